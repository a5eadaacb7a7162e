//! `setup` and `test`: bring a machine to a working state, then run everything CI runs.

use crate::root::repo_root;
use std::process::Command;

fn run(what: &str, command: &mut Command) -> Result<(), String> {
    eprintln!("xtask: {what}");
    let status = command
        .current_dir(repo_root())
        .status()
        .map_err(|e| format!("could not start `{what}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{what}` failed ({status})"))
    }
}

pub fn setup() -> Result<(), String> {
    run(
        "runtime/mlx-linux/setup.sh",
        Command::new("bash").arg("runtime/mlx-linux/setup.sh"),
    )
}

/// Setup, then formatting, lints, spec and schema checks and the whole test suite. `.ci/run` calls this.
/// Extra arguments go to `cargo test` (e.g. a test name filter).
pub fn test(extra: &[String]) -> Result<(), String> {
    setup()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(
        "cargo fmt --all --check",
        Command::new(&cargo).args(["fmt", "--all", "--check"]),
    )?;
    run(
        "cargo clippy --workspace --all-targets -- -D warnings",
        Command::new(&cargo).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    eprintln!("xtask: spec check");
    crate::spec::check(&crate::cli::CheckArgs {
        paths: Vec::new(),
        format: Default::default(),
    })?;
    eprintln!("xtask: spec schema --check");
    crate::spec::schema(true)?;
    run(
        "cargo test --workspace",
        Command::new(&cargo)
            .args(["test", "--workspace"])
            .args(extra),
    )
}
