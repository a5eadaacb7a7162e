//! Batched caches and masks exactly as mlx-lm 0.32.2 keeps them for
//! `BatchGenerator` (`mlx_lm/models/cache.py`: `BatchKVCache`), so that a
//! batch of B sequences of different lengths computes what mlx-lm's batch
//! computes, byte for byte (docs/parity.md, "Batches").
//!
//! What a batch keeps per sequence: its `left_padding` (the slots before its
//! first real key) and its `offset` (its RoPE position, `-left_padding` plus
//! every token written since). Every sequence shares one write index `idx`
//! into one key buffer [B, KV, capacity, D]; a row's real keys are
//! `left_padding[b]..idx`. The mask hides each row's padding; RoPE takes the
//! offsets as one int32 vector (`mx.fast.rope` with an array offset rotates
//! row b from `offset[b]`).
//!
//! The physical layout is mirrored, not only the values: SDPA reduces over
//! the whole key axis, so the buffer length and where padding sits decide
//! the last bits. That is also why a request's bits depend on its batch
//! mates (their lengths set the padding).
//!
//! This module is the face over the batched caches: [`BatchLayerCache`]
//! (one layer's cache, by kind), [`BatchCache`] (a model's), and the models'
//! batched forward [`BatchLm`]. The plain caches and the row moves they all
//! share are in [`crate::batch_kv`]; the quantized ones, built on those, in
//! [`crate::batch_quant`]. The scheduler that mirrors `BatchGenerator`
//! (joins, chunked prefill, leaves) is [`crate::batch_session`].

use mlx_rs::Array;

use crate::batch_deltanet::BatchArraysCache;
use crate::batch_kv::eval_layers;
// The plain caches are the variants' payloads, so the face of the batched
// caches names them too (generated models import them from here).
pub use crate::batch_kv::{BatchKvCache, BatchRotatingKvCache};
use crate::batch_quant::{BatchMixedKvCache, BatchQuantizedKvCache};
use crate::ops::Result;

fn error(what: String) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what)
}

/// The batched cache of one layer, by the cache kind mlx-lm merges its
/// single-sequence cache into (`_merge_caches`).
#[derive(Debug, Clone)]
pub enum BatchLayerCache {
    /// `KVCache.merge` → `BatchKVCache` (full attention).
    Full(BatchKvCache),
    /// `RotatingKVCache.merge` → `BatchRotatingKVCache` (a sliding window).
    Sliding(BatchRotatingKvCache),
    /// `ArraysCache.merge` (a Gated DeltaNet layer's conv and recurrent
    /// states).
    Arrays(BatchArraysCache),
    /// archgen's batched `QuantizedKVCache` (a full layer with
    /// `kv_quantization`; mlx-lm has no merge for it, see
    /// [`crate::batch_quant`]).
    Quantized(BatchQuantizedKvCache),
    /// mlx-optiq's mixed KV over a batch (`mixed_kv`): plain, then
    /// quantized ([`crate::batch_quant::BatchMixedKvCache`]).
    QuantizedAfterForward(BatchMixedKvCache),
}

impl BatchLayerCache {
    /// The number of sequences.
    pub fn batch_size(&self) -> usize {
        match self {
            BatchLayerCache::Full(c) => c.batch_size(),
            BatchLayerCache::Sliding(c) => c.batch_size(),
            BatchLayerCache::Arrays(c) => c.batch_size(),
            BatchLayerCache::Quantized(c) => c.batch_size(),
            BatchLayerCache::QuantizedAfterForward(c) => c.batch_size(),
        }
    }

    fn prepare_right_padding(&mut self, lengths: &[i32], right_padding: &[i32]) -> Result<()> {
        match self {
            BatchLayerCache::Full(c) => c.prepare_right_padding(right_padding),
            BatchLayerCache::Sliding(c) => c.prepare_right_padding(lengths, right_padding),
            BatchLayerCache::Arrays(c) => {
                c.prepare(lengths);
                Ok(())
            }
            BatchLayerCache::Quantized(c) => c.prepare_right_padding(right_padding),
            BatchLayerCache::QuantizedAfterForward(c) => c.prepare_right_padding(right_padding),
        }
    }

    fn finalize(&mut self) -> Result<()> {
        match self {
            BatchLayerCache::Full(c) => c.finalize(),
            BatchLayerCache::Sliding(c) => c.finalize(),
            BatchLayerCache::Arrays(c) => {
                c.finalize();
                Ok(())
            }
            BatchLayerCache::Quantized(c) => c.finalize(),
            BatchLayerCache::QuantizedAfterForward(c) => c.finalize(),
        }
    }

    fn filter(&mut self, keep: &[usize]) -> Result<()> {
        match self {
            BatchLayerCache::Full(c) => c.filter(keep),
            BatchLayerCache::Sliding(c) => c.filter(keep),
            BatchLayerCache::Arrays(c) => c.filter(keep),
            BatchLayerCache::Quantized(c) => c.filter(keep),
            BatchLayerCache::QuantizedAfterForward(c) => c.filter(keep),
        }
    }

    fn extend(&mut self, other: BatchLayerCache) -> Result<()> {
        match (self, other) {
            (BatchLayerCache::Full(a), BatchLayerCache::Full(b)) => a.extend(b),
            (BatchLayerCache::Sliding(a), BatchLayerCache::Sliding(b)) => a.extend(b),
            (BatchLayerCache::Arrays(a), BatchLayerCache::Arrays(b)) => a.extend(b),
            (BatchLayerCache::Quantized(a), BatchLayerCache::Quantized(b)) => a.extend(b),
            (
                BatchLayerCache::QuantizedAfterForward(a),
                BatchLayerCache::QuantizedAfterForward(b),
            ) => a.extend(b),
            (
                BatchLayerCache::Full(_)
                | BatchLayerCache::Sliding(_)
                | BatchLayerCache::Arrays(_)
                | BatchLayerCache::Quantized(_)
                | BatchLayerCache::QuantizedAfterForward(_),
                _,
            ) => Err(error(
                "BatchCache::extend: two kinds of cache on one layer".into(),
            )),
        }
    }

    /// The arrays a step boundary evaluates (`mx.eval(c.state)`).
    fn state(&self) -> Vec<&Array> {
        match self {
            BatchLayerCache::Full(c) => c.state(),
            BatchLayerCache::Sliding(c) => c.state(),
            BatchLayerCache::Arrays(c) => c.arrays().collect(),
            BatchLayerCache::Quantized(c) => c.state(),
            BatchLayerCache::QuantizedAfterForward(c) => c.state(),
        }
    }
}

/// A model's batched cache: one entry per layer, `None` for a layer that
/// reads another layer's K/V (mlx-lm gives it no cache).
#[derive(Debug, Clone)]
pub struct BatchCache {
    pub layers: Vec<Option<BatchLayerCache>>,
}

impl BatchCache {
    /// The number of sequences.
    pub fn batch_size(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(BatchLayerCache::batch_size)
            .next()
            .unwrap_or(0)
    }

    /// `c.prepare(lengths=..., right_padding=...)` on every layer: each
    /// row's chunk length and the padding that fills it to the longest.
    pub fn prepare_right_padding(&mut self, lengths: &[i32], right_padding: &[i32]) -> Result<()> {
        self.layers
            .iter_mut()
            .flatten()
            .try_for_each(|c| c.prepare_right_padding(lengths, right_padding))
    }

    /// `c.finalize()` on every layer.
    pub fn finalize(&mut self) -> Result<()> {
        self.layers
            .iter_mut()
            .flatten()
            .try_for_each(BatchLayerCache::finalize)
    }

    /// `c.filter(keep)` on every layer.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        self.layers
            .iter_mut()
            .flatten()
            .try_for_each(|c| c.filter(keep))
    }

    /// `_extend_cache`: `other`'s rows after this cache's, layer by layer.
    pub fn extend(&mut self, other: BatchCache) -> Result<()> {
        if self.layers.len() != other.layers.len() {
            return Err(error(format!(
                "BatchCache::extend: {} layers and {} layers",
                self.layers.len(),
                other.layers.len()
            )));
        }
        for (i, (a, b)) in self.layers.iter_mut().zip(other.layers).enumerate() {
            match (a.as_mut(), b) {
                (Some(a), Some(b)) => a.extend(b)?,
                (None, None) => {}
                (Some(_), None) | (None, Some(_)) => {
                    return Err(error(format!(
                        "BatchCache::extend: layer {i} has a cache on one side only"
                    )))
                }
            }
        }
        Ok(())
    }

    /// `mx.eval([c.state for c in cache])`.
    pub fn eval(&self) -> Result<()> {
        eval_layers(&self.layers, BatchLayerCache::state)
    }
}

/// A model that runs B sequences as one batch, as mlx-lm runs it under
/// `BatchGenerator` (the monolith; see docs/parity.md, "Batches").
pub trait BatchLm {
    fn vocab_size(&self) -> i32;
    /// `_merge_caches` of `n` fresh `make_prompt_cache`s: empty batched
    /// caches with no padding. An error names a cache kind mlx-lm cannot
    /// batch (or archgen does not batch yet).
    fn make_batch_cache(&self, n: usize) -> Result<BatchCache>;
    /// Logits [B, L, vocab] for `ids` [B, L] (int32), appending to `cache`.
    fn forward_batch(&self, ids: &Array, cache: &mut BatchCache) -> Result<Array>;
}
