//! A Gemma-4 spec as a full-form YAML file, in the layout of specs/.

use crate::emit::{float, identity_yaml, quantization_yaml, MODELINE};
use crate::model::*;
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
    let id = &spec.identity;
    let m = &spec.model;
    let l = &spec.layers;
    let a = &spec.attention;
    let _ = writeln!(o, "{MODELINE}");
    let _ = writeln!(o, "format_version: {}", spec.format_version);
    identity_yaml(&mut o, id);
    let _ = writeln!(o, "model:");
    let _ = writeln!(o, "  hidden_size: {}", m.hidden_size);
    let _ = writeln!(o, "  vocab_size: {}", m.vocab_size);
    let _ = writeln!(o, "  rms_norm_eps: {}", float(m.rms_norm_eps));
    let _ = writeln!(o, "  tie_word_embeddings: {}", m.tie_word_embeddings);
    let _ = writeln!(
        o,
        "  final_logit_softcapping: {}",
        m.final_logit_softcapping.map_or("null".into(), float)
    );
    let _ = writeln!(
        o,
        "  max_position_embeddings: {}",
        m.max_position_embeddings
    );
    let _ = writeln!(o, "layers:");
    let _ = writeln!(o, "  num_hidden_layers: {}", l.num_hidden_layers);
    let pattern: Vec<&str> = l.pattern.iter().map(|t| layer(*t)).collect();
    let _ = writeln!(o, "  pattern: [{}]", pattern.join(", "));
    let _ = writeln!(o, "  repeat: {}", l.repeat);
    let _ = writeln!(o, "  num_kv_shared_layers: {}", l.num_kv_shared_layers);
    let _ = writeln!(o, "attention:");
    let _ = writeln!(o, "  num_attention_heads: {}", a.num_attention_heads);
    let _ = writeln!(o, "  num_key_value_heads: {}", a.num_key_value_heads);
    let _ = writeln!(
        o,
        "  num_global_key_value_heads: {}",
        opt(a.num_global_key_value_heads)
    );
    let _ = writeln!(o, "  attention_k_eq_v: {}", a.attention_k_eq_v);
    let _ = writeln!(o, "  head_dim: {}", a.head_dim);
    let _ = writeln!(o, "  global_head_dim: {}", opt(a.global_head_dim));
    let _ = writeln!(o, "  sliding_window: {}", a.sliding_window);
    let _ = writeln!(o, "rope:");
    let _ = writeln!(o, "  traditional: {}", spec.rope.traditional);
    let _ = writeln!(o, "  sliding: {}", rope(&spec.rope.sliding));
    let _ = writeln!(o, "  full: {}", rope(&spec.rope.full));
    let _ = writeln!(o, "mlp:");
    let _ = writeln!(o, "  intermediate_size: {}", spec.mlp.intermediate_size);
    let _ = writeln!(o, "  use_double_wide_mlp: {}", spec.mlp.use_double_wide_mlp);
    match &spec.moe {
        None => o.push_str("moe: null\n"),
        Some(moe) => {
            let _ = writeln!(o, "moe:");
            let _ = writeln!(o, "  num_experts: {}", moe.num_experts);
            let _ = writeln!(o, "  top_k_experts: {}", moe.top_k_experts);
            let _ = writeln!(o, "  moe_intermediate_size: {}", moe.moe_intermediate_size);
        }
    }
    match &spec.per_layer_input {
        None => o.push_str("per_layer_input: null\n"),
        Some(p) => {
            let _ = writeln!(o, "per_layer_input:");
            let _ = writeln!(
                o,
                "  hidden_size_per_layer_input: {}",
                p.hidden_size_per_layer_input
            );
            let _ = writeln!(
                o,
                "  vocab_size_per_layer_input: {}",
                p.vocab_size_per_layer_input
            );
        }
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
