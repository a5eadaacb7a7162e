//! What a family is to the registry ([`crate::registry`]): the model types it
//! reads, whether it takes mlx-optiq's `kv_config.json`, its importer. Each
//! family implements [`ModelFamily`] beside its importer.

use crate::model::ConfigModelType;
use crate::reader::{AppliedDefault, ImportError};
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

/// One family (for the dense layout, the families sharing it): what it
/// imports and how.
pub(crate) trait ModelFamily: Sync {
    /// The config.json `model_type`s whose checkpoints this family reads.
    fn model_types(&self) -> &'static [ConfigModelType];
    /// Why a `kv_config.json` cannot be applied to this family, or None
    /// where the family's importer reads it.
    fn kv_config_refused(&self) -> Option<&'static str>;
    /// A validated spec from a config.json of one of [`Self::model_types`].
    fn import(&self, config: &ConfigJson) -> Result<(Spec, Vec<AppliedDefault>), ImportError>;
}
