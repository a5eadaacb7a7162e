//! `cargo xtask <task>`: the project's tasks, one entry point.
//! This crate must build without MLX (the setup task installs MLX).

mod bench;
mod gen;
mod setup;
mod spec;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [args]

tasks:
  setup        install what the build and tests need (apt packages, .venv with
               mlx[cpu]==0.32.2 and mlx-lm==0.32.2); safe to run again
  test         setup, then the whole suite: fmt check, clippy, spec check,
               schema check, cargo test
  spec         architecture specs: check, show, import, schema (`spec help`)
  gen          generate model files from specs: NAME... | --all | --check
  diff [BASE]  per model, what changed in generated plans and code since BASE
  bench [--quick]  decode/prefill timings: generated vs monolith vs mlx-lm
               (docs/benchmarks.md); --quick: a short smoke, writes no docs
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match task.as_str() {
        "setup" => setup::setup(),
        "test" => setup::test(rest),
        "spec" => spec::run(rest),
        "gen" => gen::run(rest),
        "diff" => gen::diff(rest),
        "bench" => bench::run(rest),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown task '{other}'\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: error: {message}");
            ExitCode::FAILURE
        }
    }
}
