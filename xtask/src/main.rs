//! `cargo xtask <task>`: the project's tasks, one entry point.
//! This crate must build without MLX (the setup task installs MLX).

mod bench;
mod cli;
mod gen;
mod report;
mod root;
mod setup;
mod spec;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, SpecCommand, Task};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return report_usage(e),
    };
    let result = match cli.task {
        Task::Setup => setup::setup(),
        Task::Test(args) => setup::test(&args.cargo_test_args),
        Task::Spec { command } => match command {
            SpecCommand::Check(args) => spec::check(&args),
            SpecCommand::Show(args) => spec::show(&args),
            SpecCommand::Import(args) => spec::import_cmd(&args),
            SpecCommand::Schema(args) => spec::schema(args.check),
        },
        Task::Gen(args) => gen::run(&args, cli.quiet),
        Task::Diff(args) => gen::diff(&args.base),
        Task::Bench(args) => bench::run(&args, cli.quiet),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Prints clap's help, version or usage error and returns its status: 0 for
/// --help and --version, 2 for a usage error (prefixed `xtask: `, with clap's
/// suggestion for a mistyped flag or task).
fn report_usage(e: clap::Error) -> ExitCode {
    let code = u8::try_from(e.exit_code()).unwrap_or(2);
    if !e.use_stderr()
        || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    {
        let _ = e.print();
        return ExitCode::from(code);
    }
    let rendered = e.render();
    let text = if std::io::stderr().is_terminal() {
        rendered.ansi().to_string()
    } else {
        rendered.to_string()
    };
    eprint!("xtask: {text}");
    ExitCode::from(code)
}
