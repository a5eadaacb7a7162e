//! L1 parity: the monolith against mlx-lm 0.32.2 on every oracle case
//! (tests/python/cases.py), built live into a temp dir on this machine, with
//! this libmlx. Every byte of prefill_logits, decode_logits and tokens must match.

use std::collections::HashMap;
use std::path::Path;

use archgen_runtime::bytes::array_bytes;
use archgen_runtime::protocol::run_logits;
use archgen_runtime::Array;
use archgen_tests::run_python;

fn case_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap()
}

/// Compares one tensor; `None` when identical.
fn diff(name: &str, ours: &Array, theirs: &Array) -> Option<String> {
    if ours.dtype() != theirs.dtype() || ours.shape() != theirs.shape() {
        return Some(format!(
            "{name}: rust {:?}{:?} vs mlx-lm {:?}{:?}",
            ours.dtype(),
            ours.shape(),
            theirs.dtype(),
            theirs.shape()
        ));
    }
    let (a, b) = (array_bytes(ours).unwrap(), array_bytes(theirs).unwrap());
    if a == b {
        return None;
    }
    let row_bytes = a.len() / (ours.shape().first().copied().unwrap_or(1).max(1) as usize);
    let first = a
        .chunks(row_bytes.max(1))
        .zip(b.chunks(row_bytes.max(1)))
        .position(|(x, y)| x != y)
        .unwrap_or(0);
    Some(format!("{name}: bytes differ, first at row {first}"))
}

/// Builds every oracle case (checkpoint + mlx-lm logits) into a temp dir;
/// returns the dir and the case names in order.
fn build_oracle_cases() -> (tempfile::TempDir, Vec<String>) {
    let root = tempfile::tempdir().unwrap();
    run_python(
        "run_oracle.py",
        &[std::ffi::OsStr::new("--cases-out"), root.path().as_os_str()],
    );
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.path().join("index.json")).unwrap())
            .unwrap();
    let cases = index["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    (root, cases)
}

#[test]
fn monolith_is_bit_exact_with_mlx_lm_on_every_oracle_case() {
    let (root, cases) = build_oracle_cases();
    assert!(
        cases.len() >= 16,
        "expected the full case set, got {cases:?}"
    );
    let mut kv_cases = 0;

    let mut failures = Vec::new();
    for name in &cases {
        let dir = root.path().join(name);
        let case = case_json(&dir);
        let ids: Vec<i32> = case["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect();
        let steps = case["decode_steps"].as_u64().unwrap() as usize;
        let model = match archgen_monolith::load_dir(&dir.join("model")) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{name}: load failed: {e}"));
                continue;
            }
        };
        let run = run_logits(&model, &ids, steps).unwrap();
        let oracle: HashMap<String, Array> =
            Array::load_safetensors(dir.join("oracle.safetensors")).unwrap();
        for (key, ours) in [
            ("prefill_logits", &run.prefill_logits),
            ("decode_logits", &run.decode_logits),
            ("tokens", &run.tokens),
        ] {
            if let Some(d) = diff(key, ours, &oracle[key]) {
                failures.push(format!("{name}: {d}"));
            }
        }
        if !case["kv_quantization"].is_null() {
            kv_cases += 1;
            if let Some(f) = kv_quant_really_ran(name, &dir, &case, &model, &ids, steps, &oracle) {
                failures.push(f);
            }
        }
        eprintln!("{name}: L={} N={steps} checked", ids.len());
    }
    assert!(kv_cases >= 2, "only {kv_cases} KV-quantized cases");
    assert!(
        failures.is_empty(),
        "not bit-exact with mlx-lm:\n{}",
        failures.join("\n")
    );
    eprintln!("{} oracle cases byte-identical with mlx-lm", cases.len());
}

/// A KV-quantized case must really exercise the quantized path: mlx-lm's
/// logits without `kv_config.json` differ (recorded by the runner), the
/// monolith built quantized caches on exactly the listed layers, and the
/// monolith loaded from the same checkpoint minus `kv_config.json` gives bytes
/// other than the oracle's.
fn kv_quant_really_ran(
    name: &str,
    dir: &Path,
    case: &serde_json::Value,
    model: &archgen_monolith::Monolith,
    ids: &[i32],
    steps: usize,
    oracle: &HashMap<String, Array>,
) -> Option<String> {
    use archgen_runtime::cache::LayerCache;
    use archgen_runtime::deltanet::MixerCache;
    use archgen_runtime::model::CausalLm;
    if case["kv_quant_changes_logits"] != serde_json::json!(true) {
        return Some(format!(
            "{name}: mlx-lm's logits do not depend on kv_config.json"
        ));
    }
    let listed: Vec<usize> = case["kv_quantization"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["layer_idx"].as_u64().unwrap() as usize)
        .collect();
    let quantized: Vec<usize> = model
        .make_cache()
        .iter()
        .enumerate()
        .filter(|(_, c)| matches!(c, Some(MixerCache::Kv(LayerCache::Quantized(_)))))
        .map(|(i, _)| i)
        .collect();
    if quantized != listed {
        return Some(format!(
            "{name}: quantized caches on layers {quantized:?}, kv_config lists {listed:?}"
        ));
    }
    let plain_dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir.join("model")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "kv_config.json" {
            std::fs::copy(entry.path(), plain_dir.path().join(entry.file_name())).unwrap();
        }
    }
    let plain = archgen_monolith::load_dir(plain_dir.path()).unwrap();
    let run = run_logits(&plain, ids, steps).unwrap();
    let same = [
        ("prefill_logits", &run.prefill_logits),
        ("decode_logits", &run.decode_logits),
    ]
    .iter()
    .all(|(k, ours)| diff(k, ours, &oracle[*k]).is_none());
    same.then(|| format!("{name}: the unquantized cache gives the same bytes as the oracle"))
}

/// `spec import` of the config.json files mlx-lm itself wrote for the oracle
/// checkpoints, then `spec show --json`: every architecture field round-trips
/// (except dead fields the importer normalises and reports).
#[test]
fn spec_import_round_trips_mlx_lm_configs() {
    let (root, cases) = build_oracle_cases();
    let mut checked = 0;
    let mut failures = Vec::new();
    for name in &cases {
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.path().join(name).join("model/config.json")).unwrap(),
        )
        .unwrap();
        let (spec, _) =
            archgen_families::import::from_config_json(&config, None, &format!("case-{name}"))
                .unwrap_or_else(|e| panic!("{name}: import failed: {e}"));
        let shown = archgen_families::to_hf_json(&spec);
        let text = config.get("text_config").unwrap_or(&config);
        let k_eq_v = text["attention_k_eq_v"].as_bool().unwrap();
        let shared = text["num_kv_shared_layers"].as_u64().unwrap();
        for (key, value) in text.as_object().unwrap() {
            let Some(ours) = shown.get(key) else { continue };
            // Fields mlx-lm never reads in this configuration: the importer
            // normalises them (and lists the change), so they may differ.
            let ple = text["hidden_size_per_layer_input"].as_u64().unwrap_or(0) > 0;
            let dead = (key == "num_global_key_value_heads" && !k_eq_v)
                || (key == "use_double_wide_mlp" && shared == 0)
                || (key == "vocab_size_per_layer_input" && !ple);
            if dead {
                continue;
            }
            let same = if key == "rope_parameters" {
                same_rope(value, ours)
            } else {
                match (ours.as_f64(), value.as_f64()) {
                    (Some(a), Some(b)) => (a - b).abs() <= f64::EPSILON * b.abs().max(1.0),
                    _ => ours == value,
                }
            };
            if !same {
                failures.push(format!("{name}: {key}: config {value} vs spec show {ours}"));
            }
            checked += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "fields did not round-trip:\n{}",
        failures.join("\n")
    );
    assert!(checked > 13 * 20, "only {checked} fields compared");
    eprintln!("{checked} config fields round-tripped");
}

/// RoPE parameters as mlx-lm reads them: type and theta per layer type; for
/// the proportional form also the partial factor and `factor` (default 1.0).
/// The default form ignores `partial_rotary_factor`.
fn same_rope(config: &serde_json::Value, shown: &serde_json::Value) -> bool {
    ["full_attention", "sliding_attention"].iter().all(|t| {
        let (a, b) = (&config[*t], &shown[*t]);
        let f =
            |v: &serde_json::Value, k: &str, d: f64| v.get(k).and_then(|x| x.as_f64()).unwrap_or(d);
        a["rope_type"] == b["rope_type"]
            && f(a, "rope_theta", -1.0) == f(b, "rope_theta", -2.0)
            && (a["rope_type"] != "proportional"
                || (f(a, "partial_rotary_factor", -1.0) == f(b, "partial_rotary_factor", -2.0)
                    && f(a, "factor", 1.0) == f(b, "factor", 1.0)))
    })
}
