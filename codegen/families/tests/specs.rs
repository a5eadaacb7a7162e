//! The checked-in specs: all validate, keep their structure, and tiny ones are tiny.

use archgen_families::*;
use archgen_ir::{
    Attention, HeadWeight, KvCache, KvQuant, KvSource, Layer, ModelIr, Values, Window,
};
use std::path::PathBuf;

fn specs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../specs")
}

fn load_named(name: &str) -> Spec {
    match load(specs_dir().join(format!("{name}.yaml"))) {
        Ok(s) => s,
        Err(d) => panic!("{name}:\n{d}"),
    }
}

const REAL: [&str; 5] = [
    "gemma4-e2b",
    "gemma4-e4b",
    "gemma4-12b",
    "gemma4-26b-a4b",
    "gemma4-31b",
];

#[test]
fn every_spec_file_validates() {
    let mut n = 0;
    let mut failures = String::new();
    for entry in std::fs::read_dir(specs_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            n += 1;
            if let Err(d) = load(&path) {
                failures.push_str(&format!("{d}\n"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures}");
    assert!(n >= 13, "{n} specs");
}

#[test]
fn every_spec_starts_with_the_schema_modeline() {
    for entry in std::fs::read_dir(specs_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(
                text.lines().next(),
                Some("# yaml-language-server: $schema=schema/archgen-spec.schema.json"),
                "{}",
                path.display()
            );
        }
    }
}

/// A Gemma-4 layer's attention (every Gemma-4 layer is attention).
fn attention(l: &Layer) -> &Attention {
    l.attention().expect("a Gemma-4 layer is attention")
}

/// The first layer without K/V of its own (the layer count when none).
fn first_kv_shared(model: &ModelIr) -> usize {
    model
        .layers
        .iter()
        .position(|l| !attention(l).owns_kv())
        .unwrap_or(model.layers.len())
}

/// V is the raw `k_proj` output (`attention_k_eq_v` on a K/V-owning full layer).
fn k_eq_v(a: &Attention) -> bool {
    matches!(
        a.kv,
        KvSource::Own {
            values: Values::SameAsKeys,
            ..
        }
    )
}

#[test]
fn e2b_facts() {
    let model = load_named("gemma4-e2b").lower();
    assert_eq!(model.layers.len(), 35);
    assert_eq!(first_kv_shared(&model), 15);
    let full: Vec<usize> = model
        .layers
        .iter()
        .filter(|l| attention(l).window == Window::Full)
        .map(|l| l.index)
        .collect();
    assert_eq!(full, vec![4, 9, 14, 19, 24, 29, 34]);
    for l in &model.layers {
        let a = attention(l);
        assert_eq!(a.owns_kv(), l.index < 15);
        assert_eq!(
            l.mlp().map(|m| m.width),
            Some(if l.index >= 15 { 12288 } else { 6144 })
        );
        assert_eq!(a.n_kv_heads, 1);
        assert!(!k_eq_v(a));
        let donor = match (l.index >= 15, a.window) {
            (true, Window::Full) => 14,
            (true, Window::Sliding(_)) => 13,
            (false, _) => l.index,
        };
        assert_eq!(a.kv_layer(l.index), donor);
        match a.window {
            Window::Full => {
                assert_eq!(a.head_dim, 512);
                assert_eq!(a.rope.rotated_dims, 128);
            }
            Window::Sliding(w) => {
                assert_eq!(a.head_dim, 256);
                assert_eq!(a.rope.rotated_dims, 256);
                assert_eq!(w, 512);
            }
        }
    }
    assert_eq!(
        model.embedding.per_layer_input,
        Some(archgen_ir::PerLayerInput {
            width: 256,
            vocab: 262144
        })
    );
    assert_eq!(model.head.logit_softcap.map(|s| s.cap), Some(30.0));
    assert_eq!(model.module_prefix(), "language_model.model.");
}

#[test]
fn e4b_donors_and_caches() {
    let model = load_named("gemma4-e4b").lower();
    assert_eq!(first_kv_shared(&model), 24);
    assert_eq!(attention(&model.layers[41]).kv_layer(41), 23);
    assert_eq!(attention(&model.layers[24]).kv_layer(24), 22);
    assert!(model
        .layers
        .iter()
        .all(|l| { l.mlp().map(|m| m.width) == Some(10240) && attention(l).n_kv_heads == 2 }));
    let donors = model.layers.iter().map(attention).filter(|a| a.owns_kv());
    let (full, sliding): (Vec<_>, Vec<_>) = donors.partition(|a| a.window == Window::Full);
    assert_eq!((sliding.len(), full.len()), (20, 4));
}

#[test]
fn k_eq_v_models_use_global_kv_heads_on_full_layers() {
    for (name, kv, gkv, caches) in [
        ("gemma4-12b", 8, 1, (40, 8)),
        ("gemma4-26b-a4b", 8, 2, (25, 5)),
        ("gemma4-31b", 16, 4, (50, 10)),
    ] {
        let model = load_named(name).lower();
        let mut c = (0, 0);
        for a in model.layers.iter().map(attention) {
            assert!(a.owns_kv());
            match a.window {
                Window::Full => {
                    assert!(k_eq_v(a));
                    assert_eq!(a.n_kv_heads, gkv, "{name}");
                    c.1 += 1;
                }
                Window::Sliding(_) => {
                    assert!(!k_eq_v(a));
                    assert_eq!(a.n_kv_heads, kv, "{name}");
                    c.0 += 1;
                }
            }
        }
        assert_eq!(c, caches, "{name}");
        assert!(model.embedding.per_layer_input.is_none());
    }
    assert_eq!(
        load_named("gemma4-12b").lower().checkpoint.model_type,
        ConfigModelType::Gemma4Unified
    );
    let moe = load_named("gemma4-26b-a4b").lower().layers[0]
        .moe()
        .unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.width), (128, 8, 704));
}

type Structure = (Vec<Window>, Vec<(bool, bool, bool)>, bool, bool, bool);

fn structure(model: &ModelIr) -> Structure {
    // Layer 0 is never KV-shared, so its MLP has the plain width.
    let width = model.layers[0].mlp().map(|m| m.width);
    // Per pattern position: window kind; per layer: (owns K/V, k_eq_v, double-wide)
    (
        model
            .layers
            .iter()
            .map(|l| match attention(l).window {
                Window::Full => Window::Full,
                // The tiny variants shrink the window, not the pattern.
                Window::Sliding(_) => Window::Sliding(0),
            })
            .collect(),
        model
            .layers
            .iter()
            .map(|l| {
                let a = attention(l);
                let double = l.mlp().map(|m| m.width) != width;
                (a.owns_kv(), k_eq_v(a), double)
            })
            .collect(),
        model.embedding.per_layer_input.is_some(),
        model.layers[0].moe().is_some(),
        model.head.weight == HeadWeight::TiedEmbedding,
    )
}

#[test]
fn tiny_variants_keep_the_structure_and_are_tiny() {
    for real in REAL {
        let (big, tiny) = (load_named(real), load_named(&format!("{real}-tiny")));
        let (ba, ta) = (big.lower(), tiny.lower());
        let (big, tiny) = (big.as_gemma4().unwrap(), tiny.as_gemma4().unwrap());
        let period = big.layers.pattern.len();
        assert_eq!(tiny.layers.pattern, big.layers.pattern, "{real}");
        let (big_n, tiny_n) = (ba.layers.len(), ta.layers.len());
        assert_eq!(tiny_n, 2 * period);
        let (bt, bl, bp, bm, btie) = structure(&ba);
        let (tt, tl, tp, tm, ttie) = structure(&ta);
        assert_eq!(tt[..], bt[..tt.len()], "{real}");
        assert_eq!((tp, tm, ttie), (bp, bm, btie), "{real}");
        // The donor/sharer structure: the tail of the tiny mirrors the tail of the real one.
        let shared_t = tiny_n - first_kv_shared(&ta);
        assert_eq!(shared_t > 0, big_n > first_kv_shared(&ba), "{real}");
        assert_eq!(
            tl[tl.len() - shared_t..],
            bl[bl.len() - shared_t..],
            "{real}"
        );
        for (i, l) in ta.layers.iter().enumerate() {
            assert_eq!(tt[i], bt[big_n - tiny_n + i]);
            assert_eq!(tl[i].1, bl[big_n - tiny_n + i].1);
            assert!(attention(l).head_dim < 64);
        }
        assert_eq!(tiny.rope, big.rope);
        assert_eq!(
            tiny.model.final_logit_softcapping,
            big.model.final_logit_softcapping
        );
        let params = ta.param_count();
        assert!(params < 1_000_000, "{real}-tiny has {params} parameters");
        if let Some(m) = ta.layers[0].moe() {
            assert!(m.top_k < m.num_experts);
        }
    }
}

#[test]
fn quantized_tiny_variants_quantize_every_module() {
    let q4 = load_named("gemma4-12b-tiny-q4").lower();
    let q = q4.quantization.as_ref().unwrap();
    assert_eq!((q.default.bits, q.default.group_size), (4, 64));
    assert!(q4.quant_skipped_modules().is_empty());
    for m in q4.quantizable_modules() {
        assert_eq!(q4.quant_for(&m.path), Some(q.default), "{}", m.path);
    }
    let q8 = load_named("gemma4-26b-a4b-tiny-q8").lower();
    let router = q8
        .quant_for("language_model.model.layers.3.router.proj")
        .unwrap();
    assert_eq!((router.bits, router.group_size), (8, 64));
    let expert = q8
        .quant_for("language_model.model.layers.3.experts.switch_glu.down_proj")
        .unwrap();
    assert_eq!((expert.bits, expert.group_size), (8, 32));
    assert!(q8.quant_skipped_modules().is_empty());
    assert_eq!(q8.quant_for("language_model.model.layers.3.nope"), None);
}

#[test]
fn kv_quantized_tiny_variant() {
    let model = load_named("gemma4-e4b-tiny-kv").lower();
    assert_eq!((model.layers.len(), first_kv_shared(&model)), (18, 12));
    // Only layer 5: full attention, owns a cache, and no KV-shared layer reads it.
    let cache = |l: &Layer| match attention(l).kv {
        KvSource::Own { cache, .. } => cache,
        KvSource::Shared { .. } => KvCache::Plain,
    };
    assert_eq!(
        cache(&model.layers[5]),
        KvCache::Quantized(KvQuant {
            bits: 4,
            group_size: 64
        })
    );
    let five = attention(&model.layers[5]);
    assert!(five.window == Window::Full && five.owns_kv());
    assert!(model
        .layers
        .iter()
        .all(|l| attention(l).kv_layer(l.index) != 5 || l.index == 5));
    assert!(model
        .layers
        .iter()
        .filter(|l| l.index != 5)
        .all(|l| cache(l) == KvCache::Plain));
}

#[test]
fn real_quantization_rules() {
    // A 26B quantized at 4-bit group 128: convert skips the experts' down_proj (input 704)
    // and the dense down_proj (input 2112) on each of the 30 layers.
    let mut spec = load_named("gemma4-26b-a4b");
    let s = spec.as_gemma4_mut().unwrap();
    s.quantization = Some(Quantization {
        default: QuantParams {
            bits: 4,
            group_size: 128,
            mode: QuantMode::Affine,
        },
        overrides: [(
            "language_model.model.layers.0.mlp.up_proj".to_string(),
            QuantOverride::Skip(false),
        )]
        .into_iter()
        .collect(),
    });
    s.validate().unwrap();
    let a = spec.lower();
    assert_eq!(
        a.quant_for("language_model.model.layers.0.experts.switch_glu.down_proj"),
        None
    );
    assert_eq!(
        a.quant_for("language_model.model.layers.0.mlp.up_proj"),
        None
    );
    assert!(a
        .quant_for("language_model.model.layers.1.mlp.up_proj")
        .is_some());
    assert_eq!(a.quant_skipped_modules().len(), 60);
    assert_eq!(
        a.quant_for("language_model.model.layers.1.mlp.down_proj"),
        None
    );
}

#[test]
fn hash_is_stable_and_content_based() {
    let a = load_named("gemma4-12b");
    let h = spec_hash(&a);
    assert_eq!(h.len(), 64);
    assert_eq!(h, spec_hash(&load_named("gemma4-12b")));
    assert_ne!(h, spec_hash(&load_named("gemma4-31b")));
}

#[test]
fn yaml_round_trip_of_every_spec() {
    for entry in std::fs::read_dir(specs_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let spec = load(&path).unwrap();
            let text = to_yaml(&spec);
            let back =
                parse_str(&text, "round-trip.yaml").unwrap_or_else(|d| panic!("{d}\n{text}"));
            assert_eq!(back, spec);
        }
    }
}
