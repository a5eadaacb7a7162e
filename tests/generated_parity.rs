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
    tier: archgen_ir::tier::Tier,
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

/// `ARCHGEN_PARITY_SPECS=NAME,NAME` runs the same three-way comparison on
/// the named specs of specs/ instead of the tiny ones: the manual check of
/// the reduced real-width specs (docs/parity.md), which pins no digest.
fn manual_specs() -> Option<Vec<PathBuf>> {
    let names = std::env::var("ARCHGEN_PARITY_SPECS").ok()?;
    Some(
        names
            .split(',')
            .filter(|n| !n.is_empty())
            .map(|n| repo_root().join("specs").join(format!("{n}.yaml")))
            .collect(),
    )
}

/// The random-weight seed of a tiny spec's checkpoint. The first specs got
/// `1000 + their position` in the sorted list; that position moves whenever a
/// spec sorting before them is added, and with it their weights and pinned
/// digests, so their seeds are kept here as they were. Later specs take a
/// seed from their name (FNV-1a), which no other spec's arrival changes.
fn seed(name: &str) -> u64 {
    const POSITIONAL: [&str; 14] = [
        "gemma4-12b-tiny-q4",
        "gemma4-12b-tiny",
        "gemma4-26b-a4b-tiny-q8",
        "gemma4-26b-a4b-tiny",
        "gemma4-31b-tiny",
        "gemma4-e2b-tiny",
        "gemma4-e4b-tiny-kv",
        "gemma4-e4b-tiny",
        "gemma4-walkthrough-tiny",
        "llama-3.2-1b-tiny-q4",
        "llama-3.2-1b-tiny",
        "qwen3-0.6b-tiny-q4",
        "qwen3-0.6b-tiny",
        "qwen3-8b-tiny",
    ];
    match POSITIONAL.iter().position(|n| *n == name) {
        Some(i) => 1000 + i as u64,
        None => {
            let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            // Above the positional range, within what numpy's seed takes.
            2000 + h % 1_000_000
        }
    }
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

/// mlx-lm's logits protocol on the checkpoint in `dir` (tests/python/
/// oracle_logits.py), written to `out` and read back.
fn mlx_lm_logits(
    dir: &Path,
    ids: &[i32],
    steps: usize,
    out: &Path,
) -> std::collections::HashMap<String, Array> {
    let id_list = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    run_python(
        "oracle_logits.py",
        &[
            "--model".as_ref(),
            dir.as_os_str(),
            "--prompt-ids".as_ref(),
            id_list.as_ref(),
            "--decode-steps".as_ref(),
            steps.to_string().as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ],
    );
    Array::load_safetensors(out).unwrap()
}

/// The monolith and the generated model `name` (which dispatch must pick
/// for the checkpoint in `dir`) give `oracle`'s bytes under the logits
/// protocol: prefill, decode steps and greedy tokens.
fn assert_both_paths_give(
    dir: &Path,
    name: &str,
    ids: &[i32],
    steps: usize,
    oracle: &std::collections::HashMap<String, Array>,
) {
    let monolith = run_logits(&archgen_monolith::load_dir(dir).unwrap(), ids, steps).unwrap();
    let (ir, weights) = archgen_checkpoint::read_dir(dir).unwrap();
    let fingerprint = archgen_plan::fingerprint(&ir);
    assert_eq!(
        archgen_generated::find(&fingerprint).map(|m| m.name),
        Some(name),
        "dispatch"
    );
    let generated = archgen_generated::run(&fingerprint, weights, Protocol { ids, steps })
        .unwrap()
        .unwrap();
    for (key, m, g) in [
        (
            "prefill_logits",
            &monolith.prefill_logits,
            &generated.prefill_logits,
        ),
        (
            "decode_logits",
            &monolith.decode_logits,
            &generated.decode_logits,
        ),
        ("tokens", &monolith.tokens, &generated.tokens),
    ] {
        assert!(same(m, &oracle[key]), "{key}: monolith != mlx-lm");
        assert!(same(g, m), "{key}: generated != monolith");
    }
}

#[test]
fn generated_monolith_and_mlx_lm_agree_on_every_tiny_spec() {
    let root = tempfile::tempdir().unwrap();
    // One Python process per tier: mlx-optiq patches mlx-lm process-wide.
    let (mut jobs, mut l2_jobs) = (Vec::new(), Vec::new());
    let mut cases = Vec::new();
    let manual = manual_specs();
    for path in manual.clone().unwrap_or_else(tiny_specs) {
        let spec = archgen_families::load(&path).unwrap();
        let ir = spec.lower();
        let name = spec.name().to_string();
        let dir = root.path().join(&name);
        // Longer than the window so the rotating cache wraps; decode past it.
        // Dense families have no window: still a 19-token prompt and 12 steps.
        let window = archgen_tests::sliding_window(&ir).unwrap_or(8);
        let vocab = ir.vocab_size as i32;
        let ids: Vec<i32> = (0..(2 * window + 3) as i32)
            .map(|i| (i * 37 + 11) % vocab)
            .collect();
        let steps = window + 4;
        // Unquantized experts run only in float32 on MLX's CPU backend.
        let dtype = if archgen_tests::has_experts(&ir) && ir.quantization.is_none() {
            "float32"
        } else {
            "bfloat16"
        };
        let q = ir.quantization.as_ref().map(|q| q.default);
        // Modules quantized in another mode than affine (mxfp4 experts): the
        // checkpoint writer takes them as its quant_predicate's answers.
        let mode_overrides: serde_json::Map<String, Value> = ir
            .quantization
            .as_ref()
            .map(|q| {
                q.overrides
                    .iter()
                    .filter_map(|(path, entry)| match entry {
                        Some(p) if p.mode != archgen_ir::QuantMode::Affine => Some((
                            path.clone(),
                            json!({"group_size": p.group_size, "bits": p.bits, "mode": p.mode.as_str()}),
                        )),
                        Some(_) | None => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let kv = archgen_tests::quantized_kv_layers(&ir);
        let mixed_kv = spec.mixed_kv().map(|m| {
            let layers: serde_json::Map<String, Value> = m
                .kv_config()
                .iter()
                .map(|e| (e.layer_idx.to_string(), json!([e.bits, e.group_size])))
                .collect();
            json!({"layers": layers, "quantized_kv_start": m.quantized_kv_start})
        });
        let tier = archgen_ir::tier::tier(&spec.lower()).tier;
        let batch = match tier {
            archgen_ir::tier::Tier::L1 => &mut jobs,
            archgen_ir::tier::Tier::L2 => &mut l2_jobs,
            archgen_ir::tier::Tier::L3 => panic!("{name}: an L3 spec has no oracle"),
        };
        batch.push(json!({
            "config": config_for(&spec),
            "out": dir,
            "seed": seed(&name),
            "dtype": dtype,
            "bits": q.map(|q| q.bits),
            "group_size": q.map(|q| q.group_size),
            "mode_overrides": if mode_overrides.is_empty() { Value::Null } else { Value::Object(mode_overrides) },
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
        cases.len() >= 8 || manual.is_some(),
        "expected every tiny spec, found {}",
        cases.len()
    );
    assert!(
        l2_jobs.len() >= 2 || manual.is_some(),
        "expected the L2 (mixed_kv) tiny specs, found {}",
        l2_jobs.len()
    );
    for (file, batch) in [("jobs.json", &jobs), ("jobs-l2.json", &l2_jobs)] {
        if batch.is_empty() {
            continue;
        }
        let jobs_path = root.path().join(file);
        std::fs::write(&jobs_path, serde_json::to_vec(batch).unwrap()).unwrap();
        run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    }

    let mut failures = Vec::new();
    for c in &cases {
        let model_dir: &Path = &c.dir.join("model");
        let (arch, weights) = archgen_checkpoint::read_dir(model_dir).unwrap();
        let fingerprint = archgen_plan::fingerprint(&arch);
        // The checkpoint (kv_config.json, kv_scheme.json) reads back at the spec's tier.
        let loaded_tier = archgen_ir::tier::tier(&arch);
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
        let failures_before = failures.len();
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
                    archgen_ir::tier::Tier::L2 => "mlx-optiq",
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
        match &manual {
            None => insta::assert_snapshot!(format!("digest-{}", c.name), snapshot),
            Some(_) => eprintln!("{snapshot}"),
        }
        if failures.len() == failures_before {
            eprintln!(
                "{} ({}): generated == monolith == {}",
                c.name,
                c.tier,
                match c.tier {
                    archgen_ir::tier::Tier::L2 => "mlx-optiq",
                    _ => "mlx-lm",
                }
            );
        }
    }
    assert!(
        failures.is_empty(),
        "parity failures:\n{}",
        failures.join("\n")
    );
}

/// mlx-lm's gemma3_text adds residuals through `clip_residual`, which for
/// float16 adds in float32 and clips the sum to float16's finite range. A
/// float16 `gemma-3-1b-tiny` whose first layer's `post_attention_layernorm`
/// weight is 30000 overflows float16 in that branch: mlx-lm clips the sum
/// to +-65504 and stays finite, where a plain float16 add would carry the
/// infinity on (and its next norm would turn it into NaN). The generated
/// model and the monolith must give mlx-lm's bytes, prefill and the
/// compiled one-token steps.
#[test]
fn gemma3_text_float16_residuals_clip_as_mlx_lm_clips_them() {
    let root = tempfile::tempdir().unwrap();
    let name = "gemma-3-1b-tiny";
    let spec =
        archgen_families::load(repo_root().join("specs").join(format!("{name}.yaml"))).unwrap();
    let ids: Vec<i32> = (0..19).map(|i| (i * 37 + 11) % 512).collect();
    let steps = 12;
    let jobs = json!([{
        "config": config_for(&spec),
        "out": root.path().join(name),
        "seed": seed(name),
        "dtype": "float16",
        "bits": null,
        "group_size": null,
        "kv_quant": null,
        "mixed_kv": null,
        "prompt_ids": ids,
        "decode_steps": 1,
    }]);
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    // The same checkpoint with the overflowing norm weight.
    let dir = root.path().join("overflowing");
    let norm = "model.layers.0.post_attention_layernorm.weight";
    let src = root.path().join(name).join("model");
    archgen_tests::with_tensor_filled(&src, &dir, norm, 30000.0);
    let written = Array::load_safetensors(dir.join("model.safetensors")).unwrap();
    assert_eq!(
        written[norm].dtype(),
        archgen_runtime::mlx_rs::Dtype::Float16
    );
    let oracle_path = root.path().join("oracle-overflowing.safetensors");
    let oracle = mlx_lm_logits(&dir, &ids, steps, &oracle_path);
    for key in ["prefill_logits", "decode_logits"] {
        archgen_tests::assert_finite(&oracle[key], &format!("{key}: mlx-lm's logits"));
    }
    assert_both_paths_give(&dir, name, &ids, steps, &oracle);
}

/// A gemma3_text checkpoint with its own `lm_head` (config.json
/// `tie_word_embeddings: false`; mlx-lm then runs the untied head) is refused
/// at load with the field named: archgen's gemma3_text head is the tied one.
#[test]
fn gemma3_text_refuses_an_untied_head() {
    let root = tempfile::tempdir().unwrap();
    let name = "gemma-3-1b-tiny";
    let spec =
        archgen_families::load(repo_root().join("specs").join(format!("{name}.yaml"))).unwrap();
    let mut config = config_for(&spec);
    config["tie_word_embeddings"] = json!(false);
    let jobs = json!([{
        "config": config,
        "out": root.path().join(name),
        "seed": seed(name),
        "dtype": "bfloat16",
        "bits": null,
        "group_size": null,
        "kv_quant": null,
        "mixed_kv": null,
        "prompt_ids": [1, 2, 3],
        "decode_steps": 1,
    }]);
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    let dir = root.path().join(name).join("model");
    let (names, _) = archgen_runtime::weights::read_checkpoint(&dir)
        .map(|c| (c.tensors.keys().cloned().collect::<Vec<_>>(), ()))
        .unwrap();
    assert!(names.iter().any(|n| n == "lm_head.weight"), "{names:?}");
    let e = archgen_checkpoint::read_dir(&dir)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("tie_word_embeddings: false"), "{e}");
}

/// The real-width check, run by hand (it needs a few GB and minutes):
/// `ARCHGEN_REAL_WIDTH_SPEC=qwen3-30b-a3b-l2-q4 cargo test --workspace --test
/// generated_parity -- --ignored real_width`. One spec from specs/ at its
/// declared sizes, random weights in bf16 (quantized as the spec says), a
/// 40-token prompt (prefill routes 40 x top-k pairs, past SwitchGLU's sort
/// threshold) and 4 decode steps: generated == monolith == mlx-lm, bytes.
#[test]
#[ignore = "real width: run by hand with ARCHGEN_REAL_WIDTH_SPEC"]
fn real_width_instance_agrees_in_all_three() {
    let Ok(name) = std::env::var("ARCHGEN_REAL_WIDTH_SPEC") else {
        panic!("set ARCHGEN_REAL_WIDTH_SPEC to a spec name in specs/");
    };
    let path = repo_root().join("specs").join(format!("{name}.yaml"));
    let spec = archgen_families::load(&path).unwrap_or_else(|d| panic!("{d}"));
    let ir = spec.lower();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join(&name);
    let vocab = ir.vocab_size as i32;
    let ids: Vec<i32> = (0..40).map(|i| (i * 7919 + 11) % vocab).collect();
    let steps = 4;
    let dtype = if archgen_tests::has_experts(&ir) && ir.quantization.is_none() {
        "float32"
    } else {
        "bfloat16"
    };
    let q = ir.quantization.as_ref().map(|q| q.default);
    let jobs = json!([{
        "config": config_for(&spec),
        "out": dir,
        "seed": 7,
        "dtype": dtype,
        "bits": q.map(|q| q.bits),
        "group_size": q.map(|q| q.group_size),
        "kv_quant": Value::Null,
        "prompt_ids": ids,
        "decode_steps": steps,
    }]);
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    let model_dir = dir.join("model");
    let (ir, weights) = archgen_checkpoint::read_dir(&model_dir).unwrap();
    let fingerprint = archgen_plan::fingerprint(&ir);
    assert_eq!(
        archgen_generated::find(&fingerprint).map(|m| m.name),
        Some(name.as_str()),
        "dispatch"
    );
    let generated = archgen_generated::run(&fingerprint, weights, Protocol { ids: &ids, steps })
        .unwrap()
        .unwrap();
    let monolith = run_logits(
        &archgen_monolith::load_dir(&model_dir).unwrap(),
        &ids,
        steps,
    )
    .unwrap();
    let oracle = Array::load_safetensors(dir.join("oracle.safetensors")).unwrap();
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
        assert!(same(g, m), "{name}: {key}: generated != monolith");
        assert!(same(m, &oracle[key]), "{name}: {key}: monolith != mlx-lm");
    }
    eprintln!(
        "{name}: generated == monolith == mlx-lm ({} prompt tokens, {steps} steps, {:?} {:?}, sha256 {})",
        ids.len(),
        generated.prefill_logits.dtype(),
        generated.prefill_logits.shape(),
        digest(&generated)
    );
}

/// `SanitizeRule::StackExperts` (`Qwen3MoeModel.sanitize`): the Hugging Face
/// per-expert weights `mlp.experts.{e}.{gate,up,down}_proj.weight` of the
/// float32 `qwen3-30b-a3b-tiny` checkpoint load, stacked, to the very logits
/// mlx-lm gives for the mlx layout (`variants.py family-hf-layout` writes the
/// HF form).
#[test]
fn hf_per_expert_weights_are_stacked_as_mlx_lm_stacks_them() {
    hf_layout_loads_as_mlx_lm_sanitizes_it("qwen3-30b-a3b-tiny", "model.layers.0.");
}

/// glm4_moe's sanitize (`StackExperts`, `DropLayerPastStack`): the per-expert
/// weights of the float32 `glm-4.5-air-tiny` checkpoint's MoE layers, and a
/// multi-token-prediction layer `model.layers.4.*` after its 4 layers, load
/// to the very logits mlx-lm gives for the mlx layout.
#[test]
fn glm4_moe_hf_experts_are_stacked_and_the_mtp_layer_dropped() {
    hf_layout_loads_as_mlx_lm_sanitizes_it("glm-4.5-air-tiny", "model.layers.1.");
}

/// deepseek_v3's sanitize (`SplitKvBProj`, `StackExperts`,
/// `DropRotaryTables`): each layer's `kv_b_proj` of the float32
/// `deepseek-v3-tiny` checkpoint (per head the key rows, then the value
/// rows), split back into `embed_q` and `unembed_out`, its per-expert
/// weights and rotary tables, load to the very logits mlx-lm gives for the
/// mlx layout.
#[test]
fn deepseek_v3_hf_kv_b_proj_is_split_and_experts_stacked() {
    hf_layout_loads_as_mlx_lm_sanitizes_it("deepseek-v3-tiny", "model.layers.1.");
}

/// A quantized `kv_b_proj` (`deepseek-v3-tiny-q4` rewritten with one per
/// layer, 4-bit g32): archgen's sanitize dequantizes, splits and quantizes
/// it again as mlx-lm's does, so the monolith's logits of that checkpoint
/// equal mlx-lm's own (`variants.py batch`, its sanitize on the same files).
/// A block-scaled fp8 tensor (`weight_scale_inv`) in the checkpoint is
/// refused with the tensor named.
#[test]
fn deepseek_v3_quantized_kv_b_proj_is_split_as_mlx_lm_splits_it() {
    let name = "deepseek-v3-tiny-q4";
    let spec = archgen_families::load(repo_root().join(format!("specs/{name}.yaml"))).unwrap();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("mlx");
    let ids: Vec<i32> = (0..19).map(|i| (i * 37 + 11) % 512).collect();
    let jobs = json!([{
        "config": config_for(&spec),
        "out": dir,
        "seed": 5,
        "dtype": "bfloat16",
        "bits": 4,
        "group_size": 32,
        "kv_quant": Value::Null,
        "prompt_ids": ids,
        "decode_steps": 1,
    }]);
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    let hf = root.path().join("hf");
    run_python(
        "variants.py",
        &[
            "family-hf-layout".as_ref(),
            dir.join("model").as_os_str(),
            hf.as_os_str(),
        ],
    );
    let tensors = Array::load_safetensors(hf.join("model.safetensors")).unwrap();
    assert!(tensors.contains_key("model.layers.0.self_attn.kv_b_proj.scales"));
    let out = root.path().join("mlx_lm.safetensors");
    let ids_json = serde_json::to_string(&[&ids]).unwrap();
    run_python(
        "variants.py",
        &[
            "batch".as_ref(),
            hf.as_os_str(),
            out.as_os_str(),
            ids_json.as_ref(),
        ],
    );
    let theirs = &Array::load_safetensors(&out).unwrap()["logits"];
    let ours = run_logits(&archgen_monolith::load_dir(&hf).unwrap(), &ids, 1).unwrap();
    let theirs = theirs.reshape(ours.prefill_logits.shape()).unwrap();
    assert!(
        same(&ours.prefill_logits, &theirs),
        "{name}: a quantized kv_b_proj: archgen's split != mlx-lm's"
    );

    let mut tensors = tensors;
    tensors.insert(
        "model.layers.0.self_attn.o_proj.weight_scale_inv".to_string(),
        Array::from_slice(&[1.0f32], &[1, 1]),
    );
    let fp8 = root.path().join("fp8");
    std::fs::create_dir_all(&fp8).unwrap();
    std::fs::copy(hf.join("config.json"), fp8.join("config.json")).unwrap();
    Array::save_safetensors(tensors.iter(), None, fp8.join("model.safetensors")).unwrap();
    let e = archgen_monolith::load_dir(&fp8)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("o_proj.weight_scale_inv") && e.contains("mlx_lm.convert"),
        "{e}"
    );
}

/// The checkpoint of the float32 tiny spec `name` rewritten in its Hugging
/// Face layout (`variants.py family-hf-layout`; `moe_layer` a layer prefix
/// with experts) loads in the monolith to mlx-lm's logits for the mlx layout.
fn hf_layout_loads_as_mlx_lm_sanitizes_it(name: &str, moe_layer: &str) {
    let spec = archgen_families::load(repo_root().join(format!("specs/{name}.yaml"))).unwrap();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("mlx");
    let ids: Vec<i32> = (0..19).map(|i| (i * 37 + 11) % 512).collect();
    let jobs = json!([{
        "config": config_for(&spec),
        "out": dir,
        "seed": 5,
        "dtype": "float32",
        "bits": Value::Null,
        "group_size": Value::Null,
        "kv_quant": Value::Null,
        "prompt_ids": ids,
        "decode_steps": 3,
    }]);
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    let hf = root.path().join("hf");
    run_python(
        "variants.py",
        &[
            "family-hf-layout".as_ref(),
            dir.join("model").as_os_str(),
            hf.as_os_str(),
        ],
    );
    let names = Array::load_safetensors(hf.join("model.safetensors")).unwrap();
    assert!(names.contains_key(&format!("{moe_layer}mlp.experts.7.down_proj.weight")));
    assert!(!names.keys().any(|k| k.contains("switch_mlp")));
    let run = run_logits(&archgen_monolith::load_dir(&hf).unwrap(), &ids, 3).unwrap();
    let oracle = Array::load_safetensors(dir.join("oracle.safetensors")).unwrap();
    for (key, got) in [
        ("prefill_logits", &run.prefill_logits),
        ("decode_logits", &run.decode_logits),
        ("tokens", &run.tokens),
    ] {
        assert!(
            same(got, &oracle[key]),
            "{name}: {key}: HF layout != mlx-lm"
        );
    }
}

/// `SanitizeRule::CopyEmbeddingToHead` (`minicpm.sanitize`): a
/// `minicpm-2b-tiny` checkpoint without `lm_head.weight` (a Hugging Face
/// MiniCPM stores none) loads with the head taken from the embedding, in the
/// monolith and in the generated model (picked by fingerprint), to the bytes
/// mlx-lm gives for that same directory, which differ from those of the
/// checkpoint with its own random head. The quantized variant without its
/// `lm_head` tensors is refused: mlx-lm's sanitize would copy only the packed
/// embedding weight, which it then cannot load.
#[test]
fn minicpm_head_is_taken_from_the_embedding_when_absent() {
    let root = tempfile::tempdir().unwrap();
    let ids: Vec<i32> = (0..19).map(|i| (i * 37 + 11) % 512).collect();
    let steps = 4;
    let mut jobs = Vec::new();
    for (name, dtype, bits) in [
        ("minicpm-2b-tiny", "bfloat16", Value::Null),
        ("minicpm-2b-tiny-q4", "bfloat16", json!(4)),
    ] {
        let spec = archgen_families::load(repo_root().join(format!("specs/{name}.yaml"))).unwrap();
        jobs.push(json!({
            "config": config_for(&spec),
            "out": root.path().join(name),
            "seed": 11,
            "dtype": dtype,
            "bits": bits,
            "group_size": if bits.is_null() { Value::Null } else { json!(32) },
            "kv_quant": Value::Null,
            "prompt_ids": ids,
            "decode_steps": steps,
        }));
    }
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    // The same checkpoints with every lm_head tensor left out.
    let headless = |name: &str| -> PathBuf {
        let (src, dst) = (
            root.path().join(name).join("model"),
            root.path().join(format!("{name}-headless")),
        );
        archgen_tests::rewrite_checkpoint(&src, &dst, |tensors| {
            let before = tensors.len();
            tensors.retain(|k, _| !k.starts_with("lm_head."));
            assert!(tensors.len() < before, "{name}: no lm_head to leave out");
        });
        dst
    };
    let dir = headless("minicpm-2b-tiny");
    let oracle_path = root.path().join("oracle-headless.safetensors");
    let oracle = mlx_lm_logits(&dir, &ids, steps, &oracle_path);
    let with_head =
        Array::load_safetensors(root.path().join("minicpm-2b-tiny/oracle.safetensors")).unwrap();
    assert!(
        !same(&oracle["prefill_logits"], &with_head["prefill_logits"]),
        "the random lm_head and the embedding gave the same logits"
    );
    assert_both_paths_give(&dir, "minicpm-2b-tiny", &ids, steps, &oracle);
    let quantized = headless("minicpm-2b-tiny-q4");
    let err = archgen_checkpoint::read_dir(&quantized)
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("embed_tokens is quantized"),
        "{err}"
    );
}

/// Qwen3.5's sanitize on a raw Hugging Face checkpoint
/// (`SanitizeRule::{DropVisual, UnwrapMultimodal, DropMtp, MoveConvAxis,
/// OffsetNormsOfRawCheckpoint}`): the `qwen3.5-4b-tiny` checkpoint rewritten
/// with `model.language_model.*` names, conv1d weights as [C, 1, K], the
/// five offset norms stored as `w - 1`, an MTP head and a vision tensor
/// (`variants.py family-hf-layout`) gives, in the monolith and in the
/// generated model, the very logits mlx-lm gives when it loads that same
/// directory (adding 1 back to the norms in bf16), and the same as on the
/// mlx layout.
/// The MoE form (`qwen3.6-35b-a3b-tiny`, float32) also stores its experts
/// fused, `mlp.experts.gate_up_proj` and `mlp.experts.down_proj`
/// (`SanitizeRule::SplitSwitchMlpGateUp`).
/// Qwen3-Next's raw layout (`qwen3-next-80b-a3b-tiny`, float32): `model.*`
/// names, per-expert weights (`SanitizeRule::StackExperts`; their presence is
/// what makes qwen3_next's sanitize act), conv1d weights as [C, 1, K], the
/// five norms stored as `w - 1` and an MTP head.
#[test]
fn qwen3_next_raw_hf_checkpoint_loads_as_mlx_lm_sanitizes_it() {
    raw_hf_checkpoint_case("qwen3-next-80b-a3b-tiny", "float32");
}

#[test]
fn qwen3_5_raw_hf_checkpoint_loads_as_mlx_lm_sanitizes_it() {
    for (name, dtype) in [
        ("qwen3.5-4b-tiny", "bfloat16"),
        ("qwen3.6-35b-a3b-tiny", "float32"),
    ] {
        raw_hf_checkpoint_case(name, dtype);
    }
}

fn raw_hf_checkpoint_case(name: &str, dtype: &str) {
    let spec = archgen_families::load(repo_root().join(format!("specs/{name}.yaml"))).unwrap();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("mlx");
    let ids: Vec<i32> = (0..19).map(|i| (i * 37 + 11) % 512).collect();
    let steps = 4;
    let jobs = json!([{
        "config": config_for(&spec),
        "out": dir,
        "seed": 5,
        "dtype": dtype,
        "bits": Value::Null,
        "group_size": Value::Null,
        "kv_quant": Value::Null,
        "prompt_ids": ids,
        "decode_steps": steps,
    }]);
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    let hf = root.path().join("hf");
    run_python(
        "variants.py",
        &[
            "family-hf-layout".as_ref(),
            dir.join("model").as_os_str(),
            hf.as_os_str(),
        ],
    );
    let names = Array::load_safetensors(hf.join("model.safetensors")).unwrap();
    // qwen3_next has no multimodal wrapper, and its HF experts are per expert.
    let (prefix, experts) = match spec.family() {
        archgen_ir::Family::Qwen3Next => ("model.", "mlp.experts.0.up_proj.weight"),
        _ => ("model.language_model.", "mlp.experts.gate_up_proj"),
    };
    let conv = &names[&format!("{prefix}layers.0.linear_attn.conv1d.weight")];
    assert_eq!(conv.shape()[1], 1, "the HF conv layout is [C, 1, K]");
    assert!(names.contains_key("mtp.fc.weight"));
    if spec.lower().layers[0].moe().is_some() {
        assert!(names.contains_key(&format!("{prefix}layers.0.{experts}")));
        assert!(!names.keys().any(|k| k.contains("switch_mlp")));
    }
    let oracle_path = root.path().join("hf-oracle.safetensors");
    let ids_arg = ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
    run_python(
        "oracle_logits.py",
        &[
            "--model".as_ref(),
            hf.as_os_str(),
            "--prompt-ids".as_ref(),
            ids_arg.as_ref(),
            "--decode-steps".as_ref(),
            steps.to_string().as_ref(),
            "--out".as_ref(),
            oracle_path.as_os_str(),
        ],
    );
    let oracle = Array::load_safetensors(&oracle_path).unwrap();
    let mlx_oracle = Array::load_safetensors(dir.join("oracle.safetensors")).unwrap();
    // The norm weights (uniform in [0.5, 1.5]) survive `w - 1` and `+ 1` in
    // bf16 exactly (Sterbenz), so the raw layout is the same model: mlx-lm
    // gives the same bytes on both layouts, and a loader that skipped the
    // `+ 1` or the conv move would not.
    for key in ["prefill_logits", "decode_logits", "tokens"] {
        assert!(
            same(&oracle[key], &mlx_oracle[key]),
            "{name}: {key}: mlx-lm differs between the two layouts"
        );
    }
    let monolith = run_logits(&archgen_monolith::load_dir(&hf).unwrap(), &ids, steps).unwrap();
    let (ir, weights) = archgen_checkpoint::read_dir(&hf).unwrap();
    let fingerprint = archgen_plan::fingerprint(&ir);
    assert_eq!(
        archgen_generated::find(&fingerprint).map(|m| m.name),
        Some(name)
    );
    let generated = archgen_generated::run(&fingerprint, weights, Protocol { ids: &ids, steps })
        .unwrap()
        .unwrap();
    for (key, m, g) in [
        (
            "prefill_logits",
            &monolith.prefill_logits,
            &generated.prefill_logits,
        ),
        (
            "decode_logits",
            &monolith.decode_logits,
            &generated.decode_logits,
        ),
        ("tokens", &monolith.tokens, &generated.tokens),
    ] {
        assert!(
            same(m, &oracle[key]),
            "{name}: {key}: monolith on the HF layout != mlx-lm"
        );
        assert!(
            same(g, m),
            "{name}: {key}: generated != monolith on the HF layout"
        );
    }
    eprintln!("{name} ({dtype}): the raw Hugging Face layout gives mlx-lm's bytes");
}
