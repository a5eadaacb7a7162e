//! What a family is to the registry ([`crate::registry`]): the model types it
//! reads, whether it takes mlx-optiq's `kv_config.json`, its importer. Each
//! family implements [`ModelFamily`] beside its importer.

use crate::model::ConfigModelType;
use crate::reader::ImportedSpec;
use crate::Spec;
use serde_json::{Map, Value};

/// A config.json being imported.
pub(crate) struct ConfigJson<'a> {
    /// The whole config.json object.
    pub(crate) top: &'a Map<String, Value>,
    pub(crate) model_type: ConfigModelType,
    /// mlx-optiq's `kv_config.json`, when the checkpoint has one.
    pub(crate) kv_config: Option<&'a Value>,
    /// `identity.name` of the spec to make.
    pub(crate) name: &'a str,
}

/// What an importer gives: the spec and the defaults it applied, or its problems.
pub(crate) type Imported = ImportedSpec<Spec>;

/// One family (for the dense layout, the families sharing it): what it
/// imports and how. Each family states its entry beside its importer, as a
/// `FAMILY` constant that [`crate::registry`] lists.
pub(crate) struct ModelFamily {
    /// Whether this family reads checkpoints of a config.json `model_type`.
    pub(crate) reads: fn(ConfigModelType) -> bool,
    /// What it does with mlx-optiq's `kv_config.json`.
    pub(crate) kv_config: KvConfig,
    /// A validated spec from a config.json of a model type it reads.
    pub(crate) import: fn(&ConfigJson) -> Imported,
}

/// The entry of a family of one layout and one importer, `$import(top, name)`,
/// whose specs are `Spec::$family` and which refuses mlx-optiq's
/// `kv_config.json` as [`GEMMA4_ONLY`].
macro_rules! single_family {
    ($family:ident, $import:path) => {
        $crate::model_family::ModelFamily {
            reads: |t| t.family() == $crate::Family::$family,
            kv_config: $crate::model_family::GEMMA4_ONLY,
            import: |c| {
                $import(c.top, c.name).map(|(s, applied)| ($crate::Spec::$family(s), applied))
            },
        }
    };
}
pub(crate) use single_family;

/// A family's answer to a checkpoint with mlx-optiq's `kv_config.json`.
pub(crate) enum KvConfig {
    /// Its importer reads the file (as the spec's KV quantization).
    Read,
    /// It cannot apply one: the reason, as `kv_config.json: {reason}`.
    Refused(&'static str),
}

/// The reason most families give: only Gemma-4's attention reads a
/// quantized KV cache.
pub(crate) const GEMMA4_ONLY: KvConfig =
    KvConfig::Refused("KV-cache quantization is supported for Gemma-4 only");
