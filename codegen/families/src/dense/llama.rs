//! Llama (`llama.py`; Mistral too, which mlx-lm runs as llama): the parent
//! every other dense family is written as a difference from.

use super::{
    refuse_no_rope_interval, refuse_scales, BiasFlags, ConfigDefault, ConfigReading, ConfigRope,
    DenseSpec, DenseVariant, HeadDim, KvHeads, OwnSections, RopeTraditional,
};
use crate::ir::{
    GateUpProjection, NormArrangement, ProjectionBias, QkNorm, QkvProjection, SanitizeRule,
    ShardOracle,
};
use crate::model::{ConfigModelType, Family};
use crate::reader::Reader;
use crate::validate::Checker;
use serde_json::Value;

pub(crate) const LLAMA: DenseVariant = DenseVariant {
    family: Family::Llama,
    model_types: &[ConfigModelType::Llama, ConfigModelType::Mistral],
    qk_norm: QkNorm::None,
    bias: ProjectionBias::None,
    qkv: QkvProjection::Separate,
    gate_up: GateUpProjection::Separate,
    arrangement: NormArrangement::PreNorm,
    sanitize: &[SanitizeRule::DropRotaryTables, SanitizeRule::DropTiedHead],
    shard_oracle: ShardOracle::MlxLm,
    head_dim: HeadDim::Optional,
    rope_traditional: RopeTraditional::Read,
    config: ConfigReading {
        kv_heads: KvHeads::SameAsHeads,
        max_position_embeddings: ConfigDefault::Required,
        tie_word_embeddings: ConfigDefault::Value(true),
        bias_flags: BiasFlags::Optional,
        rope: ConfigRope::Flat(ConfigDefault::Value(10000.0)),
        read_scaling: super::read_scaling,
        read_extras: read_layer_types,
        read_own_sections: no_own_sections,
    },
    check_no_rope_interval: refuse_no_rope_interval,
    check_scales: refuse_scales,
    check_rope_scaling: no_check,
    hf_own_fields: no_own_fields,
};

/// llama.py's `layer_types` (every layer must be full attention here) and,
/// without them, its ignored `sliding_window`.
pub(crate) fn read_layer_types(r: &mut Reader) {
    match r.get("layer_types").and_then(Value::as_array) {
        Some(types) => {
            if types.iter().any(|t| t.as_str() != Some("full_attention")) {
                r.problem(
                    "layer_types",
                    "sliding_attention layers are not supported for llama yet (every layer must be full_attention)",
                );
            }
        }
        None => {
            if let Some(w) = r.get("sliding_window").cloned() {
                r.note(
                    "sliding_window",
                    w,
                    "ignored: without layer_types mlx-lm's llama.py makes every layer full attention",
                );
            }
        }
    }
}

/// For a module whose config.json holds nothing beyond what is read before.
pub(crate) fn no_extras(_: &mut Reader) {}

fn no_own_sections(_: &mut Reader, _num_layers: u32) -> OwnSections {
    OwnSections::default()
}

fn no_check(_: &DenseSpec, _: &mut Checker) {}

fn no_own_fields(_: &DenseSpec, _: &mut Value) {}
