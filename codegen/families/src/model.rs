//! The serde types every family's spec file shares (identity, family, source, the
//! derived identity), and through a re-export Gemma-4's document (its types are in
//! `gemma4/model.rs`). Every field is required: there are no serde defaults,
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

/// Identity of a derived spec; family and source are inherited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DerivedIdentity {
    /// Spec name; equals the file name without `.yaml`.
    pub name: String,
}

// Gemma-4's document types live with the family; re-exported so that
// `crate::model::*` stays the one import of every document type.
pub use crate::gemma4::model::*;
