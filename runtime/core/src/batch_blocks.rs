//! The batched sequence mixers: the layer math of B sequences in one
//! forward, as mlx-lm's modules compute it under `BatchGenerator`, composed
//! once here for the monolith and every generated model ([`BatchLm`]
//! implementations). Each block is its single-sequence counterpart in
//! [`crate::blocks`] / [`crate::deltanet`] with two differences: RoPE takes
//! one offset per row (`cache.offset` is an int32 vector in a
//! `BatchKVCache`), and the cache is a batched one ([`BatchLayerCache`]).
//! Layers that read a donor's K/V run [`crate::blocks::attention_shared_kv`]
//! unchanged: the donor's [`SharedKv`] carries the per-row offsets.
//!
//! [`BatchLm`]: crate::batch::BatchLm

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

use crate::attention::Mask;
use crate::batch::{BatchCache, BatchLayerCache};
use crate::batch_deltanet::BatchArraysCache;
use crate::batch_quant::{BatchMixedNow, BatchQuantizedKvCache};
use crate::blocks::{
    self as b, AttentionShape, AttentionWeights, FusedQkvAttention, KvWeights, SharedKv,
};
use crate::decode::{self, StepCache, StepQkv};
use crate::deltanet::{self, GatedAttention};
use crate::distributed::sharded_to_all;
use crate::ops::Result;
use crate::rope::{Rope, RopeTables};

fn error(what: String) -> Exception {
    Exception::custom(what)
}

/// The mask of one window kind, from the batched cache of the first layer
/// of that kind before any update (`_make_masks`:
/// `create_attention_mask(h, c, window_size=...)`); `window` 0 is full
/// attention, as in [`crate::blocks::mask_for`].
pub fn window_mask(cache: &BatchLayerCache, n: i32, window: i32) -> Result<Mask> {
    match cache {
        BatchLayerCache::Full(c) if window == 0 => c.make_mask(n),
        BatchLayerCache::Sliding(c) if window > 0 => c.make_mask(n, window),
        BatchLayerCache::Quantized(c) if window == 0 => c.make_mask(n),
        BatchLayerCache::QuantizedAfterForward(c) if window == 0 => c.make_mask(n),
        BatchLayerCache::Full(_)
        | BatchLayerCache::Sliding(_)
        | BatchLayerCache::Arrays(_)
        | BatchLayerCache::Quantized(_)
        | BatchLayerCache::QuantizedAfterForward(_) => Err(error(format!(
            "the first layer of a window kind ({}) has a batched cache of another kind",
            match window {
                0 => "full".to_string(),
                w => format!("sliding {w}"),
            }
        ))),
    }
}

/// An attention layer given a Gated DeltaNet's cache (a model whose
/// layers and caches went out of step).
fn arrays_cache_in_attention() -> Exception {
    error("an attention layer has a Gated DeltaNet's ArraysCache".into())
}

/// A K/V cache's per-row RoPE offsets (before this step's update).
fn kv_offsets(c: &BatchLayerCache) -> Result<Array> {
    match c {
        BatchLayerCache::Full(c) => Ok(c.offsets()),
        BatchLayerCache::Sliding(c) => Ok(c.offsets()),
        BatchLayerCache::Quantized(c) => Ok(c.offsets()),
        BatchLayerCache::QuantizedAfterForward(c) => Ok(c.offsets()),
        BatchLayerCache::Arrays(_) => Err(arrays_cache_in_attention()),
    }
}

/// `cache.update_and_fetch(keys, values)` of a plain K/V cache (a
/// quantized one returns quantized triples: [`attend_cached`] takes it).
fn kv_update(c: &mut BatchLayerCache, k: &Array, v: &Array) -> Result<(Array, Array)> {
    match c {
        BatchLayerCache::Full(c) => c.update_and_fetch(k, v),
        BatchLayerCache::Sliding(c) => c.update_and_fetch(k, v),
        BatchLayerCache::Quantized(_) | BatchLayerCache::QuantizedAfterForward(_) => Err(error(
            "a quantized KV cache on a layer whose attention reads plain keys (only \
             plain attention layers take quantized_scaled_dot_product_attention)"
                .into(),
        )),
        BatchLayerCache::Arrays(_) => Err(arrays_cache_in_attention()),
    }
}

/// DeepSeek-V3's latent attention over a batch
/// ([`crate::mla::latent_attention_with`]): RoPE at each row's offset, the
/// latent and the RoPE key in the layer's `BatchKVCache`, the mask the
/// model made from its first layer's cache (an array, also for one token).
pub fn latent_attention(
    x: &Array,
    w: &crate::mla::LatentAttention,
    s: &crate::mla::LatentShape,
    rope: &Rope,
    cache: &mut BatchLayerCache,
    mask: &Mask,
) -> Result<Array> {
    let offsets = kv_offsets(cache)?;
    let mask = match mask {
        Mask::Array(m) => Some(m),
        Mask::None => None,
        Mask::Causal => {
            return Err(error(
                "latent attention reads its mask as an array (return_array=True)".into(),
            ))
        }
    };
    crate::mla::latent_attention_with(x, w, s, rope, &offsets, |k, v| kv_update(cache, k, v), mask)
}

/// A K/V-owning layer's attention over a batch, as
/// [`crate::blocks::attention_own_kv`] with its separate projections.
pub fn attention_own_kv(
    x: &Array,
    w: &AttentionWeights,
    kv: &KvWeights,
    s: AttentionShape,
    rope: &Rope,
    cache: &mut BatchLayerCache,
    mask: &Mask,
) -> Result<(Array, SharedKv)> {
    attention_projected(x, b::OwnQkv::Separate { attn: w, kv }, s, rope, cache, mask)
}

/// [`attention_own_kv`] of a layer with one `qkv_proj` (phi3): the same
/// steps, Q, K and V split from one product.
pub fn attention_fused_qkv(
    x: &Array,
    w: &FusedQkvAttention,
    s: AttentionShape,
    rope: &Rope,
    cache: &mut BatchLayerCache,
    mask: &Mask,
) -> Result<(Array, SharedKv)> {
    attention_projected(x, b::OwnQkv::Fused(w), s, rope, cache, mask)
}

/// The attention of a K/V-owning layer over a batch, whichever its
/// projections: RoPE at each row's offset (`self.rope(x,
/// offset=cache.offset)`), the batched cache updated, SDPA over the shared
/// key buffer ([`attend_cached`]), the output projection. Returns the K/V
/// that later layers sharing it read (with the per-row offsets).
fn attention_projected(
    x: &Array,
    qkv: b::OwnQkv<'_>,
    s: AttentionShape,
    rope: &Rope,
    cache: &mut BatchLayerCache,
    mask: &Mask,
) -> Result<(Array, SharedKv)> {
    let offsets = kv_offsets(cache)?;
    let (q, k, v) = qkv.project(x, s, &|t| rope.apply(t, &offsets))?;
    let sinks = qkv.sinks();
    let (o, shared) = attend_cached(&q, &k, &v, offsets, s, cache, mask, false, sinks)?;
    Ok((sharded_to_all(qkv.o_proj().forward(&o)?)?, shared))
}

/// The batched cache updated with `k`, `v`, and `q` attending over it: the
/// heads merged back ([B, L, H * D], or rows [B * L, H * D] with `rows`)
/// and the K/V, with the rows' offsets, for the layers that share them.
#[allow(clippy::too_many_arguments)]
fn attend_cached(
    q: &Array,
    k: &Array,
    v: &Array,
    offsets: Array,
    s: AttentionShape,
    cache: &mut BatchLayerCache,
    mask: &Mask,
    rows: bool,
    sinks: Option<&Array>,
) -> Result<(Array, SharedKv)> {
    let (keys, values) = match cache {
        BatchLayerCache::Quantized(c) => {
            return attend_quantized(q, k, v, offsets, s, c, mask, rows)
        }
        // mlx-optiq's mixed KV: plain until converted.
        BatchLayerCache::QuantizedAfterForward(c) => match c.convert_if_due()? {
            BatchMixedNow::Quantized(c) => {
                return attend_quantized(q, k, v, offsets, s, c, mask, rows)
            }
            BatchMixedNow::Plain(c) => c.update_and_fetch(k, v)?,
        },
        BatchLayerCache::Full(_) | BatchLayerCache::Sliding(_) | BatchLayerCache::Arrays(_) => {
            kv_update(cache, k, v)?
        }
    };
    let o = b::attend_with(q, &keys, &values, s, mask, rows, sinks)?;
    let shared = SharedKv {
        keys,
        values,
        offset: offsets,
    };
    Ok((o, shared))
}

/// [`attend_cached`] over a batched quantized cache, as mlx-lm's
/// `scaled_dot_product_attention` routes a cache with `.bits`: the rows'
/// K/V quantized into the cache, then
/// `quantized_scaled_dot_product_attention` with the left-padded mask
/// array. The K/V handed on are the packed keys, which a layer sharing
/// them refuses ([`crate::blocks::attend_shared_kv`]), as in one sequence.
#[allow(clippy::too_many_arguments)]
fn attend_quantized(
    q: &Array,
    k: &Array,
    v: &Array,
    offsets: Array,
    s: AttentionShape,
    cache: &mut BatchQuantizedKvCache,
    mask: &Mask,
    rows: bool,
) -> Result<(Array, SharedKv)> {
    b::refuse_softcap_over_quantized(s.scores)?;
    let (qk, qv) = cache.update_and_fetch(k, v)?;
    let quant = cache.quantization();
    let groups = (quant.group_size, quant.bits);
    b::attend_quantized_fetched(q, qk, qv, s, mask, groups, offsets, rows)
}

/// A batch's one-token step (every row at L = 1) takes the compiled decode
/// blocks of one sequence's step ([`crate::decode`]), B rows at once: only
/// the RoPE offsets (one per row) and the cache update and attention
/// differ, and they run as the eager batched layer runs them.
impl StepCache for BatchLayerCache {
    fn rope_offset(&self) -> Result<Array> {
        kv_offsets(self)
    }

    fn attend(&mut self, t: StepQkv, mask: &Mask) -> Result<(Array, SharedKv)> {
        let sinks = t.sinks.as_ref();
        attend_cached(&t.q, &t.k, &t.v, t.offset, t.shape, self, mask, true, sinks)
    }
}

/// The RoPE tables of a batch's one-token step for the compiled decode
/// blocks (as [`Rope::tables`] for one sequence), at the rows' offsets in
/// `cache` (a window's first layer, before any update); `None` when the
/// step has more than one token per row or the decode blocks are off, and
/// the layers run their eager batched forward.
pub fn step_tables(
    rope: &Rope,
    cache: &BatchLayerCache,
    n: i32,
    dtype: Dtype,
) -> Result<Option<RopeTables>> {
    if n != 1 || !decode::enabled() {
        return Ok(None);
    }
    Ok(Some(rope.tables_at(&kv_offsets(cache)?, n, dtype)?))
}

/// Whether a hybrid model's batched one-token steps (a Gated DeltaNet
/// layer's, a gated attention layer's) take one sequence's compiled decode
/// blocks, B rows at once: on the CPU, where they give the eager batched
/// layers' bits (tests/batch_parity.rs). On a GPU the eager batched layers
/// run, as mlx-lm's do: through the blocks, qwen3.5-4b-l4's and
/// qwen3-next-80b-a3b-l4's batches gave other bits than mlx-lm's
/// `BatchGenerator` on the H200 (docs/parity.md, "On the GPU").
fn hybrid_blocks_in_batches() -> bool {
    decode::enabled() && crate::device::on_cpu()
}

/// [`step_tables`] for a gated attention layer's batched step: `None` also
/// where [`hybrid_blocks_in_batches`] says the eager batched layer runs.
pub fn gated_step_tables(
    rope: &Rope,
    cache: &BatchLayerCache,
    n: i32,
    dtype: Dtype,
) -> Result<Option<RopeTables>> {
    if !hybrid_blocks_in_batches() {
        return Ok(None);
    }
    step_tables(rope, cache, n, dtype)
}

/// A batch's one-token step of a Gated DeltaNet layer through the compiled
/// decode block of one sequence's step ([`decode::delta_net`]), B rows at
/// once. `None` when the eager batched layer runs it instead: more than one
/// token per row, the blocks off for batches ([`hybrid_blocks_in_batches`]),
/// the states not written yet, or a row padded at this position. With every
/// row real, mlx-lm's masked ops keep what the unmasked ones compute
/// (`where(mask, qkv, 0)` and `where(mask, state, old_state)` with an
/// all-true mask), so the block gives the eager batched layer's bits
/// (tests/batch_parity.rs).
pub fn delta_net_step(
    h: &Array,
    layer: &decode::DeltaNetLayer<'_>,
    cache: &mut BatchArraysCache,
) -> Result<Option<Array>> {
    if h.shape()[1] != 1 || !hybrid_blocks_in_batches() || !cache.every_position_real(1) {
        return Ok(None);
    }
    let Some(mut states) = cache.take_states() else {
        return Ok(None);
    };
    let out = decode::delta_net(h, layer, &mut states);
    // Back before any error is returned: a failed step keeps the batch's states.
    cache.put_states(states);
    let out = out?;
    cache.advance(1);
    Ok(Some(out))
}

/// Qwen3.5's output-gated attention (`Qwen3NextAttention`) over a batch.
pub fn gated_attention(
    x: &Array,
    w: &GatedAttention,
    s: AttentionShape,
    rope: &Rope,
    cache: &mut BatchLayerCache,
    mask: &Mask,
) -> Result<Array> {
    let offsets = kv_offsets(cache)?;
    let [q, k, v, gate] = deltanet::gated_attention_qkv(x, w, s, &|t| rope.apply(t, &offsets))?;
    let (keys, values) = kv_update(cache, &k, &v)?;
    let o = b::attend_with(&q, &keys, &values, s, mask, false, None)?;
    deltanet::gated_attention_output(&o, &gate, &w.o_proj)
}

impl BatchCache {
    /// Checks that this cache was made for a model of `layers` layers.
    pub fn check_layers(&self, layers: usize) -> Result<()> {
        if self.layers.len() == layers {
            Ok(())
        } else {
            Err(error(format!(
                "a batched cache of {} layers for a model of {layers}",
                self.layers.len()
            )))
        }
    }

    /// Layer `i`'s batched cache (a layer that owns K/V or a Gated DeltaNet).
    pub fn layer(&self, i: usize) -> Result<&BatchLayerCache> {
        self.layers
            .get(i)
            .and_then(Option::as_ref)
            .ok_or_else(|| error(format!("layer {i} has no batched cache")))
    }

    /// Layer `i`'s batched cache, to update.
    pub fn layer_mut(&mut self, i: usize) -> Result<&mut BatchLayerCache> {
        self.layers
            .get_mut(i)
            .and_then(Option::as_mut)
            .ok_or_else(|| error(format!("layer {i} has no batched cache")))
    }

    /// Layer `i`'s batched `ArraysCache` (a Gated DeltaNet layer's).
    pub fn arrays_mut(&mut self, i: usize) -> Result<&mut BatchArraysCache> {
        match self.layers.get_mut(i) {
            Some(Some(BatchLayerCache::Arrays(c))) => Ok(c),
            Some(
                Some(
                    BatchLayerCache::Full(_)
                    | BatchLayerCache::Sliding(_)
                    | BatchLayerCache::Quantized(_)
                    | BatchLayerCache::QuantizedAfterForward(_),
                )
                | None,
            )
            | None => Err(error(format!(
                "layer {i}: a Gated DeltaNet layer needs a batched ArraysCache"
            ))),
        }
    }

    /// The mask of the Gated DeltaNet layers, `create_ssm_mask(h,
    /// cache[ssm_idx])`: from the first `ArraysCache`, `None` without one.
    pub fn ssm_mask(&self, n: i32) -> Result<Option<Array>> {
        match self
            .layers
            .iter()
            .flatten()
            .find(|c| matches!(c, BatchLayerCache::Arrays(_)))
        {
            Some(BatchLayerCache::Arrays(c)) => c.make_mask(n),
            Some(
                BatchLayerCache::Full(_)
                | BatchLayerCache::Sliding(_)
                | BatchLayerCache::Quantized(_)
                | BatchLayerCache::QuantizedAfterForward(_),
            )
            | None => Ok(None),
        }
    }
}
