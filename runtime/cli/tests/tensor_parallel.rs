//! Tensor parallelism on the CPU, 2 ranks of MLX's ring backend over
//! loopback. For the families mlx-lm shards (qwen3, llama, qwen2, a 4-bit
//! qwen3, qwen3_moe's experts, and qwen3_5's Gated DeltaNet and gated
//! attention layers with a dense MLP or with routed experts plus a shared
//! expert and the head split over the vocabulary), under the logits protocol, rank 0's bytes
//! agree three ways: the sharded generated model (`archgen launch -- logits --impl
//! generated`), the sharded monolith (`--impl monolith`) and mlx-lm's own
//! sharded model (`model.shard(group)` as sharded_load does it, under
//! mlx.launch: tests/python/tp_oracle.py, one launch for the whole batch).
//! For Gemma-4 and Gemma-2 (no shard() in mlx-lm, tier L3 sharded) the
//! sharded generated model == the sharded monolith, and the difference from
//! the unsharded model is printed. And the launcher's failures: a world size the heads do not divide, and a
//! rank killed mid-run, end with a clear error in bounded time; a sampled
//! `generate` without `--seed` is refused (each rank would pick its own).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use archgen_runtime::bytes::array_bytes;
use archgen_runtime::Array;

const ARCHGEN: &str = env!("CARGO_BIN_EXE_archgen");

/// `n` consecutive free ports on loopback for the ring backend.
fn free_ports(n: u16) -> u16 {
    for _ in 0..100 {
        let Ok(first) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(start) = first.local_addr().map(|a| a.port()) else {
            continue;
        };
        if start > u16::MAX - n {
            continue;
        }
        if (1..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", start + i)).is_ok()) {
            return start;
        }
    }
    panic!("no {n} consecutive free ports on 127.0.0.1");
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Random weights for `spec`: bf16, except unquantized routed experts, which
/// MLX's CPU `gather_mm` runs in float32 only (as the unsharded parity tests).
fn init(spec: &str, dir: &Path) {
    let repo = archgen_tests::repo_root();
    let dtype = match spec {
        "qwen3-30b-a3b-tiny" | "qwen3.6-35b-a3b-tiny" => "float32",
        _ => "bfloat16",
    };
    let o = Command::new(ARCHGEN)
        .args(["--quiet", "init", "--spec"])
        .arg(repo.join(format!("specs/{spec}.yaml")))
        .arg("--out")
        .arg(dir)
        .args(["--seed", "7", "--dtype", dtype])
        .output()
        .unwrap();
    assert!(o.status.success(), "init {spec}: {}", text(&o));
}

/// `archgen launch -n ranks -- args...`, bounded by the launcher's own
/// --timeout (and a margin here).
fn launch(ranks: usize, args: &[&str]) -> (Output, Duration) {
    let port = free_ports(ranks as u16).to_string();
    let start = Instant::now();
    let o = Command::new(ARCHGEN)
        .args(["launch", "--backend", "ring", "-n", &ranks.to_string()])
        .args(["-p", &port, "--timeout", "120", "--"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (o, start.elapsed())
}

const IDS: &str = "3,1,4,1,5,9,2,6,5,3,5";
const STEPS: &str = "4";

fn tensors(path: &Path) -> Vec<(String, String, Vec<u8>)> {
    let mut m: Vec<(String, Array)> = Array::load_safetensors(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect();
    m.sort_by(|a, b| a.0.cmp(&b.0));
    m.into_iter()
        .map(|(k, a)| {
            let dtype = format!("{:?} {:?}", a.dtype(), a.shape());
            (k, dtype, array_bytes(&a).unwrap())
        })
        .collect()
}

#[test]
fn sharded_generated_equals_sharded_monolith_equals_mlx_lm_sharded_on_two_ring_ranks() {
    let specs = [
        "qwen3-0.6b-tiny",
        "llama-3.2-1b-tiny",
        "qwen2.5-0.5b-tiny",
        "qwen3-0.6b-tiny-q4",
        "qwen3-30b-a3b-tiny",
        "qwen3.5-4b-tiny",
        "qwen3.5-4b-tiny-q4",
        "qwen3.5-4b-tp-tiny",
        "qwen3.6-35b-a3b-tiny",
    ];
    let tmp = tempfile::tempdir().unwrap();
    let mut jobs = Vec::new();
    for spec in specs {
        let dir = tmp.path().join(spec);
        init(spec, &dir);
        for imp in ["generated", "monolith"] {
            let out = dir.join(format!("{imp}.safetensors"));
            let (o, _) = launch(
                2,
                &[
                    "logits",
                    "--impl",
                    imp,
                    "--model",
                    dir.to_str().unwrap(),
                    "--prompt-ids",
                    IDS,
                    "--decode-steps",
                    STEPS,
                    "--out",
                    out.to_str().unwrap(),
                ],
            );
            let t = text(&o);
            assert!(o.status.success(), "{spec} {imp}: {t}");
            assert!(
                t.contains("[rank 0] archgen: tensor parallel: rank 0 of 2 (ring backend)"),
                "{spec} {imp}: {t}"
            );
            assert!(
                t.contains("[rank 0] archgen: parity tier L1 (bit-exact with mlx-lm 0.32.2)"),
                "{spec} {imp}: {t}"
            );
            if imp == "generated" {
                assert!(t.contains("running generated model"), "{spec}: {t}");
            }
        }
        let ids: Vec<i32> = IDS.split(',').map(|t| t.parse().unwrap()).collect();
        jobs.push(serde_json::json!({
            "model": dir,
            "prompt_ids": ids,
            "decode_steps": STEPS.parse::<usize>().unwrap(),
            "out": dir.join("mlx_lm.safetensors"),
        }));
    }
    let jobs_file = tmp.path().join("jobs.json");
    std::fs::write(&jobs_file, serde_json::to_string(&jobs).unwrap()).unwrap();
    let python = archgen_tests::venv_python();
    let script: PathBuf = archgen_tests::repo_root().join("tests/python/tp_oracle.py");
    let o = Command::new(python.with_file_name("mlx.launch"))
        .args(["--backend", "ring", "-n", "2", "--starting-port"])
        .arg(free_ports(2).to_string())
        .arg("--")
        .arg(&python)
        .arg(&script)
        .arg("--jobs")
        .arg(&jobs_file)
        .current_dir(script.parent().unwrap())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let t = text(&o);
    // Its files, not its printed lines: mlx.launch may drop a rank's last
    // output (it stops reading a pipe once the process has exited).
    assert!(o.status.success(), "mlx-lm sharded oracle: {t}");
    for spec in specs {
        let dir = tmp.path().join(spec);
        let oracle = tensors(&dir.join("mlx_lm.safetensors"));
        assert_eq!(oracle.len(), 3, "{spec}: {oracle:?}");
        for imp in ["generated", "monolith"] {
            let ours = tensors(&dir.join(format!("{imp}.safetensors")));
            for ((k, d, b), (ok, od, ob)) in ours.iter().zip(&oracle) {
                assert_eq!((k, d), (ok, od), "{spec} {imp}");
                assert!(
                    b == ob,
                    "{spec}: sharded {imp} differs from mlx-lm sharded in {k}"
                );
            }
        }
    }
}

#[test]
fn a_world_size_the_heads_do_not_divide_fails_on_every_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("q");
    init("qwen3-0.6b-tiny", &dir);
    let out = tmp.path().join("out.safetensors");
    // 4 heads, 2 KV heads: not over 3 ranks.
    let (o, took) = launch(
        3,
        &[
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    for rank in 0..3 {
        assert!(
            t.contains(&format!(
                "[rank {rank}] archgen: error: rank {rank} of 3: checkpoint-q: layer 0: the \
                 number of attention heads (4) is not divisible by the world size 3"
            )),
            "rank {rank}: {t}"
        );
    }
    assert!(t.contains("launch of 3 ranks (ring backend) failed"), "{t}");
    assert!(!out.exists(), "no output on failure");
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

/// The PIDs of `parent`'s children (Linux /proc).
fn children(parent: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn rank_of(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("MLX_RANK=").map(str::to_string))
}

#[test]
fn a_rank_that_dies_ends_the_launch_with_a_clear_error_in_bounded_time() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("q");
    init("qwen3-0.6b-tiny", &dir);
    let port = free_ports(2).to_string();
    let start = Instant::now();
    // A long generation, so rank 1 is killed while both ranks are in it.
    let child = Command::new(ARCHGEN)
        .args(["launch", "-n", "2", "-p", &port, "--grace", "3"])
        .args(["--timeout", "100", "--", "generate", "--model"])
        .arg(&dir)
        .args([
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2000",
            "--ignore-eos",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until rank 1 is generating (its process exists, and a moment).
    let rank1 = loop {
        let found = children(child.id())
            .into_iter()
            .find(|&p| rank_of(p).as_deref() == Some("1"));
        if let Some(p) = found {
            break p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "rank 1 never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(2));
    let killed = Command::new("kill")
        .args(["-9", &rank1.to_string()])
        .status();
    assert!(killed.unwrap().success());
    let o = child.wait_with_output().unwrap();
    let took = start.elapsed();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("rank 1 was killed by signal 9"), "{t}");
    // Rank 0 either failed on its own (MLX saw the closed peer) or was
    // stopped after the grace period; both are reported.
    assert!(
        t.contains("rank 0 exited with status") || t.contains("rank 0 was stopped by the launcher"),
        "{t}"
    );
    assert!(took < Duration::from_secs(60), "took {took:?}: {t}");
}

fn max_abs_diff(a: &Path, b: &Path, key: &str) -> f32 {
    use archgen_runtime::Dtype;
    let (a, b) = (
        Array::load_safetensors(a).unwrap().remove(key).unwrap(),
        Array::load_safetensors(b).unwrap().remove(key).unwrap(),
    );
    let d = a
        .as_dtype(Dtype::Float32)
        .unwrap()
        .subtract(b.as_dtype(Dtype::Float32).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max(None)
        .unwrap();
    d.try_item_exact::<f32>().unwrap()
}

#[test]
fn families_without_an_mlx_lm_shard_agree_generated_and_monolith_at_tier_l3() {
    let tmp = tempfile::tempdir().unwrap();
    for spec in ["gemma4-31b-tp-tiny", "gemma-2-2b-tiny", "minicpm-2b-tiny"] {
        let dir = tmp.path().join(spec);
        init(spec, &dir);
        for imp in ["generated", "monolith"] {
            let out = dir.join(format!("{imp}.safetensors"));
            let (o, _) = launch(
                2,
                &[
                    "logits",
                    "--impl",
                    imp,
                    "--model",
                    dir.to_str().unwrap(),
                    "--prompt-ids",
                    IDS,
                    "--decode-steps",
                    STEPS,
                    "--out",
                    out.to_str().unwrap(),
                ],
            );
            let t = text(&o);
            assert!(o.status.success(), "{spec} {imp}: {t}");
            assert!(
                t.contains(
                    "[rank 0] archgen: parity tier L3: tensor parallel over 2 ranks without a \
                     sharded oracle (mlx-lm has no shard() for this model type) (no oracle)"
                ),
                "{spec} {imp}: {t}"
            );
        }
        let generated = tensors(&dir.join("generated.safetensors"));
        let monolith = tensors(&dir.join("monolith.safetensors"));
        assert_eq!(generated.len(), 3);
        assert!(
            generated == monolith,
            "{spec}: sharded generated != sharded monolith"
        );
        // The unsharded model, for the record: the all_sum reorders the
        // reduction of o/down, so the last bits move.
        let one = dir.join("one-rank.safetensors");
        let o = Command::new(ARCHGEN)
            .args(["--quiet", "logits", "--model"])
            .arg(&dir)
            .args(["--prompt-ids", IDS, "--decode-steps", STEPS, "--out"])
            .arg(&one)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let sharded = dir.join("generated.safetensors");
        eprintln!(
            "{spec}: sharded over 2 ranks vs 1 rank: max |diff| prefill {} decode {}; tokens {}",
            max_abs_diff(&sharded, &one, "prefill_logits"),
            max_abs_diff(&sharded, &one, "decode_logits"),
            if max_abs_diff(&sharded, &one, "tokens") == 0.0 {
                "equal"
            } else {
                "differ"
            }
        );
    }
}

#[test]
fn one_rank_is_an_unsharded_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("q");
    init("qwen3-0.6b-tiny", &dir);
    let launched = tmp.path().join("launched.safetensors");
    let (o, _) = launch(
        1,
        &[
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            IDS,
            "--decode-steps",
            STEPS,
            "--out",
            launched.to_str().unwrap(),
        ],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(!t.contains("tensor parallel"), "{t}");
    let plain = tmp.path().join("plain.safetensors");
    let o = Command::new(ARCHGEN)
        .args(["--quiet", "logits", "--model"])
        .arg(&dir)
        .args(["--prompt-ids", IDS, "--decode-steps", STEPS, "--out"])
        .arg(&plain)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(tensors(&launched) == tensors(&plain));
}

#[test]
fn launch_refuses_bad_settings_before_starting_anything() {
    let run = |args: &[&str]| {
        let o = Command::new(ARCHGEN).args(args).output().unwrap();
        (o.status.code(), text(&o))
    };
    let (code, t) = run(&["launch", "--grace=-1", "--", "logits"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains("--grace -1: expected a number of seconds, 0 or more"),
        "{t}"
    );
    let (code, t) = run(&["launch", "--hosts", "10.1.2.3", "--", "logits"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains("archgen launch starts ranks on this machine only"),
        "{t}"
    );
    let (code, t) = run(&["launch", "-n", "0", "--", "logits"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("-n 0: a launch needs at least one rank"), "{t}");
    // No command: a usage error.
    let (code, _) = run(&["launch", "-n", "2"]);
    assert_eq!(code, Some(2));
    // A launched rank runs logits or generate only.
    let o = Command::new(ARCHGEN)
        .args(["serve", "--model", "nowhere"])
        .env("MLX_RANK", "0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("a launched rank runs `logits` or `generate` only"));
}

/// Every rank must draw the same tokens, and a rank without `--seed` would
/// pick a fresh seed of its own: a sampled run without one is refused; with
/// one it runs.
#[test]
fn a_sampled_tensor_parallel_run_needs_a_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("q");
    init("qwen3-0.6b-tiny", &dir);
    let launch = |extra: &[&str]| {
        let port = free_ports(2).to_string();
        Command::new(ARCHGEN)
            .args(["launch", "-n", "2", "-p", &port, "--timeout", "100"])
            .args(["--", "generate", "--model"])
            .arg(&dir)
            .args(["--prompt-ids", "1,2,3", "--max-tokens", "6", "--ignore-eos"])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = launch(&["--temp", "1.5"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("needs --seed S"), "{}", text(&o));
    let o = launch(&["--temp", "1.5", "--seed", "5"]);
    assert!(o.status.success(), "{}", text(&o));
    let tokens = String::from_utf8_lossy(&o.stdout);
    assert_eq!(tokens.split_whitespace().count(), 6, "{}", text(&o));
}
