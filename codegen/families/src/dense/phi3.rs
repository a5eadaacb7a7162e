//! Phi-3 (`phi3.py`): Llama with q/k/v projected by one `qkv_proj` and
//! gate/up by one `gate_up_proj`, each one matmul then split; no head_dim
//! field, an untied head by default, RoPE scaling of its own.

use super::llama::LLAMA;
use super::{
    BiasFlags, ConfigDefault, ConfigReading, DenseSpec, DenseVariant, HeadDim, RopeScaling,
};
use crate::diag::FieldPath;
use crate::ir::{GateUpProjection, QkvProjection, ShardOracle};
use crate::model::{ConfigModelType, Family};
use crate::reader::Reader;
use crate::validate::Checker;
use serde_json::{Map, Value};

pub(crate) const PHI3: DenseVariant = DenseVariant {
    family: Family::Phi3,
    model_types: &[ConfigModelType::Phi3],
    qkv: QkvProjection::Fused,
    gate_up: GateUpProjection::Fused,
    // phi3.py has no sanitize: mlx-lm loads the checkpoint as it is.
    sanitize: &[],
    // phi3.py has no shard().
    shard_oracle: ShardOracle::Absent,
    head_dim: HeadDim::HiddenOverHeads,
    config: ConfigReading {
        max_position_embeddings: ConfigDefault::Value(131072),
        tie_word_embeddings: ConfigDefault::Value(false),
        bias_flags: BiasFlags::NotRead,
        read_scaling: read_phi3_scaling,
        read_extras: read_phi3_fields,
        ..LLAMA.config
    },
    check_rope_scaling: refuse_llama3_scaling,
    ..LLAMA
};

/// phi3.py reads no llama3 scaling.
fn refuse_llama3_scaling(spec: &DenseSpec, c: &mut Checker) {
    if let Some(RopeScaling::Llama3 { .. }) = &spec.rope.scaling {
        c.err(
            FieldPath::parse("rope.scaling"),
            "llama3 scaling, but mlx-lm's phi3.py reads only su/longrope and linear scaling",
            "null",
            "Phi-3-mini-4k has rope_scaling null; su/longrope (SuScaledRoPE) is not supported yet",
        );
    }
}

/// phi3.py's fields beyond llama's: a partial RoPE is refused (the dense
/// layout rotates the whole head), the window and the long-context sizes noted
/// as what mlx-lm does with them.
fn read_phi3_fields(r: &mut Reader) {
    let factor = r.float("partial_rotary_factor", 1.0);
    if factor != 1.0 {
        r.problem(
            "partial_rotary_factor",
            &format!("{factor}: a partial RoPE (int(head_dim * factor) dims) is not supported for phi3 yet (1.0 is)"),
        );
    }
    if let Some(w) = r.get("sliding_window").cloned() {
        r.note(
            "sliding_window",
            w,
            "ignored: mlx-lm's phi3.py makes every layer full attention",
        );
    }
    if let Some(o) = r.get("original_max_position_embeddings").cloned() {
        r.note(
            "original_max_position_embeddings",
            o,
            "ignored: phi3.py reads it only for su/longrope scaling",
        );
    }
}

/// `rope_scaling` as phi3.py's `ModelArgs.__post_init__` reads it: `type`
/// and `long_factor` required (else mlx-lm raises); `su` / `longrope`
/// (`SuScaledRoPE`) and `linear` are refused until a `RopeKind` runs them; any
/// other type mlx-lm drops with a warning (plain RoPE).
fn read_phi3_scaling(obj: &Map<String, Value>, r: &mut Reader) -> Option<RopeScaling> {
    let kind = obj.get("type").and_then(Value::as_str);
    match (kind, obj.contains_key("long_factor")) {
        (Some("su" | "longrope"), true) => r.problem(
            "rope_scaling",
            "type `su`/`longrope` (phi3.py's SuScaledRoPE) is not supported yet; Phi-3-mini-4k (rope_scaling null) is",
        ),
        (Some("linear"), true) => r.problem(
            "rope_scaling",
            "type `linear` (nn.RoPE with scale 1 / factor) is not supported for phi3 yet",
        ),
        (Some(other), true) => r.note(
            "rope_scaling",
            Value::Object(obj.clone()),
            &format!("ignored: phi3.py warns that type `{other}` is unsupported and sets rope_scaling to None"),
        ),
        (None, _) | (Some(_), false) => r.problem(
            "rope_scaling",
            "must contain `type` and `long_factor` (mlx-lm's phi3.py raises without them)",
        ),
    }
    None
}
