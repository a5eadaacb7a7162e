//! The families archgen runs, one entry per spec layout, behind one trait:
//! which config.json `model_type`s a family reads, whether it takes
//! mlx-optiq's `kv_config.json`, and its importer. `spec import` and the
//! checkpoint loader pick a family here, and the list of supported model
//! types is this registry's.

use crate::model::ConfigModelType;
pub(crate) use crate::model_family::ConfigJson;
use crate::model_family::ModelFamily;
use crate::reader::{AppliedDefault, ImportError};
use crate::Spec;

/// Every family, in the order their model types were added.
static FAMILIES: [&dyn ModelFamily; 6] = [
    &crate::gemma4::Gemma4Family,
    &crate::dense::DenseFamilies,
    &crate::gemma2::Gemma2Family,
    &crate::qwen3_moe::Qwen3MoeFamily,
    &crate::minicpm::MiniCpmFamily,
    &crate::qwen3_5::Qwen35Family,
];

/// The family that reads `model_type`, if any does.
fn family_of(model_type: ConfigModelType) -> Option<&'static dyn ModelFamily> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.model_types().contains(&model_type))
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
    if let (Some(_), Some(why)) = (config.kv_config, family.kv_config_refused()) {
        return Err(ImportError {
            problems: vec![format!("kv_config.json: {why}")],
        });
    }
    family.import(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_type_has_exactly_one_family() {
        for t in ConfigModelType::ALL {
            let owners = FAMILIES
                .iter()
                .filter(|f| f.model_types().contains(&t))
                .count();
            assert_eq!(owners, 1, "{}", t.as_str());
        }
        assert_eq!(supported_model_types(), ConfigModelType::ALL);
    }
}
