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

use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use mlx_rs::{Array, Dtype};

use crate::attention::{Mask, Quantized};
use crate::batch_kv::{pad_keys, BatchKv, BatchKvCache, KvForm, KvParts, STEP};
use crate::cache::Mixed;
use crate::mlx_c::write_positions;
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

/// The quantized form: `f` on each of the three arrays of a quantized
/// tensor alike.
impl KvForm for Quantized {
    type Setting = KvQuantization;
    const CACHE: &'static str = "BatchQuantizedKvCache";
    fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Self> {
        Quantized::map(self, f)
    }
    fn arrays(&self) -> Vec<&Array> {
        vec![&self.data, &self.scales, &self.biases]
    }
    fn slots(&self) -> i32 {
        self.data.shape()[2]
    }
}

/// A `BatchKVCache` of quantized keys and values: see the module.
pub type BatchQuantizedKvCache = BatchKv<Quantized>;

impl BatchQuantizedKvCache {
    /// Empty, offsets `-left_padding` (as `BatchKVCache(left_padding)`).
    pub fn new(quantization: KvQuantization, left_padding: &[i32]) -> Self {
        BatchKv::empty(quantization, left_padding)
    }

    /// `KVCache.to_quantized` of a written plain batch: `mx.quantize` of
    /// its whole buffers (spare capacity kept), the same rows, offsets and
    /// write index, and the right padding of a chunk in flight.
    pub(crate) fn from_plain(quantization: KvQuantization, parts: KvParts) -> Result<Self> {
        Ok(BatchKv {
            keys: Some(quantization.quantize(&parts.keys)?),
            values: Some(quantization.quantize(&parts.values)?),
            left_padding: parts.left_padding,
            offset: parts.offset,
            idx: parts.idx,
            right_padding: parts.right_padding,
            setting: quantization,
        })
    }

    /// The group size and bits every slot is quantized with.
    pub fn quantization(&self) -> KvQuantization {
        self.setting
    }

    /// `QuantizedKVCache.update_and_fetch` on B rows: grows the buffers in
    /// steps of 256 slots (cutting a partial step first, as mlx-lm does),
    /// quantizes `k`, `v` [B, KV, L, D] and writes them at `idx..idx + L`,
    /// keys' then values' data, scales, biases; returns `[..., :idx, :]`.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Quantized, Quantized)> {
        let (ks, n) = (k.shape(), k.shape()[2]);
        let prev = self.idx;
        let capacity = self.keys.as_ref().map_or(0, KvForm::slots);
        if self.keys.is_none() || prev + n > capacity {
            let new_steps = (STEP + n - 1) / STEP * STEP;
            let (b, heads) = (ks[0], ks[1]);
            let key_widths = self.setting.widths(k);
            let value_widths = self.setting.widths(v);
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
        self.advance(n);
        let qk = self.setting.quantize(k)?;
        let qv = self.setting.quantize(v)?;
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
            write_positions(dst_k, prev..prev + n, src_k)?;
            write_positions(dst_v, prev..prev + n, src_v)?;
        }
        self.keys_and_values()
    }

    /// `extend(other)` as `BatchKVCache` extends: both buffers padded with
    /// zero triples to the longer one, ends aligned at the larger `idx` (a
    /// row with fewer keys gets more left padding), `other`'s rows after
    /// this cache's. Two caches of different quantizations do not join.
    pub fn extend(&mut self, other: BatchQuantizedKvCache) -> Result<()> {
        if self.setting != other.setting {
            return Err(error(format!(
                "BatchQuantizedKvCache::extend: a {}-bit cache (group {}) and a {}-bit one \
                 (group {})",
                self.setting.bits,
                self.setting.group_size,
                other.setting.bits,
                other.setting.group_size
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
        let len = |c: &BatchQuantizedKvCache| c.keys.as_ref().map_or(0, KvForm::slots);
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
}

/// mlx-optiq's per-layer mixed KV ([`crate::cache::MixedKvCache`]) over a
/// batch: a plain `BatchKVCache` until a forward leaves `start` or more
/// slots in it, then the batched quantized cache of its whole buffers, as
/// `KVCache.to_quantized` makes it (mlx-lm's own `kv_bits` conversion in
/// `generate_step` is the same one, for every layer).
///
/// One buffer cannot be half quantized, so the batch converts as a whole,
/// when its write index (the longest row plus padding) reaches `start`:
/// for one row without padding that is the single sequence's offset, as
/// optiq converts it. Since `mx.quantize` groups along the head dimension,
/// each slot's triple is the same whenever it is quantized; what the rule
/// decides is only from which step attention reads quantized keys. As in
/// one sequence, the conversion runs at the start of the next update
/// (nothing reads the cache between optiq's hook and that update).
/// A row joining a converted batch is quantized on joining.
#[derive(Debug, Clone)]
pub struct BatchMixedKvCache {
    state: Mixed<BatchKvCache, BatchQuantizedKvCache>,
    pub(crate) quantization: KvQuantization,
    /// optiq's `quantized_kv_start`.
    pub(crate) start: i32,
}

/// A [`BatchMixedKvCache`] on one forward, before or after its conversion.
pub type BatchMixedNow<'a> = Mixed<&'a mut BatchKvCache, &'a mut BatchQuantizedKvCache>;

impl BatchMixedKvCache {
    /// Empty and plain, offsets `-left_padding`.
    pub fn new(quantization: KvQuantization, start: i32, left_padding: &[i32]) -> Self {
        BatchMixedKvCache {
            state: Mixed::Plain(BatchKvCache::new(left_padding)),
            quantization,
            start,
        }
    }

    /// A merged plain batch, still to convert.
    pub(crate) fn plain(quantization: KvQuantization, start: i32, cache: BatchKvCache) -> Self {
        BatchMixedKvCache {
            state: Mixed::Plain(cache),
            quantization,
            start,
        }
    }

    /// A merged batch of rows some of which were converted already.
    pub(crate) fn quantized(
        quantization: KvQuantization,
        start: i32,
        cache: BatchQuantizedKvCache,
    ) -> Self {
        BatchMixedKvCache {
            state: Mixed::Quantized(cache),
            quantization,
            start,
        }
    }

    /// The number of sequences.
    pub fn batch_size(&self) -> usize {
        match &self.state {
            Mixed::Plain(c) => c.batch_size(),
            Mixed::Quantized(c) => c.batch_size(),
        }
    }

    /// Each sequence's position, as the int32 vector RoPE takes.
    pub fn offsets(&self) -> Array {
        match &self.state {
            Mixed::Plain(c) => c.offsets(),
            Mixed::Quantized(c) => c.offsets(),
        }
    }

    /// Whether the batch has been converted (attention reads quantized
    /// keys).
    pub fn is_quantized(&self) -> bool {
        self.state.is_quantized()
    }

    /// The conversion when it is due (a written plain batch whose write
    /// index reached `start`), then the cache as this forward uses it.
    pub fn convert_if_due(&mut self) -> Result<BatchMixedNow<'_>> {
        if let Mixed::Plain(c) = &self.state {
            // A clone of the handles: into_parts takes the cache apart.
            if let (true, Some(parts)) = (c.idx() >= self.start, c.clone().into_parts()) {
                self.state =
                    Mixed::Quantized(BatchQuantizedKvCache::from_plain(self.quantization, parts)?);
            }
        }
        Ok(self.state.as_mut())
    }

    /// The batch converted now, whatever its write index (a plain side
    /// joining a converted one).
    fn converted(self) -> Result<BatchQuantizedKvCache> {
        match self.state {
            Mixed::Quantized(c) => Ok(c),
            Mixed::Plain(c) => {
                // Nothing written: empty, offsets still `-left_padding`.
                let empty = BatchQuantizedKvCache::new(self.quantization, c.left_padding());
                match c.into_parts() {
                    Some(parts) => BatchQuantizedKvCache::from_plain(self.quantization, parts),
                    None => Ok(empty),
                }
            }
        }
    }

    /// `make_mask(N)`: the left-padded causal mask array, in either state.
    pub fn make_mask(&self, n: i32) -> Result<Mask> {
        match &self.state {
            Mixed::Plain(c) => c.make_mask(n),
            Mixed::Quantized(c) => c.make_mask(n),
        }
    }

    /// `prepare(right_padding=...)` of the cache in its current state.
    pub fn prepare_right_padding(&mut self, right_padding: &[i32]) -> Result<()> {
        match &mut self.state {
            Mixed::Plain(c) => c.prepare_right_padding(right_padding),
            Mixed::Quantized(c) => c.prepare_right_padding(right_padding),
        }
    }

    /// `finalize()` of the cache in its current state.
    pub fn finalize(&mut self) -> Result<()> {
        match &mut self.state {
            Mixed::Plain(c) => c.finalize(),
            Mixed::Quantized(c) => c.finalize(),
        }
    }

    /// `filter(batch_indices)` of the cache in its current state.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        match &mut self.state {
            Mixed::Plain(c) => c.filter(keep),
            Mixed::Quantized(c) => c.filter(keep),
        }
    }

    /// `extend(other)`: two plain batches join plain; when either side was
    /// converted, the other is converted first.
    pub fn extend(&mut self, other: BatchMixedKvCache) -> Result<()> {
        if (self.quantization, self.start) != (other.quantization, other.start) {
            return Err(error(
                "BatchMixedKvCache::extend: two mixed caches of different quantizations".into(),
            ));
        }
        let this = std::mem::replace(
            self,
            BatchMixedKvCache::new(self.quantization, self.start, &[]),
        );
        let state = match (this.state, other.state) {
            (Mixed::Plain(mut a), Mixed::Plain(b)) => {
                a.extend(b)?;
                Mixed::Plain(a)
            }
            (a, b) => {
                let side = |state| BatchMixedKvCache {
                    state,
                    quantization: this.quantization,
                    start: this.start,
                };
                let mut a = side(a).converted()?;
                a.extend(side(b).converted()?)?;
                Mixed::Quantized(a)
            }
        };
        self.state = state;
        Ok(())
    }

    /// `extract(idx)`: the row's plain keys and values, or its quantized
    /// triples once converted.
    pub fn extract(&self, row: usize) -> Result<MixedRow> {
        Ok(match &self.state {
            Mixed::Plain(c) => Mixed::Plain(c.extract(row)?),
            Mixed::Quantized(c) => Mixed::Quantized(c.extract(row)?),
        })
    }

    /// The arrays a step boundary evaluates.
    pub(crate) fn state(&self) -> Vec<&Array> {
        match &self.state {
            Mixed::Plain(c) => c.state(),
            Mixed::Quantized(c) => c.state(),
        }
    }
}

/// One row of a [`BatchMixedKvCache`]: keys and values, plain or quantized.
pub type MixedRow = Mixed<(Array, Array), (Quantized, Quantized)>;

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

    #[test]
    fn a_plain_row_joining_a_converted_mixed_batch_is_quantized_slot_by_slot() {
        let mut converted = BatchMixedKvCache::new(Q4, 0, &[0]);
        let ka = keys(1, 3, 0.0);
        let BatchMixedNow::Plain(c) = converted.convert_if_due().unwrap() else {
            panic!("an empty cache converted");
        };
        c.update_and_fetch(&ka, &ka).unwrap();
        assert!(converted.convert_if_due().is_ok() && converted.is_quantized());
        let mut plain = BatchMixedKvCache::new(Q4, 0, &[0]);
        let kb = keys(1, 2, 5.0);
        let BatchMixedNow::Plain(c) = plain.convert_if_due().unwrap() else {
            panic!("an empty cache converted");
        };
        c.update_and_fetch(&kb, &kb).unwrap();
        converted.extend(plain).unwrap();
        let MixedRow::Quantized((row1, _)) = converted.extract(1).unwrap() else {
            panic!("the joined row is not quantized");
        };
        assert_eq!(bytes(&row1), bytes(&Q4.quantize(&kb).unwrap()));
        let MixedRow::Quantized((row0, _)) = converted.extract(0).unwrap() else {
            panic!("the converted row is not quantized");
        };
        assert_eq!(bytes(&row0), bytes(&Q4.quantize(&ka).unwrap()));
    }
}
