//! The serde types of a spec file. Every field is required: there are no serde defaults,
//! and an `Option` field must still be written, as `null` when the feature is absent
//! (see `explicit`). Every struct denies unknown fields; nothing uses `flatten`.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

pub use archgen_ir::{ConfigModelType, QuantMode, QuantOverride, QuantParams, Quantization};

/// The only format version this crate reads.
pub const FORMAT_VERSION: u32 = 1;

/// Deserializes an `Option` field without serde's "missing means None" rule: with
/// `deserialize_with`, serde reports a missing field instead, so `null` must be written.
pub(crate) fn explicit<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}

/// A resolved, full spec: what a full spec file holds, and what a derived spec file
/// resolves to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (full form)")]
pub struct Gemma4Spec {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: Identity,
    pub model: ModelDims,
    pub layers: Layers,
    pub attention: Attention,
    pub rope: Rope,
    pub mlp: Mlp,
    /// Mixture-of-experts block on every layer (`enable_moe_block`), or null.
    #[serde(deserialize_with = "explicit")]
    pub moe: Option<Moe>,
    /// Per-layer inputs (PLE), or null when `hidden_size_per_layer_input` is 0.
    #[serde(deserialize_with = "explicit")]
    pub per_layer_input: Option<PerLayerInput>,
    /// Weight quantization as the mlx config's `quantization` dict, or null (bf16 weights).
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
    /// Per-layer KV-cache quantization (mlx-optiq `kv_config.json`), or null.
    #[serde(deserialize_with = "explicit")]
    pub kv_quantization: Option<Vec<KvQuantEntry>>,
    /// mlx-optiq per-layer mixed-precision KV (`kv_config.json` as `install_mixed_kv`
    /// applies it; tier L2), or null. The one section that may be left out (absent
    /// means null), so specs written before it read unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_kv: Option<crate::MixedKv>,
}

/// Who this architecture is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// Spec name; equals the file name without `.yaml`. Lowercase, digits, `-`, `_`, `.`.
    pub name: String,
    pub family: Family,
    pub source: Source,
}

/// Model family: which document layout the spec has and which runtime blocks run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Gemma-4 text models (`gemma4_text.py`).
    Gemma4,
    /// Dense Qwen3 (`qwen3.py`): q/k RMSNorm per head, SwiGLU.
    Qwen3,
    /// Dense Llama (`llama.py`), incl. Llama-3 RoPE scaling; also Mistral,
    /// which mlx-lm runs as llama (`MODEL_REMAPPING`).
    Llama,
    /// Dense Qwen2 / Qwen2.5 (`qwen2.py`): a bias on the q, k and v projections.
    Qwen2,
    /// Gemma-2 (`gemma2.py`): `1 + w` norms, softcapped written-out attention.
    Gemma2,
    /// Qwen3-MoE (`qwen3_moe.py`): Qwen3 attention, routed SwiGLU experts.
    Qwen3Moe,
    /// MiniCPM (`minicpm.py`): Llama's stack with embedding, residual and logit scales.
    #[serde(rename = "minicpm")]
    MiniCpm,
    /// Qwen3.5 / Qwen3.6 (`qwen3_5.py`): Gated DeltaNet layers with a gated
    /// full-attention layer every `full_attention_interval`.
    #[serde(rename = "qwen3_5")]
    Qwen35,
    /// SmolLM3 (`smollm3.py`): Llama's stack without RoPE on every
    /// `no_rope_layer_interval`-th layer (its `NoPE` module).
    #[serde(rename = "smollm3")]
    SmolLm3,
    /// Granite (`granite.py`): Llama's stack with embedding, attention,
    /// residual and logits multipliers.
    Granite,
    /// Phi-3 (`phi3.py`): Llama's stack with one fused `qkv_proj` and one fused
    /// `gate_up_proj`, each a matmul then split.
    Phi3,
    /// OLMo-2 (`olmo2.py`): Llama's sizes with the norms after the mixer and
    /// the MLP (none before) and q/k RMSNorm over the whole projections.
    Olmo2,
}

impl Family {
    /// The spec spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Gemma4 => "gemma4",
            Family::Qwen3 => "qwen3",
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Gemma2 => "gemma2",
            Family::Qwen3Moe => "qwen3_moe",
            Family::MiniCpm => "minicpm",
            Family::Qwen35 => "qwen3_5",
            Family::SmolLm3 => "smollm3",
            Family::Granite => "granite",
            Family::Phi3 => "phi3",
            Family::Olmo2 => "olmo2",
        }
    }
    /// Dense decoder families share one document layout ([`crate::DenseSpec`]).
    pub fn is_dense(self) -> bool {
        matches!(
            self,
            Family::Qwen3
                | Family::Llama
                | Family::Qwen2
                | Family::SmolLm3
                | Family::Granite
                | Family::Phi3
                | Family::Olmo2
        )
    }
}

/// The checkpoint the architecture comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Hub repository (`org/name`), or null when unknown.
    #[serde(deserialize_with = "explicit")]
    pub repo: Option<String>,
    /// Commit of that repository, or null when unpinned.
    #[serde(deserialize_with = "explicit")]
    pub revision: Option<String>,
    /// Top-level `model_type` of the checkpoint's config.json. It fixes the mlx module
    /// tree: `gemma4`/`gemma4_unified` nest the text model under `language_model.model.`,
    /// `gemma4_text` under `model.`.
    pub model_type: ConfigModelType,
}

/// The family a config.json `model_type` belongs to: the one place that maps
/// the checkpoint's name (an IR fact, [`ConfigModelType`]) to a spec layout.
pub trait ModelTypeFamily {
    /// The family whose mlx-lm module reads this `model_type`.
    fn family(self) -> Family;
}

impl ModelTypeFamily for ConfigModelType {
    fn family(self) -> Family {
        match self {
            ConfigModelType::Gemma4
            | ConfigModelType::Gemma4Text
            | ConfigModelType::Gemma4Unified => Family::Gemma4,
            ConfigModelType::Qwen3 => Family::Qwen3,
            ConfigModelType::Llama | ConfigModelType::Mistral => Family::Llama,
            ConfigModelType::Qwen2 => Family::Qwen2,
            ConfigModelType::Gemma2 => Family::Gemma2,
            ConfigModelType::Qwen3Moe => Family::Qwen3Moe,
            ConfigModelType::MiniCpm => Family::MiniCpm,
            ConfigModelType::Qwen35 | ConfigModelType::Qwen35Moe => Family::Qwen35,
            ConfigModelType::SmolLm3 => Family::SmolLm3,
            ConfigModelType::Granite => Family::Granite,
            ConfigModelType::Phi3 => Family::Phi3,
            ConfigModelType::Olmo2 => Family::Olmo2,
        }
    }
}

/// Model-wide dimensions and numerics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelDims {
    /// `hidden_size`.
    pub hidden_size: u32,
    /// `vocab_size` (rows of `embed_tokens`).
    pub vocab_size: u32,
    /// `rms_norm_eps`, used by every RMSNorm.
    pub rms_norm_eps: f64,
    /// `tie_word_embeddings`: the head is `embed_tokens.as_linear`.
    pub tie_word_embeddings: bool,
    /// `final_logit_softcapping` (tanh softcap on the logits), or null for none.
    /// mlx-lm defaults to 30.0 and transformers to none, so it is always written.
    #[serde(deserialize_with = "explicit")]
    pub final_logit_softcapping: Option<f64>,
    /// `max_position_embeddings` (informational for default/proportional RoPE).
    pub max_position_embeddings: u32,
}

/// Attention type of one layer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// `sliding_attention`: window mask, rotating cache, `head_dim`.
    Sliding,
    /// `full_attention`: causal mask, growing cache, `global_head_dim`.
    Full,
}

impl LayerType {
    /// The config.json spelling (`sliding_attention` / `full_attention`).
    pub fn hf_name(self) -> &'static str {
        match self {
            LayerType::Sliding => "sliding_attention",
            LayerType::Full => "full_attention",
        }
    }
}

/// The decoder stack: layer count, per-layer types, KV sharing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Layers {
    /// `num_hidden_layers`.
    pub num_hidden_layers: u32,
    /// One period of `layer_types`; the resolved list is `pattern` repeated `repeat`
    /// times and must have exactly `num_hidden_layers` entries (no truncation). A list
    /// without a period is written whole with `repeat: 1`.
    pub pattern: Vec<LayerType>,
    /// How many times `pattern` repeats.
    pub repeat: u32,
    /// `num_kv_shared_layers`: the last this-many layers reuse the K/V of the last
    /// non-shared layer of the same type (mlx-lm default 20, transformers 0).
    pub num_kv_shared_layers: u32,
}

/// Attention geometry. Sliding layers use `head_dim` and `num_key_value_heads`; full
/// layers use `global_head_dim` (or `head_dim` when null) and, when `attention_k_eq_v`,
/// `num_global_key_value_heads` (or `num_key_value_heads` when null).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Attention {
    /// `num_attention_heads` (query heads, every layer).
    pub num_attention_heads: u32,
    /// `num_key_value_heads`.
    pub num_key_value_heads: u32,
    /// `num_global_key_value_heads`: KV heads of full layers, only read when
    /// `attention_k_eq_v` is true; must be null otherwise.
    #[serde(deserialize_with = "explicit")]
    pub num_global_key_value_heads: Option<u32>,
    /// `attention_k_eq_v`: full layers have no `v_proj`; V is the raw `k_proj` output.
    pub attention_k_eq_v: bool,
    /// `head_dim` of sliding layers.
    pub head_dim: u32,
    /// `global_head_dim` of full layers, or null to use `head_dim`.
    #[serde(deserialize_with = "explicit")]
    pub global_head_dim: Option<u32>,
    /// `sliding_window`: window of the sliding mask and size of the rotating cache.
    pub sliding_window: u32,
}

/// RoPE per layer type (`rope_parameters`) and `rope_traditional`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rope {
    /// `rope_traditional` (pairs (2i, 2i+1) instead of (i, i+d/2)).
    pub traditional: bool,
    /// `rope_parameters.sliding_attention`.
    pub sliding: RopeParams,
    /// `rope_parameters.full_attention`.
    pub full: RopeParams,
}

/// One `rope_parameters` entry, by `rope_type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "rope_type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RopeParams {
    /// `nn.RoPE(dims, base=rope_theta, scale=1)`; mlx-lm ignores any partial factor here.
    Default {
        /// `rope_theta` (the base).
        rope_theta: f64,
    },
    /// `ProportionalRoPE`: the first `int(dims*partial_rotary_factor)` dims rotate with
    /// frequencies `factor * theta^(2i/dims)`; the rest pass through.
    Proportional {
        /// `rope_theta` (the base).
        rope_theta: f64,
        /// `partial_rotary_factor`, in (0, 1].
        partial_rotary_factor: f64,
        /// `factor` (mlx-lm default 1.0 when the config omits it).
        factor: f64,
    },
}

/// Dense MLP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Mlp {
    /// `intermediate_size` (GeGLU width).
    pub intermediate_size: u32,
    /// `use_double_wide_mlp`: KV-shared layers use `2 * intermediate_size`
    /// (mlx-lm default true, transformers false).
    pub use_double_wide_mlp: bool,
}

/// Mixture of experts, run in parallel with the dense MLP on every layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Moe {
    /// `num_experts`.
    pub num_experts: u32,
    /// `top_k_experts`.
    pub top_k_experts: u32,
    /// `moe_intermediate_size` (expert GeGLU width).
    pub moe_intermediate_size: u32,
}

/// Per-layer inputs (PLE).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PerLayerInput {
    /// `hidden_size_per_layer_input` (width P of each layer's input).
    pub hidden_size_per_layer_input: u32,
    /// `vocab_size_per_layer_input` (rows of `embed_tokens_per_layer`).
    pub vocab_size_per_layer_input: u32,
}

/// One per-layer KV-cache quantization entry (mlx-optiq `kv_config.json` item).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KvQuantEntry {
    /// Layer index; must own a cache (not a KV-shared layer).
    pub layer_idx: u32,
    /// Bits of the affine-quantized K and V.
    pub bits: u32,
    /// Group size along the head dimension.
    pub group_size: u32,
}

/// A derived spec file: a declared reduction of another spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "archgen architecture spec (derived form)")]
pub struct DerivedSpecFile {
    /// Spec format version; must be 1.
    pub format_version: u32,
    pub identity: DerivedIdentity,
    pub derive: Derive,
}

/// Identity of a derived spec; family and source are inherited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DerivedIdentity {
    /// Spec name; equals the file name without `.yaml`.
    pub name: String,
}

/// How a derived spec is made from its parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Derive {
    /// Name of the parent spec (`<from>.yaml` in the same directory).
    pub from: String,
    /// Sizes to shrink, or null to keep the parent's sizes (e.g. a quantized variant).
    #[serde(deserialize_with = "explicit")]
    pub reduce: Option<Reduce>,
    /// Weight quantization of the derived spec (never inherited), or null.
    #[serde(deserialize_with = "explicit")]
    pub quantization: Option<Quantization>,
    /// KV-cache quantization of the derived spec (never inherited), or null.
    #[serde(deserialize_with = "explicit")]
    pub kv_quantization: Option<Vec<KvQuantEntry>>,
    /// mlx-optiq per-layer mixed KV of the derived spec (never inherited); may be left
    /// out (absent means null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_kv: Option<crate::MixedKv>,
}

/// The reduced sizes. Everything structural (layer pattern, flags, RoPE, softcap, eps,
/// tying) is inherited. A size whose feature the parent lacks must be null, and one
/// whose feature the parent has must be set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reduce {
    /// Periods of the parent's layer pattern to keep.
    pub periods: u32,
    /// KV-shared layers of the result (0 iff the parent has none; the parent's
    /// alignment to the pattern period is kept).
    pub num_kv_shared_layers: u32,
    pub hidden_size: u32,
    pub vocab_size: u32,
    pub num_attention_heads: u32,
    pub num_key_value_heads: u32,
    #[serde(deserialize_with = "explicit")]
    pub num_global_key_value_heads: Option<u32>,
    pub head_dim: u32,
    #[serde(deserialize_with = "explicit")]
    pub global_head_dim: Option<u32>,
    pub sliding_window: u32,
    pub intermediate_size: u32,
    #[serde(deserialize_with = "explicit")]
    pub num_experts: Option<u32>,
    #[serde(deserialize_with = "explicit")]
    pub top_k_experts: Option<u32>,
    #[serde(deserialize_with = "explicit")]
    pub moe_intermediate_size: Option<u32>,
    #[serde(deserialize_with = "explicit")]
    pub hidden_size_per_layer_input: Option<u32>,
    #[serde(deserialize_with = "explicit")]
    pub vocab_size_per_layer_input: Option<u32>,
}

impl Gemma4Spec {
    /// The resolved `layer_types` list (`pattern` repeated `repeat` times).
    pub fn layer_types(&self) -> Vec<LayerType> {
        let mut v = Vec::with_capacity(self.layers.pattern.len() * self.layers.repeat as usize);
        for _ in 0..self.layers.repeat {
            v.extend_from_slice(&self.layers.pattern);
        }
        v
    }
}
