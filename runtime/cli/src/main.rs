//! `archgen`: run a checkpoint (logits for the parity protocol, generate,
//! chat, an OpenAI-compatible server, embeddings), write a random-weight one from a spec
//! (init), list the speed levers, or print shell completions.
//! `archgen --help` and `archgen SUBCOMMAND --help` list every flag;
//! docs/cli.md has the exit codes.

mod args;
mod batch;
mod chat;
mod chat_template;
mod checkpoint;
mod constrained;
mod embed;
mod engine;
mod generate;
mod init;
mod kernel_cache;
mod launch;
mod levers;
mod logits;
mod run;
mod sampling;
mod serve;
mod thinking;
mod tokens;
mod ui;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

/// Status 1: the command ran and failed.
const RUNTIME_ERROR: u8 = 1;

fn main() -> ExitCode {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return report_usage(e),
    };
    match run::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(run::Failure::Usage(e)) => report_usage(e),
        Err(run::Failure::Runtime(message)) => {
            eprintln!("archgen: error: {message}");
            ExitCode::from(RUNTIME_ERROR)
        }
    }
}

/// Prints clap's help, version or usage error and returns its status: 0 for
/// --help and --version, 2 for a usage error (prefixed `archgen: ` like every
/// other error, with clap's suggestion for a mistyped flag).
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
    eprint!("archgen: {text}");
    ExitCode::from(code)
}
