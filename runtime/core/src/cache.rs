//! KV caches exactly as mlx-lm keeps them (`mlx_lm/models/cache.py`): the same
//! growth steps, trims, ring order and returned views, because SDPA's reduction
//! order follows the physical key order and so decides the last bits.

use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use mlx_rs::Array;

use crate::attention::{Mask, Quantized};
use crate::mlx_c::write_positions;
use crate::ops::Result;

const STEP: i32 = 256;

fn zeros_like_kv(like: &Array, len: i32) -> Result<Array> {
    let s = like.shape();
    mlx_rs::ops::zeros_dtype(&[s[0], s[1], len, s[3]], like.dtype())
}

fn cat(parts: &[Array]) -> Result<Array> {
    mlx_rs::ops::concatenate(parts, 2)
}

/// Both caches' `keys_and_values`: `[..., :offset, :]` while the buffer is
/// not yet full, else the whole buffer.
fn filled(keys: &Array, values: &Array, offset: i32) -> Result<(Array, Array)> {
    if offset < keys.shape()[2] {
        Ok((
            keys.try_index((Ellipsis, ..offset, ..))?,
            values.try_index((Ellipsis, ..offset, ..))?,
        ))
    } else {
        Ok((keys.clone(), values.clone()))
    }
}

/// cache.py's `create_attention_mask` without a window, which both `KVCache`
/// and `QuantizedKVCache` use: no mask for one token, else "causal".
fn unwindowed_mask(n: i32) -> Mask {
    if n == 1 {
        Mask::None
    } else {
        Mask::Causal
    }
}

/// `KVCache`: preallocated in steps of 256, returns `[..., :offset, :]`.
#[derive(Debug, Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    pub offset: i32,
}

impl KvCache {
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let prev = self.offset;
        let n = k.shape()[2];
        let capacity = self.keys.as_ref().map_or(0, |a| a.shape()[2]);
        if self.keys.is_none() || prev + n > capacity {
            let n_steps = (STEP + n - 1) / STEP;
            let new_k = zeros_like_kv(k, n_steps * STEP)?;
            let new_v = zeros_like_kv(v, n_steps * STEP)?;
            match (self.keys.take(), self.values.take()) {
                (Some(mut keys), Some(mut values)) => {
                    if prev % STEP != 0 {
                        keys = keys.try_index((Ellipsis, ..prev, ..))?;
                        values = values.try_index((Ellipsis, ..prev, ..))?;
                    }
                    self.keys = Some(cat(&[keys, new_k])?);
                    self.values = Some(cat(&[values, new_v])?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
        }
        self.offset += n;
        let (keys, values) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        write_positions(keys, prev..self.offset, k)?;
        write_positions(values, prev..self.offset, v)?;
        filled(
            self.keys.as_ref().unwrap(),
            self.values.as_ref().unwrap(),
            self.offset,
        )
    }

    /// `KVCache.make_mask(N)` for a full-attention layer.
    pub fn make_mask(&self, n: i32) -> Mask {
        unwindowed_mask(n)
    }
}

/// `RotatingKVCache(max_size, keep)`: concat path for chunks (L > 1), in-place
/// ring for single steps; returns the physical buffer (not temporal order).
#[derive(Debug)]
pub struct RotatingKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    pub offset: i32,
    max_size: i32,
    keep: i32,
    idx: i32,
}

impl RotatingKvCache {
    pub fn new(max_size: i32, keep: i32) -> Self {
        RotatingKvCache {
            keys: None,
            values: None,
            offset: 0,
            max_size,
            keep,
            idx: 0,
        }
    }

    fn trim(&self, trim_size: i32, v: &Array, append: Option<&Array>) -> Result<Array> {
        let mut parts = if trim_size > 0 {
            vec![
                v.try_index((Ellipsis, ..self.keep, ..))?,
                v.try_index((Ellipsis, (trim_size + self.keep).., ..))?,
            ]
        } else {
            vec![v.clone()]
        };
        if let Some(a) = append {
            parts.push(a.clone());
        }
        cat(&parts)
    }

    fn temporal_order(&self, v: &Array) -> Result<Array> {
        if self.idx == v.shape()[2] {
            Ok(v.clone())
        } else if self.idx < self.offset {
            cat(&[
                v.try_index((Ellipsis, ..self.keep, ..))?,
                v.try_index((Ellipsis, self.idx.., ..))?,
                v.try_index((Ellipsis, self.keep..self.idx, ..))?,
            ])
        } else {
            Ok(v.try_index((Ellipsis, ..self.idx, ..))?)
        }
    }

    fn update_concat(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        match (self.keys.take(), self.values.take()) {
            (Some(keys), Some(values)) => {
                let keys = self.temporal_order(&keys)?;
                let values = self.temporal_order(&values)?;
                self.idx = keys.shape()[2];
                // At most max_size + S - 1 entries, so every query sees a full window.
                let trim_size = self.idx - self.max_size + 1;
                self.keys = Some(self.trim(trim_size, &keys, Some(k))?);
                self.values = Some(self.trim(trim_size, &values, Some(v))?);
            }
            _ => {
                self.keys = Some(k.clone());
                self.values = Some(v.clone());
            }
        }
        self.offset += k.shape()[2];
        let keys = self.keys.clone().unwrap();
        self.idx = keys.shape()[2];
        Ok((keys, self.values.clone().unwrap()))
    }

    fn update_in_place(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let s = k.shape()[2];
        let prev = self.offset;
        let capacity = self.keys.as_ref().map_or(0, |a| a.shape()[2]);
        if self.keys.is_none() || (prev >= capacity && capacity < self.max_size) {
            let new_size = STEP.min(self.max_size - prev);
            let new_k = zeros_like_kv(k, new_size)?;
            let new_v = zeros_like_kv(v, new_size)?;
            match (self.keys.take(), self.values.take()) {
                (Some(keys), Some(values)) => {
                    self.keys = Some(cat(&[keys, new_k])?);
                    self.values = Some(cat(&[values, new_v])?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
            self.idx = prev;
        }
        let trim_size = self.keys.as_ref().unwrap().shape()[2] - self.max_size;
        if trim_size > 0 {
            self.keys = Some(self.trim(trim_size, self.keys.as_ref().unwrap(), None)?);
            self.values = Some(self.trim(trim_size, self.values.as_ref().unwrap(), None)?);
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = self.keep;
        }
        let (at, end) = (self.idx, self.idx + s);
        write_positions(self.keys.as_mut().unwrap(), at..end, k)?;
        write_positions(self.values.as_mut().unwrap(), at..end, v)?;
        self.offset += s;
        self.idx += s;
        filled(
            self.keys.as_ref().unwrap(),
            self.values.as_ref().unwrap(),
            self.offset,
        )
    }

    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        if k.shape()[2] == 1 {
            self.update_in_place(k, v)
        } else {
            self.update_concat(k, v)
        }
    }

    /// `RotatingKVCache.make_mask(N, window_size)` for a sliding layer.
    pub fn make_mask(&self, n: i32, window: i32) -> Result<Mask> {
        if n > 1 {
            let offset = (self.max_size - 1).min(self.offset);
            if offset + n > window {
                Ok(Mask::Array(crate::attention::causal_mask(
                    n,
                    offset,
                    Some(window),
                )?))
            } else {
                Ok(Mask::Causal)
            }
        } else if self.offset >= window && self.max_size > window {
            // mlx-lm's roll mask: never taken for Gemma-4 (max_size == window).
            Err(mlx_rs::error::Exception::custom(
                "RotatingKvCache: max_size > window is not supported",
            ))
        } else {
            Ok(Mask::None)
        }
    }
}

/// `QuantizedKVCache(group_size, bits)`: like `KVCache` (steps of 256, slice
/// assignment, `[..., :offset, :]` views) but holding `mx.quantize`d K and V.
/// mlx-lm can use it only on full-attention layers that no KV-shared layer
/// reads (the spec validator enforces that).
#[derive(Debug)]
pub struct QuantizedKvCache {
    keys: Option<Quantized>,
    values: Option<Quantized>,
    pub offset: i32,
    pub group_size: i32,
    pub bits: i32,
}

impl QuantizedKvCache {
    pub fn new(group_size: i32, bits: i32) -> Self {
        QuantizedKvCache {
            keys: None,
            values: None,
            offset: 0,
            group_size,
            bits,
        }
    }

    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Quantized, Quantized)> {
        let s = k.shape();
        let (b, n_kv_heads, num_steps, k_head_dim) = (s[0], s[1], s[2], s[3]);
        let v_head_dim = v.shape()[3];
        let prev = self.offset;
        let capacity = self.keys.as_ref().map_or(0, |q| q.data.shape()[2]);
        if self.keys.is_none() || prev + num_steps > capacity {
            let el_per_int = 8 * 4 / self.bits; // 8 * mx.uint32.size // bits
            let new_steps = (STEP + num_steps - 1) / STEP * STEP;
            let shape = [b, n_kv_heads, new_steps];
            let zeros = |last: i32, dtype: mlx_rs::Dtype| {
                mlx_rs::ops::zeros_dtype(&[shape[0], shape[1], shape[2], last], dtype)
            };
            let init_quant = |dim: i32| -> Result<Quantized> {
                Ok(Quantized {
                    data: zeros(dim / el_per_int, mlx_rs::Dtype::Uint32)?,
                    scales: zeros(dim / self.group_size, k.dtype())?,
                    biases: zeros(dim / self.group_size, k.dtype())?,
                })
            };
            let expand_quant =
                |x: &Array| -> Result<Array> { cat(&[x.clone(), zeros(x.shape()[3], x.dtype())?]) };
            match (self.keys.take(), self.values.take()) {
                (Some(mut keys), Some(mut values)) => {
                    if prev % STEP != 0 {
                        let cut = |x: &Array| x.try_index((Ellipsis, ..prev, ..));
                        keys = keys.map(cut)?;
                        values = values.map(cut)?;
                    }
                    self.keys = Some(keys.map(expand_quant)?);
                    self.values = Some(values.map(expand_quant)?);
                }
                _ => {
                    self.keys = Some(init_quant(k_head_dim)?);
                    self.values = Some(init_quant(v_head_dim)?);
                }
            }
        }
        self.offset += num_steps;
        let (kw, ks, kb) = mlx_rs::ops::quantize(k, self.group_size, self.bits)?;
        let (vw, vs, vb) = mlx_rs::ops::quantize(v, self.group_size, self.bits)?;
        let (at, end) = (prev, self.offset);
        let keys = self.keys.as_mut().unwrap();
        let values = self.values.as_mut().unwrap();
        // `for i in range(3)`: keys[i] then values[i], in that order.
        for (dst_k, src_k, dst_v, src_v) in [
            (&mut keys.data, &kw, &mut values.data, &vw),
            (&mut keys.scales, &ks, &mut values.scales, &vs),
            (&mut keys.biases, &kb, &mut values.biases, &vb),
        ] {
            write_positions(dst_k, at..end, src_k)?;
            write_positions(dst_v, at..end, src_v)?;
        }
        self.keys_and_values()
    }

    /// `keys_and_values()`: the whole buffers when full, else `[..., :offset, :]`.
    pub fn keys_and_values(&self) -> Result<(Quantized, Quantized)> {
        let (keys, values) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        if self.offset == keys.data.shape()[2] {
            Ok((keys.clone(), values.clone()))
        } else {
            let cut = |x: &Array| x.try_index((Ellipsis, ..self.offset, ..));
            Ok((keys.map(cut)?, values.map(cut)?))
        }
    }

    /// `QuantizedKVCache.make_mask(N)`.
    pub fn make_mask(&self, n: i32) -> Mask {
        unwindowed_mask(n)
    }
}

/// mlx-optiq's per-layer mixed KV (`install_mixed_kv`, mlx-optiq 0.7.7): a plain
/// `KVCache` until a forward leaves `start` or more positions in it, then the
/// `QuantizedKVCache` that optiq's `quantize_cache_layer` makes of it:
/// `mx.quantize` of the whole key and value buffers (capacity kept), same offset.
/// optiq converts in the hook mlx-lm calls after each forward; nothing reads the
/// cache between that hook and the next forward, so converting at the start of
/// the next update ([`MixedKvCache::convert_if_due`]) gives the same state.
#[derive(Debug)]
pub struct MixedKvCache {
    state: Mixed<KvCache, QuantizedKvCache>,
    pub group_size: i32,
    pub bits: i32,
    /// optiq's `quantized_kv_start`.
    pub start: i32,
}

/// mlx-optiq's mixed KV in one of its two states: plain until the
/// conversion, quantized after. One sequence's cache ([`MixedKvCache`]) and
/// a batch's ([`crate::batch_quant::BatchMixedKvCache`]) hold their cache in
/// it and hand it to a forward as `Mixed<&mut P, &mut Q>`; a batch hands
/// back a row in it too.
#[derive(Debug, Clone)]
pub enum Mixed<P, Q> {
    Plain(P),
    Quantized(Q),
}

impl<P, Q> Mixed<P, Q> {
    /// Whether the conversion has run (attention reads quantized keys).
    pub fn is_quantized(&self) -> bool {
        match self {
            Mixed::Plain(_) => false,
            Mixed::Quantized(_) => true,
        }
    }

    /// The cache in its current state, by reference.
    pub fn as_mut(&mut self) -> Mixed<&mut P, &mut Q> {
        match self {
            Mixed::Plain(p) => Mixed::Plain(p),
            Mixed::Quantized(q) => Mixed::Quantized(q),
        }
    }
}

/// A [`MixedKvCache`] on one forward: before or after its conversion.
pub type MixedKvNow<'a> = Mixed<&'a mut KvCache, &'a mut QuantizedKvCache>;

impl MixedKvCache {
    pub fn new(group_size: i32, bits: i32, start: i32) -> Self {
        MixedKvCache {
            state: Mixed::Plain(KvCache::default()),
            group_size,
            bits,
            start,
        }
    }

    pub fn offset(&self) -> i32 {
        match &self.state {
            Mixed::Plain(c) => c.offset,
            Mixed::Quantized(c) => c.offset,
        }
    }

    /// Whether optiq's hook has converted the cache (so attention is quantized).
    pub fn is_quantized(&self) -> bool {
        self.state.is_quantized()
    }

    /// optiq's `patched_maybe_quantize` for this layer: a filled plain cache whose
    /// offset is at least `start` becomes quantized; otherwise nothing changes.
    pub fn convert_if_due(&mut self) -> Result<MixedKvNow<'_>> {
        if let Mixed::Plain(c) = &mut self.state {
            if c.offset >= self.start {
                if let (Some(keys), Some(values)) = (c.keys.take(), c.values.take()) {
                    let q = |x: &Array| -> Result<Quantized> {
                        let (data, scales, biases) =
                            mlx_rs::ops::quantize(x, self.group_size, self.bits)?;
                        Ok(Quantized {
                            data,
                            scales,
                            biases,
                        })
                    };
                    self.state = Mixed::Quantized(QuantizedKvCache {
                        keys: Some(q(&keys)?),
                        values: Some(q(&values)?),
                        offset: c.offset,
                        group_size: self.group_size,
                        bits: self.bits,
                    });
                }
            }
        }
        Ok(self.state.as_mut())
    }

    /// The mask of this layer kind: the same for both states (no window).
    pub fn make_mask(&self, n: i32) -> Mask {
        unwindowed_mask(n)
    }
}

/// The cache of one layer that owns K/V (a donor or an unshared layer).
#[derive(Debug)]
pub enum LayerCache {
    Full(KvCache),
    Sliding(RotatingKvCache),
    /// A full layer with a quantized cache (`kv_quantization`): attention
    /// then goes through [`crate::attention::quantized_sdpa`].
    Quantized(QuantizedKvCache),
    /// A full layer with mlx-optiq's mixed KV (`mixed_kv`): plain, then quantized.
    QuantizedAfterForward(MixedKvCache),
}

impl LayerCache {
    pub fn offset(&self) -> i32 {
        match self {
            LayerCache::Full(c) => c.offset,
            LayerCache::Sliding(c) => c.offset,
            LayerCache::Quantized(c) => c.offset,
            LayerCache::QuantizedAfterForward(c) => c.offset(),
        }
    }

    /// Plain K/V caches only: a quantized cache returns quantized triples, so
    /// call [`QuantizedKvCache::update_and_fetch`] on it instead.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        match self {
            LayerCache::Full(c) => c.update_and_fetch(k, v),
            LayerCache::Sliding(c) => c.update_and_fetch(k, v),
            LayerCache::Quantized(_) => Err(mlx_rs::error::Exception::custom(
                "LayerCache::update_and_fetch on a quantized cache: use QuantizedKvCache::update_and_fetch",
            )),
            LayerCache::QuantizedAfterForward(_) => Err(mlx_rs::error::Exception::custom(
                "LayerCache::update_and_fetch on a mixed KV cache: use MixedKvCache::convert_if_due",
            )),
        }
    }
}

/// A cache that does not match model `model` (not one its `make_cache` made).
fn missing_cache(model: &str) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(format!(
        "{model}: the cache holds fewer layers than the model"
    ))
}

/// Cache `k` of a sequence's K/V caches, in the order model `model`'s
/// `make_cache` made them.
pub fn kv_at<'a>(caches: &'a [LayerCache], k: usize, model: &str) -> Result<&'a LayerCache> {
    caches.get(k).ok_or_else(|| missing_cache(model))
}

/// The next layer's cache, in the order model `model`'s `make_cache` made
/// them (K/V caches or Gated DeltaNet states alike).
pub fn next_cache<'a, T>(
    caches: &mut std::slice::IterMut<'a, T>,
    model: &str,
) -> Result<&'a mut T> {
    caches.next().ok_or_else(|| missing_cache(model))
}
