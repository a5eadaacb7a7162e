//! The monolith's batched forward ([`BatchLm`]): B sequences as mlx-lm's
//! models run them under `BatchGenerator`, with `BatchKVCache`s: RoPE at
//! each sequence's own offset (an int32 vector), the left-padded causal
//! mask array (also for one-token steps), attention over the shared key
//! buffer. Everything after the mixer is the single-sequence layer
//! ([`Monolith::finish_layer`]).
//!
//! Batched: attention layers with a plain cache, full (`BatchKVCache`) or
//! sliding (`BatchRotatingKVCache`), layers that share another layer's K/V
//! (Gemma-4), Qwen3.5's gated attention and Gated DeltaNet (batched
//! `ArraysCache`). Quantized KV caches are refused because mlx-lm cannot
//! batch them either (`QuantizedKVCache` has no `merge`).

use std::collections::HashMap;

use archgen_runtime::attention::Mask;
use archgen_runtime::batch::{
    BatchCache, BatchKvCache, BatchLayerCache, BatchLm, BatchRotatingKvCache,
};
use archgen_runtime::batch_deltanet::{gated_delta_net_batch, BatchArraysCache};
use archgen_runtime::blocks::{self as b, SharedKv};
use archgen_runtime::deltanet;
use archgen_runtime::distributed::sharded_to_all;
use archgen_runtime::mlx_rs::error::Exception;
use archgen_runtime::ops::Result;
use archgen_runtime::Array;
use archgen_spec::ir::{self, KvSource, Window};

use crate::{LayerMixer, Monolith};

/// Why a layer cannot run in a batch yet, or `None` when it can.
fn unbatched(mixer: &LayerMixer) -> Option<&'static str> {
    match mixer {
        LayerMixer::Attention {
            kv: KvSource::Shared { .. },
            ..
        } => None,
        LayerMixer::Attention {
            kv: KvSource::Own { cache, .. },
            ..
        } => match cache {
            ir::KvCache::Plain => None,
            ir::KvCache::Quantized(_) => Some(
                "a quantized KV cache cannot be batched: mlx-lm's QuantizedKVCache has no merge(), \
                 so BatchGenerator refuses it too",
            ),
            ir::KvCache::QuantizedAfterForward { .. } => Some(
                "mlx-optiq's mixed KV cache cannot be batched: it becomes a QuantizedKVCache, \
                 which mlx-lm cannot merge",
            ),
        },
        LayerMixer::GatedAttention { .. } | LayerMixer::GatedDeltaNet(_) => None,
    }
}

/// The mask of one window kind, from that kind's batched cache before any
/// update (`_make_masks`: `create_attention_mask(h, c, window_size=...)`).
fn mask_for(cache: &BatchLayerCache, n: i32, window: Window) -> Result<Mask> {
    match (cache, window) {
        (BatchLayerCache::Full(c), Window::Full) => c.make_mask(n),
        (BatchLayerCache::Sliding(c), Window::Sliding(w)) => c.make_mask(n, w as i32),
        (BatchLayerCache::Full(_), Window::Sliding(_))
        | (BatchLayerCache::Sliding(_), Window::Full)
        | (BatchLayerCache::Arrays(_), _) => Err(Exception::custom(
            "the first layer of a window kind has a batched cache of another kind",
        )),
    }
}

/// A K/V cache's per-row RoPE offsets (before this step's update).
fn kv_offsets(c: &BatchLayerCache, i: usize) -> Result<Array> {
    match c {
        BatchLayerCache::Full(c) => Ok(c.offsets()),
        BatchLayerCache::Sliding(c) => Ok(c.offsets()),
        BatchLayerCache::Arrays(_) => Err(Exception::custom(format!(
            "layer {i}: an attention layer has an ArraysCache"
        ))),
    }
}

/// `cache.update_and_fetch(keys, values)` of a K/V cache.
fn kv_update(c: &mut BatchLayerCache, k: &Array, v: &Array, i: usize) -> Result<(Array, Array)> {
    match c {
        BatchLayerCache::Full(c) => c.update_and_fetch(k, v),
        BatchLayerCache::Sliding(c) => c.update_and_fetch(k, v),
        BatchLayerCache::Arrays(_) => Err(Exception::custom(format!(
            "layer {i}: an attention layer has an ArraysCache"
        ))),
    }
}

impl BatchLm for Monolith {
    fn vocab_size(&self) -> i32 {
        self.ir.vocab_size as i32
    }

    /// `_merge_caches` of fresh `make_cache()`s: a `BatchKVCache` per full
    /// layer that owns K/V, a `BatchRotatingKVCache(window)` per sliding
    /// one, nothing for layers that share K/V.
    fn make_batch_cache(&self, n: usize) -> Result<BatchCache> {
        let no_padding = vec![0; n];
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| match (unbatched(&l.mixer), &l.mixer) {
                (Some(why), _) => Err(Exception::custom(format!(
                    "{}: layer {i}: {why}",
                    self.ir.name
                ))),
                (
                    None,
                    LayerMixer::Attention {
                        kv: KvSource::Shared { .. },
                        ..
                    },
                ) => Ok(None),
                (
                    None,
                    LayerMixer::Attention {
                        window: Window::Sliding(w),
                        ..
                    },
                ) => Ok(Some(BatchLayerCache::Sliding(BatchRotatingKvCache::new(
                    *w as i32,
                    &no_padding,
                )))),
                (None, LayerMixer::GatedDeltaNet(_)) => Ok(Some(BatchLayerCache::Arrays(
                    BatchArraysCache::merged_empty(n),
                ))),
                (
                    None,
                    LayerMixer::Attention {
                        window: Window::Full,
                        ..
                    }
                    | LayerMixer::GatedAttention { .. },
                ) => Ok(Some(BatchLayerCache::Full(BatchKvCache::new(&no_padding)))),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(BatchCache { layers })
    }

    fn forward_batch(&self, ids: &Array, cache: &mut BatchCache) -> Result<Array> {
        let eps = self.ir.norm_eps;
        let n = ids.shape()[1];
        if cache.layers.len() != self.layers.len() {
            return Err(Exception::custom(format!(
                "a batched cache of {} layers for a model of {}",
                cache.layers.len(),
                self.layers.len()
            )));
        }
        // One mask per window kind, from the first layer of that kind.
        let mut masks: Vec<(Window, Mask)> = Vec::new();
        for (l, c) in self.layers.iter().zip(&cache.layers) {
            let Some(window) = l.mixer.window() else {
                continue;
            };
            if masks.iter().any(|(w, _)| *w == window) {
                continue;
            }
            let c = c.as_ref().ok_or_else(|| {
                Exception::custom("the first layer of its window has no batched K/V cache")
            })?;
            masks.push((window, mask_for(c, n, window)?));
        }
        // Gated DeltaNet layers: `create_ssm_mask(h, cache[ssm_idx])`.
        let ssm_mask = match cache
            .layers
            .iter()
            .flatten()
            .find(|c| matches!(c, BatchLayerCache::Arrays(_)))
        {
            Some(BatchLayerCache::Arrays(c)) => c.make_mask(n)?,
            Some(BatchLayerCache::Full(_) | BatchLayerCache::Sliding(_)) | None => None,
        };
        let mask_of = |i: usize, window: Window| -> Result<&Mask> {
            masks
                .iter()
                .find(|(w, _)| *w == window)
                .map(|(_, m)| m)
                .ok_or_else(|| Exception::custom(format!("layer {i}: no mask for its window")))
        };
        let (mut h, per_layer) = self.inputs(ids)?;
        let mut shared: HashMap<usize, SharedKv> = HashMap::new();
        for (i, layer) in self.layers.iter().enumerate() {
            if let Some(why) = unbatched(&layer.mixer) {
                return Err(Exception::custom(format!("layer {i}: {why}")));
            }
            let x = layer.norms.mixer_input(&h, eps)?;
            let a = match &layer.mixer {
                LayerMixer::Attention {
                    kv: source,
                    attn,
                    shape,
                    rope,
                    window,
                } => {
                    let mask = mask_of(i, *window)?;
                    match (source, &attn.kv, cache.layers[i].as_mut()) {
                        (KvSource::Own { .. }, Some(kv), Some(c)) => {
                            // `self.rope(x, offset=cache.offset)`: one offset per row.
                            let offsets = kv_offsets(c, i)?;
                            let (q, k, v) =
                                b::project_qkv(&x, attn, kv, *shape, &|t| rope.apply(t, &offsets))?;
                            let (keys, values) = kv_update(c, &k, &v, i)?;
                            let o = b::attend_with(&q, &keys, &values, *shape, mask, false)?;
                            shared.insert(
                                i,
                                SharedKv {
                                    keys,
                                    values,
                                    offset: offsets,
                                },
                            );
                            sharded_to_all(attn.o_proj.forward(&o)?)?
                        }
                        (KvSource::Shared { donor }, _, _) => {
                            let kvs = shared.get(donor).ok_or_else(|| {
                                Exception::custom(format!(
                                    "layer {i}: donor layer {donor} produced no K/V"
                                ))
                            })?;
                            b::attention_shared_kv(&x, attn, *shape, rope, kvs, mask)?
                        }
                        (KvSource::Own { .. }, _, _) => {
                            return Err(Exception::custom(format!(
                                "layer {i}: owns its K/V but has no K/V weights or batched cache"
                            )))
                        }
                    }
                }
                LayerMixer::GatedAttention { attn, shape, rope } => {
                    let mask = mask_of(i, Window::Full)?;
                    let c = cache.layers[i].as_mut().ok_or_else(|| {
                        Exception::custom(format!(
                            "layer {i}: a gated attention layer has no cache"
                        ))
                    })?;
                    let offsets = kv_offsets(c, i)?;
                    let [q, k, v, gate] = deltanet::gated_attention_qkv(&x, attn, *shape, &|t| {
                        rope.apply(t, &offsets)
                    })?;
                    let (keys, values) = kv_update(c, &k, &v, i)?;
                    let o = b::attend_with(&q, &keys, &values, *shape, mask, false)?;
                    deltanet::gated_attention_output(&o, &gate, &attn.o_proj)?
                }
                LayerMixer::GatedDeltaNet(w) => match cache.layers[i].as_mut() {
                    Some(BatchLayerCache::Arrays(c)) => {
                        gated_delta_net_batch(&x, w, c, ssm_mask.as_ref())?
                    }
                    Some(BatchLayerCache::Full(_) | BatchLayerCache::Sliding(_)) | None => {
                        return Err(Exception::custom(format!(
                            "layer {i}: a Gated DeltaNet layer needs a batched ArraysCache"
                        )))
                    }
                },
            };
            h = self.finish_layer(i, layer, &h, &a, per_layer.as_ref())?;
        }
        self.head(&h)
    }
}
