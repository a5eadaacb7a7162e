//! The `cargo xtask` command line: --help for every task, --version, a
//! suggestion for a mistyped flag or task, and the documented exit statuses
//! (0 ok, 1 the task failed, 2 usage error).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .env("ARCHGEN_ROOT", repo())
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn every_task_and_spec_command_has_help() {
    for args in [
        &["setup", "--help"][..],
        &["test", "--help"],
        &["spec", "--help"],
        &["spec", "check", "--help"],
        &["spec", "show", "--help"],
        &["spec", "import", "--help"],
        &["spec", "schema", "--help"],
        &["gen", "--help"],
        &["diff", "--help"],
        &["bench", "--help"],
        &["help", "gen"],
        &["spec", "help", "import"],
    ] {
        let o = xtask(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        let usage = format!(
            "Usage: cargo xtask {}",
            args.iter()
                .filter(|a| !a.starts_with('-') && **a != "help")
                .copied()
                .collect::<Vec<_>>()
                .join(" ")
        );
        assert!(stdout(&o).contains(&usage), "{args:?}: {}", stdout(&o));
    }
    let o = xtask(&["spec", "import", "--help"]);
    for flag in ["--name", "--kv-config", "--force", "--out"] {
        assert!(stdout(&o).contains(flag), "import --help lacks {flag}");
    }
    let o = xtask(&["--version"]);
    assert_eq!(
        stdout(&o).trim(),
        format!("xtask {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn mistakes_get_suggestions_and_status_2() {
    for (args, tip) in [
        (
            &["gen", "--chek"][..],
            "a similar argument exists: '--check'",
        ),
        (&["spec", "chek"], "'check'"),
        (&["bench", "--quik"], "a similar argument exists: '--quick'"),
        (
            &["spec", "show", "x", "--jsn"],
            "a similar argument exists: '--json'",
        ),
    ] {
        let o = xtask(args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.starts_with("xtask: error:"), "{args:?}: {e}");
        assert!(e.contains(tip), "{args:?}: {e}");
    }
    // No task, no gen mode, or two gen modes: usage, status 2, nothing run.
    for args in [&[][..], &["gen"], &["gen", "--all", "--check"], &["spec"]] {
        let o = xtask(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("Usage: cargo xtask"), "{args:?}");
    }
}

#[test]
fn a_failing_task_exits_1() {
    let bad = repo().join("codegen/families/tests/bad/odd-head-dim.yaml");
    let o = xtask(&["spec", "check", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("xtask: error: 1 of 1 spec(s) have errors"));
    let o = xtask(&["spec", "show", "no-such-spec"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let good = repo().join("specs/gemma4-e2b-tiny.yaml");
    let o = xtask(&["spec", "check", good.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn spec_errors_show_the_source_line_with_a_caret() {
    let bad = repo().join("codegen/families/tests/bad/unknown-field.yaml");
    let o = xtask(&["spec", "check", bad.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    // The catalogue line, unchanged, then the excerpt, then the hint.
    let lines: Vec<&str> = e.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.ends_with(":11:3: error at model.hiden_size: unknown field `hiden_size` (expected one of `hidden_size`, `vocab_size`, `rms_norm_eps`, `tie_word_embeddings`, `final_logit_softcapping`, `max_position_embeddings`)"))
        .unwrap_or_else(|| panic!("{e}"));
    assert_eq!(lines[at + 2], "11 |   hiden_size: 64", "{e}");
    assert_eq!(lines[at + 3], "   |   ^^^^^^^^^^", "{e}");
    assert!(lines[at + 4..]
        .contains(&"  hint: check the spelling; docs/spec-format.md lists every field"));
    assert!(
        !e.contains('\u{1b}'),
        "no colour when stderr is not a terminal"
    );
}

#[test]
fn message_format_json_prints_one_object_per_line() {
    let bad = repo().join("codegen/families/tests/bad/errors-in-several-sections.yaml");
    let good = repo().join("specs/gemma4-e2b-tiny.yaml");
    let o = xtask(&[
        "spec",
        "check",
        "--message-format",
        "json",
        good.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let objects: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let types: Vec<&str> = objects
        .iter()
        .map(|v| v["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "spec",
            "spec",
            "diagnostic",
            "diagnostic",
            "diagnostic",
            "diagnostic",
            "summary"
        ]
    );
    assert_eq!(objects[0]["status"], "ok");
    assert_eq!(objects[1]["status"], "error");
    assert_eq!(objects[1]["errors"], 4);
    let d = &objects[2];
    assert!(d["file"]
        .as_str()
        .unwrap()
        .ends_with("errors-in-several-sections.yaml"));
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(11), Some(16))
    );
    assert!(d["end_column"].as_u64().unwrap() > 16);
    assert_eq!(d["path"], "model.hidden_size");
    assert_eq!(d["message"], "0 is out of range");
    assert_eq!(d["expected"], "an integer in 1..=65536");
    assert_eq!(d["hint"], "the model width (`hidden_size`)");
    assert!(d["rendered"].as_str().unwrap().contains('^'));
    assert_eq!(objects[6]["specs"], 2);
    assert_eq!(objects[6]["failed"], 1);
    // stderr: only the task's one-line error.
    assert_eq!(
        stderr(&o).trim(),
        "xtask: error: 1 of 2 spec(s) have errors"
    );
    // All good: JSON and exit 0.
    let o = xtask(&[
        "spec",
        "check",
        "--message-format",
        "json",
        good.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o)
        .lines()
        .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
}
