//! `cargo xtask` arguments (clap derive): one struct per task, so a new task
//! is one more variant of [`Task`] and a new flag one more field.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// What the exit status means (shown under `cargo xtask --help`, docs/cli.md).
pub const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  the task ran and failed (invalid specs, stale generated files, a failed
     build or test step)
  2  usage error (unknown task or flag, a missing or invalid value); nothing
     was run";

#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    version,
    about = "archgen's project tasks: setup, test, spec, gen, diff, bench",
    after_help = EXIT_CODES,
    propagate_version = true,
    arg_required_else_help = true,
    args_override_self = true
)]
pub struct Cli {
    /// No progress bars (they are also off when stderr is not a terminal)
    #[arg(long, short, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub task: Task,
}

#[derive(Debug, Subcommand)]
pub enum Task {
    /// Install what the build and tests need (apt packages; .venv with
    /// mlx[cpu]==0.32.2 and mlx-lm==0.32.2); safe to run again
    Setup,
    /// Setup, then the whole suite: fmt check, clippy, spec check, schema
    /// check, cargo test
    Test(TestArgs),
    /// Architecture specs: check, show, import, schema
    #[command(arg_required_else_help = true)]
    Spec {
        #[command(subcommand)]
        command: SpecCommand,
    },
    /// Generate model files from specs: NAME... | --all | --check
    Gen(GenArgs),
    /// Per model, what changed in generated plans and code since BASE
    Diff(DiffArgs),
    /// Decode/prefill timings: generated vs monolith vs mlx-lm
    /// (docs/benchmarks.md)
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Extra arguments for `cargo test --workspace` (e.g. a test name filter)
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CARGO_TEST_ARGS"
    )]
    pub cargo_test_args: Vec<String>,
}

/// How spec errors are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum MessageFormat {
    /// file:line:column, the message, the source line with a caret under
    /// the span, and the hint, on stderr
    #[default]
    Human,
    /// One JSON object per line on stdout (docs/errors.md#json-messages)
    Json,
}

#[derive(Debug, Clone, Copy, Default, Args)]
pub struct FormatArgs {
    /// How to print spec errors: human (with source excerpts) or json (one
    /// object per line on stdout, for editors and CI)
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = MessageFormat::Human)]
    pub message_format: MessageFormat,
}

#[derive(Debug, Subcommand)]
pub enum SpecCommand {
    /// Validate every spec in specs/ (or the given files); prints all errors,
    /// fails on any
    Check(CheckArgs),
    /// The resolved spec: a per-layer table, or with --json config.json
    /// (text_config) field names, keys sorted
    Show(ShowArgs),
    /// Turn an mlx-lm / Hugging Face config.json into specs/NAME.yaml
    /// (mlx-lm 0.32.2 defaults, listed)
    Import(ImportArgs),
    /// Write specs/schema/archgen-spec.schema.json, or fail if it is stale
    Schema(SchemaArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Spec files to check (default: every specs/*.yaml)
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    #[command(flatten)]
    pub format: FormatArgs,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A spec name (specs/NAME.yaml) or a path to a .yaml file
    #[arg(value_name = "NAME|PATH")]
    pub name: String,
    /// Print config.json (text_config) field names as JSON instead of the table
    #[arg(long)]
    pub json: bool,
    /// Add the plan's tensor-parallel split over N ranks (as `archgen launch -n N` runs it)
    #[arg(long, value_name = "N", conflicts_with = "json")]
    pub tensor_parallel: Option<usize>,
    #[command(flatten)]
    pub format: FormatArgs,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// A model directory holding config.json, or a config.json file
    #[arg(value_name = "MODEL_DIR|CONFIG_JSON")]
    pub input: PathBuf,
    /// The spec name; writes NAME.yaml
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// mlx-optiq kv_config.json (default: MODEL_DIR/kv_config.json when present)
    #[arg(long, value_name = "FILE")]
    pub kv_config: Option<PathBuf>,
    /// Apply kv_config.json as mlx-optiq's install_mixed_kv does, from this offset
    /// (spec `mixed_kv`, tier L2; default: from the kv_scheme.json beside it, if any)
    #[arg(long, value_name = "N")]
    pub quantized_kv_start: Option<u32>,
    /// Overwrite an existing spec
    #[arg(long)]
    pub force: bool,
    /// Directory to write NAME.yaml into (default: specs/)
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// Write nothing; fail if the checked-in schema is stale
    #[arg(long)]
    pub check: bool,
}

#[derive(Debug, Args)]
#[command(arg_required_else_help = true)]
pub struct GenArgs {
    /// Specs to regenerate (specs/NAME.yaml), with the registry
    #[arg(value_name = "NAME", conflicts_with_all = ["all", "check"])]
    pub names: Vec<String>,
    /// Regenerate every spec (removes orphaned files)
    #[arg(long, conflicts_with = "check")]
    pub all: bool,
    /// Compare generated/ with what the specs give; writes nothing
    #[arg(long)]
    pub check: bool,
    #[command(flatten)]
    pub format: FormatArgs,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The git revision to compare with
    #[arg(value_name = "BASE", default_value = "HEAD")]
    pub base: String,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A short smoke run; writes no docs
    #[arg(long)]
    pub quick: bool,
    /// Bench only these specs (repeatable); a partial run leaves
    /// docs/benchmarks.md alone
    #[arg(long = "spec", value_name = "NAME")]
    pub specs: Vec<String>,
    /// Decode steps one at a time, as the change log's CPU runs 1-11
    /// were measured (needs --spec or --quick)
    #[arg(long)]
    pub sequential: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn test_passes_every_later_argument_to_cargo_test() {
        let cli = Cli::try_parse_from(["xtask", "test", "parity", "--", "--nocapture"]).unwrap();
        let Task::Test(args) = cli.task else {
            panic!("not test: {cli:?}")
        };
        assert_eq!(args.cargo_test_args, ["parity", "--", "--nocapture"]);
        // A leading flag for cargo test goes through too.
        let cli = Cli::try_parse_from(["xtask", "test", "--release", "-q"]).unwrap();
        let Task::Test(args) = cli.task else {
            panic!("not test: {cli:?}")
        };
        assert_eq!(args.cargo_test_args, ["--release", "-q"]);
    }

    #[test]
    fn bench_specs_repeat() {
        let cli = Cli::try_parse_from(["xtask", "bench", "--spec", "a", "--quick", "--spec", "b"])
            .unwrap();
        let Task::Bench(args) = cli.task else {
            panic!("not bench: {cli:?}")
        };
        assert!(args.quick);
        assert_eq!(args.specs, ["a", "b"]);
    }
}
