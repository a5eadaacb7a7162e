//! A Gemma-4 spec from a config.json (`gemma4`, `gemma4_unified` with the text
//! model under `text_config`, or a flat `gemma4_text`), read as mlx-lm 0.32.2's
//! `gemma4_text.py` `ModelArgs` reads it, with mlx-optiq's `kv_config` when given.

use crate::model::*;
use crate::reader::{
    first_quantization, imported_identity, read_kv_config, rope_type, ImportError, ImportedSpec,
    Reader, ABSENT,
};
use serde_json::{json, Map, Value};

fn minimal_period(types: &[LayerType]) -> usize {
    let n = types.len();
    (1..=n)
        .find(|&p| n % p == 0 && types.iter().enumerate().all(|(i, t)| *t == types[i % p]))
        .unwrap_or(n.max(1))
}

/// The Gemma-4 spec of a config.json whose `model_type` is one of Gemma-4's.
pub(crate) fn import(
    top: &Map<String, Value>,
    model_type: ConfigModelType,
    kv_config: Option<&Value>,
    name: &str,
) -> ImportedSpec<Gemma4Spec> {
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
    let vocab_ple = r.opt_uint(
        "vocab_size_per_layer_input",
        Some(super::hf::UNUSED_VOCAB_SIZE_PER_LAYER_INPUT),
    );
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
        let rope_type = rope_type(&rp).to_string();
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
    let quantization = first_quantization(
        &[
            (top.get("quantization"), "quantization"),
            (top.get("quantization_config"), "quantization_config"),
            (
                text.get("quantization_config"),
                "text_config.quantization_config",
            ),
        ],
        &mut r,
    );
    let kv_quantization = kv_config.and_then(|kv| read_kv_config(kv, &mut r));

    r.build_checked(super::check, || {
        let period = minimal_period(&types);
        Gemma4Spec {
            format_version: FORMAT_VERSION,
            identity: imported_identity(top, name, Family::Gemma4, model_type),
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
        }
    })
}
