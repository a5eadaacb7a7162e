//! config.json → spec: the family that reads the `model_type` imports it, reading
//! fields exactly as mlx-lm 0.32.2 does (each family's `ModelArgs`, `utils.py`
//! quantization handling); mlx-optiq's `kv_config.json` is read here. Every default
//! applied and every normalisation made is reported as an [`AppliedDefault`].

use crate::reader::{read_kv_config, Reader};
pub use crate::reader::{AppliedDefault, ImportError};
use serde_json::{json, Map, Value};

/// The file archgen writes next to `kv_config.json` when the config is applied as
/// mlx-optiq applies it (tier L2); without it, kv_config.json is `kv_quantization` (L1).
pub const KV_SCHEME_FILE: &str = "kv_scheme.json";
/// The `scheme` of [`KV_SCHEME_FILE`].
pub const OPTIQ_SCHEME: &str = "mlx-optiq install_mixed_kv";

/// The content of [`KV_SCHEME_FILE`] for optiq's `quantized_kv_start`.
pub fn kv_scheme_json(quantized_kv_start: u32) -> Value {
    json!({ "scheme": OPTIQ_SCHEME, "quantized_kv_start": quantized_kv_start })
}

/// `quantized_kv_start` from the content of [`KV_SCHEME_FILE`].
pub fn read_kv_scheme(v: &Value) -> Result<u32, String> {
    match v.get("scheme").and_then(Value::as_str) {
        Some(OPTIQ_SCHEME) => {}
        other => {
            return Err(format!(
                "`scheme`: expected \"{OPTIQ_SCHEME}\", found {}",
                other.map_or("nothing".to_string(), |s| format!("\"{s}\""))
            ))
        }
    }
    v.get("quantized_kv_start")
        .and_then(Value::as_u64)
        .and_then(|x| u32::try_from(x).ok())
        .ok_or_else(|| "`quantized_kv_start`: expected a non-negative integer".to_string())
}

/// How a checkpoint's `kv_config.json` (`[{layer_idx, bits, group_size}]`) is applied.
#[derive(Debug, Clone, Copy)]
pub enum KvConfig<'a> {
    /// A `QuantizedKVCache` from the first token on each listed layer, as stock mlx-lm
    /// runs it (spec `kv_quantization`, tier L1; Gemma-4 only).
    QuantizedCache(&'a Value),
    /// As mlx-optiq's `install_mixed_kv` applies it: plain caches converted after the
    /// first forward that leaves `quantized_kv_start` positions (spec `mixed_kv`, L2).
    OptiqMixed {
        kv_config: &'a Value,
        quantized_kv_start: u32,
    },
}

/// [`from_config_json`] with the way kv_config.json is applied spelled out.
pub fn from_config_json_kv(
    value: &Value,
    kv: Option<KvConfig<'_>>,
    name: &str,
) -> Result<(crate::Spec, Vec<AppliedDefault>), ImportError> {
    let (kv_config, quantized_kv_start) = match kv {
        None => return from_config_json(value, None, name),
        Some(KvConfig::QuantizedCache(v)) => return from_config_json(value, Some(v), name),
        Some(KvConfig::OptiqMixed {
            kv_config,
            quantized_kv_start,
        }) => (kv_config, quantized_kv_start),
    };
    let (mut spec, mut applied) = from_config_json(value, None, name)?;
    let empty = Map::new();
    let mut r = Reader::new(&empty, "");
    let entries = read_kv_config(kv_config, &mut r);
    applied.append(&mut r.applied);
    if !r.problems.is_empty() {
        return Err(ImportError {
            problems: r.problems,
        });
    }
    let n_layers = spec.lower().layers.len();
    let mixed =
        crate::MixedKv::from_kv_config(&entries.unwrap_or_default(), n_layers, quantized_kv_start);
    if let Some(e) = kv_config
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("layer_idx").and_then(Value::as_u64))
        .find(|&i| i as usize >= n_layers)
    {
        return Err(ImportError {
            problems: vec![format!(
                "kv_config: layer_idx {e} does not exist (the model has {n_layers} layers)"
            )],
        });
    }
    let family = spec.family();
    let Some(slot) = spec.document_mut().mixed_kv_mut() else {
        return Err(ImportError {
            problems: vec![format!(
                "kv_config.json: mlx-optiq's per-layer mixed KV is supported for Gemma-4 and the dense families (qwen3, llama, qwen2) only, not for {}",
                family.as_str()
            )],
        });
    };
    *slot = Some(mixed);
    spec.validate().map_err(|d| ImportError {
        problems: d
            .iter()
            .map(|i| {
                format!(
                    "kv_config.json: {}: {} (expected {}); hint: {}",
                    i.path, i.message, i.expected, i.hint
                )
            })
            .collect(),
    })?;
    Ok((spec, applied))
}

/// Imports an mlx-lm / Hugging Face `config.json` (`model_type` `gemma4` with
/// `text_config`, flat `gemma4_text`, or `gemma4_unified`) and optionally a
/// `kv_config.json` value. Absent fields take mlx-lm 0.32.2's defaults; the list says
/// which. The result is validated.
pub fn from_config_json(
    value: &Value,
    kv_config: Option<&Value>,
    name: &str,
) -> Result<(crate::Spec, Vec<AppliedDefault>), ImportError> {
    let fail = |m: String| ImportError { problems: vec![m] };
    let top = value
        .as_object()
        .ok_or_else(|| fail("config.json: expected a JSON object".into()))?;
    let Some(written) = top.get("model_type").and_then(Value::as_str) else {
        return Err(fail(
            "model_type: missing (mlx-lm needs it to pick the model)".into(),
        ));
    };
    let supported = crate::registry::supported_model_types();
    let Some(&model_type) = supported.iter().find(|t| t.as_str() == written) else {
        let names: Vec<&str> = supported.iter().map(|t| t.as_str()).collect();
        return Err(fail(format!(
            "model_type: `{written}` is not a supported model ({})",
            names.join(", ")
        )));
    };
    crate::registry::import(&crate::registry::ConfigJson {
        top,
        model_type,
        kv_config,
        name,
    })
}
