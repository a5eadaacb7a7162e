//! Granite (`granite.py`): Llama with its config's multipliers on the
//! embedding, the attention scores, both residual branches and the logits
//! (the `scales` section, the one dense family with it); no head_dim field,
//! no `rope_traditional`, both bias flags required.

use super::llama::LLAMA;
use super::{
    BiasFlags, ConfigDefault, ConfigReading, ConfigRope, DenseSpec, DenseVariant, HeadDim, KvHeads,
    OwnSections, RopeTraditional,
};
use crate::diag::FieldPath;
use crate::ir::{SanitizeRule, ShardOracle};
use crate::model::{ConfigModelType, Family};
use crate::reader::Reader;
use crate::validate::Checker;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub(crate) const GRANITE: DenseVariant = DenseVariant {
    family: Family::Granite,
    model_types: &[ConfigModelType::Granite],
    // granite.py's sanitize only pops a tied lm_head (a rotary table in its
    // checkpoint fails mlx-lm's strict load, so it must here too).
    sanitize: &[SanitizeRule::DropTiedHead],
    // granite.py has no shard().
    shard_oracle: ShardOracle::Absent,
    head_dim: HeadDim::HiddenOverHeads,
    rope_traditional: RopeTraditional::AlwaysFalse {
        hint: "Granite ignores rope_traditional; write false",
    },
    config: ConfigReading {
        kv_heads: KvHeads::Required,
        bias_flags: BiasFlags::Required,
        // No default for rope_theta.
        rope: ConfigRope::Flat(ConfigDefault::Required),
        read_extras: note_rope_traditional,
        read_own_sections: read_scales,
        ..LLAMA.config
    },
    check_scales: require_scales,
    hf_own_fields: multiplier_fields,
    ..LLAMA
};

/// granite.py's multipliers, each a Python float that meets an array as a weak
/// scalar (rounded to the array's dtype).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GraniteScales {
    /// `embedding_multiplier`: `embed_tokens(ids) * embedding_multiplier`.
    pub embedding_multiplier: f64,
    /// `attention_multiplier`: SDPA's `scale` (in place of `head_dim ** -0.5`).
    pub attention_multiplier: f64,
    /// `residual_multiplier`: `h + branch * residual_multiplier` on both branches.
    pub residual_multiplier: f64,
    /// `logits_scaling`: the logits divided by it after the head.
    pub logits_scaling: f64,
}

/// The multipliers a granite spec must state, each positive and finite.
fn require_scales(spec: &DenseSpec, c: &mut Checker) {
    let Some(g) = &spec.scales else {
        c.err(
            FieldPath::parse("scales"),
            "missing, but a granite spec states its four multipliers",
            "a mapping {embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling}",
            "copy them from config.json (granite.py has no defaults for them)",
        );
        return;
    };
    for (name, v) in [
        ("embedding_multiplier", g.embedding_multiplier),
        ("attention_multiplier", g.attention_multiplier),
        ("residual_multiplier", g.residual_multiplier),
        ("logits_scaling", g.logits_scaling),
    ] {
        c.positive_finite(
            &format!("scales.{name}"),
            v,
            "granite-3.3-2b: 12.0, 0.015625, 0.22, 8.0",
        );
    }
}

/// The multipliers in the config.json view.
fn multiplier_fields(spec: &DenseSpec, v: &mut Value) {
    if let Some(g) = &spec.scales {
        v["embedding_multiplier"] = json!(g.embedding_multiplier);
        v["attention_multiplier"] = json!(g.attention_multiplier);
        v["residual_multiplier"] = json!(g.residual_multiplier);
        v["logits_scaling"] = json!(g.logits_scaling);
    }
}

fn note_rope_traditional(r: &mut Reader) {
    if let Some(v) = r.get("rope_traditional").cloned() {
        r.note(
            "rope_traditional",
            v,
            "ignored: mlx-lm's granite.py always uses traditional=False",
        );
    }
}

/// granite.py's multipliers have no defaults.
fn read_scales(r: &mut Reader, _num_layers: u32) -> OwnSections {
    OwnSections {
        no_rope_layer_interval: None,
        scales: Some(GraniteScales {
            embedding_multiplier: r.required_float("embedding_multiplier"),
            attention_multiplier: r.required_float("attention_multiplier"),
            residual_multiplier: r.required_float("residual_multiplier"),
            logits_scaling: r.required_float("logits_scaling"),
        }),
    }
}
