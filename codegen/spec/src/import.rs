//! config.json → spec, reading fields exactly as mlx-lm 0.32.2 does (`gemma4.py`,
//! `gemma4_text.py` `ModelArgs`, `utils.py` quantization handling). Every default applied
//! and every normalisation made is reported as an [`AppliedDefault`].

use crate::model::*;
use crate::reader::{read_quantization, Reader, ABSENT};
pub use crate::reader::{AppliedDefault, ImportError};
use crate::validate;
use serde_json::{json, Map, Value};

fn minimal_period(types: &[LayerType]) -> usize {
    let n = types.len();
    (1..=n)
        .find(|&p| n % p == 0 && types.iter().enumerate().all(|(i, t)| *t == types[i % p]))
        .unwrap_or(n.max(1))
}

fn read_kv_config(kv: &Value, r: &mut Reader) -> Option<Vec<KvQuantEntry>> {
    let Some(items) = kv.as_array() else {
        r.problems.push(format!(
            "kv_config: expected a JSON list of {{layer_idx, bits, group_size}}, found {kv}"
        ));
        return None;
    };
    let mut out = Vec::new();
    for (i, e) in items.iter().enumerate() {
        let int = |k: &str| {
            e.get(k)
                .and_then(Value::as_u64)
                .and_then(|x| u32::try_from(x).ok())
        };
        let (Some(layer_idx), Some(bits)) = (int("layer_idx"), int("bits")) else {
            r.problems.push(format!(
                "kv_config[{i}]: `layer_idx` and `bits` are required integers"
            ));
            continue;
        };
        let group_size = int("group_size").unwrap_or_else(|| {
            r.applied.push(AppliedDefault {
                field: format!("kv_config[{i}].group_size"),
                value: json!(64),
                reason: "absent: mlx-optiq default".into(),
            });
            64
        });
        out.push(KvQuantEntry {
            layer_idx,
            bits,
            group_size,
        });
    }
    out.sort_by_key(|e| e.layer_idx);
    Some(out)
}

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
    match &mut spec {
        crate::Spec::Gemma4(s) => s.mixed_kv = Some(mixed),
        crate::Spec::Dense(s) => s.mixed_kv = Some(mixed),
        crate::Spec::Gemma2(_)
        | crate::Spec::Qwen3Moe(_)
        | crate::Spec::MiniCpm(_)
        | crate::Spec::Qwen35(_) => {
            return Err(ImportError {
                problems: vec![format!(
                    "kv_config.json: mlx-optiq's per-layer mixed KV is supported for Gemma-4 and the dense families (qwen3, llama, qwen2) only, not for {}",
                    spec.family().as_str()
                )],
            })
        }
    }
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
    let model_type = match top.get("model_type").and_then(Value::as_str) {
        Some("gemma4") => ConfigModelType::Gemma4,
        Some("gemma4_text") => ConfigModelType::Gemma4Text,
        Some("gemma4_unified") => ConfigModelType::Gemma4Unified,
        Some("qwen3") => ConfigModelType::Qwen3,
        Some("llama") => ConfigModelType::Llama,
        Some("mistral") => ConfigModelType::Mistral,
        Some("qwen2") => ConfigModelType::Qwen2,
        Some("gemma2") => ConfigModelType::Gemma2,
        Some("qwen3_moe") => ConfigModelType::Qwen3Moe,
        Some("minicpm") => ConfigModelType::MiniCpm,
        Some("qwen3_5") => ConfigModelType::Qwen35,
        Some("qwen3_5_moe") => ConfigModelType::Qwen35Moe,
        Some("smollm3") => ConfigModelType::SmolLm3,
        Some("granite") => ConfigModelType::Granite,
        Some("phi3") => ConfigModelType::Phi3,
        Some("olmo2") => ConfigModelType::Olmo2,
        Some(other) => return Err(fail(format!("model_type: `{other}` is not a supported model (gemma4, gemma4_text, gemma4_unified, qwen3, llama, mistral, qwen2, gemma2, qwen3_moe, minicpm, qwen3_5, qwen3_5_moe, smollm3, granite, phi3, olmo2)"))),
        None => return Err(fail("model_type: missing (mlx-lm needs it to pick the model)".into())),
    };
    if model_type == ConfigModelType::MiniCpm {
        if kv_config.is_some() {
            return Err(fail(
                "kv_config.json: KV-cache quantization is supported for Gemma-4 only".into(),
            ));
        }
        return crate::minicpm::import(top, name)
            .map(|(s, applied)| (crate::Spec::MiniCpm(s), applied));
    }
    if model_type == ConfigModelType::Qwen3Moe {
        if kv_config.is_some() {
            return Err(fail(
                "kv_config.json: KV-cache quantization is supported for Gemma-4 only".into(),
            ));
        }
        return crate::qwen3_moe::import(top, name)
            .map(|(s, applied)| (crate::Spec::Qwen3Moe(s), applied));
    }
    if model_type.family() == crate::Family::Qwen35 {
        if kv_config.is_some() {
            return Err(fail(
                "kv_config.json: KV-cache quantization is not supported for qwen3_5 (its linear layers have no K/V cache)".into(),
            ));
        }
        return crate::qwen3_5::import(top, model_type, name)
            .map(|(s, applied)| (crate::Spec::Qwen35(s), applied));
    }
    if let Some(family) = crate::dense::DenseFamily::of(model_type.family()) {
        if kv_config.is_some() {
            return Err(fail(
                "kv_config.json: KV-cache quantization is supported for Gemma-4 only".into(),
            ));
        }
        return crate::dense::import(top, model_type, family, name)
            .map(|(s, applied)| (crate::Spec::Dense(s), applied));
    }
    if model_type == ConfigModelType::Gemma2 {
        if kv_config.is_some() {
            return Err(fail(
                "kv_config.json: KV-cache quantization is supported for Gemma-4 only (mlx-lm's gemma2 attention cannot read a quantized cache)".into(),
            ));
        }
        return crate::gemma2::import(top, name)
            .map(|(s, applied)| (crate::Spec::Gemma2(s), applied));
    }
    gemma4_import(top, model_type, kv_config, name)
        .map(|(s, applied)| (crate::Spec::Gemma4(s), applied))
}

fn gemma4_import(
    top: &Map<String, Value>,
    model_type: ConfigModelType,
    kv_config: Option<&Value>,
    name: &str,
) -> Result<(Gemma4Spec, Vec<AppliedDefault>), ImportError> {
    let fail = |m: String| ImportError { problems: vec![m] };
    let empty = Map::new();
    let wrapped = model_type != ConfigModelType::Gemma4Text;
    let (text, prefix) = if wrapped {
        match top.get("text_config") {
            None | Some(Value::Null) => (&empty, "text_config."),
            Some(Value::Object(t)) => (t, "text_config."),
            Some(other) => {
                return Err(fail(format!(
                    "text_config: expected an object, found {other}"
                )))
            }
        }
    } else {
        (top, "")
    };
    let mut r = Reader {
        obj: text,
        prefix,
        applied: Vec::new(),
        problems: Vec::new(),
    };
    if wrapped && text.is_empty() {
        r.note("", json!({}), "text_config absent: mlx-lm uses {}");
    }

    // gemma4.ModelArgs: the top-level vocab_size (default 262144) overwrites text_config's.
    let vocab_size = if wrapped {
        let mut top_r = Reader {
            obj: top,
            prefix: "",
            applied: Vec::new(),
            problems: Vec::new(),
        };
        let v = top_r.uint("vocab_size", 262_144);
        r.applied.extend(top_r.applied);
        r.problems.extend(top_r.problems);
        if let Some(tv) = text.get("vocab_size") {
            if tv.as_u64() != Some(v as u64) {
                r.note(
                    "vocab_size",
                    json!(v),
                    "overwritten by the top-level vocab_size (gemma4 wrapper)",
                );
            }
        }
        v
    } else {
        r.uint("vocab_size", 262_144)
    };
    let hidden_size = r.uint("hidden_size", 1536);
    let num_layers = r.uint("num_hidden_layers", 35);
    let intermediate_size = r.uint("intermediate_size", 6144);
    let num_heads = r.uint("num_attention_heads", 8);
    let head_dim = r.uint("head_dim", 256);
    let global_head_dim = r.opt_uint("global_head_dim", Some(512)).filter(|g| *g != 0);
    let rms_norm_eps = r.float("rms_norm_eps", 1e-6);
    let vocab_ple = r.opt_uint("vocab_size_per_layer_input", Some(262_144));
    let num_kv = r.uint("num_key_value_heads", 1);
    let mut global_kv = r.opt_uint("num_global_key_value_heads", None);
    let shared = r.uint("num_kv_shared_layers", 20);
    let ple_width = r
        .opt_uint("hidden_size_per_layer_input", Some(256))
        .filter(|w| *w != 0);
    let traditional = r.boolean("rope_traditional", false);
    let sliding_window = r.uint("sliding_window", 512);
    let max_pos = r.uint("max_position_embeddings", 131_072);
    let k_eq_v = r.boolean("attention_k_eq_v", false);
    let softcap = match text.get("final_logit_softcapping") {
        None => {
            r.note("final_logit_softcapping", json!(30.0), ABSENT);
            Some(30.0)
        }
        Some(Value::Null) => None,
        Some(_) => Some(r.float("final_logit_softcapping", 30.0)),
    };
    let mut double_wide = r.boolean("use_double_wide_mlp", true);
    let enable_moe = r.boolean("enable_moe_block", false);
    let tie = r.boolean("tie_word_embeddings", true);

    // layer_types, or mlx-lm's derivation from sliding_window_pattern (truncating).
    let types: Vec<LayerType> = match r.get("layer_types").cloned() {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, t)| match t.as_str() {
                Some("sliding_attention") => Some(LayerType::Sliding),
                Some("full_attention") => Some(LayerType::Full),
                _ => {
                    r.problem(
                        &format!("layer_types[{i}]"),
                        &format!("expected \"sliding_attention\" or \"full_attention\", found {t}"),
                    );
                    None
                }
            })
            .collect(),
        Some(other) => {
            r.problem("layer_types", &format!("expected a list, found {other}"));
            Vec::new()
        }
        None => {
            let pattern = r.uint("sliding_window_pattern", 5).clamp(1, 1 << 16) as usize;
            let n = (num_layers as usize).min(1 << 16);
            let v: Vec<LayerType> = (0..n)
                .map(|i| {
                    if i % pattern == pattern - 1 {
                        LayerType::Full
                    } else {
                        LayerType::Sliding
                    }
                })
                .collect();
            r.note(
                "layer_types",
                json!(v.iter().map(|t| t.hf_name()).collect::<Vec<_>>()),
                "absent: derived from sliding_window_pattern as mlx-lm does",
            );
            v
        }
    };
    if types.len() != num_layers as usize && r.problems.is_empty() {
        r.problem(
            "layer_types",
            &format!(
                "{} entries for {num_layers} layers (mlx-lm would fail or ignore the tail)",
                types.len()
            ),
        );
    }

    // rope_parameters.
    let rope_params = match r.get("rope_parameters").cloned() {
        None => {
            r.note("rope_parameters", json!({
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
                "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 1e4, "rope_type": "default"}
            }), ABSENT);
            None
        }
        Some(Value::Object(o)) => Some(o),
        Some(other) => {
            r.problem(
                "rope_parameters",
                &format!("expected an object, found {other}"),
            );
            None
        }
    };
    let rope_of = |key: &str, r: &mut Reader| -> RopeParams {
        let Some(all) = &rope_params else {
            return if key == "full_attention" {
                RopeParams::Proportional {
                    rope_theta: 1e6,
                    partial_rotary_factor: 0.25,
                    factor: 1.0,
                }
            } else {
                RopeParams::Default { rope_theta: 1e4 }
            };
        };
        let rp = match all.get(key) {
            Some(Value::Object(o)) => o.clone(),
            None => {
                r.note(
                    &format!("rope_parameters.{key}"),
                    json!({}),
                    "absent: mlx-lm uses {} (default RoPE, theta 10000)",
                );
                Map::new()
            }
            Some(other) => {
                r.problem(
                    &format!("rope_parameters.{key}"),
                    &format!("expected an object, found {other}"),
                );
                Map::new()
            }
        };
        let mut sub = Reader {
            obj: &rp,
            prefix: "",
            applied: Vec::new(),
            problems: Vec::new(),
        };
        let base = format!("{}rope_parameters.{key}.", r.prefix);
        sub.prefix = &base;
        let rope_type = rp
            .get("type")
            .or_else(|| rp.get("rope_type"))
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let theta = sub.float("rope_theta", 10000.0);
        let out = match rope_type.as_str() {
            "default" => RopeParams::Default { rope_theta: theta },
            "proportional" => {
                let p = sub.float("partial_rotary_factor", 1.0);
                let f = sub.float("factor", 1.0);
                RopeParams::Proportional {
                    rope_theta: theta,
                    partial_rotary_factor: p,
                    factor: f,
                }
            }
            other => {
                sub.problems.push(format!(
                    "{base}rope_type: `{other}` is not supported (default, proportional)"
                ));
                RopeParams::Default { rope_theta: theta }
            }
        };
        r.applied.extend(sub.applied);
        r.problems.extend(sub.problems);
        out
    };
    let rope_sliding = rope_of("sliding_attention", &mut r);
    let rope_full = rope_of("full_attention", &mut r);

    // MoE: all three fields when enabled (mlx-lm would fail on a None).
    let moe = if enable_moe {
        let e = r.get("num_experts").cloned();
        let k = r.get("top_k_experts").cloned();
        let w = r.get("moe_intermediate_size").cloned();
        match (e, k, w) {
            (Some(e), Some(k), Some(w)) => Some(Moe {
                num_experts: r.uint_of("num_experts", &e),
                top_k_experts: r.uint_of("top_k_experts", &k),
                moe_intermediate_size: r.uint_of("moe_intermediate_size", &w),
            }),
            _ => {
                r.problem("enable_moe_block", "true, but num_experts, top_k_experts and moe_intermediate_size are not all set");
                None
            }
        }
    } else {
        for k in ["num_experts", "top_k_experts", "moe_intermediate_size"] {
            if r.get(k).is_some() {
                r.note(
                    k,
                    Value::Null,
                    "ignored by mlx-lm because enable_moe_block is false",
                );
            }
        }
        None
    };

    // Normalisations: fields mlx-lm reads but that have no effect are written as such.
    if global_kv.is_some() && !k_eq_v {
        r.note(
            "num_global_key_value_heads",
            Value::Null,
            "ignored by mlx-lm because attention_k_eq_v is false",
        );
        global_kv = None;
    }
    if double_wide && (shared == 0 || shared >= num_layers) {
        r.note(
            "use_double_wide_mlp",
            json!(false),
            "no effect in mlx-lm without KV-shared layers after a donor",
        );
        double_wide = false;
    }
    if ple_width.is_some() && vocab_ple.is_none() {
        r.problem(
            "vocab_size_per_layer_input",
            "null, but per-layer inputs are on and mlx-lm needs an integer here",
        );
    }
    let per_layer_input = ple_width.map(|w| PerLayerInput {
        hidden_size_per_layer_input: w,
        vocab_size_per_layer_input: vocab_ple.unwrap_or(0),
    });

    // Quantization: `quantization`, else `quantization_config` (top level, then text_config).
    let mut quantization = None;
    let q_src = [
        (top.get("quantization"), "quantization"),
        (top.get("quantization_config"), "quantization_config"),
        (
            text.get("quantization_config"),
            "text_config.quantization_config",
        ),
    ];
    if let Some((Some(q), field)) = q_src.iter().find(|(v, _)| v.is_some_and(|v| !v.is_null())) {
        quantization = read_quantization(q, field, &mut r);
    }
    let kv_quantization = kv_config.and_then(|kv| read_kv_config(kv, &mut r));

    if !r.problems.is_empty() {
        return Err(ImportError {
            problems: r.problems,
        });
    }
    let period = minimal_period(&types);
    let repo = top
        .get("_name_or_path")
        .and_then(Value::as_str)
        .filter(|s| s.split('/').count() == 2 && !s.starts_with('/') && !s.starts_with('.'))
        .map(str::to_string);
    let spec = Gemma4Spec {
        format_version: FORMAT_VERSION,
        identity: Identity {
            name: name.to_string(),
            family: Family::Gemma4,
            source: Source {
                repo,
                revision: None,
                model_type,
            },
        },
        model: ModelDims {
            hidden_size,
            vocab_size,
            rms_norm_eps,
            tie_word_embeddings: tie,
            final_logit_softcapping: softcap,
            max_position_embeddings: max_pos,
        },
        layers: Layers {
            num_hidden_layers: num_layers,
            pattern: types[..period.min(types.len())].to_vec(),
            repeat: (types.len() / period.max(1)) as u32,
            num_kv_shared_layers: shared,
        },
        attention: Attention {
            num_attention_heads: num_heads,
            num_key_value_heads: num_kv,
            num_global_key_value_heads: global_kv,
            attention_k_eq_v: k_eq_v,
            head_dim,
            global_head_dim,
            sliding_window,
        },
        rope: Rope {
            traditional,
            sliding: rope_sliding,
            full: rope_full,
        },
        mlp: Mlp {
            intermediate_size,
            use_double_wide_mlp: double_wide,
        },
        moe,
        per_layer_input,
        quantization,
        kv_quantization,
        mixed_kv: None,
    };
    let issues = validate::check(&spec);
    if !issues.is_empty() {
        return Err(ImportError {
            problems: issues
                .into_iter()
                .map(|i| {
                    format!(
                        "{}: {} (expected {}); hint: {}",
                        i.path, i.message, i.expected, i.hint
                    )
                })
                .collect(),
        });
    }
    Ok((spec, r.applied))
}
