//! SmolLM3 (`smollm3.py`: llama.py's `ModelArgs` and `LlamaModel`): Llama
//! without RoPE on every `no_rope_layer_interval`-th layer (its `NoPE`
//! module), the one dense family with `rope.no_rope_layer_interval`.

use super::llama::LLAMA;
use super::{ConfigReading, DenseRope, DenseSpec, DenseVariant, OwnSections};
use crate::diag::FieldPath;
use crate::ir::ShardOracle;
use crate::model::{ConfigModelType, Family};
use crate::reader::Reader;
use crate::validate::Checker;
use serde_json::{json, Value};

pub(crate) const SMOLLM3: DenseVariant = DenseVariant {
    family: Family::SmolLm3,
    model_types: &[ConfigModelType::SmolLm3],
    // smollm3.py has no shard(), so a sharded run of it has no oracle.
    shard_oracle: ShardOracle::Absent,
    config: ConfigReading {
        read_own_sections: read_interval,
        ..LLAMA.config
    },
    check_no_rope_interval: check_interval,
    hf_own_fields: interval_field,
    ..LLAMA
};

impl DenseRope {
    /// Whether layer `i` rotates its queries and keys: every layer but each
    /// `no_rope_layer_interval`-th (smollm3.py's `ModelArgs.__post_init__`,
    /// `int((i + 1) % no_rope_layer_interval != 0)`).
    pub(crate) fn rotates(&self, i: usize) -> bool {
        match self.no_rope_layer_interval {
            None | Some(0) => true,
            Some(n) => (i + 1) % n as usize != 0,
        }
    }
}

/// The interval a smollm3 spec must state.
fn check_interval(spec: &DenseSpec, c: &mut Checker) {
    let path = || FieldPath::parse("rope.no_rope_layer_interval");
    match spec.rope.no_rope_layer_interval {
        None => c.err(
            path(),
            "missing, but a smollm3 spec states which layers have no RoPE",
            "a positive integer (SmolLM3-3B: 4)",
            "write `no_rope_layer_interval` under `rope` (mlx-lm's default is 4)",
        ),
        Some(0) => c.err(
            path(),
            "0 is out of range (mlx-lm computes (i + 1) % interval)",
            "a positive integer (SmolLM3-3B: 4)",
            "every n-th layer has no RoPE; 1 would drop it everywhere",
        ),
        Some(_) => {}
    }
}

/// The interval in the config.json view. No `no_rope_layers`: mlx-lm
/// derives the list from the interval.
fn interval_field(spec: &DenseSpec, v: &mut Value) {
    v["no_rope_layer_interval"] = json!(spec.rope.no_rope_layer_interval);
}

fn read_interval(r: &mut Reader, num_layers: u32) -> OwnSections {
    OwnSections {
        no_rope_layer_interval: Some(read_no_rope_layers(r, num_layers)),
        scales: None,
    }
}

/// smollm3.py's NoPE layers: `no_rope_layer_interval` (default 4) and, when
/// config.json lists them, `no_rope_layers` (1 = RoPE, 0 = none), which must be
/// the list the interval gives: a spec states the interval only, so another
/// pattern is refused rather than silently replaced.
fn read_no_rope_layers(r: &mut Reader, num_layers: u32) -> u32 {
    let interval = r.uint("no_rope_layer_interval", 4);
    if interval == 0 {
        r.problem(
            "no_rope_layer_interval",
            "0 is out of range (mlx-lm computes (i + 1) % no_rope_layer_interval)",
        );
        return interval;
    }
    let Some(listed) = r.get("no_rope_layers").cloned() else {
        return interval;
    };
    let expected: Vec<Value> = (1..=num_layers)
        .map(|i| json!(u32::from(i % interval != 0)))
        .collect();
    match listed.as_array() {
        Some(list) if *list == expected => {}
        Some(list) if list.len() != num_layers as usize => r.problem(
            "no_rope_layers",
            &format!(
                "{} entries for {num_layers} layers (mlx-lm raises `no_rope_layers` length mismatch)",
                list.len()
            ),
        ),
        _ => r.problem(
            "no_rope_layers",
            &format!(
                "{listed} is not the every-{interval}th-layer pattern of no_rope_layer_interval {interval}; archgen's smollm3 spec states the interval only (drop no_rope_layers or make it match)"
            ),
        ),
    }
    interval
}
