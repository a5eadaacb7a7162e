//! The config.json views of a Gemma-4 spec: `text_config` names (`spec show
//! --json`) and a whole config.json of its source model type.

use crate::hf::config_view;
use crate::model::*;
use serde_json::{json, Value};

/// `vocab_size_per_layer_input` of mlx-lm's gemma4_text `ModelArgs` (and
/// transformers'): what a config without per-layer inputs carries.
pub(crate) const UNUSED_VOCAB_SIZE_PER_LAYER_INPUT: u32 = 262_144;

fn rope_json(r: &RopeParams) -> Value {
    match *r {
        RopeParams::Default { rope_theta } => json!({
            "rope_type": "default",
            "rope_theta": rope_theta,
        }),
        RopeParams::Proportional {
            rope_theta,
            partial_rotary_factor,
            factor,
        } => json!({
            "rope_type": "proportional",
            "rope_theta": rope_theta,
            "partial_rotary_factor": partial_rotary_factor,
            "factor": factor,
        }),
    }
}

/// A Gemma-4 spec with Hugging Face `text_config` field names (what
/// `cargo xtask spec show NAME --json` prints), with `kv_quantization`
/// (kv_config.json form) when present; impl_document! adds `quantization` (mlx
/// config form) and sorts the keys.
pub(crate) fn gemma4_config_fields(spec: &Gemma4Spec) -> Value {
    let a = &spec.attention;
    let layer_types: Vec<&str> = spec.layer_types().iter().map(|t| t.hf_name()).collect();
    let mut v = json!({
        "hidden_size": spec.model.hidden_size,
        "num_hidden_layers": spec.layers.num_hidden_layers,
        "intermediate_size": spec.mlp.intermediate_size,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "num_global_key_value_heads": a.num_global_key_value_heads,
        "head_dim": a.head_dim,
        "global_head_dim": a.global_head_dim,
        "sliding_window": a.sliding_window,
        "layer_types": layer_types,
        "num_kv_shared_layers": spec.layers.num_kv_shared_layers,
        "hidden_size_per_layer_input": spec.per_layer_input.as_ref().map_or(0, |p| p.hidden_size_per_layer_input),
        "vocab_size": spec.model.vocab_size,
        // Without per-layer inputs mlx-lm never reads it, but its ModelArgs
        // and transformers' config class type it as an integer (a null is
        // refused by mlx_lm.server): their default stands in.
        "vocab_size_per_layer_input": spec
            .per_layer_input
            .as_ref()
            .map_or(UNUSED_VOCAB_SIZE_PER_LAYER_INPUT, |p| p.vocab_size_per_layer_input),
        "use_double_wide_mlp": spec.mlp.use_double_wide_mlp,
        "enable_moe_block": spec.moe.is_some(),
        "num_experts": spec.moe.as_ref().map(|m| m.num_experts),
        "top_k_experts": spec.moe.as_ref().map(|m| m.top_k_experts),
        "moe_intermediate_size": spec.moe.as_ref().map(|m| m.moe_intermediate_size),
        "attention_k_eq_v": a.attention_k_eq_v,
        "final_logit_softcapping": spec.model.final_logit_softcapping,
        "rms_norm_eps": spec.model.rms_norm_eps,
        "tie_word_embeddings": spec.model.tie_word_embeddings,
        "rope_parameters": {
            "full_attention": rope_json(&spec.rope.full),
            "sliding_attention": rope_json(&spec.rope.sliding),
        },
        "rope_traditional": spec.rope.traditional,
        "max_position_embeddings": spec.model.max_position_embeddings,
    });
    if let Some(kv) = &spec.kv_quantization {
        v["kv_quantization"] = json!(kv
            .iter()
            .map(|e| json!({"layer_idx": e.layer_idx, "bits": e.bits, "group_size": e.group_size}))
            .collect::<Vec<_>>());
    }
    v
}

/// A config.json for a Gemma-4 spec, in the layout of its source model type
/// (`gemma4` / `gemma4_unified` wrap the text config, `gemma4_text` is flat),
/// without quantization (a checkpoint writer adds what it packed). mlx-lm
/// loads it to exactly this architecture.
pub(crate) fn gemma4_config_json(spec: &Gemma4Spec) -> Value {
    let mut text = config_view(gemma4_config_fields(spec), None);
    let obj = text.as_object_mut().unwrap();
    obj.remove("kv_quantization");
    let vocab = obj["vocab_size"].clone();
    let tie = obj["tie_word_embeddings"].clone();
    match spec.identity.source.model_type {
        ConfigModelType::Gemma4Text => {
            obj.insert("model_type".into(), serde_json::json!("gemma4_text"));
            text
        }
        wrapped => {
            let inner = if wrapped == ConfigModelType::Gemma4Unified {
                "gemma4_unified_text"
            } else {
                "gemma4_text"
            };
            obj.insert("model_type".into(), serde_json::json!(inner));
            serde_json::json!({
                "model_type": wrapped.as_str(),
                "text_config": text,
                "vocab_size": vocab,
                "tie_word_embeddings": tie,
            })
        }
    }
}
