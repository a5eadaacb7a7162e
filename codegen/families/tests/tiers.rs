//! Parity tiers from the IR, and the `mixed_kv` section (mlx-optiq's per-layer
//! mixed KV): its checks, its lowering, its import from kv_config.json.

use std::path::PathBuf;

use archgen_ir::tier::{tier, Tier};
use archgen_ir::{KvCache, KvSource};

fn spec(name: &str) -> archgen_families::Spec {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../specs")
        .join(format!("{name}.yaml"));
    archgen_families::load(&path).unwrap_or_else(|d| panic!("{d}"))
}

fn caches(s: &archgen_families::Spec) -> Vec<Option<KvCache>> {
    s.lower()
        .layers
        .iter()
        .map(|l| match l.attention().unwrap().kv {
            KvSource::Own { cache, .. } => Some(cache),
            KvSource::Shared { .. } => None,
        })
        .collect()
}

#[test]
fn tiers_follow_the_ir() {
    for name in ["qwen3-0.6b-tiny", "gemma4-e4b-tiny-kv", "gemma4-e2b-tiny"] {
        let t = tier(&spec(name).lower());
        assert_eq!(
            (t.tier, t.to_string()),
            (Tier::L1, "L1".to_string()),
            "{name}"
        );
    }
    let t = tier(&spec("qwen3-0.6b-tiny-mixed-kv").lower());
    assert_eq!(t.tier, Tier::L2);
    assert_eq!(
        t.to_string(),
        "L2: per-layer mixed KV (mlx-optiq install_mixed_kv, quantized_kv_start 0; layers 0: 8-bit g32, 2: 4-bit g32)"
    );
    assert!(Tier::L1 < Tier::L2 && Tier::L2 < Tier::L3);
    assert_eq!("l2".parse::<Tier>(), Ok(Tier::L2));
    assert!("L4".parse::<Tier>().is_err());
}

#[test]
fn mixed_kv_lowers_onto_the_layers_it_lists() {
    let c = caches(&spec("gemma4-12b-tiny-mixed-kv"));
    for (i, cache) in c.iter().enumerate() {
        let cache = cache.expect("no sharing in 12b");
        match (i, cache) {
            (5, KvCache::QuantizedAfterForward { quant, start }) => {
                assert_eq!((quant.bits, quant.group_size, start), (4, 32, 24))
            }
            (11, KvCache::QuantizedAfterForward { quant, start }) => {
                assert_eq!((quant.bits, quant.group_size, start), (8, 32, 24))
            }
            (5 | 11, other) => panic!("layer {i}: {other:?}"),
            (_, other) => assert_eq!(other, KvCache::Plain, "layer {i}"),
        }
    }
}

fn derived(mixed: &str) -> Result<archgen_families::Spec, String> {
    let dir = tempfile::tempdir().unwrap();
    let specs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../specs");
    for parent in ["gemma4-12b", "gemma4-12b-tiny"] {
        std::fs::copy(
            specs.join(format!("{parent}.yaml")),
            dir.path().join(format!("{parent}.yaml")),
        )
        .unwrap();
    }
    let text = format!(
        "format_version: 1\nidentity:\n  name: t\nderive:\n  from: gemma4-12b-tiny\n  reduce: null\n  quantization: null\n  kv_quantization: null\n  mixed_kv:\n{mixed}"
    );
    let path = dir.path().join("t.yaml");
    std::fs::write(&path, text).unwrap();
    archgen_families::load(&path).map_err(|d| d.to_string())
}

#[test]
fn mixed_kv_errors_are_located_and_say_why() {
    let layers = |first: &str| {
        let mut s = "    quantized_kv_start: 0\n    layers:\n".to_string();
        s.push_str(&format!("      - {first}\n"));
        for _ in 1..12 {
            s.push_str("      - null\n");
        }
        s
    };
    // Layer 0 is sliding: optiq's rotating quantized cache is not run here.
    let e = derived(&layers("{bits: 4, group_size: 16}")).unwrap_err();
    assert!(e.contains("derive.mixed_kv.layers[0]"), "{e}");
    assert!(e.contains("sliding-attention layer"), "{e}");
    // One entry too few.
    let short = "    quantized_kv_start: 0\n    layers: [null, null]\n";
    let e = derived(short).unwrap_err();
    assert!(e.contains("2 entries for 12 layers"), "{e}");
    // Nothing quantized.
    let e = derived(&layers("null")).unwrap_err();
    assert!(e.contains("no layer is quantized"), "{e}");
    // Bad bits and group on a full layer.
    let mut s = "    quantized_kv_start: 0\n    layers:\n".to_string();
    for i in 0..12 {
        s.push_str(if i == 5 {
            "      - {bits: 7, group_size: 64}\n"
        } else {
            "      - null\n"
        });
    }
    let e = derived(&s).unwrap_err();
    assert!(
        e.contains("7 bits") && e.contains("group size 64 for head dimension 32"),
        "{e}"
    );
}

#[test]
fn kv_config_imports_as_mixed_kv_and_round_trips() {
    let s = spec("qwen3-0.6b-tiny-mixed-kv");
    let config = archgen_families::to_config_json(&s);
    let kv = serde_json::json!([
        {"layer_idx": 0, "bits": 8, "group_size": 32},
        {"layer_idx": 2, "bits": 4, "group_size": 32}
    ]);
    let (imported, _) = archgen_families::import::from_config_json_kv(
        &config,
        Some(archgen_families::import::KvConfig::OptiqMixed {
            kv_config: &kv,
            quantized_kv_start: 0,
        }),
        "qwen3-0.6b-tiny-mixed-kv",
    )
    .unwrap();
    assert_eq!(imported.mixed_kv(), s.mixed_kv());
    assert_eq!(imported.lower().layers, s.lower().layers);
    // The spec file it writes reads back equal.
    let yaml = archgen_families::to_yaml(&imported);
    let back = archgen_families::parse_str(&yaml, "specs/qwen3-0.6b-tiny-mixed-kv.yaml").unwrap();
    assert_eq!(back, imported);
    // Without kv_scheme.json's semantics a dense kv_config is refused, as before.
    assert!(archgen_families::import::from_config_json(&config, Some(&kv), "x").is_err());
}

/// A full dense document with a `mixed_kv` section and an error in another
/// section: the section-by-section read knows `mixed_kv` (it once reported it
/// as an unknown field) and reports only the real error.
#[test]
fn a_full_dense_document_with_mixed_kv_reports_only_its_real_error() {
    let full = archgen_families::to_yaml(&spec("qwen3-0.6b-tiny-mixed-kv"));
    assert!(full.contains("\nmixed_kv:"), "{full}");
    archgen_families::parse_str(&full, "full.yaml").expect("the full form parses");
    let broken = full.replacen("  num_hidden_layers: 4", "  num_hidden_layers: four", 1);
    assert_ne!(broken, full, "{full}");
    let text = archgen_families::parse_str(&broken, "full.yaml")
        .unwrap_err()
        .to_string();
    assert!(text.contains("layers.num_hidden_layers"), "{text}");
    assert!(!text.contains("mixed_kv"), "{text}");
}
