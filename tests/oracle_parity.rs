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

#[test]
fn monolith_is_bit_exact_with_mlx_lm_on_every_oracle_case() {
    let root = tempfile::tempdir().unwrap();
    run_python(
        "run_oracle.py",
        &[std::ffi::OsStr::new("--cases-out"), root.path().as_os_str()],
    );
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.path().join("index.json")).unwrap())
            .unwrap();
    let cases: Vec<String> = index["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert!(
        cases.len() >= 13,
        "expected the full case set, got {cases:?}"
    );

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
        eprintln!("{name}: L={} N={steps} checked", ids.len());
    }
    assert!(
        failures.is_empty(),
        "not bit-exact with mlx-lm:\n{}",
        failures.join("\n")
    );
    eprintln!("{} oracle cases byte-identical with mlx-lm", cases.len());
}
