//! Parity tiers (docs/parity.md, "Tiers"): which oracle a model's run is
//! bit-exact with, derived from the block IR alone.
//!
//! * **L1**: bit-exact with stock mlx-lm 0.32.2.
//! * **L2**: bit-exact with mlx-optiq 0.7.7 on mlx-lm 0.32.2, for what stock mlx-lm
//!   lacks (per-layer mixed-precision KV applied as `install_mixed_kv` applies it).
//! * **L3**: no oracle. No IR fact leads there yet; run-time choices that do add
//!   their reasons here: a model split over ranks without a sharded oracle
//!   ([`sharded_tier`]), and a speed lever whose bits no oracle reproduces
//!   ([`Reason::Lever`], [`TierReport::with_reason`]).

use std::fmt;

use crate::{KvCache, KvSource, Mixer, ModelIr, Scores, ShardOracle};

/// A parity tier; a lower tier is a stronger claim (`L1 < L2 < L3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    L1,
    L2,
    L3,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::L1 => "L1",
            Tier::L2 => "L2",
            Tier::L3 => "L3",
        }
    }
    /// What the tier is checked against.
    pub fn oracle(self) -> &'static str {
        match self {
            Tier::L1 => "bit-exact with mlx-lm 0.32.2",
            Tier::L2 => "bit-exact with mlx-optiq 0.7.7 on mlx-lm 0.32.2",
            Tier::L3 => "no oracle",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "L1" | "l1" => Ok(Tier::L1),
            "L2" | "l2" => Ok(Tier::L2),
            "L3" | "l3" => Ok(Tier::L3),
            other => Err(format!("`{other}` is not a tier (L1, L2 or L3)")),
        }
    }
}

/// Why a model is above L1: one reason per feature, each with its tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Per-layer mixed-precision KV (mlx-optiq `install_mixed_kv`): the layers and
    /// their (bits, group size), and `quantized_kv_start`.
    MixedKv {
        layers: Vec<(usize, u32, u32)>,
        start: usize,
    },
    /// Split over ranks (`archgen launch`) where no sharded oracle runs: a
    /// model type mlx-lm has no `shard()` for, or a feature whose oracle is
    /// not run sharded.
    ShardedWithoutOracle { ranks: usize, why: &'static str },
    /// A run-time speed lever set so that the run leaves L1 (archgen's
    /// levers, docs/cli.md): its name, its setting and the tier it gives.
    Lever {
        name: &'static str,
        setting: String,
        tier: Tier,
    },
    /// Batches of several sequences that mlx-lm cannot run as archgen runs
    /// them: its gemma2 attention with grouped K/V heads adds a batch's 4-D
    /// mask to 5-D scores (a broadcast error, or at B = `n_kv_heads` each
    /// head masked with another row's mask); archgen masks each row with
    /// its own ([`batch_tier`]).
    BatchWithoutOracle { why: &'static str },
}

impl Reason {
    pub fn tier(&self) -> Tier {
        match self {
            Reason::MixedKv { .. } => Tier::L2,
            Reason::ShardedWithoutOracle { .. } | Reason::BatchWithoutOracle { .. } => Tier::L3,
            Reason::Lever { tier, .. } => *tier,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::MixedKv { layers, start } => {
                let list: Vec<String> = layers
                    .iter()
                    .map(|(i, b, g)| format!("{i}: {b}-bit g{g}"))
                    .collect();
                write!(
                    f,
                    "per-layer mixed KV (mlx-optiq install_mixed_kv, quantized_kv_start {start}; layers {})",
                    list.join(", ")
                )
            }
            Reason::ShardedWithoutOracle { ranks, why } => {
                write!(
                    f,
                    "tensor parallel over {ranks} ranks without a sharded oracle ({why})"
                )
            }
            Reason::Lever { name, setting, .. } => write!(f, "lever {name}={setting}"),
            Reason::BatchWithoutOracle { why } => {
                write!(f, "batches of several sequences without an oracle ({why})")
            }
        }
    }
}

/// A model's tier and the reasons for it (empty at L1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierReport {
    pub tier: Tier,
    pub reasons: Vec<Reason>,
}

impl TierReport {
    /// The report with one more reason; the tier becomes the higher of the
    /// two (a run's tier is the highest among the model's and its levers').
    pub fn with_reason(mut self, reason: Reason) -> TierReport {
        self.tier = self.tier.max(reason.tier());
        self.reasons.push(reason);
        self
    }
}

impl fmt::Display for TierReport {
    /// `L1`, or `L2: per-layer mixed KV (...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tier.as_str())?;
        for (n, r) in self.reasons.iter().enumerate() {
            f.write_str(if n == 0 { ": " } else { "; " })?;
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// The tier of a model: the highest tier among its features' reasons, L1 without any.
pub fn tier(ir: &ModelIr) -> TierReport {
    let mut mixed = Vec::new();
    let mut mixed_start = None;
    for layer in &ir.layers {
        match &layer.mixer {
            Mixer::Attention(a) => match a.kv {
                KvSource::Shared { .. } => {}
                KvSource::Own { cache, .. } => match cache {
                    // mlx-lm's own KVCache / RotatingKVCache and QuantizedKVCache.
                    KvCache::Plain | KvCache::Quantized(_) => {}
                    KvCache::QuantizedAfterForward { quant, start } => {
                        mixed.push((layer.index, quant.bits, quant.group_size));
                        mixed_start = Some(start);
                    }
                },
            },
            // The CPU path of mlx-lm's gated delta rule (`gated_delta_ops`)
            // is what the runtime reproduces: L1 on the CPU. A short conv is
            // mlx's own conv1d, as lfm2.py calls it.
            Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) => {}
            // Its plain KVCache of the latent and the RoPE key, eager ops.
            Mixer::LatentAttention(_) => {}
        }
    }
    let mut reasons = Vec::new();
    if let Some(start) = mixed_start {
        reasons.push(Reason::MixedKv {
            layers: mixed,
            start,
        });
    }
    TierReport {
        tier: reasons.iter().map(Reason::tier).max().unwrap_or(Tier::L1),
        reasons,
    }
}

/// The tier of a run of `ir` split over `ranks` processes (`archgen launch`).
/// The oracle of a sharded run is mlx-lm's own sharded model (`shard()`):
/// a model whose lowering says mlx-lm has one ([`ShardOracle::MlxLm`])
/// keeps its tier; one without ([`ShardOracle::Absent`]), or a feature whose
/// oracle is not run sharded (mlx-optiq's mixed KV), makes the run L3.
pub fn sharded_tier(ir: &ModelIr, ranks: usize) -> TierReport {
    let mut report = tier(ir);
    if ranks <= 1 {
        return report;
    }
    let no_shard = match ir.sharding.oracle {
        ShardOracle::MlxLm => None,
        ShardOracle::Absent => Some("mlx-lm has no shard() for this model type"),
    };
    let why = no_shard.or(match report.tier {
        Tier::L1 => None,
        Tier::L2 | Tier::L3 => Some("its oracle is not run sharded"),
    });
    if let Some(why) = why {
        report
            .reasons
            .push(Reason::ShardedWithoutOracle { ranks, why });
        report.tier = Tier::L3;
    }
    report
}

/// The tier of batches of several sequences of `ir` (`archgen logits
/// --batch`, `archgen serve` with `--max-batch` above 1), given `report`, the
/// tier of one sequence. mlx-lm's `BatchGenerator` is the oracle of a batch,
/// except where its batched forward fails or masks rows with each other's
/// masks: attention with written-out softcapped scores over grouped K/V heads
/// (gemma2 with `n_kv_heads < n_heads`), which archgen masks row by row (L3).
/// A batch of one row keeps mlx-lm's graph and its tier.
pub fn batch_tier(ir: &ModelIr, report: TierReport) -> TierReport {
    let grouped_softcap = ir.layers.iter().any(|layer| match &layer.mixer {
        Mixer::Attention(a) => match a.scores {
            Scores::Softcapped { .. } => a.n_kv_heads < a.n_heads,
            Scores::FusedSdpa | Scores::FusedSdpaWithSinks => false,
        },
        Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) | Mixer::LatentAttention(_) => false,
    });
    match grouped_softcap {
        true => report.with_reason(Reason::BatchWithoutOracle {
            why: "mlx-lm's gemma2 masks a batch of grouped-query attention with a 4-D mask over \
                  5-D scores; archgen gives each row its own mask",
        }),
        false => report,
    }
}
