//! Tensor parallelism as a transformation of IR blocks, following mlx-lm's
//! `Model.shard(group)` (qwen3.py, llama.py, qwen2.py) and mlx nn's
//! `shard_linear`: in every attention block Q/K/V are "all-to-sharded" (each
//! rank keeps a contiguous block of output rows, so whole heads) and `o_proj`
//! is "sharded-to-all" (each rank keeps the matching block of input columns
//! and one `all_sum` adds the partial products); in every gated MLP
//! `gate_proj` / `up_proj` are all-to-sharded and `down_proj` sharded-to-all.
//! Heads and KV heads are divided by the number of ranks. Embeddings, norms,
//! the head and per-layer inputs stay whole on every rank.
//!
//! Routed experts in place of the MLP (qwen3_moe.py's `shard()`) keep the
//! router whole and split every expert's gate/up rows and down columns in
//! place, with one `all_sum` of the block's weighted expert output.
//!
//! The split reads only IR facts, never the family: every family whose
//! layers are attention plus a gated MLP gets it from this code. What has no
//! split yet (Gemma-4's experts beside the MLP) is refused with the reason.

use std::fmt::Write as _;

use archgen_spec::ir::{FeedForward, KvSource, Mixer, ModelIr, OutputGate, ProjectionBias, Values};

/// How one linear module is split (mlx nn `shard_linear`'s two kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Split {
    /// Rows of the weight (and of its bias, scales and biases): the output
    /// is this rank's slice. `AllToShardedLinear`.
    AllToSharded,
    /// Columns of the weight (and of its scales and biases); the partial
    /// products are summed over ranks with one `all_sum`, then the bias is
    /// added. `ShardedToAllLinear`.
    ShardedToAll,
}

impl Split {
    /// mlx's name for the split.
    pub fn name(self) -> &'static str {
        match self {
            Split::AllToSharded => "all-to-sharded",
            Split::ShardedToAll => "sharded-to-all",
        }
    }
}

/// One layer's split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSplit {
    pub index: usize,
    /// Query heads per rank.
    pub heads: usize,
    /// KV heads per rank.
    pub kv_heads: usize,
    /// MLP width per rank.
    pub mlp_width: usize,
    /// Module paths relative to the text model (`layers.{i}.self_attn.q_proj`)
    /// and their split, in forward order.
    pub modules: Vec<(String, Split)>,
}

/// A model split over `ranks` processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorParallel {
    pub ranks: usize,
    pub layers: Vec<LayerSplit>,
}

impl TensorParallel {
    /// Every split module, with its path relative to the text model.
    pub fn modules(&self) -> impl Iterator<Item = (&str, Split)> {
        self.layers
            .iter()
            .flat_map(|l| l.modules.iter().map(|(m, s)| (m.as_str(), *s)))
    }

    /// How many `all_sum`s one forward pass runs (one per sharded-to-all
    /// module: `o_proj`, `down_proj`, or the experts' `down_proj`, whose
    /// block sums once after weighting the experts).
    pub fn all_sums_per_forward(&self) -> usize {
        self.modules()
            .filter(|(_, s)| *s == Split::ShardedToAll)
            .count()
    }

    /// The plan-file section that shows the split (markdown).
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "## Tensor parallel ({} ranks)\n", self.ranks);
        let _ = writeln!(
            s,
            "As mlx-lm's `shard()`: q/k/v and gate/up all-to-sharded (rows), o/down \
             sharded-to-all (columns, one `all_sum` each, bias after it); routed experts split \
             in place, the router whole; embeddings, norms and the head whole on every rank. \
             {} `all_sum`s per forward pass.\n",
            self.all_sums_per_forward()
        );
        let _ = writeln!(
            s,
            "| layers | heads / rank | kv heads / rank | MLP width / rank | all-to-sharded | sharded-to-all |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        // Consecutive layers with the same row are one line.
        let row = |l: &LayerSplit| {
            let leaf = |split: Split| {
                l.modules
                    .iter()
                    .filter(|(_, s)| *s == split)
                    .map(|(m, _)| {
                        let prefix = format!("layers.{}.", l.index);
                        format!("`{}`", m.strip_prefix(&prefix).unwrap_or(m))
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            // Heads are divided evenly, so the whole layer has ranks times as many.
            let whole = (l.heads * self.ranks, l.kv_heads * self.ranks);
            format!(
                "{} of {} | {} of {} | {} | {} | {} |",
                l.heads,
                whole.0,
                l.kv_heads,
                whole.1,
                l.mlp_width,
                leaf(Split::AllToSharded),
                leaf(Split::ShardedToAll)
            )
        };
        let mut i = 0;
        while i < self.layers.len() {
            let r = row(&self.layers[i]);
            let mut j = i + 1;
            while j < self.layers.len() && row(&self.layers[j]) == r {
                j += 1;
            }
            let span = if j - i == 1 {
                format!("{}", self.layers[i].index)
            } else {
                format!("{}-{}", self.layers[i].index, self.layers[j - 1].index)
            };
            let _ = writeln!(s, "| {span} | {r}");
            i = j;
        }
        s
    }
}

/// Splits `ir` over `ranks` processes as mlx-lm's `shard()` does, or says
/// why it cannot be split (which layer, which size does not divide, or which
/// block has no split yet).
pub fn split(ir: &ModelIr, ranks: usize) -> Result<TensorParallel, String> {
    if ranks == 0 {
        return Err("tensor parallel over 0 ranks: the world size must be at least 1".into());
    }
    let divide = |what: &str, layer: usize, n: usize| -> Result<usize, String> {
        if n % ranks == 0 {
            Ok(n / ranks)
        } else {
            Err(format!(
                "{}: layer {layer}: {what} ({n}) is not divisible by the world size {ranks}; \
                 run it on a world size that divides it",
                ir.name
            ))
        }
    };
    let mut layers = Vec::with_capacity(ir.layers.len());
    for l in &ir.layers {
        let i = l.index;
        let mut modules = Vec::new();
        let (heads, kv_heads) = match &l.mixer {
            Mixer::GatedDeltaNet(_) => {
                return Err(format!(
                    "{}: layer {i}: Gated DeltaNet layers are not split yet (mlx-lm's qwen3_5 \
                     shard() splits them; archgen does not); run it on one rank",
                    ir.name
                ));
            }
            Mixer::Attention(a) => {
                match a.output_gate {
                    OutputGate::None => {}
                    OutputGate::SigmoidPerHead => {
                        return Err(format!(
                            "{}: layer {i}: output-gated attention (Qwen3.5's full layers) is \
                             not split yet; run it on one rank",
                            ir.name
                        ));
                    }
                }
                let p = format!("layers.{i}.self_attn");
                modules.push((format!("{p}.q_proj"), Split::AllToSharded));
                match a.kv {
                    KvSource::Own { values, .. } => {
                        modules.push((format!("{p}.k_proj"), Split::AllToSharded));
                        match values {
                            Values::Projected => {
                                modules.push((format!("{p}.v_proj"), Split::AllToSharded))
                            }
                            Values::SameAsKeys => {}
                        }
                    }
                    // A sharer reads its donor's K/V, which are already this
                    // rank's KV heads.
                    KvSource::Shared { .. } => {}
                }
                modules.push((format!("{p}.o_proj"), Split::ShardedToAll));
                // q/k/v biases are split with their rows; o_proj has none.
                match a.bias {
                    ProjectionBias::None | ProjectionBias::QueryKeyValue => {}
                }
                (
                    divide("the number of attention heads", i, a.n_heads)?,
                    divide("the number of KV heads", i, a.n_kv_heads)?,
                )
            }
        };
        let mlp_width = match &l.ffn {
            FeedForward::Mlp(m) => {
                let p = format!("layers.{i}.mlp");
                modules.push((format!("{p}.gate_proj"), Split::AllToSharded));
                modules.push((format!("{p}.up_proj"), Split::AllToSharded));
                modules.push((format!("{p}.down_proj"), Split::ShardedToAll));
                divide("the MLP width", i, m.width)?
            }
            // Routed experts in place of the MLP (qwen3_moe): the router
            // stays whole; every expert's gate/up rows and down columns are
            // split in place (`shard_inplace`), and the block sums its
            // weighted expert output over the ranks once.
            FeedForward::Moe(m) => {
                let p = format!("layers.{i}.mlp.switch_mlp");
                modules.push((format!("{p}.gate_proj"), Split::AllToSharded));
                modules.push((format!("{p}.up_proj"), Split::AllToSharded));
                modules.push((format!("{p}.down_proj"), Split::ShardedToAll));
                divide("the experts' width", i, m.width)?
            }
            FeedForward::MoeAndSharedExpert { .. } => {
                return Err(format!(
                    "{}: layer {i}: routed experts with a shared expert (Qwen3.5-MoE) are not \
                     split yet; run it on one rank",
                    ir.name
                ));
            }
            FeedForward::MlpAndMoe { .. } => {
                return Err(format!(
                    "{}: layer {i}: routed experts beside the MLP (Gemma-4's MoE) are not split \
                     yet (mlx-lm has no shard() for them); run it on one rank",
                    ir.name
                ));
            }
        };
        layers.push(LayerSplit {
            index: i,
            heads,
            kv_heads,
            mlp_width,
            modules,
        });
    }
    Ok(TensorParallel { ranks, layers })
}
