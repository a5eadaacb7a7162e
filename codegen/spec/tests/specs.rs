//! The checked-in specs: all validate, keep their structure, and tiny ones are tiny.

use archgen_ir::KvQuant;
use archgen_spec::*;
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

#[test]
fn e2b_facts() {
    let a = load_named("gemma4-e2b").resolve();
    assert_eq!(a.num_layers, 35);
    assert_eq!(a.first_kv_shared_layer, 15);
    let full: Vec<usize> = a
        .layers
        .iter()
        .filter(|l| l.layer_type == LayerType::Full)
        .map(|l| l.index)
        .collect();
    assert_eq!(full, vec![4, 9, 14, 19, 24, 29, 34]);
    for l in &a.layers {
        assert_eq!(l.has_kv, l.index < 15);
        assert_eq!(l.mlp_width, if l.index >= 15 { 12288 } else { 6144 });
        assert_eq!(l.n_kv_heads, 1);
        assert!(!l.k_eq_v);
        if l.index >= 15 {
            assert_eq!(
                l.kv_source,
                if l.layer_type == LayerType::Full {
                    14
                } else {
                    13
                }
            );
        } else {
            assert_eq!(l.kv_source, l.index);
        }
        match l.layer_type {
            LayerType::Full => {
                assert_eq!(l.head_dim, 512);
                assert_eq!(l.rotated_dims, 128);
                assert_eq!(l.window, None);
            }
            LayerType::Sliding => {
                assert_eq!(l.head_dim, 256);
                assert_eq!(l.rotated_dims, 256);
                assert_eq!(l.window, Some(512));
            }
        }
    }
    assert_eq!(
        a.per_layer_input,
        Some(PleFacts {
            width: 256,
            vocab: 262144
        })
    );
    assert_eq!(a.final_logit_softcapping, Some(30.0));
    assert_eq!(a.module_prefix, "language_model.model.");
}

#[test]
fn e4b_donors_and_caches() {
    let a = load_named("gemma4-e4b").resolve();
    assert_eq!(a.first_kv_shared_layer, 24);
    assert_eq!(a.layers[41].kv_source, 23);
    assert_eq!(a.layers[24].kv_source, 22);
    assert!(a
        .layers
        .iter()
        .all(|l| l.mlp_width == 10240 && l.n_kv_heads == 2));
    let donors = a.layers.iter().filter(|l| l.has_kv);
    let (full, sliding): (Vec<_>, Vec<_>) = donors.partition(|l| l.layer_type == LayerType::Full);
    assert_eq!((sliding.len(), full.len()), (20, 4));
}

#[test]
fn k_eq_v_models_use_global_kv_heads_on_full_layers() {
    for (name, kv, gkv, caches) in [
        ("gemma4-12b", 8, 1, (40, 8)),
        ("gemma4-26b-a4b", 8, 2, (25, 5)),
        ("gemma4-31b", 16, 4, (50, 10)),
    ] {
        let a = load_named(name).resolve();
        let mut c = (0, 0);
        for l in &a.layers {
            assert!(l.has_kv);
            match l.layer_type {
                LayerType::Full => {
                    assert!(l.k_eq_v);
                    assert_eq!(l.n_kv_heads, gkv, "{name}");
                    c.1 += 1;
                }
                LayerType::Sliding => {
                    assert!(!l.k_eq_v);
                    assert_eq!(l.n_kv_heads, kv, "{name}");
                    c.0 += 1;
                }
            }
        }
        assert_eq!(c, caches, "{name}");
        assert!(a.per_layer_input.is_none());
    }
    assert_eq!(
        load_named("gemma4-12b").resolve().model_type,
        ConfigModelType::Gemma4Unified
    );
    assert_eq!(
        load_named("gemma4-26b-a4b").resolve().moe,
        Some(MoeFacts {
            num_experts: 128,
            top_k: 8,
            width: 704
        })
    );
}

type Structure = (Vec<LayerType>, Vec<(bool, bool, bool)>, bool, bool, bool);

fn structure(a: &Architecture) -> Structure {
    // Per pattern position: type; per layer: (has_kv, k_eq_v, double-wide)
    (
        a.layers.iter().map(|l| l.layer_type).collect(),
        a.layers
            .iter()
            .map(|l| (l.has_kv, l.k_eq_v, l.mlp_width == 2 * a.intermediate_size))
            .collect(),
        a.per_layer_input.is_some(),
        a.moe.is_some(),
        a.tie_word_embeddings,
    )
}

#[test]
fn tiny_variants_keep_the_structure_and_are_tiny() {
    for real in REAL {
        let (big, tiny) = (load_named(real), load_named(&format!("{real}-tiny")));
        let (ba, ta) = (big.resolve(), tiny.resolve());
        let (big, tiny) = (big.as_gemma4().unwrap(), tiny.as_gemma4().unwrap());
        let period = big.layers.pattern.len();
        assert_eq!(tiny.layers.pattern, big.layers.pattern, "{real}");
        assert_eq!(ta.num_layers, 2 * period);
        let (bt, bl, bp, bm, btie) = structure(&ba);
        let (tt, tl, tp, tm, ttie) = structure(&ta);
        assert_eq!(tt[..], bt[..tt.len()], "{real}");
        assert_eq!((tp, tm, ttie), (bp, bm, btie), "{real}");
        // The donor/sharer structure: the tail of the tiny mirrors the tail of the real one.
        let shared_t = ta.num_layers - ta.first_kv_shared_layer;
        assert_eq!(
            shared_t > 0,
            ba.num_layers > ba.first_kv_shared_layer,
            "{real}"
        );
        assert_eq!(
            tl[tl.len() - shared_t..],
            bl[bl.len() - shared_t..],
            "{real}"
        );
        for l in &ta.layers {
            let lb = &ba.layers[ba.num_layers - ta.num_layers + l.index];
            assert_eq!(l.layer_type, lb.layer_type);
            assert_eq!(l.k_eq_v, lb.k_eq_v);
            assert!(l.head_dim < 64);
        }
        assert_eq!(tiny.rope, big.rope);
        assert_eq!(
            tiny.model.final_logit_softcapping,
            big.model.final_logit_softcapping
        );
        let params = ta.param_count();
        assert!(params < 1_000_000, "{real}-tiny has {params} parameters");
        if let Some(m) = ta.moe {
            assert!(m.top_k < m.num_experts);
        }
    }
}

#[test]
fn quantized_tiny_variants_quantize_every_module() {
    let q4 = load_named("gemma4-12b-tiny-q4").resolve();
    let q = q4.quantization.as_ref().unwrap();
    assert_eq!((q.default.bits, q.default.group_size), (4, 64));
    assert!(q4.quant_skipped_modules().is_empty());
    for m in q4.quantizable_modules() {
        assert_eq!(q4.quant_for(&m.path), Some(q.default), "{}", m.path);
    }
    let q8 = load_named("gemma4-26b-a4b-tiny-q8").resolve();
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
    let a = load_named("gemma4-e4b-tiny-kv").resolve();
    assert_eq!((a.num_layers, a.first_kv_shared_layer), (18, 12));
    // Only layer 5: full attention, owns a cache, and no KV-shared layer reads it.
    assert_eq!(
        a.layers[5].kv_quant,
        Some(KvQuant {
            bits: 4,
            group_size: 64
        })
    );
    assert!(a.layers[5].window.is_none() && a.layers[5].has_kv);
    assert!(a.layers.iter().all(|l| l.kv_source != 5 || l.index == 5));
    assert!(a
        .layers
        .iter()
        .filter(|l| l.index != 5)
        .all(|l| l.kv_quant.is_none()));
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
    let a = s.resolve();
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
