//! A RoPE kind as its name and numbers, in the order its constructor takes
//! them: the one reading of [`RopeKind`]'s fields that the fingerprint
//! hashes, the plan file shows and the emitter passes to `Rope::llama3` and
//! `Rope::yarn`.

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
    // Only the Llama-3, linear and YaRN scalings are f64; every other number is f32.
    let (name, f32s, f64s): (_, Vec<(_, f32)>, Vec<(_, f64)>) = match kind {
        RopeKind::Default { theta } => ("default", vec![("θ", theta)], Vec::new()),
        RopeKind::Proportional {
            theta,
            partial_rotary_factor,
            factor,
        } => (
            "proportional",
            vec![
                ("θ", theta),
                ("p", partial_rotary_factor),
                ("factor", factor),
            ],
            Vec::new(),
        ),
        RopeKind::Llama3 {
            theta,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => (
            "llama3",
            vec![("θ", theta)],
            vec![
                ("factor", factor),
                ("low", low_freq_factor),
                ("high", high_freq_factor),
                ("original", original_max_position_embeddings),
            ],
        ),
        RopeKind::Linear { theta, factor } => {
            ("linear", vec![("θ", theta)], vec![("factor", factor)])
        }
        RopeKind::Yarn {
            theta,
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
        } => (
            "yarn",
            vec![("θ", theta)],
            vec![
                ("factor", factor),
                ("original", original_max_position_embeddings),
                ("beta_fast", beta_fast),
                ("beta_slow", beta_slow),
                ("mscale", mscale),
                ("mscale_all_dim", mscale_all_dim),
            ],
        ),
        RopeKind::NoPe => ("none", Vec::new(), Vec::new()),
    };
    let numbers = f32s
        .into_iter()
        .map(|(label, v)| (label, RopeNumber::F32(v)))
        .chain(
            f64s.into_iter()
                .map(|(label, v)| (label, RopeNumber::F64(v))),
        )
        .collect();
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
