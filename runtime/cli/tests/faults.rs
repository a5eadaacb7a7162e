//! The `archgen` binary on corrupted checkpoints: one `archgen: error:` line
//! naming the problem, exit status 1, no panic, no abort.

use std::process::Command;

use archgen_tests::faults::{faults, Bases};

#[test]
fn corrupted_checkpoints_exit_with_one_clear_error() {
    let bases = Bases::build();
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for fault in faults() {
        let dir = bases.make(&fault, tmp.path());
        let o = Command::new(env!("CARGO_BIN_EXE_archgen"))
            .args(["generate", "--model"])
            .arg(&dir)
            .args(["--prompt-ids", "2,5,9", "--max-tokens", "2"])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        let problems = [
            (o.status.code() != Some(1), "exit status is not 1"),
            (e.matches("archgen: error:").count() != 1, "not one error"),
            (e.contains("panicked"), "panic"),
            (!o.stdout.is_empty(), "output on stdout"),
            (
                !fault.expect.iter().all(|p| e.contains(p)),
                "message lacks the expected pieces",
            ),
        ];
        for (bad, what) in problems {
            if bad {
                failures.push(format!("{}: {what} ({}): {e}", fault.name, o.status));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
