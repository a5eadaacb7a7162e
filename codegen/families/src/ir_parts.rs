//! The IR blocks several lowerings share, written once: Llama's full causal
//! attention with its own projected K/V, plain RoPE, and the SwiGLU MLP. A
//! lowering whose block differs states only the difference, with struct update
//! syntax (`Attention { qk_norm: QkNorm::RmsPerHead, ..full_attention(..) }`),
//! so each shared fact is in one place.

use crate::document::Document;
use crate::ir::*;

/// Full causal attention as llama.py runs it: separate unbiased q/k/v
/// projections, no q/k/v norms, `head_dim ** -0.5` in fused SDPA, its own
/// K/V in a plain cache, no output gate.
pub(crate) fn full_attention(
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    rope: RopeForm,
) -> Attention {
    Attention {
        n_heads: n_heads as usize,
        n_kv_heads: n_kv_heads as usize,
        head_dim: head_dim as usize,
        bias: ProjectionBias::None,
        qk_norm: QkNorm::None,
        value_norm: ValueNorm::None,
        rope,
        scale: AttentionScale::InvSqrtHeadDim,
        window: Window::Full,
        kv: KvSource::Own {
            values: Values::Projected,
            cache: KvCache::Plain,
        },
        scores: Scores::FusedSdpa,
        output_gate: OutputGate::None,
        projection: QkvProjection::Separate,
    }
}

/// `nn.RoPE(rotated_dims, traditional, base=theta)`: unscaled RoPE.
pub(crate) fn plain_rope(theta: f64, traditional: bool, rotated_dims: usize) -> RopeForm {
    RopeForm {
        kind: RopeKind::Default {
            theta: theta as f32,
        },
        traditional,
        rotated_dims,
    }
}

/// A decoder layer as every lowering but Gemma-4's builds it: no per-layer
/// input, no layer scalar.
pub(crate) fn layer(
    index: usize,
    norms: Norms,
    mixer: Mixer,
    ffn: FeedForward,
    residual: Residual,
) -> Layer {
    Layer {
        index,
        norms,
        mixer,
        ffn,
        input: LayerInput::None,
        scalar: LayerScalar::None,
        residual,
    }
}

/// A [`layer`] whose residual branches are added as they are (no scale).
pub(crate) fn plain_layer(index: usize, norms: Norms, mixer: Mixer, ffn: FeedForward) -> Layer {
    layer(index, norms, mixer, ffn, Residual::Plain)
}

/// The norms of a layer whose RMSNorm weights are used as they are (no `1 + w`).
pub(crate) fn direct_norms(arrangement: NormArrangement) -> Norms {
    Norms {
        arrangement,
        weight: NormWeight::Direct,
    }
}

/// The SwiGLU MLP, `down(silu(gate(x)) * up(x))`, with separate projections.
pub(crate) fn swiglu(width: u32) -> GatedMlp {
    GatedMlp {
        width: width as usize,
        activation: Activation::Silu,
        projection: GateUpProjection::Separate,
    }
}

/// Routed SwiGLU experts behind a softmax-then-top-k router (qwen3_moe.py's
/// and qwen3_next's): the k chosen probabilities renormalized to sum to 1 when
/// `norm_topk_prob`, else taken as they are.
pub(crate) fn softmax_topk_experts(
    num_experts: u32,
    top_k: u32,
    width: u32,
    norm_topk_prob: bool,
) -> Moe {
    let probs = if norm_topk_prob {
        TopKProbs::Renormalized
    } else {
        TopKProbs::AsTaken
    };
    Moe {
        num_experts: num_experts as usize,
        top_k: top_k as usize,
        width: width as usize,
        router: Router::SoftmaxTopK { probs },
        activation: Activation::Silu,
    }
}

/// How the model splits over tensor-parallel ranks where its attention heads
/// divide evenly (every family's but Qwen3.5's): the head whole on each rank,
/// the K/V heads divided. `oracle` says whether mlx-lm's module has a
/// `shard()` to compare with.
pub(crate) fn whole_head_sharding(oracle: ShardOracle) -> Sharding {
    Sharding {
        oracle,
        head: HeadSplit::Whole,
        kv_heads: KvHeadSplit::Divided,
    }
}

/// The plain head: the final RMSNorm's weight as it is, then the embedding
/// (`embed_tokens.as_linear`) when `tie_word_embeddings`, else its own
/// `lm_head`; no softcap, no logit scale.
pub(crate) fn plain_head(tie_word_embeddings: bool) -> Head {
    Head {
        weight: if tie_word_embeddings {
            HeadWeight::TiedEmbedding
        } else {
            HeadWeight::Untied
        },
        logit_softcap: None,
        norm: NormWeight::Direct,
        logit_scale: LogitScale::None,
    }
}

/// What a lowering decides for the model as a whole; [`model_ir`] adds what
/// the spec's identity, `model` sizes and weight quantization fix.
pub(crate) struct ModelParts {
    pub(crate) prefix: ModulePrefix,
    /// mlx-lm's `sanitize`, as rules in the order it applies them.
    pub(crate) sanitize: Vec<SanitizeRule>,
    pub(crate) sharding: Sharding,
    pub(crate) embedding: Embedding,
    pub(crate) layers: Vec<Layer>,
    pub(crate) head: Head,
}

/// The embedding without per-layer inputs (every family's but Gemma-4's),
/// times `scale`.
pub(crate) fn scaled_embedding(scale: EmbedScale) -> Embedding {
    Embedding {
        scale,
        per_layer_input: None,
    }
}

/// The block IR of a plain decoder: its modules under `model.`, the
/// embedding unscaled, the [`plain_head`] and the whole head on each rank
/// ([`whole_head_sharding`]); `sanitize` as mlx-lm's `sanitize` applies it.
pub(crate) fn plain_model_ir(
    spec: &dyn Document,
    sanitize: Vec<SanitizeRule>,
    oracle: ShardOracle,
    layers: Vec<Layer>,
    tie_word_embeddings: bool,
) -> ModelIr {
    let parts = ModelParts {
        prefix: ModulePrefix::Model,
        sanitize,
        sharding: whole_head_sharding(oracle),
        embedding: scaled_embedding(EmbedScale::None),
        layers,
        head: plain_head(tie_word_embeddings),
    };
    model_ir(spec, parts)
}

/// The block IR of a spec: its name and checkpoint model type, the `model`
/// section's sizes and norm epsilon (as f32, the dtype mlx's `rms_norm`
/// takes it in), its weight quantization, and the lowering's `parts`.
pub(crate) fn model_ir(spec: &dyn Document, parts: ModelParts) -> ModelIr {
    let (identity, model) = (spec.identity(), spec.model_sizes());
    ModelIr {
        name: identity.name.clone(),
        checkpoint: Checkpoint {
            model_type: identity.source.model_type,
            prefix: parts.prefix,
            sanitize: parts.sanitize,
        },
        sharding: parts.sharding,
        hidden_size: model.hidden_size() as usize,
        vocab_size: model.vocab_size() as usize,
        max_position_embeddings: model.max_position_embeddings() as usize,
        norm_eps: model.rms_norm_eps() as f32,
        embedding: parts.embedding,
        layers: parts.layers,
        head: parts.head,
        quantization: spec.quantization().map(WeightQuant::of),
    }
}
