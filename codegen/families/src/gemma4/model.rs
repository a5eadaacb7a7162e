//! The Gemma-4 document: the serde types of a Gemma-4 spec file (full and
//! derived form), in the rules of `crate::model` (every field required, `null`
//! written for an absent feature, unknown fields denied).

use crate::model::{explicit, DerivedIdentity, Identity, Quantization};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
