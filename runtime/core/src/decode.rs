//! Single-token decode steps of generated models through compiled blocks.
//!
//! A decode step of a small model is bound by MLX's per-operation cost (graph
//! nodes built through the C API, each one scheduled on the stream), not by
//! arithmetic. Each layer's step is split around its cache update into two
//! shape-stable pieces, and each piece runs as an `mlx::compile`d function:
//!
//! * before attention: input norm, Q/K/V projections, their norms, transposes
//!   and RoPE ([`gemma4::project_qkv`] / [`gemma4::project_q`]);
//! * after attention: `o_proj`, post-attention norm and residual, the
//!   feed-forward half, the PLE gate and the layer scalar
//!   ([`gemma4::attention_residual`], [`gemma4::feed_forward`],
//!   [`gemma4::finish_layer`]).
//!
//! The compiled functions trace exactly those runtime blocks, so the layer
//! math still exists once. Compilation fuses chains of elementwise operations
//! (the RMSNorm and RoPE fallbacks on the CPU, residuals, scalars) into one
//! generated kernel each; every fused kernel evaluates the same per-element
//! operations, in the same order and in the same dtypes, as the separate
//! kernels, so the bits do not change (checked by the parity tests against
//! the monolith and mlx-lm, which do not compile these blocks). Matmuls,
//! reductions, the cache update and attention stay separate operations.
//!
//! The weights are inputs of the compiled functions, not captured constants,
//! so all layers of one kind share one compiled function (one entry per
//! structure, kept per thread, as mlx-lm's own compiled helpers are).

use std::cell::RefCell;
use std::collections::HashMap;

use mlx_rs::Array;

use crate::attention::Mask;
use crate::cache::LayerCache;
use crate::gemma4::{self, AttentionShape, AttentionWeights, KvWeights, LayerNorms, Mlp, MoeBlock};
use crate::gemma4::{PleGate, SharedKv};
use crate::layers::{Linear, Quantized, SwitchLinear};
use crate::moe::{Router, SwitchGlu};
use crate::ops::{rms_norm, Result};
use crate::rope::{apply_tables, RopeTables};

/// The parts of one decoder layer a decode step needs.
pub struct Layer<'a> {
    pub norms: &'a LayerNorms,
    pub attn: &'a AttentionWeights,
    pub mlp: &'a Mlp,
    pub moe: Option<&'a MoeBlock>,
    pub ple: Option<(&'a PleGate, &'a Array)>,
    pub layer_scalar: &'a Array,
    pub shape: AttentionShape,
    pub eps: f32,
}

/// One decode step (one token) of a layer that computes its own K/V;
/// `rope` holds this step's tables of the layer's RoPE form.
pub fn own_kv(
    h: &Array,
    layer: &Layer<'_>,
    kv: &KvWeights,
    rope: &RopeTables,
    cache: &mut LayerCache,
    mask: &Mask,
) -> Result<(Array, SharedKv)> {
    let offset = Array::from_int(cache.offset());
    let qkv = pre_attention(h, layer, Some(kv), rope)?;
    let [q, k, v] = <[Array; 3]>::try_from(qkv).map_err(|_| bad_outputs())?;
    let (o, shared) = gemma4::attend_own_kv(&q, &k, &v, cache, mask, offset)?;
    Ok((post_attention(h, &o, layer)?, shared))
}

/// One decode step (one token) of a layer that reads a donor's K/V.
pub fn shared_kv(
    h: &Array,
    layer: &Layer<'_>,
    rope: &RopeTables,
    shared: &SharedKv,
    mask: &Mask,
) -> Result<Array> {
    let q = pre_attention(h, layer, None, rope)?;
    let q = q.into_iter().next().ok_or_else(bad_outputs)?;
    let o = gemma4::attend_shared_kv(&q, shared, mask)?;
    post_attention(h, &o, layer)
}

fn bad_outputs() -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom("compiled decode block: unexpected outputs")
}

/// MLX's CPU compiler writes scalar constants into the kernel source with
/// 7 significant digits, which does not round-trip every float32 (1/3840 =
/// 0.0002604167 reads back one ulp off). A block is compiled only if every
/// float32 constant its trace inlines reads back exactly: each RMSNorm's eps
/// and its mean's normalizer 1/n, n the normed width (hidden size or head
/// dim). Otherwise the same traced function runs eagerly. (The constants of
/// gelu_approx are inlined the same way in mlx-lm's own compiled geglu.)
fn inlines_exactly(layer: &Layer<'_>, hidden: i32) -> bool {
    // `float tmp = <%.7g of v>;`: a double literal converted to float.
    let reads_back = |v: f32| format!("{:.6e}", v as f64).parse::<f64>().map(|d| d as f32) == Ok(v);
    let inverse = |n: i32| [1.0f32 / n as f32, (1.0f64 / n as f64) as f32];
    reads_back(layer.eps)
        && inverse(hidden).into_iter().all(reads_back)
        && inverse(layer.shape.head_dim).into_iter().all(reads_back)
}

/// `rms_norm(h, input_norm)`, then Q, K, V (or Q alone) as the eager path
/// computes them, RoPE from this step's tables.
fn pre_attention(
    h: &Array,
    layer: &Layer<'_>,
    kv: Option<&KvWeights>,
    rope: &RopeTables,
) -> Result<Vec<Array>> {
    let hidden = h.shape()[h.ndim() - 1];
    let mut p = Packed::new(1);
    p.key
        .extend([layer.eps.to_bits() as i64, hidden as i64, rope.dims as i64]);
    layer.shape.put(&mut p);
    h.put(&mut p);
    rope.cos.put(&mut p);
    rope.sin.put(&mut p);
    layer.norms.input.put(&mut p);
    layer.attn.put(&mut p);
    p.key.push(kv.is_some() as i64);
    if let Some(kv) = kv {
        kv.put(&mut p);
    }
    let (s, eps, dims) = (layer.shape, layer.eps, rope.dims);
    p.run(
        || inlines_exactly(layer, hidden),
        || {
            // Templates for rebuilding the structures from the traced inputs.
            let (attn, kv) = (layer.attn.clone(), kv.cloned());
            Box::new(move |inputs: &[Array]| -> Result<Vec<Array>> {
                let it = &mut inputs.iter();
                let (h, cos, sin, norm) = (next(it), next(it), next(it), next(it));
                let (attn, kv) = (attn.take(it), kv.take(it));
                let tables = RopeTables { dims, cos, sin };
                let rope = |t: &Array| apply_tables(t, &tables);
                let x = rms_norm(&h, Some(&norm), eps)?;
                Ok(match kv {
                    Some(kv) => {
                        let (q, k, v) = gemma4::project_qkv(&x, &attn, &kv, s, &rope)?;
                        vec![q, k, v]
                    }
                    None => vec![gemma4::project_q(&x, &attn, s, &rope)?],
                })
            })
        },
    )
}

/// `o_proj`, the attention residual, the feed-forward half, the PLE gate and
/// the layer scalar.
fn post_attention(h: &Array, o: &Array, layer: &Layer<'_>) -> Result<Array> {
    if let Some(moe) = layer.moe {
        // Compiled, the MoE half changed the float32 logits of
        // gemma4-26b-a4b-tiny in the last bits: it stays eager.
        let a = layer.attn.o_proj.forward(o)?;
        let h = gemma4::attention_residual(h, &a, layer.norms, layer.eps)?;
        let h = gemma4::feed_forward(&h, layer.norms, layer.mlp, Some(moe), layer.eps)?;
        return gemma4::finish_layer(&h, layer.ple, layer.layer_scalar, layer.eps);
    }
    let mut p = Packed::new(2);
    p.key.extend([layer.eps.to_bits() as i64]);
    h.put(&mut p);
    o.put(&mut p);
    layer.attn.o_proj.put(&mut p);
    layer.norms.put(&mut p);
    layer.mlp.put(&mut p);
    p.key.push(layer.moe.is_some() as i64);
    if let Some(moe) = layer.moe {
        moe.put(&mut p);
    }
    p.key.push(layer.ple.is_some() as i64);
    if let Some((gate, input)) = layer.ple {
        gate.put(&mut p);
        input.put(&mut p);
    }
    layer.layer_scalar.put(&mut p);
    let eps = layer.eps;
    let hidden = h.shape()[h.ndim() - 1];
    p.key.push(hidden as i64);
    let out = p.run(
        || inlines_exactly(layer, hidden),
        || {
            // Templates for rebuilding the structures from the traced inputs.
            let (o_proj, norms, mlp) = (
                layer.attn.o_proj.clone(),
                layer.norms.clone(),
                layer.mlp.clone(),
            );
            let moe = layer.moe.cloned();
            let ple = layer.ple.map(|(g, x)| (g.clone(), x.clone()));
            Box::new(move |inputs: &[Array]| -> Result<Vec<Array>> {
                let it = &mut inputs.iter();
                let (h, o) = (next(it), next(it));
                let (o_proj, norms, mlp) = (o_proj.take(it), norms.take(it), mlp.take(it));
                let (moe, ple, scalar) = (moe.take(it), ple.take(it), next(it));
                let a = o_proj.forward(&o)?;
                let h = gemma4::attention_residual(&h, &a, &norms, eps)?;
                let h = gemma4::feed_forward(&h, &norms, &mlp, moe.as_ref(), eps)?;
                let ple = ple.as_ref().map(|(g, x)| (g, x));
                Ok(vec![gemma4::finish_layer(&h, ple, &scalar, eps)?])
            })
        },
    )?;
    out.into_iter().next().ok_or_else(bad_outputs)
}

type Block = Box<dyn FnMut(&[Array]) -> Result<Vec<Array>>>;

thread_local! {
    /// Compiled blocks by structure key (which block, constants, which
    /// optional weights exist, quantization): one per layer kind.
    static BLOCKS: RefCell<HashMap<Vec<i64>, Block>> = RefCell::new(HashMap::new());
}

/// A block's inputs flattened to arrays, and the key of everything else the
/// traced function depends on (shapes and dtypes are MLX's own cache key).
struct Packed {
    key: Vec<i64>,
    arrays: Vec<Array>,
}

impl Packed {
    fn new(block: i64) -> Self {
        Packed {
            key: vec![block],
            arrays: Vec::with_capacity(32),
        }
    }

    /// Calls the compiled block of this key, building it on first use.
    /// Single-token shapes are fixed per layer kind, so MLX traces each block
    /// once per kind (and once more per new cache length only where a traced
    /// shape depends on it, which none here does).
    /// `exact`: whether compiling keeps every bit (else the function runs
    /// eagerly); asked once per key.
    fn run(
        self,
        exact: impl FnOnce() -> bool,
        make: impl FnOnce() -> Box<dyn FnMut(&[Array]) -> Result<Vec<Array>>>,
    ) -> Result<Vec<Array>> {
        BLOCKS.with(|cell| {
            let mut blocks = cell.borrow_mut();
            let f = blocks.entry(self.key).or_insert_with(|| {
                let mut f = make();
                if !exact() {
                    return f;
                }
                let traced = move |x: &[Array]| f(x);
                Box::new(mlx_rs::transforms::compile::compile(traced, false))
            });
            f(&self.arrays)
        })
    }
}

fn next(it: &mut std::slice::Iter<'_, Array>) -> Array {
    it.next()
        .expect("compiled decode block: fewer inputs than packed")
        .clone()
}

/// Flattening of weight structures into the compiled block's inputs:
/// `put` appends the arrays (and the structure to the key), `take`
/// rebuilds the structure from the traced inputs, with `self` as template.
trait Flat: Sized {
    fn put(&self, p: &mut Packed);
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self;
}

impl Flat for Array {
    fn put(&self, p: &mut Packed) {
        p.arrays.push(self.clone());
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        next(it)
    }
}

impl Flat for AttentionShape {
    fn put(&self, p: &mut Packed) {
        p.key.extend([
            self.n_heads as i64,
            self.n_kv_heads as i64,
            self.head_dim as i64,
            self.eps.to_bits() as i64,
        ]);
    }
    fn take(&self, _: &mut std::slice::Iter<'_, Array>) -> Self {
        *self
    }
}

impl<T: Flat> Flat for Option<T> {
    fn put(&self, p: &mut Packed) {
        p.key.push(self.is_some() as i64);
        if let Some(t) = self {
            t.put(p);
        }
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        self.as_ref().map(|t| t.take(it))
    }
}

impl<A: Flat, B: Flat> Flat for (A, B) {
    fn put(&self, p: &mut Packed) {
        self.0.put(p);
        self.1.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let a = self.0.take(it);
        (a, self.1.take(it))
    }
}

fn put_quant(q: &Option<Quantized>, p: &mut Packed) {
    match q {
        None => p.key.push(0),
        Some(q) => {
            p.key.extend([1, q.group_size as i64, q.bits as i64]);
            p.arrays.push(q.scales.clone());
            p.arrays.push(q.biases.clone());
        }
    }
}

fn take_quant(q: &Option<Quantized>, it: &mut std::slice::Iter<'_, Array>) -> Option<Quantized> {
    q.as_ref().map(|q| Quantized {
        scales: next(it),
        biases: next(it),
        group_size: q.group_size,
        bits: q.bits,
    })
}

impl Flat for Linear {
    fn put(&self, p: &mut Packed) {
        self.weight.put(p);
        put_quant(&self.quant, p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let weight = next(it);
        Linear {
            weight,
            quant: take_quant(&self.quant, it),
        }
    }
}

impl Flat for SwitchLinear {
    fn put(&self, p: &mut Packed) {
        self.weight.put(p);
        put_quant(&self.quant, p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let weight = next(it);
        SwitchLinear {
            weight,
            quant: take_quant(&self.quant, it),
        }
    }
}

impl Flat for AttentionWeights {
    fn put(&self, p: &mut Packed) {
        // o_proj is used after attention, not here; `kv` travels separately.
        self.q_proj.put(p);
        self.q_norm.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let q_proj = self.q_proj.take(it);
        AttentionWeights {
            q_proj,
            o_proj: self.o_proj.clone(),
            q_norm: next(it),
            kv: None,
        }
    }
}

impl Flat for KvWeights {
    fn put(&self, p: &mut Packed) {
        self.k_proj.put(p);
        self.v_proj.put(p);
        self.k_norm.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let k_proj = self.k_proj.take(it);
        let v_proj = self.v_proj.take(it);
        KvWeights {
            k_proj,
            v_proj,
            k_norm: next(it),
        }
    }
}

impl Flat for LayerNorms {
    fn put(&self, p: &mut Packed) {
        // The input norm belongs to the block before attention.
        self.post_attention.put(p);
        self.pre_feedforward.put(p);
        self.post_feedforward.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let (post_attention, pre_feedforward, post_feedforward) = (next(it), next(it), next(it));
        LayerNorms {
            input: self.input.clone(),
            post_attention,
            pre_feedforward,
            post_feedforward,
        }
    }
}

impl Flat for Mlp {
    fn put(&self, p: &mut Packed) {
        self.gate_proj.put(p);
        self.up_proj.put(p);
        self.down_proj.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let gate_proj = self.gate_proj.take(it);
        let up_proj = self.up_proj.take(it);
        Mlp {
            gate_proj,
            up_proj,
            down_proj: self.down_proj.take(it),
        }
    }
}

impl Flat for Router {
    fn put(&self, p: &mut Packed) {
        p.key.extend([
            self.top_k as i64,
            self.hidden as i64,
            self.eps.to_bits() as i64,
        ]);
        self.proj.put(p);
        self.scale.put(p);
        self.per_expert_scale.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let proj = self.proj.take(it);
        let (scale, per_expert_scale) = (next(it), next(it));
        Router {
            proj,
            scale,
            per_expert_scale,
            top_k: self.top_k,
            hidden: self.hidden,
            eps: self.eps,
        }
    }
}

impl Flat for MoeBlock {
    fn put(&self, p: &mut Packed) {
        self.router.put(p);
        self.experts.gate_proj.put(p);
        self.experts.up_proj.put(p);
        self.experts.down_proj.put(p);
        self.pre_feedforward_2.put(p);
        self.post_feedforward_1.put(p);
        self.post_feedforward_2.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let router = self.router.take(it);
        let gate_proj = self.experts.gate_proj.take(it);
        let up_proj = self.experts.up_proj.take(it);
        let down_proj = self.experts.down_proj.take(it);
        let (pre_feedforward_2, post_feedforward_1, post_feedforward_2) =
            (next(it), next(it), next(it));
        MoeBlock {
            router,
            experts: SwitchGlu {
                gate_proj,
                up_proj,
                down_proj,
            },
            pre_feedforward_2,
            post_feedforward_1,
            post_feedforward_2,
        }
    }
}

impl Flat for PleGate {
    fn put(&self, p: &mut Packed) {
        self.gate.put(p);
        self.projection.put(p);
        self.post_norm.put(p);
    }
    fn take(&self, it: &mut std::slice::Iter<'_, Array>) -> Self {
        let gate = self.gate.take(it);
        let projection = self.projection.take(it);
        PleGate {
            gate,
            projection,
            post_norm: next(it),
        }
    }
}
