//! The `archgen` binary end to end: it runs a tiny checkpoint, and bad input
//! gets one clear message and a non-zero exit, never a panic.

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

/// A clean failure: exit 1, an `archgen: error:` line naming `what`, no panic.
fn assert_clean_error(o: &Output, what: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {e}");
    assert!(e.contains("archgen: error:"), "stderr: {e}");
    assert!(e.contains(what), "expected '{what}' in: {e}");
    assert!(!e.contains("panicked"), "panic: {e}");
}

fn tiny_model(root: &Path) -> String {
    run_python(
        "run_oracle.py",
        &[
            "--cases-out".as_ref(),
            root.as_os_str(),
            "--only".as_ref(),
            "e2b-tiny-bf16".as_ref(),
        ],
    );
    root.join("e2b-tiny-bf16/model").display().to_string()
}

#[test]
fn runs_a_tiny_checkpoint_and_rejects_bad_input() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_model(root.path());

    // generate: greedy and seeded sampling both run end to end.
    let o = archgen(&[
        "generate",
        "--model",
        &model,
        "--prompt-ids",
        "2,5,9",
        "--max-tokens",
        "6",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .count(),
        6
    );
    assert!(stderr(&o).contains("tokens/s"), "{}", stderr(&o));
    let sampled = |seed: &str| {
        let o = archgen(&[
            "generate",
            "--model",
            &model,
            "--prompt-ids",
            "2,5,9",
            "--max-tokens",
            "8",
            "--temp",
            "1.5",
            "--top-p",
            "0.9",
            "--seed",
            seed,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(sampled("7"), sampled("7"), "same seed, same tokens");

    // logits writes the three tensors of the protocol.
    let out = root.path().join("out.safetensors");
    let o = archgen(&[
        "logits",
        "--model",
        &model,
        "--prompt-ids",
        "1,2,3",
        "--decode-steps",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = archgen_runtime::Array::load_safetensors(&out).unwrap();
    assert_eq!(t["prefill_logits"].shape(), &[3, 512]);
    assert_eq!(t["decode_logits"].shape(), &[2, 512]);
    assert_eq!(t["tokens"].shape(), &[2]);

    let out_s = out.to_str().unwrap();
    let base = |extra: &[&str]| {
        let mut v = vec!["logits", "--model", &model, "--out", out_s];
        v.extend_from_slice(extra);
        archgen(&v)
    };
    assert_clean_error(&base(&["--prompt-ids", "1,x,3"]), "item 2 ('x')");
    assert_clean_error(
        &base(&["--prompt-ids", "1,99999"]),
        "out of the vocabulary (size 512)",
    );
    assert_clean_error(
        &base(&["--prompt-ids", "1", "--impl", "fast"]),
        "'fast' is not one of",
    );
    assert_clean_error(
        &base(&["--prompt-ids", "1", "--impl", "generated"]),
        "--impl generated",
    );
    assert_clean_error(
        &archgen(&[
            "logits",
            "--model",
            "/nonexistent",
            "--prompt-ids",
            "1",
            "--out",
            out_s,
        ]),
        "/nonexistent: not a directory",
    );

    // An unsupported model type in config.json.
    let bad = root.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    std::fs::copy(
        Path::new(&model).join("model.safetensors"),
        bad.join("model.safetensors"),
    )
    .unwrap();
    let o = archgen(&[
        "logits",
        "--model",
        bad.to_str().unwrap(),
        "--prompt-ids",
        "1",
        "--out",
        out_s,
    ]);
    assert_clean_error(&o, "llama");
}
