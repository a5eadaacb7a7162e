//! A batched quantized KV cache: mlx-lm's `BatchKVCache` layout (one
//! left-padded buffer for B sequences, per-row offsets, one shared write
//! index) holding what its single-sequence `QuantizedKVCache` holds, the
//! `mx.quantize`d (packed, scales, biases) triples of keys and values,
//! grown and quantized exactly as [`crate::cache::QuantizedKvCache`] does.
//!
//! mlx-lm 0.32.2 has no such cache: `QuantizedKVCache` has no `merge()`, and
//! `BatchGenerator` takes no `kv_bits`. So this is archgen's own batch, built
//! from the two halves mlx-lm does have: the row moves of `BatchKVCache`
//! (`prepare`/`finalize` for right padding, `filter`, `extend`, `extract`),
//! applied to each of the three arrays of a quantized tensor alike, and the
//! single-sequence cache's growth and quantization (every token quantized
//! in groups along the head dimension, so a row's groups never mix with
//! another row's or another position's). Attention is mlx-lm's
//! `quantized_scaled_dot_product_attention` with the left-padded causal
//! mask array ([`crate::attention::quantized_sdpa`]).
//!
//! What that buys (docs/parity.md, "Batches"): a batch of one row with no
//! padding holds the very buffers the single-sequence cache holds, and the
//! mask array selects what the single sequence's causal mask selects, so
//! it computes mlx-lm's single-sequence bytes; rows of a real batch (with
//! padding and joins) have no mlx-lm oracle and are checked against the
//! monolith only.

use mlx_rs::ops::indexing::{Ellipsis, TryIndexMutOp, TryIndexOp};
use mlx_rs::{Array, Dtype};

use crate::attention::{Mask, Quantized};
use crate::batch::{
    check_rows, int_vector, left_padded_causal_mask, pad_keys, roll_rows, shift_to_left_padding,
    STEP,
};
use crate::ops::Result;

fn error(what: String) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what)
}

/// `f` on each of the three arrays of both quantized tensors.
fn both(
    keys: &Quantized,
    values: &Quantized,
    f: impl Fn(&Array) -> Result<Array>,
) -> Result<(Quantized, Quantized)> {
    Ok((keys.map(&f)?, values.map(&f)?))
}

/// The widths of a quantized tensor's last axis: packed words, scales
/// (and biases), and the dtype of the scales.
#[derive(Debug, Clone, Copy, PartialEq)]
struct QuantWidths {
    words: i32,
    groups: i32,
    dtype: Dtype,
}

impl QuantWidths {
    fn of(q: &Quantized) -> Self {
        QuantWidths {
            words: q.data.shape()[3],
            groups: q.scales.shape()[3],
            dtype: q.scales.dtype(),
        }
    }

    /// `QuantizedKVCache`'s zero buffers: `rows` rows of `heads` heads and
    /// `len` slots.
    fn zeros(self, rows: i32, heads: i32, len: i32) -> Result<Quantized> {
        let z =
            |last: i32, dtype: Dtype| mlx_rs::ops::zeros_dtype(&[rows, heads, len, last], dtype);
        Ok(Quantized {
            data: z(self.words, Dtype::Uint32)?,
            scales: z(self.groups, self.dtype)?,
            biases: z(self.groups, self.dtype)?,
        })
    }
}

/// The quantization of one cache: `mx.quantize(x, group_size, bits)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuantization {
    pub group_size: i32,
    pub bits: i32,
}

impl KvQuantization {
    /// `mx.quantize` of `x` (affine) as a [`Quantized`] triple.
    pub fn quantize(self, x: &Array) -> Result<Quantized> {
        let (data, scales, biases) = mlx_rs::ops::quantize(x, self.group_size, self.bits)?;
        Ok(Quantized {
            data,
            scales,
            biases,
        })
    }

    /// `QuantizedKVCache`'s empty buffers for K/V `like` [B, KV, L, D]:
    /// `D * bits / 32` packed words, `D / group_size` scales and biases.
    fn widths(self, like: &Array) -> QuantWidths {
        let el_per_int = 8 * 4 / self.bits; // 8 * mx.uint32.size // bits
        let d = like.shape()[3];
        QuantWidths {
            words: d / el_per_int,
            groups: d / self.group_size,
            dtype: like.dtype(),
        }
    }
}

/// A `BatchKVCache` of quantized keys and values: see the module.
#[derive(Debug, Clone)]
pub struct BatchQuantizedKvCache {
    keys: Option<Quantized>,
    values: Option<Quantized>,
    left_padding: Vec<i32>,
    offset: Vec<i32>,
    idx: i32,
    /// Set by [`BatchQuantizedKvCache::prepare_right_padding`] for a
    /// right-padded prefill chunk, consumed by `finalize`.
    right_padding: Option<Vec<i32>>,
    pub quantization: KvQuantization,
}

impl BatchQuantizedKvCache {
    /// Empty, offsets `-left_padding` (as `BatchKVCache(left_padding)`).
    pub fn new(quantization: KvQuantization, left_padding: &[i32]) -> Self {
        BatchQuantizedKvCache {
            keys: None,
            values: None,
            left_padding: left_padding.to_vec(),
            offset: left_padding.iter().map(|l| -l).collect(),
            idx: 0,
            right_padding: None,
            quantization,
        }
    }

    /// A quantized batch of already quantized buffers (right-aligned rows
    /// after `left_padding[b]` zero slots, every row ending at `idx`), as
    /// the merge of single-sequence caches and the conversion of a plain
    /// batch build it.
    pub(crate) fn from_parts(
        quantization: KvQuantization,
        keys: Quantized,
        values: Quantized,
        left_padding: Vec<i32>,
        offset: Vec<i32>,
        idx: i32,
    ) -> Self {
        BatchQuantizedKvCache {
            keys: Some(keys),
            values: Some(values),
            left_padding,
            offset,
            idx,
            right_padding: None,
            quantization,
        }
    }

    /// The number of sequences.
    pub fn batch_size(&self) -> usize {
        self.offset.len()
    }

    /// Each sequence's position, as the int32 vector RoPE takes.
    pub fn offsets(&self) -> Array {
        int_vector(&self.offset)
    }

    /// Each sequence's position (host values of `offsets`).
    pub fn offset_values(&self) -> &[i32] {
        &self.offset
    }

    /// Each sequence's padding slots before its first key.
    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    /// The shared write index: every row's keys end here.
    pub fn idx(&self) -> i32 {
        self.idx
    }

    /// The arrays a step boundary evaluates (`mx.eval(c.state)`).
    pub(crate) fn state(&self) -> Vec<&Array> {
        [&self.keys, &self.values]
            .into_iter()
            .flatten()
            .flat_map(|q| [&q.data, &q.scales, &q.biases])
            .collect()
    }

    fn buffers(&self, what: &str) -> Result<(&Quantized, &Quantized)> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(error(format!(
                "BatchQuantizedKvCache::{what}: no keys written yet"
            ))),
        }
    }

    /// `QuantizedKVCache.update_and_fetch` on B rows: grows the buffers in
    /// steps of 256 slots (cutting a partial step first, as mlx-lm does),
    /// quantizes `k`, `v` [B, KV, L, D] and writes them at `idx..idx + L`,
    /// keys' then values' data, scales, biases; returns `[..., :idx, :]`.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Quantized, Quantized)> {
        let (ks, n) = (k.shape(), k.shape()[2]);
        let prev = self.idx;
        let capacity = self.keys.as_ref().map_or(0, |q| q.data.shape()[2]);
        if self.keys.is_none() || prev + n > capacity {
            let new_steps = (STEP + n - 1) / STEP * STEP;
            let (b, heads) = (ks[0], ks[1]);
            let key_widths = self.quantization.widths(k);
            let value_widths = self.quantization.widths(v);
            match (self.keys.take(), self.values.take()) {
                (Some(keys), Some(values)) => {
                    let grow = |q: Quantized, widths: QuantWidths| -> Result<Quantized> {
                        let q = if prev % STEP != 0 {
                            q.map(|x| x.try_index((Ellipsis, ..prev, ..)))?
                        } else {
                            q
                        };
                        let zeros = widths.zeros(b, heads, new_steps)?;
                        Ok(Quantized {
                            data: mlx_rs::ops::concatenate(&[q.data, zeros.data], 2)?,
                            scales: mlx_rs::ops::concatenate(&[q.scales, zeros.scales], 2)?,
                            biases: mlx_rs::ops::concatenate(&[q.biases, zeros.biases], 2)?,
                        })
                    };
                    self.keys = Some(grow(keys, key_widths)?);
                    self.values = Some(grow(values, value_widths)?);
                }
                _ => {
                    self.keys = Some(key_widths.zeros(b, heads, new_steps)?);
                    self.values = Some(value_widths.zeros(b, v.shape()[1], new_steps)?);
                }
            }
        }
        for o in &mut self.offset {
            *o += n;
        }
        self.idx += n;
        let qk = self.quantization.quantize(k)?;
        let qv = self.quantization.quantize(v)?;
        let (keys, values) = match (self.keys.as_mut(), self.values.as_mut()) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(error("BatchQuantizedKvCache: lost its buffers".into())),
        };
        // `for i in range(3)`: keys[i] then values[i], in that order.
        for (dst_k, src_k, dst_v, src_v) in [
            (&mut keys.data, &qk.data, &mut values.data, &qv.data),
            (&mut keys.scales, &qk.scales, &mut values.scales, &qv.scales),
            (&mut keys.biases, &qk.biases, &mut values.biases, &qv.biases),
        ] {
            dst_k.try_index_mut((Ellipsis, prev..prev + n, ..), src_k)?;
            dst_v.try_index_mut((Ellipsis, prev..prev + n, ..), src_v)?;
        }
        self.keys_and_values()
    }

    /// `[..., :idx, :]` of every buffer.
    pub fn keys_and_values(&self) -> Result<(Quantized, Quantized)> {
        let (k, v) = self.buffers("keys_and_values")?;
        both(k, v, |x| x.try_index((Ellipsis, ..self.idx, ..)))
    }

    /// `prepare(right_padding=...)`: remembers the padding of a
    /// right-padded prefill chunk when any row has some.
    pub fn prepare_right_padding(&mut self, right_padding: &[i32]) -> Result<()> {
        if right_padding.len() != self.batch_size() {
            return Err(error(format!(
                "BatchQuantizedKvCache::prepare: {} right paddings for a batch of {}",
                right_padding.len(),
                self.batch_size()
            )));
        }
        if right_padding.iter().any(|&p| p > 0) {
            self.right_padding = Some(right_padding.to_vec());
        }
        Ok(())
    }

    /// `finalize()`: each row's right padding rolled in front of its keys
    /// (all three arrays of both tensors, over the whole buffer), where
    /// `left_padding` hides it.
    pub fn finalize(&mut self) -> Result<()> {
        let Some(padding) = self.right_padding.take() else {
            return Ok(());
        };
        let (k, v) = self.buffers("finalize")?;
        let (k, v) = both(k, v, |x| roll_rows(x, &padding))?;
        (self.keys, self.values) = (Some(k), Some(v));
        shift_to_left_padding(&mut self.offset, &mut self.left_padding, &padding);
        Ok(())
    }

    /// `make_mask(N)`: the left-padded causal mask array, also for one
    /// token.
    pub fn make_mask(&self, n: i32) -> Result<Mask> {
        Ok(Mask::Array(left_padded_causal_mask(
            n,
            self.idx,
            &self.left_padding,
        )?))
    }

    /// `filter(batch_indices)`: keeps rows `keep` (in that order), then
    /// drops the padding slots every kept row has.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let rows = check_rows(keep, self.batch_size(), "BatchQuantizedKvCache::filter")?;
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let (k, v) = both(k, v, |x| x.take_axis(&rows, 0))?;
            (self.keys, self.values) = (Some(k), Some(v));
        }
        self.offset = keep.iter().map(|&i| self.offset[i]).collect();
        self.left_padding = keep.iter().map(|&i| self.left_padding[i]).collect();
        let min_left_pad = self.left_padding.iter().copied().min().unwrap_or(0);
        if min_left_pad > 0 {
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                let (k, v) = both(k, v, |x| x.try_index((Ellipsis, min_left_pad.., ..)))?;
                (self.keys, self.values) = (Some(k), Some(v));
            }
            self.idx -= min_left_pad;
            for lp in &mut self.left_padding {
                *lp -= min_left_pad;
            }
        }
        Ok(())
    }

    /// `extend(other)` as `BatchKVCache` extends: both buffers padded with
    /// zero triples to the longer one, ends aligned at the larger `idx` (a
    /// row with fewer keys gets more left padding), `other`'s rows after
    /// this cache's. Two caches of different quantizations do not join.
    pub fn extend(&mut self, other: BatchQuantizedKvCache) -> Result<()> {
        if self.quantization != other.quantization {
            return Err(error(format!(
                "BatchQuantizedKvCache::extend: a {}-bit cache (group {}) and a {}-bit one \
                 (group {})",
                self.quantization.bits,
                self.quantization.group_size,
                other.quantization.bits,
                other.quantization.group_size
            )));
        }
        let layout = match (&self.keys, &self.values, &other.keys, &other.values) {
            // Python takes the shapes from the last cache with keys.
            (_, _, Some(k), Some(v)) | (Some(k), Some(v), _, _) => {
                (k.data.shape()[1], QuantWidths::of(k), QuantWidths::of(v))
            }
            _ => {
                self.left_padding.extend(other.left_padding);
                self.offset.extend(other.offset);
                return Ok(());
            }
        };
        let idx = self.idx.max(other.idx);
        let len = |c: &BatchQuantizedKvCache| c.keys.as_ref().map_or(0, |q| q.data.shape()[2]);
        let max_size = len(self).max(len(&other));
        let (k1, v1, lp1) = self.padded(layout, idx, max_size)?;
        let (k2, v2, lp2) = other.padded(layout, idx, max_size)?;
        let cat = |a: &Quantized, b: &Quantized| -> Result<Quantized> {
            let c = |x: &Array, y: &Array| mlx_rs::ops::concatenate(&[x.clone(), y.clone()], 0);
            Ok(Quantized {
                data: c(&a.data, &b.data)?,
                scales: c(&a.scales, &b.scales)?,
                biases: c(&a.biases, &b.biases)?,
            })
        };
        self.keys = Some(cat(&k1, &k2)?);
        self.values = Some(cat(&v1, &v2)?);
        self.left_padding = lp1.into_iter().chain(lp2).collect();
        self.offset.extend(other.offset);
        self.idx = idx;
        Ok(())
    }

    /// This side of an `extend`: its buffers (zero-length ones when it has
    /// none) with `idx - self.idx` zero slots before them and the rest of
    /// `max_size` after (cut from the end when longer), its left padding
    /// moved by the slots put before.
    fn padded(
        &self,
        (heads, key_widths, value_widths): (i32, QuantWidths, QuantWidths),
        idx: i32,
        max_size: i32,
    ) -> Result<(Quantized, Quantized, Vec<i32>)> {
        let rows = self.batch_size() as i32;
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (k.clone(), v.clone()),
            _ => (
                key_widths.zeros(rows, heads, 0)?,
                value_widths.zeros(rows, heads, 0)?,
            ),
        };
        let left = idx - self.idx;
        let mut right = max_size - k.data.shape()[2] - left;
        let (k, v) = if right < 0 {
            let cut = right;
            right = 0;
            both(&k, &v, |x| x.try_index((Ellipsis, ..cut, ..)))?
        } else {
            (k, v)
        };
        let (k, v) = both(&k, &v, |x| pad_keys(x, left, right))?;
        let lp = self.left_padding.iter().map(|lp| lp + left).collect();
        Ok((k, v, lp))
    }

    /// `extract(idx)`: row `row`'s real slots [1, KV, len, ...] of both
    /// quantized tensors (what a single-sequence `QuantizedKVCache` of that
    /// row would hold, without its spare capacity).
    pub fn extract(&self, row: usize) -> Result<(Quantized, Quantized)> {
        check_rows(&[row], self.batch_size(), "BatchQuantizedKvCache::extract")?;
        let (k, v) = self.buffers("extract")?;
        let r = row as i32;
        let lp = self.left_padding[row];
        both(k, v, |x| {
            x.try_index((r..r + 1, .., lp..self.idx))?.contiguous()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::QuantizedKvCache;

    const Q4: KvQuantization = KvQuantization {
        group_size: 32,
        bits: 4,
    };

    /// Deterministic keys [b, 2, len, 32] that differ per row and slot.
    fn keys(b: i32, len: i32, seed: f32) -> Array {
        let n = b * 2 * len * 32;
        let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37 + seed).sin()).collect();
        Array::from_slice(&x, &[b, 2, len, 32])
    }

    fn bytes(q: &Quantized) -> Vec<Vec<u8>> {
        [&q.data, &q.scales, &q.biases]
            .into_iter()
            .map(|x| crate::bytes::array_bytes(x).unwrap())
            .collect()
    }

    #[test]
    fn one_row_holds_what_the_single_sequence_cache_holds() {
        let mut single = QuantizedKvCache::new(Q4.group_size, Q4.bits);
        let mut batch = BatchQuantizedKvCache::new(Q4, &[0]);
        for (len, seed) in [(5, 0.0), (1, 1.0), (3, 2.0)] {
            let (k, v) = (keys(1, len, seed), keys(1, len, seed + 0.5));
            let (sk, sv) = single.update_and_fetch(&k, &v).unwrap();
            let (bk, bv) = batch.update_and_fetch(&k, &v).unwrap();
            assert_eq!(bytes(&sk), bytes(&bk));
            assert_eq!(bytes(&sv), bytes(&bv));
        }
        assert_eq!(batch.offset_values(), &[9]);
    }

    #[test]
    fn right_padding_becomes_left_padding_in_all_three_arrays() {
        let mut c = BatchQuantizedKvCache::new(Q4, &[0, 0]);
        c.prepare_right_padding(&[0, 2]).unwrap();
        let k = keys(2, 3, 0.0);
        c.update_and_fetch(&k, &k).unwrap();
        c.finalize().unwrap();
        assert_eq!(c.left_padding(), &[0, 2]);
        assert_eq!(c.offset_values(), &[3, 1]);
        // Row 1's one real slot (its first written one) is now the last.
        let (got, _) = c.extract(1).unwrap();
        let want = Q4
            .quantize(&k.try_index((1..2, .., 0..1)).unwrap())
            .unwrap();
        assert_eq!(bytes(&got), bytes(&want));
    }

    #[test]
    fn filter_then_extend_keeps_each_rows_slots() {
        let mut a = BatchQuantizedKvCache::new(Q4, &[0, 0]);
        let ka = keys(2, 4, 0.0);
        a.update_and_fetch(&ka, &ka).unwrap();
        a.filter(&[1]).unwrap();
        let mut b = BatchQuantizedKvCache::new(Q4, &[0]);
        let kb = keys(1, 2, 3.0);
        b.update_and_fetch(&kb, &kb).unwrap();
        a.extend(b).unwrap();
        assert_eq!((a.idx(), a.left_padding()), (4, &[0, 2][..]));
        assert_eq!(a.offset_values(), &[4, 2]);
        let (row0, _) = a.extract(0).unwrap();
        let (row1, _) = a.extract(1).unwrap();
        let want0 = Q4.quantize(&ka.try_index(1..2).unwrap()).unwrap();
        let want1 = Q4.quantize(&kb).unwrap();
        assert_eq!(bytes(&row0), bytes(&want0));
        assert_eq!(bytes(&row1), bytes(&want1));
        let other = BatchQuantizedKvCache::new(KvQuantization { bits: 8, ..Q4 }, &[0]);
        assert!(a.extend(other).is_err());
    }
}
