//! DeepSeek-V3's config.json importer and its registry entry.

use super::{check, DeepseekV3Rope, DeepseekV3Spec, LatentAttentionSizes, YarnRopeScaling};
use crate::dense::{DenseLayers, DenseMlp, DenseModel};
use crate::model::*;
use crate::model_family::ModelFamily;
use crate::noaux_tc::NoauxTcExperts;
use crate::reader::{first_quantization, imported_identity, rope_type, ImportedSpec, Reader};
use crate::yarn::YarnScaling;
use serde_json::{Map, Value};

/// Imports a `deepseek_v3` (or `kimi_k2`) config.json as mlx-lm 0.32.2's
/// `ModelArgs` reads it.
pub(crate) fn import(
    top: &Map<String, Value>,
    name: &str,
    model_type: ConfigModelType,
) -> ImportedSpec<DeepseekV3Spec> {
    let mut r = Reader::new(top, "");
    let model = DenseModel {
        hidden_size: r.required_uint("hidden_size"),
        vocab_size: r.required_uint("vocab_size"),
        rms_norm_eps: r.float("rms_norm_eps", 1e-6),
        tie_word_embeddings: false,
        max_position_embeddings: r.uint("max_position_embeddings", 2048),
    };
    if top.get("tie_word_embeddings") == Some(&Value::Bool(true)) {
        r.note(
            "tie_word_embeddings",
            Value::Bool(false),
            "ignored: deepseek_v3.py always builds its own lm_head",
        );
    }
    let layers = DenseLayers {
        num_hidden_layers: r.required_uint("num_hidden_layers"),
    };
    let attention = LatentAttentionSizes {
        num_attention_heads: r.required_uint("num_attention_heads"),
        q_lora_rank: match top.get("q_lora_rank") {
            Some(Value::Null) => None,
            _ => Some(r.uint("q_lora_rank", 1536)),
        },
        kv_lora_rank: r.uint("kv_lora_rank", 512),
        qk_nope_head_dim: r.uint("qk_nope_head_dim", 128),
        qk_rope_head_dim: r.uint("qk_rope_head_dim", 64),
        v_head_dim: r.uint("v_head_dim", 128),
    };
    if top.get("attention_bias") == Some(&Value::Bool(true)) {
        r.problem(
            "attention_bias",
            "true: archgen's latent attention has no bias on q_a_proj, kv_a_proj_with_mqa and o_proj yet",
        );
    }
    match top.get("moe_layer_freq").and_then(Value::as_u64) {
        None | Some(1) => {}
        Some(f) => r.problem(
            "moe_layer_freq",
            &format!(
                "{f}: archgen runs experts on every layer from first_k_dense_replace on (1) only"
            ),
        ),
    }
    let rope = DeepseekV3Rope {
        rope_theta: r.float("rope_theta", 10000.0),
        scaling: read_yarn(&mut r),
    };
    let mlp = DenseMlp {
        intermediate_size: r.required_uint("intermediate_size"),
    };
    let moe = NoauxTcExperts::read(top, &mut r);
    // The published checkpoints' `quantization_config` is their own fp8
    // (or packed int4) form, which the loader refuses: noted, not read.
    let quantization = match top.get("quantization_config") {
        Some(q)
            if q.get("quant_method")
                .and_then(Value::as_str)
                .is_some_and(|m| m != "mlx") =>
        {
            r.note(
                "quantization_config",
                q.clone(),
                "ignored: the checkpoint's own fp8 / packed int4 form, which archgen does not \
                 load; convert the checkpoint with mlx-lm first",
            );
            first_quantization(&[(top.get("quantization"), "quantization")], &mut r)
        }
        _ => crate::reader::top_quantization(top, &mut r),
    };
    r.build_checked(check, || DeepseekV3Spec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, Family::DeepseekV3, model_type),
        model,
        layers,
        attention,
        rope,
        mlp,
        moe,
        quantization,
    })
}

/// The `rope_scaling` of a deepseek_v3 config: `yarn` (or `deepseek_yarn`)
/// with mlx-lm's `YarnRoPE` defaults for the keys left out; any other type
/// (or none) is refused.
fn read_yarn(r: &mut Reader) -> YarnRopeScaling {
    let fallback = YarnRopeScaling::with_defaults(1.0);
    let Some(scaling) = r.get("rope_scaling").and_then(Value::as_object).cloned() else {
        r.problem(
            "rope_scaling",
            "missing or not a mapping: archgen runs deepseek_v3 with its YaRN RoPE only \
             (mlx-lm's nn.RoPE(traditional=True) without scaling is not supported yet)",
        );
        return fallback;
    };
    match rope_type(&scaling) {
        "yarn" | "deepseek_yarn" => {}
        other => {
            r.problem(
                "rope_scaling",
                &format!("rope type `{other}` is not supported for deepseek_v3 (archgen reads yarn only)"),
            );
            return fallback;
        }
    }
    YarnRopeScaling::read(&scaling, r)
}

/// deepseek_v3 in the family registry.
pub(crate) const FAMILY: ModelFamily = ModelFamily {
    reads: |t| t.family() == crate::Family::DeepseekV3,
    kv_config: crate::model_family::GEMMA4_ONLY,
    import: |c| {
        import(c.top, c.name, c.model_type)
            .map(|(s, applied)| (crate::Spec::DeepseekV3(s), applied))
    },
};
