//! archgen-checkpoint: an mlx-community checkpoint directory read as every
//! archgen model loads it. Its config.json goes through the spec importer and
//! the family's lowering to the block IR (mlx-lm's defaults for what it
//! leaves out); its tensors go through mlx-lm's `sanitize` as the IR's
//! sanitize rules list it. The monolith and the generated models are both
//! built from what [`read_dir`] returns, so neither depends on the other to
//! load.

use archgen_ir::ModelIr;
use archgen_runtime::model::ModelError;
use archgen_runtime::weights::Weights;

mod sanitize;

/// A checkpoint directory's resolved architecture and its sanitized weights:
/// what the monolith and every generated model are built from.
pub fn read_dir(dir: &std::path::Path) -> std::result::Result<(ModelIr, Weights), ModelError> {
    let ckpt = archgen_runtime::weights::read_checkpoint(dir).map_err(|e| ModelError(e.0))?;
    let ir = architecture_of(&ckpt.config, dir)?;
    let tensors = sanitize::sanitize(ckpt.tensors, &ir)
        .map_err(|e| ModelError(format!("{}: {e}", dir.display())))?;
    let quant = quantization_of(&ckpt.config, &ir);
    Ok((ir, Weights::new(tensors, quant.as_ref())))
}

/// The block IR of a config.json, through the spec importer and the
/// family's lowering.
pub fn architecture_of(
    config: &serde_json::Value,
    dir: &std::path::Path,
) -> std::result::Result<ModelIr, ModelError> {
    // The spec name must be a valid file stem starting with a letter; a
    // directory name need not be one.
    let stem: String = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(90)
        .collect();
    let name = format!("checkpoint-{stem}");
    // mlx-optiq's per-layer KV-cache quantization, when the directory has one.
    let kv_path = dir.join("kv_config.json");
    let kv_config: Option<serde_json::Value> = if kv_path.is_file() {
        let text = std::fs::read_to_string(&kv_path)
            .map_err(|e| ModelError(format!("{}: {e}", kv_path.display())))?;
        Some(
            serde_json::from_str(&text)
                .map_err(|e| ModelError(format!("{}: {e}", kv_path.display())))?,
        )
    } else {
        None
    };
    // archgen's kv_scheme.json says the kv_config is applied as mlx-optiq applies it.
    let scheme_path = dir.join(archgen_families::import::KV_SCHEME_FILE);
    let kv = match (&kv_config, scheme_path.is_file()) {
        (None, false) => None,
        (None, true) => {
            return Err(ModelError(format!(
                "{}: present without kv_config.json (it says how kv_config.json is applied); add the kv_config.json or remove it",
                scheme_path.display()
            )))
        }
        (Some(v), false) => Some(archgen_families::import::KvConfig::QuantizedCache(v)),
        (Some(v), true) => {
            let text = std::fs::read_to_string(&scheme_path)
                .map_err(|e| ModelError(format!("{}: {e}", scheme_path.display())))?;
            let scheme: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| ModelError(format!("{}: {e}", scheme_path.display())))?;
            let quantized_kv_start = archgen_families::import::read_kv_scheme(&scheme)
                .map_err(|e| ModelError(format!("{}: {e}", scheme_path.display())))?;
            Some(archgen_families::import::KvConfig::OptiqMixed {
                kv_config: v,
                quantized_kv_start,
            })
        }
    };
    let (spec, _defaults) = archgen_families::import::from_config_json_kv(config, kv, &name)
        .map_err(|e| {
            let kv = match kv {
                None => "",
                Some(archgen_families::import::KvConfig::QuantizedCache(_)) => {
                    " (+ kv_config.json)"
                }
                Some(archgen_families::import::KvConfig::OptiqMixed { .. }) => {
                    " (+ kv_config.json, kv_scheme.json)"
                }
            };
            ModelError(format!("{}/config.json{kv}: {e}", dir.display()))
        })?;
    Ok(spec.lower())
}

/// config.json's `quantization` (or `quantization_config`, also inside
/// `text_config`), with module paths made relative to the text model like the
/// sanitized tensor names (and LFM2's module names read as theirs).
fn quantization_of(config: &serde_json::Value, ir: &ModelIr) -> Option<serde_json::Value> {
    let lfm2_names = ir
        .checkpoint
        .sanitize
        .contains(&archgen_ir::SanitizeRule::RenameLfm2Modules);
    let q = config
        .get("quantization")
        .or_else(|| config.get("quantization_config"))
        .or_else(|| {
            config
                .get("text_config")
                .and_then(|t| t.get("quantization_config"))
        })?;
    let obj = q.as_object()?;
    let mut out = serde_json::Map::new();
    for (k, v) in obj {
        let k = ["language_model.model.", "language_model.", "model."]
            .iter()
            .find_map(|p| k.strip_prefix(p))
            .unwrap_or(k);
        let k = match lfm2_names {
            true => archgen_ir::names::lfm2_shared_name(k),
            false => k.to_string(),
        };
        out.insert(k, v.clone());
    }
    Some(serde_json::Value::Object(out))
}
