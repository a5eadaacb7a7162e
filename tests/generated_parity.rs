//! For every tiny spec in specs/: a checkpoint with exactly that structure,
//! then the generated model (picked by fingerprint, as `--impl auto` does),
//! the monolith and mlx-lm 0.32.2 must give the same bytes under the logits
//! protocol. An insta snapshot pins each model's output digest so numeric
//! drift shows up in review. Specs of tier L2 (mlx-optiq's per-layer mixed KV,
//! `mixed_kv`) are checked against mlx-optiq 0.7.7 on mlx-lm instead
//! (tests/python/optiq_oracle.py), in a Python process of their own.

use std::path::{Path, PathBuf};

use archgen_runtime::bytes::array_bytes;
use archgen_runtime::model::{CausalLm, ModelTask};
use archgen_runtime::protocol::{run_logits, LogitsRun};
use archgen_runtime::Array;
use archgen_tests::{config_for, repo_root, run_python};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

struct Protocol<'a> {
    ids: &'a [i32],
    steps: usize,
}

impl ModelTask for Protocol<'_> {
    type Output = LogitsRun;
    fn run<M: CausalLm>(self, m: &M) -> LogitsRun {
        run_logits(m, self.ids, self.steps).unwrap()
    }
}

struct Case {
    name: String,
    spec_path: PathBuf,
    dir: PathBuf,
    ids: Vec<i32>,
    steps: usize,
    tier: archgen_spec::tier::Tier,
}

fn tiny_specs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo_root().join("specs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml") && p.to_string_lossy().contains("-tiny")
        })
        .collect();
    v.sort();
    v
}

fn digest(run: &LogitsRun) -> String {
    let mut h = Sha256::new();
    for a in [&run.prefill_logits, &run.decode_logits, &run.tokens] {
        h.update(array_bytes(a).unwrap());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn same(a: &Array, b: &Array) -> bool {
    a.dtype() == b.dtype()
        && a.shape() == b.shape()
        && array_bytes(a).unwrap() == array_bytes(b).unwrap()
}

#[test]
fn generated_monolith_and_mlx_lm_agree_on_every_tiny_spec() {
    let root = tempfile::tempdir().unwrap();
    // One Python process per tier: mlx-optiq patches mlx-lm process-wide.
    let (mut jobs, mut l2_jobs) = (Vec::new(), Vec::new());
    let mut cases = Vec::new();
    for path in tiny_specs() {
        let spec = archgen_spec::load(&path).unwrap();
        let arch = spec.resolve();
        let name = spec.name().to_string();
        let dir = root.path().join(&name);
        // Longer than the window so the rotating cache wraps; decode past it.
        // Dense families have no window: still a 19-token prompt and 12 steps.
        let window = if arch.sliding_window > 0 {
            arch.sliding_window
        } else {
            8
        };
        let vocab = arch.vocab_size as i32;
        let ids: Vec<i32> = (0..(2 * window + 3) as i32)
            .map(|i| (i * 37 + 11) % vocab)
            .collect();
        let steps = window + 4;
        // Unquantized experts run only in float32 on MLX's CPU backend.
        let dtype = if arch.moe.is_some() && arch.quantization.is_none() {
            "float32"
        } else {
            "bfloat16"
        };
        let q = arch.quantization.as_ref().map(|q| q.default);
        let kv: serde_json::Map<String, Value> = arch
            .layers
            .iter()
            .filter_map(|f| {
                f.kv_quant
                    .map(|k| (f.index.to_string(), json!([k.bits, k.group_size])))
            })
            .collect();
        let mixed_kv = spec.mixed_kv().map(|m| {
            let layers: serde_json::Map<String, Value> = m
                .kv_config()
                .iter()
                .map(|e| (e.layer_idx.to_string(), json!([e.bits, e.group_size])))
                .collect();
            json!({"layers": layers, "quantized_kv_start": m.quantized_kv_start})
        });
        let tier = archgen_spec::tier::tier(&spec.lower()).tier;
        // Seeds count within a tier, so adding an L2 spec leaves the L1
        // checkpoints (and their pinned digests) as they were.
        let (batch, seed) = match tier {
            archgen_spec::tier::Tier::L1 => (&mut jobs, 1000),
            archgen_spec::tier::Tier::L2 => (&mut l2_jobs, 2000),
            archgen_spec::tier::Tier::L3 => panic!("{name}: an L3 spec has no oracle"),
        };
        let seed = seed + batch.len();
        batch.push(json!({
            "config": config_for(&spec),
            "out": dir,
            "seed": seed,
            "dtype": dtype,
            "bits": q.map(|q| q.bits),
            "group_size": q.map(|q| q.group_size),
            "kv_quant": if kv.is_empty() { Value::Null } else { Value::Object(kv) },
            "mixed_kv": mixed_kv,
            "prompt_ids": ids,
            "decode_steps": steps,
        }));
        cases.push(Case {
            name,
            spec_path: path,
            dir,
            ids,
            steps,
            tier,
        });
    }
    assert!(
        cases.len() >= 8,
        "expected every tiny spec, found {}",
        cases.len()
    );
    assert!(
        l2_jobs.len() >= 2,
        "expected the L2 (mixed_kv) tiny specs, found {}",
        l2_jobs.len()
    );
    for (file, batch) in [("jobs.json", &jobs), ("jobs-l2.json", &l2_jobs)] {
        let jobs_path = root.path().join(file);
        std::fs::write(&jobs_path, serde_json::to_vec(batch).unwrap()).unwrap();
        run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    }

    let mut failures = Vec::new();
    for c in &cases {
        let model_dir: &Path = &c.dir.join("model");
        let (arch, weights) = archgen_monolith::read_dir(model_dir).unwrap();
        let fingerprint = archgen_plan::fingerprint(&arch);
        // The checkpoint (kv_config.json, kv_scheme.json) reads back at the spec's tier.
        let loaded_tier = archgen_spec::tier::tier(&arch);
        if loaded_tier.tier != c.tier {
            failures.push(format!(
                "{}: the checkpoint loads as {loaded_tier}, the spec is {}",
                c.name, c.tier
            ));
        }
        // Dispatch must pick this spec's generated model for its checkpoint.
        match archgen_generated::find(&fingerprint) {
            Some(m) if m.name == c.name => {}
            other => {
                failures.push(format!(
                    "{}: checkpoint fingerprint {fingerprint} selects {:?}",
                    c.name,
                    other.map(|m| m.name)
                ));
                continue;
            }
        }
        let generated = archgen_generated::run(
            &fingerprint,
            weights,
            Protocol {
                ids: &c.ids,
                steps: c.steps,
            },
        )
        .unwrap()
        .unwrap();
        let monolith = run_logits(
            &archgen_monolith::load_dir(model_dir).unwrap(),
            &c.ids,
            c.steps,
        )
        .unwrap();
        let oracle = Array::load_safetensors(c.dir.join("oracle.safetensors")).unwrap();
        for (key, g, m) in [
            (
                "prefill_logits",
                &generated.prefill_logits,
                &monolith.prefill_logits,
            ),
            (
                "decode_logits",
                &generated.decode_logits,
                &monolith.decode_logits,
            ),
            ("tokens", &generated.tokens, &monolith.tokens),
        ] {
            if !same(g, m) {
                failures.push(format!("{}: {key}: generated != monolith", c.name));
            }
            if !same(m, &oracle[key]) {
                let oracle_name = match c.tier {
                    archgen_spec::tier::Tier::L2 => "mlx-optiq",
                    _ => "mlx-lm",
                };
                failures.push(format!("{}: {key}: monolith != {oracle_name}", c.name));
            }
        }
        let snapshot = format!(
            "spec: {}\nfingerprint: {fingerprint}\nprompt: {} tokens, decode: {} steps\nprefill_logits: {:?} {:?}\ndecode_logits: {:?} {:?}\ntokens: {:?}\nsha256: {}\n",
            c.spec_path.strip_prefix(repo_root()).unwrap().display(),
            c.ids.len(),
            c.steps,
            generated.prefill_logits.dtype(),
            generated.prefill_logits.shape(),
            generated.decode_logits.dtype(),
            generated.decode_logits.shape(),
            generated.tokens.as_slice::<i32>(),
            digest(&generated),
        );
        insta::assert_snapshot!(format!("digest-{}", c.name), snapshot);
        eprintln!(
            "{} ({}): generated == monolith == {}",
            c.name,
            c.tier,
            match c.tier {
                archgen_spec::tier::Tier::L2 => "mlx-optiq",
                _ => "mlx-lm",
            }
        );
    }
    assert!(
        failures.is_empty(),
        "parity failures:\n{}",
        failures.join("\n")
    );
}
