//! Masks and scaled dot-product attention, as mlx-lm builds them.

use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::Array;

use crate::ops::Result;

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
