//! Qwen3-Next (`qwen3_next.py`) as mlx-lm 0.32.2 runs it: the Qwen3.5 layout
//! (`qwen3_5.py` imports its attention, MLP, gated norm and MoE block from
//! this module), and its difference from Qwen3.5:
//!
//! * the Gated DeltaNet projects its input with `in_proj_qkvz` and
//!   `in_proj_ba`, whose outputs are grouped per key head and regrouped by
//!   `fix_query_key_value_ordering` (`InProj::GroupedPerKeyHead`);
//! * no multimodal wrapper: the checkpoint is `model.*` and `lm_head`;
//! * `sanitize` does nothing unless a layer has per-expert Hugging Face
//!   weights; then it drops `mtp.`, the tied head, stacks the experts, moves
//!   the conv axis and adds 1 to the norms;
//! * RoPE from the flat `rope_theta` and `partial_rotary_factor`;
//! * `ModelArgs` requires `intermediate_size` beside the experts, and
//!   `norm_topk_prob` defaults to false;
//! * no `shard()`.

use super::{
    FeedForwardSections, Qwen35Layers, Qwen35LinearAttention, Qwen35Moe, Qwen35Rope, Qwen35Spec,
    Qwen35Variant, LAYOUT,
};
use crate::dense::{DenseAttention, DenseMlp, DenseModel};
use crate::ir::{
    HeadSplit, InProj, KvHeadSplit, ModulePrefix, SanitizeRule, ShardOracle, Sharding,
};
use crate::layout_reader::Layout;
use crate::model::*;
use crate::model_family::{KvConfig, ModelFamily};
use crate::reader::{first_quantization, imported_identity, ImportedSpec, Reader};
use serde_json::{json, Map, Value};

pub(crate) const QWEN3_NEXT: Qwen35Variant = Qwen35Variant {
    family: Family::Qwen3Next,
    layout: Layout {
        family: "qwen3_next",
        anchor: "qwen3-next",
        ..LAYOUT
    },
    check_model_type: |c, spec| {
        let hint = "the model_type of a Qwen3-Next checkpoint is qwen3_next";
        c.model_type_is(&spec.identity, ConfigModelType::Qwen3Next, hint)
    },
    feed_forward: FeedForwardSections::MlpAndOptionalMoe,
    in_proj: InProj::GroupedPerKeyHead,
    prefix: ModulePrefix::Model,
    sanitize: |spec| match spec.moe {
        // `if not moe_layers: return weights`.
        None => Vec::new(),
        // Each acts on a raw checkpoint only; the norms on the module's own
        // condition, per-expert weights.
        Some(_) => vec![
            SanitizeRule::DropMtp,
            SanitizeRule::DropTiedHead,
            SanitizeRule::StackExperts,
            SanitizeRule::MoveConvAxis,
            SanitizeRule::OffsetNormsOfPerExpertCheckpoint,
        ],
    },
    // qwen3_next.py has no shard(): the plan refuses to split its linear layers.
    sharding: Sharding {
        oracle: ShardOracle::Absent,
        head: HeadSplit::Whole,
        kv_heads: KvHeadSplit::Divided,
    },
    config_fields,
};

/// qwen3_next's own `ModelArgs` fields: flat RoPE (no scaling), the dense
/// width, the experts' sizes (zero for the dense form) and the sparse layers'
/// placement, every layer sparse when there are experts.
fn config_fields(spec: &Qwen35Spec) -> Value {
    let e = spec.moe.as_ref();
    json!({
        "rope_theta": spec.rope.rope_theta,
        "partial_rotary_factor": spec.rope.partial_rotary_factor,
        "rope_scaling": null,
        "intermediate_size": spec.mlp.as_ref().map_or(0, |m| m.intermediate_size),
        "num_experts": e.map_or(0, |e| e.num_experts),
        "num_experts_per_tok": e.map_or(0, |e| e.num_experts_per_tok),
        "moe_intermediate_size": e.map_or(0, |e| e.moe_intermediate_size),
        "shared_expert_intermediate_size": e.map_or(0, |e| e.shared_expert_intermediate_size),
        "norm_topk_prob": e.is_some_and(|e| e.norm_topk_prob),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    })
}

/// Imports a `qwen3_next` config.json as mlx-lm 0.32.2's `ModelArgs` reads
/// it: every size required (the dataclass has no defaults for them), then
/// `norm_topk_prob` (false), `tie_word_embeddings` (false), `attention_bias`
/// (false, true refused), `rope_scaling` (null; any other refused) and
/// `full_attention_interval` (4). The experts run on every layer
/// (`decoder_sparse_step: 1`, `mlp_only_layers: []`); other placements are
/// refused.
pub(crate) fn import(top: &Map<String, Value>, name: &str) -> ImportedSpec<Qwen35Spec> {
    let mut r = Reader::new(top, "");
    let [hidden_size, num_layers, intermediate_size, num_heads] = r.required_uints([
        "hidden_size",
        "num_hidden_layers",
        "intermediate_size",
        "num_attention_heads",
    ]);
    let linear_attention = Qwen35LinearAttention {
        linear_num_value_heads: r.required_uint("linear_num_value_heads"),
        linear_num_key_heads: r.required_uint("linear_num_key_heads"),
        linear_key_head_dim: r.required_uint("linear_key_head_dim"),
        linear_value_head_dim: r.required_uint("linear_value_head_dim"),
        linear_conv_kernel_dim: r.required_uint("linear_conv_kernel_dim"),
    };
    let [num_experts, num_experts_per_tok, decoder_sparse_step, shared_expert_intermediate_size] =
        r.required_uints([
            "num_experts",
            "num_experts_per_tok",
            "decoder_sparse_step",
            "shared_expert_intermediate_size",
        ]);
    let mlp_only_layers = r.get("mlp_only_layers").cloned();
    let moe_intermediate_size = r.required_uint("moe_intermediate_size");
    let rms_norm_eps = r.required_float("rms_norm_eps");
    let vocab_size = r.required_uint("vocab_size");
    let num_kv = r.required_uint("num_key_value_heads");
    let rope = Qwen35Rope {
        rope_theta: r.required_float("rope_theta"),
        partial_rotary_factor: r.required_float("partial_rotary_factor"),
    };
    let max_pos = r.required_uint("max_position_embeddings");
    let attention = DenseAttention {
        num_attention_heads: num_heads,
        num_key_value_heads: num_kv,
        head_dim: r.required_uint("head_dim"),
    };
    let norm_topk_prob = r.boolean("norm_topk_prob", false);
    let model = DenseModel {
        hidden_size,
        vocab_size,
        rms_norm_eps,
        tie_word_embeddings: r.boolean("tie_word_embeddings", false),
        max_position_embeddings: max_pos,
    };
    if r.boolean("attention_bias", false) {
        r.problem(
            "attention_bias",
            "true is not supported (archgen's gated attention has no projection biases)",
        );
    }
    match r.get("rope_scaling") {
        None | Some(Value::Null) => {}
        Some(v) => {
            let msg = format!("{v}: only unscaled RoPE (null) is supported");
            r.problem("rope_scaling", &msg);
        }
    }
    let layers = Qwen35Layers {
        num_hidden_layers: num_layers,
        full_attention_interval: r.uint("full_attention_interval", 4),
    };
    let moe = (num_experts > 0).then(|| {
        match mlp_only_layers {
            Some(Value::Array(l)) if l.is_empty() => {}
            None => r.problem("mlp_only_layers", "required by qwen3_next's ModelArgs"),
            Some(other) => r.problem(
                "mlp_only_layers",
                &format!("{other}: only [] (the experts on every layer) is supported"),
            ),
        }
        if decoder_sparse_step != 1 {
            r.problem(
                "decoder_sparse_step",
                &format!("{decoder_sparse_step}: only 1 (the experts on every layer) is supported"),
            );
        }
        Qwen35Moe {
            num_experts,
            num_experts_per_tok,
            moe_intermediate_size,
            shared_expert_intermediate_size,
            norm_topk_prob,
        }
    });
    let quantization = first_quantization(
        &[
            (top.get("quantization"), "quantization"),
            (top.get("quantization_config"), "quantization_config"),
        ],
        &mut r,
    );
    r.build_checked(super::check, || Qwen35Spec {
        format_version: FORMAT_VERSION,
        identity: imported_identity(top, name, Family::Qwen3Next, ConfigModelType::Qwen3Next),
        model,
        layers,
        attention,
        rope,
        linear_attention,
        mlp: Some(DenseMlp { intermediate_size }),
        moe,
        quantization,
    })
}

/// Qwen3-Next in the family registry.
pub(crate) const FAMILY: ModelFamily = ModelFamily {
    reads: |t| t.family() == Family::Qwen3Next,
    kv_config: KvConfig::Refused(
        "KV-cache quantization is not supported for qwen3_next (its linear layers have no K/V cache)",
    ),
    import: |c| import(c.top, c.name).map(|(s, applied)| (crate::Spec::Qwen35(s), applied)),
};
