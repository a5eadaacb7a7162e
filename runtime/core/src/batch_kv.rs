//! The plain batched K/V caches, exactly as mlx-lm 0.32.2 keeps them for
//! `BatchGenerator` (`mlx_lm/models/cache.py`: `BatchKVCache`,
//! `BatchRotatingKVCache`), and the row moves every batched cache shares:
//! the left-padded causal mask, rolling right padding into left padding,
//! the row checks of `filter` and `extract`, and the buffer growth step.
//!
//! This is the ground floor of the batched caches: the quantized batch
//! ([`crate::batch_quant`]) builds on these helpers, and the per-layer enum
//! and the model trait ([`crate::batch`]) sit above both. It imports
//! neither, so the batched caches have no import circle.

use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use mlx_rs::{Array, Dtype};

use crate::attention::Mask;
use crate::mlx_c::write_positions;
use crate::ops::Result;

/// `BatchKVCache.step`: buffers grow in steps of 256 slots, as `KVCache`'s.
pub(crate) const STEP: i32 = 256;

fn error(what: String) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what)
}

/// An int32 vector of host values.
pub(crate) fn int_vector(values: &[i32]) -> Array {
    Array::from_slice(values, &[values.len() as i32])
}

/// `dynamic_roll(x, shifts[:, None], axis=2)` of cache.py: row b of `x`
/// [B, H, S, D] rolled right by `shifts[b]` along the key axis, through the
/// same gather (`take_along_axis` with `(arange(S) - shift) % S`).
pub(crate) fn roll_rows(x: &Array, shifts: &[i32]) -> Result<Array> {
    let s = x.shape()[2];
    let mut idx = Vec::with_capacity(shifts.len() * s as usize);
    for &shift in shifts {
        idx.extend((0..s).map(|j| (j - shift).rem_euclid(s)));
    }
    let idx = Array::from_slice(&idx, &[shifts.len() as i32, 1, s, 1]);
    x.take_along_axis(&idx, 2)
}

/// `mx.zeros((B, H, len, D))` in `like`'s dtype.
pub(crate) fn zeros_rows(b: i32, h: i32, len: i32, d: i32, dtype: Dtype) -> Result<Array> {
    mlx_rs::ops::zeros_dtype(&[b, h, len, d], dtype)
}

/// `mx.pad(x, [(0,0), (0,0), (left, right), (0,0)])` with zeros.
/// The shape both sides of an `extend` are brought to (`_extend` of
/// `BatchKVCache` and `BatchRotatingKVCache`): heads, key and value widths,
/// dtype, and the longer side's key length.
struct ExtendLayout {
    heads: i32,
    dk: i32,
    dv: i32,
    dtype: Dtype,
    max_size: i32,
}

impl ExtendLayout {
    /// One side's keys and values (zero-length rows when it has none) with
    /// `left` zero slots before them and the rest of `max_size` after (cut
    /// from the end when longer), and its left padding moved by `left`.
    fn pad(
        &self,
        keys: &Option<Array>,
        values: &Option<Array>,
        rows: i32,
        left_padding: &[i32],
        left: i32,
    ) -> Result<(Array, Array, Vec<i32>)> {
        let (mut k, mut v) = match (keys, values) {
            (Some(k), Some(v)) => (k.clone(), v.clone()),
            _ => (
                zeros_rows(rows, self.heads, 0, self.dk, self.dtype)?,
                zeros_rows(rows, self.heads, 0, self.dv, self.dtype)?,
            ),
        };
        let mut right = self.max_size - k.shape()[2] - left;
        if right < 0 {
            k = k.try_index((Ellipsis, ..right, ..))?;
            v = v.try_index((Ellipsis, ..right, ..))?;
            right = 0;
        }
        let (k, v) = (pad_keys(&k, left, right)?, pad_keys(&v, left, right)?);
        Ok((k, v, left_padding.iter().map(|lp| lp + left).collect()))
    }
}

/// One batched cache's buffers as `extend` reads them.
struct ExtendSide<'a> {
    keys: &'a Option<Array>,
    values: &'a Option<Array>,
    left_padding: &'a [i32],
    idx: i32,
}

impl<'a> ExtendSide<'a> {
    fn of(
        keys: &'a Option<Array>,
        values: &'a Option<Array>,
        left_padding: &'a [i32],
        idx: i32,
    ) -> Self {
        ExtendSide {
            keys,
            values,
            left_padding,
            idx,
        }
    }

    /// Heads, key width, value width and dtype, when it holds keys.
    fn dims(&self) -> Option<(i32, i32, i32, Dtype)> {
        match (self.keys, self.values) {
            (Some(k), Some(v)) => Some((k.shape()[1], k.shape()[3], v.shape()[3], k.dtype())),
            _ => None,
        }
    }

    fn len(&self) -> i32 {
        self.keys.as_ref().map_or(0, |k| k.shape()[2])
    }
}

/// Both sides of an `extend` in one buffer: keys, values, left padding
/// and the shared write position.
struct Joined {
    keys: Array,
    values: Array,
    left_padding: Vec<i32>,
    idx: i32,
}

impl Joined {
    /// The fields as the caches store them.
    fn parts(self) -> (Option<Array>, Option<Array>, Vec<i32>, i32) {
        (
            Some(self.keys),
            Some(self.values),
            self.left_padding,
            self.idx,
        )
    }
}

impl ExtendLayout {
    /// `first`'s rows then `second`'s, both padded to the longer buffer with
    /// their ends aligned at the larger `idx`: a row that has fewer keys gets
    /// more left padding. `None` when neither side holds keys yet.
    fn join(first: ExtendSide<'_>, second: ExtendSide<'_>) -> Result<Option<Joined>> {
        // Python takes H, D, M from the last cache with keys.
        let Some((heads, dk, dv, dtype)) = second.dims().or_else(|| first.dims()) else {
            return Ok(None);
        };
        let idx = first.idx.max(second.idx);
        let layout = ExtendLayout {
            heads,
            dk,
            dv,
            dtype,
            max_size: first.len().max(second.len()),
        };
        let pad = |c: &ExtendSide<'_>| {
            let rows = c.left_padding.len() as i32;
            layout.pad(c.keys, c.values, rows, c.left_padding, idx - c.idx)
        };
        let (k1, v1, lp1) = pad(&first)?;
        let (k2, v2, lp2) = pad(&second)?;
        Ok(Some(Joined {
            keys: mlx_rs::ops::concatenate(&[k1, k2], 0)?,
            values: mlx_rs::ops::concatenate(&[v1, v2], 0)?,
            left_padding: lp1.into_iter().chain(lp2).collect(),
            idx,
        }))
    }
}

/// After each row's keys were rolled right by `shift[b]` slots (its
/// right padding brought to the front): those slots count as left padding
/// and no longer as the row's tokens.
pub(crate) fn shift_to_left_padding(offset: &mut [i32], left_padding: &mut [i32], shift: &[i32]) {
    for ((o, lp), s) in offset.iter_mut().zip(left_padding.iter_mut()).zip(shift) {
        *o -= s;
        *lp += s;
    }
}

pub(crate) fn pad_keys(x: &Array, left: i32, right: i32) -> Result<Array> {
    if left == 0 && right == 0 {
        return Ok(x.clone());
    }
    let s = x.shape();
    let mut parts = Vec::with_capacity(3);
    if left > 0 {
        parts.push(zeros_rows(s[0], s[1], left, s[3], x.dtype())?);
    }
    parts.push(x.clone());
    if right > 0 {
        parts.push(zeros_rows(s[0], s[1], right, s[3], x.dtype())?);
    }
    mlx_rs::ops::concatenate(&parts, 2)
}

/// `create_causal_mask(N, offset=idx, left_padding=lp)` of mlx-lm `base.py`:
/// bool [B, 1, N, idx + N], query `idx + i` of row b sees key k when
/// `k <= idx + i` and `k >= lp[b]`.
pub fn left_padded_causal_mask(n: i32, idx: i32, left_padding: &[i32]) -> Result<Array> {
    let causal = crate::attention::causal_mask(n, idx, None)?;
    let keys = mlx_rs::ops::arange::<i32, i32>(0, idx + n, 1)?.expand_dims(0)?;
    let lp = Array::from_slice(left_padding, &[left_padding.len() as i32, 1, 1, 1]);
    causal.logical_and(lp.le(&keys)?)
}

/// A written [`BatchKvCache`] taken apart ([`BatchKvCache::into_parts`]).
pub(crate) struct KvParts {
    pub keys: Array,
    pub values: Array,
    pub left_padding: Vec<i32>,
    pub offset: Vec<i32>,
    pub idx: i32,
    pub right_padding: Option<Vec<i32>>,
}

/// The form a [`BatchKv`] holds its keys and values in: plain arrays
/// ([`BatchKvCache`]) or `mx.quantize`d triples
/// ([`crate::batch_quant::BatchQuantizedKvCache`]). Every row move of
/// `BatchKVCache` (take rows, cut slots, roll, pad) is one op applied to
/// each array of the form alike, so those moves are written once, over the
/// form; only growth and `extend` differ.
pub trait KvForm: Clone + std::fmt::Debug {
    /// What the buffers are made with beyond their shapes: nothing for
    /// plain arrays, the group size and bits for quantized ones.
    type Setting: Copy + PartialEq + std::fmt::Debug;
    /// The cache's name in errors.
    const CACHE: &'static str;
    /// `f` on each array of the form alike.
    fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Self>;
    /// Its arrays, for `mx.eval`.
    fn arrays(&self) -> Vec<&Array>;
    /// Its length along the slot axis (axis 2, the same for every array).
    fn slots(&self) -> i32;
}

impl KvForm for Array {
    type Setting = ();
    const CACHE: &'static str = "BatchKvCache";
    fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Self> {
        f(self)
    }
    fn arrays(&self) -> Vec<&Array> {
        vec![self]
    }
    fn slots(&self) -> i32 {
        self.shape()[2]
    }
}

/// mlx-lm's `BatchKVCache` layout, in either [`KvForm`]: one left-padded
/// K/V buffer for B sequences of a full-attention layer, per-row offsets
/// and one shared write index. The fields are the crate's so that each
/// form's growth and `extend` (in this module and in
/// [`crate::batch_quant`]) can write them.
#[derive(Debug, Clone)]
pub struct BatchKv<F: KvForm> {
    pub(crate) keys: Option<F>,
    pub(crate) values: Option<F>,
    pub(crate) left_padding: Vec<i32>,
    pub(crate) offset: Vec<i32>,
    pub(crate) idx: i32,
    /// Set by `prepare_right_padding` for a right-padded prefill chunk,
    /// consumed by `finalize`.
    pub(crate) right_padding: Option<Vec<i32>>,
    pub(crate) setting: F::Setting,
}

/// mlx-lm's `BatchKVCache`: plain keys and values.
pub type BatchKvCache = BatchKv<Array>;

impl<F: KvForm> BatchKv<F> {
    /// `BatchKVCache(left_padding)`: empty, offsets `-left_padding`.
    pub(crate) fn empty(setting: F::Setting, left_padding: &[i32]) -> Self {
        BatchKv {
            keys: None,
            values: None,
            left_padding: left_padding.to_vec(),
            offset: left_padding.iter().map(|l| -l).collect(),
            idx: 0,
            right_padding: None,
            setting,
        }
    }

    /// The cache `BatchKVCache.merge` builds from single-sequence caches:
    /// `keys`/`values` [B, KV, len, ...] hold row b's slots right-aligned
    /// after `left_padding[b]` zero slots; every row ends at `len`
    /// ([`crate::seq_cache::merge`]).
    pub(crate) fn from_merged(
        setting: F::Setting,
        keys: F,
        values: F,
        left_padding: Vec<i32>,
    ) -> Self {
        let len = keys.slots();
        BatchKv {
            offset: left_padding.iter().map(|lp| len - lp).collect(),
            keys: Some(keys),
            values: Some(values),
            left_padding,
            idx: len,
            right_padding: None,
            setting,
        }
    }

    /// The number of sequences.
    pub fn batch_size(&self) -> usize {
        self.offset.len()
    }

    /// Each sequence's position, as the int32 vector RoPE takes
    /// (`cache.offset`).
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

    /// The arrays a step boundary evaluates (`mx.eval(c.state)`): the
    /// buffers, none before the first write.
    pub(crate) fn state(&self) -> Vec<&Array> {
        [&self.keys, &self.values]
            .into_iter()
            .flatten()
            .flat_map(F::arrays)
            .collect()
    }

    /// Both buffers once written; `what` names the caller in the error.
    fn written(&self, what: &str) -> Result<(&F, &F)> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(error(format!("{}::{what}: no keys written yet", F::CACHE))),
        }
    }

    /// `f` on every array of both buffers, kept as the new buffers (nothing
    /// before the first write).
    fn map_buffers(&mut self, f: impl Fn(&Array) -> Result<Array>) -> Result<()> {
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let (k, v) = (k.map(&f)?, v.map(&f)?);
            (self.keys, self.values) = (Some(k), Some(v));
        }
        Ok(())
    }

    /// Moves the write index and every row's offset past `n` new slots.
    pub(crate) fn advance(&mut self, n: i32) {
        for o in &mut self.offset {
            *o += n;
        }
        self.idx += n;
    }

    /// `keys_and_values()`: `[..., :idx, :]` of both buffers.
    pub fn keys_and_values(&self) -> Result<(F, F)> {
        let (k, v) = self.written("keys_and_values")?;
        let fetch = |x: &Array| x.try_index((Ellipsis, ..self.idx, ..));
        Ok((k.map(fetch)?, v.map(fetch)?))
    }

    /// `prepare(lengths=..., right_padding=...)` before a right-padded
    /// prefill chunk (`PromptProcessingBatch.prompt`): remembers the padding
    /// when any row has some.
    pub fn prepare_right_padding(&mut self, right_padding: &[i32]) -> Result<()> {
        if right_padding.len() != self.batch_size() {
            return Err(error(format!(
                "{}::prepare: {} right paddings for a batch of {}",
                F::CACHE,
                right_padding.len(),
                self.batch_size()
            )));
        }
        if right_padding.iter().any(|&p| p > 0) {
            self.right_padding = Some(right_padding.to_vec());
        }
        Ok(())
    }

    /// `finalize()`: after a right-padded chunk, rolls each row right by its
    /// padding over the whole buffer (every array of the form), so the
    /// padding's keys move before the row's real keys, where `left_padding`
    /// hides them.
    pub fn finalize(&mut self) -> Result<()> {
        let Some(padding) = self.right_padding.take() else {
            return Ok(());
        };
        self.written("finalize")?;
        self.map_buffers(|x| roll_rows(x, &padding))?;
        shift_to_left_padding(&mut self.offset, &mut self.left_padding, &padding);
        Ok(())
    }

    /// `make_mask(N)`: always an array, even for one token
    /// ([`left_padded_causal_mask`]).
    pub fn make_mask(&self, n: i32) -> Result<Mask> {
        Ok(Mask::Array(left_padded_causal_mask(
            n,
            self.idx,
            &self.left_padding,
        )?))
    }

    /// `filter(batch_indices)`: keeps rows `keep` (in that order), then
    /// drops the padding slots every kept row has (`min(left_padding)`).
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let what = format!("{}::filter", F::CACHE);
        let rows = check_rows(keep, self.batch_size(), &what)?;
        self.map_buffers(|x| x.take_axis(&rows, 0))?;
        self.offset = keep.iter().map(|&i| self.offset[i]).collect();
        self.left_padding = keep.iter().map(|&i| self.left_padding[i]).collect();
        let min_left_pad = self.left_padding.iter().copied().min().unwrap_or(0);
        if min_left_pad > 0 {
            self.map_buffers(|x| x.try_index((Ellipsis, min_left_pad.., ..)))?;
            self.idx -= min_left_pad;
            for lp in &mut self.left_padding {
                *lp -= min_left_pad;
            }
        }
        Ok(())
    }

    /// `extract(idx)`: row `row`'s real slots [1, KV, len, ...] of both
    /// buffers (what mlx-lm hands back as a single-sequence cache, without
    /// its spare capacity).
    pub fn extract(&self, row: usize) -> Result<(F, F)> {
        let what = format!("{}::extract", F::CACHE);
        check_rows(&[row], self.batch_size(), &what)?;
        let (k, v) = self.written("extract")?;
        let r = row as i32;
        let lp = self.left_padding[row];
        let cut = |x: &Array| x.try_index((r..r + 1, .., lp..self.idx))?.contiguous();
        Ok((k.map(cut)?, v.map(cut)?))
    }
}

impl BatchKvCache {
    /// `BatchKVCache(left_padding)`: empty, offsets `-left_padding`.
    pub fn new(left_padding: &[i32]) -> Self {
        BatchKv::empty((), left_padding)
    }

    /// `update_and_fetch`: writes `k`, `v` [B, KV, L, D] at `idx..idx + L`
    /// (growing the buffer by whole steps of 256 as `KVCache` does) and
    /// returns `[..., :idx, :]`.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let prev = self.idx;
        let n = k.shape()[2];
        let capacity = self.keys.as_ref().map_or(0, KvForm::slots);
        if self.keys.is_none() || prev + n > capacity {
            let (ks, vs) = (k.shape(), v.shape());
            let n_steps = (STEP + n - 1) / STEP;
            let new_k = zeros_rows(ks[0], ks[1], n_steps * STEP, ks[3], k.dtype())?;
            let new_v = zeros_rows(vs[0], vs[1], n_steps * STEP, vs[3], v.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(mut keys), Some(mut values)) => {
                    if prev % STEP != 0 {
                        keys = keys.try_index((Ellipsis, ..prev, ..))?;
                        values = values.try_index((Ellipsis, ..prev, ..))?;
                    }
                    self.keys = Some(mlx_rs::ops::concatenate(&[keys, new_k], 2)?);
                    self.values = Some(mlx_rs::ops::concatenate(&[values, new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
        }
        self.advance(n);
        let (keys, values) = self.buffers_mut()?;
        write_positions(keys, prev..prev + n, k)?;
        write_positions(values, prev..prev + n, v)?;
        self.keys_and_values()
    }

    fn buffers_mut(&mut self) -> Result<(&mut Array, &mut Array)> {
        match (self.keys.as_mut(), self.values.as_mut()) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(error("BatchKvCache: no keys written yet".into())),
        }
    }

    /// `extend(other)`: appends `other`'s rows. Both buffers are padded to
    /// the same length with their ends aligned at the larger `idx`: a row
    /// that has fewer keys gets more left padding.
    pub fn extend(&mut self, other: BatchKvCache) -> Result<()> {
        let joined = ExtendLayout::join(self.extend_side(), other.extend_side())?;
        self.offset.extend(other.offset);
        match joined {
            None => self.left_padding.extend(other.left_padding),
            Some(j) => (self.keys, self.values, self.left_padding, self.idx) = j.parts(),
        }
        Ok(())
    }

    fn extend_side(&self) -> ExtendSide<'_> {
        ExtendSide::of(&self.keys, &self.values, &self.left_padding, self.idx)
    }

    /// Its whole buffers (spare capacity included) and row bookkeeping,
    /// `None` before any key is written: what `KVCache.to_quantized`
    /// quantizes ([`crate::batch_quant::BatchMixedKvCache`]).
    pub(crate) fn into_parts(self) -> Option<KvParts> {
        match (self.keys, self.values) {
            (Some(keys), Some(values)) => Some(KvParts {
                keys,
                values,
                left_padding: self.left_padding,
                offset: self.offset,
                idx: self.idx,
                right_padding: self.right_padding,
            }),
            _ => None,
        }
    }
}

/// `mx.roll(x, shift, axis)` along `axis` (uniform for every row): element
/// j of the result is `x[(j - shift) mod len]`.
fn roll_axis(x: &Array, shift: i32, axis: i32) -> Result<Array> {
    let ndim = x.ndim() as i32;
    let axis = if axis < 0 { axis + ndim } else { axis };
    let len = x.shape()[axis as usize];
    let s = shift.rem_euclid(len.max(1));
    if s == 0 {
        return Ok(x.clone());
    }
    let cut = len - s;
    let tail = x.split_at_indices(&[cut], axis)?;
    mlx_rs::ops::concatenate(&[tail[1].clone(), tail[0].clone()], axis)
}

/// mlx-lm's `BatchRotatingKVCache(max_size, left_padding)`: one left-padded
/// ring buffer for B sequences of a sliding-window layer. Prefill chunks
/// (L > 1) concatenate in temporal order and trim to `max_size + L - 1`;
/// one-token steps write in place into the ring once it is full.
#[derive(Debug, Clone)]
pub struct BatchRotatingKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    left_padding: Vec<i32>,
    offset: Vec<i32>,
    max_size: i32,
    /// `_idx`: the write index into the buffer.
    idx: i32,
    /// `_offset`: the tokens written (the same for every row).
    written: i32,
    rotated: bool,
    /// `_lengths`: set by [`BatchRotatingKvCache::prepare_right_padding`].
    lengths: Option<Vec<i32>>,
}

impl BatchRotatingKvCache {
    /// `BatchRotatingKVCache(max_size, left_padding)`: empty.
    pub fn new(max_size: i32, left_padding: &[i32]) -> Self {
        BatchRotatingKvCache {
            keys: None,
            values: None,
            left_padding: left_padding.to_vec(),
            offset: left_padding.iter().map(|l| -l).collect(),
            max_size,
            idx: 0,
            written: 0,
            rotated: false,
            lengths: None,
        }
    }

    pub fn batch_size(&self) -> usize {
        self.offset.len()
    }

    /// Each sequence's position, as the int32 vector RoPE takes.
    pub fn offsets(&self) -> Array {
        int_vector(&self.offset)
    }

    /// Each sequence's padding slots before its first key.
    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    fn trim(trim_size: i32, v: &Array, append: Option<&Array>) -> Result<Array> {
        let v = if trim_size > 0 {
            v.try_index((Ellipsis, trim_size.., ..))?
        } else {
            v.clone()
        };
        match append {
            Some(a) => mlx_rs::ops::concatenate(&[v, a.clone()], 2),
            None => Ok(v),
        }
    }

    /// `_temporal_order`: unrolls a rotated ring.
    fn temporal_order(&mut self) -> Result<()> {
        if self.rotated {
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                let (k, v) = (roll_axis(k, -self.idx, 2)?, roll_axis(v, -self.idx, 2)?);
                self.idx = k.shape()[2];
                self.keys = Some(k);
                self.values = Some(v);
            }
            self.rotated = false;
        }
        Ok(())
    }

    /// Rolls each row right by `max(0, offset - lengths)`: a right-padded
    /// row's padding moves in front of its keys.
    fn roll_right_padding(&mut self, lengths: &[i32]) -> Result<()> {
        let roll: Vec<i32> = self
            .offset
            .iter()
            .zip(lengths)
            .map(|(o, l)| (o - l).max(0))
            .collect();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            self.keys = Some(roll_rows(k, &roll)?);
            self.values = Some(roll_rows(v, &roll)?);
        }
        shift_to_left_padding(&mut self.offset, &mut self.left_padding, &roll);
        Ok(())
    }

    fn update_concat(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        match (self.keys.clone(), self.values.clone()) {
            (Some(_), Some(_)) => {
                self.temporal_order()?;
                let (mut keys, mut values) = match (self.keys.take(), self.values.take()) {
                    (Some(k), Some(v)) => (k, v),
                    _ => return Err(error("BatchRotatingKvCache: lost its keys".into())),
                };
                if keys.shape()[2] > self.idx {
                    keys = keys.try_index((Ellipsis, ..self.idx, ..))?;
                    values = values.try_index((Ellipsis, ..self.idx, ..))?;
                }
                self.keys = Some(keys);
                self.values = Some(values);
                if let Some(lengths) = self.lengths.clone() {
                    self.roll_right_padding(&lengths)?;
                }
                // At most max_size + L - 1 keys, so every query sees a full window.
                let trim_size = self.idx - self.max_size + 1;
                if trim_size > 0 {
                    for lp in &mut self.left_padding {
                        *lp -= trim_size;
                    }
                }
                let (keys, values) = (self.keys.take(), self.values.take());
                let (keys, values) = match (keys, values) {
                    (Some(k), Some(v)) => (k, v),
                    _ => return Err(error("BatchRotatingKvCache: lost its keys".into())),
                };
                self.keys = Some(Self::trim(trim_size, &keys, Some(k))?);
                self.values = Some(Self::trim(trim_size, &values, Some(v))?);
            }
            _ => {
                self.keys = Some(k.clone());
                self.values = Some(v.clone());
            }
        }
        let n = k.shape()[2];
        for o in &mut self.offset {
            *o += n;
        }
        self.written += n;
        match (&self.keys, &self.values) {
            (Some(keys), Some(values)) => {
                self.idx = keys.shape()[2];
                Ok((keys.clone(), values.clone()))
            }
            _ => Err(error("BatchRotatingKvCache: lost its keys".into())),
        }
    }

    fn update_in_place(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        if self.lengths.is_some() {
            return Err(error(
                "BatchRotatingKvCache: finalize() must run before one-token steps".into(),
            ));
        }
        let (ks, vs) = (k.shape(), v.shape());
        let s = ks[2];
        let prev = self.written;
        let capacity = self.keys.as_ref().map_or(0, KvForm::slots);
        if self.keys.is_none() || (prev >= capacity && capacity < self.max_size) {
            let new_size = STEP.min(self.max_size - prev);
            if new_size <= 0 {
                return Err(error(format!(
                    "BatchRotatingKvCache: cannot grow a {capacity}-slot buffer at offset {prev} \
                     (max_size {})",
                    self.max_size
                )));
            }
            let new_k = zeros_rows(ks[0], ks[1], new_size, ks[3], k.dtype())?;
            let new_v = zeros_rows(vs[0], vs[1], new_size, vs[3], v.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(keys), Some(values)) => {
                    self.keys = Some(mlx_rs::ops::concatenate(&[keys, new_k], 2)?);
                    self.values = Some(mlx_rs::ops::concatenate(&[values, new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
            self.idx = prev;
        }
        let capacity = self.keys.as_ref().map_or(0, KvForm::slots);
        let trim_size = capacity - self.max_size;
        if trim_size > 0 {
            if let (Some(keys), Some(values)) = (&self.keys, &self.values) {
                self.keys = Some(Self::trim(trim_size, keys, None)?);
                self.values = Some(Self::trim(trim_size, values, None)?);
            }
            self.idx = self.max_size;
            for lp in &mut self.left_padding {
                *lp -= trim_size;
            }
        }
        if self.idx == self.max_size {
            self.rotated = true;
            self.idx = 0;
        }
        if self.rotated {
            for lp in &mut self.left_padding {
                *lp -= s;
            }
        }
        let at = self.idx;
        match (self.keys.as_mut(), self.values.as_mut()) {
            (Some(keys), Some(values)) => {
                write_positions(keys, at..at + s, k)?;
                write_positions(values, at..at + s, v)?;
            }
            _ => return Err(error("BatchRotatingKvCache: lost its keys".into())),
        }
        self.written += s;
        for o in &mut self.offset {
            *o += s;
        }
        self.idx += s;
        self.keys_and_values()
    }

    /// `update_and_fetch`: the concat path for chunks, the ring for one token.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        if k.shape()[2] == 1 {
            self.update_in_place(k, v)
        } else {
            self.update_concat(k, v)
        }
    }

    /// `keys_and_values()`: `[..., :_offset, :]` until the buffer is full.
    /// The arrays a step boundary evaluates (`mx.eval(c.state)`): the
    /// buffers, none before the first write.
    pub(crate) fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    pub fn keys_and_values(&self) -> Result<(Array, Array)> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if self.written < k.shape()[2] => Ok((
                k.try_index((Ellipsis, ..self.written, ..))?,
                v.try_index((Ellipsis, ..self.written, ..))?,
            )),
            (Some(k), Some(v)) => Ok((k.clone(), v.clone())),
            _ => Err(error("BatchRotatingKvCache: no keys written yet".into())),
        }
    }

    /// `prepare(lengths=..., right_padding=...)`.
    pub fn prepare_right_padding(&mut self, lengths: &[i32], right_padding: &[i32]) -> Result<()> {
        if lengths.len() != self.batch_size() || right_padding.len() != self.batch_size() {
            return Err(error(format!(
                "BatchRotatingKvCache::prepare: {} lengths and {} paddings for a batch of {}",
                lengths.len(),
                right_padding.len(),
                self.batch_size()
            )));
        }
        if right_padding.iter().any(|&p| p > 0) {
            self.lengths = Some(
                lengths
                    .iter()
                    .zip(&self.offset)
                    .map(|(l, o)| l + o)
                    .collect(),
            );
        }
        Ok(())
    }

    /// `finalize()`: right padding rolled in front of each row's keys.
    pub fn finalize(&mut self) -> Result<()> {
        if let Some(lengths) = self.lengths.take() {
            self.roll_right_padding(&lengths)?;
        }
        Ok(())
    }

    /// `make_mask(N, window_size)`: the windowed causal mask, each row's
    /// padding hidden, rolled to the ring's order on a rotated one-token step.
    pub fn make_mask(&self, n: i32, window: i32) -> Result<Mask> {
        let offset = (self.max_size - 1).min(self.written);
        let mask = crate::attention::causal_mask(n, offset, Some(window))?;
        let mut lp = self.left_padding.clone();
        let trim_size = self.idx - self.max_size + i32::from(n > 1);
        if trim_size > 0 {
            lp.iter_mut().for_each(|p| *p -= trim_size);
        }
        let rotated = n == 1 && (self.rotated || self.idx >= self.max_size);
        if rotated {
            lp.iter_mut().for_each(|p| *p -= 1);
        }
        let keys = mlx_rs::ops::arange::<i32, i32>(0, offset + n, 1)?.expand_dims(0)?;
        let lp = Array::from_slice(&lp, &[lp.len() as i32, 1, 1, 1]);
        let mut mask = mask.logical_and(keys.ge(&lp)?)?;
        if rotated {
            let idx = if self.idx >= self.max_size {
                0
            } else {
                self.idx
            };
            mask = roll_axis(&mask, idx + 1, -1)?;
        }
        Ok(Mask::Array(mask))
    }

    /// The window (`max_size`) every row's ring holds.
    pub fn max_size(&self) -> i32 {
        self.max_size
    }

    /// The cache `BatchRotatingKVCache.merge` builds: `keys`/`values`
    /// [B, KV, len, D] in temporal order, row b's keys right-aligned after
    /// `left_padding[b]` zero slots, `offsets` each row's position (a fresh
    /// row's is 0); write index and tokens written are `len`, not rotated
    /// ([`crate::seq_cache::merge`]).
    pub(crate) fn from_merged(
        max_size: i32,
        keys: Array,
        values: Array,
        left_padding: Vec<i32>,
        offsets: Vec<i32>,
    ) -> Self {
        let len = keys.shape()[2];
        BatchRotatingKvCache {
            keys: Some(keys),
            values: Some(values),
            left_padding,
            offset: offsets,
            max_size,
            idx: len,
            written: len,
            rotated: false,
            lengths: None,
        }
    }

    /// `extract(idx)`: row `row` as mlx-lm's single-sequence
    /// `RotatingKVCache`: its keys and values [1, KV, n, D] in temporal
    /// order (a rotated ring unrolled, the row's padding cut) and its
    /// position.
    pub fn extract(&self, row: usize) -> Result<(Array, Array, i32)> {
        check_rows(&[row], self.batch_size(), "BatchRotatingKvCache::extract")?;
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (k, v),
            _ => {
                return Err(error(
                    "BatchRotatingKvCache::extract: no keys written yet".into(),
                ))
            }
        };
        let r = row as i32;
        let padding = self.left_padding[row].max(0);
        let (mut k, mut v) = (k.try_index(r..r + 1)?, v.try_index(r..r + 1)?);
        let mut end = self.idx;
        if self.rotated {
            k = roll_axis(&k, -self.idx, 2)?;
            v = roll_axis(&v, -self.idx, 2)?;
            end = self.max_size;
        }
        let cut =
            |x: &Array| -> Result<Array> { x.try_index((.., .., padding..end))?.contiguous() };
        Ok((cut(&k)?, cut(&v)?, self.offset[row]))
    }

    /// `filter(batch_indices)`: keeps rows `keep` (no padding is dropped).
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let BatchRotatingKvCache {
            keys,
            values,
            offset,
            left_padding,
            ..
        } = self;
        Rows(keys, values, offset, left_padding).keep(keep, "BatchRotatingKvCache::filter")?;
        Ok(())
    }

    /// `extend(other)`: both rings in temporal order when their write
    /// positions differ, then padded to one length with ends aligned.
    pub fn extend(&mut self, mut other: BatchRotatingKvCache) -> Result<()> {
        if self.keys.is_none() && other.keys.is_none() {
            self.left_padding.extend(other.left_padding);
            self.offset.extend(other.offset);
            return Ok(());
        }
        if self.rotated != other.rotated || self.idx != other.idx {
            self.temporal_order()?;
            other.temporal_order()?;
        }
        let Some(joined) = ExtendLayout::join(self.extend_side(), other.extend_side())? else {
            return Err(error("BatchRotatingKvCache::extend: no keys".into()));
        };
        (self.keys, self.values, self.left_padding, self.idx) = joined.parts();
        self.offset.extend(other.offset);
        self.written = self.written.max(other.written);
        Ok(())
    }

    fn extend_side(&self) -> ExtendSide<'_> {
        ExtendSide::of(&self.keys, &self.values, &self.left_padding, self.idx)
    }
}

/// The per-row parts of a batched K/V cache that `filter` selects from:
/// keys, values, offsets, left padding.
struct Rows<'a>(
    &'a mut Option<Array>,
    &'a mut Option<Array>,
    &'a mut Vec<i32>,
    &'a mut Vec<i32>,
);

impl Rows<'_> {
    /// Keeps rows `keep`, in that order; `what` names the caller in errors.
    fn keep(self, keep: &[usize], what: &str) -> Result<()> {
        let Rows(keys, values, offset, left_padding) = self;
        let rows = check_rows(keep, offset.len(), what)?;
        if let (Some(k), Some(v)) = (keys.as_mut(), values.as_mut()) {
            *k = k.take_axis(&rows, 0)?;
            *v = v.take_axis(&rows, 0)?;
        }
        *offset = keep.iter().map(|&i| offset[i]).collect();
        *left_padding = keep.iter().map(|&i| left_padding[i]).collect();
        Ok(())
    }
}

/// `mx.eval` of the arrays `arrays` gives for each layer that has a cache.
pub(crate) fn eval_layers<'a, L>(
    layers: &'a [Option<L>],
    arrays: impl FnMut(&'a L) -> Vec<&'a Array>,
) -> Result<()> {
    let all: Vec<&Array> = layers.iter().flatten().flat_map(arrays).collect();
    mlx_rs::transforms::eval(all)
}

/// The row indices as an int32 array, after checking them against `batch`.
pub(crate) fn check_rows(rows: &[usize], batch: usize, what: &str) -> Result<Array> {
    if let Some(bad) = rows.iter().find(|&&r| r >= batch) {
        return Err(error(format!("{what}: row {bad} of a batch of {batch}")));
    }
    let rows: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
    Ok(int_vector(&rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(b: i32, len: i32) -> Array {
        let n = b * len;
        mlx_rs::ops::arange::<i32, f32>(1, n + 1, 1)
            .unwrap()
            .reshape(&[b, 1, len, 1])
            .unwrap()
    }

    #[test]
    fn roll_moves_each_row_by_its_shift() {
        let x = filled(2, 4);
        let r = roll_rows(&x, &[1, 3]).unwrap();
        assert_eq!(
            r.as_slice::<f32>(),
            &[4.0, 1.0, 2.0, 3.0, 6.0, 7.0, 8.0, 5.0]
        );
    }

    #[test]
    fn mask_hides_left_padding_and_the_future() {
        let m = left_padded_causal_mask(2, 1, &[0, 1]).unwrap();
        assert_eq!(m.shape(), &[2, 1, 2, 3]);
        let got: Vec<bool> = m.as_slice::<bool>().to_vec();
        #[rustfmt::skip]
        let want = [
            true, true, false, true, true, true, // row 0: causal only
            false, true, false, false, true, true, // row 1: key 0 is padding
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn right_padding_becomes_left_padding() {
        let mut c = BatchKvCache::new(&[0, 0]);
        let k = filled(2, 3);
        c.prepare_right_padding(&[0, 2]).unwrap();
        c.update_and_fetch(&k, &k).unwrap();
        c.finalize().unwrap();
        assert_eq!(c.left_padding(), &[0, 2]);
        assert_eq!(c.offset_values(), &[3, 1]);
        let (keys, _) = c.keys_and_values().unwrap();
        // Row 1 wrote 4, 5, 6 of which 5, 6 were padding: rolled right by 2
        // over the 256-slot buffer, zeros land in front, 4 at slot 2.
        let row1 = keys.try_index(1).unwrap().reshape(&[-1]).unwrap();
        assert_eq!(row1.as_slice::<f32>(), &[0.0, 0.0, 4.0]);
    }

    #[test]
    fn filter_drops_shared_padding_and_extend_aligns_ends() {
        let mut a = BatchKvCache::new(&[0, 0]);
        a.prepare_right_padding(&[2, 0]).unwrap();
        a.update_and_fetch(&filled(2, 3), &filled(2, 3)).unwrap();
        a.finalize().unwrap();
        a.filter(&[0]).unwrap();
        // Row 0 had 2 padding slots, now the only row: they are dropped.
        assert_eq!((a.idx(), a.left_padding()), (1, &[0][..]));
        let mut b = BatchKvCache::new(&[0]);
        b.update_and_fetch(&filled(1, 3), &filled(1, 3)).unwrap();
        a.extend(b).unwrap();
        assert_eq!(a.idx(), 3);
        assert_eq!(a.left_padding(), &[2, 0]);
        assert_eq!(a.offset_values(), &[1, 3]);
        let (k, _) = a.extract(0).unwrap();
        assert_eq!(k.shape(), &[1, 1, 1, 1]);
        assert_eq!(k.as_slice::<f32>(), &[1.0]);
    }
}
