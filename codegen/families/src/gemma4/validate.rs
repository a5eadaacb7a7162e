//! Gemma-4's semantic checks: the bounds, the layer pattern and KV sharing,
//! RoPE, the experts and per-layer inputs, KV-cache quantization and mixed KV,
//! over the [`Checker`] every family shares.

use crate::diag::{FieldPath, Issue};
use crate::ir::{Attention, KvSource, Layer, Window, AFFINE_BITS, AFFINE_GROUPS};
use crate::model::*;
use crate::validate::limits::*;
use crate::validate::{check_quantization, ranges, Checker};
use std::collections::BTreeSet;

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

/// All semantic errors of a resolved spec (paths in full-spec coordinates).
pub(crate) fn check(spec: &Gemma4Spec) -> Vec<Issue> {
    let mut c = Checker::default();
    c.header(spec.format_version, &spec.identity);

    if spec.identity.source.model_type.family() != Family::Gemma4 {
        c.err(
            p("identity.source.model_type"),
            format!(
                "`{}` is not a Gemma-4 model type",
                spec.identity.source.model_type.as_str()
            ),
            "one of gemma4, gemma4_text, gemma4_unified",
            "a qwen3 or llama checkpoint needs a spec of that family (`cargo xtask spec import`)",
        );
    }
    // Bounds first: the structure is checked only if they hold.
    let bounds = [
        model_and_layer_bounds,
        attention_bounds,
        rope_bounds,
        feed_forward_bounds,
    ];
    let mut ok = true;
    for check_bounds in bounds {
        ok &= check_bounds(&mut c, spec);
    }
    if !ok || !structure(&mut c, spec) {
        return c.issues;
    }
    lowered(&mut c, spec);
    c.issues
}

/// The model's and the layer pattern's sizes; false when the structure
/// cannot be checked with them.
fn model_and_layer_bounds(c: &mut Checker, spec: &Gemma4Spec) -> bool {
    let m = &spec.model;
    let l = &spec.layers;
    let mut ok = ranges! { c;
        "model.hidden_size": m.hidden_size => MAX_HIDDEN, "the model width (`hidden_size`)";
        "model.vocab_size": m.vocab_size => MAX_VOCAB, "rows of embed_tokens (`vocab_size`)";
    };
    c.range(
        "model.max_position_embeddings",
        m.max_position_embeddings,
        MAX_POSITIONS,
        "`max_position_embeddings` from config.json",
    );
    c.eps(m.rms_norm_eps, "Gemma-4 uses 1.0e-6");
    if let Some(s) = m.final_logit_softcapping {
        c.positive_finite(
            "model.final_logit_softcapping",
            s,
            "write null for no softcap; Gemma-4 uses 30.0",
        );
    }
    ok &= ranges! { c;
        "layers.num_hidden_layers": l.num_hidden_layers => MAX_LAYERS, "the number of decoder layers";
        "layers.repeat": l.repeat => MAX_LAYERS, "how many times `pattern` repeats";
    };
    if l.pattern.is_empty() || l.pattern.len() > MAX_LAYERS as usize {
        c.err(
            p("layers.pattern"),
            format!("pattern has {} entries", l.pattern.len()),
            format!("1..={MAX_LAYERS} layer types"),
            "e.g. [sliding, sliding, sliding, sliding, sliding, full]",
        );
        ok = false;
    }
    if ok {
        let total = l.pattern.len() as u64 * l.repeat as u64;
        if total != l.num_hidden_layers as u64 {
            c.err(
                p("layers.repeat"),
                format!("pattern of {} × repeat {} gives {} layer types, but num_hidden_layers is {}", l.pattern.len(), l.repeat, total, l.num_hidden_layers),
                format!("pattern length × repeat = {}", l.num_hidden_layers),
                "the resolved layer_types list must have exactly num_hidden_layers entries (no truncation)",
            );
            ok = false;
        }
    }
    ok
}

/// The attention's sizes: heads, head dims, window, grouping.
fn attention_bounds(c: &mut Checker, spec: &Gemma4Spec) -> bool {
    let a = &spec.attention;
    let mut ok = ranges! { c;
        "attention.num_attention_heads": a.num_attention_heads => MAX_HEADS, "query heads (`num_attention_heads`)";
        "attention.num_key_value_heads": a.num_key_value_heads => MAX_HEADS, "KV heads (`num_key_value_heads`)";
    };
    let sliding = "head dimension of sliding layers";
    ok &= c.rotated_head_dim("attention.head_dim", a.head_dim, sliding);
    if let Some(g) = a.global_head_dim {
        let full = "head dimension of full layers; null means head_dim";
        ok &= c.rotated_head_dim("attention.global_head_dim", g, full);
    }
    ok &= c.range(
        "attention.sliding_window",
        a.sliding_window,
        MAX_WINDOW,
        "window of sliding layers (`sliding_window`)",
    );
    ok &= c.grouped(a.num_attention_heads, a.num_key_value_heads);
    match (a.num_global_key_value_heads, a.attention_k_eq_v) {
        (Some(_), false) => c.err(
            p("attention.num_global_key_value_heads"),
            "set, but mlx-lm reads it only when attention_k_eq_v is true",
            "null when attention_k_eq_v is false",
            "write null (full layers then use num_key_value_heads), or set attention_k_eq_v: true",
        ),
        (Some(g), true) => {
            ok &= c.range(
                "attention.num_global_key_value_heads",
                g,
                MAX_HEADS,
                "KV heads of full layers",
            );
            if g > 0 && a.num_attention_heads > 0 && a.num_attention_heads % g != 0 {
                c.err(
                    p("attention.num_global_key_value_heads"),
                    format!("{} query heads are not divisible by {g} global KV heads", a.num_attention_heads),
                    "a divisor of num_attention_heads",
                    "full layers repeat each KV head num_attention_heads / num_global_key_value_heads times",
                );
                ok = false;
            }
        }
        _ => {}
    }
    ok
}

/// Each RoPE's parameters (these never stop the structure's checks).
fn rope_bounds(c: &mut Checker, spec: &Gemma4Spec) -> bool {
    let a = &spec.attention;
    for (name, r) in [("sliding", &spec.rope.sliding), ("full", &spec.rope.full)] {
        match r {
            RopeParams::Default { rope_theta } => {
                c.positive_finite(
                    &format!("rope.{name}.rope_theta"),
                    *rope_theta,
                    "the RoPE base, e.g. 10000.0",
                );
            }
            RopeParams::Proportional {
                rope_theta,
                partial_rotary_factor,
                factor,
            } => {
                c.positive_finite(
                    &format!("rope.{name}.rope_theta"),
                    *rope_theta,
                    "the RoPE base, e.g. 1000000.0",
                );
                c.positive_finite(
                    &format!("rope.{name}.factor"),
                    *factor,
                    "frequency factor; 1.0 when the config has none",
                );
                if !(partial_rotary_factor.is_finite()
                    && *partial_rotary_factor > 0.0
                    && *partial_rotary_factor <= 1.0)
                {
                    c.err(
                        p(&format!("rope.{name}.partial_rotary_factor")),
                        format!("{partial_rotary_factor} is outside (0, 1]"),
                        "a number in (0, 1]",
                        "the fraction of each head's dimensions that rotate; Gemma-4 full layers use 0.25",
                    );
                } else {
                    let hd = match name {
                        "full" => a.global_head_dim.unwrap_or(a.head_dim),
                        _ => a.head_dim,
                    };
                    if ((hd as f64) * partial_rotary_factor).floor() < 2.0 {
                        c.err(
                            p(&format!("rope.{name}.partial_rotary_factor")),
                            format!("int({hd} × {partial_rotary_factor}) rotates fewer than 2 dimensions"),
                            "a factor that rotates at least one pair",
                            "raise the factor or the head dimension",
                        );
                    }
                }
            }
        }
    }
    true
}

/// The MLP's, the experts' and the per-layer inputs' sizes.
fn feed_forward_bounds(c: &mut Checker, spec: &Gemma4Spec) -> bool {
    let mut ok = true;
    ok &= c.range(
        "mlp.intermediate_size",
        spec.mlp.intermediate_size,
        MAX_INTERMEDIATE,
        "dense MLP width (`intermediate_size`)",
    );
    if let Some(moe) = &spec.moe {
        ok &= ranges! { c;
            "moe.num_experts": moe.num_experts => MAX_EXPERTS, "experts per layer";
            "moe.moe_intermediate_size": moe.moe_intermediate_size => MAX_INTERMEDIATE, "expert GeGLU width";
        };
        if moe.top_k_experts == 0 || moe.top_k_experts > moe.num_experts {
            c.err(
                p("moe.top_k_experts"),
                format!(
                    "top-k {} with {} experts",
                    moe.top_k_experts, moe.num_experts
                ),
                format!("an integer in 1..={}", moe.num_experts),
                "the router picks top_k_experts of num_experts with argpartition",
            );
            ok = false;
        }
    }
    if let Some(ple) = &spec.per_layer_input {
        ok &= ranges! { c;
            "per_layer_input.hidden_size_per_layer_input": ple.hidden_size_per_layer_input => MAX_PLE_WIDTH, "per-layer input width; write per_layer_input: null to disable PLE";
            "per_layer_input.vocab_size_per_layer_input": ple.vocab_size_per_layer_input => MAX_VOCAB, "rows of embed_tokens_per_layer";
        };
    }
    ok
}

/// KV sharing and the double-wide MLP; false when an error was found (the
/// lowering needs a sound structure).
fn structure(c: &mut Checker, spec: &Gemma4Spec) -> bool {
    let l = &spec.layers;
    let n = l.num_hidden_layers;
    let shared = l.num_kv_shared_layers;
    let types = spec.layer_types();
    if shared > n {
        c.err(
            p("layers.num_kv_shared_layers"),
            format!("{shared} shared layers but only {n} layers"),
            format!("an integer in 0..{n}"),
            "the last num_kv_shared_layers layers reuse K/V of earlier layers",
        );
        return false;
    }
    let first_shared = (n - shared) as usize;
    if shared > 0 {
        let donors: BTreeSet<LayerType> = types[..first_shared].iter().copied().collect();
        let mut missing: Vec<LayerType> = types[first_shared..]
            .iter()
            .copied()
            .filter(|t| !donors.contains(t))
            .collect();
        missing.dedup();
        let missing: BTreeSet<LayerType> = missing.into_iter().collect();
        for t in missing {
            let first = types[first_shared..]
                .iter()
                .position(|x| *x == t)
                .unwrap_or(0)
                + first_shared;
            c.err(
                p("layers.num_kv_shared_layers"),
                format!(
                    "KV-shared layer {first} is {} but no layer before {first_shared} is, so it has no donor",
                    t.hf_name()
                ),
                format!("every type among layers {first_shared}..{n} to occur before layer {first_shared}"),
                "mlx-lm takes K/V from the last non-shared layer of the same type (KeyError otherwise); lower num_kv_shared_layers",
            );
        }
    }
    if spec.mlp.use_double_wide_mlp && (shared == 0 || first_shared == 0) {
        c.err(
            p("mlp.use_double_wide_mlp"),
            "true, but there are no KV-shared layers after a donor, so no layer is double-wide",
            "false when num_kv_shared_layers is 0",
            "mlx-lm doubles the MLP only on layers >= num_hidden_layers - num_kv_shared_layers > 0; write false",
        );
    }
    c.issues.is_empty()
}

/// What is checked against the lowered IR: weight and KV-cache
/// quantization, mixed KV.
fn lowered(c: &mut Checker, spec: &Gemma4Spec) {
    let ir = crate::gemma4::lower(spec);
    if let Some(q) = &spec.quantization {
        check_quantization(q, &ir, &mut c.issues);
    }
    // Every Gemma-4 layer is attention: entry i is layer i's.
    let attention: Vec<&Attention> = ir.layers.iter().filter_map(Layer::attention).collect();
    if let Some(kv) = &spec.kv_quantization {
        kv_quantization(c, spec, &attention, kv);
    }
    if let (true, Some(m)) = (c.issues.is_empty(), &spec.mixed_kv) {
        c.issues
            .extend(crate::mixed_kv::check(m, &crate::gemma4::lower(spec)));
    }
}

/// `kv_quantization`'s entries: layers that exist, that mlx-lm can run with a
/// `QuantizedKVCache`, and bits and group sizes it supports.
fn kv_quantization(
    c: &mut Checker,
    spec: &Gemma4Spec,
    attention: &[&Attention],
    kv: &[KvQuantEntry],
) {
    let n = spec.layers.num_hidden_layers;
    // `structure` checked that the shared layers fit.
    let first_shared = (n - spec.layers.num_kv_shared_layers) as usize;
    // Donor -> the KV-shared layers reading it.
    let mut readers: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (index, a) in attention.iter().enumerate() {
        match a.kv {
            KvSource::Shared { donor } => readers.entry(donor).or_default().push(index),
            KvSource::Own { .. } => {}
        }
    }
    // The layers mlx-lm can run with a QuantizedKVCache.
    let full_quantizable: Vec<usize> = attention
        .iter()
        .enumerate()
        .filter(|(i, a)| a.owns_kv() && a.window == Window::Full && !readers.contains_key(i))
        .map(|(i, _)| i)
        .collect();
    let mut prev: Option<u32> = None;
    for (i, e) in kv.iter().enumerate() {
        let ep = p("kv_quantization").index(i);
        if e.layer_idx >= n {
            c.err(
                ep.key("layer_idx"),
                format!("layer {} does not exist", e.layer_idx),
                format!("a layer index in 0..{n}"),
                "indices are 0-based",
            );
            continue;
        }
        if let Some(pv) = prev {
            if e.layer_idx <= pv {
                c.err(
                    ep.key("layer_idx"),
                    format!("layer {} after layer {pv}", e.layer_idx),
                    "entries sorted by layer_idx, each layer once",
                    "sort the list and drop duplicates",
                );
            }
        }
        prev = Some(e.layer_idx);
        let facts = attention[e.layer_idx as usize];
        if !facts.owns_kv() {
            c.err(
                ep.key("layer_idx"),
                format!("layer {} is KV-shared and owns no cache", e.layer_idx),
                format!("a layer below {first_shared}"),
                "sharers read their donor's cache; quantize the donor instead",
            );
        } else if matches!(facts.window, Window::Sliding(_)) {
            c.err(
                ep.key("layer_idx"),
                format!(
                    "layer {} is a sliding-attention layer (rotating cache)",
                    e.layer_idx
                ),
                format!("a full-attention layer ({})", list(&full_quantizable)),
                "mlx-lm quantizes only the full layers' KVCache: RotatingKVCache.to_quantized raises NotImplementedError (mlx-lm 0.32.2)",
            );
        } else if let Some(sharers) = readers.get(&(e.layer_idx as usize)) {
            c.err(
                ep.key("layer_idx"),
                format!(
                    "layer {} is the K/V donor of KV-shared {}",
                    e.layer_idx,
                    list(sharers)
                ),
                format!(
                    "a full-attention layer that no KV-shared layer reads ({})",
                    list(&full_quantizable)
                ),
                "a sharer has no cache, so mlx-lm's scaled_dot_product_attention takes the unquantized path with the donor's quantized (data, scales, biases) tuples and fails; quantize another full layer or lower num_kv_shared_layers",
            );
        }
        let group_ok = AFFINE_GROUPS.contains(&e.group_size);
        for (ok, key, value, expected) in [
            (
                AFFINE_BITS.contains(&e.bits),
                "bits",
                format!("{} bits", e.bits),
                "one of 2, 3, 4, 5, 6, 8",
            ),
            (
                group_ok,
                "group_size",
                format!("group size {}", e.group_size),
                "one of 32, 64, 128",
            ),
        ] {
            if !ok {
                c.err(
                    ep.key(key),
                    value,
                    expected,
                    "KV caches use mlx affine quantization",
                );
            }
        }
        if group_ok && facts.head_dim as u32 % e.group_size != 0 {
            c.err(
                ep.key("group_size"),
                format!(
                    "group size {} does not divide layer {}'s head_dim {}",
                    e.group_size, e.layer_idx, facts.head_dim
                ),
                format!("a group size dividing {}", facts.head_dim),
                "K and V are quantized along the head dimension",
            );
        }
    }
}

/// `layers 5, 11` / `layer 5` / `no such layer in this model`.
fn list(layers: &[usize]) -> String {
    match layers {
        [] => "no such layer in this model".to_string(),
        [one] => format!("layer {one}"),
        more => format!(
            "layers {}",
            more.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
