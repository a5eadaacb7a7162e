//! Continuous batching, byte for byte: a fixed schedule of arrivals run by
//! mlx-lm 0.32.2's own `BatchGenerator` (tests/python/batch_oracle.py) and
//! by archgen's `BatchSession` over the monolith and over the generated
//! model of the same spec must give every sequence the same logprobs rows,
//! greedy tokens and the steps that returned them (docs/parity.md,
//! "Batches"). The oracle runs once per spec; both implementations are
//! compared with its output and with each other.
//!
//! The schedule exercises every cache move mlx-lm makes: two prompts of
//! different lengths prefilled together (right padding, `finalize`), a
//! prompt longer than the prefill step (chunks), a one-token prompt, joins
//! while others generate (`extend` with left padding), joins during another
//! prompt's chunks, leaves at the token budget (`filter`, dropping shared
//! padding) and cancellations (`remove`) in prefill and in generation.

use archgen_runtime::batch::BatchLm;
use archgen_runtime::batch::{BatchCache, BatchLayerCache};
use archgen_runtime::batch_session::{
    run_schedule, BatchConfig, BatchSession, ChunkAfterStart, FirstSteps, PromptLanes, Schedule,
    SeqRun, StepPhases,
};
use archgen_runtime::bytes::array_bytes;
use archgen_runtime::mlx_rs::Dtype;
use archgen_runtime::model::{CausalLm, ModelTask};
use archgen_runtime::Array;
use archgen_tests::{config_for, repo_root, run_python};
use serde_json::{json, Value};

/// Families whose batches mlx-lm 0.32.2's `BatchGenerator` cannot run as
/// written: Gemma-2's grouped-query attention raises a broadcast error over
/// the batch's mask (archgen's own batches of it are checked in
/// [`gemma2_grouped_query_batches_mask_each_row`]).
const MLX_LM_CANNOT_BATCH: [archgen_ir::Family; 1] = [archgen_ir::Family::Gemma2];

/// The specs whose batches are checked against mlx-lm's `BatchGenerator`:
/// every tiny spec in specs/ that is unquantized, with a plain KV cache (the
/// quantized and mixed KV specs have their own checks below), of a family
/// `BatchGenerator` runs. Read from specs/, sorted by name, so a new spec or
/// family is checked without editing a list here; each cache kind the
/// families have comes with them (`BatchKVCache`, `BatchRotatingKVCache` for
/// sliding layers, the batched `ArraysCache` of Gated DeltaNet and short
/// convolutions, the latent attention's cache).
fn batched_specs() -> Vec<(String, archgen_families::Spec)> {
    let mut specs: Vec<(String, archgen_families::Spec)> =
        std::fs::read_dir(repo_root().join("specs"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .map(|p| archgen_families::load(&p).unwrap_or_else(|d| panic!("{d}")))
            .filter(|spec| {
                let ir = spec.lower();
                spec.name().ends_with("-tiny")
                    && ir.quantization.is_none()
                    && archgen_tests::quantized_kv_layers(&ir).is_empty()
                    && spec.mixed_kv().is_none()
                    && !MLX_LM_CANNOT_BATCH.contains(&spec.family())
            })
            .map(|spec| (spec.name().to_string(), spec))
            .collect();
    specs.sort_by(|a, b| a.0.cmp(&b.0));
    specs
}

fn schedule(vocab: i32) -> Value {
    let ids = |n: i32, seed: i32| -> Vec<i32> { (0..n).map(|i| (i * 37 + seed) % vocab).collect() };
    json!({
        "prefill_step_size": 4,
        "sequences": [
            {"prompt": ids(7, 11), "arrival": 0, "decode": 5},
            {"prompt": ids(3, 5), "arrival": 0, "decode": 3},
            {"prompt": ids(1, 2), "arrival": 2, "decode": 4},
            {"prompt": ids(10, 29), "arrival": 3, "decode": 3},
            {"prompt": ids(5, 41), "arrival": 4, "decode": 2},
            {"prompt": ids(2, 17), "arrival": 9, "decode": 3},
            // Cancelled in prefill, and while generating.
            {"prompt": ids(9, 3), "arrival": 1, "decode": 6, "leave": 4},
            {"prompt": ids(2, 7), "arrival": 5, "decode": 6, "leave": 8},
        ]
    })
}

/// Whether a model's batched one-token steps take the compiled decode
/// blocks (where `decode::enabled`): when every layer is a plain attention
/// layer, separate q/k/v projections and no output gate, its norm before
/// the mixer (GLM-4.5 MoE's and gpt-oss's experts then run eagerly after
/// the compiled attention), or when the model has Gated DeltaNet layers
/// (hybrid models: each Gated DeltaNet step with no row padded, and each
/// gated attention step, is the layer's single-sequence block, B rows at
/// once), or when short convolutions sit beside plain attention layers
/// (LFM2: the attention layers take the blocks in [B, 1, hidden]).
/// Short-convolution and latent attention layers, a fused `qkv_proj` and
/// post-norm layers run their one-token steps eagerly, as their
/// single-sequence steps do.
fn takes_compiled_batch_steps(ir: &archgen_ir::ModelIr) -> bool {
    use archgen_ir::{Layer, Mixer, NormArrangement, OutputGate, QkvProjection};
    // A plain attention layer with its norm before the mixer.
    let plain_attention = |l: &Layer| {
        let norm_first = match l.norms.arrangement {
            NormArrangement::PreNorm | NormArrangement::Sandwich => true,
            NormArrangement::PostNorm => false,
        };
        let plain = match &l.mixer {
            Mixer::Attention(a) => {
                a.output_gate == OutputGate::None && a.projection == QkvProjection::Separate
            }
            Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) | Mixer::LatentAttention(_) => false,
        };
        norm_first && plain
    };
    let delta_net = ir.layers.iter().any(|l| match &l.mixer {
        Mixer::GatedDeltaNet(_) => true,
        Mixer::Attention(_) | Mixer::ShortConv(_) | Mixer::LatentAttention(_) => false,
    });
    // LFM2: its plain attention layers beside the short convs.
    let short_conv = ir.layers.iter().any(|l| match &l.mixer {
        Mixer::ShortConv(_) => true,
        Mixer::Attention(_) | Mixer::GatedDeltaNet(_) | Mixer::LatentAttention(_) => false,
    });
    let short_conv_with_plain_attention = short_conv && ir.layers.iter().any(plain_attention);
    ir.layers.iter().all(plain_attention) || delta_net || short_conv_with_plain_attention
}

/// The spec with a quantized KV cache (layer 5 of a Gemma-4 with sliding
/// and KV-shared layers) whose batches are checked: mlx-lm cannot batch it
/// (`QuantizedKVCache` has no merge()), so a real batch is checked
/// generated against monolith, and a batch of one row against mlx-lm's
/// single-sequence generation.
const KV_QUANT: &str = "gemma4-e4b-tiny-kv";

/// The specs with mlx-optiq's mixed KV (plain, then quantized: tier L2)
/// whose batches are checked generated against monolith, and (the first)
/// a batch of one row against optiq's single-sequence generation.
const MIXED_KV: [&str; 2] = ["qwen3-0.6b-tiny-mixed-kv", "gemma4-12b-tiny-mixed-kv"];

/// The spec-cases job of a checkpoint of `spec` with its quantized KV
/// layers (kv_config.json) or its mixed KV (kv_config.json and
/// kv_scheme.json), bf16 (float32 with unquantized experts).
fn kv_quant_job(spec: &archgen_families::Spec, out: &std::path::Path, seed: u64) -> Value {
    let ir = spec.lower();
    let kv = archgen_tests::quantized_kv_layers(&ir);
    let mixed_kv = spec.mixed_kv().map(|m| {
        let layers: serde_json::Map<String, Value> = m
            .kv_config()
            .iter()
            .map(|e| (e.layer_idx.to_string(), json!([e.bits, e.group_size])))
            .collect();
        json!({"layers": layers, "quantized_kv_start": m.quantized_kv_start})
    });
    // spec_cases.py checks that optiq converted every listed layer: the
    // prompt reaches the start.
    let start = spec.mixed_kv().map_or(0, |m| m.quantized_kv_start);
    let prompt: Vec<u32> = (1..=start.max(3)).collect();
    json!({
        "config": config_for(spec),
        "out": out,
        "seed": seed,
        "dtype": if archgen_tests::has_experts(&ir) { "float32" } else { "bfloat16" },
        "bits": null,
        "group_size": null,
        "kv_quant": if kv.is_empty() { Value::Null } else { Value::Object(kv) },
        "mixed_kv": mixed_kv,
        "prompt_ids": prompt,
        "decode_steps": 1,
    })
}

/// The first layer of `spec` with a quantized KV cache.
fn first_quantized_layer(spec: &archgen_families::Spec) -> usize {
    archgen_tests::quantized_kv_layers(&spec.lower())
        .keys()
        .filter_map(|k| k.parse().ok())
        .min()
        .expect("a quantized KV layer")
}

/// Each sequence's logprobs rows, tokens and steps of two runs of one
/// schedule, generated against monolith: a failure line per difference.
fn compare_runs(
    name: &str,
    schedule: &Schedule,
    runs: &[SeqRun],
    generated: &[SeqRun],
    failures: &mut Vec<String>,
) {
    assert_eq!(runs.len(), schedule.sequences.len(), "{name}");
    assert_eq!(generated.len(), schedule.sequences.len(), "{name}");
    for (i, (run, gen)) in runs.iter().zip(generated).enumerate() {
        if schedule.sequences[i].leave.is_none() {
            assert_eq!(
                run.tokens.len(),
                schedule.sequences[i].decode,
                "{name}: seq{i}"
            );
        }
        let vec = |v: &[i32]| Array::from_slice(v, &[v.len() as i32]);
        for (key, ours, theirs) in [
            ("logprobs", run.logprobs.clone(), gen.logprobs.clone()),
            ("tokens", vec(&run.tokens), vec(&gen.tokens)),
            ("steps", vec(&run.steps), vec(&gen.steps)),
        ] {
            if !same(&ours, &theirs) {
                failures.push(format!("{name}: seq{i}.{key}: generated != monolith"));
            }
        }
    }
}

/// mlx-lm's `BatchGenerator` on the checkpoint in `dir` running the
/// schedule `json` (tests/python/batch_oracle.py; its files `label.*` in
/// `root`): each sequence's `seqI.logprobs`, `.tokens` and `.steps`.
fn batch_generator(
    dir: &std::path::Path,
    json: &Value,
    root: &std::path::Path,
    label: &str,
) -> std::collections::HashMap<String, Array> {
    let schedule_path = root.join(format!("{label}.schedule.json"));
    std::fs::write(&schedule_path, serde_json::to_vec(json).unwrap()).unwrap();
    let oracle_path = root.join(format!("{label}.oracle.safetensors"));
    run_python(
        "batch_oracle.py",
        &[
            dir.as_os_str(),
            schedule_path.as_os_str(),
            oracle_path.as_os_str(),
        ],
    );
    Array::load_safetensors(&oracle_path).unwrap()
}

/// Each sequence's logprobs rows, tokens and steps of a run (`who`: the
/// monolith or the generated model) against [`batch_generator`]'s: a
/// failure line per difference.
fn compare_with_batch_generator(
    name: &str,
    who: &str,
    runs: &[SeqRun],
    oracle: &std::collections::HashMap<String, Array>,
    failures: &mut Vec<String>,
) {
    for (i, run) in runs.iter().enumerate() {
        let vec = |v: &[i32]| Array::from_slice(v, &[v.len() as i32]);
        for (key, ours) in [
            ("logprobs", run.logprobs.clone()),
            ("tokens", vec(&run.tokens)),
            ("steps", vec(&run.steps)),
        ] {
            if !same(&ours, &oracle[&format!("seq{i}.{key}")]) {
                failures.push(format!("{name}: seq{i}.{key}: {who} != mlx-lm"));
            }
        }
    }
}

/// The schedule run on a generated model (whose type the registry picks),
/// through its `CausalLm::batched`.
struct RunBatched<'a>(&'a Schedule);

impl ModelTask for RunBatched<'_> {
    type Output = Result<Vec<SeqRun>, String>;

    fn run<M: CausalLm>(self, m: &M) -> Self::Output {
        let batched = m
            .batched()
            .ok_or("a generated model without a batched forward")?;
        run_schedule(batched, self.0).map_err(|e| e.to_string())
    }
}

/// The generated model of the checkpoint in `dir` (checking that dispatch
/// finds the spec `name`), running `schedule` batched; checks that its
/// one-token steps took the compiled decode blocks exactly when
/// [`takes_compiled_batch_steps`] says so (and the decode blocks are on).
fn run_generated(
    dir: &std::path::Path,
    name: &str,
    schedule: &Schedule,
) -> Result<Vec<SeqRun>, String> {
    let spec = archgen_families::load(repo_root().join("specs").join(format!("{name}.yaml")))
        .unwrap_or_else(|d| panic!("{d}"));
    let calls = archgen_runtime::decode::compiled_block_calls();
    let runs = run_generated_once(dir, name, schedule)?;
    let compiled = archgen_runtime::decode::compiled_block_calls() > calls;
    assert_eq!(
        compiled,
        takes_compiled_batch_steps(&spec.lower()) && archgen_runtime::decode::enabled(),
        "{name}: whether the batched steps took the compiled decode blocks"
    );
    Ok(runs)
}

fn run_generated_once(
    dir: &std::path::Path,
    name: &str,
    schedule: &Schedule,
) -> Result<Vec<SeqRun>, String> {
    let (ir, weights) = archgen_checkpoint::read_dir(dir).unwrap();
    let fingerprint = archgen_plan::fingerprint(&ir);
    assert_eq!(
        archgen_generated::find(&fingerprint).map(|m| m.name),
        Some(name),
        "{name}: dispatch"
    );
    archgen_generated::run(&fingerprint, weights, RunBatched(schedule))
        .expect("a generated model")
        .unwrap()
}

fn same(a: &Array, b: &Array) -> bool {
    a.dtype() == b.dtype()
        && a.shape() == b.shape()
        && array_bytes(a).unwrap() == array_bytes(b).unwrap()
}

#[test]
fn generated_and_monolith_batches_match_mlx_lm_batch_generator() {
    let root = tempfile::tempdir().unwrap();
    let mut jobs = Vec::new();
    let batched = batched_specs();
    assert!(
        batched.len() >= 20,
        "expected every unquantized tiny spec, found {}",
        batched.len()
    );
    for (k, (name, spec)) in batched.iter().enumerate() {
        // Unquantized experts run only in float32 on MLX's CPU backend.
        let dtype = if archgen_tests::has_experts(&spec.lower()) {
            "float32"
        } else {
            "bfloat16"
        };
        jobs.push(json!({
            "config": config_for(spec),
            "out": root.path().join(name),
            "seed": 4200 + k,
            "dtype": dtype,
            "bits": null,
            "group_size": null,
            "kv_quant": null,
            "mixed_kv": null,
            "prompt_ids": [1, 2, 3],
            "decode_steps": 1,
        }));
    }
    // A quantized KV cache (gemma4-e4b-tiny-kv): mlx-lm cannot batch it
    // (no oracle), so generated and monolith are compared with each other.
    let kv_spec =
        archgen_families::load(repo_root().join("specs").join(format!("{KV_QUANT}.yaml")))
            .unwrap_or_else(|d| panic!("{d}"));
    jobs.push(kv_quant_job(&kv_spec, &root.path().join("kv-quant"), 4299));
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);

    let mut failures = Vec::new();
    for (name, _) in &batched {
        let name = name.as_str();
        let model_dir = root.path().join(name).join("model");
        let model = archgen_monolith::load_dir(&model_dir).unwrap();
        let json = schedule(BatchLm::vocab_size(&model));
        let oracle = batch_generator(&model_dir, &json, root.path(), name);
        let schedule = Schedule::from_json(&json, BatchLm::vocab_size(&model)).unwrap();
        let runs = run_schedule(&model, &schedule).unwrap();
        let generated = run_generated(&model_dir, name, &schedule).unwrap();
        let before = failures.len();
        compare_with_batch_generator(name, "monolith", &runs, &oracle, &mut failures);
        compare_with_batch_generator(name, "generated", &generated, &oracle, &mut failures);
        compare_runs(name, &schedule, &runs, &generated, &mut failures);
        if failures.len() == before {
            eprintln!(
                "{name}: generated == monolith == mlx-lm BatchGenerator ({} sequences)",
                runs.len()
            );
        }
    }
    // A quantized KV cache: the same schedule, generated == monolith byte
    // for byte, with the quantized layers batched as such.
    let kv_dir = root.path().join("kv-quant").join("model");
    let kv_model = archgen_monolith::load_dir(&kv_dir).unwrap();
    let first_kv_layer = first_quantized_layer(&kv_spec);
    let fresh = kv_model.make_batch_cache(2).unwrap();
    assert!(
        matches!(
            fresh.layers[first_kv_layer],
            Some(BatchLayerCache::Quantized(_))
        ),
        "layer {first_kv_layer}: not a batched quantized cache"
    );
    let vocab = BatchLm::vocab_size(&kv_model);
    let kv_schedule = Schedule::from_json(&schedule(vocab), vocab).unwrap();
    let runs = run_schedule(&kv_model, &kv_schedule).unwrap();
    let generated = run_generated(&kv_dir, KV_QUANT, &kv_schedule).unwrap();
    let before = failures.len();
    compare_runs(KV_QUANT, &kv_schedule, &runs, &generated, &mut failures);
    if failures.len() == before {
        eprintln!(
            "{KV_QUANT}: generated == monolith ({} sequences, quantized KV batched; \
             no mlx-lm batch oracle)",
            runs.len()
        );
    }
    // mlx-optiq's mixed KV (one spec-cases run: optiq patches mlx-lm
    // process-wide): the same schedule, generated == monolith.
    let mixed_jobs: Vec<Value> = MIXED_KV
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let spec =
                archgen_families::load(repo_root().join("specs").join(format!("{name}.yaml")))
                    .unwrap_or_else(|d| panic!("{d}"));
            kv_quant_job(&spec, &root.path().join(name), 4300 + k as u64)
        })
        .collect();
    let mixed_path = root.path().join("mixed-jobs.json");
    std::fs::write(&mixed_path, serde_json::to_vec(&mixed_jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[mixed_path.as_os_str()]);
    for name in MIXED_KV {
        let dir = root.path().join(name).join("model");
        let model = archgen_monolith::load_dir(&dir).unwrap();
        let fresh = model.make_batch_cache(2).unwrap();
        assert!(
            fresh
                .layers
                .iter()
                .any(|l| matches!(l, Some(BatchLayerCache::QuantizedAfterForward(_)))),
            "{name}: no batched mixed KV cache"
        );
        let vocab = BatchLm::vocab_size(&model);
        // One more sequence, long enough that the batch's write index
        // passes gemma4-12b-tiny-mixed-kv's start (24) and it converts.
        let mut json = schedule(vocab);
        let long: Vec<i32> = (0..20).map(|i| (i * 13 + 1) % vocab).collect();
        json["sequences"]
            .as_array_mut()
            .unwrap()
            .push(json!({"prompt": long, "arrival": 1, "decode": 8}));
        let mixed_schedule = Schedule::from_json(&json, vocab).unwrap();
        let runs = run_schedule(&model, &mixed_schedule).unwrap();
        let generated = run_generated(&dir, name, &mixed_schedule).unwrap();
        let before = failures.len();
        compare_runs(name, &mixed_schedule, &runs, &generated, &mut failures);
        if failures.len() == before {
            eprintln!(
                "{name}: generated == monolith ({} sequences, mixed KV batched; \
                 no mlx-lm or optiq batch oracle)",
                runs.len()
            );
        }
    }
    assert!(
        failures.is_empty(),
        "batch parity failures:\n{}",
        failures.join("\n")
    );
}

/// gemma3_text's float16 `clip_residual` in batches: a float16
/// `gemma-3-1b-tiny` whose first layer's `post_attention_layernorm` weight
/// (30000) overflows float16 in that branch, run on the batch schedule by
/// mlx-lm's `BatchGenerator`, the monolith and the generated model (whose
/// one-token steps take the compiled decode blocks): every logprobs row and
/// token equal, and mlx-lm's finite.
#[test]
fn gemma3_text_float16_batches_clip_as_batch_generator_clips_them() {
    let root = tempfile::tempdir().unwrap();
    let name = "gemma-3-1b-tiny";
    let spec = archgen_families::load(repo_root().join("specs").join(format!("{name}.yaml")))
        .unwrap_or_else(|d| panic!("{d}"));
    let jobs = json!([{
        "config": config_for(&spec),
        "out": root.path().join(name),
        "seed": 4400,
        "dtype": "float16",
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
    let dir = root.path().join("overflowing");
    let norm = "model.layers.0.post_attention_layernorm.weight";
    let src = root.path().join(name).join("model");
    archgen_tests::with_tensor_filled(&src, &dir, norm, 30000.0);
    let model = archgen_monolith::load_dir(&dir).unwrap();
    let json = schedule(BatchLm::vocab_size(&model));
    let oracle = batch_generator(&dir, &json, root.path(), name);
    let schedule = Schedule::from_json(&json, BatchLm::vocab_size(&model)).unwrap();
    let runs = run_schedule(&model, &schedule).unwrap();
    let generated = run_generated(&dir, name, &schedule).unwrap();
    for i in 0..runs.len() {
        let theirs = &oracle[&format!("seq{i}.logprobs")];
        assert_eq!(theirs.dtype(), Dtype::Float16, "seq{i}: a float16 run");
        // A sequence that leaves before its first token has no rows.
        archgen_tests::assert_finite(theirs, &format!("seq{i}: mlx-lm's logprobs"));
    }
    let mut failures = Vec::new();
    compare_with_batch_generator(name, "monolith", &runs, &oracle, &mut failures);
    compare_with_batch_generator(name, "generated", &generated, &oracle, &mut failures);
    compare_runs(name, &schedule, &runs, &generated, &mut failures);
    assert!(
        failures.is_empty(),
        "batch parity failures:\n{}",
        failures.join("\n")
    );
}

/// One sequence through `BatchSession` alone (a batch of one row, no
/// padding) and through mlx-lm's `generate_step` with `oracle` (the job of
/// tests/python/single_seq_oracle.py): the failures, none when every
/// logprobs row and greedy token is equal byte for byte. `generated` names
/// the generated model to run too (`None`: the monolith only); `label`
/// names the case in messages.
fn one_row_against_generate_step(
    label: &str,
    model_dir: &std::path::Path,
    generated: Option<&str>,
    oracle: Value,
) -> Vec<String> {
    let model = archgen_monolith::load_dir(model_dir).unwrap();
    let vocab = BatchLm::vocab_size(&model);
    let prompt: Vec<i32> = (0..10).map(|i| (i * 37 + 29) % vocab).collect();
    let decode = 12;
    let mut job = oracle;
    job["prompt"] = json!(prompt);
    job["decode"] = json!(decode);
    job["prefill_step_size"] = json!(4);
    let dir = model_dir.parent().unwrap();
    let job_path = dir.join("single.json");
    std::fs::write(&job_path, serde_json::to_vec(&job).unwrap()).unwrap();
    let oracle_path = dir.join("single.safetensors");
    run_python(
        "single_seq_oracle.py",
        &[
            model_dir.as_os_str(),
            job_path.as_os_str(),
            oracle_path.as_os_str(),
        ],
    );
    let oracle = Array::load_safetensors(&oracle_path).unwrap();
    let json = json!({
        "prefill_step_size": 4,
        "sequences": [{"prompt": prompt, "arrival": 0, "decode": decode}],
    });
    let schedule = Schedule::from_json(&json, vocab).unwrap();
    let mut runs = vec![("monolith", run_schedule(&model, &schedule).unwrap())];
    if let Some(name) = generated {
        runs.push((
            "generated",
            run_generated(model_dir, name, &schedule).unwrap(),
        ));
    }
    let mut failures = Vec::new();
    for (which, run) in &runs {
        let run = &run[0];
        let tokens = Array::from_slice(&run.tokens, &[run.tokens.len() as i32]);
        for (key, ours) in [("logprobs", &run.logprobs), ("tokens", &tokens)] {
            if !same(ours, &oracle[key]) {
                failures.push(format!(
                    "{label}: {key}: {which} (a batch of one) != mlx-lm generate_step"
                ));
            }
        }
    }
    if failures.is_empty() {
        eprintln!("{label}: a batch of one row == mlx-lm generate_step ({decode} tokens)");
    }
    failures
}

/// A batch of ONE row with no padding is the single-sequence computation:
/// with a quantized KV cache (which mlx-lm cannot batch) its rows hold what
/// `QuantizedKVCache` holds and its mask array selects what the single
/// sequence's causal mask selects. So `BatchSession`, one sequence alone,
/// must give mlx-lm's `generate_step` logprobs rows and greedy tokens byte
/// for byte: a 10-token prompt in chunks of 4 (the caches written by
/// chunks, then by single tokens), 12 decoded tokens (past Gemma-4's
/// sliding window of 8), over
/// * gemma4-e4b-tiny-kv (a `QuantizedKVCache` from the start on layer 5),
///   monolith and generated;
/// * qwen3-0.6b-tiny-mixed-kv against mlx-optiq's `install_mixed_kv` hook
///   in `generate_step` (tier L2), monolith and generated;
/// * every layer of a Qwen3 mixed KV (4 bits, group 32, from position 5)
///   against stock mlx-lm's `generate_step(kv_bits=4, kv_group_size=32,
///   quantized_kv_start=5)`: the conversion falls after the second prefill
///   chunk. Monolith only (no generated model has this spec).
#[test]
fn one_row_of_a_quantized_kv_batch_is_mlx_lm_single_sequence_generation() {
    let root = tempfile::tempdir().unwrap();
    let load = |name: &str| {
        archgen_families::load(repo_root().join("specs").join(format!("{name}.yaml")))
            .unwrap_or_else(|d| panic!("{d}"))
    };
    let write_jobs = |file: &str, jobs: &[Value]| {
        let path = root.path().join(file);
        std::fs::write(&path, serde_json::to_vec(jobs).unwrap()).unwrap();
        run_python("spec_cases.py", &[path.as_os_str()]);
    };
    let quantized = root.path().join(KV_QUANT);
    write_jobs(
        "jobs.json",
        &[kv_quant_job(&load(KV_QUANT), &quantized, 4600)],
    );

    // L2 jobs (optiq patches mlx-lm process-wide): the mixed spec, and the
    // same architecture with every layer mixed as mlx-lm's kv_bits does.
    let mixed_name = MIXED_KV[0];
    let mixed_spec = load(mixed_name);
    let mixed = root.path().join(mixed_name);
    let every_layer = root.path().join("kv-bits");
    let mut kv_bits_job = kv_quant_job(&mixed_spec, &every_layer, 4602);
    let layers: serde_json::Map<String, Value> = (0..mixed_spec.lower().layers.len())
        .map(|i| (i.to_string(), json!([4, 32])))
        .collect();
    kv_bits_job["mixed_kv"] = json!({"layers": layers, "quantized_kv_start": 5});
    // spec_cases.py checks that optiq converted every listed layer: its
    // prompt passes the start.
    kv_bits_job["prompt_ids"] = json!([1, 2, 3, 4, 5, 6]);
    write_jobs(
        "l2-jobs.json",
        &[kv_quant_job(&mixed_spec, &mixed, 4601), kv_bits_job],
    );

    let mut failures = one_row_against_generate_step(
        KV_QUANT,
        &quantized.join("model"),
        Some(KV_QUANT),
        json!({"kv_config": "quantized"}),
    );
    failures.extend(one_row_against_generate_step(
        mixed_name,
        &mixed.join("model"),
        Some(mixed_name),
        json!({"kv_config": "optiq"}),
    ));
    failures.extend(one_row_against_generate_step(
        "every layer mixed (4 bits, group 32, from 5) vs kv_bits",
        &every_layer.join("model"),
        None,
        json!({"kv_config": "ignored", "kv_bits": 4, "kv_group_size": 32,
               "quantized_kv_start": 5}),
    ));
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// The server's decode-only steps (`BatchSession::step_generation`, run
/// between prefill chunks while other sequences generate) compute what
/// mlx-lm's `BatchGenerator` computes when the prompt in prefill arrived
/// that many steps later: the prompt batch and the generation batch share no
/// cache, so only the number of generation forwards before the prompt joins
/// the generation batch matters.
///
/// A (3 tokens) generates alone while B (10 tokens, chunks of 4) arrives at
/// step 2 and is prefilled; after each of B's chunks that leaves more to
/// feed, two decode-only steps run. mlx-lm's oracle runs the same two
/// sequences with B arriving `2 + (decode-only steps)` steps in; both
/// sequences' logprobs rows and tokens must be equal byte for byte.
#[test]
fn decode_only_steps_between_chunks_match_a_later_arrival_in_batch_generator() {
    const SPECS: [&str; 2] = ["gemma4-e2b-tiny", "qwen3-0.6b-tiny"];
    const DECODE_ONLY_PER_CHUNK: usize = 2;
    let root = tempfile::tempdir().unwrap();
    let jobs: Vec<Value> = SPECS
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let spec =
                archgen_families::load(repo_root().join("specs").join(format!("{name}.yaml")))
                    .unwrap_or_else(|d| panic!("{d}"));
            json!({
                "config": config_for(&spec),
                "out": root.path().join(name),
                "seed": 4400 + k,
                "dtype": "bfloat16",
                "bits": null,
                "group_size": null,
                "kv_quant": null,
                "mixed_kv": null,
                "prompt_ids": [1, 2, 3],
                "decode_steps": 1,
            })
        })
        .collect();
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);

    let mut failures = Vec::new();
    for name in SPECS {
        let model_dir = root.path().join(name).join("model");
        let model = archgen_monolith::load_dir(&model_dir).unwrap();
        let vocab = BatchLm::vocab_size(&model);
        let ids =
            |n: i32, seed: i32| -> Vec<i32> { (0..n).map(|i| (i * 37 + seed) % vocab).collect() };
        let (prompt_a, prompt_b) = (ids(3, 11), ids(10, 29));
        let (decode_a, decode_b) = (20, 4);
        let config = BatchConfig {
            prefill_step_size: 4,
            ..BatchConfig::default()
        };

        // The server's interleave.
        let mut session = BatchSession::new(&model, config);
        let a = session.join(&prompt_a, decode_a).unwrap();
        let mut b = None;
        let mut rows: [Vec<Array>; 2] = [Vec::new(), Vec::new()];
        let mut tokens: [Vec<i32>; 2] = [Vec::new(), Vec::new()];
        let mut decode_only = 0;
        let mut step = 0;
        while step < 100 && (b.is_none() || !session.is_idle()) {
            if step == 2 {
                b = Some(session.join(&prompt_b, decode_b).unwrap());
            }
            let mut outputs = session.step().unwrap();
            if session.prefilling() && session.can_decode() {
                for _ in 0..DECODE_ONLY_PER_CHUNK {
                    outputs.extend(session.step_generation().unwrap());
                    decode_only += 1;
                }
            }
            for out in outputs {
                let i = if out.seq == a { 0 } else { 1 };
                rows[i].push(out.logprobs);
                tokens[i].push(out.token);
            }
            step += 1;
        }
        assert!(session.is_idle(), "{name}: the session did not finish");
        // B's prompt feeds 4 + 4 + 1 tokens: two chunks leave more to feed.
        assert_eq!(decode_only, 2 * DECODE_ONLY_PER_CHUNK, "{name}");
        assert_eq!(tokens[0].len(), decode_a, "{name}: A");
        assert_eq!(tokens[1].len(), decode_b, "{name}: B");

        // The same sequences in BatchGenerator, B arriving later.
        let json = json!({
            "prefill_step_size": 4,
            "sequences": [
                {"prompt": prompt_a, "arrival": 0, "decode": decode_a},
                {"prompt": prompt_b, "arrival": 2 + decode_only, "decode": decode_b},
            ]
        });
        let schedule_path = root.path().join(format!("{name}.later.json"));
        std::fs::write(&schedule_path, serde_json::to_vec(&json).unwrap()).unwrap();
        let oracle_path = root.path().join(format!("{name}.later.safetensors"));
        run_python(
            "batch_oracle.py",
            &[
                model_dir.as_os_str(),
                schedule_path.as_os_str(),
                oracle_path.as_os_str(),
            ],
        );
        let oracle = Array::load_safetensors(&oracle_path).unwrap();
        let before = failures.len();
        for i in 0..2 {
            let n = tokens[i].len() as i32;
            let ours_rows = archgen_runtime::mlx_rs::ops::stack(&rows[i], 0).unwrap();
            let ours_tokens = Array::from_slice(&tokens[i], &[n]);
            for (key, ours) in [("logprobs", &ours_rows), ("tokens", &ours_tokens)] {
                if !same(ours, &oracle[&format!("seq{i}.{key}")]) {
                    failures.push(format!(
                        "{name}: seq{i}.{key}: decode-only interleave != mlx-lm"
                    ));
                }
            }
        }
        if failures.len() == before {
            eprintln!("{name}: decode-only steps == mlx-lm BatchGenerator with B {decode_only} steps later");
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// A model that records the shape of every batched forward it runs.
struct Recording<'a> {
    model: &'a dyn BatchLm,
    shapes: std::cell::RefCell<Vec<[i32; 2]>>,
}

impl BatchLm for Recording<'_> {
    fn vocab_size(&self) -> i32 {
        self.model.vocab_size()
    }
    fn make_batch_cache(&self, n: usize) -> archgen_runtime::ops::Result<BatchCache> {
        self.model.make_batch_cache(n)
    }
    fn forward_batch(
        &self,
        ids: &Array,
        cache: &mut BatchCache,
    ) -> archgen_runtime::ops::Result<Array> {
        let s = ids.shape();
        self.shapes.borrow_mut().push([s[0], s[1]]);
        self.model.forward_batch(ids, cache)
    }
}

/// One sequence's logprobs rows and tokens, and the step each came in.
type Trace = (Vec<Vec<u8>>, Vec<i32>, Vec<usize>);

/// Runs `prompts` (each with its arrival step and token budget) through one
/// session with prefill chunks of 4 tokens and returns each sequence's
/// trace and the forwards' shapes.
fn run_lanes(
    model: &dyn BatchLm,
    lanes: PromptLanes,
    prompts: &[(Vec<i32>, usize, usize)],
) -> (Vec<Trace>, Vec<[i32; 2]>) {
    let config = BatchConfig {
        prefill_step_size: 4,
        prompt_lanes: lanes,
        ..BatchConfig::default()
    };
    run_session(model, config, prompts)
}

/// [`run_lanes`] with any session configuration.
fn run_session(
    model: &dyn BatchLm,
    config: BatchConfig,
    prompts: &[(Vec<i32>, usize, usize)],
) -> (Vec<Trace>, Vec<[i32; 2]>) {
    let (traces, shapes, _) = run_session_phases(model, config, prompts);
    (traces, shapes)
}

/// [`run_session`], with each step's [`StepPhases`] too.
fn run_session_phases(
    model: &dyn BatchLm,
    config: BatchConfig,
    prompts: &[(Vec<i32>, usize, usize)],
) -> (Vec<Trace>, Vec<[i32; 2]>, Vec<StepPhases>) {
    let recording = Recording {
        model,
        shapes: Default::default(),
    };
    let mut session = BatchSession::new(&recording, config);
    let mut ids = vec![None; prompts.len()];
    let mut traces: Vec<Trace> = vec![Default::default(); prompts.len()];
    let mut phases = Vec::new();
    for step in 0..200 {
        for (k, (prompt, arrival, budget)) in prompts.iter().enumerate() {
            if *arrival == step {
                ids[k] = Some(session.join(prompt, *budget).unwrap());
            }
        }
        for out in session.step().unwrap() {
            let k = ids.iter().position(|id| *id == Some(out.seq)).unwrap();
            traces[k].0.push(array_bytes(&out.logprobs).unwrap());
            traces[k].1.push(out.token);
            traces[k].2.push(step);
        }
        phases.push(session.last_phases());
        if ids.iter().all(Option::is_some) && session.is_idle() {
            break;
        }
    }
    assert!(session.is_idle(), "the session did not finish");
    (traces, recording.shapes.into_inner(), phases)
}

/// The server's `PromptLanes::ShortFirst`: a short prompt that arrives while
/// a long one is in prefill gets a prompt batch of its own, is fed before
/// the long one's next chunk, and finishes before the long one's first
/// token; no prefill forward holds both. Each sequence computes what it
/// computes alone (in a batch of one, as `BatchGenerator` with that prompt
/// alone), byte for byte. mlx-lm's one prompt batch (`PromptLanes::One`)
/// pads the short prompt into the long one's chunks instead.
/// A bf16 checkpoint of the tiny spec `name` with random weights from
/// `seed`, made by spec_cases.py in `root/name/model`; the spec and that
/// directory.
fn bf16_checkpoint(
    root: &std::path::Path,
    name: &str,
    seed: u64,
) -> (archgen_families::Spec, std::path::PathBuf) {
    let spec = archgen_families::load(repo_root().join("specs").join(format!("{name}.yaml")))
        .unwrap_or_else(|d| panic!("{d}"));
    let jobs = json!([{
        "config": config_for(&spec),
        "out": root.join(name),
        "seed": seed,
        "dtype": "bfloat16",
        "bits": null,
        "group_size": null,
        "kv_quant": null,
        "mixed_kv": null,
        "prompt_ids": [1, 2, 3],
        "decode_steps": 1,
    }]);
    let jobs_path = root.join(format!("{name}.jobs.json"));
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);
    (spec, root.join(name).join("model"))
}

#[test]
fn a_short_prompt_overtakes_a_long_one_in_prefill_and_computes_as_alone() {
    let root = tempfile::tempdir().unwrap();
    let name = "qwen3-0.6b-tiny";
    let (_, model_dir) = bf16_checkpoint(root.path(), name, 4500);
    let model = archgen_monolith::load_dir(&model_dir).unwrap();
    let vocab = BatchLm::vocab_size(&model);
    let ids = |n: i32, seed: i32| -> Vec<i32> { (0..n).map(|i| (i * 37 + seed) % vocab).collect() };
    // The long prompt: 41 tokens, 10 chunks of 4 then its last token. The
    // short one (6 tokens) arrives at step 2, with 8 tokens to return.
    let long = (ids(41, 5), 0, 3);
    let short = (ids(6, 13), 2, 8);

    let (both, shapes) = run_lanes(
        &model,
        PromptLanes::ShortFirst,
        &[long.clone(), short.clone()],
    );
    let (long_alone, _) = run_lanes(
        &model,
        PromptLanes::ShortFirst,
        &[(long.0.clone(), 0, long.2)],
    );
    let (short_alone, _) = run_lanes(
        &model,
        PromptLanes::ShortFirst,
        &[(short.0.clone(), 0, short.2)],
    );
    assert_eq!(both[0].0, long_alone[0].0, "the long prompt's logprobs");
    assert_eq!(both[0].1, long_alone[0].1, "the long prompt's tokens");
    assert_eq!(both[1].0, short_alone[0].0, "the short prompt's logprobs");
    assert_eq!(both[1].1, short_alone[0].1, "the short prompt's tokens");
    let short_done = *both[1].2.last().unwrap();
    let long_first = both[0].2[0];
    assert!(
        short_done < long_first,
        "the short prompt ended at step {short_done}, the long one's first token came at {long_first}"
    );
    // Prefill forwards (more than one token per row) each hold one prompt.
    let shared: Vec<&[i32; 2]> = shapes.iter().filter(|s| s[1] > 1 && s[0] > 1).collect();
    assert!(
        shared.is_empty(),
        "prefill forwards of two prompts: {shared:?}"
    );

    // mlx-lm's one prompt batch: the short prompt joins the long one's
    // chunks (a forward of 2 rows) and its first token waits for them.
    let (one, shapes) = run_lanes(&model, PromptLanes::One, &[long, short]);
    assert!(
        shapes.iter().any(|s| s[0] == 2 && s[1] == 4),
        "with one prompt batch the two prompts share a chunk: {shapes:?}"
    );
    assert_eq!(one[1].1.len(), 8);
}

/// The first-token-in-decode-step lever ([`FirstSteps::InGenerationBatch`]):
/// a sequence whose prompt is done runs its last prompt token in the
/// generation batch's next forward instead of a forward of its own. Against
/// `BatchGenerator`'s schedule on the same arrivals: every one-row-per-
/// sequence forward of newly finished prompts is gone (one forward fewer
/// each time prompts finish), every sequence returns its whole budget at
/// the same steps, with the same greedy tokens and logprobs within a few
/// bf16 roundings (its first token is computed beside other rows).
#[test]
fn a_finished_prompt_joins_the_next_decode_forward_with_the_lever() {
    let root = tempfile::tempdir().unwrap();
    // A plain KV cache, sliding-window caches beside full ones, and the
    // Gated DeltaNet's conv and recurrent states.
    for name in ["qwen3-0.6b-tiny", "gemma-3-1b-tiny", "qwen3.5-4b-tiny"] {
        let model = bf16_monolith(root.path(), name, 4501);
        let ids = |n: i32, seed: i32| prompt_ids(&model, n, seed);
        // Prompts that finish while others generate, two that finish together,
        // and one that finishes in the step its predecessor starts generating.
        let prompts = [
            (ids(9, 5), 0, 12),
            (ids(6, 13), 2, 8),
            (ids(7, 17), 2, 8),
            (ids(13, 29), 5, 6),
            (ids(5, 3), 9, 5),
        ];
        let config = |first_steps| BatchConfig {
            prefill_step_size: 4,
            first_steps,
            ..BatchConfig::default()
        };
        let (mlx_lm, mlx_lm_shapes) = run_session(&model, config(FirstSteps::OwnForward), &prompts);
        let (lever, lever_shapes) =
            run_session(&model, config(FirstSteps::InGenerationBatch), &prompts);

        // BatchGenerator's first steps: a [n, 1] forward right after the step's
        // generation forward, for the n prompts that just finished.
        let one_token = |shapes: &[[i32; 2]]| shapes.iter().filter(|s| s[1] == 1).count();
        let prefill = |shapes: &[[i32; 2]]| -> Vec<[i32; 2]> {
            shapes.iter().filter(|s| s[1] > 1).copied().collect()
        };
        assert_eq!(
            prefill(&mlx_lm_shapes),
            prefill(&lever_shapes),
            "prefill forwards"
        );
        let first_steps = mlx_lm_shapes.len() - lever_shapes.len();
        assert!(
            first_steps >= 3,
            "the lever ran {} one-token forwards, BatchGenerator's schedule {}: expected at least \
             3 fewer (the prompts finish in at least 3 different steps)",
            one_token(&lever_shapes),
            one_token(&mlx_lm_shapes)
        );
        let mut apart = (0f32, 0usize);
        for (k, (a, b)) in mlx_lm.iter().zip(&lever).enumerate() {
            assert_eq!(a.1.len(), prompts[k].2, "sequence {k}: tokens returned");
            assert_eq!(a.2, b.2, "sequence {k}: the steps its tokens came in");
            assert_eq!(a.1, b.1, "sequence {k}: greedy tokens");
            apart = logprobs_apart(k, a, b, apart);
        }
        eprintln!(
            "{name}: {first_steps} forwards fewer; logprobs rows that differ from BatchGenerator's \
             schedule: {}, at most {} apart",
            apart.1, apart.0
        );
    }
}

/// The server's `defer-chunk-on-start` ([`ChunkAfterStart::NextStep`]):
/// short prompts that start generating while a long one is in prefill do
/// not wait for its next chunk: the step in which they start feeds no chunk
/// to a prompt with more than one chunk left (never in two steps in a row),
/// so the next step hands out their first
/// tokens after a one-token forward instead of after a chunk. Against the
/// same arrivals without it: every sequence returns the same greedy tokens,
/// the short ones at the same steps, the long one as many steps later as
/// chunks waited; the chunks are the same forwards (the same shapes);
/// logprobs within a few bf16 roundings
/// (the long prompt joins the generation batch beside other rows than
/// without the lever).
#[test]
fn a_chunk_waits_a_step_for_sequences_that_start_generating_with_the_lever() {
    let root = tempfile::tempdir().unwrap();
    for name in ["qwen3-0.6b-tiny", "qwen3.5-4b-tiny"] {
        let model = bf16_monolith(root.path(), name, 4511);
        let ids = |n: i32, seed: i32| prompt_ids(&model, n, seed);
        // A long prompt in prefill (9 chunks of 4), short ones arriving
        // while it is: two together, then one alone, then one that is only
        // its last token.
        let prompts = [
            (ids(37, 5), 0, 4),
            (ids(5, 13), 1, 6),
            (ids(6, 17), 1, 6),
            (ids(3, 29), 4, 5),
            (ids(1, 3), 7, 4),
        ];
        let config = |chunk_after_start| BatchConfig {
            prefill_step_size: 4,
            prompt_lanes: PromptLanes::ShortFirst,
            chunk_after_start,
            ..BatchConfig::default()
        };
        let (same, same_shapes, same_phases) =
            run_session_phases(&model, config(ChunkAfterStart::SameStep), &prompts);
        let (next, next_shapes, next_phases) =
            run_session_phases(&model, config(ChunkAfterStart::NextStep), &prompts);

        // Without the lever a step that starts sequences feeds a chunk
        // while a prompt is in prefill; with it, the long prompt's chunk
        // waits (never in two steps in a row; a short prompt on its last
        // chunk is fed).
        let starts_with_chunk = |phases: &[StepPhases]| {
            phases
                .iter()
                .filter(|p| p.started > 0 && p.prefill.is_some())
                .count()
        };
        assert!(starts_with_chunk(&same_phases) >= 2, "{same_phases:?}");
        let deferred = next_phases.iter().filter(|p| p.chunk_deferred).count();
        assert!(deferred >= 2, "{next_phases:?}");
        for (i, p) in next_phases.iter().enumerate() {
            if p.chunk_deferred {
                assert!(
                    i == 0 || !next_phases[i - 1].chunk_deferred,
                    "steps {} and {i} both deferred",
                    i - 1
                );
            }
        }
        // The chunks themselves: the same forwards (a short prompt's chunk
        // may come before a long one's it followed without the lever).
        let chunks = |shapes: &[[i32; 2]]| -> Vec<[i32; 2]> {
            let mut c: Vec<[i32; 2]> = shapes.iter().filter(|s| s[1] > 1).copied().collect();
            c.sort_unstable();
            c
        };
        assert_eq!(chunks(&same_shapes), chunks(&next_shapes), "prefill chunks");

        let mut apart = (0f32, 0usize);
        for (k, (a, b)) in same.iter().zip(&next).enumerate() {
            assert_eq!(a.1.len(), prompts[k].2, "sequence {k}: tokens returned");
            assert_eq!(a.1, b.1, "sequence {k}: greedy tokens");
            if k > 0 {
                assert_eq!(a.2, b.2, "short sequence {k}: the steps its tokens came in");
            }
            apart = logprobs_apart(k, a, b, apart);
        }
        let (long_same, long_next) = (same[0].2[0], next[0].2[0]);
        assert!(
            long_next > long_same && long_next - long_same <= deferred,
            "the long prompt's first token: step {long_next} with the lever, {long_same} without, \
             {deferred} chunks deferred"
        );
        eprintln!(
            "{name}: {deferred} chunks deferred; the long prompt's first token {} steps later; \
             logprobs rows that differ: {}, at most {} apart",
            long_next - long_same,
            apart.1,
            apart.0
        );
    }
}

/// The server's `prefill-step-while-generating`: a prompt that arrives while
/// others generate is fed in chunks of at most that many tokens (chunks of
/// `prefill_step_size` when no one else generates or waits). Against the
/// same arrivals without it: the chunks are smaller exactly while others
/// generate, every sequence returns its whole budget with the same greedy
/// tokens, and logprobs stay within a few bf16 roundings (the prompt's
/// chunking is not mlx-lm's: L3).
#[test]
fn a_prompt_is_chunked_smaller_while_others_generate_with_the_lever() {
    let root = tempfile::tempdir().unwrap();
    for name in ["qwen3-0.6b-tiny", "qwen3.5-4b-tiny"] {
        let model = bf16_monolith(root.path(), name, 4521);
        let ids = |n: i32, seed: i32| prompt_ids(&model, n, seed);
        // A prompt alone first (its chunks are whole), one that arrives
        // while it generates (chunked small), and a short one.
        let prompts = [(ids(17, 5), 0, 14), (ids(29, 13), 6, 6), (ids(3, 29), 7, 5)];
        let config = |small| BatchConfig {
            prefill_step_size: 8,
            prompt_lanes: PromptLanes::ShortFirst,
            prefill_step_while_generating: small,
            ..BatchConfig::default()
        };
        let (whole, whole_shapes) = run_session(&model, config(None), &prompts);
        let (small, small_shapes) = run_session(&model, config(Some(3)), &prompts);
        let chunks = |shapes: &[[i32; 2]]| -> Vec<i32> {
            shapes.iter().filter(|s| s[1] > 1).map(|s| s[1]).collect()
        };
        // The first prompt alone: two whole chunks in both runs.
        assert_eq!(&chunks(&whole_shapes)[..2], &[8, 8]);
        assert_eq!(&chunks(&small_shapes)[..2], &[8, 8]);
        // The later ones, while the first generates: at most 3 tokens.
        assert!(chunks(&whole_shapes)[2..].iter().any(|&n| n > 3));
        assert!(
            chunks(&small_shapes)[2..].iter().all(|&n| n <= 3),
            "{small_shapes:?}"
        );
        let mut apart = (0f32, 0usize);
        for (k, (a, b)) in whole.iter().zip(&small).enumerate() {
            assert_eq!(a.1.len(), prompts[k].2, "sequence {k}: tokens returned");
            assert_eq!(a.1, b.1, "sequence {k}: greedy tokens");
            apart = logprobs_apart(k, a, b, apart);
        }
        eprintln!(
            "{name}: chunks {:?} against {:?}; logprobs rows that differ: {}, at most {} apart",
            chunks(&small_shapes),
            chunks(&whole_shapes),
            apart.1,
            apart.0
        );
    }
}

/// The monolith on a bf16 checkpoint of the tiny spec `name`
/// ([`bf16_checkpoint`]).
fn bf16_monolith(root: &std::path::Path, name: &str, seed: u64) -> archgen_monolith::Monolith {
    let (_, model_dir) = bf16_checkpoint(root, name, seed);
    archgen_monolith::load_dir(&model_dir).unwrap()
}

/// `n` prompt ids for `model`'s vocabulary, from `seed`.
fn prompt_ids(model: &dyn BatchLm, n: i32, seed: i32) -> Vec<i32> {
    let vocab = model.vocab_size();
    (0..n).map(|i| (i * 37 + seed) % vocab).collect()
}

/// Sequence `k`'s logprobs rows in two runs, each within a few bf16
/// roundings of the other (asserted); `apart` (the largest difference
/// and the rows that differ so far) with these rows added.
fn logprobs_apart(k: usize, a: &Trace, b: &Trace, apart: (f32, usize)) -> (f32, usize) {
    let mut apart = apart;
    for (step, (ra, rb)) in a.0.iter().zip(&b.0).enumerate() {
        let (ra, rb) = (bf16_values(ra), bf16_values(rb));
        let worst = ra
            .iter()
            .zip(&rb)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 0.0625,
            "sequence {k}, token {step}: logprobs {worst} apart"
        );
        apart = (apart.0.max(worst), apart.1 + usize::from(ra != rb));
    }
    apart
}

/// bf16 values from their little-endian bytes.
fn bf16_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
        .collect()
}

/// Gemma-2 with grouped-query attention (gemma-2-2b-tiny: 4 heads, 2 K/V
/// heads) in a batch. mlx-lm 0.32.2's gemma2 adds the batch's mask
/// [B, 1, L, S] to scores [B, 2, 2, L, S]: stock `BatchGenerator` fails on
/// the schedule (checked here, so the test notices if mlx-lm changes), and
/// at B = 2 it would mask each K/V head with another row's mask. archgen
/// masks each row with its own (`attention::mask_each_row`, tier L3 for
/// batches): checked byte for byte against mlx-lm's own attention with the
/// mask's one missing axis added (`batch_oracle.py --gemma2-mask-each-row`),
/// generated and monolith.
#[test]
fn gemma2_grouped_query_batches_mask_each_row() {
    let name = "gemma-2-2b-tiny";
    let root = tempfile::tempdir().unwrap();
    let (spec, model_dir) = bf16_checkpoint(root.path(), name, 4301);
    let ir = spec.lower();
    assert!(
        archgen_ir::tier::batch_tier(&ir, archgen_ir::tier::tier(&ir)).tier
            == archgen_ir::tier::Tier::L3,
        "{name}: batches of grouped softcapped attention are L3"
    );
    let model = archgen_monolith::load_dir(&model_dir).unwrap();
    let json = schedule(BatchLm::vocab_size(&model));
    let schedule_path = root.path().join("schedule.json");
    std::fs::write(&schedule_path, serde_json::to_vec(&json).unwrap()).unwrap();
    let oracle_path = root.path().join("oracle.safetensors");

    let stock = std::process::Command::new(archgen_tests::venv_python())
        .arg(repo_root().join("tests/python/batch_oracle.py"))
        .args([&model_dir, &schedule_path, &oracle_path])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&stock.stderr);
    assert!(
        !stock.status.success() && said.contains("broadcast_shapes"),
        "stock mlx-lm was expected to fail on a Gemma-2 GQA batch: {}\n{said}",
        stock.status
    );

    run_python(
        "batch_oracle.py",
        &[
            model_dir.as_os_str(),
            schedule_path.as_os_str(),
            oracle_path.as_os_str(),
            std::ffi::OsStr::new("--gemma2-mask-each-row"),
        ],
    );
    let oracle = Array::load_safetensors(&oracle_path).unwrap();
    let schedule = Schedule::from_json(&json, BatchLm::vocab_size(&model)).unwrap();
    let runs = run_schedule(&model, &schedule).unwrap();
    let generated = run_generated_once(&model_dir, name, &schedule).unwrap();
    let mut failures = Vec::new();
    for (which, seqs) in [("monolith", &runs), ("generated", &generated)] {
        assert_eq!(seqs.len(), schedule.sequences.len(), "{which}");
        for (i, run) in seqs.iter().enumerate() {
            let n = run.tokens.len() as i32;
            let tokens = Array::from_slice(&run.tokens, &[n]);
            let steps = Array::from_slice(&run.steps, &[n]);
            for (key, ours) in [
                ("logprobs", &run.logprobs),
                ("tokens", &tokens),
                ("steps", &steps),
            ] {
                if !same(ours, &oracle[&format!("seq{i}.{key}")]) {
                    failures.push(format!(
                        "{name}: seq{i}.{key}: {which} != mlx-lm, rows masked"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
