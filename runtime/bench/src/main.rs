//! `archgen-bench`: the benchmark behind `cargo xtask bench` (docs/benchmarks.md).
//!
//!   archgen-bench run [--quick] [OPTIONS]   drive a whole benchmark (driver.rs)
//!   archgen-bench worker --impl generated|monolith --model DIR
//!                                           one implementation, timed on command
//!                                           (worker.rs; mlx-lm's worker is
//!                                           tests/python/bench_mlx_lm.py)

mod driver;
mod plan;
mod report;
mod results;
mod worker;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("worker") => worker::main(&args[1..]),
        Some("run") => match driver::main(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("archgen-bench: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("{}", driver::USAGE);
            ExitCode::from(2)
        }
    }
}
