//! `archgen`: run a Gemma-4 checkpoint directory.
//!
//!   archgen logits --model DIR --prompt-ids 1,2,3 --decode-steps N
//!                  [--impl monolith|generated|auto] --out FILE.safetensors
//!   archgen generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)
//!                  [--max-tokens N] [--temp T] [--top-p P] [--seed S]
//!                  [--ignore-eos]

mod args;
mod chat;
mod chat_template;
mod engine;
mod init;
mod run;
mod serve;

use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match args::parse(&argv).and_then(run::run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("archgen: error: {message}");
            ExitCode::FAILURE
        }
    }
}
