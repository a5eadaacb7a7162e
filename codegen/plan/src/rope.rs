//! A RoPE kind as its name and numbers, in the order its constructor takes
//! them: the one reading of [`RopeKind`]'s fields that the fingerprint
//! hashes, the plan file shows and the emitter passes to `Rope::llama3`.

use archgen_ir::RopeKind;
use std::fmt;

/// One number of a RoPE kind, in the precision the IR holds it: f32 where
/// mlx-lm's value meets an f32 array directly, f64 where it is combined as a
/// Python float first (the Llama-3 scaling).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeNumber {
    F32(f32),
    F64(f64),
}

impl fmt::Display for RopeNumber {
    /// The number as Rust prints its own type (shortest round-trip form).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RopeNumber::F32(v) => write!(f, "{v}"),
            RopeNumber::F64(v) => write!(f, "{v}"),
        }
    }
}

/// A RoPE kind's name and its numbers, each with the short label the plan
/// file prints (`θ`, `p`, `factor`, `low`, `high`, `original`).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeParameters {
    pub name: &'static str,
    pub numbers: Vec<(&'static str, RopeNumber)>,
}

/// The name and numbers of `kind`. Every field is bound by name (no `..`),
/// so a new RoPE field does not compile until the fingerprint covers it.
pub fn rope_parameters(kind: RopeKind) -> RopeParameters {
    use RopeNumber::{F32, F64};
    let (name, numbers) = match kind {
        RopeKind::Default { theta } => ("default", vec![("θ", F32(theta))]),
        RopeKind::Proportional {
            theta,
            partial_rotary_factor,
            factor,
        } => (
            "proportional",
            vec![
                ("θ", F32(theta)),
                ("p", F32(partial_rotary_factor)),
                ("factor", F32(factor)),
            ],
        ),
        RopeKind::Llama3 {
            theta,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => (
            "llama3",
            vec![
                ("θ", F32(theta)),
                ("factor", F64(factor)),
                ("low", F64(low_freq_factor)),
                ("high", F64(high_freq_factor)),
                ("original", F64(original_max_position_embeddings)),
            ],
        ),
        RopeKind::NoPe => ("none", Vec::new()),
    };
    RopeParameters { name, numbers }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Llama-3 numbers keep the scaling in f64 and in `Llama3RoPE`'s
    /// argument order, which `Rope::llama3` and the fingerprint rely on.
    #[test]
    fn llama3_numbers_keep_order_and_precision() {
        let kind = RopeKind::Llama3 {
            theta: 500000.0,
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let p = rope_parameters(kind);
        assert_eq!(p.name, "llama3");
        assert_eq!(
            p.numbers,
            vec![
                ("θ", RopeNumber::F32(500000.0)),
                ("factor", RopeNumber::F64(32.0)),
                ("low", RopeNumber::F64(1.0)),
                ("high", RopeNumber::F64(4.0)),
                ("original", RopeNumber::F64(8192.0)),
            ]
        );
        assert_eq!(rope_parameters(RopeKind::NoPe).numbers, Vec::new());
    }

    /// Each number prints as its own type does: an f32 is not widened.
    #[test]
    fn numbers_print_in_their_own_precision() {
        assert_eq!(RopeNumber::F32(0.1).to_string(), "0.1");
        assert_eq!(RopeNumber::F64(0.1).to_string(), "0.1");
        assert_eq!(RopeNumber::F32(1e6).to_string(), "1000000");
    }
}
