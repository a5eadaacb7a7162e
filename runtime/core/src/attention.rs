//! Masks and scaled dot-product attention, as mlx-lm builds them.

use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::Array;

use crate::ops::{scalar_like, Result};

/// What mlx-lm passes as `mask=`: nothing, the string "causal", or a bool array.
#[derive(Debug, Clone)]
pub enum Mask {
    None,
    Causal,
    Array(Array),
}

/// `create_causal_mask(N, offset, window_size)` from mlx-lm `base.py`:
/// bool [N, offset + N], query p sees keys k with p - window < k <= p.
pub fn causal_mask(n: i32, offset: i32, window: Option<i32>) -> Result<Array> {
    let rinds = mlx_rs::ops::arange::<i32, i32>(0, offset + n, 1)?;
    let linds = if offset != 0 {
        mlx_rs::ops::arange::<i32, i32>(offset, offset + n, 1)?
    } else {
        rinds.clone()
    };
    let linds = linds.expand_dims(1)?;
    let rinds = rinds.expand_dims(0)?;
    let mut mask = linds.ge(&rinds)?;
    if let Some(w) = window {
        mask = mask.logical_and(linds.lt(rinds.add(Array::from_int(w))?)?)?;
    }
    Ok(mask)
}

/// `mx.fast.scaled_dot_product_attention(q, k, v, scale, mask)`.
pub fn sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Mask) -> Result<Array> {
    match mask {
        Mask::None => mlx_rs::fast::scaled_dot_product_attention(q, k, v, scale, None, None),
        Mask::Causal => mlx_rs::fast::scaled_dot_product_attention(
            q,
            k,
            v,
            scale,
            ScaledDotProductAttentionMask::Causal,
            None,
        ),
        Mask::Array(m) => mlx_rs::fast::scaled_dot_product_attention(q, k, v, scale, m, None),
    }
}

/// `mx.fast.scaled_dot_product_attention(q, k, v, scale, mask, sinks)`:
/// `sinks` `[heads]`, one logit per query head that joins the softmax of
/// each of its rows and weighs no value (gpt_oss's `AttentionBlock`).
pub fn sdpa_with_sinks(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: &Mask,
    sinks: &Array,
) -> Result<Array> {
    match mask {
        Mask::None => mlx_rs::fast::scaled_dot_product_attention(q, k, v, scale, None, sinks),
        Mask::Causal => mlx_rs::fast::scaled_dot_product_attention(
            q,
            k,
            v,
            scale,
            ScaledDotProductAttentionMask::Causal,
            sinks,
        ),
        Mask::Array(m) => mlx_rs::fast::scaled_dot_product_attention(q, k, v, scale, m, sinks),
    }
}

/// `sdpa(q, k, v, scale, Mask::None)` for one query token (q [B, H, 1, D],
/// k/v [B, KV, L, D]) with the heads merged into rows [B, H * D]: the ops
/// of MLX's CPU fallback (`fast.cpp`), `scale * q`, `q @ k^T`, precise
/// softmax, `@ v`, except that grouped-query heads become `rep = H / KV`
/// rows of one matmul per KV head (q reshaped to [B, KV, rep, D]) instead of
/// `unflatten(q)` against `expand_dims(k)` and `expand_dims(v)` broadcast
/// over them: each score and output is the same dot product, computed by the
/// same kernel (checked byte for byte against `fast.scaled_dot_product_attention`
/// in `tests/decode_blocks.rs`, up to 2,048 keys). 7 graph nodes instead of
/// the fallback's 12 plus the transpose and reshape that merge the heads.
pub fn sdpa_one_token(q: &Array, k: &Array, v: &Array, scale: f32) -> Result<Array> {
    let (b, h, d) = (q.shape()[0], q.shape()[1], q.shape()[3]);
    let kv = k.shape()[1];
    let q = scalar_like(scale as f64, q).multiply(q)?;
    let q = q.reshape(&[b, kv, h / kv, d])?;
    let scores = q.matmul(k.swap_axes(-1, -2)?)?;
    let p = mlx_rs::ops::softmax_axis(&scores, -1, true)?;
    p.matmul(v)?.reshape(&[b, h * d])
}

/// (B, L) of hidden states [B, L, hidden]; [B, hidden] is one token per
/// row (the compiled decode blocks use that form: a 2-D matmul is one node,
/// a 3-D one is flatten + matmul + unflatten around the same kernel).
pub fn batch_and_len(x: &Array) -> (i32, i32) {
    let s = x.shape();
    if s.len() == 2 {
        (s[0], 1)
    } else {
        (s[0], s[1])
    }
}

/// The shape attention's heads are merged into: [B, L, H*D], or [B*L, H*D]
/// rows (`rows`, the compiled decode blocks' form).
pub fn merged(b: i32, l: i32, rows: bool) -> Vec<i32> {
    if rows {
        vec![b * l, -1]
    } else {
        vec![b, l, -1]
    }
}

/// Attention of `q` [B, H, L, D] over `k`, `v`, heads merged back for
/// `o_proj` ([`merged`]); one unmasked token in the rows form takes
/// [`sdpa_one_token`] (every one-token step over a cache, which has no mask).
pub fn attend(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: &Mask,
    rows: bool,
) -> Result<Array> {
    let (b, l) = (q.shape()[0], q.shape()[2]);
    if rows && l == 1 && matches!(mask, Mask::None) && crate::device::one_token_sdpa() {
        return sdpa_one_token(q, k, v, scale);
    }
    sdpa(q, k, v, scale, mask)?
        .transpose_axes(&[0, 2, 1, 3])?
        .reshape(&merged(b, l, rows))
}

/// `mx.finfo(dtype).min` as the Python float mlx-lm passes to `mx.where`.
pub fn finfo_min(dtype: mlx_rs::Dtype) -> f64 {
    match dtype {
        // bf16: largest finite is 0x7F7F = (2 - 2^-7) * 2^127.
        mlx_rs::Dtype::Bfloat16 => -(2.0 - 2f64.powi(-7)) * 2f64.powi(127),
        mlx_rs::Dtype::Float16 => -65504.0,
        mlx_rs::Dtype::Float64 => f64::MIN,
        _ => f32::MIN as f64,
    }
}

/// One quantized tensor as `mx.quantize` returns it (affine mode): packed
/// uint32 data, then scales and biases in the input's dtype.
#[derive(Debug, Clone)]
pub struct Quantized {
    pub data: Array,
    pub scales: Array,
    pub biases: Array,
}

impl Quantized {
    /// `f` applied to the data, the scales and the biases alike.
    pub(crate) fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Quantized> {
        Ok(Quantized {
            data: f(&self.data)?,
            scales: f(&self.scales)?,
            biases: f(&self.biases)?,
        })
    }
}

/// mlx-lm's `quantized_scaled_dot_product_attention` (`base.py`), op for op:
/// `queries *= scale` (a Python float: weak scalar), GQA by reshaping the
/// queries to [B, KV, rep, L, D] and `expand_dims(-3)` of each K/V array,
/// `quantized_matmul(transpose=True)`, the mask (the "causal" string becomes
/// `arange(kL-qL, kL)[:, None] >= arange(kL)[None]`; bool masks go through
/// `where(mask, scores, finfo.min)`, others are added), `softmax(precise=True)`,
/// `quantized_matmul(transpose=False)`, reshape back to [B, H, L, D].
pub fn quantized_sdpa(
    queries: &Array,
    q_keys: &Quantized,
    q_values: &Quantized,
    scale: f64,
    mask: &Mask,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let s = queries.shape();
    let (b, n_q_heads, l, d) = (s[0], s[1], s[2], s[3]);
    let kd = q_keys.data.shape();
    let n_kv_heads = kd[kd.len() - 3];
    let n_repeats = n_q_heads / n_kv_heads;

    let mut queries = queries.multiply(scalar_like(scale, queries))?;
    let expand = |q: &Quantized| -> Result<Quantized> {
        Ok(Quantized {
            data: q.data.expand_dims(-3)?,
            scales: q.scales.expand_dims(-3)?,
            biases: q.biases.expand_dims(-3)?,
        })
    };
    let (k, v) = if n_repeats > 1 {
        queries = queries.reshape(&[b, n_kv_heads, n_repeats, l, d])?;
        (expand(q_keys)?, expand(q_values)?)
    } else {
        (q_keys.clone(), q_values.clone())
    };

    let mut scores = mlx_rs::ops::quantized_matmul(
        &queries, &k.data, &k.scales, &k.biases, true, group_size, bits,
    )?;
    let mask = match mask {
        Mask::None => None,
        Mask::Causal => {
            let ss = scores.shape();
            let (ql, kl) = (ss[ss.len() - 2], ss[ss.len() - 1]);
            let q_indices = mlx_rs::ops::arange::<i32, i32>(kl - ql, kl, 1)?;
            let k_indices = mlx_rs::ops::arange::<i32, i32>(0, kl, 1)?;
            Some(q_indices.expand_dims(1)?.ge(&k_indices.expand_dims(0)?)?)
        }
        Mask::Array(m) => Some(m.clone()),
    };
    if let Some(mut m) = mask {
        if n_repeats > 1 && m.ndim() > 3 {
            m = m.expand_dims(-3)?;
        }
        if m.dtype() == mlx_rs::Dtype::Bool {
            let min = scalar_like(finfo_min(scores.dtype()), &scores);
            scores = mlx_rs::ops::select(&m, &scores, &min)?;
        } else {
            scores = scores.add(&m)?;
        }
    }
    let scores = mlx_rs::ops::softmax_axis(&scores, -1, true)?;
    let out = mlx_rs::ops::quantized_matmul(
        &scores, &v.data, &v.scales, &v.biases, false, group_size, bits,
    )?;
    if n_repeats > 1 {
        out.reshape(&[b, n_q_heads, l, d])
    } else {
        Ok(out)
    }
}

/// gemma2's hand-written attention (`gemma2.py` `Attention.__call__` after
/// RoPE and the cache), op for op: `queries * scale` (weak scalar), grouped
/// heads by reshaping the queries to [B, KV, rep, L, D] against
/// `expand_dims(k/v, 2)`, `scores = q @ k^T`, `tanh(scores / cap)`, `* cap`
/// (eager, weak scalars), a bool mask through
/// `where(mask, scores, finfo(dtype).min)` or any other mask added,
/// `softmax(precise=True)`, `@ v`, reshaped back to [B, H, L, D].
/// `q` is [B, H, L, D], `k` and `v` [B, KV, S, D].
///
/// mlx-lm always hands this attention an array mask or none (its
/// `create_attention_mask(..., return_array=True)`); [`Mask::Causal`] is an
/// error, as the string would be in mlx-lm.
pub fn softcapped_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f64,
    softcap: f64,
    mask: &Mask,
) -> Result<Array> {
    let s = q.shape();
    let (b, n_heads, l, d) = (s[0], s[1], s[2], s[3]);
    let n_kv_heads = k.shape()[1];
    let repeats = n_heads / n_kv_heads;
    let mut queries = q.multiply(scalar_like(scale, q))?;
    let (keys, values) = if repeats > 1 {
        queries = queries.reshape(&[b, n_kv_heads, repeats, l, d])?;
        (k.expand_dims(2)?, v.expand_dims(2)?)
    } else {
        (k.clone(), v.clone())
    };
    let scores = queries.matmul(keys.swap_axes(-1, -2)?)?;
    let cap = scalar_like(softcap, &scores);
    let mut scores = mlx_rs::ops::tanh(scores.divide(&cap)?)?.multiply(&cap)?;
    let mask = mask_each_row(mask, repeats)?;
    match &mask {
        Mask::None => {}
        Mask::Causal => {
            return Err(mlx_rs::error::Exception::custom(
                "softcapped_attention: the mask must be an array (mlx-lm's gemma2 builds it with \
                 return_array=True), not \"causal\"",
            ))
        }
        Mask::Array(m) if m.dtype() == mlx_rs::Dtype::Bool => {
            let min = scalar_like(finfo_min(scores.dtype()), &scores);
            scores = mlx_rs::ops::select(m, &scores, &min)?;
        }
        Mask::Array(m) => scores = scores.add(m)?,
    }
    let scores = mlx_rs::ops::softmax_axis(&scores, -1, true)?;
    let out = scores.matmul(&values)?;
    if repeats > 1 {
        out.reshape(&[b, n_heads, l, d])
    } else {
        Ok(out)
    }
}

/// A batch's mask [B, 1, L, S] with an axis for the grouped heads'
/// repeats: [B, 1, 1, L, S], so that it lines up with the scores
/// [B, kv_heads, repeats, L, S] row by row.
///
/// mlx-lm's gemma2 adds the 4-D mask to the 5-D scores as they are, which
/// aligns the mask's batch axis with the K/V heads: a broadcast error for
/// any batch of more than one row (and of other than `kv_heads` rows), and
/// at B = `kv_heads` each head masked with another sequence's mask. archgen
/// masks each row with its own mask instead (docs/parity.md, "Batches",
/// Gemma-2: tier L3, checked against mlx-lm with this one axis added). One
/// sequence, a batch of one and ungrouped heads keep mlx-lm's graph.
fn mask_each_row(mask: &Mask, repeats: i32) -> Result<Mask> {
    match mask {
        // A mask of more than one row is a batch's (one sequence's is [1, ...]
        // or 2-D).
        Mask::Array(m) if repeats > 1 && m.ndim() == 4 && m.shape()[0] > 1 => {
            Ok(Mask::Array(m.expand_dims(2)?))
        }
        Mask::None | Mask::Causal | Mask::Array(_) => Ok(mask.clone()),
    }
}
