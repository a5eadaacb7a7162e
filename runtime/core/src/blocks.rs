//! The decoder blocks of every family, op for op as mlx-lm 0.32.2 runs them,
//! each block's math written once and parameterised by the facts of the
//! block IR (`archgen_ir`), never by family. The monolith composes
//! them with run-time branches; generated models call the same functions
//! with every branch resolved; the CPU decode path (`decode`) traces them.
//!
//! ```text
//! pre-norm:  h = x + mixer(norm(x))          out = h + ffn(norm(h))
//! sandwich:  h = x + norm(mixer(norm(x)))    out = h + norm(ffn(norm(h)))
//! post-norm: h = x + norm(mixer(x))          out = h + norm(ffn(h))
//! then:      out += per-layer input gate;    out *= layer scalar
//! ```
//!
//! The facts a block branches on are the IR's own enums (`QkNorm`,
//! `Scores`, `Activation` and the rest, re-exported here): generated models
//! name them as `blocks::QkNorm`, the monolith passes the IR's values
//! through. The runtime has a type of its own only where it needs another
//! shape of a fact: [`NormArrangement`] (no post-norm: its norms are
//! [`PostNorms`]), [`GroupTopK`] (with the router's `top_k`, the key of its
//! compiled trace), and the enums that hold weights ([`LayerNorms`],
//! [`QkNormWeight`], [`GateUp`]).

use mlx_rs::{Array, Dtype};

use crate::attention::{
    attend, batch_and_len, causal_mask, merged, quantized_sdpa, sdpa_with_sinks,
    softcapped_attention, Mask, Quantized,
};
use crate::cache::{LayerCache, MixedKvNow, QuantizedKvCache};
use crate::distributed::sharded_to_all;
use crate::flat::Flat;
use crate::layers::{pretranspose_all, project_head, Embedding, Linear};
use crate::moe::{
    biased_experts_moe, experts, sigmoid_group_moe, softmax_topk_moe, Router, SigmoidGroupRouter,
    SoftmaxTopKRouter, SwitchGlu, TopKSoftmaxRouter,
};
use crate::ops::{
    divide_weak, geglu, gelu_approx_compiled, gelu_approx_times, multiply_weak, rms_norm, swiglu,
    swiglu_oai, Result,
};
use crate::rope::{Rope, RopeTables};
use crate::weights::Weights;

// The layer facts a block reads: the IR's own enums.
pub use archgen_ir::{
    Activation, EmbedScale, GateUpProjection, LogitScale, NormWeight, ProjectionBias, QkNorm,
    Scores, ValueNorm, Values,
};

pub use crate::layers::{final_norm, logits, Head};
pub use crate::moe::{ExpertsShape, GroupTopK, TopKProbs};

fn refused(what: &str) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what.to_string())
}

/// The token embedding, scaled.
pub fn embed(embed_tokens: &Embedding, ids: &Array, s: EmbedScale, hidden: i32) -> Result<Array> {
    let e = embed_tokens.lookup(ids)?;
    match s {
        EmbedScale::None => Ok(e),
        EmbedScale::SqrtHidden => multiply_weak(&e, (hidden as f64).powf(0.5)),
        EmbedScale::Constant(c) => multiply_weak(&e, c),
    }
}

/// [`logits`] with a [`LogitScale`]: final norm, the scale of the normed
/// hidden state (`DivideBy`), the head, the scale of the logits
/// (`DivideLogitsBy`), the optional compiled softcap.
pub fn logits_scaled(
    h: &Array,
    norm: &Array,
    head: Head<'_>,
    scale: LogitScale,
    softcap: Option<f32>,
    eps: f32,
) -> Result<Array> {
    let d = match scale {
        LogitScale::None => return logits(h, norm, head, softcap, eps),
        LogitScale::DivideLogitsBy(d) => {
            let out = divide_weak(&logits(h, norm, head, None, eps)?, d)?;
            return match softcap {
                Some(c) => crate::ops::logit_softcap(c, &out),
                None => Ok(out),
            };
        }
        LogitScale::DivideBy(d) => d,
    };
    let h = divide_weak(&final_norm(h, norm, eps)?, d)?;
    project_head(&h, head, softcap)
}

/// The factor a layer's branches are multiplied by before they join the
/// residual stream (IR `Residual::DepthScaled`), as the float32 array of the
/// Python float; [`Residual::add`] rounds it to the branch's dtype where it
/// meets the branch, as a weak scalar is. An array, not a constant, so that compiled decode blocks take
/// it as an input (`decode`: MLX writes float constants into kernel source
/// with 7 digits).
pub fn residual_scale(factor: f64) -> Array {
    Array::from_f32(factor as f32)
}

/// float16's largest finite value, `mx.finfo(mx.float16).max`.
const FLOAT16_MAX: f32 = 65504.0;

/// How a layer's two branches (mixer, feed-forward half) join the residual
/// stream (IR `Residual`), with what the add reads at run time.
#[derive(Debug, Clone, Copy)]
pub enum Residual<'a> {
    /// `h + branch`.
    Plain,
    /// `h + branch * factor`, the factor an array ([`residual_scale`], IR
    /// `Residual::DepthScaled` / `Scaled`) so that a compiled block takes it
    /// as an input, not as kernel source.
    Scaled(&'a Array),
    /// gemma3_text's `clip_residual` (IR `Residual::ClippedInFloat16`):
    /// `h + branch`, except that a float16 stream adds both in float32,
    /// clips the sum to float16's finite range and casts it back, so an
    /// overflow stays finite.
    ClippedInFloat16,
}

impl<'a> Residual<'a> {
    /// `h` plus the branch, in this form.
    pub fn add(self, h: &Array, branch: Array) -> Result<Array> {
        match self {
            Residual::Plain => h.add(branch),
            Residual::Scaled(factor) => h.add(branch.multiply(factor.as_dtype(branch.dtype())?)?),
            Residual::ClippedInFloat16 => match h.dtype() {
                Dtype::Float16 => {
                    // mx.clip's Python-float bounds become arrays of the
                    // float32 sum's dtype.
                    let sum = h
                        .as_dtype(Dtype::Float32)?
                        .add(branch.as_dtype(Dtype::Float32)?)?;
                    let bounds = (Array::from_f32(-FLOAT16_MAX), Array::from_f32(FLOAT16_MAX));
                    mlx_rs::ops::clip(&sum, bounds)?.as_dtype(Dtype::Float16)
                }
                _ => h.add(branch),
            },
        }
    }

    /// The factor of scaled branches.
    pub fn factor(self) -> Option<&'a Array> {
        match self {
            Residual::Scaled(factor) => Some(factor),
            Residual::Plain | Residual::ClippedInFloat16 => None,
        }
    }
}

// ---- Attention

/// The static shape of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    /// eps of the q/k/v norms.
    pub eps: f32,
    /// The scale SDPA multiplies the scores by, as the f32 it receives
    /// (with [`Scores::Softcapped`], the weak scalar the queries are
    /// multiplied by: a Python float is rounded to f32 first there too).
    pub scale: f32,
    pub value_norm: ValueNorm,
    pub scores: Scores,
}

impl AttentionShape {
    /// The output widths of the query projection and of each of the key
    /// and value projections: heads times head size.
    pub fn projection_widths(&self) -> (i32, i32) {
        (
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        )
    }
}

/// The weight-name prefix of layer `layer`'s attention projections.
pub(crate) fn self_attn_prefix(layer: usize) -> String {
    format!("layers.{layer}.self_attn")
}

/// The weight-name prefix of layer `layer`'s feed-forward block (its MLP,
/// or the router and experts that replace it).
pub(crate) fn mlp_prefix(layer: usize) -> String {
    format!("layers.{layer}.mlp")
}

/// Attention of `q` [B, H, L, D] over `k`, `v` as the layer's [`Scores`]
/// say, heads merged back for `o_proj` ([`merged`]).
///
/// The written-out form gets its mask as mlx-lm's gemma2 builds it,
/// `create_attention_mask(h, cache[0], return_array=True)`: where the cache
/// would say "causal" (a prompt of more than one token) that is the bool
/// array `create_causal_mask(L, offset)`, and the keys the cache returns
/// are the `offset + L` positions it covers; one token gets no mask.
///
/// With [`Scores::FusedSdpaWithSinks`], `sinks` is the layer's `[heads]`
/// sink logits, passed to fast SDPA as mlx-lm's `AttentionBlock` passes them
/// (every query length, one token too: no written-out one-token form).
pub fn attend_with(
    q: &Array,
    k: &Array,
    v: &Array,
    s: AttentionShape,
    mask: &Mask,
    rows: bool,
    sinks: Option<&Array>,
) -> Result<Array> {
    match s.scores {
        Scores::FusedSdpa => attend(q, k, v, s.scale, mask, rows),
        Scores::FusedSdpaWithSinks => {
            let sinks = sinks.ok_or_else(|| {
                refused("attention with sinks: the layer has no self_attn.sinks loaded")
            })?;
            let (b, l) = (q.shape()[0], q.shape()[2]);
            sdpa_with_sinks(q, k, v, s.scale, mask, sinks)?
                .transpose_axes(&[0, 2, 1, 3])?
                .reshape(&merged(b, l, rows))
        }
        Scores::Softcapped { cap } => {
            let (b, l) = (q.shape()[0], q.shape()[2]);
            let mask = match mask {
                Mask::Causal => {
                    let keys = k.shape()[2];
                    Mask::Array(causal_mask(l, keys - l, None)?)
                }
                Mask::None | Mask::Array(_) => mask.clone(),
            };
            softcapped_attention(q, k, v, f64::from(s.scale), f64::from(cap), &mask)?
                .transpose_axes(&[0, 2, 1, 3])?
                .reshape(&merged(b, l, rows))
        }
    }
}

/// Attention weights of one layer: Q and output projections, the query norm
/// when the layer has q/k norms, and `kv` when the layer projects its own
/// K/V (`None` on KV-sharing layers, and in generated models, which keep K/V
/// weights in a field of their own).
#[derive(Debug, Clone, Flat)]
pub struct AttentionWeights {
    pub q_proj: Linear,
    #[flat(elsewhere = crate::flat::unused_linear())]
    pub o_proj: Linear,
    pub q_norm: Option<QkNormWeight>,
    #[flat(elsewhere = None)]
    pub kv: Option<KvWeights>,
    /// `self_attn.sinks` `[heads]` of a layer with [`Scores::FusedSdpaWithSinks`]
    /// (read by the uncompiled attention, never by a compiled block).
    #[flat(elsewhere = None)]
    pub sinks: Option<Array>,
}

/// A query or key RMSNorm weight and what it spans (IR `QkNorm`).
#[derive(Debug, Clone)]
pub enum QkNormWeight {
    /// Each head after the split: weight `[head_dim]` (qwen3, gemma).
    PerHead(Array),
    /// The whole projection before the split: weight `[heads * head_dim]`,
    /// one mean over every head (olmo2's `q_norm(q_proj(x))`).
    WholeProjection(Array),
}

/// A projection `[B, L, heads * head_dim]` as heads `[B, L, heads,
/// head_dim]` (`heads`, the projection already split), normed as `norm`
/// says.
fn normed_heads(
    proj: &Array,
    heads: Array,
    norm: Option<&QkNormWeight>,
    s: AttentionShape,
) -> Result<Array> {
    match norm {
        None => Ok(heads),
        Some(QkNormWeight::PerHead(w)) => rms_norm(&heads, Some(w), s.eps),
        Some(QkNormWeight::WholeProjection(w)) => {
            rms_norm(proj, Some(w), s.eps)?.reshape(heads.shape())
        }
    }
}

impl AttentionWeights {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        pretranspose_all([&mut self.q_proj, &mut self.o_proj]);
        self.kv.iter_mut().for_each(KvWeights::pretranspose);
    }
}

/// K/V projections of a layer that computes its own K/V. `v_proj` is `None`
/// when V is the raw `k_proj` output (IR `Values::SameAsKeys`).
#[derive(Debug, Clone, Flat)]
pub struct KvWeights {
    pub k_proj: Linear,
    pub v_proj: Option<Linear>,
    pub k_norm: Option<QkNormWeight>,
}

impl KvWeights {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        self.k_proj.pretranspose();
        self.v_proj.iter_mut().for_each(Linear::pretranspose);
    }
}

/// K/V a layer attended over, and the rope offset it used: what a donor
/// passes to the layers that share its K/V. From a quantized cache,
/// `keys`/`values` hold only the packed uint32 data, which sharers refuse.
#[derive(Debug, Clone)]
pub struct SharedKv {
    pub keys: Array,
    pub values: Array,
    pub offset: Array,
}

/// The projections of a layer that computes its own K/V, by IR
/// `QkvProjection`.
#[derive(Debug, Clone, Copy)]
pub enum OwnQkv<'a> {
    /// `q_proj` (with the output projection and q norm) and the K/V
    /// projections, each its own matmul.
    Separate {
        attn: &'a AttentionWeights,
        kv: &'a KvWeights,
    },
    /// One `qkv_proj` ([`FusedQkvAttention`]).
    Fused(&'a FusedQkvAttention),
}

impl<'a> OwnQkv<'a> {
    pub fn separate(attn: &'a AttentionWeights, kv: &'a KvWeights) -> Self {
        OwnQkv::Separate { attn, kv }
    }
}

/// A K/V-owning layer's attention: computes Q/K/V from its projections,
/// updates its cache, attends, projects out.
pub fn attention_own_kv(
    x: &Array,
    qkv: OwnQkv<'_>,
    s: AttentionShape,
    rope: &Rope,
    cache: &mut LayerCache,
    mask: &Mask,
) -> Result<(Array, SharedKv)> {
    let offset = Array::from_int(cache.offset());
    let (q, k, v) = qkv.project(x, s, &|t| rope.apply(t, &offset))?;
    let sinks = qkv.sinks();
    let (o, shared) = attend_own_kv(&q, &k, &v, s, cache, mask, offset, false, sinks)?;
    Ok((sharded_to_all(qkv.o_proj().forward(&o)?)?, shared))
}

/// The attention weights of a layer whose queries, keys and values come
/// from one projection (IR `QkvProjection::Fused`): `qkv_proj`
/// `[(heads + 2 * kv_heads) * head_dim, hidden]`, rows of the queries, then
/// the keys, then the values; no bias, no q/k norm.
#[derive(Debug, Clone)]
pub struct FusedQkvAttention {
    pub qkv_proj: Linear,
    pub o_proj: Linear,
}

impl FusedQkvAttention {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        pretranspose_all([&mut self.qkv_proj, &mut self.o_proj]);
    }
}

/// `layers.{i}.self_attn` of a layer with one `qkv_proj`.
pub fn load_fused_qkv_attention(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    s: AttentionShape,
) -> FusedQkvAttention {
    let (p, (q, kv)) = (self_attn_prefix(layer), s.projection_widths());
    FusedQkvAttention {
        qkv_proj: w.linear(&format!("{p}.qkv_proj"), q + 2 * kv, hidden),
        o_proj: w.linear(&format!("{p}.o_proj"), hidden, q),
    }
}

impl<'a> OwnQkv<'a> {
    /// Queries, keys and values [B, heads, L, head_dim]: projected, normed
    /// as the layer's norms say (the fused form has no q/k norms; the
    /// shape's value norm applies to both), transposed; Q and K through
    /// `rope`.
    pub fn project(
        self,
        x: &Array,
        s: AttentionShape,
        rope: &dyn Fn(&Array) -> Result<Array>,
    ) -> Result<(Array, Array, Array)> {
        let (b, l) = batch_and_len(x);
        match self {
            OwnQkv::Separate { attn, kv } => {
                let projected = Projected {
                    q: attn.q_proj.forward(x)?,
                    k: kv.k_proj.forward(x)?,
                    v: kv.v_proj.as_ref().map(|p| p.forward(x)).transpose()?,
                };
                projected.heads((b, l), attn.q_norm.as_ref(), kv.k_norm.as_ref(), s, rope)
            }
            // One matmul, split at `[q, q + kv]` along the last axis
            // (`mx.split`).
            OwnQkv::Fused(w) => {
                let (q_width, kv_width) = s.projection_widths();
                let parts = w
                    .qkv_proj
                    .forward(x)?
                    .split_at_indices(&[q_width, q_width + kv_width], -1)?;
                let [q, k, v] = <[Array; 3]>::try_from(parts)
                    .map_err(|_| refused("qkv_proj: split in three gave another count"))?;
                let heads = |t: &Array| t.reshape(&[b, l, -1, s.head_dim]);
                let v = match s.value_norm {
                    ValueNorm::RmsScaleFree => rms_norm(&heads(&v)?, None, s.eps)?,
                    ValueNorm::None => heads(&v)?,
                };
                Ok((
                    rope(&heads(&q)?.transpose_axes(&[0, 2, 1, 3])?)?,
                    rope(&heads(&k)?.transpose_axes(&[0, 2, 1, 3])?)?,
                    v.transpose_axes(&[0, 2, 1, 3])?,
                ))
            }
        }
    }

    /// The output projection.
    pub fn o_proj(self) -> &'a Linear {
        match self {
            OwnQkv::Separate { attn, .. } => &attn.o_proj,
            OwnQkv::Fused(w) => &w.o_proj,
        }
    }

    /// The sink logits of attention with sinks (the fused form has none).
    pub fn sinks(self) -> Option<&'a Array> {
        match self {
            OwnQkv::Separate { attn, .. } => attn.sinks.as_ref(),
            OwnQkv::Fused(_) => None,
        }
    }
}

/// The outputs of a K/V-owning layer's separate projections (or the parts
/// of one stacked product that computes them: `decode::FusedQkv`), before
/// their heads are split. `v` is `None` when V is K's projection (IR
/// `Values::SameAsKeys`).
pub struct Projected {
    pub q: Array,
    pub k: Array,
    pub v: Option<Array>,
}

impl Projected {
    /// Queries, keys and values [B, heads, L, head_dim] of the projections
    /// of `(B, L)` tokens: split into heads, normed as the layer's norms say,
    /// transposed; Q and K through `rope`.
    pub fn heads(
        self,
        (b, l): (i32, i32),
        q_norm: Option<&QkNormWeight>,
        k_norm: Option<&QkNormWeight>,
        s: AttentionShape,
        rope: &dyn Fn(&Array) -> Result<Array>,
    ) -> Result<(Array, Array, Array)> {
        // Heads as -1: a rank of a tensor-parallel run has n_kv_heads / N of
        // them (the shape's counts are the model's; see `distributed`).
        let split = |t: &Array| t.reshape(&[b, l, -1, s.head_dim]);
        let q = normed_heads(&self.q, split(&self.q)?, q_norm, s)?;
        let k = split(&self.k)?;
        // V = K's projection before any norm (IR `Values::SameAsKeys`).
        let v = match &self.v {
            None => k.clone(),
            Some(v) => split(v)?,
        };
        let k = normed_heads(&self.k, k, k_norm, s)?;
        let k = rope(&k.transpose_axes(&[0, 2, 1, 3])?)?;
        let v = match s.value_norm {
            ValueNorm::RmsScaleFree => rms_norm(&v, None, s.eps)?,
            ValueNorm::None => v,
        };
        let v = v.transpose_axes(&[0, 2, 1, 3])?;
        let q = rope(&q.transpose_axes(&[0, 2, 1, 3])?)?;
        Ok((q, k, v))
    }
}

/// The queries [B, heads, L, head_dim] of a KV-sharing layer, through `rope`.
pub fn project_q(
    x: &Array,
    w: &AttentionWeights,
    s: AttentionShape,
    rope: &dyn Fn(&Array) -> Result<Array>,
) -> Result<Array> {
    let q = queries(x, w, s)?;
    rope(&q.transpose_axes(&[0, 2, 1, 3])?)
}

fn queries(x: &Array, w: &AttentionWeights, s: AttentionShape) -> Result<Array> {
    let (b, l) = batch_and_len(x);
    // Heads as -1, as in `OwnQkv::project`.
    let q_proj = w.q_proj.forward(x)?;
    let q = q_proj.reshape(&[b, l, -1, s.head_dim])?;
    normed_heads(&q_proj, q, w.q_norm.as_ref(), s)
}

/// A K/V-owning layer's cache update and attention over the cache: returns
/// the heads merged back to [B, L, heads * head_dim] (or [B * L, ...] with
/// `rows`), the input of `o_proj`, and the K/V sharers read.
#[allow(clippy::too_many_arguments)]
pub fn attend_own_kv(
    q: &Array,
    k: &Array,
    v: &Array,
    s: AttentionShape,
    cache: &mut LayerCache,
    mask: &Mask,
    offset: Array,
    rows: bool,
    sinks: Option<&Array>,
) -> Result<(Array, SharedKv)> {
    match cache {
        LayerCache::Quantized(_) | LayerCache::QuantizedAfterForward(_) => {
            refuse_softcap_over_quantized(s.scores)?
        }
        LayerCache::Full(_) | LayerCache::Sliding(_) => {}
    }
    let quantized: Option<&mut QuantizedKvCache> = match cache {
        LayerCache::Quantized(qc) => Some(qc),
        // mlx-optiq's mixed KV: plain until converted (see MixedKvCache).
        LayerCache::QuantizedAfterForward(mc) => match mc.convert_if_due()? {
            MixedKvNow::Quantized(qc) => Some(qc),
            MixedKvNow::Plain(kc) => {
                let (keys, values) = kc.update_and_fetch(k, v)?;
                let o = attend_with(q, &keys, &values, s, mask, rows, sinks)?;
                return Ok((
                    o,
                    SharedKv {
                        keys,
                        values,
                        offset,
                    },
                ));
            }
        },
        LayerCache::Full(_) | LayerCache::Sliding(_) => None,
    };
    if let Some(qc) = quantized {
        // base.scaled_dot_product_attention: a cache with `.bits` routes to
        // quantized_scaled_dot_product_attention.
        let (qk, qv) = qc.update_and_fetch(k, v)?;
        let groups = (qc.group_size, qc.bits);
        return attend_quantized_fetched(q, qk, qv, s, mask, groups, offset, rows);
    }
    let (keys, values) = cache.update_and_fetch(k, v)?;
    let o = attend_with(q, &keys, &values, s, mask, rows, sinks)?;
    Ok((
        o,
        SharedKv {
            keys,
            values,
            offset,
        },
    ))
}

/// The refusal of mlx-lm's gemma2 attention (scores written out to be
/// softcapped) over a quantized cache, whose keys it cannot read.
pub(crate) fn refuse_softcap_over_quantized(scores: Scores) -> Result<()> {
    match scores {
        Scores::FusedSdpa => Ok(()),
        Scores::Softcapped { .. } => Err(refused(
            "written-out softcapped attention over a quantized KV cache: mlx-lm's gemma2 \
             attention cannot read quantized keys",
        )),
        // base.scaled_dot_product_attention raises "Quantized SDPA does not
        // support attention sinks."
        Scores::FusedSdpaWithSinks => Err(refused(
            "attention with sinks over a quantized KV cache: mlx-lm's quantized SDPA does not \
             support attention sinks",
        )),
    }
}

/// Attention over a quantized cache already updated with this step's K/V
/// (`base.scaled_dot_product_attention` routes a cache with `.bits` to
/// `quantized_scaled_dot_product_attention`), with `(group_size, bits)` of
/// its quantization: the heads merged back ([B, L, H * D], or rows with
/// `rows`), and the packed key and value data as the K/V for sharers. One
/// sequence's attention and a batch's both end here.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_quantized_fetched(
    q: &Array,
    keys: Quantized,
    values: Quantized,
    s: AttentionShape,
    mask: &Mask,
    (group_size, bits): (i32, i32),
    offset: Array,
    rows: bool,
) -> Result<(Array, SharedKv)> {
    let (b, l) = (q.shape()[0], q.shape()[2]);
    // The scale meets the queries as a weak scalar of their dtype; the
    // one form with a quantized cache (scale 1) is exact either way.
    let scale = f64::from(s.scale);
    let o = quantized_sdpa(q, &keys, &values, scale, mask, group_size, bits)?
        .transpose_axes(&[0, 2, 1, 3])?
        .reshape(&merged(b, l, rows))?;
    // mlx-lm would hand the quantized tuples to sharers, whose plain SDPA
    // then fails; the spec validator forbids that, and the packed uint32
    // data carried here is refused by `attend_shared_kv`.
    let shared = SharedKv {
        keys: keys.data,
        values: values.data,
        offset,
    };
    Ok((o, shared))
}

/// A KV-sharing layer's attention: its own queries over the donor's K/V.
pub fn attention_shared_kv(
    x: &Array,
    w: &AttentionWeights,
    s: AttentionShape,
    rope: &Rope,
    shared: &SharedKv,
    mask: &Mask,
) -> Result<Array> {
    let q = project_q(x, w, s, &|t| rope.apply(t, &shared.offset))?;
    let o = attend_shared_kv(&q, s, shared, mask, false, w.sinks.as_ref())?;
    sharded_to_all(w.o_proj.forward(&o)?)
}

/// A KV-sharing layer's attention over the donor's K/V, heads merged back
/// to [B, L, heads * head_dim] (or [B * L, ...] with `rows`), the input of
/// `o_proj`.
pub fn attend_shared_kv(
    q: &Array,
    s: AttentionShape,
    shared: &SharedKv,
    mask: &Mask,
    rows: bool,
    sinks: Option<&Array>,
) -> Result<Array> {
    if shared.keys.dtype() == mlx_rs::Dtype::Uint32 {
        return Err(refused(
            "KV-shared layer over a quantized donor cache: mlx-lm cannot run this (its sharers take the unquantized SDPA)",
        ));
    }
    attend_with(q, &shared.keys, &shared.values, s, mask, rows, sinks)
}

/// What the layers of one attention window share in a forward pass: their
/// RoPE, this step's RoPE tables (one-token steps on the decode path, see
/// `decode`; `None` otherwise) and the mask.
pub struct WindowStep<'a> {
    pub rope: &'a Rope,
    pub tables: Option<&'a RopeTables>,
    pub mask: &'a Mask,
}

impl<'a> WindowStep<'a> {
    pub fn new(rope: &'a Rope, tables: Option<&'a RopeTables>, mask: &'a Mask) -> Self {
        WindowStep { rope, tables, mask }
    }
}

/// The K/V layer `donor` of model `model` computed in this forward, for a
/// later layer that reads it (`shared_kv`).
pub fn donor_kv<'a>(
    computed: &'a [Option<SharedKv>],
    donor: usize,
    model: &str,
) -> Result<&'a SharedKv> {
    computed
        .get(donor)
        .and_then(Option::as_ref)
        .ok_or_else(|| refused(&format!("{model}: layer {donor} computed no K/V to share")))
}

/// The mask of one window kind, from the cache of the first layer of that
/// kind, before any cache update (`_make_masks`, `create_attention_mask`).
pub fn mask_for(cache: &LayerCache, n: i32, window: i32) -> Result<Mask> {
    match cache {
        LayerCache::Full(c) => Ok(c.make_mask(n)),
        LayerCache::Sliding(c) => c.make_mask(n, window),
        LayerCache::Quantized(c) => Ok(c.make_mask(n)),
        LayerCache::QuantizedAfterForward(c) => Ok(c.make_mask(n)),
    }
}

// ---- Feed-forward

/// Gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Flat)]
#[flat(key(match self.activation {
    Activation::GeluApprox => 0,
    Activation::Silu => 1,
    Activation::GeluApproxThenMultiply => 2,
    Activation::ClampedSwiglu => 3,
}))]
pub struct Mlp {
    pub gate_up: GateUp,
    pub down_proj: Linear,
    #[flat(copied)]
    pub activation: Activation,
}

/// The gate and up projections of a gated MLP (IR `GateUpProjection`).
#[derive(Debug, Clone)]
pub enum GateUp {
    /// `gate_proj` and `up_proj`: a matmul each.
    Separate { gate_proj: Linear, up_proj: Linear },
    /// `gate_up_proj` `[2 * width, hidden]`: one matmul, split in halves
    /// along the last axis, the gate first (`mx.split(x, 2, axis=-1)`).
    Fused { gate_up_proj: Linear },
    /// A checkpoint's separate `gate_proj` and `up_proj` stacked for the
    /// GPU path's one-token steps (lever `gpu-stacked-projections`,
    /// [`crate::device::stacked_projections`]): the compiled decode blocks
    /// read `gate_up_proj` as [`GateUp::Fused`]; everything else (prefill)
    /// reads `gate_proj` and `up_proj`, row views of the same buffer.
    Stacked {
        gate_up_proj: Linear,
        gate_proj: Linear,
        up_proj: Linear,
    },
}

impl Mlp {
    /// [`Linear::pretranspose`] on the projections (generated models);
    /// with the `gpu-stacked-projections` lever, separate gate and up
    /// projections become [`GateUp::Stacked`] first.
    pub fn pretranspose(&mut self) {
        if crate::device::stacked_projections() {
            self.stack_gate_up();
        }
        match &mut self.gate_up {
            GateUp::Separate { gate_proj, up_proj } => pretranspose_all([gate_proj, up_proj]),
            GateUp::Fused { gate_up_proj } => gate_up_proj.pretranspose(),
            // Pretransposed when stacked.
            GateUp::Stacked { .. } => {}
        }
        self.down_proj.pretranspose();
    }

    /// Separate gate and up projections as [`GateUp::Stacked`]; left as they
    /// are where they cannot stack ([`crate::layers::stack_rows`]).
    fn stack_gate_up(&mut self) {
        let GateUp::Separate { gate_proj, up_proj } = &self.gate_up else {
            return;
        };
        if let Some((gate_up_proj, views)) = crate::layers::stack_rows(&[gate_proj, up_proj]) {
            if let Ok([gate_proj, up_proj]) = <[Linear; 2]>::try_from(views) {
                self.gate_up = GateUp::Stacked {
                    gate_up_proj,
                    gate_proj,
                    up_proj,
                };
                crate::device::count_outcome(crate::device::LeverOutcome::StackedGateUp);
            }
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (gate, up) = self.gate_and_up(x)?;
        self.down(&self.activate(&gate, &up)?)
    }

    /// `gate(x)` and `up(x)`: two matmuls, or the halves of one.
    pub fn gate_and_up(&self, x: &Array) -> Result<(Array, Array)> {
        match &self.gate_up {
            GateUp::Separate { gate_proj, up_proj }
            | GateUp::Stacked {
                gate_proj, up_proj, ..
            } => Ok((gate_proj.forward(x)?, up_proj.forward(x)?)),
            GateUp::Fused { gate_up_proj } => {
                let halves = gate_up_proj.forward(x)?.split_equal(2, -1)?;
                let [gate, up] = <[Array; 2]>::try_from(halves)
                    .map_err(|_| refused("gate_up_proj: split in two gave another count"))?;
                Ok((gate, up))
            }
        }
    }

    /// The gate's activation times `up`, as the family's mlx-lm module
    /// computes it (a compiled helper of its own where mlx-lm has one).
    pub fn activate(&self, gate: &Array, up: &Array) -> Result<Array> {
        match self.activation {
            Activation::GeluApprox => geglu(gate, up),
            Activation::GeluApproxThenMultiply => gelu_approx_times(gate, up),
            Activation::Silu => swiglu(gate, up),
            Activation::ClampedSwiglu => swiglu_oai(gate, up),
        }
    }

    /// `down(act)`, summed over ranks when the model is sharded.
    pub fn down(&self, act: &Array) -> Result<Array> {
        sharded_to_all(self.down_proj.forward(act)?)
    }
}

/// The RMSNorm weights of a layer, by arrangement (IR `NormArrangement`).
#[derive(Debug, Clone)]
pub enum LayerNorms {
    /// Before the mixer and before the feed-forward half (mlx-lm calls the
    /// second one `post_attention_layernorm`).
    PreNorm { input: Array, ffn: Array },
    /// Before and after the mixer, before and after the feed-forward half.
    Sandwich {
        input: Array,
        post_attention: Array,
        pre_feedforward: Array,
        post_feedforward: Array,
    },
}

impl LayerNorms {
    /// The norm before the mixer.
    pub fn input(&self) -> &Array {
        match self {
            LayerNorms::PreNorm { input, .. } | LayerNorms::Sandwich { input, .. } => input,
        }
    }
}

/// Which arrangement to load (IR `NormArrangement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormArrangement {
    PreNorm,
    Sandwich,
}

/// The RMSNorm weights of a post-norm layer (IR `NormArrangement::PostNorm`,
/// olmo2's `TransformerBlock`): one after the mixer, one after the MLP, none
/// before either. A type of its own rather than a [`LayerNorms`] variant:
/// every `LayerNorms` has the norm before the mixer that
/// [`LayerNorms::input`] hands to generated files.
#[derive(Debug, Clone)]
pub struct PostNorms {
    pub post_attention: Array,
    pub post_feedforward: Array,
}

/// A post-norm layer's mixer output into the residual stream:
/// `x + post_attention_layernorm(a)`.
pub fn post_norm_attention_residual(
    x: &Array,
    a: &Array,
    norms: &PostNorms,
    eps: f32,
) -> Result<Array> {
    x.add(rms_norm(a, Some(&norms.post_attention), eps)?)
}

/// A post-norm layer's feed-forward half: the MLP reads the residual stream
/// itself, `h + post_feedforward_layernorm(mlp(h))`.
pub fn post_norm_feed_forward(h: &Array, norms: &PostNorms, mlp: &Mlp, eps: f32) -> Result<Array> {
    h.add(rms_norm(
        &mlp.forward(h)?,
        Some(&norms.post_feedforward),
        eps,
    )?)
}

/// `layers.{i}.` norms of a post-norm layer, their weights as the norms
/// apply them.
pub fn load_post_norms(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    weight: NormWeight,
) -> PostNorms {
    let mut norm = |name: &str| layer_norm(w, layer, name, hidden, weight);
    PostNorms {
        post_attention: norm("post_attention_layernorm"),
        post_feedforward: norm("post_feedforward_layernorm"),
    }
}

/// Routed experts beside the dense MLP (IR `FeedForward::MlpAndMoe`): router,
/// experts and the three norms of the two branches.
#[derive(Debug, Clone, Flat)]
pub struct MoeBlock {
    pub router: Router,
    pub experts: SwitchGlu,
    pub pre_feedforward_2: Array,
    pub post_feedforward_1: Array,
    pub post_feedforward_2: Array,
}

impl MoeBlock {
    /// [`Linear::pretranspose`] on the router's projection (generated models).
    pub fn pretranspose(&mut self) {
        self.router.proj.pretranspose();
    }
}

/// Routed experts in place of the dense MLP (IR `FeedForward::Moe` with the
/// softmax-then-top-k router): Qwen3-MoE's `Qwen3MoeSparseMoeBlock`, its
/// router `mlp.gate` and SwiGLU experts `mlp.switch_mlp`.
#[derive(Debug, Clone, Flat)]
pub struct SparseMoe {
    pub router: SoftmaxTopKRouter,
    pub experts: SwitchGlu,
}

impl SparseMoe {
    /// [`Linear::pretranspose`] on the router's projection (generated models).
    pub fn pretranspose(&mut self) {
        self.router.gate.pretranspose();
    }

    /// Route, run the chosen experts, sum them weighted by their scores
    /// (under tensor parallelism each rank's experts hold a slice of the
    /// width, and the block's output is summed over the ranks, as
    /// `Qwen3MoeSparseMoeBlock` does with its `sharding_group`).
    pub fn forward(&self, x: &Array) -> Result<Array> {
        sharded_to_all(softmax_topk_moe(&self.router, &self.experts, x)?)
    }
}

/// Routed experts behind the sigmoid group router plus ungated shared
/// experts (IR `FeedForward::MoeAndSharedExperts`): glm4_moe's `MoE`, its
/// router `mlp.gate` (`weight`, `e_score_correction_bias`), SwiGLU experts
/// `mlp.switch_mlp` and the shared experts' MLP `mlp.shared_experts`.
#[derive(Debug, Clone, Flat)]
pub struct GroupRoutedMoe {
    pub router: SigmoidGroupRouter,
    pub experts: SwitchGlu,
    pub shared_experts: Mlp,
}

impl GroupRoutedMoe {
    /// [`Linear::pretranspose`] on the dense projections (generated models).
    pub fn pretranspose(&mut self) {
        self.router.gate.pretranspose();
        self.shared_experts.pretranspose();
    }

    /// `y = experts(x) + shared_experts(x)`. The shared experts' own down
    /// projection, not `Mlp::down`: under tensor parallelism they are split
    /// in place (`shard_inplace`) and the block's sum goes over the ranks
    /// once, as glm4_moe's `MoE` does with its `sharding_group`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let routed = sigmoid_group_moe(&self.router, &self.experts, x)?;
        let e = &self.shared_experts;
        let (g, u) = e.gate_and_up(x)?;
        let shared = e.down_proj.forward(&e.activate(&g, &u)?)?;
        sharded_to_all(routed.add(&shared)?)
    }
}

/// A block of routed experts that takes the place of a layer's dense MLP.
pub trait RoutedExperts {
    /// What a sandwich layer with these experts would be, for its refusal.
    const IN_A_SANDWICH: &'static str;
    /// The block's output for the normed residual stream `x`.
    fn route(&self, x: &Array) -> Result<Array>;
}

impl RoutedExperts for SparseMoe {
    const IN_A_SANDWICH: &'static str = "routed experts in place of the MLP in a sandwich layer";
    fn route(&self, x: &Array) -> Result<Array> {
        self.forward(x)
    }
}

impl RoutedExperts for GroupRoutedMoe {
    const IN_A_SANDWICH: &'static str = "routed experts with shared experts in a sandwich layer";
    fn route(&self, x: &Array) -> Result<Array> {
        self.forward(x)
    }
}

/// The feed-forward half of a pre-norm layer whose MLP is replaced by routed
/// experts: `h + moe(post_attention_layernorm(h))` (`Qwen3MoeDecoderLayer`,
/// glm4_moe's and Qwen3.5's `DecoderLayer`). Returns the layer output before
/// the per-layer input gate; a sandwich layer is refused.
pub fn experts_feed_forward<E: RoutedExperts>(
    h: &Array,
    norms: &LayerNorms,
    moe: &E,
    eps: f32,
) -> Result<Array> {
    match norms {
        LayerNorms::PreNorm { ffn, .. } => h.add(moe.route(&rms_norm(h, Some(ffn), eps)?)?),
        LayerNorms::Sandwich { .. } => Err(refused(&format!(
            "{}: no runtime block runs this arrangement yet",
            E::IN_A_SANDWICH
        ))),
    }
}

/// Routed experts with biases in place of the dense MLP (IR
/// `FeedForward::BiasedExperts`): gpt_oss's `MLPBlock`, its biased router
/// `mlp.router` and SwitchGLU experts `mlp.experts` with a bias on each
/// projection and the clamped SwiGLU.
#[derive(Debug, Clone, Flat)]
pub struct BiasedExpertsMoe {
    pub router: TopKSoftmaxRouter,
    pub experts: SwitchGlu,
}

impl BiasedExpertsMoe {
    /// [`Linear::pretranspose`] on the router's projection (generated models).
    pub fn pretranspose(&mut self) {
        self.router.router.pretranspose();
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        biased_experts_moe(&self.router, &self.experts, x)
    }
}

/// gpt_oss's `TransformerBlock` adds `mlp(post_attention_layernorm(h))`
/// to `h` as the other routed experts do ([`experts_feed_forward`]).
impl RoutedExperts for BiasedExpertsMoe {
    const IN_A_SANDWICH: &'static str = "routed experts with biases in a sandwich layer";
    fn route(&self, x: &Array) -> Result<Array> {
        self.forward(x)
    }
}

/// Mixer output into the residual stream: `x + a` (pre-norm) or
/// `x + post_attention_norm(a)` (sandwich), added in the layer's
/// [`Residual`] form.
pub fn attention_residual(
    x: &Array,
    a: &Array,
    norms: &LayerNorms,
    eps: f32,
    residual: Residual<'_>,
) -> Result<Array> {
    match norms {
        LayerNorms::PreNorm { .. } => residual.add(x, a.clone()),
        LayerNorms::Sandwich { post_attention, .. } => {
            residual.add(x, rms_norm(a, Some(post_attention), eps)?)
        }
    }
}

/// The feed-forward half after the mixer: `h` is the residual stream after
/// the mixer, the branch added in the layer's [`Residual`] form. Returns the
/// layer output before the per-layer input gate.
pub fn feed_forward(
    h: &Array,
    norms: &LayerNorms,
    mlp: &Mlp,
    moe: Option<&MoeBlock>,
    eps: f32,
    residual: Residual<'_>,
) -> Result<Array> {
    match norms {
        LayerNorms::PreNorm { .. } => {
            if moe.is_some() {
                return Err(refused(
                    "routed experts beside the MLP in a pre-norm layer: no runtime block runs this arrangement yet",
                ));
            }
            let f = mlp.forward(&mlp_input(h, norms, eps)?)?;
            mlp_residual(h, &f, norms, eps, residual)
        }
        LayerNorms::Sandwich {
            pre_feedforward,
            post_feedforward,
            ..
        } => {
            let f = match moe {
                None => {
                    let f = mlp.forward(&mlp_input(h, norms, eps)?)?;
                    return mlp_residual(h, &f, norms, eps, residual);
                }
                Some(m) => {
                    let h1 = mlp.forward(&rms_norm(h, Some(pre_feedforward), eps)?)?;
                    let h1 = rms_norm(&h1, Some(&m.post_feedforward_1), eps)?;
                    let (idx, w) = m.router.route(h)?;
                    let h2 = rms_norm(h, Some(&m.pre_feedforward_2), eps)?;
                    let h2 = experts(&m.experts, &h2, &idx, &w)?;
                    let h2 = rms_norm(&h2, Some(&m.post_feedforward_2), eps)?;
                    h1.add(&h2)?
                }
            };
            residual.add(h, rms_norm(&f, Some(post_feedforward), eps)?)
        }
    }
}

/// The MLP's input: `h` after the norm in front of the feed-forward half
/// (`ffn` before a pre-norm MLP, `pre_feedforward` in a sandwich).
pub fn mlp_input(h: &Array, norms: &LayerNorms, eps: f32) -> Result<Array> {
    match norms {
        LayerNorms::PreNorm { ffn, .. } => rms_norm(h, Some(ffn), eps),
        LayerNorms::Sandwich {
            pre_feedforward, ..
        } => rms_norm(h, Some(pre_feedforward), eps),
    }
}

/// `h` plus the MLP's output `f` (after `post_feedforward` in a sandwich),
/// added in the layer's [`Residual`] form.
pub fn mlp_residual(
    h: &Array,
    f: &Array,
    norms: &LayerNorms,
    eps: f32,
    residual: Residual<'_>,
) -> Result<Array> {
    match norms {
        LayerNorms::PreNorm { .. } => residual.add(h, f.clone()),
        LayerNorms::Sandwich {
            post_feedforward, ..
        } => residual.add(h, rms_norm(f, Some(post_feedforward), eps)?),
    }
}

// ---- Per-layer inputs and the layer scalar

/// Per-layer inputs (`_get_per_layer_inputs` + `_project_per_layer_inputs`):
/// returns [B, L, layers, width]; layer i reads `[:, :, i, :]`.
#[allow(clippy::too_many_arguments)]
pub fn per_layer_inputs(
    ids: &Array,
    h: &Array,
    p: &PerLayerInputs,
    layers: i32,
    width: i32,
    hidden: i32,
    eps: f32,
) -> Result<Array> {
    let tok = multiply_weak(&p.embed.lookup(ids)?, (width as f64).powf(0.5))?;
    let tok = mlx_rs::ops::unflatten(&tok, -1, &[layers, width])?;
    let proj = multiply_weak(&p.model_projection.forward(h)?, (hidden as f64).powf(-0.5))?;
    let proj = mlx_rs::ops::unflatten(&proj, -1, &[layers, width])?;
    let proj = rms_norm(&proj, Some(&p.projection_norm), eps)?;
    multiply_weak(&proj.add(&tok)?, 2f64.powf(-0.5))
}

/// `per_layer_inputs[:, :, i, :]`.
pub fn per_layer_slice(all: &Array, i: i32) -> Result<Array> {
    use mlx_rs::ops::indexing::TryIndexOp;
    all.try_index((.., .., i, ..))
}

/// The per-layer input gate of one layer.
#[derive(Debug, Clone, Flat)]
pub struct PleGate {
    pub gate: Linear,
    pub projection: Linear,
    pub post_norm: Array,
}

impl PleGate {
    /// [`Linear::pretranspose`] on the projections (generated models).
    pub fn pretranspose(&mut self) {
        pretranspose_all([&mut self.gate, &mut self.projection]);
    }
}

/// Model-level per-layer-input parameters.
#[derive(Debug, Clone)]
pub struct PerLayerInputs {
    pub embed: Embedding,
    pub model_projection: Linear,
    pub projection_norm: Array,
}

impl PerLayerInputs {
    /// [`Linear::pretranspose`] on the projection (generated models).
    pub fn pretranspose(&mut self) {
        self.model_projection.pretranspose();
    }
}

/// The per-layer input gate after the feed-forward residual, then the layer
/// scalar; either may be absent.
pub fn finish_layer(
    h: &Array,
    ple: Option<(&PleGate, &Array)>,
    layer_scalar: Option<&Array>,
    eps: f32,
) -> Result<Array> {
    let h = match ple {
        None => h.clone(),
        Some((g, input)) => {
            let gate = gelu_approx_compiled(&g.gate.forward(h)?)?;
            let gate = gate.multiply(input)?;
            let gate = g.projection.forward(&gate)?;
            let gate = rms_norm(&gate, Some(&g.post_norm), eps)?;
            h.add(&gate)?
        }
    };
    match layer_scalar {
        None => Ok(h),
        Some(s) => h.multiply(s),
    }
}

// ---- Loading: tensor names relative to the text model, as
// `archgen_ir::names` spells them for the checkpoint contract.

/// `layers.{i}.` norms of the arrangement.
pub fn load_norms(w: &mut Weights, layer: usize, hidden: i32, a: NormArrangement) -> LayerNorms {
    load_norms_weighted(w, layer, hidden, a, NormWeight::Direct)
}

/// `layers.{i}.` norms of the arrangement, their weights as the norms
/// apply them.
pub fn load_norms_weighted(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    a: NormArrangement,
    weight: NormWeight,
) -> LayerNorms {
    let mut norm = |name: &str| layer_norm(w, layer, name, hidden, weight);
    match a {
        NormArrangement::PreNorm => LayerNorms::PreNorm {
            input: norm("input_layernorm"),
            ffn: norm("post_attention_layernorm"),
        },
        NormArrangement::Sandwich => LayerNorms::Sandwich {
            input: norm("input_layernorm"),
            post_attention: norm("post_attention_layernorm"),
            pre_feedforward: norm("pre_feedforward_layernorm"),
            post_feedforward: norm("post_feedforward_layernorm"),
        },
    }
}

/// The RMSNorm weight `layers.{layer}.{name}.weight` `[hidden]`.
fn layer_norm(w: &mut Weights, layer: usize, name: &str, hidden: i32, weight: NormWeight) -> Array {
    load_norm_weight(w, &format!("layers.{layer}.{name}.weight"), hidden, weight)
}

/// One RMSNorm weight `[width]` as the norm applies it.
pub fn load_norm_weight(w: &mut Weights, name: &str, width: i32, weight: NormWeight) -> Array {
    match weight {
        NormWeight::Direct => w.param(name, &[width]),
        NormWeight::OnePlus => w.param_one_plus(name, &[width]),
    }
}

/// `layers.{i}.self_attn` without K/V projections (every layer has these).
pub fn load_attention(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    s: AttentionShape,
    qk: QkNorm,
) -> AttentionWeights {
    let (p, (q_out, _)) = (self_attn_prefix(layer), s.projection_widths());
    AttentionWeights {
        q_proj: w.linear(&format!("{p}.q_proj"), q_out, hidden),
        o_proj: w.linear(&format!("{p}.o_proj"), hidden, q_out),
        q_norm: load_qk_norm(w, &format!("{p}.q_norm.weight"), qk, s.n_heads, s.head_dim),
        kv: None,
        sinks: match s.scores {
            Scores::FusedSdpaWithSinks => Some(w.param(&format!("{p}.sinks"), &[s.n_heads])),
            Scores::FusedSdpa | Scores::Softcapped { .. } => None,
        },
    }
}

/// K/V projections (and the key norm) of a layer that owns its K/V.
pub fn load_kv(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    s: AttentionShape,
    qk: QkNorm,
    values: Values,
) -> KvWeights {
    let (p, (_, out)) = (self_attn_prefix(layer), s.projection_widths());
    KvWeights {
        k_proj: w.linear(&format!("{p}.k_proj"), out, hidden),
        v_proj: match values {
            Values::Projected => Some(w.linear(&format!("{p}.v_proj"), out, hidden)),
            Values::SameAsKeys => None,
        },
        k_norm: load_qk_norm(
            w,
            &format!("{p}.k_norm.weight"),
            qk,
            s.n_kv_heads,
            s.head_dim,
        ),
    }
}

/// A query or key norm of `heads` heads as `qk` says, or none.
fn load_qk_norm(
    w: &mut Weights,
    name: &str,
    qk: QkNorm,
    heads: i32,
    head_dim: i32,
) -> Option<QkNormWeight> {
    match qk {
        QkNorm::None => None,
        QkNorm::RmsPerHead => Some(QkNormWeight::PerHead(w.param(name, &[head_dim]))),
        QkNorm::RmsPerHeadOnePlus => {
            Some(QkNormWeight::PerHead(w.param_one_plus(name, &[head_dim])))
        }
        QkNorm::RmsWholeProjection => Some(QkNormWeight::WholeProjection(
            w.param(name, &[heads * head_dim]),
        )),
    }
}

/// The biases of `layers.{i}.self_attn`'s projections, put on the loaded
/// linears (`kv` is `None` on a layer that reads a donor's K/V).
pub fn load_biases(
    w: &mut Weights,
    layer: usize,
    bias: ProjectionBias,
    attn: &mut AttentionWeights,
    kv: Option<&mut KvWeights>,
    s: AttentionShape,
) {
    let p = self_attn_prefix(layer);
    match bias {
        ProjectionBias::None => {}
        ProjectionBias::QueryKeyValue | ProjectionBias::QueryKeyValueOutput => {
            let (q, k) = s.projection_widths();
            attn.q_proj.bias = Some(w.param(&format!("{p}.q_proj.bias"), &[q]));
            match bias {
                ProjectionBias::QueryKeyValueOutput => {
                    // o_proj's rows: the model's width (packed or not).
                    let hidden = attn.o_proj.weight.shape()[0];
                    attn.o_proj.bias = Some(w.param(&format!("{p}.o_proj.bias"), &[hidden]));
                }
                ProjectionBias::None | ProjectionBias::QueryKeyValue => {}
            }
            if let Some(kv) = kv {
                kv.k_proj.bias = Some(w.param(&format!("{p}.k_proj.bias"), &[k]));
                if let Some(v) = &mut kv.v_proj {
                    v.bias = Some(w.param(&format!("{p}.v_proj.bias"), &[k]));
                }
            }
        }
    }
}

/// `layers.{i}.mlp` of the given width.
pub fn load_mlp(w: &mut Weights, layer: usize, hidden: i32, width: i32, act: Activation) -> Mlp {
    load_mlp_projected(w, layer, hidden, width, act, GateUpProjection::Separate)
}

/// `layers.{i}.mlp` of the given width with its gate and up projections
/// separate or fused.
pub fn load_mlp_projected(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    width: i32,
    act: Activation,
    projection: GateUpProjection,
) -> Mlp {
    load_mlp_at(w, &mlp_prefix(layer), hidden, width, act, projection)
}

/// The MLP under `prefix`: gate and up projections (separate or fused) to
/// `width`, then the down projection back to `hidden`. A layer's own MLP
/// and the shared experts beside routed ones are this one block under
/// another prefix, so they load through one function.
pub(crate) fn load_mlp_at(
    w: &mut Weights,
    prefix: &str,
    hidden: i32,
    width: i32,
    act: Activation,
    projection: GateUpProjection,
) -> Mlp {
    Mlp {
        gate_up: match projection {
            GateUpProjection::Separate => GateUp::Separate {
                gate_proj: w.linear(&format!("{prefix}.gate_proj"), width, hidden),
                up_proj: w.linear(&format!("{prefix}.up_proj"), width, hidden),
            },
            GateUpProjection::Fused => GateUp::Fused {
                gate_up_proj: w.linear(&format!("{prefix}.gate_up_proj"), 2 * width, hidden),
            },
        },
        down_proj: w.linear(&format!("{prefix}.down_proj"), hidden, width),
        activation: act,
    }
}

/// Router (scaled top-k softmax), experts and the branch norms of an
/// MLP-and-MoE layer.
pub fn load_moe(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    shape: ExpertsShape,
    eps: f32,
) -> MoeBlock {
    let experts = shape.count;
    let p = format!("layers.{layer}");
    let norm = |w: &mut Weights, n: &str| w.param(&format!("{p}.{n}.weight"), &[hidden]);
    MoeBlock {
        pre_feedforward_2: norm(w, "pre_feedforward_layernorm_2"),
        post_feedforward_1: norm(w, "post_feedforward_layernorm_1"),
        post_feedforward_2: norm(w, "post_feedforward_layernorm_2"),
        router: Router {
            proj: w.linear(&format!("{p}.router.proj"), experts, hidden),
            scale: w.param(&format!("{p}.router.scale"), &[hidden]),
            per_expert_scale: w.param(&format!("{p}.router.per_expert_scale"), &[experts]),
            top_k: shape.top_k,
            hidden,
            eps,
        },
        experts: load_switch_glu(w, &format!("{p}.experts.switch_glu"), hidden, shape),
    }
}

/// The SwiGLU experts under `prefix`: `shape.count` stacked gate, up and
/// down projections between `hidden` and `shape.width`. It takes the whole
/// [`ExpertsShape`] so that each routed-experts loader hands its shape on
/// instead of unpacking it for this call.
fn load_switch_glu(w: &mut Weights, prefix: &str, hidden: i32, shape: ExpertsShape) -> SwitchGlu {
    let (experts, width) = (shape.count, shape.width);
    SwitchGlu {
        gate_proj: w.switch_linear(&format!("{prefix}.gate_proj"), experts, width, hidden),
        up_proj: w.switch_linear(&format!("{prefix}.up_proj"), experts, width, hidden),
        down_proj: w.switch_linear(&format!("{prefix}.down_proj"), experts, hidden, width),
    }
}

/// Router (`mlp.gate`, softmax then top-k) and SwiGLU experts
/// (`mlp.switch_mlp`) of a layer whose MLP they replace.
pub fn load_sparse_moe(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    shape: ExpertsShape,
    probs: TopKProbs,
) -> SparseMoe {
    let p = mlp_prefix(layer);
    SparseMoe {
        router: SoftmaxTopKRouter {
            gate: w.linear(&format!("{p}.gate"), shape.count, hidden),
            top_k: shape.top_k,
            probs,
        },
        experts: load_switch_glu(w, &format!("{p}.switch_mlp"), hidden, shape),
    }
}

/// gpt_oss's `layers.{i}.mlp`: the biased router `mlp.router` and the
/// SwitchGLU experts `mlp.experts`, each projection with its
/// `[experts, out]` bias.
pub fn load_biased_experts_moe(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    shape: ExpertsShape,
) -> BiasedExpertsMoe {
    let ExpertsShape {
        count: experts,
        top_k,
        width,
    } = shape;
    let p = mlp_prefix(layer);
    let mut router = w.linear(&format!("{p}.router"), experts, hidden);
    router.bias = Some(w.param(&format!("{p}.router.bias"), &[experts]));
    let e = format!("{p}.experts");
    let mut glu = load_switch_glu(w, &e, hidden, shape);
    for (name, proj, out) in [
        ("gate_proj", &mut glu.gate_proj, width),
        ("up_proj", &mut glu.up_proj, width),
        ("down_proj", &mut glu.down_proj, hidden),
    ] {
        proj.bias = Some(w.param(&format!("{e}.{name}.bias"), &[experts, out]));
    }
    BiasedExpertsMoe {
        router: TopKSoftmaxRouter { router, top_k },
        experts: glu,
    }
}

/// glm4_moe's `layers.{i}.mlp` of an MoE layer: the router's `gate.weight`
/// (a plain parameter, unquantized) and float32 `gate.e_score_correction_bias`,
/// SwiGLU experts `switch_mlp` and the shared experts' MLP `shared_experts`
/// of `shared_width`.
pub fn load_group_routed_moe(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    shape: ExpertsShape,
    shared_width: i32,
    facts: GroupTopK,
) -> GroupRoutedMoe {
    let experts = shape.count;
    let p = mlp_prefix(layer);
    GroupRoutedMoe {
        router: SigmoidGroupRouter {
            gate: Linear {
                weight: w.param(&format!("{p}.gate.weight"), &[experts, hidden]),
                quant: None,
                weight_t: None,
                bias: None,
            },
            correction_bias: w.param(&format!("{p}.gate.e_score_correction_bias"), &[experts]),
            facts,
        },
        experts: load_switch_glu(w, &format!("{p}.switch_mlp"), hidden, shape),
        shared_experts: load_mlp_at(
            w,
            &format!("{p}.shared_experts"),
            hidden,
            shared_width,
            Activation::Silu,
            GateUpProjection::Separate,
        ),
    }
}

/// The per-layer input gate of layer `i`.
pub fn load_ple_gate(w: &mut Weights, layer: usize, hidden: i32, width: i32) -> PleGate {
    let p = format!("layers.{layer}");
    PleGate {
        gate: w.linear(&format!("{p}.per_layer_input_gate"), width, hidden),
        projection: w.linear(&format!("{p}.per_layer_projection"), hidden, width),
        post_norm: w.param(&format!("{p}.post_per_layer_input_norm.weight"), &[hidden]),
    }
}

/// `layers.{i}.layer_scalar`.
pub fn load_layer_scalar(w: &mut Weights, layer: usize) -> Array {
    w.param(&format!("layers.{layer}.layer_scalar"), &[1])
}

pub fn load_per_layer_inputs(
    w: &mut Weights,
    layers: i32,
    width: i32,
    vocab: i32,
    hidden: i32,
) -> PerLayerInputs {
    PerLayerInputs {
        embed: w.embedding("embed_tokens_per_layer", vocab, layers * width),
        model_projection: w.linear("per_layer_model_projection", layers * width, hidden),
        projection_norm: w.param("per_layer_projection_norm.weight", &[width]),
    }
}
