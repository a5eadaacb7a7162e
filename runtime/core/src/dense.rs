//! Dense decoder blocks (Qwen3 `qwen3.py`, Llama `llama.py`), op for op as
//! mlx-lm 0.32.2 runs them:
//!
//! ```text
//! h = x + o_proj(attn(rope(q_norm?(q)), rope(k_norm?(k)), v))   on input_layernorm(x)
//! out = h + down(swiglu(gate(n), up(n)))                         n = post_attention_layernorm(h)
//! ```
//!
//! The monolith composes these with run-time branches (q/k norm or not); generated
//! models call the same functions with every branch resolved.

use std::collections::HashMap;

use mlx_rs::Array;

use crate::attention::{attend, batch_and_len, Mask};
use crate::cache::KvCache;
use crate::layers::{Embedding, Linear};
use crate::ops::{rms_norm, swiglu, Result};
use crate::rope::Rope;
use crate::weights::Weights;

/// The static shape of a layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub eps: f32,
    /// `head_dim ** -0.5` as the Python float mlx-lm passes (rounded to f32 by
    /// `mx.fast.scaled_dot_product_attention`).
    pub scale: f32,
}

impl Shape {
    pub fn new(n_heads: i32, n_kv_heads: i32, head_dim: i32, eps: f32) -> Self {
        Shape {
            n_heads,
            n_kv_heads,
            head_dim,
            eps,
            scale: (head_dim as f64).powf(-0.5) as f32,
        }
    }
}

/// Attention weights; `qk_norm` holds Qwen3's per-head `(q_norm, k_norm)`.
#[derive(Debug, Clone)]
pub struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub qk_norm: Option<(Array, Array)>,
}

/// SwiGLU MLP: `down(swiglu(gate(x), up(x)))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gate = self.gate_proj.forward(x)?;
        let up = self.up_proj.forward(x)?;
        self.down_proj.forward(&swiglu(&gate, &up)?)
    }
}

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct Layer {
    pub input_norm: Array,
    pub post_attention_norm: Array,
    pub attn: Attention,
    pub mlp: Mlp,
}

impl Layer {
    /// [`Linear::pretranspose`] on every projection (generated models).
    pub fn pretranspose(&mut self) {
        for l in [
            &mut self.attn.q_proj,
            &mut self.attn.k_proj,
            &mut self.attn.v_proj,
            &mut self.attn.o_proj,
            &mut self.mlp.gate_proj,
            &mut self.mlp.up_proj,
            &mut self.mlp.down_proj,
        ] {
            l.pretranspose();
        }
    }
}

/// Queries, keys, values [B, heads, L, head_dim] of `x` ([B, L, hidden], or
/// rows [B, hidden] in the decode blocks); Q and K through `rope`.
/// `QK_NORM` (Qwen3) applies the per-head RMSNorm to queries and keys; it is a
/// const parameter so a generated model resolves it at compile time.
pub fn project<const QK_NORM: bool>(
    x: &Array,
    a: &Attention,
    s: Shape,
    rope: &dyn Fn(&Array) -> Result<Array>,
) -> Result<[Array; 3]> {
    let (b, l) = batch_and_len(x);
    let heads = |p: &Linear, n: i32| p.forward(x)?.reshape(&[b, l, n, s.head_dim]);
    let q = heads(&a.q_proj, s.n_heads)?;
    let k = heads(&a.k_proj, s.n_kv_heads)?;
    let v = heads(&a.v_proj, s.n_kv_heads)?;
    let (q, k) = if QK_NORM {
        let (qn, kn) = a.qk_norm.as_ref().ok_or_else(|| {
            mlx_rs::error::Exception::custom("q/k norm weights were not loaded for this layer")
        })?;
        (
            rms_norm(&q, Some(qn), s.eps)?,
            rms_norm(&k, Some(kn), s.eps)?,
        )
    } else {
        (q, k)
    };
    let t = |a: Array| a.transpose_axes(&[0, 2, 1, 3]);
    Ok([rope(&t(q)?)?, rope(&t(k)?)?, t(v)?])
}

/// Self-attention over the layer's cache (updated here), then `o_proj`.
pub fn attention<const QK_NORM: bool>(
    x: &Array,
    a: &Attention,
    s: Shape,
    rope: &Rope,
    cache: &mut KvCache,
    mask: &Mask,
) -> Result<Array> {
    let offset = Array::from_int(cache.offset);
    let [q, k, v] = project::<QK_NORM>(x, a, s, &|t| rope.apply(t, &offset))?;
    let (keys, values) = cache.update_and_fetch(&k, &v)?;
    a.o_proj
        .forward(&attend(&q, &keys, &values, s.scale, mask, false)?)
}

/// The second half of a layer: `h = x + r` (`r` the attention output), then
/// `h + mlp(post_attention_layernorm(h))`.
pub fn residual_and_mlp(
    x: &Array,
    r: &Array,
    post_norm: &Array,
    mlp: &Mlp,
    eps: f32,
) -> Result<Array> {
    let h = x.add(r)?;
    let m = mlp.forward(&rms_norm(&h, Some(post_norm), eps)?)?;
    h.add(&m)
}

/// A whole decoder layer (`TransformerBlock.__call__`).
pub fn layer<const QK_NORM: bool>(
    x: &Array,
    w: &Layer,
    s: Shape,
    rope: &Rope,
    cache: &mut KvCache,
    mask: &Mask,
) -> Result<Array> {
    let r = attention::<QK_NORM>(
        &rms_norm(x, Some(&w.input_norm), s.eps)?,
        &w.attn,
        s,
        rope,
        cache,
        mask,
    )?;
    residual_and_mlp(x, &r, &w.post_attention_norm, &w.mlp, s.eps)
}

pub use crate::layers::{logits, Head};

/// mlx-lm's `sanitize` for qwen3 / llama, then the `model.` prefix removed:
/// drops precomputed rotary frequencies and, when tied, `lm_head.weight`.
pub fn sanitize(tensors: HashMap<String, Array>, tied: bool) -> HashMap<String, Array> {
    tensors
        .into_iter()
        .filter(|(k, _)| !k.contains("self_attn.rotary_emb.inv_freq"))
        .filter(|(k, _)| !(tied && k == "lm_head.weight"))
        .map(|(k, v)| (k.strip_prefix("model.").map(str::to_string).unwrap_or(k), v))
        .collect()
}

// ---- Loading: the one place that knows the dense families' tensor names.

/// `layers.{i}`: norms, attention (with q/k norms when `qk_norm`), MLP.
pub fn load_layer(
    w: &mut Weights,
    layer: usize,
    hidden: i32,
    s: Shape,
    qk_norm: bool,
    mlp_width: i32,
) -> Layer {
    let p = format!("layers.{layer}");
    let a = format!("{p}.self_attn");
    let q_out = s.n_heads * s.head_dim;
    let kv_out = s.n_kv_heads * s.head_dim;
    Layer {
        input_norm: w.param(&format!("{p}.input_layernorm.weight"), &[hidden]),
        post_attention_norm: w.param(&format!("{p}.post_attention_layernorm.weight"), &[hidden]),
        attn: Attention {
            q_proj: w.linear(&format!("{a}.q_proj"), q_out, hidden),
            k_proj: w.linear(&format!("{a}.k_proj"), kv_out, hidden),
            v_proj: w.linear(&format!("{a}.v_proj"), kv_out, hidden),
            o_proj: w.linear(&format!("{a}.o_proj"), hidden, q_out),
            qk_norm: qk_norm.then(|| {
                (
                    w.param(&format!("{a}.q_norm.weight"), &[s.head_dim]),
                    w.param(&format!("{a}.k_norm.weight"), &[s.head_dim]),
                )
            }),
        },
        mlp: Mlp {
            gate_proj: w.linear(&format!("{p}.mlp.gate_proj"), mlp_width, hidden),
            up_proj: w.linear(&format!("{p}.mlp.up_proj"), mlp_width, hidden),
            down_proj: w.linear(&format!("{p}.mlp.down_proj"), hidden, mlp_width),
        },
    }
}

/// Embedding, final norm and (untied) head.
pub struct Outer {
    pub embed: Embedding,
    pub norm: Array,
    pub lm_head: Option<Linear>,
}

pub fn load_outer(w: &mut Weights, vocab: i32, hidden: i32, tied: bool) -> Outer {
    Outer {
        embed: w.embedding("embed_tokens", vocab, hidden),
        norm: w.param("norm.weight", &[hidden]),
        lm_head: (!tied).then(|| w.linear("lm_head", vocab, hidden)),
    }
}

impl Outer {
    pub fn head(&self) -> Head<'_> {
        match &self.lm_head {
            Some(l) => Head::Untied(l),
            None => Head::Tied(&self.embed),
        }
    }
}
