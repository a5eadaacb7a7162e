//! mlx-optiq's per-layer mixed-precision KV cache (`kv_config.json` applied by
//! `install_mixed_kv`, mlx-optiq 0.7.7): the spec section `mixed_kv`, its checks, and
//! its lowering onto the IR's caches ([`crate::ir::KvCache::QuantizedAfterForward`]).
//!
//! Unlike `kv_quantization` (a `QuantizedKVCache` from the first token, which stock
//! mlx-lm runs: tier L1), optiq fills a plain `KVCache` and converts it after a forward
//! once its offset reaches `quantized_kv_start`: the prefill attends over unquantized
//! K/V and later steps over the quantized cache. Stock mlx-lm has no such cache, so a
//! model with it is tier L2 (docs/parity.md, "Tiers").

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::diag::{FieldPath, Issue};
use crate::ir::KvQuant;
use crate::ir::{KvCache, KvSource, ModelIr, Window};
use crate::ir::{AFFINE_BITS, AFFINE_GROUPS};

/// `mixed_kv`: one entry per layer, quantized or not, plus optiq's `quantized_kv_start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MixedKv {
    /// mlx-optiq's `quantized_kv_start` (`optiq serve --quantized-kv-start`, default 0):
    /// a listed layer's cache is converted after the first forward that leaves at least
    /// this many positions in it. 0: right after the prefill.
    pub quantized_kv_start: u32,
    /// Every layer in order: `{bits, group_size}` for a cache optiq quantizes, or null
    /// for one it keeps in the compute dtype (a layer kv_config.json does not list).
    pub layers: Vec<Option<KvBits>>,
}

/// The affine quantization of one layer's K and V (a kv_config.json entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KvBits {
    /// Bits of K and V (mlx affine: 2, 3, 4, 5, 6, 8).
    pub bits: u32,
    /// Group size along the head dimension (32, 64, 128; divides it).
    pub group_size: u32,
}

impl MixedKv {
    /// The section from a kv_config.json list (`[{layer_idx, bits, group_size}]`) for a
    /// model of `n_layers` layers; layers it does not list stay unquantized.
    pub fn from_kv_config(
        entries: &[crate::KvQuantEntry],
        n_layers: usize,
        quantized_kv_start: u32,
    ) -> MixedKv {
        let mut layers = vec![None; n_layers];
        for e in entries {
            if let Some(slot) = layers.get_mut(e.layer_idx as usize) {
                *slot = Some(KvBits {
                    bits: e.bits,
                    group_size: e.group_size,
                });
            }
        }
        MixedKv {
            quantized_kv_start,
            layers,
        }
    }

    /// The kv_config.json entries (quantized layers only, by index).
    pub fn kv_config(&self) -> Vec<crate::KvQuantEntry> {
        self.layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                l.map(|q| crate::KvQuantEntry {
                    layer_idx: i as u32,
                    bits: q.bits,
                    group_size: q.group_size,
                })
            })
            .collect()
    }
}

/// Semantic errors of `mixed_kv` against the model lowered without it (field paths from
/// the document root).
pub(crate) fn check(mixed: &MixedKv, ir: &ModelIr) -> Vec<Issue> {
    let root = FieldPath::root().key("mixed_kv");
    let mut issues = Vec::new();
    let n = ir.layers.len();
    if mixed.layers.len() != n {
        issues.push(Issue::new(
            root.key("layers"),
            format!("{} entries for {n} layers", mixed.layers.len()),
            format!("one entry per layer ({n}), null for an unquantized one"),
            "list every layer in order; kv_config.json's unlisted layers are null",
        ));
        return issues;
    }
    if mixed.layers.iter().all(Option::is_none) {
        issues.push(Issue::new(
            root.key("layers"),
            "no layer is quantized",
            "at least one {bits, group_size} entry",
            "write `mixed_kv: null` (or leave it out) for a model without KV quantization",
        ));
    }
    let donors = ir.donors_read();
    for (i, (layer, entry)) in ir.layers.iter().zip(&mixed.layers).enumerate() {
        let Some(q) = entry else { continue };
        let at = root.key("layers").index(i);
        let Some(a) = layer.attention() else {
            issues.push(Issue::new(
                at.clone(),
                format!("layer {i} is a linear-attention layer (no K/V cache)"),
                "null",
                "only attention layers have a K/V cache to quantize",
            ));
            continue;
        };
        match (a.kv, a.window) {
            (KvSource::Shared { donor }, _) => issues.push(Issue::new(
                at.clone(),
                format!("layer {i} is KV-shared (reads layer {donor}) and owns no cache"),
                "null",
                "a sharer reads its donor's cache; optiq converts only caches a layer owns",
            )),
            (KvSource::Own { .. }, Window::Sliding(w)) => issues.push(Issue::new(
                at.clone(),
                format!("layer {i} is a sliding-attention layer (rotating cache of {w})"),
                "null, or quantize a full-attention layer",
                "optiq turns a RotatingKVCache into its own RotatingQuantizedKVCache, which archgen does not run yet",
            )),
            (KvSource::Own { .. }, Window::Full) if donors.contains(&i) => issues.push(Issue::new(
                at.clone(),
                format!("layer {i} is the K/V donor of KV-shared layers"),
                "null, or quantize a full-attention layer no sharer reads",
                "optiq's sharers attend over the donor's quantized tuples through its own SDPA dispatch, which archgen does not run yet",
            )),
            (KvSource::Own { cache, .. }, Window::Full) => match cache {
                KvCache::Plain => {}
                KvCache::Quantized(_) | KvCache::QuantizedAfterForward { .. } => {
                    issues.push(Issue::new(
                        at.clone(),
                        format!("layer {i} already has a quantized cache (kv_quantization)"),
                        "null",
                        "use either kv_quantization (L1) or mixed_kv (L2), not both",
                    ))
                }
            },
        }
        if !AFFINE_BITS.contains(&q.bits) {
            issues.push(Issue::new(
                at.key("bits"),
                format!("{} bits", q.bits),
                "one of 2, 3, 4, 5, 6, 8",
                "optiq quantizes K/V with mx.quantize (affine)",
            ));
        }
        if !AFFINE_GROUPS.contains(&q.group_size) || a.head_dim % q.group_size as usize != 0 {
            issues.push(Issue::new(
                at.key("group_size"),
                format!(
                    "group size {} for head dimension {}",
                    q.group_size, a.head_dim
                ),
                "32, 64 or 128, dividing the layer's head dimension",
                "mx.quantize groups along the head dimension",
            ));
        }
    }
    issues
}

/// Folds `mixed_kv` into the IR's caches (the spec must be valid).
pub(crate) fn apply(ir: &mut ModelIr, mixed: Option<&MixedKv>) {
    let Some(mixed) = mixed else { return };
    for (layer, entry) in ir.layers.iter_mut().zip(&mixed.layers) {
        let Some(q) = entry else { continue };
        let crate::ir::Mixer::Attention(a) = &mut layer.mixer else {
            continue;
        };
        if let KvSource::Own { cache, .. } = &mut a.kv {
            *cache = KvCache::QuantizedAfterForward {
                quant: KvQuant {
                    bits: q.bits,
                    group_size: q.group_size,
                },
                start: mixed.quantized_kv_start as usize,
            };
        }
    }
}

/// The `mixed_kv:` section of a spec file; nothing when absent (absent means null).
pub(crate) fn yaml(o: &mut String, mixed: Option<&MixedKv>) {
    use std::fmt::Write;
    let Some(m) = mixed else { return };
    let _ = writeln!(o, "mixed_kv:");
    let _ = writeln!(o, "  quantized_kv_start: {}", m.quantized_kv_start);
    let _ = writeln!(o, "  layers:");
    for (i, l) in m.layers.iter().enumerate() {
        match l {
            Some(q) => {
                let _ = writeln!(
                    o,
                    "    - {{bits: {}, group_size: {}}}   # layer {i}",
                    q.bits, q.group_size
                );
            }
            None => {
                let _ = writeln!(o, "    - null                          # layer {i}");
            }
        }
    }
}
