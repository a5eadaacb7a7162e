//! Gemma-4 text models (`gemma4_text.py`, also under `gemma4` and
//! `gemma4_unified`): the family's lowering to the block IR, its config.json
//! import, its YAML writer, its config.json views, its semantic checks
//! (`validate.rs`) and its document types (`model.rs`, `Gemma4Spec`).

mod hf;
mod import;
mod lower;
pub(crate) mod model;
mod validate;
mod yaml;

pub(crate) use hf::{gemma4_config_fields as config_fields, gemma4_config_json as config_json};
pub(crate) use import::import;
pub(crate) use lower::lower;
pub(crate) use validate::check;

use crate::model::Gemma4Spec;
use crate::model_family::{KvConfig, ModelFamily};

crate::document::impl_document!(Gemma4Spec, check, with mixed_kv, yaml = yaml::gemma4_yaml);

// Its derived form (`derive.rs`) sets the stack's sizes as the other forms do.
crate::reduce::impl_stack_sections!(Gemma4Spec);

/// Gemma-4 in the family registry: the one family that reads mlx-optiq's
/// `kv_config.json` itself (as `kv_quantization`).
pub(crate) const FAMILY: ModelFamily = ModelFamily {
    reads: |t| t.family() == crate::Family::Gemma4,
    kv_config: KvConfig::Read,
    import: |c| {
        import(c.top, c.model_type, c.kv_config, c.name)
            .map(|(s, applied)| (crate::Spec::Gemma4(s), applied))
    },
};
