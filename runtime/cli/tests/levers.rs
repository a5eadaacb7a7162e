//! Speed levers on the command line (docs/cli.md, "Levers"): `archgen
//! levers` lists them; a run states the levers it has on and the tier they
//! give it; `--l1`/`--l3` expand to lever settings that a lever's own flag
//! overrides; the environment variables stay a lower-priority source; and
//! `--require-tier` refuses an L3 lever by name, before reading anything.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The environment variables that set levers: removed from every run here
/// unless a test sets one, so the caller's environment cannot decide a test.
const LEVER_VARS: [&str; 6] = [
    "ARCHGEN_EAGER_DECODE",
    "ARCHGEN_GPU_DECODE",
    "ARCHGEN_GPU_DECODE_BLOCKS",
    "ARCHGEN_GPU_ONE_TOKEN_SDPA",
    "ARCHGEN_DELTANET_CHUNKED_PREFILL",
    "MLX_CUDA_GRAPH_CACHE_SIZE",
];

fn archgen_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_archgen"));
    cmd.args(args);
    for var in LEVER_VARS {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn archgen(args: &[&str]) -> Output {
    archgen_with(args, &[])
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn archgen_levers_lists_each_lever_its_tier_default_and_the_aliases() {
    let o = archgen(&["levers"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8(o.stdout).unwrap();
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{table}"))
            .split_whitespace()
            .take(5)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row("gpu-one-token-sdpa"),
        [
            "gpu-one-token-sdpa",
            "L3",
            "off",
            "on|off",
            "ARCHGEN_GPU_ONE_TOKEN_SDPA"
        ]
    );
    assert_eq!(
        row("eager-decode"),
        [
            "eager-decode",
            "L1",
            "off",
            "on|off",
            "ARCHGEN_EAGER_DECODE"
        ]
    );
    assert_eq!(row("max-batch"), ["max-batch", "L1", "16", "1..=4096", "-"]);
    assert_eq!(
        row("gpu-stacked-projections"),
        [
            "gpu-stacked-projections",
            "L3",
            "off",
            "on|off",
            "ARCHGEN_GPU_STACKED_PROJECTIONS"
        ]
    );
    assert_eq!(
        row("cuda-head-norm-rope"),
        [
            "cuda-head-norm-rope",
            "L3",
            "off",
            "on|off",
            "ARCHGEN_CUDA_HEAD_NORM_ROPE"
        ]
    );
    assert_eq!(
        row("deltanet-chunked-prefill"),
        [
            "deltanet-chunked-prefill",
            "L3",
            "off",
            "on|off",
            "ARCHGEN_DELTANET_CHUNKED_PREFILL"
        ]
    );
    assert_eq!(
        row("defer-chunk-on-start"),
        [
            "defer-chunk-on-start",
            "L1",
            "on",
            "on|off",
            "ARCHGEN_DEFER_CHUNK_ON_START"
        ]
    );
    assert_eq!(
        row("first-token-in-decode-step"),
        [
            "first-token-in-decode-step",
            "L3",
            "off",
            "on|off",
            "ARCHGEN_FIRST_TOKEN_IN_DECODE_STEP"
        ]
    );
    assert!(
        table.contains(
            "--l3   gpu-one-token-sdpa=on, gpu-stacked-projections=on, cuda-head-norm-rope=on, \
             deltanet-chunked-prefill=on, first-token-in-decode-step=on\n"
        ),
        "{table}"
    );
    assert!(
        table.contains(
            "--l1   gpu-decode-on-cpu=off, gpu-decode-blocks=all, gpu-one-token-sdpa=off, \
             gpu-stacked-projections=off, cuda-head-norm-rope=off, deltanet-chunked-prefill=off, \
             first-token-in-decode-step=off, prefill-step-while-generating=off\n"
        ),
        "{table}"
    );

    let o = archgen(&["levers", "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let levers = json["levers"].as_array().unwrap();
    let names: Vec<&str> = levers.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "eager-decode",
            "gpu-decode",
            "gpu-decode-on-cpu",
            "gpu-decode-blocks",
            "gpu-one-token-sdpa",
            "gpu-stacked-projections",
            "cuda-head-norm-rope",
            "deltanet-chunked-prefill",
            "max-batch",
            "prefill-step",
            "keep-buffer-pool",
            "first-token-in-decode-step",
            "defer-chunk-on-start",
            "prefill-step-while-generating",
            "cuda-graph-cache"
        ]
    );
    let sdpa = &levers[4];
    assert_eq!(sdpa["tier_when_on"], "L3");
    assert_eq!(sdpa["default"], "off");
    assert_eq!(sdpa["kind"], "switch");
    assert_eq!(sdpa["environment"], "ARCHGEN_GPU_ONE_TOKEN_SDPA");
    assert_eq!(
        sdpa["commands"],
        serde_json::json!(["logits", "generate", "chat", "serve", "embed"])
    );
    assert_eq!(levers[8]["commands"], serde_json::json!(["serve"]));
    assert_eq!(levers[11]["name"], "first-token-in-decode-step");
    assert_eq!(
        levers[11]["commands"],
        serde_json::json!(["logits", "serve"])
    );
    let aliases = json["aliases"].as_array().unwrap();
    assert_eq!(aliases[0]["flag"], "--l1");
    assert_eq!(aliases[0]["sets"]["gpu-one-token-sdpa"], "off");
    assert_eq!(aliases[2]["flag"], "--l3");
    assert_eq!(
        aliases[2]["sets"],
        serde_json::json!({
            "gpu-one-token-sdpa": "on",
            "gpu-stacked-projections": "on",
            "cuda-head-norm-rope": "on",
            "deltanet-chunked-prefill": "on",
            "first-token-in-decode-step": "on"
        })
    );

    let o = archgen(&["levers", "--format", "yaml"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn require_tier_refuses_an_l3_lever_by_name_before_reading_anything() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("no-such-model");
    let model = missing.to_str().unwrap();
    let out = root.path().join("o.safetensors");
    let out = out.to_str().unwrap();
    let logits = [
        "logits",
        "--model",
        model,
        "--prompt-ids",
        "1",
        "--out",
        out,
    ];
    let generate = ["generate", "--model", model, "--prompt-ids", "1"];
    let chat = ["chat", "--model", model];
    let serve = ["serve", "--model", model, "--port", "0"];
    for base in [&logits[..], &generate, &chat, &serve] {
        let run = |extra: &[&str], env: &[(&str, &str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            archgen_with(&v, env)
        };
        // The lever's flag, the alias and the environment each turn it on.
        for (extra, env, source) in [
            (
                &["--gpu-one-token-sdpa", "--require-tier", "L1"][..],
                &[][..],
                "from its flag",
            ),
            (&["--l3", "--require-tier", "L2"], &[], "from --l3"),
            (
                &["--require-tier", "L1"],
                &[("ARCHGEN_GPU_ONE_TOKEN_SDPA", "1")],
                "from ARCHGEN_GPU_ONE_TOKEN_SDPA",
            ),
        ] {
            let o = run(extra, env);
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{base:?} {extra:?}: {e}");
            let required = extra.last().unwrap();
            // --l3 turns on each of its levers that the command reads; the
            // refusal names each.
            let levers = match source {
                "from --l3" if base[0] == "serve" || base[0] == "logits" => format!(
                    "lever gpu-one-token-sdpa=on ({source}) is L3, lever \
                     gpu-stacked-projections=on ({source}) is L3, lever \
                     cuda-head-norm-rope=on ({source}) is L3, lever \
                     deltanet-chunked-prefill=on ({source}) is L3, lever \
                     first-token-in-decode-step=on ({source}) is L3; turn them off \
                     (--gpu-one-token-sdpa off, --gpu-stacked-projections off, \
                     --cuda-head-norm-rope off, --deltanet-chunked-prefill off, \
                     --first-token-in-decode-step off;"
                ),
                "from --l3" => format!(
                    "lever gpu-one-token-sdpa=on ({source}) is L3, lever \
                     gpu-stacked-projections=on ({source}) is L3, lever \
                     cuda-head-norm-rope=on ({source}) is L3, lever \
                     deltanet-chunked-prefill=on ({source}) is L3; turn them off \
                     (--gpu-one-token-sdpa off, --gpu-stacked-projections off, \
                     --cuda-head-norm-rope off, --deltanet-chunked-prefill off;"
                ),
                _ => format!(
                    "lever gpu-one-token-sdpa=on ({source}) is L3; turn it off \
                     (--gpu-one-token-sdpa off;"
                ),
            };
            assert!(
                e.contains(&format!(
                    "archgen: error: --require-tier {required}: refusing to run {model}: {levers}"
                )),
                "{base:?} {extra:?}: {e}"
            );
        }
        // Turned off again (by --l1 over the environment), the levers pass and
        // the run goes on to fail on the missing model instead.
        let o = run(
            &["--l1", "--require-tier", "L1"],
            &[("ARCHGEN_GPU_ONE_TOKEN_SDPA", "1")],
        );
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{base:?}: {e}");
        assert!(!e.contains("refusing"), "{base:?}: {e}");
        assert!(e.contains("no-such-model"), "{base:?}: {e}");
    }
    assert!(!Path::new(out).exists());

    // `launch` passes the levers to its ranks, which refuse the same way.
    let mut launched = vec!["launch", "-n", "1", "--timeout", "60", "--"];
    launched.extend_from_slice(&logits);
    launched.extend_from_slice(&["--gpu-decode-on-cpu", "--require-tier", "L1"]);
    let o = archgen(&launched);
    let e = stderr(&o);
    assert_ne!(o.status.code(), Some(0), "{e}");
    assert!(
        e.contains("lever gpu-decode-on-cpu=on (from its flag) is L3"),
        "{e}"
    );

    // A bad value in a lever's environment variable is named.
    let o = archgen_with(&logits, &[("ARCHGEN_GPU_DECODE_BLOCKS", "middle")]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains(
            "archgen: error: ARCHGEN_GPU_DECODE_BLOCKS=middle: `middle` is not one of all, pre, post, none"
        ),
        "{e}"
    );
}

fn init(spec: &str, dir: &Path) {
    init_with(spec, dir, &[]);
}

/// `archgen init` of `spec` at seed 7 with `extra` flags.
fn init_with(spec: &str, dir: &Path, extra: &[&str]) {
    let repo = archgen_tests::repo_root();
    let spec = repo.join(format!("specs/{spec}.yaml"));
    let mut args = vec![
        "init",
        "--spec",
        spec.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--seed",
        "7",
    ];
    args.extend_from_slice(extra);
    let o = archgen(&args);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `deltanet-chunked-prefill` reaches a Gated DeltaNet model's prompt: the
/// float32 prefill logits move off L1's bytes (another order of sums) and
/// stay within rounding of them, and the greedy tokens are L1's.
#[test]
fn the_chunked_prefill_lever_changes_a_hybrid_prompt_within_rounding() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    // float32, so that the recurrence's rounding reaches the logits rather
    // than being rounded away with y's bfloat16.
    init_with("qwen3.5-4b-tiny", &dir, &["--dtype", "float32"]);
    let ids: Vec<String> = (0..100)
        .map(|i| ((i * 37 + 11) % 512).to_string())
        .collect();
    let ids = ids.join(",");
    let logits = |name: &str, extra: &[&str]| {
        let out = root.path().join(format!("{name}.safetensors"));
        let mut args = vec![
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &ids,
            "--decode-steps",
            "16",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = archgen(&args);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let e = stderr(&o);
        (e, archgen_runtime::Array::load_safetensors(&out).unwrap())
    };
    let (_, l1) = logits("l1", &[]);
    let (e, chunked) = logits("chunked", &["--deltanet-chunked-prefill", "on"]);
    assert!(
        e.contains("archgen: parity tier L3: lever deltanet-chunked-prefill=on (no oracle)\n"),
        "{e}"
    );
    // qwen3.5-4b-tiny: 6 of its 8 layers are Gated DeltaNet, one prompt each.
    assert!(
        e.contains("archgen: deltanet-chunked-prefill: 6 Gated DeltaNet layer calls ran a prompt in chunks\n"),
        "{e}"
    );
    let f32 = |a: &archgen_runtime::Array| {
        let a = a.as_dtype(archgen_runtime::mlx_rs::Dtype::Float32).unwrap();
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    };
    let (a, b) = (f32(&l1["prefill_logits"]), f32(&chunked["prefill_logits"]));
    let gap = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(gap > 0.0, "the lever left the prefill's bytes as they were");
    assert!(gap <= 1e-3, "prefill logits {gap} apart");
    let tokens = |r: &std::collections::HashMap<String, archgen_runtime::Array>| {
        r["tokens"].as_slice::<i32>().to_vec()
    };
    assert_eq!(tokens(&l1), tokens(&chunked), "greedy tokens");
}

#[test]
fn a_run_states_its_levers_and_the_tier_they_give_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    init("qwen3-0.6b-tiny", &dir);
    let logits = |name: &str, extra: &[&str], env: &[(&str, &str)]| {
        let out = root.path().join(format!("{name}.safetensors"));
        let mut args = vec![
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3,4,5,6,7,8,9",
            "--decode-steps",
            "4",
            "--impl",
            "generated",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = archgen_with(&args, env);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        (stderr(&o), std::fs::read(&out).unwrap())
    };
    let l1 = "archgen: parity tier L1 (bit-exact with mlx-lm 0.32.2)\n";
    let sdpa_l3 = "archgen: parity tier L3: lever gpu-one-token-sdpa=on (no oracle)\n";
    let alias_l3 = "archgen: parity tier L3: lever gpu-one-token-sdpa=on; \
                    lever gpu-stacked-projections=on; lever cuda-head-norm-rope=on; \
                    lever deltanet-chunked-prefill=on; lever first-token-in-decode-step=on \
                    (no oracle)\n";
    // gpu-decode is on by default in every build but macOS's.
    let gpu = if cfg!(target_os = "macos") {
        ""
    } else {
        "gpu-decode (default), "
    };

    let (e, default_bytes) = logits("default", &[], &[]);
    assert!(e.contains(l1), "{e}");
    let none_on = match gpu {
        "" => "archgen: levers on: none\n",
        _ => "archgen: levers on: gpu-decode (default)\n",
    };
    assert!(e.contains(none_on), "{e}");
    assert!(
        e.contains("; one-token steps: compiled blocks of the CPU's fallback ops\n"),
        "{e}"
    );

    let (e, _) = logits("l3", &["--l3"], &[]);
    assert!(e.contains(alias_l3), "{e}");
    // qwen3-0.6b has no Gated DeltaNet layer: the lever says it did nothing.
    assert!(
        e.contains(
            "archgen: deltanet-chunked-prefill: not applied: no Gated DeltaNet layer ran a prompt \
             of more than one token\n"
        ),
        "{e}"
    );
    // The custom CUDA kernel's lever says when it cannot run (a CPU run).
    assert!(
        e.contains(
            "archgen: cuda-head-norm-rope: not applied: its kernel runs only in one-token steps \
             on CUDA's GPU path (this run's path: compiled blocks of the CPU's fallback ops)\n"
        ),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "archgen: levers on: {gpu}gpu-one-token-sdpa (from --l3), \
             gpu-stacked-projections (from --l3), cuda-head-norm-rope (from --l3), \
             deltanet-chunked-prefill (from --l3), first-token-in-decode-step (from --l3)\n"
        )),
        "{e}"
    );
    // One sequence runs no decode batch: the batch lever says it did nothing.
    assert!(
        e.contains(
            "archgen: first-token-in-decode-step: not applied: one sequence runs no decode batch \
             (the lever acts with --batch)\n"
        ),
        "{e}"
    );

    let (e, _) = logits(
        "l3-off",
        &[
            "--l3",
            "--gpu-one-token-sdpa",
            "off",
            "--gpu-stacked-projections",
            "off",
            "--cuda-head-norm-rope",
            "off",
            "--deltanet-chunked-prefill",
            "off",
            "--first-token-in-decode-step",
            "off",
        ],
        &[],
    );
    assert!(e.contains(l1), "{e}");

    let (e, _) = logits("env", &[], &[("ARCHGEN_GPU_ONE_TOKEN_SDPA", "1")]);
    assert!(e.contains(sdpa_l3), "{e}");
    assert!(
        e.contains("gpu-one-token-sdpa (from ARCHGEN_GPU_ONE_TOKEN_SDPA)"),
        "{e}"
    );
    let (e, _) = logits("env-l1", &["--l1"], &[("ARCHGEN_GPU_ONE_TOKEN_SDPA", "1")]);
    assert!(e.contains(l1), "{e}");

    // The decode levers reach the runtime: the blocks the steps run change,
    // and an L1 lever keeps the bytes.
    let (e, eager_bytes) = logits("eager", &["--eager-decode"], &[]);
    assert!(e.contains(l1), "{e}");
    assert!(e.contains("; one-token steps: eager blocks\n"), "{e}");
    assert!(e.contains("eager-decode (from its flag)"), "{e}");
    assert!(
        eager_bytes == default_bytes,
        "--eager-decode changed the logits"
    );
    let (e, _) = logits("wiring", &["--gpu-decode-on-cpu"], &[]);
    assert!(
        e.contains("archgen: parity tier L3: lever gpu-decode-on-cpu=on (no oracle)\n"),
        "{e}"
    );
    assert!(
        e.contains("; one-token steps: compiled blocks with native fast ops (the GPU path)\n"),
        "{e}"
    );

    // --quiet: no status notes at all.
    let (e, _) = logits("quiet", &["--l3", "--quiet"], &[]);
    assert!(
        !e.contains("levers on") && !e.contains("parity tier"),
        "{e}"
    );
}

#[test]
fn chat_and_serve_state_their_levers_serves_with_its_own() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    init("qwen3-0.6b-tiny", &dir);
    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/qwen3.jinja");
    archgen_tests::run_python(
        "make_chat_tokenizer.py",
        &[dir.as_os_str(), template.as_os_str()],
    );
    let gpu = if cfg!(target_os = "macos") {
        ""
    } else {
        "gpu-decode (default), "
    };

    // chat with nothing on stdin: the notes, then the end of the conversation.
    let o = Command::new(env!("CARGO_BIN_EXE_archgen"))
        .args(["chat", "--model", dir.to_str().unwrap(), "--l3"])
        .env_remove("ARCHGEN_GPU_ONE_TOKEN_SDPA")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(
            "archgen: parity tier L3: lever gpu-one-token-sdpa=on; \
             lever gpu-stacked-projections=on; lever cuda-head-norm-rope=on; \
             lever deltanet-chunked-prefill=on (no oracle)\n"
        ),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "archgen: levers on: {gpu}gpu-one-token-sdpa (from --l3), \
             gpu-stacked-projections (from --l3), cuda-head-norm-rope (from --l3), \
             deltanet-chunked-prefill (from --l3)\n"
        )),
        "{e}"
    );

    // serve states its own levers too, before it listens.
    let mut server = Command::new(env!("CARGO_BIN_EXE_archgen"))
        .args(["serve", "--model", dir.to_str().unwrap(), "--port", "0"])
        .args(["--max-batch", "4", "--l1", "--keep-buffer-pool"])
        .env("MLX_CUDA_GRAPH_CACHE_SIZE", "500")
        .env("ARCHGEN_GPU_ONE_TOKEN_SDPA", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut startup = String::new();
    for line in BufReader::new(server.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        startup.push_str(&line);
        startup.push('\n');
        if line.contains("http://") {
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        startup.contains("archgen: parity tier L1 (bit-exact with mlx-lm 0.32.2)\n"),
        "{startup}"
    );
    assert!(
        startup.contains(&format!(
            "archgen: levers on: {gpu}max-batch=4 (from its flag), prefill-step=2048 (default), \
             keep-buffer-pool (from its flag), defer-chunk-on-start (default), \
             cuda-graph-cache=500 (from MLX_CUDA_GRAPH_CACHE_SIZE)\n"
        )),
        "{startup}"
    );
}

/// `first-token-in-decode-step` in `logits --batch`: the schedule runs with
/// each finished prompt's last token in the next decode forward. The run
/// says so and states its tier; every sequence returns its tokens at the
/// steps `BatchGenerator`'s schedule returns them, and the same greedy tokens
/// (on this CPU, bf16, the same bytes: tests/batch_parity.rs measures them).
/// Without `--batch` the lever has nothing to act on, and the run says that.
#[test]
fn the_batch_levers_run_a_batch_schedule_and_say_so() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    init_with("qwen3-0.6b-tiny", &dir, &[]);
    let schedule = root.path().join("schedule.json");
    let ids =
        |n: usize, seed: usize| -> Vec<usize> { (0..n).map(|i| (i * 37 + seed) % 512).collect() };
    std::fs::write(
        &schedule,
        serde_json::json!({
            "prefill_step_size": 4,
            "sequences": [
                {"prompt": ids(9, 5), "arrival": 0, "decode": 10},
                {"prompt": ids(6, 13), "arrival": 2, "decode": 6},
                {"prompt": ids(7, 17), "arrival": 2, "decode": 6},
                {"prompt": ids(13, 29), "arrival": 5, "decode": 4}
            ]
        })
        .to_string(),
    )
    .unwrap();
    let run = |name: &str, extra: &[&str]| {
        let out = root.path().join(format!("{name}.safetensors"));
        let mut args = vec![
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--batch",
            schedule.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = archgen(&args);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        (
            stderr(&o),
            archgen_runtime::Array::load_safetensors(&out).unwrap(),
        )
    };
    let (_, l1) = run("l1", &[]);
    let (e, lever) = run("lever", &["--first-token-in-decode-step", "on"]);
    assert!(
        e.contains("archgen: parity tier L3: lever first-token-in-decode-step=on (no oracle)\n"),
        "{e}"
    );
    assert!(
        e.contains("a finished prompt's last token runs in the next decode forward"),
        "{e}"
    );
    for i in 0..4 {
        for part in ["tokens", "steps"] {
            let key = format!("seq{i}.{part}");
            let (a, b) = (&l1[&key], &lever[&key]);
            assert_eq!(a.as_slice::<i32>(), b.as_slice::<i32>(), "{key}");
        }
    }
    // Prompts that arrive while the first generates are chunked at most 2
    // tokens: more chunks, so later steps, the same greedy tokens here.
    let (e, small) = run("small", &["--prefill-step-while-generating", "2"]);
    assert!(
        e.contains("archgen: parity tier L3: lever prefill-step-while-generating=2 (no oracle)\n"),
        "{e}"
    );
    assert!(
        e.contains("prompts chunked at most 2 tokens while others generate"),
        "{e}"
    );
    for i in 0..4 {
        let key = format!("seq{i}.tokens");
        let (a, b) = (&l1[&key], &small[&key]);
        assert_eq!(a.as_slice::<i32>(), b.as_slice::<i32>(), "{key}");
    }
    let first_step = |run: &std::collections::HashMap<String, archgen_runtime::Array>| {
        run["seq3.steps"].as_slice::<i32>()[0]
    };
    assert!(
        first_step(&small) > first_step(&l1),
        "the last prompt, chunked smaller, got its first token no later"
    );
    let ids = ids(9, 5)
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out = root.path().join("one.safetensors");
    let o = archgen(&[
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &ids,
        "--out",
        out.to_str().unwrap(),
        "--first-token-in-decode-step",
        "on",
        "--prefill-step-while-generating",
        "2",
    ]);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(
            "archgen: first-token-in-decode-step: not applied: one sequence runs no decode batch"
        ),
        "{e}"
    );
    assert!(
        e.contains(
            "archgen: prefill-step-while-generating: not applied: one sequence has no others \
             generating"
        ),
        "{e}"
    );
}
