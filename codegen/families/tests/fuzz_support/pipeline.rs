//! The spec and config-import pipelines the fuzz targets drive (`fuzz/`), shared
//! with the bounded replay test so `cargo test` runs exactly the same code.
#![allow(dead_code)]

use archgen_families::{ConfigModelType, Spec};

/// Bytes → spec text → parse + validate → lower to the block IR
/// (with its tensor names) → YAML and HF config.json,
/// each read back to the same spec. Returns whether the spec parsed. Must
/// never panic.
pub fn spec_pipeline(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(spec) = archgen_families::parse_str(&text, "fuzz.yaml") else {
        return false;
    };
    let _ = spec.lower().param_count();
    let origin = format!("{}.yaml", spec.name());
    let yaml = archgen_families::to_yaml(&spec);
    let again = archgen_families::parse_str(&yaml, &origin)
        .unwrap_or_else(|d| panic!("a valid spec's YAML does not parse: {d}\n{yaml}"));
    assert_eq!(again, spec, "YAML round trip");
    round_trip_hf(&spec);
    true
}

/// The HF view, imported again as a flat gemma4_text config, gives the same spec.
fn round_trip_hf(spec: &Spec) {
    let mut flat = archgen_families::to_hf_json(spec);
    if spec.as_gemma4().is_some() {
        flat["model_type"] = "gemma4_text".into();
    }
    let (back, _) = archgen_families::import::from_config_json(&flat, None, spec.name())
        .unwrap_or_else(|e| panic!("a valid spec's config.json does not import: {e}\n{flat}"));
    let _ = back.lower().param_count();
    let mut expected = spec.clone();
    expected.identity_mut().source.repo = None;
    expected.identity_mut().source.revision = None;
    if let Some(g) = expected.as_gemma4_mut() {
        g.identity.source.model_type = ConfigModelType::Gemma4Text;
        g.kv_quantization = None;
    }
    assert_eq!(back, expected, "config.json round trip");
}

/// Bytes → JSON → config import → lower → HF config.json →
/// import again.
/// Returns whether the config imported. Must never panic.
pub fn config_import(data: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return false;
    };
    let Ok((spec, _)) = archgen_families::import::from_config_json(&value, None, "fuzz") else {
        return false;
    };
    let _ = spec.lower().param_count();
    round_trip_hf(&spec);
    true
}
