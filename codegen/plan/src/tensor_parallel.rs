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
//! Qwen3.5 / Qwen3.6 (qwen3_5.py's `shard()`): a Gated DeltaNet layer splits
//! its conv1d channels and `in_proj_qkv` rows by segments (q, k and v side by
//! side, each cut in N), `in_proj_z` / `_b` / `_a` by rows, `dt_bias` and
//! `A_log` in N, and `out_proj` by columns, with one `all_sum` of its output;
//! gated attention splits `q_proj` by rows (per head the queries then the
//! output gate, so whole heads keep their gates); routed experts with a
//! shared expert split the shared expert and the experts in place, keep the
//! router and `shared_expert_gate` whole, and sum the block's output once.
//! Its untied head is split over the vocabulary (all-to-sharded) and the
//! logits gathered along their last axis; the other families' `shard()`
//! keep the head whole. Both, and the repeat of K/V heads, are the IR's
//! [`archgen_ir::Sharding`], set by each family's lowering.
//!
//! The split reads only IR facts, never the family: every family whose
//! layers are attention plus a gated MLP gets it from this code. What has no
//! split yet (Gemma-4's experts beside the MLP) is refused with the reason.

use std::fmt::Write as _;

use archgen_ir::{
    FeedForward, HeadSplit, HeadWeight, InProj, KvHeadSplit, KvSource, Mixer, ModelIr, OutputGate,
    ProjectionBias, QkNorm, Values,
};
use archgen_ir::{GateUpProjection, QkvProjection};

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
    /// Axis 0 (the output rows of a linear, the channels of a depthwise
    /// conv) cut at `at` into three segments (q, k and v side by side), each
    /// segment split in N and this rank's parts concatenated: mlx's `_shard`
    /// with `segments` (qwen3_5's `in_proj_qkv` and `conv1d`).
    Segmented { at: [usize; 2] },
    /// A parameter vector (not a module) split in N along axis 0:
    /// `mx.split(p, N)[rank]` (qwen3_5's `dt_bias`, `A_log`).
    Vector,
    /// K/V projections of fewer heads than ranks: every tensor's rows
    /// grouped by the `heads` heads, each head repeated `times` times in
    /// place, then all-to-sharded, so each rank holds one head (qwen3_5's
    /// `repeat_kv_layer_inplace` before `shard_linear`).
    RepeatedHeads { heads: usize, times: usize },
}

impl Split {
    /// mlx's name for the split.
    pub fn name(self) -> &'static str {
        match self {
            Split::AllToSharded => "all-to-sharded",
            Split::ShardedToAll => "sharded-to-all",
            Split::Segmented { .. } => "all-to-sharded by segments",
            Split::Vector => "split in N",
            Split::RepeatedHeads { .. } => "heads repeated, then all-to-sharded",
        }
    }
}

/// What mixes the sequence in a split layer (for the plan's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixerKind {
    /// Softmax attention: `heads` query heads, `kv_heads` KV heads.
    Attention,
    /// Softmax attention with the per-head output gate in `q_proj`.
    GatedAttention,
    /// Gated DeltaNet: `heads` value heads, `kv_heads` key heads.
    GatedDeltaNet,
}

/// One layer's split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSplit {
    pub index: usize,
    pub mixer: MixerKind,
    /// Query heads per rank (Gated DeltaNet: value heads).
    pub heads: usize,
    /// KV heads per rank (Gated DeltaNet: key heads).
    pub kv_heads: usize,
    /// How many times each KV head is repeated before the split (1: not;
    /// qwen3_5 with fewer KV heads than ranks: ranks / KV heads).
    pub kv_repeat: usize,
    /// MLP width per rank (routed experts: each expert's width).
    pub mlp_width: usize,
    /// The shared expert's width per rank, beside routed experts.
    pub shared_width: Option<usize>,
    /// `all_sum`s of the layer per forward pass (one for the mixer, one for
    /// the feed-forward half: a MoE block sums its experts and its shared
    /// expert together, once).
    pub all_sums: usize,
    /// Module paths relative to the text model (`layers.{i}.self_attn.q_proj`)
    /// and their split, in forward order.
    pub modules: Vec<(String, Split)>,
}

/// A model split over `ranks` processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorParallel {
    pub ranks: usize,
    pub layers: Vec<LayerSplit>,
    /// Vocabulary rows of the head per rank, when the head is split
    /// (all-to-sharded `lm_head`, logits gathered along their last axis).
    pub vocab_per_rank: Option<usize>,
}

/// The module path of an untied head, relative to the text model.
pub const HEAD_MODULE: &str = "lm_head";

impl TensorParallel {
    /// Every split module, with its path relative to the text model.
    pub fn modules(&self) -> impl Iterator<Item = (&str, Split)> {
        let head = self
            .vocab_per_rank
            .map(|_| (HEAD_MODULE, Split::AllToSharded));
        self.layers
            .iter()
            .flat_map(|l| l.modules.iter().map(|(m, s)| (m.as_str(), *s)))
            .chain(head)
    }

    /// How many `all_sum`s one forward pass runs (one per sharded-to-all
    /// `o_proj`, `down_proj` or `out_proj`; a MoE block sums once after
    /// weighting its experts and adding its shared expert).
    pub fn all_sums_per_forward(&self) -> usize {
        self.layers.iter().map(|l| l.all_sums).sum()
    }

    /// The plan-file section that shows the split (markdown).
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "## Tensor parallel ({} ranks)\n", self.ranks);
        let _ = writeln!(
            s,
            "As mlx-lm's `shard()`: q/k/v and gate/up all-to-sharded (rows), o/down \
             sharded-to-all (columns, one `all_sum` each, bias after it); routed experts split \
             in place, the router whole; embeddings and norms whole on every rank; {}. \
             {} `all_sum`s per forward pass.\n",
            match self.vocab_per_rank {
                Some(v) => format!(
                    "the head all-to-sharded over the vocabulary ({v} rows per rank), the logits \
                     gathered along their last axis (one `all_gather`)"
                ),
                None => "the head whole on every rank".to_string(),
            },
            self.all_sums_per_forward()
        );
        let _ = writeln!(
            s,
            "| layers | mixer | heads / rank | kv heads / rank | MLP width / rank | all-to-sharded | \
             sharded-to-all | split in N |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        // Consecutive layers with the same row are one line.
        let row = |l: &LayerSplit| {
            let leaf = |keep: &dyn Fn(Split) -> bool| {
                l.modules
                    .iter()
                    .filter(|(_, s)| keep(*s))
                    .map(|(m, s)| {
                        let prefix = format!("layers.{}.", l.index);
                        let m = m.strip_prefix(&prefix).unwrap_or(m);
                        match s {
                            Split::Segmented { at } => {
                                format!("`{m}` (segments at {}, {})", at[0], at[1])
                            }
                            Split::RepeatedHeads { times, .. } => {
                                format!("`{m}` (each head repeated {times} times)")
                            }
                            Split::AllToSharded | Split::ShardedToAll | Split::Vector => {
                                format!("`{m}`")
                            }
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (mixer, heads, kv_heads) = match l.mixer {
                MixerKind::Attention => ("attention", "", ""),
                MixerKind::GatedAttention => ("gated attention", "", ""),
                MixerKind::GatedDeltaNet => ("Gated DeltaNet", " value", " key"),
            };
            // Heads are divided evenly, so the whole layer has ranks times as
            // many (KV heads repeated to the ranks: ranks / repeat).
            let whole = (l.heads * self.ranks, l.kv_heads * self.ranks / l.kv_repeat);
            let width = match l.shared_width {
                None => format!("{}", l.mlp_width),
                Some(w) => format!("{} per expert, shared expert {w}", l.mlp_width),
            };
            format!(
                "{mixer} | {} of {}{heads} | {} of {}{kv_heads} | {width} | {} | {} | {} |",
                l.heads,
                whole.0,
                l.kv_heads,
                whole.1,
                leaf(&|s| {
                    matches!(
                        s,
                        Split::AllToSharded | Split::Segmented { .. } | Split::RepeatedHeads { .. }
                    )
                }),
                leaf(&|s| s == Split::ShardedToAll),
                leaf(&|s| s == Split::Vector),
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

/// Why a fused projection is not split: its rows are queries, keys and
/// values (or gate and up) side by side, so a contiguous block of rows is
/// not one rank's heads, and no mlx-lm `shard()` says how it is split.
/// A gated MLP under `prefix` (a plain MLP, the experts' `switch_mlp` or a
/// shared expert) as Megatron splits it: gate and up rows sharded, down
/// columns sharded and summed over the ranks.
fn push_gated_mlp(modules: &mut Vec<(String, Split)>, prefix: &str) {
    modules.push((format!("{prefix}.gate_proj"), Split::AllToSharded));
    modules.push((format!("{prefix}.up_proj"), Split::AllToSharded));
    modules.push((format!("{prefix}.down_proj"), Split::ShardedToAll));
}

fn fused_refused(ir: &ModelIr, layer: usize, module: &str) -> String {
    format!(
        "{}: layer {layer}: the fused `{module}` is not split yet (its rows are several \
         projections side by side, and mlx-lm has no shard() for it); run it on one rank",
        ir.name
    )
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
        let (mixer, heads, kv_heads, kv_repeat) = match &l.mixer {
            // lfm2.py has no shard(), and a depthwise conv over B * x has no
            // head structure to split by.
            // deepseek_v3's shard() splits q_b_proj and the per-head
            // MultiLinears, which archgen's split does not cover yet.
            Mixer::LatentAttention(_) => {
                return Err(format!(
                    "{}: layer {i}: a latent attention layer is not split yet; run it on one \
                     rank",
                    ir.name
                ))
            }
            Mixer::ShortConv(_) => {
                return Err(format!(
                    "{}: layer {i}: a short-conv layer is not split (mlx-lm's lfm2 has no \
                     shard()); run it on one rank",
                    ir.name
                ))
            }
            // qwen3_5's GatedDeltaNet: q, k and v side by side in
            // `in_proj_qkv` and the conv's channels, so both are split by
            // segments [key_dim, 2 * key_dim]; z, b, a by rows; the per-head
            // `dt_bias` and `A_log` in N; `out_proj` by columns, its output
            // summed once (`all_sum` in `GatedDeltaNet.__call__`).
            Mixer::GatedDeltaNet(d) => {
                match d.in_proj {
                    InProj::Split => {}
                    // qwen3_next.py has no shard(), and its q, k, v, z rows
                    // are interleaved per key head in one projection.
                    InProj::GroupedPerKeyHead => {
                        return Err(format!(
                            "{}: layer {i}: a Gated DeltaNet with per-key-head grouped \
                             projections is not split (mlx-lm's qwen3_next has no shard()); \
                             run it on one rank",
                            ir.name
                        ))
                    }
                }
                let p = format!("layers.{i}.linear_attn");
                let key_dim = d.k_heads * d.k_head_dim;
                let segments = Split::Segmented {
                    at: [key_dim, 2 * key_dim],
                };
                modules.push((format!("{p}.conv1d"), segments));
                modules.push((format!("{p}.in_proj_qkv"), segments));
                modules.push((format!("{p}.in_proj_z"), Split::AllToSharded));
                modules.push((format!("{p}.in_proj_b"), Split::AllToSharded));
                modules.push((format!("{p}.in_proj_a"), Split::AllToSharded));
                modules.push((format!("{p}.dt_bias"), Split::Vector));
                modules.push((format!("{p}.A_log"), Split::Vector));
                modules.push((format!("{p}.out_proj"), Split::ShardedToAll));
                (
                    MixerKind::GatedDeltaNet,
                    divide("the number of linear-attention value heads", i, d.v_heads)?,
                    divide("the number of linear-attention key heads", i, d.k_heads)?,
                    1,
                )
            }
            Mixer::Attention(a) => {
                let kind = match a.output_gate {
                    OutputGate::None => MixerKind::Attention,
                    // Qwen3NextAttention: `q_proj` has per head the queries,
                    // then the gate (`reshape(B, L, heads, -1)`, split in
                    // two), so a contiguous block of rows is whole heads with
                    // their gates: the plain all-to-sharded split.
                    OutputGate::SigmoidPerHead => MixerKind::GatedAttention,
                };
                match a.projection {
                    QkvProjection::Separate => {}
                    QkvProjection::Fused => return Err(fused_refused(ir, i, "qkv_proj")),
                }
                // A q/k norm over the whole projection takes one mean over
                // every head: a rank holding some of them cannot compute it.
                match (a.qk_norm, ranks) {
                    (QkNorm::RmsWholeProjection, 2..) => {
                        return Err(format!(
                            "{}: layer {i}: its q/k RMSNorm spans every head of the projection, \
                             which a split by heads cannot compute; run it on one rank",
                            ir.name
                        ))
                    }
                    (QkNorm::RmsWholeProjection, _)
                    | (QkNorm::None | QkNorm::RmsPerHead | QkNorm::RmsPerHeadOnePlus, _) => {}
                }
                let p = format!("layers.{i}.self_attn");
                let heads = divide("the number of attention heads", i, a.n_heads)?;
                // qwen3_5's shard() repeats every KV head N / kv_heads times
                // when there are fewer than ranks, so each rank holds one.
                let fewer_kv_heads_than_ranks = ranks > a.n_kv_heads;
                let (kv_split, kv_heads, kv_repeat) =
                    match (ir.sharding.kv_heads, fewer_kv_heads_than_ranks) {
                        (KvHeadSplit::RepeatedWhenFewer, true) => {
                            if ranks % a.n_kv_heads != 0 {
                                return Err(format!(
                                    "{}: layer {i}: the number of KV heads ({}) is fewer than \
                                     the world size {ranks} and does not divide it (mlx-lm \
                                     repeats each KV head N / {} times); run it on a world \
                                     size that divides or is a multiple of it",
                                    ir.name, a.n_kv_heads, a.n_kv_heads
                                ));
                            }
                            let times = ranks / a.n_kv_heads;
                            let split = Split::RepeatedHeads {
                                heads: a.n_kv_heads,
                                times,
                            };
                            (split, 1, times)
                        }
                        (KvHeadSplit::RepeatedWhenFewer, false) | (KvHeadSplit::Divided, _) => {
                            let per_rank = divide("the number of KV heads", i, a.n_kv_heads)?;
                            (Split::AllToSharded, per_rank, 1)
                        }
                    };
                modules.push((format!("{p}.q_proj"), Split::AllToSharded));
                match a.kv {
                    KvSource::Own { values, .. } => {
                        modules.push((format!("{p}.k_proj"), kv_split));
                        match values {
                            Values::Projected => modules.push((format!("{p}.v_proj"), kv_split)),
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
                    ProjectionBias::QueryKeyValueOutput => {
                        return Err(format!(
                            "{}: layer {i}: an o_proj bias (gpt_oss's attention) is not split \
                             yet; run it on one rank",
                            ir.name
                        ))
                    }
                }
                (kind, heads, kv_heads, kv_repeat)
            }
        };
        let (mlp_width, shared_width) = match &l.ffn {
            FeedForward::Mlp(m) => {
                match m.projection {
                    GateUpProjection::Separate => {}
                    GateUpProjection::Fused => return Err(fused_refused(ir, i, "gate_up_proj")),
                }
                let p = format!("layers.{i}.mlp");
                push_gated_mlp(&mut modules, &p);
                (divide("the MLP width", i, m.width)?, None)
            }
            // Routed experts in place of the MLP (qwen3_moe): the router
            // stays whole; every expert's gate/up rows and down columns are
            // split in place (`shard_inplace`), and the block sums its
            // weighted expert output over the ranks once.
            FeedForward::Moe(m) => {
                let p = format!("layers.{i}.mlp.switch_mlp");
                push_gated_mlp(&mut modules, &p);
                (divide("the experts' width", i, m.width)?, None)
            }
            // Qwen3NextSparseMoeBlock (qwen3_5's shard()): the shared expert
            // and the experts split in place, the router and the one-output
            // `shared_expert_gate` whole; the block adds the weighted
            // experts and the gated shared expert, then sums over the ranks
            // once (its `sharding_group`).
            FeedForward::MoeAndSharedExpert { moe, shared } => {
                let p = format!("layers.{i}.mlp");
                push_gated_mlp(&mut modules, &format!("{p}.shared_expert"));
                push_gated_mlp(&mut modules, &format!("{p}.switch_mlp"));
                (
                    divide("the experts' width", i, moe.width)?,
                    Some(divide("the shared expert's width", i, shared.width)?),
                )
            }
            FeedForward::BiasedExperts(_) => {
                return Err(format!(
                    "{}: layer {i}: routed experts with biases (gpt_oss's MLPBlock) are not \
                     split yet; run it on one rank",
                    ir.name
                ));
            }
            FeedForward::MoeAndSharedExperts { .. } => {
                return Err(format!(
                    "{}: layer {i}: routed experts with shared experts (glm4_moe's MoE) are not \
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
            mixer,
            heads,
            kv_heads,
            kv_repeat,
            mlp_width,
            shared_width,
            all_sums: 2,
            modules,
        });
    }
    let vocab_per_rank = match (ir.head.weight, ir.sharding.head) {
        (HeadWeight::Untied, HeadSplit::OverVocabulary) => {
            if ir.vocab_size % ranks != 0 {
                return Err(format!(
                    "{}: the head: the vocabulary ({}) is not divisible by the world size \
                     {ranks} (mlx-lm splits this model's untied head over it); run it on a \
                     world size that divides it",
                    ir.name, ir.vocab_size
                ));
            }
            Some(ir.vocab_size / ranks)
        }
        (HeadWeight::Untied, HeadSplit::Whole) | (HeadWeight::TiedEmbedding, _) => None,
    };
    Ok(TensorParallel {
        ranks,
        layers,
        vocab_per_rank,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ir(name: &str) -> ModelIr {
        let path = format!("{}/../../specs/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
        archgen_families::load(&path)
            .unwrap_or_else(|d| panic!("{path}: {d:?}"))
            .lower()
    }

    /// Why the spec `name` does not split over `ranks`.
    fn refusal(name: &str, ranks: usize) -> String {
        match split(&ir(name), ranks) {
            Ok(_) => panic!("{name} split over {ranks} ranks, but a refusal was expected"),
            Err(e) => e,
        }
    }

    /// Fails unless the spec `name` over `ranks` is refused with a message
    /// that names it and then says `says`.
    fn assert_refused(name: &str, ranks: usize, says: &str) {
        let e = refusal(name, ranks);
        assert!(e.starts_with(&format!("{name}: {says}")), "{e}");
    }

    fn split_of(tp: &TensorParallel, module: &str) -> Option<Split> {
        tp.modules().find(|(m, _)| *m == module).map(|(_, s)| s)
    }

    #[test]
    fn qwen3_6_moe_splits_as_qwen3_5_shard() {
        let tp = split(&ir("qwen3.6-35b-a3b-tiny"), 2).unwrap();
        // key_dim = 2 key heads * 16: q, k, v segments of the conv and qkv.
        let seg = Some(Split::Segmented { at: [32, 64] });
        assert_eq!(split_of(&tp, "layers.0.linear_attn.conv1d"), seg);
        assert_eq!(split_of(&tp, "layers.0.linear_attn.in_proj_qkv"), seg);
        for m in ["in_proj_z", "in_proj_b", "in_proj_a"] {
            let m = format!("layers.0.linear_attn.{m}");
            assert_eq!(split_of(&tp, &m), Some(Split::AllToSharded), "{m}");
        }
        for m in ["dt_bias", "A_log"] {
            let m = format!("layers.0.linear_attn.{m}");
            assert_eq!(split_of(&tp, &m), Some(Split::Vector), "{m}");
        }
        let out = split_of(&tp, "layers.0.linear_attn.out_proj");
        assert_eq!(out, Some(Split::ShardedToAll));
        let q = split_of(&tp, "layers.3.self_attn.q_proj");
        assert_eq!(q, Some(Split::AllToSharded));
        let o = split_of(&tp, "layers.3.self_attn.o_proj");
        assert_eq!(o, Some(Split::ShardedToAll));
        // The router and the shared expert's gate stay whole.
        assert_eq!(split_of(&tp, "layers.0.mlp.gate"), None);
        assert_eq!(split_of(&tp, "layers.0.mlp.shared_expert_gate"), None);
        let d = split_of(&tp, "layers.0.mlp.shared_expert.down_proj");
        assert_eq!(d, Some(Split::ShardedToAll));
        let l0 = &tp.layers[0];
        assert_eq!(
            (l0.mixer, l0.heads, l0.kv_heads),
            (MixerKind::GatedDeltaNet, 2, 1)
        );
        assert_eq!((l0.mlp_width, l0.shared_width), (16, Some(16)));
        assert_eq!(tp.layers[3].mixer, MixerKind::GatedAttention);
        // One all_sum for each mixer, one for each MoE block.
        assert_eq!(tp.all_sums_per_forward(), 16);
        // Its head is untied: split over the vocabulary, as qwen3_5's shard().
        assert_eq!(tp.vocab_per_rank, Some(256));
        assert_eq!(split_of(&tp, HEAD_MODULE), Some(Split::AllToSharded));
    }

    #[test]
    fn a_tied_head_and_other_families_heads_stay_whole() {
        let tp = split(&ir("qwen3.5-4b-tiny"), 2).unwrap();
        assert_eq!(tp.vocab_per_rank, None);
        assert_eq!(tp.layers[0].shared_width, None);
        assert_eq!(
            split_of(&tp, "layers.0.mlp.down_proj"),
            Some(Split::ShardedToAll)
        );
        let tp = split(&ir("qwen3-0.6b-tiny"), 2).unwrap();
        assert_eq!(tp.vocab_per_rank, None);
    }

    #[test]
    fn fewer_kv_heads_than_ranks_are_repeated_as_qwen3_5_shard_repeats_them() {
        let tp = split(&ir("qwen3.5-4b-tp-tiny"), 2).unwrap();
        let repeated = Some(Split::RepeatedHeads { heads: 1, times: 2 });
        assert_eq!(split_of(&tp, "layers.3.self_attn.k_proj"), repeated);
        assert_eq!(split_of(&tp, "layers.3.self_attn.v_proj"), repeated);
        let l3 = &tp.layers[3];
        assert_eq!((l3.heads, l3.kv_heads, l3.kv_repeat), (2, 1, 2));
        // Other families' shard() does not repeat: the KV heads must divide.
        assert_refused(
            "qwen3-0.6b-tiny",
            4,
            "layer 0: the number of KV heads (2) is not divisible by the world size 4",
        );
    }

    #[test]
    fn a_world_size_the_linear_heads_do_not_divide_is_refused_naming_the_layer() {
        assert_eq!(
            refusal("qwen3.5-4b-tiny", 4),
            "qwen3.5-4b-tiny: layer 0: the number of linear-attention key heads (2) is not \
             divisible by the world size 4; run it on a world size that divides it"
        );
        assert_refused(
            "qwen3.6-35b-a3b-tiny",
            3,
            "layer 0: the number of linear-attention value heads (4) is not divisible by the world size 3",
        );
    }

    #[test]
    fn a_fused_projection_is_refused_naming_the_layer_and_module() {
        assert_refused(
            "phi-3-mini-4k-tiny",
            2,
            "layer 0: the fused `qkv_proj` is not split yet",
        );
    }

    #[test]
    fn routed_experts_with_shared_experts_are_refused_naming_the_layer() {
        // Layer 0 is dense (first_k_dense_replace 1); layer 1 is the first MoE layer.
        assert_refused(
            "glm-4.5-air-tiny",
            2,
            "layer 1: routed experts with shared experts",
        );
    }
}
