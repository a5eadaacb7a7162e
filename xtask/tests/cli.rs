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
    let bad = repo().join("codegen/spec/tests/bad/odd-head-dim.yaml");
    let o = xtask(&["spec", "check", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("xtask: error: 1 of 1 spec(s) have errors"));
    let o = xtask(&["spec", "show", "no-such-spec"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let good = repo().join("specs/gemma4-e2b-tiny.yaml");
    let o = xtask(&["spec", "check", good.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}
