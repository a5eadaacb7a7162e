//! Qwen3.5's Gated DeltaNet in a batch, as mlx-lm 0.32.2 runs it under
//! `BatchGenerator`: the `ArraysCache` batch methods (`merge` of empty
//! caches, `prepare`, `finalize`, `advance`, `make_mask`, `filter`,
//! `extend`) and `GatedDeltaNet.__call__` with a padding mask
//! (`qwen3_5.py`, `gated_delta.py`). The single-sequence layer is
//! [`crate::deltanet::gated_delta_net`]; this one adds what padding needs:
//! masked conv inputs, the conv state taken at each row's length, and
//! recurrent steps that keep a padded row's state.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use crate::deltanet::{
    causal_conv1d, compute_g, deltanet_projections, gated_delta_ops, normalize_qk, rms_norm_gated,
    ArraysCache, GatedDeltaNet,
};
use crate::distributed::sharded_to_all;
use crate::ops::{scalar_like, Result};

fn error(what: String) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what)
}

/// `ArraysCache(size=2)` of a Gated DeltaNet layer in a batch: the conv
/// state [B, K-1, conv_dim], the recurrent state [B, Hv, Dv, Dk] (f32), and
/// the padding facts its mask is made from.
#[derive(Debug, Clone, Default)]
pub struct BatchArraysCache {
    pub(crate) conv: Option<Array>,
    state: Option<Array>,
    /// `left_padding`: set by `merge` (zeros), cleared by `finalize`,
    /// lowered by every layer call (`advance`).
    left_padding: Option<Vec<i32>>,
    /// `lengths`: each row's real tokens in the chunk being prefilled.
    pub(crate) lengths: Option<Vec<i32>>,
}

impl BatchArraysCache {
    /// `ArraysCache.merge` of `n` empty caches: no states, `left_padding`
    /// zeros.
    pub fn merged_empty(n: usize) -> Self {
        BatchArraysCache {
            left_padding: Some(vec![0; n]),
            ..Default::default()
        }
    }

    /// `ArraysCache.merge` of caches of which at least one holds states:
    /// the stacked states (no recurrent one for a short conv), and no
    /// padding facts (so no mask).
    pub(crate) fn from_merged(conv: Array, state: Option<Array>) -> Self {
        BatchArraysCache {
            conv: Some(conv),
            state,
            left_padding: None,
            lengths: None,
        }
    }

    /// `extract(idx)`: row `row`'s conv and recurrent states (what mlx-lm
    /// hands back as a single-sequence `ArraysCache`); a short conv's cache
    /// has no recurrent state.
    pub fn extract(&self, row: usize) -> Result<(Array, Option<Array>)> {
        if row >= self.batch_size() {
            return Err(error(format!(
                "BatchArraysCache::extract: row {row} of a batch of {}",
                self.batch_size()
            )));
        }
        let r = row as i32;
        let state = match &self.state {
            Some(s) => Some(s.try_index(r..r + 1)?),
            None => None,
        };
        match &self.conv {
            Some(c) => Ok((c.try_index(r..r + 1)?, state)),
            None => Err(error(
                "BatchArraysCache::extract: no states written yet".into(),
            )),
        }
    }

    /// `batch_size`: from the states, else the padding facts, else 1.
    pub fn batch_size(&self) -> usize {
        match (&self.conv, &self.state, &self.left_padding, &self.lengths) {
            (Some(c), _, _, _) | (None, Some(c), _, _) => c.shape()[0] as usize,
            (None, None, Some(lp), _) => lp.len(),
            (None, None, None, Some(l)) => l.len(),
            (None, None, None, None) => 1,
        }
    }

    /// `prepare(lengths=...)` before a right-padded chunk.
    pub fn prepare(&mut self, lengths: &[i32]) {
        self.lengths = Some(lengths.to_vec());
    }

    /// `finalize()` after a right-padded chunk: no mask from then on.
    pub fn finalize(&mut self) {
        self.lengths = None;
        self.left_padding = None;
    }

    /// `advance(N)`, after each layer call.
    pub(crate) fn advance(&mut self, n: i32) {
        for v in self.lengths.iter_mut().chain(self.left_padding.iter_mut()) {
            v.iter_mut().for_each(|x| *x -= n);
        }
    }

    /// Whether every row is real at the next `n` positions: `make_mask(n)`
    /// would be absent or all true.
    pub(crate) fn every_position_real(&self, n: i32) -> bool {
        self.left_padding.iter().flatten().all(|&p| p <= 0)
            && self.lengths.iter().flatten().all(|&l| l >= n)
    }

    /// The conv and recurrent states, taken out as one sequence's cache for
    /// a step through the single-sequence block; `None` (nothing taken)
    /// until both are written. [`Self::put_states`] puts them back.
    pub(crate) fn take_states(&mut self) -> Option<ArraysCache> {
        match (&self.conv, &self.state) {
            (Some(_), Some(_)) => Some(ArraysCache {
                conv: self.conv.take(),
                state: self.state.take(),
            }),
            _ => None,
        }
    }

    /// The states of [`Self::take_states`], back in the batch's cache.
    pub(crate) fn put_states(&mut self, states: ArraysCache) {
        self.conv = states.conv;
        self.state = states.state;
    }

    /// `make_mask(N)` (`create_ssm_mask`): bool [B, N], position p of row b
    /// is real when `p >= left_padding[b]` and `p < lengths[b]`; `None`
    /// when neither is set.
    pub fn make_mask(&self, n: i32) -> Result<Option<Array>> {
        let pos = mlx_rs::ops::arange::<i32, i32>(0, n, 1)?;
        let column = |v: &[i32]| Array::from_slice(v, &[v.len() as i32, 1]);
        let mut mask = match &self.left_padding {
            Some(lp) => Some(pos.ge(column(lp))?),
            None => None,
        };
        if let Some(lengths) = &self.lengths {
            let in_length = pos.lt(column(lengths))?;
            mask = Some(match mask {
                Some(m) => m.logical_and(&in_length)?,
                None => in_length,
            });
        }
        Ok(mask)
    }

    /// `filter(batch_indices)`.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        if let Some(bad) = keep.iter().find(|&&r| r >= self.batch_size()) {
            return Err(error(format!(
                "BatchArraysCache::filter: row {bad} of a batch of {}",
                self.batch_size()
            )));
        }
        let rows: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let rows = Array::from_slice(&rows, &[rows.len() as i32]);
        for a in [&mut self.conv, &mut self.state].into_iter().flatten() {
            *a = a.take_axis(&rows, 0)?;
        }
        for v in [&mut self.left_padding, &mut self.lengths]
            .into_iter()
            .flatten()
        {
            *v = keep.iter().map(|&i| v[i]).collect();
        }
        Ok(())
    }

    /// `extend(other)`: rows appended; a side without a state gets zeros,
    /// a side without padding facts gets zeros when the other has them.
    pub fn extend(&mut self, other: BatchArraysCache) -> Result<()> {
        let (a_batch, b_batch) = (self.batch_size() as i32, other.batch_size() as i32);
        let cat = |a: Option<Array>, b: Option<Array>| -> Result<Option<Array>> {
            let like = match (&a, &b) {
                (_, Some(x)) | (Some(x), None) => x.clone(),
                (None, None) => return Ok(None),
            };
            let zeros = |rows: i32| {
                let mut shape = like.shape().to_vec();
                shape[0] = rows;
                mlx_rs::ops::zeros_dtype(&shape, like.dtype())
            };
            let a = match a {
                Some(a) => a,
                None => zeros(a_batch)?,
            };
            let b = match b {
                Some(b) => b,
                None => zeros(b_batch)?,
            };
            Ok(Some(mlx_rs::ops::concatenate(&[a, b], 0)?))
        };
        self.conv = cat(self.conv.take(), other.conv)?;
        self.state = cat(self.state.take(), other.state)?;
        let cat_host = |a: Option<Vec<i32>>, b: Option<Vec<i32>>| match (a, b) {
            (None, None) => None,
            (a, b) => {
                let mut v = a.unwrap_or_else(|| vec![0; a_batch as usize]);
                v.extend(b.unwrap_or_else(|| vec![0; b_batch as usize]));
                Some(v)
            }
        };
        self.left_padding = cat_host(self.left_padding.take(), other.left_padding);
        self.lengths = cat_host(self.lengths.take(), other.lengths);
        Ok(())
    }

    /// The arrays a step boundary evaluates.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.conv.iter().chain(self.state.iter())
    }
}

/// `GatedDeltaNet.__call__` in a batch, with `mask` from
/// [`BatchArraysCache::make_mask`] (made before the first layer).
pub fn gated_delta_net_batch(
    x: &Array,
    w: &GatedDeltaNet,
    cache: &mut BatchArraysCache,
    mask: Option<&Array>,
) -> Result<Array> {
    let s = &w.shape;
    let sh = x.shape();
    let (bsz, len) = (sh[0], sh[1]);
    let (qkv, z, b, a) = deltanet_projections(x, &w.in_proj, s)?;
    // `mx.where(mask[..., None], qkv, 0)`: padded positions feed zeros.
    let qkv = match mask {
        Some(m) => mlx_rs::ops::select(&m.expand_dims(-1)?, &qkv, scalar_like(0.0, &qkv))?,
        None => qkv,
    };
    let (conv_out, conv_state) = causal_conv1d(&qkv, &w.conv1d, cache.conv.as_ref(), x.dtype())?;
    cache.conv = Some(match &cache.lengths {
        // The state after each row's last real token: `conv_input` rows
        // `clip(length, 0, S) .. + K-1`.
        Some(lengths) => {
            let n_keep = w.conv1d.shape()[1] - 1;
            let state = match &cache.conv {
                Some(c) => c.clone(),
                None => mlx_rs::ops::zeros_dtype(&[bsz, n_keep, qkv.shape()[2]], x.dtype())?,
            };
            let conv_input = mlx_rs::ops::concatenate(&[state, qkv.clone()], 1)?;
            conv_state_at_lengths(&conv_input, lengths, len, n_keep)?
        }
        None => conv_state,
    });
    let kd = s.key_dim();
    let parts = conv_out.split_at_indices(&[kd, 2 * kd], -1)?;
    let q = parts[0].reshape(&[bsz, len, s.num_k_heads, s.head_k_dim])?;
    let k = parts[1].reshape(&[bsz, len, s.num_k_heads, s.head_k_dim])?;
    let v = parts[2].reshape(&[bsz, len, s.num_v_heads, s.head_v_dim])?;
    let (q, k) = normalize_qk(&q, &k, s.head_k_dim)?;
    let beta = mlx_rs::ops::sigmoid(&b)?;
    let g = compute_g(&w.a_log, &a, &w.dt_bias)?;
    let (out, state) = gated_delta_ops([&q, &k, &v, &g, &beta], cache.state.as_ref(), mask)?;
    cache.state = Some(state);
    cache.advance(len);
    let out = rms_norm_gated(&out, &z, &w.norm, s.eps)?;
    sharded_to_all(w.out_proj.forward(&out.reshape(&[bsz, len, -1])?)?)
}

/// A batch's conv state after each row's last real token, as mlx-lm's
/// batched `ArraysCache` keeps it: `conv_input` rows
/// `clip(length, 0, len) .. + n_keep` of each sequence (right-padded rows
/// stop at their own length). Shared by the Gated DeltaNet and the short
/// convolution.
pub(crate) fn conv_state_at_lengths(
    conv_input: &Array,
    lengths: &[i32],
    len: i32,
    n_keep: i32,
) -> Result<Array> {
    let mut positions = Vec::with_capacity(lengths.len() * n_keep as usize);
    for &l in lengths {
        let end = l.clamp(0, len);
        positions.extend((0..n_keep).map(|j| end + j));
    }
    let positions = Array::from_slice(&positions, &[lengths.len() as i32, n_keep, 1]);
    conv_input.take_along_axis(&positions, 1)
}
