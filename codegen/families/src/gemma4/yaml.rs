//! A Gemma-4 spec as a full-form YAML file, in the layout of specs/.

use crate::model::*;
use crate::yaml_writer::{float, header_yaml, quantization_yaml, section_yaml};
use std::fmt::Write;

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "null".to_string(), |x| x.to_string())
}

fn layer(t: LayerType) -> &'static str {
    match t {
        LayerType::Sliding => "sliding",
        LayerType::Full => "full",
    }
}

fn rope(r: &RopeParams) -> String {
    match *r {
        RopeParams::Default { rope_theta } => {
            format!("{{rope_type: default, rope_theta: {}}}", float(rope_theta))
        }
        RopeParams::Proportional {
            rope_theta,
            partial_rotary_factor,
            factor,
        } => format!(
            "{{rope_type: proportional, rope_theta: {}, partial_rotary_factor: {}, factor: {}}}",
            float(rope_theta),
            float(partial_rotary_factor),
            float(factor)
        ),
    }
}

/// The full-form YAML text of a Gemma-4 spec, starting with the schema modeline. Parsing the
/// result gives back an equal spec.
pub(crate) fn gemma4_yaml(spec: &Gemma4Spec) -> String {
    let mut o = String::new();
    let m = &spec.model;
    let l = &spec.layers;
    let a = &spec.attention;
    header_yaml(&mut o, spec.format_version, &spec.identity);
    section_yaml(
        &mut o,
        "model",
        &[
            ("hidden_size", m.hidden_size.to_string()),
            ("vocab_size", m.vocab_size.to_string()),
            ("rms_norm_eps", float(m.rms_norm_eps)),
            ("tie_word_embeddings", m.tie_word_embeddings.to_string()),
            (
                "final_logit_softcapping",
                m.final_logit_softcapping.map_or("null".into(), float),
            ),
            (
                "max_position_embeddings",
                m.max_position_embeddings.to_string(),
            ),
        ],
    );
    let pattern: Vec<&str> = l.pattern.iter().map(|t| layer(*t)).collect();
    section_yaml(
        &mut o,
        "layers",
        &[
            ("num_hidden_layers", l.num_hidden_layers.to_string()),
            ("pattern", format!("[{}]", pattern.join(", "))),
            ("repeat", l.repeat.to_string()),
            ("num_kv_shared_layers", l.num_kv_shared_layers.to_string()),
        ],
    );
    section_yaml(
        &mut o,
        "attention",
        &[
            ("num_attention_heads", a.num_attention_heads.to_string()),
            ("num_key_value_heads", a.num_key_value_heads.to_string()),
            (
                "num_global_key_value_heads",
                opt(a.num_global_key_value_heads),
            ),
            ("attention_k_eq_v", a.attention_k_eq_v.to_string()),
            ("head_dim", a.head_dim.to_string()),
            ("global_head_dim", opt(a.global_head_dim)),
            ("sliding_window", a.sliding_window.to_string()),
        ],
    );
    section_yaml(
        &mut o,
        "rope",
        &[
            ("traditional", spec.rope.traditional.to_string()),
            ("sliding", rope(&spec.rope.sliding)),
            ("full", rope(&spec.rope.full)),
        ],
    );
    section_yaml(
        &mut o,
        "mlp",
        &[
            ("intermediate_size", spec.mlp.intermediate_size.to_string()),
            (
                "use_double_wide_mlp",
                spec.mlp.use_double_wide_mlp.to_string(),
            ),
        ],
    );
    match &spec.moe {
        None => o.push_str("moe: null\n"),
        Some(moe) => section_yaml(
            &mut o,
            "moe",
            &[
                ("num_experts", moe.num_experts.to_string()),
                ("top_k_experts", moe.top_k_experts.to_string()),
                (
                    "moe_intermediate_size",
                    moe.moe_intermediate_size.to_string(),
                ),
            ],
        ),
    }
    match &spec.per_layer_input {
        None => o.push_str("per_layer_input: null\n"),
        Some(p) => section_yaml(
            &mut o,
            "per_layer_input",
            &[
                (
                    "hidden_size_per_layer_input",
                    p.hidden_size_per_layer_input.to_string(),
                ),
                (
                    "vocab_size_per_layer_input",
                    p.vocab_size_per_layer_input.to_string(),
                ),
            ],
        ),
    }
    quantization_yaml(&mut o, spec.quantization.as_ref());
    match &spec.kv_quantization {
        None => o.push_str("kv_quantization: null\n"),
        Some(kv) if kv.is_empty() => o.push_str("kv_quantization: []\n"),
        Some(kv) => {
            let _ = writeln!(o, "kv_quantization:");
            for e in kv {
                let _ = writeln!(
                    o,
                    "  - {{layer_idx: {}, bits: {}, group_size: {}}}",
                    e.layer_idx, e.bits, e.group_size
                );
            }
        }
    }
    crate::mixed_kv::yaml(&mut o, spec.mixed_kv.as_ref());
    o
}
