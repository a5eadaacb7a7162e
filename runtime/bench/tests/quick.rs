//! `archgen-bench run --quick` end to end (what `cargo xtask bench --quick`
//! runs, here in the test profile): a tiny checkpoint, the three workers,
//! finite timings for each, and the ratio line in its documented form.
//! Times are not asserted.

use std::process::Command;

use serde_json::Value;

#[test]
fn quick_bench_gives_three_finite_timings_and_the_ratio_line() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("quick.json");
    let out = Command::new(env!("CARGO_BIN_EXE_archgen-bench"))
        .args(["run", "--quick", "--cache-dir"])
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "archgen-bench run --quick failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    let last = stdout.lines().last().expect("some output");
    let rest = last
        .strip_prefix("ratio spec=gemma4-12b-tiny cache=128 gen/mono=")
        .unwrap_or_else(|| panic!("unexpected last line {last:?}"));
    let (mono, mlx) = rest
        .split_once(" gen/mlx-lm=")
        .unwrap_or_else(|| panic!("unexpected last line {last:?}"));
    for r in [mono, mlx] {
        let v: f64 = r.parse().unwrap_or_else(|_| panic!("ratio {r:?}"));
        assert!(v.is_finite() && v > 0.0, "ratio {v}");
    }

    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cache = &v["specs"][0]["caches"][0];
    assert_eq!(cache["cache"], 128);
    let impls = cache["impls"].as_array().unwrap();
    let names: Vec<&str> = impls.iter().map(|i| i["impl"].as_str().unwrap()).collect();
    assert_eq!(names, ["generated", "monolith", "mlx-lm"]);
    for i in impls {
        let steps: Vec<f64> = i["steps_s"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap())
            .map(|t| t.as_f64().unwrap())
            .collect();
        assert_eq!(steps.len(), 6, "{}: 2 rounds x 3 steps", i["impl"]);
        assert!(steps.iter().all(|t| t.is_finite() && *t > 0.0), "{i}");
        let prefill = i["prefill_s"][0].as_f64().unwrap();
        assert!(prefill.is_finite() && prefill > 0.0, "{i}");
    }
    assert!(v["machine"]["mlx"].as_str().unwrap().starts_with("0.32"));
}
