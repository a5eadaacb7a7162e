//! archgen-ir: the block IR, a closed, typed description of a decoder language
//! model as blocks. Every family's spec lowers to it (once per family, in
//! archgen-families), and the plan, the tensor contract, the plan file, the emitter,
//! the monolith and the CPU decode path read it without asking which family a
//! model is. No MLX here, and no spec parsing.
//!
//! * the IR types (this module);
//! * [`names`]: the one map from blocks to checkpoint tensor names, the
//!   quantizable modules and the parameter count;
//! * [`tier`]: the parity tier a model's run has, from the IR alone;
//! * the quantization types ([`Quantization`], [`QuantParams`], [`WeightQuant`],
//!   [`KvQuant`]) and the checkpoint's [`ConfigModelType`].
//!
//! Every choice is an enum matched exhaustively downstream, so a new variant
//! makes the compiler list each place that must handle it. Variants exist only
//! where a lowering produces them; the knobs the next families need (a bias
//! per projection, `1 + w` norm weights, a score softcap, other embedding and
//! logit scales, other routers) are added together with the lowering that
//! produces them and the runtime block that runs them.
//!
//! ```text
//! ModelIr
//! ├── checkpoint   model_type, module prefix, sanitize rules
//! ├── sharding     mlx-lm's shard(): oracle or none, head whole or over the vocabulary,
//! │                K/V heads divided or repeated
//! ├── embedding    scale, per-layer inputs
//! ├── layers[i]    Norms (arrangement, weight form)
//! │                Mixer::Attention (heads, q/k/v biases and norms, RoPE, scale, window, K/V source,
//! │                    scores: fused SDPA or written out with a softcap, output gate,
//! │                    projection: q/k/v separate or one fused qkv_proj)
//! │                Mixer::GatedDeltaNet (heads, conv kernel, gated norm, conv + recurrent state)
//! │                Mixer::ShortConv (conv kernel, conv state)
//! │                Mixer::LatentAttention (heads, query projection, latent rank, head dims,
//! │                    RoPE, scale; a cache of the latent and the RoPE key)
//! │                FeedForward::{Mlp, MlpAndMoe, Moe} (gate/up separate or one gate_up_proj)
//! │                LayerInput (per-layer input gate), LayerScalar, Residual (plain or scaled)
//! └── head         tied or not, logit softcap (compiled or eager), final norm weight form,
//!                  logit scale (none, a divide before the projection or one after it)
//! ```

pub mod names;
mod quant;
pub mod tier;

pub use quant::{
    KvQuant, ModuleKind, QuantMode, QuantOverride, QuantParams, QuantizableModule, Quantization,
    WeightQuant, AFFINE_BITS, AFFINE_GROUPS,
};

/// A decoder model as blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelIr {
    pub name: String,
    /// How the checkpoint spells and stores the tensors.
    pub checkpoint: Checkpoint,
    /// How mlx-lm's model class splits itself over ranks.
    pub sharding: Sharding,
    pub hidden_size: usize,
    pub vocab_size: usize,
    /// Informational (no RoPE form here reads it).
    pub max_position_embeddings: usize,
    /// eps of every RMSNorm of the model.
    pub norm_eps: f32,
    pub embedding: Embedding,
    pub layers: Vec<Layer>,
    pub head: Head,
    /// Weight quantization as written; [`ModelIr::quant_for`] resolves it per
    /// module.
    pub quantization: Option<WeightQuant>,
}

/// The checkpoint's layout: which `model_type` mlx-lm reads it with, where
/// the text model's modules live, and mlx-lm's `sanitize` for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub model_type: ConfigModelType,
    pub prefix: ModulePrefix,
    /// Applied in order by the loader (`archgen_checkpoint::read_dir`).
    pub sanitize: Vec<SanitizeRule>,
}

/// How mlx-lm's model class splits itself over ranks (its `shard()`): what
/// a tensor-parallel run reproduces (`archgen_plan::tensor_parallel::split`)
/// and whether an oracle runs it split ([`tier::sharded_tier`]). Set
/// by each lowering; how a block splits (rows, columns, segments of a Gated
/// DeltaNet's `in_proj_qkv`) follows from the block itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharding {
    pub oracle: ShardOracle,
    pub head: HeadSplit,
    pub kv_heads: KvHeadSplit,
}

/// Whether mlx-lm's model class has a `shard()`, the oracle of a split run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardOracle {
    /// qwen3.py, llama.py (and so mistral), qwen2.py, qwen3_moe.py, qwen3_5.py.
    MlxLm,
    /// The class has none (gemma4, gemma2, minicpm): archgen splits it as the
    /// dense classes split themselves, and the run has no oracle (tier L3).
    Absent,
}

/// What a split does with an untied head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadSplit {
    /// Kept whole on every rank (qwen3.py, llama.py, qwen2.py, qwen3_moe.py).
    Whole,
    /// All-to-sharded over the vocabulary, the logits gathered with
    /// `gather_last_axis` (qwen3_5.py).
    OverVocabulary,
}

/// What a split does with an attention layer's K/V heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvHeadSplit {
    /// Divided by the ranks, which must divide them.
    Divided,
    /// With fewer K/V heads than ranks, each repeated ranks / heads times in
    /// place before the split (qwen3_5.py's `repeat_kv_layer_inplace`).
    RepeatedWhenFewer,
}

/// Where the text model's modules are in the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModulePrefix {
    /// `model.layers.0...`, head `lm_head`.
    Model,
    /// `language_model.model.layers.0...`, head `language_model.lm_head`
    /// (multimodal wrappers).
    LanguageModel,
}

/// One rule of mlx-lm's `sanitize` (tensor renames and drops before loading).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SanitizeRule {
    /// A multimodal wrapper: drop the vision/audio towers and move
    /// `model.language_model.*` to `language_model.model.*`.
    UnwrapMultimodal,
    /// Drop precomputed rotary tables (`self_attn.rotary_emb`).
    DropRotaryTables,
    /// Drop activation ranges of quantization-aware checkpoints
    /// (`input_max`, `input_min`, `output_max`, `output_min`).
    DropActivationRanges,
    /// Drop `k_proj`, `v_proj` and `k_norm` of layers that read a donor's K/V.
    DropSharedKv,
    /// Drop `lm_head.weight` when the head is tied.
    DropTiedHead,
    /// Split `experts.gate_up_proj` into `experts.switch_glu.{gate,up}_proj`
    /// and rename `experts.down_proj`.
    SplitExpertsGateUp,
    /// Stack the per-expert Hugging Face weights
    /// `mlp.experts.{e}.{gate,up,down}_proj.weight` of each layer into
    /// `mlp.switch_mlp.{gate,up,down}_proj.weight` (`[experts, out, in]`).
    StackExperts,
    /// `lm_head.weight` taken from `embed_tokens.weight` when the checkpoint
    /// has none (minicpm's `sanitize`; the head itself stays a separate
    /// `lm_head` linear).
    CopyEmbeddingToHead,
    /// Split `mlp.experts.gate_up_proj` along its second-to-last axis into
    /// `mlp.switch_mlp.{gate,up}_proj.weight` and rename `mlp.experts.down_proj`
    /// to `mlp.switch_mlp.down_proj.weight` (qwen3_5_moe's sanitize).
    SplitSwitchMlpGateUp,
    /// Drop the vision tower of a multimodal Qwen3.5 checkpoint
    /// (`model.visual.*`, `vision_tower.*`).
    DropVisual,
    /// Drop the multi-token-prediction head (every name containing `mtp.`).
    DropMtp,
    /// Move a Hugging Face conv1d weight `[C, 1, K]` to mlx's `[C, K, 1]`
    /// (`moveaxis(2, 1)` on every `conv1d.weight` whose last dim is not 1).
    MoveConvAxis,
    /// When the checkpoint is a raw Hugging Face one (an unsanitized conv1d
    /// weight is present), add 1 to the 1-D weights of the input,
    /// post-attention, final, q and k norms (a weak scalar: the sum is in the
    /// weight's dtype). Qwen3.5 stores them as offsets around 0.
    OffsetNormsOfRawCheckpoint,
    /// The same offset on qwen3_next's condition: the checkpoint has
    /// per-expert Hugging Face weights (a `model.layers.{i}.mlp.experts.0.
    /// up_proj.weight`), whatever its conv weights look like.
    OffsetNormsOfPerExpertCheckpoint,
    /// LFM2's module names read as the names the shared blocks load
    /// (`operator_norm` → `input_layernorm`, `ffn_norm` →
    /// `post_attention_layernorm`, `feed_forward.w1` / `w3` / `w2` →
    /// `mlp.gate_proj` / `up_proj` / `down_proj`, `self_attn.out_proj` →
    /// `o_proj`, `q_layernorm` / `k_layernorm` → `q_norm` / `k_norm`, the
    /// final `embedding_norm` → `norm`), with their quantization tensors.
    /// Not one of mlx-lm's rules: the blocks' loaders name these modules
    /// the Llama way, and this rule is where LFM2's checkpoint meets them.
    RenameLfm2Modules,
    /// lfm2's `sanitize`: a `conv.weight` whose last axis is longer than its
    /// second (Hugging Face's `[C, 1, K]`) is transposed to mlx's `[C, K, 1]`.
    TransposeShortConvWeight,
    /// Drop every name starting with `model.layers.{n}`, `n` the stack's
    /// layer count: the multi-token-prediction layer a checkpoint keeps after
    /// the last decoder layer (glm4_moe's `sanitize`).
    DropLayerPastStack,
    /// deepseek_v3's `sanitize` of `self_attn.kv_b_proj` ([heads * (nope +
    /// v), rank]): split per head into `embed_q` (the key half, transposed
    /// to [heads, rank, nope]) and `unembed_out` (the value half,
    /// [heads, v, rank]), a quantized one dequantized first and both halves
    /// quantized again with its bits and group size.
    SplitKvBProj,
    /// Refuse a checkpoint with block-scaled fp8 weights (`weight_scale_inv`)
    /// or compressed-tensors int4 weights (`weight_packed`), which
    /// deepseek_v3's `sanitize` converts and archgen does not: convert the
    /// checkpoint with mlx-lm first.
    RefuseFp8AndPackedInt4,
}

/// Token embedding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Embedding {
    pub scale: EmbedScale,
    pub per_layer_input: Option<PerLayerInput>,
}

/// What the embedding is multiplied by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EmbedScale {
    None,
    /// `sqrt(hidden_size)` as a weak Python float scalar.
    SqrtHidden,
    /// A constant from the config as a weak Python scalar, rounded to the
    /// embedding's dtype (minicpm's `embed_tokens(ids) * scale_emb`).
    Constant(f64),
}

/// Per-layer inputs: a second embedding and a projection of the first, split
/// into one input per layer (Gemma's PLE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerLayerInput {
    /// Width of each layer's input.
    pub width: usize,
    /// Rows of `embed_tokens_per_layer`.
    pub vocab: usize,
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    pub index: usize,
    pub norms: Norms,
    pub mixer: Mixer,
    pub ffn: FeedForward,
    pub input: LayerInput,
    pub scalar: LayerScalar,
    /// How the mixer's and the feed-forward half's outputs join the residual
    /// stream.
    pub residual: Residual,
}

/// How a layer's two branches (mixer, feed-forward half) are added to the
/// residual stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Residual {
    /// `h + branch`.
    Plain,
    /// `h + branch * (scale_depth / num_hidden_layers**0.5)` on both branches
    /// (minicpm's `DecoderLayer`): the factor a Python float computed in f64,
    /// then a weak scalar (rounded to the branch's dtype).
    DepthScaled {
        scale_depth: f64,
        num_hidden_layers: usize,
    },
    /// `h + branch * multiplier` on both branches with `multiplier` a Python
    /// float from the config, a weak scalar (granite's `residual_multiplier`):
    /// the same multiply as [`Residual::DepthScaled`], another factor.
    Scaled { multiplier: f64 },
    /// gemma3_text's `clip_residual(h, branch)` on both branches: `h +
    /// branch`, except that a float16 stream adds both in float32, clips
    /// the sum to float16's finite range (`mx.finfo(mx.float16).max`) and
    /// casts it back.
    ClippedInFloat16,
}

impl Residual {
    /// The Python float the branches are multiplied by, as mlx-lm computes
    /// it: `scale_depth / num_hidden_layers**0.5` in f64 (`**` is C `pow`).
    pub fn factor(self) -> Option<f64> {
        match self {
            Residual::Plain | Residual::ClippedInFloat16 => None,
            Residual::DepthScaled {
                scale_depth,
                num_hidden_layers,
            } => Some(scale_depth / (num_hidden_layers as f64).powf(0.5)),
            Residual::Scaled { multiplier } => Some(multiplier),
        }
    }
}

/// Where the layer's RMSNorms sit and how their weight is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Norms {
    pub arrangement: NormArrangement,
    pub weight: NormWeight,
}

/// Where the RMSNorms of a layer sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormArrangement {
    /// `h = x + mixer(norm(x)); out = h + ffn(norm(h))`
    /// (`input_layernorm`, `post_attention_layernorm`).
    PreNorm,
    /// `h = x + norm(mixer(norm(x))); out = h + norm(ffn(norm(h)))`
    /// (`input_layernorm`, `post_attention_layernorm`,
    /// `pre_feedforward_layernorm`, `post_feedforward_layernorm`).
    Sandwich,
    /// `h = x + norm(mixer(x)); out = h + norm(ffn(h))`: no norm before the
    /// mixer or the feed-forward half (olmo2's `TransformerBlock`:
    /// `post_attention_layernorm`, `post_feedforward_layernorm`).
    PostNorm,
}

/// How an RMSNorm applies its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormWeight {
    /// `x * w` (`mx.fast.rms_norm` with the stored weight).
    Direct,
    /// `x * (1 + w)`: `mx.fast.rms_norm(x, 1.0 + weight, eps)`, the `1.0` a
    /// weak scalar, so the sum is rounded to the weight's dtype (gemma2).
    OnePlus,
}

/// The sequence mixer of a layer.
#[derive(Debug, Clone, PartialEq)]
pub enum Mixer {
    Attention(Attention),
    /// Gated DeltaNet linear attention (Qwen3.5's `linear_attn`): no K/V
    /// cache, a recurrent state instead.
    GatedDeltaNet(DeltaNet),
    /// A gated short convolution (LFM2's `conv`): no K/V cache, a conv
    /// state instead.
    ShortConv(ShortConv),
    /// Multi-head latent attention (DeepSeek-V3's `self_attn`): K/V as one
    /// normed latent and one shared RoPE key per token, in a plain cache.
    LatentAttention(LatentAttention),
}

/// Multi-head latent attention (mlx-lm `deepseek_v3.DeepseekV3Attention`):
/// queries through [`LatentQuery`], `kv_a_proj_with_mqa` to the latent
/// (`kv_a_layernorm`, eps 1e-6) and one RoPE key, RoPE scores
/// `(q_pe * scale) @ k_pe^T` passed to SDPA as its additive mask, the latent
/// expanded per head through `embed_q` and `unembed_out` (`MultiLinear`, the
/// halves of a checkpoint's `kv_b_proj`) for a prefill, absorbed into the
/// query and the output for one token. Its cache is mlx-lm's `KVCache`
/// holding the latent (keys, one head) and the rotated RoPE key (values).
/// No bias on any projection (`attention_bias: false`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatentAttention {
    /// `num_attention_heads`.
    pub n_heads: usize,
    pub query: LatentQuery,
    /// `kv_lora_rank`: the latent's width.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`.
    pub qk_nope_head_dim: usize,
    /// `qk_rope_head_dim`: the rotated dims (one key head shared by all).
    pub qk_rope_head_dim: usize,
    /// `v_head_dim`.
    pub v_head_dim: usize,
    /// The RoPE of the `qk_rope_head_dim` dims.
    pub rope: RopeForm,
    /// The module's `scale`, the Python float
    /// `(qk_nope_head_dim + qk_rope_head_dim) ** -0.5`, times `s * s` with
    /// `s = 0.1 * mscale_all_dim * log(factor) + 1` where the RoPE scaling
    /// has a non-zero `mscale_all_dim` and a factor above 1.
    pub scale: f64,
}

/// How a latent attention layer projects its queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatentQuery {
    /// `q_lora_rank: null`: one `q_proj`.
    Direct,
    /// `q_b_proj(q_a_layernorm(q_a_proj(x)))` through `rank` (`q_lora_rank`).
    LowRank { rank: usize },
}

/// A gated short convolution (mlx-lm `lfm2.ShortConv`): `in_proj` to
/// `[3 * hidden]` split in B, C and x; `B * x` through a depthwise causal
/// conv1d of `kernel` taps without bias (`conv.conv`, weight
/// `[hidden, kernel, 1]`); `out_proj(C * conv_out)`. Its cache is mlx-lm's
/// `ArraysCache(size=1)`: the last `kernel - 1` rows of `B * x` in the
/// activation dtype. No bias on any projection (`conv_bias: false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortConv {
    /// `conv_L_cache`: the conv's taps.
    pub kernel: usize,
}

/// A Gated DeltaNet layer (mlx-lm `qwen3_5.GatedDeltaNet`): input
/// projections, a depthwise causal conv1d over q/k/v, L2-normalised q and k,
/// the gated delta rule recurrence (one compiled step per token off Metal),
/// a gated RMSNorm with `z`, the output projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNet {
    /// `linear_num_key_heads`.
    pub k_heads: usize,
    /// `linear_num_value_heads` (a multiple of the key heads).
    pub v_heads: usize,
    /// `linear_key_head_dim`.
    pub k_head_dim: usize,
    /// `linear_value_head_dim`.
    pub v_head_dim: usize,
    /// `linear_conv_kernel_dim`.
    pub conv_kernel: usize,
    pub in_proj: InProj,
    pub norm: GatedNorm,
    pub cache: StateCache,
}

impl DeltaNet {
    /// Channels of the conv: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.k_heads * self.k_head_dim + self.v_heads * self.v_head_dim
    }
    /// Width of v (and of `z`, and of `out_proj`'s input).
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.v_head_dim
    }
}

/// How a Gated DeltaNet layer projects its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InProj {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` (qwen3_5).
    Split,
    /// `in_proj_qkvz` [2 key_dim + 2 value_dim] and `in_proj_ba` [2 Hv], their
    /// outputs grouped per key head and regrouped by
    /// `fix_query_key_value_ordering` (qwen3_next).
    GroupedPerKeyHead,
}

/// The norm before a Gated DeltaNet layer's output projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedNorm {
    /// `Qwen3NextRMSNormGated`: `rms_norm(out, weight, eps)` then the compiled
    /// `precise_swiglu(out, z, that)` (weight `[v_head_dim]`, no `1 + w`).
    RmsSiluGate,
}

/// The cache of a layer without K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateCache {
    /// mlx-lm's `ArraysCache(size=2)`: the conv state `[B, K-1, conv_dim]`
    /// in the activation dtype and the recurrent state `[B, Hv, Dv, Dk]` in
    /// float32. No offset; no mask for one unpadded sequence.
    ConvAndRecurrent,
}

/// Multi-head attention with grouped K/V heads.
#[derive(Debug, Clone, PartialEq)]
pub struct Attention {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub bias: ProjectionBias,
    pub qk_norm: QkNorm,
    pub value_norm: ValueNorm,
    pub rope: RopeForm,
    pub scale: AttentionScale,
    pub window: Window,
    pub kv: KvSource,
    pub scores: Scores,
    pub output_gate: OutputGate,
    pub projection: QkvProjection,
}

/// How a layer projects its queries, keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvProjection {
    /// `q_proj`, `k_proj`, `v_proj` (the ones the layer has): a matmul each.
    Separate,
    /// One `qkv_proj` of `(heads + 2 * kv_heads) * head_dim` outputs, queries
    /// then keys then values: one matmul, then `mx.split` at `[q, q + kv]`
    /// (phi3.py's `Attention`). The product's bits are the fused matmul's,
    /// which on a GPU need not be the three separate ones'. Only on a layer
    /// that projects its own K/V with `v_proj`'s rows.
    Fused,
}

/// A gate on the attention output before `o_proj`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputGate {
    None,
    /// `q_proj` has `2 * heads * head_dim` outputs, per head the queries then
    /// the gate; `o_proj(output * sigmoid(gate))` (Qwen3.5's full layers).
    SigmoidPerHead,
}

/// How the scores become attention weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scores {
    /// `mx.fast.scaled_dot_product_attention` with the scale (mlx-lm's
    /// `scaled_dot_product_attention`; a quantized cache takes its quantized
    /// form).
    FusedSdpa,
    /// Written out, as gemma2 does: `queries * scale` (weak scalar),
    /// `q @ k^T`, `tanh(s / cap) * cap` (eager, weak scalars), a bool mask
    /// through `where(mask, s, finfo(dtype).min)`, `softmax(precise=True)`,
    /// `@ v`. The mask is always an array (`return_array=True`).
    Softcapped { cap: f32 },
    /// `mx.fast.scaled_dot_product_attention` with `sinks=self.sinks`: a
    /// learned logit per head (`self_attn.sinks`, `[heads]`) that joins each
    /// row's softmax and takes no value (gpt_oss's `AttentionBlock`).
    FusedSdpaWithSinks,
}

/// Which attention projections add a bias (a `[out]` vector, never
/// quantized): `nn.Linear(bias=True)` computes `addmm(b, x, W.T)`, a
/// quantized one `quantized_matmul(...) + b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectionBias {
    None,
    /// `q_proj`, `k_proj` and `v_proj` (not `o_proj`): Qwen2.
    QueryKeyValue,
    /// `q_proj`, `k_proj`, `v_proj` and `o_proj` (gpt_oss's `AttentionBlock`).
    QueryKeyValueOutput,
}

/// Normalization of queries and keys before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// RMSNorm per head with weights `q_norm`, `k_norm` of `[head_dim]`.
    RmsPerHead,
    /// RMSNorm per head applying `1.0 + weight` (Gemma's `RMSNorm`, a weak
    /// scalar: the sum is in the weight's dtype), weights of `[head_dim]`
    /// (gemma3_text).
    RmsPerHeadOnePlus,
    /// RMSNorm over the whole projection before the head split, weights
    /// `q_norm` of `[heads * head_dim]` and `k_norm` of
    /// `[kv_heads * head_dim]` (olmo2): one mean over every head.
    RmsWholeProjection,
}

/// Normalization of values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueNorm {
    None,
    /// RMSNorm per head without a weight.
    RmsScaleFree,
}

/// The RoPE of a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeForm {
    pub kind: RopeKind,
    /// Rotate pairs (2i, 2i+1) instead of (i, i + d/2).
    pub traditional: bool,
    /// Dimensions that rotate (head_dim unless partial).
    pub rotated_dims: usize,
}

/// The scale SDPA multiplies the scores by (or, with [`Scores::Softcapped`],
/// the queries).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttentionScale {
    /// 1.0 (the norms already scale q and k).
    One,
    /// `head_dim ** -0.5` as the Python float mlx-lm passes.
    InvSqrtHeadDim,
    /// `1.0 / (query_pre_attn_scalar ** 0.5)`, a Python float (gemma2): a
    /// divide of a power, computed in f64, not `pow(x, -0.5)`.
    InvSqrtQueryPreAttnScalar(f64),
    /// A Python float passed as SDPA's `scale`: from the config (granite's
    /// `attention_multiplier`, in place of `head_dim ** -0.5`) or computed by
    /// the module (gpt_oss's `1 / math.sqrt(head_dim)`).
    Constant(f64),
}

impl AttentionScale {
    /// The f32 SDPA receives.
    pub fn value(self, head_dim: usize) -> f32 {
        match self {
            AttentionScale::One => 1.0,
            AttentionScale::InvSqrtHeadDim => (head_dim as f64).powf(-0.5) as f32,
            AttentionScale::InvSqrtQueryPreAttnScalar(s) => (1.0 / s.powf(0.5)) as f32,
            AttentionScale::Constant(s) => s as f32,
        }
    }
}

/// Which positions a query sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Window {
    /// Causal over everything (growing cache).
    Full,
    /// Causal over the last `n` positions (rotating cache of `n`).
    Sliding(usize),
}

/// Where a layer's K/V come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvSource {
    /// The layer projects K/V and owns a cache.
    Own { values: Values, cache: KvCache },
    /// The layer attends over the K/V of an earlier layer (a donor), with the
    /// donor's RoPE offset; it has no K/V weights and no cache.
    Shared { donor: usize },
}

/// Where V comes from on a K/V-owning layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// `v_proj`.
    Projected,
    /// The raw `k_proj` output (no `v_proj`).
    SameAsKeys,
}

/// A K/V-owning layer's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCache {
    /// Keys and values in the activation dtype.
    Plain,
    /// mlx's quantized KV cache (full-window layers only).
    Quantized(KvQuant),
    /// mlx-optiq's per-layer mixed KV (`install_mixed_kv`): a plain cache that,
    /// after the first forward leaving `start` or more positions in it, becomes a
    /// quantized cache holding `mx.quantize` of its whole buffers (full-window
    /// layers only). Stock mlx-lm has no such cache: tier L2 ([`tier`]).
    QuantizedAfterForward { quant: KvQuant, start: usize },
}

/// The feed-forward half of a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FeedForward {
    Mlp(GatedMlp),
    /// A dense MLP and routed experts side by side, each with its own norms
    /// (`pre_feedforward_layernorm_2`, `post_feedforward_layernorm_1/_2`),
    /// summed.
    MlpAndMoe {
        mlp: GatedMlp,
        moe: Moe,
    },
    /// Routed experts in place of the dense MLP (`mlp.gate`,
    /// `mlp.switch_mlp`), under the layer's feed-forward norm.
    Moe(Moe),
    /// Routed experts plus a shared SwiGLU expert scaled by
    /// `sigmoid(shared_expert_gate(x))`, summed (`Qwen3NextSparseMoeBlock`:
    /// `mlp.gate`, `mlp.switch_mlp`, `mlp.shared_expert`,
    /// `mlp.shared_expert_gate`), under the layer's feed-forward norm.
    MoeAndSharedExpert {
        moe: Moe,
        shared: SharedExpert,
    },
    /// Routed experts plus ungated shared SwiGLU experts, summed
    /// (`y = experts(x) + shared_experts(x)`: glm4_moe's `MoE`, `mlp.gate`,
    /// `mlp.switch_mlp`, `mlp.shared_experts`), under the layer's
    /// feed-forward norm. `shared.width` is `moe_intermediate_size *
    /// n_shared_experts`.
    MoeAndSharedExperts {
        moe: Moe,
        shared: SharedExpert,
    },
    /// Routed experts in place of the dense MLP with a bias on the router
    /// and on each expert projection (gpt_oss's `MLPBlock`: `mlp.router`,
    /// `mlp.experts.{gate,up,down}_proj` with `.bias` `[experts, out]`,
    /// added as `x + expand_dims(bias[indices], -2)`), the weighted experts
    /// summed over k, under the layer's feed-forward norm.
    BiasedExperts(Moe),
}

/// The shared expert of [`FeedForward::MoeAndSharedExpert`] (and the shared
/// experts of [`FeedForward::MoeAndSharedExperts`], one MLP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedExpert {
    /// `shared_expert_intermediate_size`: its SwiGLU width.
    pub width: usize,
}

/// `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedMlp {
    pub width: usize,
    pub activation: Activation,
    pub projection: GateUpProjection,
}

/// How a gated MLP projects its gate and up halves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateUpProjection {
    /// `gate_proj` and `up_proj`: a matmul each.
    Separate,
    /// One `gate_up_proj` of `2 * width` outputs: one matmul, then
    /// `mx.split(x, 2, axis=-1)`, the gate the first half (phi3.py's `MLP`).
    Fused,
}

/// The gate's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// tanh-approximated GELU times the up projection as mlx-lm's compiled
    /// `geglu` computes it: both in one compiled function (Gemma-4).
    GeluApprox,
    /// The same GELU as `nn.gelu_approx` (compiled alone by mlx nn), then an
    /// eager `* up` (Gemma-2). Not [`Activation::GeluApprox`]: on CUDA the
    /// one fused kernel and the two kernels give other bits (measured on an
    /// H200, docs/parity.md "On the GPU"); on the CPU they agree.
    GeluApproxThenMultiply,
    /// SiLU (SwiGLU).
    Silu,
    /// mlx-lm's compiled `swiglu_oai(gate, x)` with its defaults (alpha
    /// 1.702, limit 7.0; gpt_oss's `SwigluOAI()`, which does not read the
    /// config's `swiglu_limit`): `gate` clipped from above, `x` clipped both
    /// ways, `(x + 1) * (gate * sigmoid(alpha * gate))`, the Python floats
    /// weak scalars.
    ClampedSwiglu,
}

/// Routed experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moe {
    pub num_experts: usize,
    pub top_k: usize,
    /// Width of each expert's gated MLP.
    pub width: usize,
    pub router: Router,
    pub activation: Activation,
}

/// How tokens pick experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Router {
    /// Scale-free RMSNorm times `scale * hidden ** -0.5`, `proj`, top-k of
    /// the logits, softmax over the chosen, times `per_expert_scale`
    /// (Gemma-4's router).
    ScaledTopKSoftmax,
    /// `gate` projection, a precise softmax over every expert, top-k of the
    /// probabilities (argpartition), then the chosen probabilities as taken
    /// or renormalized (Qwen3-MoE's router, `norm_topk_prob`).
    SoftmaxTopK { probs: TopKProbs },
    /// `noaux_tc` (glm4_moe's compiled `group_expert_select`): an
    /// unquantized `gate.weight` projection, sigmoid in float32, plus the
    /// float32 `e_score_correction_bias` for the choice only; with groups,
    /// only the `topk_group` best groups (by their two best scores) stay
    /// eligible; top-k by argpartition, the chosen *uncorrected* scores
    /// renormalized (when `probs` says so and top-k > 1), times the routed
    /// scaling factor.
    SigmoidGroupTopK(GroupTopK),
    /// gpt_oss's `MLPBlock` router: a biased `mlp.router` linear, top-k of
    /// the logits (argpartition, `take_along_axis`), then a precise softmax
    /// over the k chosen, in the activation dtype.
    TopKPreciseSoftmax,
}

/// The facts of [`Router::SigmoidGroupTopK`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupTopK {
    /// `n_group`: the experts split into this many groups (1: no group
    /// limit).
    pub n_group: usize,
    /// `topk_group`: how many groups stay eligible.
    pub topk_group: usize,
    pub probs: TopKProbs,
    /// `routed_scaling_factor`, the Python float the chosen scores are
    /// multiplied by (a weak scalar: float32 there).
    pub routed_scaling_factor: f64,
}

/// What a softmax-then-top-k router does with the k chosen probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopKProbs {
    /// Divided by their sum.
    Renormalized,
    /// As the softmax over every expert gave them.
    AsTaken,
}

/// A per-layer input gate after the feed-forward half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerInput {
    None,
    /// `h + norm(proj(gelu(gate(h)) * input))` with this layer's slice of the
    /// per-layer inputs.
    Gated {
        width: usize,
    },
}

/// What the layer output is multiplied by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerScalar {
    None,
    /// A stored `[1]` weight, `layer_scalar`.
    Learned,
}

/// Final norm and output projection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Head {
    pub weight: HeadWeight,
    /// `tanh(x / c) * c` on the logits.
    pub logit_softcap: Option<Softcap>,
    /// How the final RMSNorm applies its weight.
    pub norm: NormWeight,
    /// What the normed hidden state is scaled by before the output
    /// projection.
    pub logit_scale: LogitScale,
}

/// A scale of the final hidden state before the output projection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LogitScale {
    None,
    /// `h / d` with `d` a Python float (a divide, not a multiply by `1 / d`:
    /// different bits), rounded to `h`'s dtype as a weak scalar: minicpm's
    /// untied `lm_head(out / (hidden_size / dim_model_base))`.
    DivideBy(f64),
    /// The logits after the output projection divided by `d`, a Python float
    /// as a weak scalar: granite's `lm_head(out) / logits_scaling` (or
    /// `embed_tokens.as_linear(out) / logits_scaling` when tied).
    DivideLogitsBy(f64),
}

/// `tanh(x / cap) * cap` with `cap` a Python float.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Softcap {
    pub cap: f32,
    pub form: SoftcapForm,
}

/// How mlx-lm runs a softcap. Kept apart because MLX's fused (compiled)
/// kernels and its eager ones need not give the same tanh bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoftcapForm {
    /// `mx.compile`d (Gemma-4's `logit_softcap`).
    Compiled,
    /// Eager ops (gemma2).
    Eager,
}

/// The output projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadWeight {
    /// `embed_tokens.as_linear`.
    TiedEmbedding,
    /// `lm_head`.
    Untied,
}

impl Attention {
    /// Whether this layer projects its own K/V.
    pub fn owns_kv(&self) -> bool {
        matches!(self.kv, KvSource::Own { .. })
    }
    /// The layer whose K/V this one attends over (itself when it owns them).
    pub fn kv_layer(&self, index: usize) -> usize {
        match self.kv {
            KvSource::Own { .. } => index,
            KvSource::Shared { donor } => donor,
        }
    }
}

impl Layer {
    /// The layer's attention, when its mixer is attention.
    pub fn attention(&self) -> Option<&Attention> {
        match &self.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) | Mixer::LatentAttention(_) => None,
        }
    }
    /// The layer's Gated DeltaNet, when its mixer is one.
    pub fn delta_net(&self) -> Option<&DeltaNet> {
        match &self.mixer {
            Mixer::Attention(_) | Mixer::ShortConv(_) | Mixer::LatentAttention(_) => None,
            Mixer::GatedDeltaNet(d) => Some(d),
        }
    }
    /// The dense gated MLP, when the feed-forward half has one.
    pub fn mlp(&self) -> Option<GatedMlp> {
        match self.ffn {
            FeedForward::Mlp(m) | FeedForward::MlpAndMoe { mlp: m, .. } => Some(m),
            FeedForward::Moe(_)
            | FeedForward::MoeAndSharedExpert { .. }
            | FeedForward::MoeAndSharedExperts { .. }
            | FeedForward::BiasedExperts(_) => None,
        }
    }
    /// The routed experts, when the feed-forward half has them.
    pub fn moe(&self) -> Option<Moe> {
        match self.ffn {
            FeedForward::Mlp(_) => None,
            FeedForward::MlpAndMoe { moe, .. }
            | FeedForward::Moe(moe)
            | FeedForward::MoeAndSharedExpert { moe, .. }
            | FeedForward::MoeAndSharedExperts { moe, .. }
            | FeedForward::BiasedExperts(moe) => Some(moe),
        }
    }
}

impl ModelIr {
    /// Layers that have K/V of their own, read by a later layer.
    pub fn donors_read(&self) -> Vec<usize> {
        let mut d: Vec<usize> = self
            .layers
            .iter()
            .filter_map(|l| match l.attention()?.kv {
                KvSource::Shared { donor } => Some(donor),
                KvSource::Own { .. } => None,
            })
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }
}

/// Declares [`Family`] and [`ConfigModelType`] from one table: each family
/// with its spelling, then the `model_type`s mlx-lm runs through that family
/// beside the one spelled as the family. From the table come both enums
/// (declaration order = table order, which the schema and
/// [`ConfigModelType::ALL`] follow), their `as_str` and serde spellings, and
/// [`ConfigModelType::family`]. Adding a family is one row here.
macro_rules! families_and_model_types {
    (
        $(#[doc = $model_type_enum_doc:literal])*
        enum ConfigModelType;
        $(#[doc = $family_enum_doc:literal])*
        enum Family;
        $(
            $(#[doc = $family_doc:literal])*
            $family:ident = $spelling:literal {
                $(#[doc = $model_type_doc:literal])*
                ;
                $(
                    $(#[doc = $alias_doc:literal])*
                    $alias:ident = $alias_spelling:literal,
                )*
            }
        )*
    ) => {
        $(#[doc = $model_type_enum_doc])*
        // serde and the schema: `identity.source.model_type` of a spec document is this type.
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
        )]
        pub enum ConfigModelType {
            $(
                $(#[doc = $model_type_doc])*
                #[serde(rename = $spelling)]
                $family,
                $(
                    $(#[doc = $alias_doc])*
                    #[serde(rename = $alias_spelling)]
                    $alias,
                )*
            )*
        }

        impl ConfigModelType {
            /// Every model type, in declaration order.
            pub const ALL: [ConfigModelType; [$(stringify!($family), $(stringify!($alias),)*)*].len()] = [
                $(ConfigModelType::$family, $(ConfigModelType::$alias,)*)*
            ];

            /// The config.json spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(
                        ConfigModelType::$family => $spelling,
                        $(ConfigModelType::$alias => $alias_spelling,)*
                    )*
                }
            }

            /// The family whose mlx-lm module reads this `model_type`: the one place
            /// that maps the checkpoint's name to a spec layout.
            pub fn family(self) -> Family {
                match self {
                    $(ConfigModelType::$family $(| ConfigModelType::$alias)* => Family::$family,)*
                }
            }
        }

        $(#[doc = $family_enum_doc])*
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            Hash,
            serde::Serialize,
            serde::Deserialize,
            schemars::JsonSchema,
        )]
        pub enum Family {
            $(
                $(#[doc = $family_doc])*
                #[serde(rename = $spelling)]
                $family,
            )*
        }

        impl Family {
            /// The spec spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Family::$family => $spelling,)*
                }
            }
        }
    };
}

families_and_model_types! {
    /// Top-level `model_type` values: the three that mlx-lm 0.32.2 runs through
    /// `gemma4_text`, `qwen3`, `llama`, `mistral` (run by `llama.py`: mlx-lm's
    /// `MODEL_REMAPPING`) and `qwen2`.
    enum ConfigModelType;
    /// Model family: which document layout the spec has and which runtime blocks run it.
    enum Family;

    /// Gemma-4 text models (`gemma4_text.py`).
    Gemma4 = "gemma4" {
        ;
        Gemma4Text = "gemma4_text",
        Gemma4Unified = "gemma4_unified",
    }
    /// Dense Qwen3 (`qwen3.py`): q/k RMSNorm per head, SwiGLU.
    Qwen3 = "qwen3" { ; }
    /// Dense Llama (`llama.py`), incl. Llama-3 RoPE scaling; also Mistral,
    /// which mlx-lm runs as llama (`MODEL_REMAPPING`).
    Llama = "llama" {
        ;
        /// Mistral: mlx-lm remaps it to `llama`.
        Mistral = "mistral",
    }
    /// Dense Qwen2 / Qwen2.5 (`qwen2.py`): a bias on the q, k and v projections.
    Qwen2 = "qwen2" { ; }
    /// Gemma-2 (`gemma2.py`): `1 + w` norms, softcapped written-out attention.
    Gemma2 = "gemma2" { ; }
    /// Qwen3-MoE (`qwen3_moe.py`): Qwen3 attention, routed SwiGLU experts.
    Qwen3Moe = "qwen3_moe" { ; }
    /// MiniCPM (`minicpm.py`): Llama's stack with embedding, residual and logit scales.
    MiniCpm = "minicpm" { ; }
    /// Qwen3.5 / Qwen3.6 (`qwen3_5.py`): Gated DeltaNet layers with a gated
    /// full-attention layer every `full_attention_interval`.
    Qwen35 = "qwen3_5" {
        /// Qwen3.5 (`qwen3_5.py`; config.json flat or under `text_config`).
        ;
        /// Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe.py`: qwen3_5 with the fused HF
        /// experts split by its sanitize).
        Qwen35Moe = "qwen3_5_moe",
    }
    /// SmolLM3 (`smollm3.py`): Llama's stack without RoPE on every
    /// `no_rope_layer_interval`-th layer (its `NoPE` module).
    SmolLm3 = "smollm3" {
        /// SmolLM3 (`smollm3.py`: `llama.LlamaModel` with `NoPE` layers).
        ;
    }
    /// Granite (`granite.py`): Llama's stack with embedding, attention,
    /// residual and logits multipliers.
    Granite = "granite" { ; }
    /// Phi-3 (`phi3.py`): Llama's stack with one fused `qkv_proj` and one fused
    /// `gate_up_proj`, each a matmul then split.
    Phi3 = "phi3" { ; }
    /// OLMo-2 (`olmo2.py`): Llama's sizes with the norms after the mixer and
    /// the MLP (none before) and q/k RMSNorm over the whole projections.
    Olmo2 = "olmo2" { ; }
    /// Gemma 3 text models (`gemma3_text.py`): Gemma-2's layers with q/k
    /// norms, a sliding-window pattern and no softcaps.
    Gemma3Text = "gemma3_text" {
        ;
        /// Gemma 3 4B/12B/27B (`gemma3.py`): the multimodal wrapper whose
        /// language model is a `gemma3_text` model under `text_config`.
        Gemma3 = "gemma3",
    }
    /// LFM2 (`lfm2.py`): gated short-convolution layers with attention layers
    /// (q/k norms per head) at `full_attn_idxs`.
    Lfm2 = "lfm2" { ; }
    /// GLM-4.5 MoE (`glm4_moe.py`): biased q/k/v, partial RoPE, dense first
    /// layers, then sigmoid-routed (`noaux_tc`) experts with shared experts.
    Glm4Moe = "glm4_moe" { ; }
    /// Qwen3-Next (`qwen3_next.py`): Qwen3.5's hybrid stack with the Gated
    /// DeltaNet's projections grouped per key head and no multimodal wrapper.
    Qwen3Next = "qwen3_next" { ; }
    /// DeepSeek-V3 (`deepseek_v3.py`): multi-head latent attention with
    /// YaRN RoPE, dense first layers, then `noaux_tc`-routed experts with
    /// shared experts; also Kimi-K2, which mlx-lm remaps to it.
    DeepseekV3 = "deepseek_v3" {
        ;
        /// Kimi-K2: mlx-lm remaps it to `deepseek_v3`.
        KimiK2 = "kimi_k2",
    }
    /// gpt-oss (`gpt_oss.py`): sliding and full attention layers with
    /// attention sinks and biased projections, routed experts with biases and
    /// a clamped SwiGLU.
    GptOss = "gpt_oss" { ; }
}

/// RoPE of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeKind {
    /// `nn.RoPE(head_dim, traditional, base=theta, scale=1.0)` (`mx.fast.rope` with `base`).
    Default { theta: f32 },
    /// `ProportionalRoPE`: `mx.fast.rope` with `freqs = concat(factor * theta^(arange(0,
    /// rotated_dims, 2)/head_dim), inf × (head_dim - rotated_dims)/2)`.
    Proportional {
        theta: f32,
        partial_rotary_factor: f32,
        factor: f32,
    },
    /// `Llama3RoPE`: `mx.fast.rope` with `freqs` from `theta^(arange(0, dims, 2)/dims)`
    /// smoothed between `low_freq_factor` and `high_freq_factor` (mlx-lm `rope_utils.py`).
    /// The scaling parameters stay f64: mlx-lm combines them as Python floats before
    /// they meet f32 arrays.
    Llama3 {
        theta: f32,
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// `nn.RoPE(head_dim, traditional, base=theta, scale=1 / factor)`: rope_utils'
    /// `linear` scaling, the positions multiplied by `scale` (the Python float
    /// `1 / factor`, passed to `mx.fast.rope` as f32).
    Linear { theta: f32, factor: f64 },
    /// `YarnRoPE` (rope_utils' `yarn`, `deepseek_yarn`): `mx.fast.rope` with
    /// `freqs` blended between `theta^(arange(0, dims, 2)/dims)` and `factor`
    /// times it by a linear ramp over the correction range of `beta_fast` and
    /// `beta_slow`, the rotated dims first multiplied by
    /// `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` where that is
    /// not 1. The scaling stays f64: mlx-lm computes it as Python floats.
    Yarn {
        theta: f32,
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        mscale: f64,
        mscale_all_dim: f64,
    },
    /// No rotation: smollm3.py's `NoPE` module, `rope(x, offset)` returns `x`
    /// (SmolLM3's every `no_rope_layer_interval`-th layer).
    NoPe,
}
