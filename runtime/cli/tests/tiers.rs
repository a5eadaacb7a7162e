//! Parity tiers on the command line: `logits` and `generate` state the tier of
//! the run, `--require-tier` refuses a run below it (exit status 1, nothing
//! run), and an L2 checkpoint written by `archgen init` (kv_config.json plus
//! kv_scheme.json) gives mlx-optiq's bytes through both implementations.

use std::path::Path;
use std::process::{Command, Output};

use archgen_tests::run_python;

fn archgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_archgen"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn init(spec: &str, dir: &Path) {
    let repo = archgen_tests::repo_root();
    let o = archgen(&[
        "init",
        "--spec",
        repo.join(format!("specs/{spec}.yaml")).to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--seed",
        "5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

const IDS: &str = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17";

fn logits(dir: &Path, imp: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        IDS,
        "--decode-steps",
        "9",
        "--impl",
        imp,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    archgen(&args)
}

#[test]
fn runs_state_their_tier_and_require_tier_refuses_below_it() {
    let root = tempfile::tempdir().unwrap();
    let l1 = root.path().join("l1");
    let l2 = root.path().join("l2");
    init("qwen3-0.6b-tiny", &l1);
    init("qwen3-0.6b-tiny-mixed-kv", &l2);
    assert!(l2.join("kv_config.json").is_file() && l2.join("kv_scheme.json").is_file());
    let out = root.path().join("o.safetensors");

    // L1: stated, and both requirements hold.
    for req in [None, Some("L1"), Some("L2")] {
        let extra: Vec<&str> = req.iter().flat_map(|r| ["--require-tier", *r]).collect();
        let o = logits(&l1, "auto", &out, &extra);
        assert!(o.status.success(), "{req:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("archgen: parity tier L1 (bit-exact with mlx-lm 0.32.2)"),
            "{}",
            stderr(&o)
        );
    }

    // L2: stated with its reason; --require-tier L2 runs, L1 refuses.
    let o = logits(&l2, "generated", &out, &["--require-tier", "L2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "archgen: parity tier L2: per-layer mixed KV (mlx-optiq install_mixed_kv, \
             quantized_kv_start 0; layers 0: 8-bit g32, 2: 4-bit g32)"
        ),
        "{}",
        stderr(&o)
    );
    std::fs::remove_file(&out).unwrap();
    let o = logits(&l2, "monolith", &out, &["--require-tier", "L1"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("archgen: error: --require-tier L1: refusing to run")
            && e.contains("its parity tier is L2: per-layer mixed KV"),
        "{e}"
    );
    assert!(!e.contains("panicked"), "{e}");
    assert!(!out.exists(), "a refused run wrote {}", out.display());

    // generate refuses the same way, and runs with the tier stated.
    let gen = |req: &str| {
        archgen(&[
            "generate",
            "--model",
            l2.to_str().unwrap(),
            "--prompt-ids",
            IDS,
            "--max-tokens",
            "4",
            "--require-tier",
            req,
        ])
    };
    let o = gen("L1");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--require-tier L1: refusing"),
        "{}",
        stderr(&o)
    );
    let o = gen("L2");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("parity tier L2"), "{}", stderr(&o));

    // Not a tier: a usage error (status 2), nothing run.
    let o = logits(&l2, "auto", &out, &["--require-tier", "L4"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--require-tier"), "{}", stderr(&o));
}

#[test]
fn an_initialised_l2_checkpoint_gives_mlx_optiqs_bytes() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    init("gemma4-12b-tiny-mixed-kv", &dir);
    let mut outs = Vec::new();
    for imp in ["generated", "monolith"] {
        let out = root.path().join(format!("{imp}.safetensors"));
        let o = logits(&dir, imp, &out, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        outs.push(out);
    }
    // 17 prompt tokens, then 9 steps: the cache passes quantized_kv_start (24)
    // during decode, so both the plain and the converted cache are exercised.
    let oracle = root.path().join("optiq.safetensors");
    run_python(
        "optiq_oracle.py",
        &[
            "--model".as_ref(),
            dir.as_os_str(),
            "--prompt-ids".as_ref(),
            IDS.as_ref(),
            "--decode-steps".as_ref(),
            "9".as_ref(),
            "--out".as_ref(),
            oracle.as_os_str(),
        ],
    );
    let load = |p: &Path| archgen_runtime::Array::load_safetensors(p).unwrap();
    let (g, m, r) = (load(&outs[0]), load(&outs[1]), load(&oracle));
    for k in ["prefill_logits", "decode_logits", "tokens"] {
        let bytes = |t: &std::collections::HashMap<String, archgen_runtime::Array>| {
            archgen_runtime::bytes::array_bytes(&t[k]).unwrap()
        };
        assert_eq!(bytes(&g), bytes(&m), "{k}: generated != monolith");
        assert_eq!(bytes(&m), bytes(&r), "{k}: monolith != mlx-optiq");
    }
}

/// A Gemma-2 with grouped-query attention: one sequence is L1; a batch of
/// several (`logits --batch`) is L3 with the reason stated (mlx-lm's gemma2
/// cannot mask such a batch row by row; archgen does), runs, and is refused
/// under `--require-tier L1`.
#[test]
fn gemma2_grouped_query_batches_state_tier_l3() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("g2");
    init("gemma-2-2b-tiny", &dir);
    let out = root.path().join("o.safetensors");
    let o = logits(&dir, "auto", &out, &["--require-tier", "L1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("parity tier L1"), "{}", stderr(&o));

    let schedule = root.path().join("s.json");
    std::fs::write(
        &schedule,
        r#"{"prefill_step_size": 4, "sequences": [
            {"prompt": [1, 2, 3, 4, 5], "arrival": 0, "decode": 3},
            {"prompt": [6, 7], "arrival": 0, "decode": 4},
            {"prompt": [8, 9, 10], "arrival": 1, "decode": 2}]}"#,
    )
    .unwrap();
    let batch = |extra: &[&str]| {
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
        archgen(&args)
    };
    std::fs::remove_file(&out).unwrap();
    let o = batch(&[]);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("parity tier L3: batches of several sequences without an oracle")
            && e.contains("gemma2"),
        "{e}"
    );
    assert!(out.exists());
    std::fs::remove_file(&out).unwrap();
    let o = batch(&["--require-tier", "L1"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("--require-tier L1: refusing"), "{e}");
    assert!(!out.exists());
}
