//! The short-convolution mixer of LFM2 (mlx-lm 0.32.2's `lfm2.ShortConv`),
//! op for op as mlx-lm runs it:
//!
//! ```text
//! B, C, x = split(in_proj(h), 3, axis=-1)
//! Bx = B * x                       (zeros at padded positions in a batch)
//! conv_out = conv1d(concat([state, Bx], 1), depthwise, kernel K)
//! out = out_proj(C * conv_out)
//! ```
//!
//! Its cache is mlx-lm's `ArraysCache(size=1)`: the last `K - 1` rows of
//! `Bx` (the conv state, in the activation dtype). One sequence keeps it in a
//! [`ArraysCache`] (whose recurrent state stays empty), a batch in a
//! [`BatchArraysCache`], whose padding facts give the mask and pick each
//! row's state. LFM2 has no `shard()`, and `conv_bias` is false in every
//! published model, so neither a split nor a bias is here.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use crate::batch_deltanet::BatchArraysCache;
use crate::deltanet::ArraysCache;
use crate::layers::{pretranspose_all, Linear};
use crate::ops::{scalar_like, Result};
use crate::weights::Weights;

fn refused(what: String) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what)
}

/// One short-conv layer's weights (`layers.{i}.conv`).
#[derive(Debug)]
pub struct ShortConv {
    /// `[3 * hidden, hidden]`: B, C and x side by side.
    pub in_proj: Linear,
    /// The depthwise `nn.Conv1d` weight `[hidden, K, 1]` (mlx's layout;
    /// the loader's sanitize moves a Hugging Face `[hidden, 1, K]` here).
    pub conv: Array,
    pub out_proj: Linear,
}

impl ShortConv {
    /// Pretransposes the projections (same bits, no transpose per call).
    pub fn pretranspose(&mut self) {
        pretranspose_all([&mut self.in_proj, &mut self.out_proj]);
    }

    /// `K - 1`: the rows of `Bx` the cache keeps.
    fn n_keep(&self) -> i32 {
        self.conv.shape()[1] - 1
    }
}

/// `layers.{i}.conv` with `kernel` = `conv_L_cache`.
pub fn load_short_conv(w: &mut Weights, layer: usize, hidden: i32, kernel: i32) -> ShortConv {
    let p = format!("layers.{layer}.conv");
    ShortConv {
        in_proj: w.linear(&format!("{p}.in_proj"), 3 * hidden, hidden),
        conv: w.param(&format!("{p}.conv.weight"), &[hidden, kernel, 1]),
        out_proj: w.linear(&format!("{p}.out_proj"), hidden, hidden),
    }
}

/// `in_proj`, `mx.split(BCx, 3, axis=-1)`, `B * x`: (Bx, C).
fn gated_input(x: &Array, w: &ShortConv) -> Result<(Array, Array)> {
    let parts = w.in_proj.forward(x)?.split_equal(3, -1)?;
    let [b, c, x] = <[Array; 3]>::try_from(parts)
        .map_err(|_| refused("short conv: in_proj split in three gave another count".into()))?;
    Ok((b.multiply(&x)?, c))
}

/// `concat([state or zeros(B, K-1, hidden) in Bx's dtype, Bx], 1)`.
fn conv_input(bx: &Array, state: Option<&Array>, n_keep: i32) -> Result<Array> {
    let state = match state {
        Some(s) => s.clone(),
        None => mlx_rs::ops::zeros_dtype(&[bx.shape()[0], n_keep, bx.shape()[2]], bx.dtype())?,
    };
    mlx_rs::ops::concatenate(&[state, bx.clone()], 1)
}

/// `self.conv(Bx)` (`nn.Conv1d`, stride 1, no padding, one group per
/// channel, no bias), then `out_proj(C * conv_out)`.
fn convolve_and_project(input: &Array, c: &Array, w: &ShortConv) -> Result<Array> {
    let channels = input.shape()[2];
    let conv_out = mlx_rs::ops::conv1d(input, &w.conv, 1, 0, 1, channels)?;
    w.out_proj.forward(&c.multiply(&conv_out)?)
}

/// `ShortConv.__call__` for one unpadded sequence (no mask) with its cache:
/// prefill (any number of tokens) and decode steps alike. The new state is
/// `Bx[:, -(K-1):, :]` of the concatenated input.
pub fn short_conv(x: &Array, w: &ShortConv, cache: &mut ArraysCache) -> Result<Array> {
    let (bx, c) = gated_input(x, w)?;
    let n_keep = w.n_keep();
    let input = conv_input(&bx, cache.conv.as_ref(), n_keep)?;
    cache.conv = Some(input.try_index((.., -n_keep.., ..))?);
    convolve_and_project(&input, &c, w)
}

/// `ShortConv.__call__` in a batch, with `mask` from
/// [`BatchArraysCache::make_mask`] (made before the first layer):
/// `mx.where(mask[..., None], Bx, 0)` (the 0 a weak scalar), then the state
/// after each row's last real token when the chunk is right-padded
/// (`cache.lengths`: rows `clip(length, 0, t) .. + K-1` of the input), else
/// the last `K - 1` rows; `advance(t)`.
pub fn short_conv_batch(
    x: &Array,
    w: &ShortConv,
    cache: &mut BatchArraysCache,
    mask: Option<&Array>,
) -> Result<Array> {
    let (bx, c) = gated_input(x, w)?;
    let bx = match mask {
        Some(m) => mlx_rs::ops::select(&m.expand_dims(-1)?, &bx, scalar_like(0.0, &bx))?,
        None => bx,
    };
    let n_keep = w.n_keep();
    let t = x.shape()[1];
    let input = conv_input(&bx, cache.conv.as_ref(), n_keep)?;
    let state = match &cache.lengths {
        Some(lengths) => crate::batch_deltanet::conv_state_at_lengths(&input, lengths, t, n_keep)?,
        None => input.try_index((.., -n_keep.., ..))?,
    };
    cache.conv = Some(state);
    cache.advance(t);
    convolve_and_project(&input, &c, w)
}
