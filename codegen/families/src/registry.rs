//! The families archgen runs, one entry per spec layout, each a [`ModelFamily`]:
//! which config.json `model_type`s a family reads, whether it takes
//! mlx-optiq's `kv_config.json`, and its importer. `spec import` and the
//! checkpoint loader pick a family here, and the list of supported model
//! types is this registry's.

use crate::model::ConfigModelType;
pub(crate) use crate::model_family::ConfigJson;
use crate::model_family::{KvConfig, ModelFamily};
use crate::reader::{AppliedDefault, ImportError};
use crate::Spec;

/// Every family, in the order their model types were added.
static FAMILIES: &[&ModelFamily] = &[
    &crate::gemma4::FAMILY,
    &crate::dense::FAMILY,
    &crate::gemma::FAMILY,
    &crate::qwen3_moe::FAMILY,
    &crate::minicpm::FAMILY,
    &crate::qwen3_5::FAMILY,
    &crate::lfm2::FAMILY,
    &crate::glm4_moe::FAMILY,
    &crate::qwen3_5::qwen3_next::FAMILY,
    &crate::deepseek_v3::FAMILY,
    &crate::gpt_oss::FAMILY,
];

/// The family that reads `model_type`, if any does.
fn family_of(model_type: ConfigModelType) -> Option<&'static ModelFamily> {
    FAMILIES.iter().copied().find(|f| (f.reads)(model_type))
}

/// Every config.json `model_type` some family reads, in declaration order.
pub fn supported_model_types() -> Vec<ConfigModelType> {
    ConfigModelType::ALL
        .into_iter()
        .filter(|t| family_of(*t).is_some())
        .collect()
}

/// Imports `config` with the family that reads its model type: a family
/// that takes no `kv_config.json` refuses one first.
pub(crate) fn import(config: &ConfigJson) -> Result<(Spec, Vec<AppliedDefault>), ImportError> {
    let Some(family) = family_of(config.model_type) else {
        return Err(ImportError {
            problems: vec![format!(
                "model_type: `{}` is not a supported model",
                config.model_type.as_str()
            )],
        });
    };
    match (config.kv_config, &family.kv_config) {
        (Some(_), KvConfig::Refused(why)) => Err(ImportError {
            problems: vec![format!("kv_config.json: {why}")],
        }),
        (None, _) | (Some(_), KvConfig::Read) => (family.import)(config),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_type_has_exactly_one_family() {
        for t in ConfigModelType::ALL {
            let owners = FAMILIES.iter().filter(|f| (f.reads)(t)).count();
            assert_eq!(owners, 1, "{}", t.as_str());
        }
        assert_eq!(supported_model_types(), ConfigModelType::ALL);
    }
}
