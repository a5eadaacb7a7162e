//! The serde types every family's spec file shares (identity, source, the
//! derived identity), and through re-exports the family and `model_type`
//! enums (archgen-ir, beside each other) and Gemma-4's document (its types are
//! in `gemma4/model.rs`). Every field is required: there are no serde defaults,
//! and an `Option` field must still be written, as `null` when the feature is absent
//! (see `explicit`). Every struct denies unknown fields; nothing uses `flatten`.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

pub use archgen_ir::{
    ConfigModelType, Family, QuantMode, QuantOverride, QuantParams, Quantization,
};

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
