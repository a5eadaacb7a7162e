//! Command-line parsing (clap derive). Each subcommand has its own argument
//! struct, so a new subcommand is one more variant of [`Command`] and a new
//! flag is one more field.

use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::levers::{LeverFlags, ListFormat, LogitsCommand, ModelCommand, ServeCommand};

/// What the exit status means (shown under `archgen --help`, docs/cli.md).
pub const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  the command ran and failed (unreadable or invalid checkpoint or spec,
     a token id outside the vocabulary, an I/O or MLX error)
  2  usage error (unknown subcommand or flag, a missing or invalid value);
     nothing was run";

#[derive(Debug, Parser)]
#[command(
    name = "archgen",
    version,
    about = "Run language-model checkpoints on archgen's generated models or its monolith",
    long_about = "Run language-model checkpoints on archgen's generated models or its \
                  monolith, bit-for-bit with mlx-lm 0.32.2 (docs/parity.md).",
    after_help = EXIT_CODES,
    propagate_version = true,
    arg_required_else_help = true,
    args_override_self = true
)]
pub struct Cli {
    /// No progress bars and no status notes on stderr (errors still print).
    /// Progress bars are also off whenever stderr is not a terminal.
    #[arg(long, short, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write the parity protocol's logits for a prompt (docs/parity.md §2)
    #[command(
        long_about = "Write the parity protocol's tensors (docs/parity.md §2): prefill_logits \
                      [L, vocab] (one forward over the whole prompt), decode_logits [N, vocab] \
                      (N greedy one-token steps on the same cache) and tokens [N] int32 (the \
                      tokens fed), logits in the model's compute dtype.",
        after_help = EXIT_CODES
    )]
    Logits(LogitsArgs),
    /// Generate text or token ids from a prompt
    #[command(
        long_about = "Generate from a prompt. --prompt encodes TEXT with DIR/tokenizer.json \
                      (special tokens added as its post-processor says, e.g. <bos>) and prints \
                      decoded text; with --prompt-ids it prints text when DIR/tokenizer.json \
                      exists, else token ids. It stops at an EOS id from config.json / \
                      generation_config.json unless --ignore-eos is given.",
        after_help = EXIT_CODES
    )]
    Generate(GenerateArgs),
    /// Chat with a checkpoint on stdin, through its chat template
    #[command(
        long_about = "Chat with a checkpoint: each line on stdin is a user turn; the whole \
                      conversation goes through the checkpoint's chat template (chat_template \
                      in tokenizer_config.json, or chat_template.jinja) as transformers' \
                      apply_chat_template renders it, and the reply streams to stdout. /reset \
                      forgets the conversation; /exit or the end of input ends the chat. Needs \
                      DIR/tokenizer.json. Stops a reply at an EOS id from config.json / \
                      generation_config.json.",
        after_help = EXIT_CODES
    )]
    Chat(ChatArgs),
    /// Serve the OpenAI API (completions, chat completions, embeddings) over HTTP
    #[command(
        long_about = "Serve an OpenAI-compatible HTTP API: GET /v1/models (and /v1/models/ID), \
                      POST /v1/completions and POST /v1/chat/completions, streamed (server-sent \
                      events) or not, with max_tokens, temperature, top_p, top_k, min_p, \
                      repetition / presence / frequency penalties, logit_bias, seed (the one \
                      used comes back in the x-archgen-seed header), stop and usage counts; \
                      POST /v1/embeddings (last-token pooling; docs/cli.md, Embeddings); \
                      POST /tokenize and /detokenize; GET /health and GET /metrics \
                      (Prometheus text). A null field counts as absent; unknown fields are \
                      ignored and named in the x-archgen-ignored-fields header; a field the \
                      server does not serve (n > 1, ...) is a 400 \
                      naming it. response_format json_object / json_schema and tool_choice \
                      required / a named function are held by a grammar (constrained \
                      decoding). --api-key wants a bearer key on every route but /health; \
                      --allowed-origins answers browsers (CORS). The model runs on one thread whose \
                      scheduler keeps up to --max-batch sequences in flight, interleaving \
                      prompt chunks of --prefill-step tokens with one decode step of every \
                      sequence; up to --max-queue more requests wait (past that: 429). A \
                      request the server cannot serve (past the model's context, or a \
                      --max-prompt-tokens / --max-tokens ceiling) gets a 400 with an \
                      OpenAI-style error body before any compute; a client that disconnects \
                      has its sequence dropped at the next step. SIGTERM or Ctrl-C drains: \
                      /health and new requests answer 503, in-flight requests finish (for at \
                      most --drain-seconds), then the listener closes; exit 0. Needs DIR/tokenizer.json; /v1/chat/completions also needs a chat \
                      template.",
        after_help = EXIT_CODES
    )]
    Serve(ServeArgs),
    /// Embed texts with an embedding checkpoint (e.g. Qwen3-Embedding)
    #[command(
        long_about = "Embed texts with an embedding checkpoint (e.g. Qwen3-Embedding): each \
                      text is encoded with DIR/tokenizer.json (special tokens added as its \
                      post-processor says) and run as one forward; its embedding is the final \
                      norm's output (the LM head's input) pooled and normalised as the \
                      checkpoint's sentence-transformers files say (modules.json, \
                      1_Pooling/config.json, a Normalize module), or last-token pooling and L2 \
                      normalisation when it has none (a note on stderr says which), in the \
                      model's compute dtype. --format json prints OpenAI's embeddings list \
                      (float values); --format safetensors writes `embeddings` [N, hidden] in \
                      the compute dtype to --out.",
        after_help = EXIT_CODES
    )]
    Embed(EmbedArgs),
    /// Write a random-weight checkpoint with a spec's exact structure
    #[command(
        long_about = "Write a random-weight checkpoint (config.json + model.safetensors, the \
                      spec's weight quantization applied, kv_config.json when the spec \
                      quantizes the KV cache) with exactly the spec's structure.",
        after_help = EXIT_CODES
    )]
    Init(InitArgs),
    /// Run `logits` or `generate` tensor-parallel on N ranks (MLX distributed)
    #[command(
        long_about = "Start N ranks of archgen on this machine, each running the command after                       `--` (logits or generate) on its slice of the model, split as mlx-lm's                       shard() splits it: q/k/v and gate/up by output rows, o/down by input                       columns with one all_sum each, heads divided by N. MLX's own backend does                       the communication: ring (TCP over loopback, CPU) or nccl (CUDA builds, one                       GPU per rank). The ranks get the environment mlx.launch writes (MLX_RANK,                       MLX_HOSTFILE for ring; MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT for nccl),                       so `mlx.launch --backend ring -n 2 -- archgen logits ...` works too. Rank 0                       alone prints and writes --out; every rank's stderr shows prefixed                       `[rank R]`. When a rank fails, the others are stopped after --grace                       seconds; --timeout bounds the whole run.",
        after_help = "Example:\n  archgen launch --backend ring -n 2 -- logits --model DIR \
                      --prompt-ids 1,2,3 --decode-steps 4 --out out.safetensors"
    )]
    Launch(LaunchArgs),
    /// List the speed levers, their tiers and defaults, and what --l1, --l2, --l3 set
    #[command(
        long_about = "List the speed levers: every run-time choice that can change a run's bits \
                      or its speed. Each is a flag (--NAME VALUE) of the commands that read it; \
                      its tier is the parity tier of a run with it on (L1: mlx-lm's bits kept, \
                      L3: no oracle), and a run's tier is the highest of its model's and its \
                      levers'. --l1, --l2 and --l3 are aliases for fixed lever settings; a \
                      lever's own flag overrides them, and each lever's environment variable \
                      applies when neither is given (docs/cli.md, \"Levers\").",
        after_help = EXIT_CODES
    )]
    Levers(LeversArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(after_help = "Examples:\n  \
        archgen completions bash > ~/.local/share/bash-completion/completions/archgen\n  \
        archgen completions zsh > ~/.zfunc/_archgen\n  \
        archgen completions fish > ~/.config/fish/completions/archgen.fish")]
    Completions(CompletionsArgs),
}

#[derive(Debug, Args)]
pub struct LeversArgs {
    /// Output format
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = ListFormat::Table)]
    pub format: ListFormat,
}

/// The distributed backend `archgen launch` sets its ranks up for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LaunchBackend {
    /// TCP sockets between CPU processes (MLX_HOSTFILE)
    Ring,
    /// NVIDIA NCCL, one GPU per rank (CUDA builds of MLX only)
    Nccl,
}

#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// MLX distributed backend
    #[arg(long, value_enum, default_value_t = LaunchBackend::Ring)]
    pub backend: LaunchBackend,
    /// Ranks per host
    #[arg(short = 'n', long = "ranks", value_name = "N", default_value_t = 2)]
    pub n: usize,
    /// Comma-separated host IPs (this machine's loopback only; use mlx.launch for other hosts)
    #[arg(long, value_name = "IP,...", default_value = "127.0.0.1")]
    pub hosts: String,
    /// Ring backend: rank r listens on this port + r (mlx.launch's default)
    #[arg(long, short = 'p', value_name = "PORT", default_value_t = 32323)]
    pub starting_port: u16,
    /// NCCL backend: the port rank 0 serves NCCL's unique id on
    #[arg(long, value_name = "PORT", default_value_t = 12345)]
    pub nccl_port: u16,
    /// Seconds the other ranks get to end after one fails, before they are killed
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub grace: f64,
    /// Kill every rank after this many seconds
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// The archgen command each rank runs: logits ... or generate ...
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Which model implementation runs a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Impl {
    /// The generic interpreter of the architecture
    Monolith,
    /// The generated model whose fingerprint matches; fails when there is none
    Generated,
    /// The generated model when one matches, else the monolith (saying why)
    Auto,
}

/// The parity tier a run must keep (docs/parity.md, "Tiers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RequiredTier {
    /// Bit-exact with mlx-lm 0.32.2
    #[value(name = "L1", alias = "l1")]
    L1,
    /// Bit-exact with mlx-lm 0.32.2 or with mlx-optiq 0.7.7 on it
    #[value(name = "L2", alias = "l2")]
    L2,
}

impl RequiredTier {
    pub fn tier(self) -> archgen_ir::tier::Tier {
        match self {
            RequiredTier::L1 => archgen_ir::tier::Tier::L1,
            RequiredTier::L2 => archgen_ir::tier::Tier::L2,
        }
    }
}

/// Comma-separated token ids, e.g. `2,105,7`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIds(pub Vec<i32>);

/// Parses `--prompt-ids`: at least one non-negative integer, comma-separated.
fn parse_ids(s: &str) -> Result<TokenIds, String> {
    let ids: Result<Vec<i32>, String> = s
        .split(',')
        .map(|t| t.trim())
        .enumerate()
        .map(|(i, t)| {
            t.parse::<i32>().ok().filter(|v| *v >= 0).ok_or_else(|| {
                format!(
                    "item {} ('{t}') is not a non-negative integer; give ids like 2,105,7",
                    i + 1
                )
            })
        })
        .collect();
    Ok(TokenIds(ids?))
}

/// A number as Python reads it (f64; mlx-lm's arithmetic turns it into an
/// array of the operand's dtype where it meets one).
fn parse_number(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    match v.is_finite() {
        true => Ok(v),
        false => Err(format!("{v} must be a finite number")),
    }
}

/// `--temp`: a finite number >= 0 (0 is greedy).
fn parse_temp(s: &str) -> Result<f64, String> {
    let t = parse_number(s)?;
    if t < 0.0 {
        return Err(format!("{t} must be a finite number >= 0"));
    }
    Ok(t)
}

/// `--top-p`: a number in (0, 1].
fn parse_top_p(s: &str) -> Result<f64, String> {
    let p = parse_number(s)?;
    if !(p > 0.0 && p <= 1.0) {
        return Err(format!("{p} is outside (0, 1]"));
    }
    Ok(p)
}

/// `--min-p`: a number in [0, 1] (0 turns min-p off).
fn parse_min_p(s: &str) -> Result<f64, String> {
    let p = parse_number(s)?;
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("{p} is outside [0, 1]"));
    }
    Ok(p)
}

/// `--repetition-penalty`: a number >= 0 (0 turns it off).
fn parse_repetition_penalty(s: &str) -> Result<f64, String> {
    let p = parse_number(s)?;
    if p < 0.0 {
        return Err(format!("{p} must be >= 0 (0 turns it off)"));
    }
    Ok(p)
}

/// One `--logit-bias` item: `ID=BIAS`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitBias {
    pub id: i32,
    pub bias: f64,
}

fn parse_logit_bias(s: &str) -> Result<LogitBias, String> {
    let Some((id, bias)) = s.split_once('=') else {
        return Err(format!(
            "'{s}' is not ID=BIAS; give e.g. --logit-bias 13=-100,7=2.5"
        ));
    };
    let id = id
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|v| *v >= 0)
        .ok_or_else(|| format!("'{id}' in '{s}' is not a non-negative token id"))?;
    let bias = parse_number(bias).map_err(|e| format!("the bias in '{s}': {e}"))?;
    Ok(LogitBias { id, bias })
}

/// The sampler and logits processors of `generate` and `chat`: mlx-lm's
/// `make_sampler` and `make_logits_processors` (docs/cli.md, "Sampling").
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy
    #[arg(long, value_name = "T", default_value_t = 0.0, value_parser = parse_temp,
          allow_negative_numbers = true)]
    pub temp: f64,
    /// Nucleus sampling: keep the smallest set of tokens whose mass reaches P
    #[arg(long, value_name = "P", default_value_t = 1.0, value_parser = parse_top_p,
          allow_negative_numbers = true)]
    pub top_p: f64,
    /// Min-p sampling: drop tokens less likely than P times the most likely one (0: off)
    #[arg(long, value_name = "P", default_value_t = 0.0, value_parser = parse_min_p,
          allow_negative_numbers = true)]
    pub min_p: f64,
    /// Tokens min-p sampling always keeps
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub min_tokens_to_keep: u32,
    /// Top-k sampling: keep the K most likely tokens (0: off; below the vocabulary size)
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub top_k: u32,
    /// Add BIAS to the logit of token ID (repeatable, or comma-separated: 13=-100,7=2.5)
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias,
          value_delimiter = ',', allow_negative_numbers = true)]
    pub logit_bias: Vec<LogitBias>,
    /// Repetition penalty: divide positive (multiply negative) logits of recent tokens by it (0: off)
    #[arg(long, value_name = "F", value_parser = parse_repetition_penalty,
          allow_negative_numbers = true)]
    pub repetition_penalty: Option<f64>,
    /// Recent tokens (prompt included) the repetition penalty looks at
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONTEXT,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub repetition_context_size: u32,
    /// Presence penalty: subtract it from the logit of every recent token (0: off)
    #[arg(long, value_name = "F", value_parser = parse_number, allow_negative_numbers = true)]
    pub presence_penalty: Option<f64>,
    /// Recent tokens (prompt included) the presence penalty looks at
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONTEXT,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub presence_context_size: u32,
    /// Frequency penalty: subtract it from a recent token's logit once per occurrence (0: off)
    #[arg(long, value_name = "F", value_parser = parse_number, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f64>,
    /// Recent tokens (prompt included) the frequency penalty looks at
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONTEXT,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub frequency_context_size: u32,
    /// Random seed of the sampler (default: a fresh one from the OS, printed on stderr
    /// so the run can be replayed); chat's reply N (from 0) uses S + N
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
}

/// mlx-lm's context of each penalty.
const DEFAULT_CONTEXT: u32 = crate::sampling::DEFAULT_PENALTY_CONTEXT as u32;

impl SamplingArgs {
    /// The settings, or a usage error of `command` naming the flag (a token
    /// id given twice to --logit-bias).
    pub fn params(&self, command: &str) -> Result<crate::sampling::SamplingParams, clap::Error> {
        use crate::sampling::{Penalty, SamplingParams};
        let mut logit_bias: Vec<(i32, f64)> = Vec::with_capacity(self.logit_bias.len());
        for b in &self.logit_bias {
            if logit_bias.iter().any(|&(id, _)| id == b.id) {
                return Err(usage_error(
                    command,
                    ErrorKind::ValueValidation,
                    &format!(
                        "--logit-bias: token {} is given twice; give each token once",
                        b.id
                    ),
                ));
            }
            logit_bias.push((b.id, b.bias));
        }
        let penalty = |value: Option<f64>, context: u32| {
            value.map(|value| Penalty {
                value,
                context: context as usize,
            })
        };
        Ok(SamplingParams {
            temp: self.temp,
            top_p: self.top_p,
            min_p: self.min_p,
            min_tokens_to_keep: self.min_tokens_to_keep as usize,
            top_k: self.top_k as usize,
            logit_bias,
            repetition_penalty: penalty(self.repetition_penalty, self.repetition_context_size),
            presence_penalty: penalty(self.presence_penalty, self.presence_context_size),
            frequency_penalty: penalty(self.frequency_penalty, self.frequency_context_size),
        })
    }
}

#[derive(Debug, Args)]
pub struct LogitsArgs {
    /// Model directory (config.json + model*.safetensors, mlx-community layout)
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Prompt token ids, comma-separated
    #[arg(long, value_name = "1,2,3", value_parser = parse_ids,
          required_unless_present = "batch")]
    pub prompt_ids: Option<TokenIds>,
    /// Greedy one-token decode steps after the prefill
    #[arg(long, value_name = "N", default_value_t = 0, conflicts_with = "batch")]
    pub decode_steps: usize,
    /// Run a schedule of sequences as one continuous batch, as mlx-lm's
    /// BatchGenerator runs it (JSON: prompts, arrival steps, decode steps;
    /// docs/parity.md, "Batches"); writes seq{i}.logprobs [N, vocab],
    /// seq{i}.tokens [N] and seq{i}.steps [N] per sequence
    #[arg(long, value_name = "FILE.json", conflicts_with = "prompt_ids")]
    pub batch: Option<PathBuf>,
    /// Which implementation runs the checkpoint
    #[arg(long = "impl", value_name = "IMPL", value_enum, default_value_t = Impl::Auto)]
    pub implementation: Impl,
    /// Refuse to run (exit status 1) when the run's parity tier is below this one
    #[arg(long, value_name = "TIER", value_enum)]
    pub require_tier: Option<RequiredTier>,
    /// Output file (.safetensors), written atomically
    #[arg(long, value_name = "FILE.safetensors")]
    pub out: PathBuf,
    #[command(flatten)]
    pub levers: LeverFlags<LogitsCommand>,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model directory (config.json + model*.safetensors, mlx-community layout)
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Prompt text, encoded with DIR/tokenizer.json
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Prompt token ids, comma-separated (instead of --prompt)
    #[arg(long, value_name = "1,2,3", value_parser = parse_ids)]
    pub prompt_ids: Option<TokenIds>,
    /// Most tokens to generate
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Do not stop at the checkpoint's EOS ids
    #[arg(long)]
    pub ignore_eos: bool,
    /// Wrap --prompt in the checkpoint's chat template as one user turn
    #[arg(long, conflicts_with = "prompt_ids")]
    pub chat: bool,
    /// With --chat: chat template variables as a JSON object (mlx-lm's --chat-template-args), e.g. '{"enable_thinking": false}'
    #[arg(long, value_name = "JSON", requires = "chat")]
    pub chat_template_args: Option<String>,
    /// Hold the output to JSON valid against the JSON schema in FILE
    /// (constrained decoding; needs DIR/tokenizer.json)
    #[arg(long, value_name = "FILE", conflicts_with = "json_object")]
    pub json_schema: Option<PathBuf>,
    /// Hold the output to one JSON object (constrained decoding; needs
    /// DIR/tokenizer.json)
    #[arg(long)]
    pub json_object: bool,
    /// Which implementation runs the checkpoint
    #[arg(long = "impl", value_name = "IMPL", value_enum, default_value_t = Impl::Auto)]
    pub implementation: Impl,
    /// Refuse to run (exit status 1) when the run's parity tier is below this one
    #[arg(long, value_name = "TIER", value_enum)]
    pub require_tier: Option<RequiredTier>,
    #[command(flatten)]
    pub levers: LeverFlags<ModelCommand>,
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// Model directory (config.json, model*.safetensors, tokenizer.json, a chat template)
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// A system message that opens the conversation
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Chat template variables as a JSON object (mlx-lm's --chat-template-args), e.g. '{"enable_thinking": false}'
    #[arg(long, value_name = "JSON")]
    pub chat_template_args: Option<String>,
    /// Most tokens per reply
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Which implementation runs the checkpoint
    #[arg(long = "impl", value_name = "IMPL", value_enum, default_value_t = Impl::Auto)]
    pub implementation: Impl,
    /// Refuse to run (exit status 1) when the run's parity tier is below this one
    #[arg(long, value_name = "TIER", value_enum)]
    pub require_tier: Option<RequiredTier>,
    #[command(flatten)]
    pub levers: LeverFlags<ModelCommand>,
}

/// What `archgen embed` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmbedFormat {
    /// OpenAI's embeddings list (float values), to stdout or --out
    Json,
    /// `embeddings` [N, hidden] in the model's compute dtype, to --out
    Safetensors,
}

#[derive(Debug, Args)]
pub struct EmbedArgs {
    /// Model directory (config.json, model*.safetensors, tokenizer.json)
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// A text to embed (repeat for several)
    #[arg(
        long,
        value_name = "TEXT",
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub text: Vec<String>,
    /// A file of texts to embed, one per line
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Output format
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = EmbedFormat::Json)]
    pub format: EmbedFormat,
    /// Output file (JSON: default stdout; safetensors: required), written whole
    #[arg(long, value_name = "FILE", required_if_eq("format", "safetensors"))]
    pub out: Option<PathBuf>,
    /// Which implementation runs the checkpoint
    #[arg(long = "impl", value_name = "IMPL", value_enum, default_value_t = Impl::Auto)]
    pub implementation: Impl,
    /// Refuse to run (exit status 1) when the run's parity tier is below this one
    #[arg(long, value_name = "TIER", value_enum)]
    pub require_tier: Option<RequiredTier>,
    #[command(flatten)]
    pub levers: LeverFlags<ModelCommand>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model directory (config.json, model*.safetensors, tokenizer.json, a chat template)
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Address to listen on (127.0.0.1: this machine only)
    #[arg(long, value_name = "HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free one (the address is printed)
    #[arg(long, value_name = "PORT", default_value_t = 8080)]
    pub port: u16,
    /// Which implementation runs the checkpoint
    #[arg(long = "impl", value_name = "IMPL", value_enum, default_value_t = Impl::Auto)]
    pub implementation: Impl,
    /// Requests waiting for a place in the batch; one more is answered 429
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_queue: u32,
    /// Longest prompt served, in tokens (default: the model's context); longer ones get a 400
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_prompt_tokens: Option<u64>,
    /// Largest max_tokens a request may ask for (default: the model's context); more gets a 400
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tokens: Option<u64>,
    /// On SIGTERM or Ctrl-C, how long in-flight requests may run before the server exits anyway
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub drain_seconds: u64,
    /// Bytes of finished requests' KV caches kept for prompts that extend them (0: no prompt cache); least recently used evicted first
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30)]
    pub prompt_cache_bytes: u64,
    /// Serve only requests with `Authorization: Bearer KEY` (GET /health excepted); others get 401
    #[arg(
        long,
        value_name = "KEY",
        env = "ARCHGEN_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Browser origins allowed to call the API (CORS), e.g. http://localhost:3000; `*` allows any. Without it no CORS headers are sent
    #[arg(long, value_name = "ORIGIN[,ORIGIN...]", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Chat template variables for every chat request, as a JSON object (mlx-lm's --chat-template-args), e.g. '{"enable_thinking": false}'; a request's chat_template_kwargs override them
    #[arg(long, value_name = "JSON")]
    pub chat_template_args: Option<String>,
    /// Sequences the prompt cache keeps at most (mlx-lm's --prompt-cache-size)
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub prompt_cache_size: u32,
    /// Refuse to start (exit status 1) when the run's parity tier is below this one
    #[arg(long, value_name = "TIER", value_enum)]
    pub require_tier: Option<RequiredTier>,
    // --max-batch, --prefill-step and --cuda-graph-cache are levers (levers.rs).
    #[command(flatten)]
    pub levers: LeverFlags<ServeCommand>,
}

/// What `generate` starts from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Token ids given on the command line.
    Ids(Vec<i32>),
    /// Text to encode with the model directory's tokenizer.json.
    Text(String),
}

impl GenerateArgs {
    /// The prompt: exactly one of --prompt and --prompt-ids.
    pub fn prompt(&self) -> Result<Prompt, clap::Error> {
        match (&self.prompt, &self.prompt_ids) {
            (Some(t), None) => Ok(Prompt::Text(t.clone())),
            (None, Some(ids)) => Ok(Prompt::Ids(ids.0.clone())),
            (Some(_), Some(_)) => Err(usage_error(
                "generate",
                ErrorKind::ArgumentConflict,
                "give either --prompt TEXT or --prompt-ids 1,2,3, not both",
            )),
            (None, None) => Err(usage_error(
                "generate",
                ErrorKind::MissingRequiredArgument,
                "give --prompt TEXT or --prompt-ids 1,2,3",
            )),
        }
    }
}

/// Weight dtype of `archgen init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WeightDtype {
    Bfloat16,
    Float16,
    Float32,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The spec to follow (specs/NAME.yaml)
    #[arg(long, value_name = "FILE.yaml")]
    pub spec: PathBuf,
    /// Directory to write config.json and model.safetensors into
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Weight RNG seed
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Dtype of the unquantized weights
    #[arg(long, value_enum, default_value_t = WeightDtype::Bfloat16)]
    pub dtype: WeightDtype,
    /// How to print spec errors: human (with source excerpts) or json (one
    /// object per line on stdout, docs/errors.md#json-messages)
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = MessageFormat::Human)]
    pub message_format: MessageFormat,
}

/// How spec errors are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MessageFormat {
    /// file:line:column, the message, the source line with a caret under
    /// the span, and the hint, on stderr
    Human,
    /// One JSON object per line on stdout
    Json,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to write a completion script for
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// A usage error raised after parsing (a rule clap's attributes do not
/// express), rendered and exited like clap's own (status 2).
pub fn usage_error(subcommand: &str, kind: ErrorKind, message: &str) -> clap::Error {
    let mut cli = Cli::command();
    cli.build();
    match cli.find_subcommand_mut(subcommand) {
        Some(sub) => sub.error(kind, message),
        None => cli.error(kind, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("archgen").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn logits_flags_parse_as_before() {
        let cli = parse(&[
            "logits",
            "--model",
            "m",
            "--prompt-ids",
            "1, 2,3",
            "--decode-steps",
            "4",
            "--impl",
            "generated",
            "--out",
            "o.safetensors",
        ])
        .unwrap();
        let Command::Logits(a) = cli.command else {
            panic!("not logits: {cli:?}")
        };
        assert_eq!(a.prompt_ids, Some(TokenIds(vec![1, 2, 3])));
        assert_eq!(a.decode_steps, 4);
        assert_eq!(a.implementation, Impl::Generated);
        // --decode-steps and --impl default to 0 and auto.
        let cli = parse(&[
            "logits",
            "--model",
            "m",
            "--prompt-ids",
            "1",
            "--out",
            "o.safetensors",
        ])
        .unwrap();
        let Command::Logits(a) = cli.command else {
            panic!("not logits")
        };
        assert_eq!((a.decode_steps, a.implementation), (0, Impl::Auto));
    }

    #[test]
    fn logits_takes_a_batch_schedule_instead_of_a_prompt() {
        let cli = parse(&[
            "logits",
            "--model",
            "m",
            "--batch",
            "s.json",
            "--out",
            "o.safetensors",
        ])
        .unwrap();
        let Command::Logits(a) = cli.command else {
            panic!("not logits")
        };
        assert_eq!(a.batch, Some(PathBuf::from("s.json")));
        assert_eq!(a.prompt_ids, None);
        // One or the other: both, or neither, is a usage error.
        for args in [
            &[
                "logits",
                "--model",
                "m",
                "--batch",
                "s.json",
                "--prompt-ids",
                "1",
                "--out",
                "o.safetensors",
            ][..],
            &[
                "logits",
                "--model",
                "m",
                "--batch",
                "s.json",
                "--decode-steps",
                "2",
                "--out",
                "o.safetensors",
            ][..],
            &["logits", "--model", "m", "--out", "o.safetensors"][..],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn a_repeated_flag_keeps_the_last_value() {
        let cli = parse(&[
            "generate",
            "--model",
            "a",
            "--model",
            "b",
            "--prompt-ids",
            "1",
        ])
        .unwrap();
        let Command::Generate(a) = cli.command else {
            panic!("not generate")
        };
        assert_eq!(a.model, PathBuf::from("b"));
    }

    #[test]
    fn bad_values_are_usage_errors_naming_the_problem() {
        for (args, expected) in [
            (&["--prompt-ids", "1,x,3"][..], "item 2 ('x')"),
            (
                &["--prompt-ids", "1", "--temp", "-1"],
                "-1 must be a finite",
            ),
            (
                &["--prompt-ids", "1", "--top-p", "0"],
                "0 is outside (0, 1]",
            ),
            (&["--prompt-ids", "1", "--impl", "fast"], "'fast'"),
        ] {
            let mut v = vec!["generate", "--model", "m"];
            v.extend_from_slice(args);
            let e = parse(&v).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            assert!(e.to_string().contains(expected), "{args:?}: {e}");
        }
    }

    #[test]
    fn chat_serve_and_generate_chat_parse() {
        let cli = parse(&[
            "chat",
            "--model",
            "m",
            "--system",
            "Be terse.",
            "--temp",
            "0.5",
        ])
        .unwrap();
        let Command::Chat(a) = cli.command else {
            panic!("not chat: {cli:?}")
        };
        assert_eq!(a.system.as_deref(), Some("Be terse."));
        let s = &a.sampling;
        assert_eq!(
            (s.temp, s.top_p, s.seed, a.max_tokens),
            (0.5, 1.0, None, 256)
        );
        let cli = parse(&["serve", "--model", "m"]).unwrap();
        let Command::Serve(a) = cli.command else {
            panic!("not serve: {cli:?}")
        };
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 8080));
        assert_eq!((a.max_queue, a.drain_seconds), (256, 30));
        // The batch and chunk sizes are levers, at the flags' former defaults.
        let levers = a.levers.resolve_with(|_| None).unwrap().values;
        assert_eq!((levers.max_batch, levers.prefill_step), (16, 2048));
        assert_eq!((a.max_prompt_tokens, a.max_tokens), (None, None));
        // mlx-lm's 10 sequences, and a 1 GiB byte bound (mlx-lm has none).
        assert_eq!((a.prompt_cache_bytes, a.prompt_cache_size), (1 << 30, 10));
        let cli = parse(&["serve", "--model", "m", "--prompt-cache-bytes", "0"]).unwrap();
        let Command::Serve(a) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(a.prompt_cache_bytes, 0, "0 turns the prompt cache off");
        for bad in [
            "--max-batch",
            "--max-queue",
            "--prefill-step",
            "--max-tokens",
            "--prompt-cache-size",
        ] {
            let e = parse(&["serve", "--model", "m", bad, "0"]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad} 0");
        }
        let cli = parse(&["serve", "--model", "m", "--host", "::1", "--port", "0"]).unwrap();
        let Command::Serve(a) = cli.command else {
            panic!("not serve")
        };
        assert_eq!((a.host.as_str(), a.port), ("::1", 0));
        assert!(parse(&["serve", "--model", "m", "--port", "70000"]).is_err());
        let cli = parse(&["generate", "--model", "m", "--prompt", "hi", "--chat"]).unwrap();
        let Command::Generate(a) = cli.command else {
            panic!("not generate")
        };
        assert!(a.chat);
        let e = parse(&["generate", "--model", "m", "--prompt-ids", "1", "--chat"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--prompt-ids"), "{e}");
    }

    #[test]
    fn generate_needs_exactly_one_prompt() {
        let both = parse(&[
            "generate",
            "--model",
            "m",
            "--prompt",
            "x",
            "--prompt-ids",
            "1",
        ])
        .unwrap();
        let Command::Generate(a) = both.command else {
            panic!("not generate")
        };
        let e = a.prompt().unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("not both"), "{e}");
        let none = parse(&["generate", "--model", "m"]).unwrap();
        let Command::Generate(a) = none.command else {
            panic!("not generate")
        };
        assert!(a
            .prompt()
            .unwrap_err()
            .to_string()
            .contains("give --prompt TEXT or --prompt-ids"));
    }

    fn levers_of(args: &[&str]) -> crate::levers::RunLevers {
        match parse(args).unwrap().command {
            Command::Logits(a) => a.levers.resolve_with(|_| None).unwrap(),
            Command::Generate(a) => a.levers.resolve_with(|_| None).unwrap(),
            Command::Chat(a) => a.levers.resolve_with(|_| None).unwrap(),
            Command::Serve(a) => a.levers.resolve_with(|_| None).unwrap(),
            other => panic!("no levers: {other:?}"),
        }
    }

    #[test]
    fn levers_are_flags_of_every_command_that_runs_a_model() {
        let logits = ["logits", "--model", "m", "--prompt-ids", "1", "--out", "o"];
        let generate = ["generate", "--model", "m", "--prompt-ids", "1"];
        let chat = ["chat", "--model", "m"];
        let serve = ["serve", "--model", "m"];
        for base in [&logits[..], &generate, &chat, &serve] {
            let with = |extra: &[&str]| {
                let mut v = base.to_vec();
                v.extend_from_slice(extra);
                levers_of(&v).values
            };
            // A bare switch is on; `off` turns it off; the last one given wins.
            assert!(with(&["--eager-decode"]).eager_decode, "{base:?}");
            assert!(!with(&["--eager-decode", "--eager-decode", "off"]).eager_decode);
            assert!(!with(&["--gpu-decode", "off"]).gpu_decode);
            assert_eq!(
                with(&["--gpu-decode-blocks", "post"]).gpu_decode_blocks,
                archgen_runtime::device::GpuBlocks::PostAttention
            );
            // The alias, and a lever's own flag over it, in either order.
            assert!(with(&["--l3"]).gpu_one_token_sdpa);
            assert!(!with(&["--l3", "--gpu-one-token-sdpa", "off"]).gpu_one_token_sdpa);
            assert!(with(&["--gpu-one-token-sdpa", "--l1"]).gpu_one_token_sdpa);
            assert!(!with(&["--l1"]).gpu_one_token_sdpa);
            assert!(with(&["--l3"]).gpu_stacked_projections);
            assert!(!with(&["--l3", "--gpu-stacked-projections", "off"]).gpu_stacked_projections);
            assert!(with(&["--gpu-stacked-projections"]).gpu_stacked_projections);
            assert!(!with(&[]).gpu_stacked_projections);
        }
        let serve = levers_of(&[
            "serve",
            "--model",
            "m",
            "--max-batch",
            "32",
            "--prefill-step",
            "512",
            "--cuda-graph-cache",
            "900",
        ])
        .values;
        assert_eq!(
            (serve.max_batch, serve.prefill_step, serve.cuda_graph_cache),
            (32, 512, 900)
        );
    }

    #[test]
    fn bad_lever_flags_are_usage_errors_naming_the_flag() {
        for (args, expected) in [
            (
                &["chat", "--model", "m", "--eager-decode", "yes"][..],
                "`yes` is not on or off",
            ),
            (
                &["chat", "--model", "m", "--gpu-decode-blocks", "mid"],
                "not one of all, pre",
            ),
            (
                &["serve", "--model", "m", "--max-batch", "4097"],
                "1..=4096",
            ),
            (&["chat", "--model", "m", "--l1", "--l3"], "--l3"),
            // serve's levers are not flags of the other commands.
            (&["chat", "--model", "m", "--max-batch", "4"], "--max-batch"),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            assert!(e.to_string().contains(expected), "{args:?}: {e}");
        }
    }
}
