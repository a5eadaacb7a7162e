//! Single-token decode steps of generated models through compiled blocks.
//!
//! A decode step of a small model is bound by MLX's per-operation cost (graph
//! nodes built through the C API, each one scheduled on the stream), not by
//! arithmetic. Each layer's step is split around its cache update into two
//! shape-stable pieces, and each piece runs as an `mlx::compile`d function:
//!
//! * before attention: input norm, Q/K/V projections, their norms, transposes
//!   and RoPE ([`blocks::OwnQkv::project`] / [`blocks::project_q`]);
//! * after attention: `o_proj`, the mixer residual, the feed-forward half,
//!   the per-layer input gate and the layer scalar
//!   ([`blocks::attention_residual`], [`blocks::feed_forward`],
//!   [`blocks::finish_layer`]).
//!
//! Both are the blocks of every family, parameterised by the layer's facts
//! (norm arrangement, q/k/v norms, scale, activation, which optional weights
//! exist), which also key the compiled functions.
//!
//! The hybrid Qwen3.5 / Qwen3.6 layers have their own: a Gated DeltaNet
//! layer has no attention to split around, so its whole step is one block
//! ([`delta_net`]) whose conv and recurrent states are traced inputs and
//! outputs; the output-gated attention layer is split around its cache as
//! above ([`gated_attention`]).
//!
//! The compiled functions trace exactly those runtime blocks, so the layer
//! math still exists once. Compilation fuses chains of elementwise operations
//! (the RMSNorm and RoPE fallbacks on the CPU, residuals, scalars) into one
//! generated kernel each; a fused kernel evaluates the same per-element
//! operations, in the same order and in the same dtypes, as the separate
//! kernels. Two things would still change bits, and are kept out (see
//! [`reads_back`]): float32 scalar constants, which MLX writes into the
//! kernel source with 7 digits, and transcendental functions whose inputs
//! involve such constants (RoPE's cos/sin, computed once per step outside,
//! [`crate::rope::Rope::tables`]). Matmuls, reductions, the cache update and
//! attention stay separate operations. Checked byte for byte by
//! `tests/decode_blocks.rs` and the parity tests (generated == monolith ==
//! mlx-lm, which do not compile these blocks).
//!
//! That is the CPU path ([`Path::CpuFallbacks`]). On CUDA by default (on
//! Metal, never measured, opt-in with `ARCHGEN_GPU_DECODE=1`;
//! [`Path::NativeFastOps`]), the same blocks are compiled with MLX's fast
//! ops left as they are: `fast.rms_norm` and `fast.rope` are single
//! primitives with their own kernels there (eps, base and offset are kernel
//! arguments or inputs, not kernel source), and attention over the cache is
//! `fast.scaled_dot_product_attention` as in the eager blocks; what fuses is
//! the elementwise glue (residual adds, the layer scalar, the gates). The
//! float32 scalar constants stay out of the traces as on the CPU. The
//! fused kernels are compiled by NVRTC, whose default contracts a multiply
//! and an add into one FMA, so bit equality with the eager kernels is a
//! measurement, not a consequence. Measured on an H200 (docs/parity.md,
//! "On the GPU"): NVRTC does contract (`a * b + c` compiled differs from
//! eager in about a quarter of the elements), and mlx-lm's own compiled
//! `geglu` gives other bits when traced into a larger function. So the
//! blocks keep out what would fuse a product into a sum or re-fuse
//! `geglu`: a GeGLU layer compiles around its activation
//! ([`post_attention_split`]), and MiniCPM's scaled residuals, the
//! shared-expert MoE and Gemma-4's GeGLU experts run their ops uncompiled.
//! With that, every family measured there is byte-identical to the eager
//! blocks and to mlx-lm (`ARCHGEN_GPU_DECODE=0` runs the eager blocks).
//!
//! The weights are inputs of the compiled functions, not captured constants,
//! so all layers of one kind share one compiled function (one entry per
//! structure, kept per thread, as mlx-lm's own compiled helpers are).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use crate::attention::Mask;
use crate::blocks::{
    self, Activation, AttentionShape, AttentionWeights, BiasedExpertsMoe, GateUp, GroupRoutedMoe,
    KvWeights, LayerNorms, Mlp, MoeBlock, PleGate, QkNormWeight, Residual, Scores, SharedKv,
    SparseMoe, ValueNorm,
};
use crate::cache::LayerCache;
use crate::cuda_kernels;
use crate::deltanet::{self, ArraysCache, DeltaNetShape, GatedAttention, GatedDeltaNet, InProj};
use crate::device::{gpu_blocks, path, GpuBlocks, LeverOutcome, Path};
use crate::feed_forward::FeedForward;
use crate::flat::{hollow, next, placeholder, Flat, Packed};
use crate::layers::{Linear, QuantForm, Quantized, SwitchLinear};
use crate::ops::{rms_norm, NormInputs, Result};
use crate::rope::{apply_tables, Rope, RopeTables, YarnTables};

/// Whether one-token steps take this module's compiled blocks.
pub fn enabled() -> bool {
    // A tensor-parallel rank runs the eager blocks: these compiled ones
    // stack Q/K/V by the model's full head counts and do not trace the
    // all_sum of the sharded-to-all projections.
    path() != Path::Eager && !crate::distributed::tensor_parallel()
}

/// Whether the block with this id (the first entry of its key) is compiled
/// on this path: always on the CPU, as [`gpu_blocks`] says on a GPU.
fn compiles_on_this_path(block: i64) -> bool {
    let pre = matches!(block, PRE_ATTENTION | GATED_PRE_ATTENTION);
    match (path(), gpu_blocks()) {
        (Path::NativeFastOps, GpuBlocks::PreAttention) => pre,
        (Path::NativeFastOps, GpuBlocks::PostAttention) => !pre,
        (Path::NativeFastOps, GpuBlocks::None) => false,
        _ => true,
    }
}

/// The key ids of the blocks before attention: [`pre_attention`]'s, and
/// [`gated_attention`]'s first.
const PRE_ATTENTION: i64 = 1;
const GATED_PRE_ATTENTION: i64 = 5;

/// The parts of one attention decoder layer a decode step needs: the facts
/// of its IR `Layer` that shape the step (its feed-forward half, its
/// residual form, the optional per-layer input gate and layer scalar) as
/// typed values, so one composition ([`step`]) serves every combination.
pub struct Layer<'a> {
    pub norms: &'a LayerNorms,
    pub attn: &'a AttentionWeights,
    /// What follows the mixer (IR `FeedForward`): a dense MLP, with
    /// Gemma-4's routed experts beside it or not, or routed experts in its
    /// place. A shared-expert MoE runs only beside the hybrid mixers
    /// ([`gated_attention`], [`delta_net`]); [`step`] refuses it.
    pub ffn: &'a FeedForward,
    pub residual: Residual<'a>,
    pub ple: Option<(&'a PleGate, &'a Array)>,
    pub layer_scalar: Option<&'a Array>,
    pub shape: AttentionShape,
    pub eps: f32,
}

/// Where a layer's keys and values come from in a one-token step (IR
/// `KvSource`).
pub enum KvSource<'a> {
    /// The layer projects its own K/V (with its Q stacked into one matmul
    /// when `fused` is there: [`FusedQkv`]) and writes them into `cache`:
    /// one sequence's or a batch's ([`StepCache`]).
    Own {
        weights: &'a KvWeights,
        fused: Option<&'a FusedQkv>,
        cache: &'a mut dyn StepCache,
    },
    /// The layer reads the K/V a donor layer wrote this step.
    Shared(&'a SharedKv),
}

impl<'a> KvSource<'a> {
    pub fn own(
        weights: &'a KvWeights,
        fused: Option<&'a FusedQkv>,
        cache: &'a mut dyn StepCache,
    ) -> Self {
        KvSource::Own {
            weights,
            fused,
            cache,
        }
    }
}

/// One decode step (one token) of an attention layer; `rope` holds this
/// step's tables of the layer's RoPE form. `h` and the result are rows
/// [B, hidden] (one token each): 2-D matmuls are one node, 3-D ones
/// flatten + matmul + unflatten around the same kernel. A hybrid model,
/// whose other layers take [B, 1, hidden], passes that shape: it is made
/// rows here and the result given back in it (the same values). The rows
/// are one sequence's batch or B sequences of a batched cache, one token
/// each ([`StepCache`]): the same blocks either way.
///
/// The composition, in order: the compiled block before attention (input
/// norm, Q and, for [`KvSource::Own`], K and V with their norms and RoPE),
/// the cache update and attention (uncompiled), then the block after it
/// (`o_proj`, the mixer residual, the feed-forward half, the per-layer
/// input gate, the layer scalar: [`post_attention`]). Returns the layer's
/// output and the K/V it attended over: its own this step, or the donor's
/// it read, which the layers after it may share.
pub fn step(
    h: &Array,
    layer: &Layer<'_>,
    kv: KvSource<'_>,
    rope: &RopeTables,
    mask: &Mask,
) -> Result<(Array, SharedKv)> {
    // A hybrid model's [B, 1, hidden] as rows, the shape to give back.
    let (rows, given) = match *h.shape() {
        [b, 1, hidden] => (h.reshape(&[b, hidden])?, Some([b, 1, hidden])),
        _ => (h.clone(), None),
    };
    let h = &rows;
    // Refused before the cache is touched: a step that cannot finish must
    // not leave this token's K/V behind.
    let after = AfterAttention::of(layer)?;
    let (o, attended) = match kv {
        KvSource::Own {
            weights,
            fused,
            cache,
        } => {
            let own = OwnProjections { kv: weights, fused };
            attend_own_kv(h, layer, own, rope, cache, mask)?
        }
        KvSource::Shared(shared) => (
            attend_shared_kv(h, layer, rope, shared, mask)?,
            shared.clone(),
        ),
    };
    let out = post_attention(h, &o, layer, after)?;
    match given {
        Some(shape) => Ok((out.reshape(&shape)?, attended)),
        None => Ok((out, attended)),
    }
}

/// The attention half of a one-token step of a layer that computes its own
/// K/V, whatever follows it: the compiled block before attention, the cache
/// update and attention over the cache. Returns the attention output (before
/// `o_proj`) and the K/V for the layers that share them.
fn attend_own_kv(
    h: &Array,
    layer: &Layer<'_>,
    own: OwnProjections<'_>,
    rope: &RopeTables,
    cache: &mut dyn StepCache,
    mask: &Mask,
) -> Result<(Array, SharedKv)> {
    let offset = cache.rope_offset()?;
    // The stacked projection needs one dtype throughout (see FusedQkv).
    let input_dtype = layer.norms.input().dtype();
    let own = OwnProjections {
        fused: own.fused.filter(|f| f.usable(h.dtype(), input_dtype)),
        ..own
    };
    let qkv = pre_attention(h, layer, Some(own), rope)?;
    let [q, k, v] = <[Array; 3]>::try_from(qkv).map_err(|_| bad_outputs())?;
    let step = StepQkv {
        q,
        k,
        v,
        offset,
        shape: layer.shape,
        sinks: layer.attn.sinks.clone(),
    };
    cache.attend(step, mask)
}

/// One token's attention inputs as the block before attention leaves them:
/// the query [B, H, 1, D], this step's key and value [B, KV, 1, D], the
/// RoPE offset they were rotated from (carried to the layers sharing them)
/// and the layer's attention shape.
pub struct StepQkv {
    pub q: Array,
    pub k: Array,
    pub v: Array,
    pub offset: Array,
    pub shape: AttentionShape,
    /// The layer's sink logits (attention with sinks only).
    pub sinks: Option<Array>,
}

/// The K/V cache a one-token step of a K/V-owning layer writes: one
/// sequence's ([`LayerCache`]) or a batch's
/// ([`crate::batch::BatchLayerCache`], whose rows each have their own
/// offset). The compiled blocks before and after attention do not depend on
/// it; what does is the RoPE offset the step's K/V carry to the layers
/// sharing them, and the cache update and attention, which run uncompiled
/// as the eager layer runs them.
pub trait StepCache {
    /// The offset RoPE rotates this step from, as the eager layer passes
    /// it (`mx.array(cache.offset)`: an int32 scalar, or one per row).
    fn rope_offset(&self) -> Result<Array>;

    /// The cache updated with the step's K and V, its query attending over
    /// it: the heads merged back to rows [B, H * D] (the input of
    /// `o_proj`), and the K/V (with the step's offset) the layers sharing
    /// them read.
    fn attend(&mut self, step: StepQkv, mask: &Mask) -> Result<(Array, SharedKv)>;
}

impl StepCache for LayerCache {
    fn rope_offset(&self) -> Result<Array> {
        Ok(Array::from_int(self.offset()))
    }

    fn attend(&mut self, t: StepQkv, mask: &Mask) -> Result<(Array, SharedKv)> {
        let sinks = t.sinks.as_ref();
        blocks::attend_own_kv(&t.q, &t.k, &t.v, t.shape, self, mask, t.offset, true, sinks)
    }
}

/// [`attend_own_kv`] of a layer that reads a donor's K/V: the query only,
/// attending over the donor's keys and values.
fn attend_shared_kv(
    h: &Array,
    layer: &Layer<'_>,
    rope: &RopeTables,
    shared: &SharedKv,
    mask: &Mask,
) -> Result<Array> {
    let q = pre_attention(h, layer, None, rope)?;
    let q = q.into_iter().next().ok_or_else(bad_outputs)?;
    blocks::attend_shared_kv(
        &q,
        layer.shape,
        shared,
        mask,
        true,
        layer.attn.sinks.as_ref(),
    )
}

fn bad_outputs() -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom("compiled decode block: unexpected outputs")
}

/// Q, K and V projections of a layer that computes its own K/V as one
/// matmul, for one-token steps: the three weights stacked on the output axis
/// (when V is the keys' projection, V's rows are K's again), with the
/// norms in the form the path can run ([`StackedNorms`]). A matmul's output
/// column does not depend on the other columns, nor an RMSNorm's row on the
/// other rows, so on the CPU Q, K and V keep their bits (checked by
/// `tests/decode_blocks.rs` and the parity tests); 3 matmuls, 3 reshapes,
/// 3 norms, 3 transposes and 2 RoPEs become one of each (and 3 slices). On
/// the GPU path it is the lever `gpu-stacked-projections` (L3): 3 matmuls
/// become one, each part then normed and rotated as the separate ones are.
#[derive(Debug, Clone)]
pub struct FusedQkv {
    pub proj: Linear,
    pub norms: StackedNorms,
}

/// The q/k/v norms of a [`FusedQkv`], by path.
#[derive(Debug, Clone)]
pub enum StackedNorms {
    /// The CPU path: one per-head weight [H + 2 KV, head_dim] (q_norm,
    /// k_norm, and ones for V's scale-free norm, whose `* 1` changes no
    /// bit), so the three norms are one. Only for layers that norm all three
    /// (q/k RMSNorm per head and a scale-free V norm) in one dtype.
    OneWeight(Array),
    /// The GPU path: `fast.rms_norm` takes a weight of the last axis only,
    /// so each part keeps its own norm (any form), as the separate
    /// projections run it ([`blocks::Projected::heads`]).
    PerPart {
        q: Option<QkNormWeight>,
        k: Option<QkNormWeight>,
        /// Whether V has rows of its own in the stacked projection (a
        /// layer whose V is K's projection stacks Q and K only).
        own_values: bool,
    },
}

impl FusedQkv {
    /// Stacks the layer's projections and points `attn.q_proj`,
    /// `kv.k_proj` and `kv.v_proj` at row views of the stacked buffer, so
    /// the weights are not held twice (the eager path reads the same numbers
    /// from the views). `None` when a projection has a bias, when the
    /// projections' quantization or dtypes differ, on the CPU for layers
    /// whose norms cannot be one weight ([`StackedNorms::OneWeight`]), and
    /// on a GPU unless the lever is on ([`crate::device::stacked_projections`]):
    /// there a matmul's kernel (and so its reduction order) is chosen by the
    /// output width, so the stacked product is not known to keep Q, K and
    /// V's bits.
    pub fn new(attn: &mut AttentionWeights, kv: &mut KvWeights, s: AttentionShape) -> Option<Self> {
        // Sharded weights hold a rank's heads, not `s`'s; the decode path is
        // off under tensor parallelism anyway (`enabled`).
        let norms = match path() {
            Path::CpuFallbacks if !crate::distributed::tensor_parallel() => {
                StackedNorms::OneWeight(Self::one_norm_weight(attn, kv, s)?)
            }
            Path::NativeFastOps if crate::device::stacked_projections() => StackedNorms::PerPart {
                q: attn.q_norm.clone(),
                k: kv.k_norm.clone(),
                own_values: kv.v_proj.is_some(),
            },
            Path::CpuFallbacks | Path::NativeFastOps | Path::Eager => return None,
        };
        // The one per-head norm weight spans V's rows, so there V's rows are
        // K's again when V is K's projection.
        let parts = match (&norms, &kv.v_proj) {
            (_, Some(v)) => vec![&attn.q_proj, &kv.k_proj, v],
            (StackedNorms::OneWeight(_), None) => vec![&attn.q_proj, &kv.k_proj, &kv.k_proj],
            (StackedNorms::PerPart { .. }, None) => vec![&attn.q_proj, &kv.k_proj],
        };
        let (proj, views) = crate::layers::stack_rows(&parts)?;
        let mut views = views.into_iter();
        attn.q_proj = views.next()?;
        kv.k_proj = views.next()?;
        if kv.v_proj.is_some() {
            kv.v_proj = views.next();
        }
        if let StackedNorms::PerPart { .. } = norms {
            crate::device::count_outcome(LeverOutcome::StackedQueryKeyValue);
        }
        Some(FusedQkv { proj, norms })
    }

    /// The CPU path's one per-head norm weight ([`StackedNorms::OneWeight`]),
    /// `None` where the layer's norms are not that form.
    fn one_norm_weight(
        attn: &AttentionWeights,
        kv: &KvWeights,
        s: AttentionShape,
    ) -> Option<Array> {
        // Per-head norms only: a whole-projection norm's mean spans Q's (or
        // K's) heads, which the stacked per-head norm would not.
        let (
            Some(QkNormWeight::PerHead(q_norm)),
            Some(QkNormWeight::PerHead(k_norm)),
            ValueNorm::RmsScaleFree,
        ) = (&attn.q_norm, &kv.k_norm, s.value_norm)
        else {
            return None;
        };
        let dtype = q_norm.dtype();
        let value_dtype = |l: &Linear| {
            l.quant
                .as_ref()
                .map_or(l.weight.dtype(), |q| q.scales.dtype())
        };
        if value_dtype(&attn.q_proj) != dtype || k_norm.dtype() != dtype {
            return None;
        }
        let (h, kvh, d) = (s.n_heads, s.n_kv_heads, s.head_dim);
        let norm = mlx_rs::ops::concatenate(
            &[
                mlx_rs::ops::broadcast_to(q_norm, &[h, d]).ok()?,
                mlx_rs::ops::broadcast_to(k_norm, &[kvh, d]).ok()?,
                mlx_rs::ops::ones_dtype(&[kvh, d], dtype).ok()?,
            ],
            0,
        )
        .ok()?;
        norm.eval().ok()?;
        Some(norm)
    }

    /// Whether a step of this dtype can take it: the CPU path's one norm
    /// needs one dtype throughout (its norm inputs are found by dtype).
    fn usable(&self, h: mlx_rs::Dtype, input_norm: mlx_rs::Dtype) -> bool {
        match &self.norms {
            StackedNorms::OneWeight(norm) => norm.dtype() == h && input_norm == h,
            StackedNorms::PerPart { .. } => true,
        }
    }

    /// What [`blocks::OwnQkv::project`] returns, from the stacked projection.
    fn project(
        &self,
        x: &Array,
        s: AttentionShape,
        rope: &dyn Fn(&Array) -> Result<Array>,
    ) -> Result<(Array, Array, Array)> {
        let (h, kvh) = (s.n_heads, s.n_kv_heads);
        let b = x.shape()[0];
        let stacked = self.proj.forward(x)?;
        match &self.norms {
            StackedNorms::OneWeight(norm) => {
                let f = stacked.reshape(&[b, 1, h + 2 * kvh, s.head_dim])?;
                let y = rms_norm(&f, Some(norm), s.eps)?.transpose_axes(&[0, 2, 1, 3])?;
                let qk = rope(&y.try_index((.., ..h + kvh))?)?;
                Ok((
                    qk.try_index((.., ..h))?,
                    qk.try_index((.., h..))?,
                    y.try_index((.., h + kvh..))?,
                ))
            }
            StackedNorms::PerPart { q, k, own_values } => {
                let (q_width, kv_width) = s.projection_widths();
                let parts = match own_values {
                    true => stacked.split_at_indices(&[q_width, q_width + kv_width], -1)?,
                    false => stacked.split_at_indices(&[q_width], -1)?,
                };
                let mut parts = parts.into_iter();
                let projected = blocks::Projected {
                    q: parts.next().ok_or_else(bad_outputs)?,
                    k: parts.next().ok_or_else(bad_outputs)?,
                    v: parts.next(),
                };
                projected.heads((b, 1), q.as_ref(), k.as_ref(), s, rope)
            }
        }
    }
}

impl Flat for FusedQkv {
    fn put(&self, p: &mut Packed) {
        self.proj.put(p);
        match &self.norms {
            StackedNorms::OneWeight(norm) => p.put_variant(0, norm),
            StackedNorms::PerPart { q, k, own_values } => {
                p.key.extend([1, *own_values as i64]);
                q.put(p);
                k.put(p);
            }
        }
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let proj = self.proj.take(it);
        let norms = match &self.norms {
            StackedNorms::OneWeight(_) => StackedNorms::OneWeight(next(it)),
            StackedNorms::PerPart { q, k, own_values } => StackedNorms::PerPart {
                q: q.take(it),
                k: k.take(it),
                own_values: *own_values,
            },
        };
        FusedQkv { proj, norms }
    }
}

/// MLX's CPU compiler writes scalar constants into the kernel source with
/// 7 significant digits (`float tmp = 0.0002604167;`), which does not
/// round-trip every float32: 1/3840, RMSNorm's mean normalizer at
/// gemma4-12b's hidden size, reads back one ulp off. So the blocks must not
/// inline a float32 constant that could change:
///
/// * every RMSNorm inside a block runs as [`crate::ops::rms_norm_fallback`] with its eps
///   and normalizers as *inputs* of the compiled function ([`NormInputs`]);
///   a norm that finds none (a width or dtype combination not provided) is
///   detected by a dry run when the block is created, and the block then
///   runs eagerly;
/// * the MoE router's `hidden ** -0.5` is a weak scalar constant: MoE blocks
///   are compiled only if it reads back exactly;
/// * RoPE's transcendental part is outside ([`crate::rope::Rope::tables`]).
///
/// (gelu_approx's constants are inlined the same way in mlx-lm's own
/// compiled `geglu` and `gelu_approx`, which every implementation runs.)
fn reads_back(v: f32) -> bool {
    // `float tmp = <%.7g of v>;`: a double literal converted to float.
    format!("{:.6e}", v as f64).parse::<f64>().map(|d| d as f32) == Ok(v)
}

/// The projections of a layer that computes its own K/V: its K/V weights,
/// and its Q/K/V stacked into one matmul where they are ([`FusedQkv`]).
#[derive(Clone, Copy)]
struct OwnProjections<'a> {
    kv: &'a KvWeights,
    fused: Option<&'a FusedQkv>,
}

/// `rms_norm(h, input_norm)`, then Q, K, V (or Q alone, for a layer reading
/// a donor's K/V: `own` is `None`) as the eager path computes them, RoPE
/// from this step's tables.
fn pre_attention(
    h: &Array,
    layer: &Layer<'_>,
    own: Option<OwnProjections<'_>>,
    rope: &RopeTables,
) -> Result<Vec<Array>> {
    // A layer reading a donor's K/V projects Q alone: the compiled block.
    if let Some(own) = own {
        if let Some(qkv) = head_norm_rope_step(h, layer, own, rope)? {
            return Ok(qkv.into());
        }
    }
    let (kv, fused) = (own.map(|o| o.kv), own.and_then(|o| o.fused));
    let (s, eps) = (layer.shape, layer.eps);
    let (mut p, norm_inputs) =
        pre_attention_packed(PRE_ATTENTION, h, layer.norms.input(), s, eps, rope);
    // Either Q/K/V stacked, or Q (and K, V) as three projections.
    let kv = if fused.is_some() { None } else { kv };
    p.key.push(fused.is_some() as i64);
    match fused {
        Some(f) => f.put(&mut p),
        None => layer.attn.put(&mut p),
    }
    p.key.push(kv.is_some() as i64);
    if let Some(kv) = kv {
        kv.put(&mut p);
    }
    let templates = || {
        let attn = match fused {
            Some(_) => None,
            None => Some(hollow(layer.attn)),
        };
        (fused.map(hollow), attn, kv.map(hollow))
    };
    run_pre_attention(
        p,
        norm_inputs,
        rope,
        eps,
        templates,
        move |x, weights, rope| {
            Ok(match weights {
                (Some(f), _, _) => {
                    let (q, k, v) = f.project(x, s, rope)?;
                    vec![q, k, v]
                }
                (None, Some(attn), Some(kv)) => {
                    let own = blocks::OwnQkv::Separate {
                        attn: &attn,
                        kv: &kv,
                    };
                    let (q, k, v) = own.project(x, s, rope)?;
                    vec![q, k, v]
                }
                (None, Some(attn), None) => vec![blocks::project_q(x, &attn, s, rope)?],
                (None, None, _) => return Err(bad_outputs()),
            })
        },
    )
}

/// The lever `cuda-head-norm-rope` (L3,
/// [`crate::device::head_norm_rope_kernel`]): the input norm and the Q/K/V
/// projections as MLX runs them (stacked when `fused` is there), then one
/// custom kernel for the per-head norms and RoPE
/// ([`cuda_kernels::head_norm_rope`]) where the compiled block runs three
/// norms, two rotations and the layout copies around them. `None` when the
/// lever is off or the kernel does not cover the layer (per-head Q and K
/// norms are its form: Gemma-4, Qwen3): the compiled block runs.
fn head_norm_rope_step(
    h: &Array,
    layer: &Layer<'_>,
    own: OwnProjections<'_>,
    rope: &RopeTables,
) -> Result<Option<[Array; 3]>> {
    let OwnProjections { kv, fused } = own;
    if !crate::device::head_norm_rope_kernel() {
        return Ok(None);
    }
    let not_covered = || {
        crate::device::count_outcome(LeverOutcome::HeadKernelNotCovered);
        Ok(None)
    };
    let (Some(QkNormWeight::PerHead(q_norm)), Some(QkNormWeight::PerHead(k_norm))) =
        (&layer.attn.q_norm, &kv.k_norm)
    else {
        return not_covered();
    };
    let s = layer.shape;
    let x = rms_norm(h, Some(layer.norms.input()), layer.eps)?;
    let rows = match fused.map(|f| (f, &f.norms)) {
        Some((f, StackedNorms::PerPart { own_values, .. })) => cuda_kernels::QkvRows::Stacked {
            qkv: f.proj.forward(&x)?,
            own_values: *own_values,
        },
        Some((_, StackedNorms::OneWeight(_))) | None => cuda_kernels::QkvRows::Separate {
            q: layer.attn.q_proj.forward(&x)?,
            k: kv.k_proj.forward(&x)?,
            v: kv.v_proj.as_ref().map(|v| v.forward(&x)).transpose()?,
        },
    };
    let shape = cuda_kernels::HeadShape {
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        eps: s.eps,
        value_norm: match s.value_norm {
            ValueNorm::RmsScaleFree => true,
            ValueNorm::None => false,
        },
    };
    match cuda_kernels::head_norm_rope(&rows, q_norm, k_norm, shape, rope)? {
        Ok(qkv) => {
            crate::device::count_outcome(LeverOutcome::HeadKernelRan);
            Ok(Some(qkv))
        }
        Err(_) => not_covered(),
    }
}

/// The start every block before attention shares: the key (`block`, eps,
/// the hidden size, the rotated dims, the attention shape), the residual
/// stream `h`, the inputs of the norms over the hidden size and the head
/// dim ([`put_norm_inputs`]), this step's RoPE tables and the input norm's
/// weight; the block's projection weights follow.
fn pre_attention_packed(
    block: i64,
    h: &Array,
    input_norm: &Array,
    s: AttentionShape,
    eps: f32,
    rope: &RopeTables,
) -> (Packed, Option<NormInputs>) {
    let hidden = h.shape()[h.ndim() - 1];
    let mut p = Packed::new(block);
    p.key
        .extend([eps.to_bits() as i64, hidden as i64, rope.dims() as i64]);
    s.put(&mut p);
    h.put(&mut p);
    let native = matches!(rope, RopeTables::Native { .. });
    let norm_inputs = put_norm_inputs(&mut p, native, &[eps, s.eps], &[hidden, s.head_dim]);
    rope.put(&mut p);
    input_norm.put(&mut p);
    (p, norm_inputs)
}

/// Runs a block packed by [`pre_attention_packed`] and then the projection
/// weights (whose templates `templates` makes, once, when the block is
/// built): the input norm, then `project` of the normed rows with those
/// weights and this step's RoPE.
fn run_pre_attention<W: Flat + 'static>(
    p: Packed,
    norm_inputs: Option<NormInputs>,
    rope: &RopeTables,
    eps: f32,
    templates: impl FnOnce() -> W,
    project: impl Fn(&Array, W, &dyn Fn(&Array) -> Result<Array>) -> Result<Vec<Array>> + 'static,
) -> Result<Vec<Array>> {
    p.run(true, |covered| {
        // Templates for rebuilding the structures from the traced inputs.
        let (tables, weights) = (hollow(rope), templates());
        Box::new(move |inputs: &[Array]| -> Result<Vec<Array>> {
            let it = &mut inputs.iter();
            let h = next(it);
            let scope = norm_inputs.as_ref().map(|n| n.with_arrays(it));
            let tables = tables.take(it);
            let norm = next(it);
            let weights = weights.take(it);
            let rope = |t: &Array| apply_tables(t, &tables);
            let (out, all) = norm_scope(scope, || -> Result<Vec<Array>> {
                project(&rms_norm(&h, Some(&norm), eps)?, weights, &rope)
            });
            covered.set(all);
            out
        })
    })
}

/// `o_proj`, the attention residual, the feed-forward half, the PLE gate and
/// the layer scalar, with both residual branches scaled where the layer's
/// [`Residual`] says (the factor an input of the block).
fn post_attention(
    h: &Array,
    o: &Array,
    layer: &Layer<'_>,
    after: AfterAttention<'_>,
) -> Result<Array> {
    match post_attention_form(after) {
        PostAttentionForm::OneBlock => post_attention_block(h, o, layer, after, true),
        PostAttentionForm::SplitAtActivation(mlp) => post_attention_split(h, o, layer, mlp),
        PostAttentionForm::Eager => post_attention_block(h, o, layer, after, false),
    }
}

/// What the block after attention runs after `o_proj` and before the
/// layer's end: the forms of [`Layer::ffn`] and [`Layer::residual`] a
/// runtime block exists for.
#[derive(Debug, Clone, Copy)]
enum AfterAttention<'a> {
    /// The dense MLP, with Gemma-4's routed experts beside it or not, its
    /// residual branches plain or scaled (block [`POST_ATTENTION`]).
    Mlp {
        mlp: &'a Mlp,
        moe: &'a Option<MoeBlock>,
        residual: Residual<'a>,
    },
    /// Routed experts in place of the MLP, plain residuals (block
    /// [`POST_ATTENTION_EXPERTS`]).
    Experts(&'a SparseMoe),
    /// Routed experts behind the sigmoid group router with shared experts,
    /// plain residuals (block [`POST_ATTENTION_GROUP_EXPERTS`], never
    /// compiled: see [`post_attention_form`]).
    GroupExperts(&'a GroupRoutedMoe),
    /// Routed experts with biases and the clamped SwiGLU, plain residuals
    /// (block [`POST_ATTENTION_BIASED_EXPERTS`], never compiled: see
    /// [`post_attention_form`]).
    BiasedExperts(&'a BiasedExpertsMoe),
}

impl<'a> AfterAttention<'a> {
    fn of(layer: &Layer<'a>) -> Result<Self> {
        match (layer.ffn, layer.residual) {
            (FeedForward::Mlp { mlp, moe }, residual) => {
                Ok(AfterAttention::Mlp { mlp, moe, residual })
            }
            (FeedForward::SparseMoe(m), Residual::Plain) => Ok(AfterAttention::Experts(m)),
            (FeedForward::GroupRoutedMoe(m), Residual::Plain) => {
                Ok(AfterAttention::GroupExperts(m))
            }
            (FeedForward::BiasedExperts(m), Residual::Plain) => {
                Ok(AfterAttention::BiasedExperts(m))
            }
            (
                FeedForward::SparseMoe(_)
                | FeedForward::GroupRoutedMoe(_)
                | FeedForward::BiasedExperts(_),
                Residual::Scaled(_) | Residual::ClippedInFloat16,
            ) => Err(Exception::custom(
                "decode::step: routed experts with scaled or clipped residuals: no runtime block \
                 runs them (the emitter refuses such a layer kind)",
            )),
            (FeedForward::SharedExpertMoe(_), _) => Err(Exception::custom(
                "decode::step: a shared-expert MoE after plain attention has no decode block; it \
                 runs beside a gated attention or a Gated DeltaNet (decode::gated_attention, \
                 decode::delta_net)",
            )),
        }
    }

    /// How the branches join the residual stream.
    fn residual(self) -> Residual<'a> {
        match self {
            AfterAttention::Mlp { residual, .. } => residual,
            AfterAttention::Experts(_)
            | AfterAttention::GroupExperts(_)
            | AfterAttention::BiasedExperts(_) => Residual::Plain,
        }
    }
}

/// The key ids of the blocks after attention ([`AfterAttention`]).
const POST_ATTENTION: i64 = 2;
const POST_ATTENTION_EXPERTS: i64 = 3;
const POST_ATTENTION_GROUP_EXPERTS: i64 = 9;
const POST_ATTENTION_BIASED_EXPERTS: i64 = 10;

/// How the ops after attention run on this path.
#[derive(Debug, Clone, Copy)]
enum PostAttentionForm<'a> {
    /// One compiled block.
    OneBlock,
    /// Two compiled blocks with the activation of this MLP between them,
    /// called as the eager blocks call it ([`post_attention_split`]).
    SplitAtActivation(&'a Mlp),
    /// The same ops, not compiled.
    Eager,
}

/// mlx-lm's compiled `geglu` is a shapeless compiled function of its own; on
/// CUDA its kernel gives other bits than the same ops fused into a larger
/// compiled function (an H200 measured 112 of 15,360 elements: glue probe,
/// docs/parity.md "On the GPU"), and a nested compiled call is traced into
/// its caller. So on a GPU a layer with a GeGLU MLP compiles around the
/// activation, not through it; its routed experts (Gemma-4's, GeGLU too,
/// inside `gather` matmuls) keep the layer eager there. The CPU compiles no
/// such kernel (no contraction) and keeps one block.
fn post_attention_form(after: AfterAttention<'_>) -> PostAttentionForm<'_> {
    let on_gpu = match after {
        // MiniCPM's depth-scaled residuals, `h + branch * scale`: fused, the
        // multiply and the add become one FMA (on an H200 minicpm-2b-tiny,
        // -tiny-q4 and -l2 left the eager blocks' decode bits).
        AfterAttention::Mlp {
            residual: Residual::Scaled(_),
            ..
        } => PostAttentionForm::Eager,
        // gemma3_text's float16 `clip_residual` has not run on a GPU: its
        // layers stay eager there until the GPU table passes them
        // (docs/parity.md, "On the GPU").
        AfterAttention::Mlp {
            residual: Residual::ClippedInFloat16,
            ..
        } => PostAttentionForm::Eager,
        AfterAttention::Mlp {
            mlp,
            moe,
            residual: Residual::Plain,
        } => match (mlp.activation, moe) {
            (Activation::GeluApprox, None) => PostAttentionForm::SplitAtActivation(mlp),
            (Activation::GeluApprox, Some(_)) => PostAttentionForm::Eager,
            // Its own compiled trace with alpha and limit baked in, as the
            // experts' form ([`AfterAttention::BiasedExperts`]).
            (Activation::ClampedSwiglu, _) => PostAttentionForm::Eager,
            (Activation::GeluApproxThenMultiply | Activation::Silu, _) => {
                PostAttentionForm::OneBlock
            }
        },
        // The router's softmax, top-k and renormalization carry no float
        // constant.
        AfterAttention::Experts(_) => PostAttentionForm::OneBlock,
        AfterAttention::GroupExperts(_) | AfterAttention::BiasedExperts(_) => {
            PostAttentionForm::Eager
        }
    };
    match (path(), after) {
        // glm4_moe's router is its own `mx.compile` trace with the routed
        // scaling factor baked in as a constant, called between eager ops;
        // inside a larger block its ops would fuse with their neighbours,
        // so the layer's ops after attention stay eager on every path.
        (_, AfterAttention::GroupExperts(_)) => PostAttentionForm::Eager,
        // gpt_oss's `swiglu_oai` is likewise its own compiled trace (alpha
        // and limit baked in) between the experts' gathered matmuls.
        (_, AfterAttention::BiasedExperts(_)) => PostAttentionForm::Eager,
        (Path::NativeFastOps, _) => on_gpu,
        (Path::CpuFallbacks | Path::Eager, _) => PostAttentionForm::OneBlock,
    }
}

/// [`post_attention`] around the activation: one compiled block for
/// `o_proj`, the attention residual, the MLP's norm and its gate and up
/// projections; the activation as the eager blocks call it (mlx-lm's own
/// compiled helper); one compiled block for `down_proj`, the feed-forward
/// residual, the PLE gate and the layer scalar.
fn post_attention_split(h: &Array, o: &Array, layer: &Layer<'_>, mlp: &Mlp) -> Result<Array> {
    let hidden = h.shape()[h.ndim() - 1];
    let eps = layer.eps;
    let mut p = Packed::new(BEFORE_ACTIVATION);
    p.key.extend([eps.to_bits() as i64, hidden as i64]);
    h.put(&mut p);
    o.put(&mut p);
    layer.attn.o_proj.put(&mut p);
    layer.norms.put(&mut p);
    mlp.put(&mut p);
    let before = p.run(true, |covered| {
        let (o_proj, norms, mlp) = (hollow(&layer.attn.o_proj), hollow(layer.norms), hollow(mlp));
        Box::new(move |inputs: &[Array]| -> Result<Vec<Array>> {
            let it = &mut inputs.iter();
            let (h, o) = (next(it), next(it));
            let (o_proj, norms, mlp) = (o_proj.take(it), norms.take(it), mlp.take(it));
            let a = o_proj.forward(&o)?;
            let h = blocks::attention_residual(&h, &a, &norms, eps, Residual::Plain)?;
            let (gate, up) = mlp.gate_and_up(&blocks::mlp_input(&h, &norms, eps)?)?;
            covered.set(true);
            Ok(vec![h, gate, up])
        })
    })?;
    let [h, gate, up] = <[Array; 3]>::try_from(before).map_err(|_| bad_outputs())?;
    let act = mlp.activate(&gate, &up)?;
    let mut p = Packed::new(AFTER_ACTIVATION);
    p.key.extend([eps.to_bits() as i64, hidden as i64]);
    h.put(&mut p);
    act.put(&mut p);
    mlp.put(&mut p);
    layer.norms.put(&mut p);
    put_layer_end(&mut p, layer.ple, layer.layer_scalar);
    let after = p.run(true, |covered| {
        let (mlp, norms) = (hollow(mlp), hollow(layer.norms));
        let ple = layer.ple.map(|(g, x)| (hollow(g), hollow(x)));
        let scalar = layer.layer_scalar.map(hollow);
        Box::new(move |inputs: &[Array]| -> Result<Vec<Array>> {
            let it = &mut inputs.iter();
            let (h, act) = (next(it), next(it));
            let (mlp, norms) = (mlp.take(it), norms.take(it));
            let (ple, scalar) = (ple.take(it), scalar.take(it));
            let h = blocks::mlp_residual(&h, &mlp.down(&act)?, &norms, eps, Residual::Plain)?;
            covered.set(true);
            let b = h.shape()[0];
            Ok(vec![finish_layer_rows(&h, b, &ple, scalar.as_ref(), eps)?])
        })
    })?;
    after.into_iter().next().ok_or_else(bad_outputs)
}

/// Packs what [`finish_layer_rows`] reads: the PLE gate and its input, and
/// the layer scalar.
fn put_layer_end(p: &mut Packed, ple: Option<(&PleGate, &Array)>, scalar: Option<&Array>) {
    p.key.push(ple.is_some() as i64);
    if let Some((gate, input)) = ple {
        gate.put(p);
        input.put(p);
    }
    scalar.cloned().put(p);
}

/// [`blocks::finish_layer`] inside a block, with the PLE input (packed as the
/// model holds it) as rows `[b, width]`.
fn finish_layer_rows(
    h: &Array,
    b: i32,
    ple: &Option<(PleGate, Array)>,
    scalar: Option<&Array>,
    eps: f32,
) -> Result<Array> {
    let ple = match ple {
        Some((g, x)) => Some((g, x.reshape(&[b, -1])?)),
        None => None,
    };
    blocks::finish_layer(h, ple.as_ref().map(|(g, x)| (*g, x)), scalar, eps)
}

/// The key ids of [`post_attention_split`]'s two blocks.
const BEFORE_ACTIVATION: i64 = 7;
const AFTER_ACTIVATION: i64 = 8;

/// Packs the inputs of a block's norms ([`NormInputs`] of `eps` and
/// `widths`) unless the block runs MLX's fast ops as they are (`native`:
/// the GPU path, whose `fast.rms_norm` takes eps as a kernel argument), and
/// returns them as the template the traced function reads them through.
fn put_norm_inputs(
    p: &mut Packed,
    native: bool,
    eps: &[f32],
    widths: &[i32],
) -> Option<NormInputs> {
    let norms = (!native).then(|| NormInputs::new(eps, widths));
    if let Some(n) = &norms {
        p.arrays.extend(n.arrays().cloned());
    }
    norms
}

/// The start all blocks after attention share: the key (`block`, eps, the
/// hidden size, whether the fast ops stay native), the residual stream `h`
/// and the inputs of the norms over the hidden size ([`put_norm_inputs`]).
fn post_attention_packed(block: i64, h: &Array, eps: f32) -> (Packed, Option<NormInputs>) {
    let hidden = h.shape()[h.ndim() - 1];
    let native = path() == Path::NativeFastOps;
    let mut p = Packed::new(block);
    p.key
        .extend([eps.to_bits() as i64, hidden as i64, native as i64]);
    h.put(&mut p);
    let norms = put_norm_inputs(&mut p, native, &[eps], &[hidden]);
    (p, norms)
}

/// The shape the residual stream takes inside the block after attention.
#[derive(Debug, Clone, Copy)]
enum StreamShape {
    /// Rows [B, hidden], as the step carries them.
    Rows,
    /// [B, 1, hidden]: routed experts' gathers keep mlx-lm's shapes.
    Tokens,
}

/// A [`Residual`] without its factor: what a compiled block's key holds and
/// its trace rebuilds the form from, the factor one of its inputs.
#[derive(Debug, Clone, Copy)]
enum ResidualForm {
    Plain,
    Scaled,
    ClippedInFloat16,
}

impl ResidualForm {
    fn of(residual: Residual<'_>) -> Self {
        match residual {
            Residual::Plain => ResidualForm::Plain,
            Residual::Scaled(_) => ResidualForm::Scaled,
            Residual::ClippedInFloat16 => ResidualForm::ClippedInFloat16,
        }
    }

    /// The form again, with the traced factor of a scaled one.
    fn with(self, factor: Option<&Array>) -> Result<Residual<'_>> {
        match (self, factor) {
            (ResidualForm::Plain, None) => Ok(Residual::Plain),
            (ResidualForm::Scaled, Some(f)) => Ok(Residual::Scaled(f)),
            (ResidualForm::ClippedInFloat16, None) => Ok(Residual::ClippedInFloat16),
            (ResidualForm::Scaled, None)
            | (ResidualForm::Plain | ResidualForm::ClippedInFloat16, Some(_)) => Err(
                Exception::custom("compiled decode block: a residual factor unlike its form"),
            ),
        }
    }
}

/// [`post_attention`] as one block, compiled when `compile`, the norms
/// found their inputs and, with Gemma-4's experts beside the MLP, the
/// router's inlined `hidden ** -0.5` reads back ([`reads_back`]).
fn post_attention_block(
    h: &Array,
    o: &Array,
    layer: &Layer<'_>,
    after: AfterAttention<'_>,
    compile: bool,
) -> Result<Array> {
    let hidden = h.shape()[h.ndim() - 1];
    let block = match after {
        AfterAttention::Mlp { .. } => POST_ATTENTION,
        AfterAttention::Experts(_) => POST_ATTENTION_EXPERTS,
        AfterAttention::GroupExperts(_) => POST_ATTENTION_GROUP_EXPERTS,
        AfterAttention::BiasedExperts(_) => POST_ATTENTION_BIASED_EXPERTS,
    };
    let (mut p, norm_inputs) = post_attention_packed(block, h, layer.eps);
    o.put(&mut p);
    layer.attn.o_proj.put(&mut p);
    layer.norms.put(&mut p);
    // The feed-forward's arrays in `FeedForward::take`'s order; the dense
    // block's key also says whether experts sit beside the MLP and whether
    // the branches are scaled (the experts' block has neither).
    let (stream, compile) = match after {
        AfterAttention::Mlp { mlp, moe, residual } => {
            mlp.put(&mut p);
            moe.put(&mut p);
            put_layer_end(&mut p, layer.ple, layer.layer_scalar);
            p.key.push(ResidualForm::of(residual) as i64);
            residual.factor().cloned().put(&mut p);
            match moe {
                None => (StreamShape::Rows, compile),
                Some(m) => (
                    StreamShape::Tokens,
                    compile && reads_back((m.router.hidden as f64).powf(-0.5) as f32),
                ),
            }
        }
        AfterAttention::Experts(m) => {
            m.put(&mut p);
            put_layer_end(&mut p, layer.ple, layer.layer_scalar);
            (StreamShape::Tokens, compile)
        }
        AfterAttention::GroupExperts(m) => {
            m.put(&mut p);
            put_layer_end(&mut p, layer.ple, layer.layer_scalar);
            (StreamShape::Tokens, false)
        }
        AfterAttention::BiasedExperts(m) => {
            m.put(&mut p);
            put_layer_end(&mut p, layer.ple, layer.layer_scalar);
            (StreamShape::Tokens, false)
        }
    };
    let eps = layer.eps;
    let out = p.run(compile, |covered| {
        // Templates for rebuilding the structures from the traced inputs.
        let (o_proj, norms, ffn) = (
            hollow(&layer.attn.o_proj),
            hollow(layer.norms),
            hollow(layer.ffn),
        );
        let ple = layer.ple.map(|(g, x)| (hollow(g), hollow(x)));
        let scalar = layer.layer_scalar.map(hollow);
        let form = ResidualForm::of(after.residual());
        let factor = after.residual().factor().map(hollow);
        Box::new(move |inputs: &[Array]| -> Result<Vec<Array>> {
            let it = &mut inputs.iter();
            let h = next(it);
            let scope = norm_inputs.as_ref().map(|n| n.with_arrays(it));
            let o = next(it);
            let (o_proj, norms, ffn) = (o_proj.take(it), norms.take(it), ffn.take(it));
            let (ple, scalar, factor) = (ple.take(it), scalar.take(it), factor.take(it));
            let (out, all) = norm_scope(scope, || -> Result<Vec<Array>> {
                let b = h.shape()[0];
                let (h, o) = match stream {
                    StreamShape::Rows => (h, o),
                    StreamShape::Tokens => (h.reshape(&[b, 1, hidden])?, o.reshape(&[b, 1, -1])?),
                };
                let a = o_proj.forward(&o)?;
                let h = ffn.after_mixer(&h, &a, &norms, form.with(factor.as_ref())?, eps)?;
                let h = finish_layer_rows(&h, b, &ple, scalar.as_ref(), eps)?;
                Ok(vec![match stream {
                    StreamShape::Rows => h,
                    StreamShape::Tokens => h.reshape(&[b, hidden])?,
                }])
            });
            covered.set(all);
            out
        })
    })?;
    out.into_iter().next().ok_or_else(bad_outputs)
}

/// Whether a hybrid layer's block that holds its feed-forward half is
/// compiled on this path. On a GPU the shared-expert MoE stays eager: its
/// `sigmoid(gate) * shared + routed`, fused, turns the multiply and the add
/// into one FMA (on an H200 qwen3.6-35b-a3b-tiny left the eager blocks'
/// decode bits while the dense qwen3.5 layers kept them). Routed experts
/// beside the MLP (Gemma-4's form, in no hybrid family) compile as
/// [`post_attention_block`] compiles them: only where the router's inlined
/// `hidden ** -0.5` reads back, and not on a GPU, where no hybrid layer
/// with them has been measured.
fn hybrid_feed_forward_compiles(ffn: &FeedForward) -> bool {
    match (path(), ffn) {
        // glm4_moe's router is its own compiled trace between eager ops
        // ([`post_attention_form`]).
        (_, FeedForward::GroupRoutedMoe(_) | FeedForward::BiasedExperts(_)) => false,
        (
            Path::NativeFastOps,
            FeedForward::SharedExpertMoe(_) | FeedForward::Mlp { moe: Some(_), .. },
        ) => false,
        (_, FeedForward::Mlp { moe: Some(m), .. }) => {
            reads_back((m.router.hidden as f64).powf(-0.5) as f32)
        }
        // The routers' precise softmax and top-k carry no float constant.
        (
            _,
            FeedForward::Mlp { moe: None, .. }
            | FeedForward::SparseMoe(_)
            | FeedForward::SharedExpertMoe(_),
        ) => true,
    }
}

/// The parts of a Gated DeltaNet layer a decode step needs.
pub struct DeltaNetLayer<'a> {
    pub norms: &'a LayerNorms,
    pub mixer: &'a GatedDeltaNet,
    pub ffn: &'a FeedForward,
    pub eps: f32,
}

/// What a Gated DeltaNet layer computes (the generated kind's eager
/// forward): input norm, [`deltanet::gated_delta_net_with`], the residual,
/// the feed-forward half.
#[allow(clippy::too_many_arguments)]
fn delta_net_layer(
    h: &Array,
    input_norm: &Array,
    norms: &LayerNorms,
    mixer: &GatedDeltaNet,
    ffn: &FeedForward,
    eps: f32,
    cache: &mut ArraysCache,
    qk_scales: Option<(&Array, &Array)>,
) -> Result<Array> {
    let x = rms_norm(h, Some(input_norm), eps)?;
    let a = deltanet::gated_delta_net_with(&x, mixer, cache, qk_scales)?;
    hybrid_residual_and_feed_forward(h, &a, norms, ffn, eps)
}

/// The mixer residual and the feed-forward half of a hybrid layer (the
/// generated kinds' eager forward after the mixer).
fn hybrid_residual_and_feed_forward(
    h: &Array,
    a: &Array,
    norms: &LayerNorms,
    ffn: &FeedForward,
    eps: f32,
) -> Result<Array> {
    // Hybrid kinds have no scaled residuals, per-layer input gate or layer
    // scalar (the emitter refuses them beside these mixers).
    let h = ffn.after_mixer(h, a, norms, Residual::Plain, eps)?;
    blocks::finish_layer(&h, None, None, eps)
}

/// The parts of a gated full-attention layer (`Qwen3NextAttention`) a
/// decode step needs.
pub struct GatedAttentionLayer<'a> {
    pub norms: &'a LayerNorms,
    pub attn: &'a GatedAttention,
    pub ffn: &'a FeedForward,
    pub shape: AttentionShape,
    pub eps: f32,
}

/// One decode step (one token, `h` [B, 1, hidden]) of a gated
/// full-attention layer, split as [`step`] splits a layer: a compiled
/// block before the cache (input norm, Q with its gate, K, V, q/k norms,
/// RoPE from this step's `rope` tables: [`deltanet::gated_attention_qkv`]),
/// the eager cache update and attention (as the eager layer runs them),
/// and a compiled block after (`o_proj(o * sigmoid(gate))`, the residual,
/// the feed-forward half). The rows are one sequence's batch or B
/// sequences of a batched cache, one token each ([`StepCache`]).
pub fn gated_attention(
    h: &Array,
    layer: &GatedAttentionLayer<'_>,
    rope: &RopeTables,
    cache: &mut dyn StepCache,
    mask: &Mask,
) -> Result<Array> {
    let offset = cache.rope_offset()?;
    let (s, eps) = (layer.shape, layer.eps);
    let (mut p, norm_inputs) =
        pre_attention_packed(GATED_PRE_ATTENTION, h, layer.norms.input(), s, eps, rope);
    layer.attn.put(&mut p);
    let templates = || hollow(layer.attn);
    let qkv = run_pre_attention(
        p,
        norm_inputs,
        rope,
        eps,
        templates,
        move |x, attn, rope| Ok(deltanet::gated_attention_qkv(x, &attn, s, rope)?.to_vec()),
    )?;
    let [q, k, v, gate] = <[Array; 4]>::try_from(qkv).map_err(|_| bad_outputs())?;
    let step = StepQkv {
        q,
        k,
        v,
        offset,
        shape: s,
        sinks: None,
    };
    // `attend` merges the heads into rows [B, H * D]; the gate and the block
    // after read [B, 1, H * D], the eager layer's shape (the same values).
    let (o, _) = cache.attend(step, mask)?;
    let o = o.reshape(&[h.shape()[0], 1, -1])?;

    let (mut p, norm_inputs) = post_attention_packed(6, h, eps);
    o.put(&mut p);
    gate.put(&mut p);
    layer.attn.o_proj.put(&mut p);
    layer.norms.put(&mut p);
    layer.ffn.put(&mut p);
    let out = p.run(hybrid_feed_forward_compiles(layer.ffn), |covered| {
        let (o_proj, norms) = (hollow(&layer.attn.o_proj), hollow(layer.norms));
        let ffn = hollow(layer.ffn);
        Box::new(move |inputs: &[Array]| -> Result<Vec<Array>> {
            let it = &mut inputs.iter();
            let h = next(it);
            let scope = norm_inputs.as_ref().map(|n| n.with_arrays(it));
            let (o, gate) = (next(it), next(it));
            let (o_proj, norms, ffn) = (o_proj.take(it), norms.take(it), ffn.take(it));
            let (out, all) = norm_scope(scope, || -> Result<Vec<Array>> {
                let a = deltanet::gated_attention_output(&o, &gate, &o_proj)?;
                Ok(vec![hybrid_residual_and_feed_forward(
                    &h, &a, &norms, &ffn, eps,
                )?])
            });
            covered.set(all);
            out
        })
    })?;
    out.into_iter().next().ok_or_else(bad_outputs)
}

/// One decode step (one token, `h` [B, 1, hidden]) of a Gated DeltaNet
/// layer as one compiled block: the whole layer, with the conv state and
/// the recurrent state as traced inputs and their successors as outputs
/// (written back into `cache`). The float constants enter as inputs: the
/// norms' eps and normalizers ([`NormInputs`], including `normalize_qk`'s
/// scaled eps over `head_k_dim`) and `normalize_qk`'s two scales
/// ([`deltanet::normalize_qk_with`]). mlx-lm's compiled helpers
/// (`silu`, `compute_g`, `_gated_delta_step_ops`, `precise_swiglu`) are
/// traced inside it; that this keeps the eager layer's bits is checked by
/// `tests/decode_blocks.rs`, not assumed. Before the first forward (empty
/// cache) the step runs the eager layer.
pub fn delta_net(h: &Array, layer: &DeltaNetLayer<'_>, cache: &mut ArraysCache) -> Result<Array> {
    let (Some(conv), Some(state)) = (cache.conv.clone(), cache.state.clone()) else {
        return delta_net_layer(
            h,
            layer.norms.input(),
            layer.norms,
            layer.mixer,
            layer.ffn,
            layer.eps,
            cache,
            None,
        );
    };
    let hidden = h.shape()[h.ndim() - 1];
    let s = layer.mixer.shape;
    let norm_eps = [layer.eps, deltanet::qk_norm_eps(s.head_k_dim), s.eps];
    let widths = [hidden, s.head_k_dim, s.head_v_dim];
    let (q_scale, k_scale) = deltanet::qk_scales(s.head_k_dim);
    let mut p = Packed::new(4);
    p.key.extend([layer.eps.to_bits() as i64, hidden as i64]);
    h.put(&mut p);
    p.arrays
        .extend(NormInputs::new(&norm_eps, &widths).arrays().cloned());
    p.arrays.push(crate::ops::f32_constant(q_scale as f32));
    p.arrays.push(crate::ops::f32_constant(k_scale as f32));
    conv.put(&mut p);
    state.put(&mut p);
    layer.norms.input().put(&mut p);
    layer.norms.put(&mut p);
    layer.mixer.put(&mut p);
    layer.ffn.put(&mut p);
    let eps = layer.eps;
    let out = p.run(hybrid_feed_forward_compiles(layer.ffn), |covered| {
        // Templates for rebuilding the structures from the traced inputs.
        let (norms, mixer) = (hollow(layer.norms), hollow(layer.mixer));
        let ffn = hollow(layer.ffn);
        let norm_inputs = NormInputs::new(&norm_eps, &widths);
        Box::new(move |inputs: &[Array]| -> Result<Vec<Array>> {
            let it = &mut inputs.iter();
            let h = next(it);
            let scope = norm_inputs.with_arrays(it);
            let (q_scale, k_scale) = (next(it), next(it));
            let (conv, state) = (next(it), next(it));
            let input_norm = next(it);
            let (norms, mixer, ffn) = (norms.take(it), mixer.take(it), ffn.take(it));
            let (out, all) = norm_scope(Some(scope), || -> Result<Vec<Array>> {
                let mut cache = ArraysCache {
                    conv: Some(conv),
                    state: Some(state),
                };
                let h = delta_net_layer(
                    &h,
                    &input_norm,
                    &norms,
                    &mixer,
                    &ffn,
                    eps,
                    &mut cache,
                    Some((&q_scale, &k_scale)),
                )?;
                match (cache.conv, cache.state) {
                    (Some(conv), Some(state)) => Ok(vec![h, conv, state]),
                    _ => Err(bad_outputs()),
                }
            });
            covered.set(all);
            out
        })
    })?;
    let [h, conv, state] = <[Array; 3]>::try_from(out).map_err(|_| bad_outputs())?;
    cache.conv = Some(conv);
    cache.state = Some(state);
    Ok(h)
}

impl Flat for FeedForward {
    fn put(&self, p: &mut Packed) {
        match self {
            FeedForward::Mlp { mlp, moe } => {
                p.put_variant(0, mlp);
                moe.put(p);
            }
            FeedForward::SharedExpertMoe(m) => p.put_variant(1, m),
            FeedForward::SparseMoe(m) => p.put_variant(2, m),
            FeedForward::GroupRoutedMoe(m) => p.put_variant(3, m),
            FeedForward::BiasedExperts(m) => p.put_variant(4, m),
        }
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        match self {
            FeedForward::Mlp { mlp, moe } => {
                let mlp = mlp.take(it);
                FeedForward::Mlp {
                    mlp,
                    moe: moe.take(it),
                }
            }
            FeedForward::SharedExpertMoe(m) => FeedForward::SharedExpertMoe(m.take(it)),
            FeedForward::SparseMoe(m) => FeedForward::SparseMoe(m.take(it)),
            FeedForward::GroupRoutedMoe(m) => FeedForward::GroupRoutedMoe(m.take(it)),
            FeedForward::BiasedExperts(m) => FeedForward::BiasedExperts(m.take(it)),
        }
    }
}

impl Flat for DeltaNetShape {
    fn put(&self, p: &mut Packed) {
        p.key.extend([
            self.hidden as i64,
            self.num_k_heads as i64,
            self.num_v_heads as i64,
            self.head_k_dim as i64,
            self.head_v_dim as i64,
            self.conv_kernel as i64,
            self.eps.to_bits() as i64,
        ]);
    }
    fn take(&self, _: &mut std::slice::Iter<'_, Array>) -> Self {
        *self
    }
}

impl Flat for GatedDeltaNet {
    fn put(&self, p: &mut Packed) {
        self.shape.put(p);
        match &self.in_proj {
            InProj::Split { qkv, z, b, a } => {
                p.key.push(0);
                for l in [qkv, z, b, a] {
                    l.put(p);
                }
            }
            InProj::Fused { qkvz, ba } => {
                p.key.push(1);
                qkvz.put(p);
                ba.put(p);
            }
        }
        for a in [&self.conv1d, &self.dt_bias, &self.a_log, &self.norm] {
            a.put(p);
        }
        self.out_proj.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let in_proj = match &self.in_proj {
            InProj::Split { qkv, z, b, a } => {
                let qkv = qkv.take(it);
                let z = z.take(it);
                let b = b.take(it);
                InProj::Split {
                    qkv,
                    z,
                    b,
                    a: a.take(it),
                }
            }
            InProj::Fused { qkvz, ba } => {
                let qkvz = qkvz.take(it);
                InProj::Fused {
                    qkvz,
                    ba: ba.take(it),
                }
            }
        };
        let (conv1d, dt_bias, a_log, norm) = (next(it), next(it), next(it), next(it));
        GatedDeltaNet {
            in_proj,
            conv1d,
            dt_bias,
            a_log,
            norm,
            out_proj: self.out_proj.take(it),
            shape: self.shape,
        }
    }
}

/// Runs a block's body with its norms' inputs: on the CPU path
/// (`Some`), every `rms_norm` inside runs as the fallback with the traced
/// eps and normalizers ([`NormInputs::scope`]), and the flag says whether
/// each found them; on the GPU path (`None`) the norms are MLX's
/// `fast.rms_norm`, whose eps is a kernel argument, not kernel source.
fn norm_scope<T>(
    scope: Option<Option<NormInputs>>,
    f: impl FnOnce() -> Result<T>,
) -> (Result<T>, bool) {
    match scope {
        None => (f(), true),
        Some(Some(norms)) => norms.scope(f),
        Some(None) => (Err(bad_outputs()), false),
    }
}

type Block = Box<dyn FnMut(&[Array]) -> Result<Vec<Array>>>;

thread_local! {
    /// Compiled blocks by structure key (which block, constants, which
    /// optional weights exist, quantization): one per layer kind.
    static BLOCKS: RefCell<HashMap<Vec<i64>, (Block, bool)>> = RefCell::new(HashMap::new());
    /// Calls of compiled blocks on this thread ([`compiled_block_calls`]).
    static COMPILED_CALLS: Cell<u64> = const { Cell::new(0) };
}

/// How many times this thread has called a compiled decode block: tests
/// read it to check that a forward took the compiled blocks, not only
/// that its bits are right.
pub fn compiled_block_calls() -> u64 {
    COMPILED_CALLS.with(Cell::get)
}

/// This thread's decode blocks so far: (compiled, running eagerly).
pub fn block_counts() -> (usize, usize) {
    BLOCKS.with(|cell| {
        let blocks = cell.borrow();
        let compiled = blocks.values().filter(|(_, c)| *c).count();
        (compiled, blocks.len() - compiled)
    })
}

impl Packed {
    /// Calls the compiled block of this key, building it on first use.
    /// Single-token shapes are fixed per layer kind, so MLX traces each block
    /// once per kind (and once more per new cache length only where a traced
    /// shape depends on it, which none here does).
    /// When the key is new, `make` builds the block's function; it sets the
    /// flag it is given to whether every norm found its inputs. An eager dry
    /// run reads that flag, and the function is compiled only if it is set
    /// and `compile` allows; otherwise it runs eagerly from then on.
    fn run(self, compile: bool, make: impl FnOnce(Rc<Cell<bool>>) -> Block) -> Result<Vec<Array>> {
        BLOCKS.with(|cell| {
            let mut blocks = cell.borrow_mut();
            if !blocks.contains_key(&self.key) {
                let covered = Rc::new(Cell::new(false));
                let mut f = make(covered.clone());
                let compile = compile && compiles_on_this_path(self.key[0]);
                let entry: (Block, bool) = if compile && {
                    f(&self.arrays)?;
                    covered.get()
                } {
                    let traced = move |x: &[Array]| f(x);
                    (
                        Box::new(mlx_rs::transforms::compile::compile(traced, false)),
                        true,
                    )
                } else {
                    (f, false)
                };
                blocks.insert(self.key.clone(), entry);
            }
            let (f, compiled) = blocks.get_mut(&self.key).expect("inserted above");
            if *compiled {
                COMPILED_CALLS.with(|c| c.set(c.get() + 1));
            }
            f(&self.arrays)
        })
    }
}

impl Flat for AttentionShape {
    fn put(&self, p: &mut Packed) {
        p.key.extend([
            self.n_heads as i64,
            self.n_kv_heads as i64,
            self.head_dim as i64,
            self.eps.to_bits() as i64,
            self.scale.to_bits() as i64,
            match self.value_norm {
                ValueNorm::None => 0,
                ValueNorm::RmsScaleFree => 1,
            },
        ]);
        match self.scores {
            Scores::FusedSdpa => p.key.push(0),
            Scores::Softcapped { cap } => p.key.extend([1, cap.to_bits() as i64]),
            Scores::FusedSdpaWithSinks => p.key.push(2),
        }
    }
    fn take(&self, _: &mut std::slice::Iter<'_, Array>) -> Self {
        *self
    }
}

impl Flat for Rope {
    fn put(&self, p: &mut Packed) {
        match self {
            Rope::Base { dims, base, scale } => p.key.extend([
                0,
                *dims as i64,
                base.to_bits() as i64,
                scale.to_bits() as i64,
            ]),
            Rope::Freqs { dims, freqs } => {
                p.key.extend([1, *dims as i64]);
                freqs.put(p);
            }
            Rope::Yarn(y) => {
                p.key
                    .extend([3, y.dims as i64, y.pairs.traditional() as i64]);
                y.freqs.put(p);
                y.input_scale.put(p);
            }
            Rope::NoPe => p.key.push(2),
        }
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        match self {
            Rope::Base { dims, base, scale } => Rope::Base {
                dims: *dims,
                base: *base,
                scale: *scale,
            },
            Rope::Freqs { dims, .. } => Rope::Freqs {
                dims: *dims,
                freqs: next(it),
            },
            Rope::Yarn(y) => Rope::Yarn(YarnTables {
                dims: y.dims,
                freqs: next(it),
                input_scale: y.input_scale.take(it),
                pairs: y.pairs,
            }),
            Rope::NoPe => Rope::NoPe,
        }
    }
}

impl Flat for RopeTables {
    fn put(&self, p: &mut Packed) {
        match self {
            RopeTables::Fallback(t) => p.put_variant(0, t),
            RopeTables::Native { rope, offset } => {
                p.key.push(1);
                rope.put(p);
                offset.put(p);
            }
            RopeTables::NoPe => p.key.push(2),
        }
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        match self {
            RopeTables::Fallback(t) => RopeTables::Fallback(t.take(it)),
            RopeTables::Native { rope, .. } => {
                let rope = rope.take(it);
                RopeTables::Native {
                    rope,
                    offset: next(it),
                }
            }
            RopeTables::NoPe => RopeTables::NoPe,
        }
    }
}

fn put_quant(q: &Option<Quantized>, p: &mut Packed) {
    match q {
        None => p.key.push(0),
        Some(q) => {
            p.key.extend([1, q.group_size as i64, q.bits as i64]);
            p.arrays.push(q.scales.clone());
            match &q.form {
                QuantForm::Affine { biases } => p.arrays.push(biases.clone()),
                // Keyed apart: the same sizes without biases are another graph.
                QuantForm::Mxfp4 => p.key.push(-1),
            }
        }
    }
}

fn take_quant(q: &Option<Quantized>, it: &mut std::slice::Iter<'_, Array>) -> Option<Quantized> {
    q.as_ref().map(|q| Quantized {
        scales: next(it),
        form: match &q.form {
            QuantForm::Affine { .. } => QuantForm::Affine { biases: next(it) },
            QuantForm::Mxfp4 => QuantForm::Mxfp4,
        },
        group_size: q.group_size,
        bits: q.bits,
    })
}

impl Flat for Linear {
    fn put(&self, p: &mut Packed) {
        // A pretransposed weight goes in as its evaluated transpose only.
        match &self.weight_t {
            Some(t) => p.put_variant(1, t),
            None => p.put_variant(0, &self.weight),
        }
        put_quant(&self.quant, p);
        self.bias.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let (weight, weight_t) = match &self.weight_t {
            Some(_) => (placeholder(), Some(next(it))),
            None => (next(it), None),
        };
        Linear {
            weight,
            quant: take_quant(&self.quant, it),
            weight_t,
            bias: self.bias.take(it),
        }
    }
}

impl Flat for SwitchLinear {
    fn put(&self, p: &mut Packed) {
        self.weight.put(p);
        put_quant(&self.quant, p);
        self.bias.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let weight = next(it);
        SwitchLinear {
            weight,
            quant: take_quant(&self.quant, it),
            bias: self.bias.take(it),
        }
    }
}

impl Flat for QkNormWeight {
    fn put(&self, p: &mut Packed) {
        match self {
            QkNormWeight::PerHead(w) => p.put_variant(0, w),
            QkNormWeight::WholeProjection(w) => p.put_variant(1, w),
        }
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        match self {
            QkNormWeight::PerHead(_) => QkNormWeight::PerHead(next(it)),
            QkNormWeight::WholeProjection(_) => QkNormWeight::WholeProjection(next(it)),
        }
    }
}

impl Flat for LayerNorms {
    fn put(&self, p: &mut Packed) {
        // The input norm belongs to the block before attention.
        match self {
            LayerNorms::PreNorm { ffn, .. } => p.put_variant(0, ffn),
            LayerNorms::Sandwich {
                post_attention,
                pre_feedforward,
                post_feedforward,
                ..
            } => {
                p.key.push(1);
                post_attention.put(p);
                pre_feedforward.put(p);
                post_feedforward.put(p);
            }
        }
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        match self {
            LayerNorms::PreNorm { .. } => LayerNorms::PreNorm {
                input: placeholder(),
                ffn: next(it),
            },
            LayerNorms::Sandwich { .. } => {
                let (post_attention, pre_feedforward, post_feedforward) =
                    (next(it), next(it), next(it));
                LayerNorms::Sandwich {
                    input: placeholder(),
                    post_attention,
                    pre_feedforward,
                    post_feedforward,
                }
            }
        }
    }
}

impl Flat for GateUp {
    fn put(&self, p: &mut Packed) {
        match self {
            GateUp::Separate { gate_proj, up_proj } => {
                gate_proj.put(p);
                up_proj.put(p);
            }
            // Its own key (a `Linear`'s starts with 0 or 1, so 2 tells the
            // forms apart): the compiled block splits one product.
            GateUp::Fused { gate_up_proj } => p.put_variant(2, gate_up_proj),
            // The block reads the stacked product, as for a fused projection.
            GateUp::Stacked { gate_up_proj, .. } => p.put_variant(2, gate_up_proj),
        }
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        match self {
            GateUp::Separate { gate_proj, up_proj } => GateUp::Separate {
                gate_proj: gate_proj.take(it),
                up_proj: up_proj.take(it),
            },
            GateUp::Fused { gate_up_proj } | GateUp::Stacked { gate_up_proj, .. } => {
                GateUp::Fused {
                    gate_up_proj: gate_up_proj.take(it),
                }
            }
        }
    }
}
