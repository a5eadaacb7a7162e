//! The Gemma-4 lowering: a [`Gemma4Spec`] as blocks, with mlx-lm 0.32.2's
//! rules (`gemma4_text.py`). The one place that knows how Gemma-4's fields
//! become IR facts.

use std::collections::BTreeMap;

use crate::ir::*;
use crate::ir::{KvQuant, RopeKind};
use crate::ir_parts::{model_ir, plain_head, whole_head_sharding, ModelParts};
use crate::model::{ConfigModelType, Gemma4Spec, LayerType, ModelDims, RopeParams};

crate::document::impl_model_sizes!(ModelDims);

/// The IR of a valid Gemma-4 spec.
pub(crate) fn lower(spec: &Gemma4Spec) -> ModelIr {
    let types = spec.layer_types();
    let n = types.len();
    // The first layer without K/V of its own.
    let m = n - spec.layers.num_kv_shared_layers as usize;
    let a = &spec.attention;
    // A KV-shared layer reads the last non-shared layer of its type.
    let mut last_of_type: BTreeMap<LayerType, usize> = BTreeMap::new();
    for (i, t) in types.iter().enumerate().take(m) {
        last_of_type.insert(*t, i);
    }
    let kv_quant: BTreeMap<u32, KvQuant> = spec
        .kv_quantization
        .iter()
        .flatten()
        .map(|e| {
            (
                e.layer_idx,
                KvQuant {
                    bits: e.bits,
                    group_size: e.group_size,
                },
            )
        })
        .collect();
    let per_layer_input = spec.per_layer_input.as_ref().map(|p| PerLayerInput {
        width: p.hidden_size_per_layer_input as usize,
        vocab: p.vocab_size_per_layer_input as usize,
    });
    let layers = types
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let full = t == LayerType::Full;
            let head_dim = match (full, a.global_head_dim) {
                (true, Some(g)) if g > 0 => g,
                _ => a.head_dim,
            } as usize;
            let k_eq_v = a.attention_k_eq_v && full;
            let n_kv_heads = match (k_eq_v, a.num_global_key_value_heads) {
                (true, Some(g)) => g,
                _ => a.num_key_value_heads,
            } as usize;
            let kv = if i < m {
                KvSource::Own {
                    values: if k_eq_v {
                        Values::SameAsKeys
                    } else {
                        Values::Projected
                    },
                    cache: match kv_quant.get(&(i as u32)) {
                        Some(q) => KvCache::Quantized(*q),
                        None => KvCache::Plain,
                    },
                }
            } else {
                KvSource::Shared {
                    donor: last_of_type.get(&t).copied().unwrap_or(i),
                }
            };
            let double = spec.mlp.use_double_wide_mlp && i >= m && m > 0;
            let mlp = GatedMlp {
                width: spec.mlp.intermediate_size as usize * if double { 2 } else { 1 },
                activation: Activation::GeluApprox,
                projection: GateUpProjection::Separate,
            };
            let params = if full {
                &spec.rope.full
            } else {
                &spec.rope.sliding
            };
            let (kind, rotated_dims) = match *params {
                RopeParams::Default { rope_theta } => (
                    RopeKind::Default {
                        theta: rope_theta as f32,
                    },
                    head_dim,
                ),
                RopeParams::Proportional {
                    rope_theta,
                    partial_rotary_factor,
                    factor,
                } => (
                    RopeKind::Proportional {
                        theta: rope_theta as f32,
                        partial_rotary_factor: partial_rotary_factor as f32,
                        factor: factor as f32,
                    },
                    // Python: int(dims * partial_rotary_factor), in f64.
                    (head_dim as f64 * partial_rotary_factor).floor() as usize,
                ),
            };
            Layer {
                index: i,
                norms: Norms {
                    arrangement: NormArrangement::Sandwich,
                    weight: NormWeight::Direct,
                },
                mixer: Mixer::Attention(Attention {
                    n_heads: a.num_attention_heads as usize,
                    n_kv_heads,
                    head_dim,
                    bias: ProjectionBias::None,
                    qk_norm: QkNorm::RmsPerHead,
                    value_norm: ValueNorm::RmsScaleFree,
                    rope: RopeForm {
                        kind,
                        traditional: spec.rope.traditional,
                        rotated_dims,
                    },
                    scale: AttentionScale::One,
                    window: if full {
                        Window::Full
                    } else {
                        Window::Sliding(a.sliding_window as usize)
                    },
                    kv,
                    scores: Scores::FusedSdpa,
                    output_gate: OutputGate::None,
                    projection: QkvProjection::Separate,
                }),
                ffn: match &spec.moe {
                    None => FeedForward::Mlp(mlp),
                    Some(moe) => FeedForward::MlpAndMoe {
                        mlp,
                        moe: Moe {
                            num_experts: moe.num_experts as usize,
                            top_k: moe.top_k_experts as usize,
                            width: moe.moe_intermediate_size as usize,
                            router: Router::ScaledTopKSoftmax,
                            activation: Activation::GeluApprox,
                        },
                    },
                },
                input: match per_layer_input {
                    None => LayerInput::None,
                    Some(p) => LayerInput::Gated { width: p.width },
                },
                scalar: LayerScalar::Learned,
                residual: Residual::Plain,
            }
        })
        .collect();
    let model_type = spec.identity.source.model_type;
    let wrapped = model_type != ConfigModelType::Gemma4Text;
    let mut sanitize = Vec::new();
    if wrapped {
        sanitize.push(SanitizeRule::UnwrapMultimodal);
    }
    sanitize.extend([
        SanitizeRule::DropRotaryTables,
        SanitizeRule::DropActivationRanges,
        SanitizeRule::DropSharedKv,
        SanitizeRule::SplitExpertsGateUp,
    ]);
    model_ir(
        spec,
        ModelParts {
            prefix: if wrapped {
                ModulePrefix::LanguageModel
            } else {
                ModulePrefix::Model
            },
            sanitize,
            // gemma4_text.py has no shard().
            sharding: whole_head_sharding(ShardOracle::Absent),
            embedding: Embedding {
                scale: EmbedScale::SqrtHidden,
                per_layer_input,
            },
            layers,
            head: Head {
                logit_softcap: spec.model.final_logit_softcapping.map(|s| Softcap {
                    cap: s as f32,
                    form: SoftcapForm::Compiled,
                }),
                ..plain_head(spec.model.tie_word_embeddings)
            },
        },
    )
}
