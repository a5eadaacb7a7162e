//! The dispatcher: joins a tensor-parallel group where the command runs on
//! ranks, then hands each command to its module.

use crate::args::{Cli, Command};
use crate::ui::Ui;

/// Why a command failed: a usage error found after parsing (exit status 2)
/// or a failure while running (exit status 1).
#[derive(Debug)]
pub enum Failure {
    Usage(clap::Error),
    Runtime(String),
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::Runtime(message)
    }
}

pub fn run(cli: Cli) -> Result<(), Failure> {
    // Commands that run MLX's kernels point its CUDA kernel cache at a
    // persistent folder first: before any thread starts and before MLX
    // reads the variable (kernel_cache.rs). The run's copy of that folder
    // lives until the run ends; dropping it hands the new kernels over.
    let (kernel_cache, _staged_kernels) = match &cli.command {
        Command::Logits(_)
        | Command::Generate(_)
        | Command::Chat(_)
        | Command::Serve(_)
        | Command::Embed(_)
        | Command::Init(_) => crate::kernel_cache::persist_compiled_kernels(),
        Command::Launch(_) | Command::Levers(_) | Command::Completions(_) => (None, None),
    };
    // A rank of a tensor-parallel run (started by `archgen launch` or
    // mlx.launch) joins its group first; ranks other than 0 stay quiet.
    let group = match &cli.command {
        Command::Logits(_) | Command::Generate(_) => crate::launch::join_from_env()?,
        Command::Chat(_)
        | Command::Serve(_)
        | Command::Embed(_)
        | Command::Init(_)
        | Command::Launch(_)
            if std::env::var_os("MLX_RANK").is_some() =>
        {
            return Err(Failure::Runtime(
                "MLX_RANK is set: a launched rank runs `logits` or `generate` only \
                 (chat, serve, embed, init and launch run as one process)"
                    .into(),
            ));
        }
        Command::Chat(_)
        | Command::Serve(_)
        | Command::Embed(_)
        | Command::Init(_)
        | Command::Launch(_)
        | Command::Levers(_)
        | Command::Completions(_) => None,
    };
    let rank = group.map_or(0, |g| g.rank());
    let ui = Ui::new(cli.quiet || rank != 0);
    if let Some(note) = kernel_cache {
        ui.note(&note);
    }
    match cli.command {
        Command::Init(args) => Ok(crate::init::init(&ui, &args)?),
        Command::Launch(args) => Ok(crate::launch::launch(&args)?),
        Command::Logits(args) => match &args.prompt_ids {
            Some(ids) => Ok(crate::logits::logits(&ui, &args, ids, rank == 0)?),
            None => Ok(crate::batch::logits(&ui, &args)?),
        },
        Command::Generate(args) => {
            let prompt = args.prompt().map_err(Failure::Usage)?;
            let params = args.sampling.params("generate").map_err(Failure::Usage)?;
            let ranks = group.map_or(1, |g| g.size() as usize);
            let to = crate::generate::Destination {
                prints: rank == 0,
                ranks,
            };
            Ok(crate::generate::generate(&ui, &args, &prompt, params, to)?)
        }
        Command::Chat(args) => {
            let params = args.sampling.params("chat").map_err(Failure::Usage)?;
            Ok(crate::chat::chat(&ui, &args, params)?)
        }
        Command::Serve(args) => Ok(crate::serve::serve(ui, &args)?),
        Command::Embed(args) => Ok(crate::embed::embed(&ui, &args)?),
        Command::Levers(args) => {
            print!("{}", crate::levers::list(args.format));
            Ok(())
        }
        Command::Completions(args) => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(args.shell, &mut cmd, "archgen", &mut std::io::stdout());
            Ok(())
        }
    }
}
