//! The monolith's batched forward ([`BatchLm`]): B sequences as mlx-lm's
//! models run them under `BatchGenerator`, with `BatchKVCache`s: RoPE at
//! each sequence's own offset (an int32 vector), the left-padded causal
//! mask array (also for one-token steps), attention over the shared key
//! buffer. The batched mixers are the runtime's
//! ([`archgen_runtime::batch_blocks`], shared with the generated models);
//! everything after the mixer is the single-sequence layer
//! ([`Monolith::finish_layer`]).
//!
//! Batched: attention layers with a plain cache, full (`BatchKVCache`) or
//! sliding (`BatchRotatingKVCache`), layers that share another layer's K/V
//! (Gemma-4), Qwen3.5's gated attention, DeepSeek-V3's latent attention
//! (its latent and RoPE key in a `BatchKVCache`), Gated DeltaNet (batched
//! `ArraysCache`), and full layers with a quantized KV cache (archgen's
//! batched `QuantizedKVCache`, [`archgen_runtime::batch_quant`]: mlx-lm
//! has no merge for it, so no mlx-lm batch to mirror), and mlx-optiq's
//! mixed KV (plain, then quantized:
//! [`archgen_runtime::batch_quant::BatchMixedKvCache`]).

use std::collections::HashMap;

use archgen_ir::{self as ir, KvSource, Window};
use archgen_runtime::attention::Mask;
use archgen_runtime::batch::{
    BatchCache, BatchKvCache, BatchLayerCache, BatchLm, BatchRotatingKvCache,
};
use archgen_runtime::batch_blocks as bb;
use archgen_runtime::batch_deltanet::{gated_delta_net_batch, BatchArraysCache};
use archgen_runtime::batch_quant::{BatchMixedKvCache, BatchQuantizedKvCache, KvQuantization};
use archgen_runtime::blocks::{self as b, SharedKv};
use archgen_runtime::mlx_rs::error::Exception;
use archgen_runtime::ops::Result;
use archgen_runtime::short_conv;
use archgen_runtime::Array;

use crate::{LayerMixer, Monolith};

/// The runtime's window size of an IR window (0: full attention).
fn window_size(window: Window) -> i32 {
    match window {
        Window::Full => 0,
        Window::Sliding(w) => w as i32,
    }
}

/// A layer's fresh batched cache (as its single-sequence cache in
/// `make_cache`, merged), `None` for a layer reading a donor's K/V.
fn batch_cache(mixer: &LayerMixer, no_padding: &[i32]) -> Option<BatchLayerCache> {
    let quantization = |q: &ir::KvQuant| KvQuantization {
        group_size: q.group_size as i32,
        bits: q.bits as i32,
    };
    match mixer {
        LayerMixer::Attention {
            kv: KvSource::Shared { .. },
            ..
        } => None,
        LayerMixer::Attention {
            kv: KvSource::Own { cache, .. },
            window,
            ..
        }
        | LayerMixer::FusedQkvAttention { window, cache, .. } => Some(match (*window, cache) {
            (Window::Sliding(w), _) => {
                BatchLayerCache::Sliding(BatchRotatingKvCache::new(w as i32, no_padding))
            }
            (Window::Full, ir::KvCache::Plain) => {
                BatchLayerCache::Full(BatchKvCache::new(no_padding))
            }
            (Window::Full, ir::KvCache::Quantized(q)) => {
                BatchLayerCache::Quantized(BatchQuantizedKvCache::new(quantization(q), no_padding))
            }
            (Window::Full, ir::KvCache::QuantizedAfterForward { quant, start }) => {
                BatchLayerCache::QuantizedAfterForward(BatchMixedKvCache::new(
                    quantization(quant),
                    *start as i32,
                    no_padding,
                ))
            }
        }),
        LayerMixer::GatedAttention { .. } | LayerMixer::LatentAttention { .. } => {
            Some(BatchLayerCache::Full(BatchKvCache::new(no_padding)))
        }
        LayerMixer::GatedDeltaNet(_) | LayerMixer::ShortConv(_) => Some(BatchLayerCache::Arrays(
            BatchArraysCache::merged_empty(no_padding.len()),
        )),
    }
}

impl BatchLm for Monolith {
    fn vocab_size(&self) -> i32 {
        self.ir.vocab_size as i32
    }

    /// `_merge_caches` of fresh `make_cache()`s: a `BatchKVCache` per full
    /// layer that owns K/V (its quantized or mixed counterpart where the
    /// layer's cache is one), a `BatchRotatingKVCache(window)` per sliding
    /// one, a batched `ArraysCache` per Gated DeltaNet or short conv, nothing for layers
    /// that share K/V.
    fn make_batch_cache(&self, n: usize) -> Result<BatchCache> {
        let no_padding = vec![0; n];
        let layers = self
            .layers
            .iter()
            .map(|l| batch_cache(&l.mixer, &no_padding))
            .collect();
        Ok(BatchCache { layers })
    }

    fn forward_batch(&self, ids: &Array, cache: &mut BatchCache) -> Result<Array> {
        let eps = self.ir.norm_eps;
        let n = ids.shape()[1];
        cache.check_layers(self.layers.len())?;
        // One mask per window kind, from the first layer of that kind.
        let mut masks: Vec<(Window, Mask)> = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let Some(window) = l.mixer.window() else {
                continue;
            };
            if masks.iter().any(|(w, _)| *w == window) {
                continue;
            }
            masks.push((
                window,
                bb::window_mask(cache.layer(i)?, n, window_size(window))?,
            ));
        }
        // Gated DeltaNet layers: `create_ssm_mask(h, cache[ssm_idx])`.
        let ssm_mask = cache.ssm_mask(n)?;
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
                    match (source, &attn.kv) {
                        (KvSource::Own { .. }, Some(kv)) => {
                            let (a, kvs) = bb::attention_own_kv(
                                &x,
                                attn,
                                kv,
                                *shape,
                                rope,
                                cache.layer_mut(i)?,
                                mask,
                            )?;
                            shared.insert(i, kvs);
                            a
                        }
                        (KvSource::Shared { donor }, _) => {
                            let kvs = shared.get(donor).ok_or_else(|| {
                                Exception::custom(format!(
                                    "layer {i}: donor layer {donor} produced no K/V"
                                ))
                            })?;
                            b::attention_shared_kv(&x, attn, *shape, rope, kvs, mask)?
                        }
                        (KvSource::Own { .. }, None) => {
                            return Err(Exception::custom(format!(
                                "layer {i}: owns its K/V but has no K/V weights"
                            )))
                        }
                    }
                }
                // One qkv_proj: the same steps as the arm above, the
                // projection split from one product.
                LayerMixer::FusedQkvAttention {
                    attn,
                    shape,
                    rope,
                    window,
                    ..
                } => {
                    let (a, kvs) = bb::attention_fused_qkv(
                        &x,
                        attn,
                        *shape,
                        rope,
                        cache.layer_mut(i)?,
                        mask_of(i, *window)?,
                    )?;
                    shared.insert(i, kvs);
                    a
                }
                LayerMixer::GatedAttention { attn, shape, rope } => bb::gated_attention(
                    &x,
                    attn,
                    *shape,
                    rope,
                    cache.layer_mut(i)?,
                    mask_of(i, Window::Full)?,
                )?,
                LayerMixer::LatentAttention { attn, shape, rope } => bb::latent_attention(
                    &x,
                    attn,
                    shape,
                    rope,
                    cache.layer_mut(i)?,
                    mask_of(i, Window::Full)?,
                )?,
                LayerMixer::GatedDeltaNet(w) => {
                    gated_delta_net_batch(&x, w, cache.arrays_mut(i)?, ssm_mask.as_ref())?
                }
                LayerMixer::ShortConv(w) => {
                    short_conv::short_conv_batch(&x, w, cache.arrays_mut(i)?, ssm_mask.as_ref())?
                }
            };
            h = self.finish_layer(i, layer, &h, &a, per_layer.as_ref())?;
        }
        self.head(&h)
    }
}
