//! Gemma-4 text models (`gemma4_text.py`, also under `gemma4` and
//! `gemma4_unified`): the family's lowering to the block IR, its config.json
//! import, its YAML writer and its config.json views. The document types
//! (`Gemma4Spec`) and their validation are in `model.rs` and `validate.rs`.

mod hf;
mod import;
mod lower;
mod yaml;

pub(crate) use hf::{gemma4_config_json as config_json, gemma4_hf_json as hf_json};
pub(crate) use import::import;
pub(crate) use lower::lower;
pub(crate) use yaml::gemma4_yaml as to_yaml;
