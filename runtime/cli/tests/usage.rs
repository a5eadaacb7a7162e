//! The `archgen` command line itself (no checkpoint needed): --help for every
//! subcommand, --version, a suggestion for a mistyped flag, completion scripts,
//! and the documented exit statuses (0 ok, 1 failed while running, 2 usage).

use std::path::Path;
use std::process::{Command, Output};

fn archgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_archgen"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const SUBCOMMANDS: [&str; 7] = [
    "logits",
    "generate",
    "embed",
    "init",
    "launch",
    "levers",
    "completions",
];

#[test]
fn every_subcommand_has_help() {
    for sub in SUBCOMMANDS {
        for form in [vec![sub, "--help"], vec![sub, "-h"], vec!["help", sub]] {
            let o = archgen(&form);
            let out = stdout(&o);
            assert_eq!(o.status.code(), Some(0), "{form:?}: {}", stderr(&o));
            assert!(
                out.contains(&format!("Usage: archgen {sub}")),
                "{form:?}: {out}"
            );
        }
    }
    let o = archgen(&["logits", "--help"]);
    for flag in [
        "--model",
        "--prompt-ids",
        "--decode-steps",
        "--impl",
        "--out",
    ] {
        assert!(stdout(&o).contains(flag), "logits --help lacks {flag}");
    }
    let o = archgen(&["generate", "--help"]);
    for flag in [
        "--prompt ",
        "--prompt-ids",
        "--max-tokens",
        "--temp",
        "--top-p",
        "--seed",
        "--ignore-eos",
        "--impl",
    ] {
        assert!(stdout(&o).contains(flag), "generate --help lacks {flag}");
    }
    let top = archgen(&["--help"]);
    assert_eq!(top.status.code(), Some(0));
    for sub in SUBCOMMANDS {
        assert!(stdout(&top).contains(sub), "--help lacks {sub}");
    }
    assert!(stdout(&top).contains("Exit status:"), "{}", stdout(&top));
}

#[test]
fn version_prints_the_crate_version() {
    let o = archgen(&["--version"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o).trim(),
        format!("archgen {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_mistyped_flag_gets_a_suggestion_and_status_2() {
    let o = archgen(&[
        "logits",
        "--model",
        "m",
        "--prompt-ids",
        "1",
        "--decode-step",
        "2",
        "--out",
        "o.safetensors",
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("archgen: error: unexpected argument '--decode-step' found"),
        "{e}"
    );
    assert!(
        e.contains("a similar argument exists: '--decode-steps'"),
        "{e}"
    );
    assert!(o.stdout.is_empty());
    // A mistyped subcommand too.
    let o = archgen(&["generat", "--model", "m"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("similar subcommand exists: 'generate'"));
}

#[test]
fn exit_statuses_are_as_documented() {
    // 2: usage errors, before anything runs.
    for (args, what) in [
        (&[][..], "Usage: archgen"),
        (
            &["logits", "--model", "m"],
            "required arguments were not provided",
        ),
        (
            &["init", "--spec", "s.yaml", "--out", "o", "--dtype", "int8"],
            "'int8'",
        ),
        (
            &[
                "generate",
                "--model",
                "m",
                "--prompt-ids",
                "1",
                "--top-p",
                "1.5",
            ],
            "outside (0, 1]",
        ),
        (&["completions", "tcsh"], "'tcsh'"),
    ] {
        let o = archgen(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(what), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"));
    }
    // 1: the command ran and failed.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let o = archgen(&[
        "generate",
        "--model",
        missing.to_str().unwrap(),
        "--prompt-ids",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a directory"), "{}", stderr(&o));
    let o = archgen(&[
        "init",
        "--spec",
        missing.to_str().unwrap(),
        "--out",
        dir.path().join("out").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // 0: success.
    assert_eq!(archgen(&["completions", "bash"]).status.code(), Some(0));
}

#[test]
fn completion_scripts_name_every_subcommand_and_flag() {
    for (shell, marker) in [
        ("bash", "complete -F _archgen"),
        ("zsh", "#compdef archgen"),
        ("fish", "complete -c archgen"),
    ] {
        let o = archgen(&["completions", shell]);
        let script = stdout(&o);
        assert_eq!(o.status.code(), Some(0), "{shell}: {}", stderr(&o));
        assert!(script.contains(marker), "{shell}: lacks {marker}");
        for word in [
            "logits",
            "generate",
            "init",
            "levers",
            "prompt-ids",
            "decode-steps",
            "gpu-one-token-sdpa",
            "cuda-graph-cache",
        ] {
            assert!(script.contains(word), "{shell} script lacks {word}");
        }
    }
}

fn bad_spec(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../codegen/families/tests/bad")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn init_shows_spec_errors_with_the_source_line_or_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let spec = bad_spec("odd-head-dim.yaml");
    let o = archgen(&["init", "--spec", &spec, "--out", out.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains(
            ":27:13: error at attention.head_dim: 15 is odd (expected an even head dimension)"
        ),
        "{e}"
    );
    assert!(e.contains("27 |   head_dim: 15"), "{e}");
    assert!(e.contains("   |             ^^"), "{e}");
    assert!(
        e.contains("  hint: RoPE rotates pairs of dimensions"),
        "{e}"
    );
    assert!(!out.exists(), "nothing written for a bad spec");

    let o = archgen(&[
        "init",
        "--spec",
        &spec,
        "--out",
        out.to_str().unwrap(),
        "--message-format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{}", stdout(&o));
    assert_eq!(lines[0]["path"], "attention.head_dim");
    assert_eq!(
        (lines[0]["line"].as_u64(), lines[0]["column"].as_u64()),
        (Some(27), Some(13))
    );
    assert_eq!(lines[0]["end_column"], 15);
    assert!(stderr(&o).contains("archgen: error: 1 spec error (JSON on stdout)"));
}
