//! One sequence's cache taken out of a batch and put back into another, as
//! mlx-lm 0.32.2's server reuses a finished request's KV for a later prompt
//! that extends it (`mlx_lm/server.py`, `LRUPromptCache` in
//! `mlx_lm/models/cache.py`):
//! * [`extract`] is `BatchGenerator`'s `extract_cache`: each layer's
//!   `extract(idx)` (`BatchKVCache` → `KVCache`, `BatchRotatingKVCache` →
//!   `RotatingKVCache`, `ArraysCache` → `ArraysCache`, and archgen's
//!   batched quantized cache → a `QuantizedKVCache`'s triples);
//! * [`merge`] is `_merge_caches` of the caches a prompt batch admits in one
//!   step: given ones and fresh ones (`make_prompt_cache`) together, as
//!   `BatchKVCache.merge`, `BatchRotatingKVCache.merge` and
//!   `ArraysCache.merge` build them;
//! * [`SeqCache::is_trimmable`] and [`SeqCache::truncate`] are
//!   `can_trim_prompt_cache` and `trim_prompt_cache`: a full-attention KV
//!   cache always trims, a sliding window only while its ring has not
//!   wrapped (`offset < max_size`), a Gated DeltaNet state never (its
//!   recurrence cannot be rewound).

use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use mlx_rs::Array;

use crate::attention::Quantized;
use crate::batch::{BatchCache, BatchLayerCache};
use crate::batch_deltanet::BatchArraysCache;
use crate::batch_kv::{pad_keys, zeros_rows, BatchKvCache, BatchRotatingKvCache};
use crate::batch_quant::{BatchMixedKvCache, BatchQuantizedKvCache, KvQuantization, MixedRow};
use crate::ops::Result;

fn error(what: String) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what)
}

/// One layer of a single sequence's cache, by mlx-lm's cache kind.
#[derive(Debug, Clone)]
pub enum SeqLayerCache {
    /// `KVCache`: keys and values [1, KV, len, D], one per token.
    Full { keys: Array, values: Array },
    /// `RotatingKVCache`: at most a window of keys [1, KV, n, D] in temporal
    /// order (the last `n` positions before `offset`).
    Sliding {
        keys: Array,
        values: Array,
        offset: i32,
        max_size: i32,
    },
    /// `ArraysCache` of a Gated DeltaNet layer: conv state [1, K-1, C] and
    /// recurrent state [1, Hv, Dv, Dk]; of a short-conv layer: the conv
    /// state alone.
    Arrays { conv: Array, state: Option<Array> },
    /// `QuantizedKVCache`: quantized keys and values [1, KV, len, ...], one
    /// slot per token, in `quantization`.
    Quantized {
        keys: Quantized,
        values: Quantized,
        quantization: KvQuantization,
    },
}

impl SeqLayerCache {
    fn arrays(&self) -> Vec<&Array> {
        match self {
            SeqLayerCache::Full { keys, values } | SeqLayerCache::Sliding { keys, values, .. } => {
                vec![keys, values]
            }
            SeqLayerCache::Arrays { conv, state } => std::iter::once(conv).chain(state).collect(),
            SeqLayerCache::Quantized { keys, values, .. } => [keys, values]
                .into_iter()
                .flat_map(|q| [&q.data, &q.scales, &q.biases])
                .collect(),
        }
    }

    /// `is_trimmable()` of the layer's mlx-lm cache.
    fn is_trimmable(&self) -> bool {
        match self {
            SeqLayerCache::Full { .. } | SeqLayerCache::Quantized { .. } => true,
            SeqLayerCache::Sliding {
                offset, max_size, ..
            } => offset < max_size,
            SeqLayerCache::Arrays { .. } => false,
        }
    }
}

/// A single sequence's cache: one entry per layer, `None` for a layer that
/// reads another layer's K/V (as in [`BatchCache`]).
#[derive(Debug, Clone)]
pub struct SeqCache {
    pub layers: Vec<Option<SeqLayerCache>>,
}

impl SeqCache {
    /// The bytes of its arrays (mlx-lm's `sum(c.nbytes for c in cache)`).
    pub fn nbytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .flat_map(SeqLayerCache::arrays)
            .map(Array::nbytes)
            .sum()
    }

    /// `can_trim_prompt_cache`: every layer can drop its last tokens.
    pub fn is_trimmable(&self) -> bool {
        self.layers
            .iter()
            .flatten()
            .all(SeqLayerCache::is_trimmable)
    }

    /// `trim_prompt_cache(cache, len - keep)`: keeps the first `keep` tokens
    /// of a trimmable cache; an error for one that is not.
    pub fn truncate(&mut self, keep: usize) -> Result<()> {
        if !self.is_trimmable() {
            return Err(error(
                "SeqCache::truncate: a sliding window that wrapped or a recurrent state \
                 cannot drop tokens"
                    .into(),
            ));
        }
        let keep = keep as i32;
        for layer in self.layers.iter_mut().flatten() {
            match layer {
                SeqLayerCache::Full { keys, values } => {
                    let n = keep.min(keys.shape()[2]);
                    *keys = keys.try_index((Ellipsis, ..n, ..))?;
                    *values = values.try_index((Ellipsis, ..n, ..))?;
                }
                SeqLayerCache::Sliding {
                    keys,
                    values,
                    offset,
                    ..
                } => {
                    // Unwrapped: the ring holds every position from 0.
                    let n = keep.min(*offset);
                    *keys = keys.try_index((Ellipsis, ..n, ..))?;
                    *values = values.try_index((Ellipsis, ..n, ..))?;
                    *offset = n;
                }
                SeqLayerCache::Quantized { keys, values, .. } => {
                    let n = keep.min(keys.data.shape()[2]);
                    let cut = |x: &Array| x.try_index((Ellipsis, ..n, ..));
                    *keys = keys.map(cut)?;
                    *values = values.map(cut)?;
                }
                SeqLayerCache::Arrays { .. } => {
                    return Err(error(
                        "SeqCache::truncate: a recurrent state cannot drop tokens".into(),
                    ))
                }
            }
        }
        self.eval()
    }

    /// Evaluates its arrays, so that a stored cache holds its own buffers
    /// and not the batch's it was sliced from.
    pub fn eval(&self) -> Result<()> {
        crate::batch_kv::eval_layers(&self.layers, SeqLayerCache::arrays)
    }
}

/// `[c.extract(row) for c in prompt_cache]`: row `row` of a batched cache as
/// a single sequence's, evaluated.
pub fn extract(cache: &BatchCache, row: usize) -> Result<SeqCache> {
    let layers = cache
        .layers
        .iter()
        .map(|layer| {
            Ok(match layer {
                None => None,
                Some(BatchLayerCache::Full(c)) => {
                    let (keys, values) = c.extract(row)?;
                    Some(SeqLayerCache::Full { keys, values })
                }
                Some(BatchLayerCache::Sliding(c)) => {
                    let (keys, values, offset) = c.extract(row)?;
                    Some(SeqLayerCache::Sliding {
                        keys,
                        values,
                        offset,
                        max_size: c.max_size(),
                    })
                }
                Some(BatchLayerCache::Arrays(c)) => {
                    let (conv, state) = c.extract(row)?;
                    Some(SeqLayerCache::Arrays { conv, state })
                }
                Some(BatchLayerCache::Quantized(c)) => {
                    let (keys, values) = c.extract(row)?;
                    Some(SeqLayerCache::Quantized {
                        keys,
                        values,
                        quantization: c.quantization(),
                    })
                }
                Some(BatchLayerCache::QuantizedAfterForward(c)) => Some(match c.extract(row)? {
                    MixedRow::Plain((keys, values)) => SeqLayerCache::Full { keys, values },
                    MixedRow::Quantized((keys, values)) => SeqLayerCache::Quantized {
                        keys,
                        values,
                        quantization: c.quantization,
                    },
                }),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let seq = SeqCache { layers };
    seq.eval()?;
    Ok(seq)
}

/// `_merge_caches` of one prompt batch's admissions: row b starts from
/// `rows[b]` when given, else from a fresh cache. `fresh` is the model's
/// fresh batched cache of one row (`make_batch_cache(1)`), read only for
/// each layer's kind and window.
pub fn merge(fresh: &BatchCache, rows: &[Option<&SeqCache>]) -> Result<BatchCache> {
    for (i, row) in rows.iter().enumerate() {
        if let Some(row) = row {
            if row.layers.len() != fresh.layers.len() {
                return Err(error(format!(
                    "merge: row {i}'s cache has {} layers, the model {}",
                    row.layers.len(),
                    fresh.layers.len()
                )));
            }
        }
    }
    let layers =
        fresh
            .layers
            .iter()
            .enumerate()
            .map(|(l, kind)| {
                let given: Vec<Option<&SeqLayerCache>> = rows
                    .iter()
                    .map(|row| row.and_then(|r| r.layers[l].as_ref()))
                    .collect();
                Ok(match kind {
                    None => {
                        if given.iter().any(Option::is_some) {
                            return Err(error(format!(
                                "merge: layer {l} has no cache in this model but a given one"
                            )));
                        }
                        None
                    }
                    Some(BatchLayerCache::Full(_)) => {
                        Some(BatchLayerCache::Full(merge_full(l, &given)?))
                    }
                    Some(BatchLayerCache::Sliding(c)) => Some(BatchLayerCache::Sliding(
                        merge_sliding(l, c.max_size(), &given)?,
                    )),
                    Some(BatchLayerCache::Arrays(_)) => {
                        Some(BatchLayerCache::Arrays(merge_arrays(l, &given)?))
                    }
                    Some(BatchLayerCache::Quantized(c)) => Some(BatchLayerCache::Quantized(
                        merge_quantized(l, c.quantization(), &given)?,
                    )),
                    Some(BatchLayerCache::QuantizedAfterForward(c)) => Some(
                        BatchLayerCache::QuantizedAfterForward(merge_mixed(l, c, &given)?),
                    ),
                })
            })
            .collect::<Result<Vec<_>>>()?;
    Ok(BatchCache { layers })
}

fn kind_error(layer: usize, expected: &str) -> mlx_rs::error::Exception {
    error(format!(
        "merge: layer {layer}: a given cache is not {expected}, as the model's is"
    ))
}

/// Each given row as `pick` reads it (a fresh row as `None`); a row `pick`
/// does not read (another kind of cache) is refused as not `expected`.
fn given_rows<'a, T>(
    layer: usize,
    given: &[Option<&'a SeqLayerCache>],
    expected: &str,
    pick: impl Fn(&'a SeqLayerCache) -> Option<T>,
) -> Result<Vec<Option<T>>> {
    given
        .iter()
        .map(|g| match g {
            None => Ok(None),
            Some(cache) => pick(cache)
                .map(Some)
                .ok_or_else(|| kind_error(layer, expected)),
        })
        .collect()
}

/// Rows `(keys, values, len)` right-aligned in `len_max` slots after zero
/// padding, stacked: the buffers `merge` fills (`mx.zeros` then a slice
/// assignment per row: the same values).
fn stack_right_aligned(rows: &[Option<(&Array, &Array, i32)>]) -> Result<(Array, Array, Vec<i32>)> {
    let max_len = rows.iter().flatten().map(|r| r.2).max().unwrap_or(0);
    let (k0, v0) = rows
        .iter()
        .flatten()
        .map(|r| (r.0, r.1))
        .next()
        .ok_or_else(|| error("merge: no row has keys".into()))?;
    let (ks, vs) = (k0.shape(), v0.shape());
    let mut keys = Vec::with_capacity(rows.len());
    let mut values = Vec::with_capacity(rows.len());
    let mut padding = Vec::with_capacity(rows.len());
    for row in rows {
        match row {
            Some((k, v, len)) => {
                keys.push(pad_keys(k, max_len - len, 0)?);
                values.push(pad_keys(v, max_len - len, 0)?);
                padding.push(max_len - len);
            }
            None => {
                keys.push(zeros_rows(1, ks[1], max_len, ks[3], k0.dtype())?);
                values.push(zeros_rows(1, vs[1], max_len, vs[3], v0.dtype())?);
                padding.push(max_len);
            }
        }
    }
    Ok((
        mlx_rs::ops::concatenate(&keys, 0)?,
        mlx_rs::ops::concatenate(&values, 0)?,
        padding,
    ))
}

/// `BatchKVCache.merge`.
fn merge_full(layer: usize, given: &[Option<&SeqLayerCache>]) -> Result<BatchKvCache> {
    let rows = given_rows(layer, given, "a full-attention KV cache", |g| match g {
        SeqLayerCache::Full { keys, values } => Some((keys, values, keys.shape()[2])),
        _ => None,
    })?;
    if rows.iter().flatten().all(|r| r.2 == 0) {
        return Ok(BatchKvCache::new(&vec![0; given.len()]));
    }
    let (keys, values, padding) = stack_right_aligned(&rows)?;
    Ok(BatchKvCache::from_merged((), keys, values, padding))
}

/// `BatchKVCache.merge` of quantized rows: each of the three arrays of
/// both tensors right-aligned after zero padding, as a full cache's keys
/// (zero slots dequantize to zero and the mask hides them).
fn merge_quantized(
    layer: usize,
    quantization: KvQuantization,
    given: &[Option<&SeqLayerCache>],
) -> Result<BatchQuantizedKvCache> {
    let expected = format!(
        "a {}-bit quantized KV cache of group size {}",
        quantization.bits, quantization.group_size
    );
    let rows = given_rows(layer, given, &expected, |g| match g {
        SeqLayerCache::Quantized {
            keys,
            values,
            quantization: q,
        } if *q == quantization => Some((keys, values, keys.data.shape()[2])),
        _ => None,
    })?;
    if rows.iter().flatten().all(|r| r.2 == 0) {
        return Ok(BatchQuantizedKvCache::new(
            quantization,
            &vec![0; given.len()],
        ));
    }
    let stack = |pick: &dyn Fn(&Quantized) -> &Array| {
        let part: Vec<Option<(&Array, &Array, i32)>> = rows
            .iter()
            .map(|r| r.map(|(k, v, n)| (pick(k), pick(v), n)))
            .collect();
        stack_right_aligned(&part)
    };
    let (kd, vd, padding) = stack(&|q| &q.data)?;
    let (ks, vs, _) = stack(&|q| &q.scales)?;
    let (kb, vb, _) = stack(&|q| &q.biases)?;
    Ok(BatchQuantizedKvCache::from_merged(
        quantization,
        Quantized {
            data: kd,
            scales: ks,
            biases: kb,
        },
        Quantized {
            data: vd,
            scales: vs,
            biases: vb,
        },
        padding,
    ))
}

/// The merge of a mixed-KV layer's rows: plain rows merge plain (the
/// batch converts on its next update, see [`BatchMixedKvCache`]); when a
/// given row was converted already, the plain ones are quantized as they
/// are (slot by slot, so to the same triples) and all merge quantized.
fn merge_mixed(
    layer: usize,
    fresh: &BatchMixedKvCache,
    given: &[Option<&SeqLayerCache>],
) -> Result<BatchMixedKvCache> {
    let (quantization, start) = (fresh.quantization, fresh.start);
    let any_quantized = given
        .iter()
        .any(|g| matches!(g, Some(SeqLayerCache::Quantized { .. })));
    if !any_quantized {
        let plain = merge_full(layer, given)?;
        return Ok(BatchMixedKvCache::plain(quantization, start, plain));
    }
    let converted = given
        .iter()
        .map(|g| match g {
            Some(SeqLayerCache::Full { keys, values }) => Ok(Some(SeqLayerCache::Quantized {
                keys: quantization.quantize(keys)?,
                values: quantization.quantize(values)?,
                quantization,
            })),
            Some(other) => Ok(Some((*other).clone())),
            None => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    let rows: Vec<Option<&SeqLayerCache>> = converted.iter().map(Option::as_ref).collect();
    let merged = merge_quantized(layer, quantization, &rows)?;
    Ok(BatchMixedKvCache::quantized(quantization, start, merged))
}

/// `BatchRotatingKVCache.merge`: each row's last `min(offset, max_size)`
/// keys.
fn merge_sliding(
    layer: usize,
    max_size: i32,
    given: &[Option<&SeqLayerCache>],
) -> Result<BatchRotatingKvCache> {
    let mut offsets = Vec::with_capacity(given.len());
    let mut kept = Vec::with_capacity(given.len());
    for g in given {
        match g {
            None => {
                offsets.push(0);
                kept.push(None);
            }
            Some(SeqLayerCache::Sliding {
                keys,
                values,
                offset,
                max_size: m,
            }) => {
                if *m != max_size {
                    return Err(error(format!(
                        "merge: layer {layer}: a window of {m} slots into one of {max_size} \
                         (BatchRotatingKVCache merges one window size only)"
                    )));
                }
                let size = (*offset).min(max_size);
                let n = keys.shape()[2];
                if n < size {
                    return Err(error(format!(
                        "merge: layer {layer}: the ring holds {n} keys, its size is {size}"
                    )));
                }
                let last = |x: &Array| x.try_index((Ellipsis, n - size.., ..));
                offsets.push(*offset);
                kept.push(Some((last(keys)?, last(values)?, size)));
            }
            Some(_) => return Err(kind_error(layer, "a sliding-window KV cache")),
        }
    }
    if kept.iter().flatten().all(|r| r.2 == 0) {
        return Ok(BatchRotatingKvCache::new(max_size, &vec![0; given.len()]));
    }
    let rows: Vec<Option<(&Array, &Array, i32)>> = kept
        .iter()
        .map(|r| r.as_ref().map(|(k, v, n)| (k, v, *n)))
        .collect();
    let (keys, values, padding) = stack_right_aligned(&rows)?;
    Ok(BatchRotatingKvCache::from_merged(
        max_size, keys, values, padding, offsets,
    ))
}

/// A given row of an `ArraysCache`: its conv state and its recurrent state
/// (none for a short conv).
type ArraysRow<'a> = (&'a Array, Option<&'a Array>);

/// `ArraysCache.merge`: all fresh gives the empty batched cache (with its
/// zero `left_padding`); otherwise the states stacked, a fresh row's zeros.
fn merge_arrays(layer: usize, given: &[Option<&SeqLayerCache>]) -> Result<BatchArraysCache> {
    let rows = given_rows(
        layer,
        given,
        "a recurrent (ArraysCache) state",
        |g| match g {
            SeqLayerCache::Arrays { conv, state } => Some((conv, state.as_ref())),
            _ => None,
        },
    )?;
    let Some((conv0, state0)) = rows.iter().flatten().next().copied() else {
        return Ok(BatchArraysCache::merged_empty(given.len()));
    };
    // A given row's array, or a fresh row's zeros shaped like `first`.
    let stack = |first: &Array, pick: &dyn Fn(&ArraysRow) -> Option<Array>| {
        let parts = rows
            .iter()
            .map(|r| match r.as_ref().map(pick) {
                Some(Some(a)) => Ok(a),
                Some(None) => Err(kind_error(layer, "an ArraysCache with a recurrent state")),
                None => {
                    let mut shape = first.shape().to_vec();
                    shape[0] = 1;
                    mlx_rs::ops::zeros_dtype(&shape, first.dtype())
                }
            })
            .collect::<Result<Vec<_>>>()?;
        mlx_rs::ops::concatenate(&parts, 0)
    };
    let conv = stack(conv0, &|r| Some(r.0.clone()))?;
    let state = match state0 {
        Some(first) => Some(stack(first, &|r| r.1.cloned())?),
        None => None,
    };
    Ok(BatchArraysCache::from_merged(conv, state))
}
