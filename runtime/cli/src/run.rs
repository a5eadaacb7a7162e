//! The commands: the `logits` protocol (the contract outside tools compare
//! with mlx-lm) and `generate` for people.

use std::io::Write;
use std::path::Path;

use archgen_runtime::distributed::Split;
use archgen_runtime::mlx_rs::{self, Array};
use archgen_runtime::model::{CausalLm, ModelTask};

use tokenizers::Tokenizer;

use crate::args::{Cli, Command, GenerateArgs, Impl, InitArgs, LogitsArgs, Prompt, RequiredTier};
use crate::engine::{Flow, Sampling, TextStream};
use crate::ui::Ui;

pub(crate) fn mlx<T>(r: Result<T, mlx_rs::error::Exception>) -> Result<T, String> {
    r.map_err(|e| format!("MLX: {e}"))
}

/// Loads the checkpoint at `model` and runs `task` on the implementation that
/// `--impl` selects: the generated model whose fingerprint matches the
/// checkpoint, or the monolith. States the run's parity tier, and refuses the
/// run when it is below `require_tier`.
pub(crate) fn with_model<T: ModelTask<Output = Result<(), String>>>(
    ui: &Ui,
    model: &Path,
    implementation: Impl,
    require_tier: Option<RequiredTier>,
    task: T,
) -> Result<(), String> {
    let bar = ui.bytes_bar(&format!("loading {}", model.display()), 0);
    let loaded = match &bar {
        Some(bar) => {
            let shown = bar.clone();
            let report = move |done: u64, total: u64| {
                shown.set_length(total);
                shown.set_position(done);
            };
            archgen_runtime::weights::with_load_progress(Box::new(report), || {
                archgen_monolith::read_dir(model)
            })
        }
        None => archgen_monolith::read_dir(model),
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let (arch, mut weights) = loaded.map_err(|e| e.to_string())?;
    // A tensor-parallel rank: split the IR's blocks as mlx-lm's shard()
    // does and load only this rank's slices.
    if let Some(group) = crate::launch::group() {
        let split = archgen_plan::tensor_parallel::split(&arch, group.size() as usize)
            .map_err(|e| format!("rank {} of {}: {e}", group.rank(), group.size()))?;
        ui.note(&format!(
            "tensor parallel: rank {} of {} ({} backend), {} all_sums per forward pass",
            group.rank(),
            group.size(),
            group.backend().name(),
            split.all_sums_per_forward()
        ));
        let splits = split.modules().map(|(m, s)| {
            let s = match s {
                archgen_plan::tensor_parallel::Split::AllToSharded => Split::AllToSharded,
                archgen_plan::tensor_parallel::Split::ShardedToAll => Split::ShardedToAll,
                archgen_plan::tensor_parallel::Split::Segmented { at } => Split::Segmented {
                    at: at.map(|i| i as i32),
                },
                archgen_plan::tensor_parallel::Split::Vector => Split::Vector,
                archgen_plan::tensor_parallel::Split::RepeatedHeads { heads, times } => {
                    Split::RepeatedHeads {
                        heads: heads as i32,
                        times: times as i32,
                    }
                }
            };
            (m.to_string(), s)
        });
        weights
            .shard(group, splits.collect::<Vec<_>>())
            .map_err(|e| format!("{}: {e}", model.display()))?;
    }
    // Both implementations reproduce the same oracle, so the tier is the
    // model's (split over ranks, that of its sharded oracle).
    let ranks = crate::launch::group().map_or(1, |g| g.size() as usize);
    let tier = archgen_spec::tier::sharded_tier(&arch, ranks);
    if let Some(required) = require_tier {
        if tier.tier > required.tier() {
            return Err(format!(
                "--require-tier {}: refusing to run {}: its parity tier is {tier} ({}); \
                 run it without --require-tier {}, or use a checkpoint without these features",
                required.tier(),
                model.display(),
                tier.tier.oracle(),
                required.tier(),
            ));
        }
    }
    ui.note(&format!("parity tier {tier} ({})", tier.tier.oracle()));
    let fingerprint = archgen_plan::fingerprint(&arch);
    if implementation != Impl::Monolith {
        if let Some(found) = archgen_generated::find(&fingerprint) {
            ui.note(&format!(
                "running generated model {} (fingerprint {fingerprint}, {})",
                found.name, found.spec
            ));
            return archgen_generated::run(&fingerprint, weights, task)
                .expect("find() and run() cover the same fingerprints")
                .map_err(|e| format!("{}: {e}", model.display()))?;
        }
        let why = format!(
            "no generated model has this checkpoint's fingerprint {fingerprint} \
             ({} generated: `cargo xtask spec import {} --name NAME` then `cargo xtask gen NAME` adds one)",
            archgen_generated::MODELS.len(),
            model.display()
        );
        if implementation == Impl::Generated {
            return Err(format!("--impl generated: {why}"));
        }
        ui.note(&format!("--impl auto: running the monolith: {why}"));
    }
    let m = archgen_monolith::Monolith::new(arch, weights)
        .map_err(|e| format!("{}: {e}", model.display()))?;
    task.run(&m)
}

pub(crate) fn check_ids(what: &str, ids: &[i32], vocab: i32) -> Result<(), String> {
    match ids.iter().position(|&t| t >= vocab) {
        Some(i) => Err(format!(
            "{what}: id {} at position {} is out of the vocabulary (size {vocab})",
            ids[i],
            i + 1
        )),
        None => Ok(()),
    }
}

/// Writes `tensors` to `out` atomically: a temporary beside it, then rename.
pub(crate) fn save_atomically(tensors: &[(&str, &Array)], out: &Path) -> Result<(), String> {
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if out.extension().and_then(|e| e.to_str()) != Some("safetensors") {
        return Err(format!(
            "--out {}: the file name must end in .safetensors",
            out.display()
        ));
    }
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp.safetensors", std::process::id()));
    let saved = Array::save_safetensors(tensors.iter().copied(), None, &tmp);
    if let Err(e) = saved {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("cannot write {}: {e}", out.display()));
    }
    std::fs::rename(&tmp, out).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", out.display())
    })
}

fn logits(ui: &Ui, args: &LogitsArgs, writes: bool) -> Result<(), String> {
    let Some(ids) = &args.prompt_ids else {
        return crate::batch::logits(ui, args);
    };
    let task = LogitsTask {
        ids: &ids.0,
        steps: args.decode_steps,
        out: &args.out,
        writes,
    };
    with_model(
        ui,
        &args.model,
        args.implementation,
        args.require_tier,
        task,
    )
}

struct LogitsTask<'a> {
    ids: &'a [i32],
    steps: usize,
    out: &'a Path,
    /// False on tensor-parallel ranks other than 0: they run every step
    /// (the collectives need them) and write nothing.
    writes: bool,
}

impl ModelTask for LogitsTask<'_> {
    type Output = Result<(), String>;

    fn run<M: CausalLm>(self, m: &M) -> Self::Output {
        check_ids("--prompt-ids", self.ids, m.vocab_size())?;
        let run = mlx(archgen_runtime::protocol::run_logits(
            m, self.ids, self.steps,
        ))?;
        if !self.writes {
            return mlx(mlx_rs::transforms::eval([
                &run.prefill_logits,
                &run.decode_logits,
                &run.tokens,
            ]));
        }
        save_atomically(
            &[
                ("prefill_logits", &run.prefill_logits),
                ("decode_logits", &run.decode_logits),
                ("tokens", &run.tokens),
            ],
            self.out,
        )
    }
}

/// Samples one token, lazily: greedy at temp 0, else seeded categorical over
/// `logits / temp` restricted to the top-p nucleus. Returns the token as an
/// unevaluated int32 array [1, 1], the next step's input, so the decode loop
/// can build that step before this one has run (see [`GenerateTask`]).
pub(crate) fn sample(logits: &Array, temp: f32, top_p: f32, key: &Array) -> Result<Array, String> {
    let token = if temp == 0.0 {
        mlx(mlx_rs::ops::indexing::argmax_axis(logits, -1, false))?
    } else {
        let scaled = mlx(logits.as_dtype(archgen_runtime::Dtype::Float32))?;
        let scaled = mlx(scaled.multiply(Array::from_f32(1.0 / temp)))?;
        let scaled = if top_p < 1.0 {
            let probs = mlx(mlx_rs::ops::softmax_axis(&scaled, -1, true))?;
            let order = mlx(mlx_rs::ops::argsort_axis(&probs, -1))?;
            let sorted = mlx(probs.take_along_axis(&order, -1))?;
            let cum = mlx(mlx_rs::ops::cumsum(&sorted, -1, None, None))?;
            // Keep the smallest top set whose mass reaches top_p (ascending order).
            let keep_sorted = mlx(cum.gt(Array::from_f32(1.0 - top_p)))?;
            let inverse = mlx(mlx_rs::ops::argsort_axis(&order, -1))?;
            let keep = mlx(keep_sorted.take_along_axis(&inverse, -1))?;
            mlx(mlx_rs::ops::select(
                &keep,
                &scaled,
                Array::from_f32(f32::NEG_INFINITY),
            ))?
        } else {
            scaled
        };
        mlx(mlx_rs::random::categorical(&scaled, -1, None, key))?
    };
    mlx(mlx(token.as_dtype(archgen_runtime::Dtype::Int32))?.reshape(&[1, 1]))
}

/// The value of a token array from [`sample`] (waits for it to be computed).
pub(crate) fn token_value(token: &Array) -> Result<i32, String> {
    token
        .try_item_exact::<i32>()
        .map_err(|e| format!("MLX: {e}"))
}

/// Loads `DIR/tokenizer.json`; `Ok(None)` when the file is absent.
pub(crate) fn load_tokenizer(model: &Path) -> Result<Option<Tokenizer>, String> {
    let path = model.join("tokenizer.json");
    if !path.is_file() {
        return Ok(None);
    }
    Tokenizer::from_file(&path)
        .map(Some)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Adds the ids of an `eos_token_id` value (an int, a list of ints, or null).
fn push_eos(
    value: Option<&serde_json::Value>,
    file: &Path,
    eos: &mut Vec<i32>,
) -> Result<(), String> {
    let bad = || {
        format!(
            "{}: eos_token_id must be an integer or a list of integers",
            file.display()
        )
    };
    let as_id = |v: &serde_json::Value| {
        v.as_u64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(bad)
    };
    match value {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Array(items)) => {
            for v in items {
                eos.push(as_id(v)?);
            }
        }
        Some(v) => eos.push(as_id(v)?),
    }
    Ok(())
}

/// The stop ids: `eos_token_id` from config.json (top level and
/// `text_config`) and from generation_config.json when present, merged.
pub(crate) fn eos_ids(model: &Path) -> Result<Vec<i32>, String> {
    let mut eos = Vec::new();
    for name in ["config.json", "generation_config.json"] {
        let file = model.join(name);
        if !file.is_file() {
            continue;
        }
        let json = crate::chat_template::read_json(&file)?;
        push_eos(json.get("eos_token_id"), &file, &mut eos)?;
        if let Some(text_config) = json.get("text_config") {
            push_eos(text_config.get("eos_token_id"), &file, &mut eos)?;
        }
    }
    eos.sort_unstable();
    eos.dedup();
    Ok(eos)
}

/// Decodes with special tokens kept (as mlx-lm's detokenizer does).
pub(crate) fn decode(tokenizer: &Tokenizer, ids: &[u32]) -> Result<String, String> {
    tokenizer
        .decode(ids, false)
        .map_err(|e| format!("tokenizer: cannot decode {ids:?}: {e}"))
}

/// Prints generated tokens as they come: token ids, or decoded text
/// (through [`TextStream`], which holds back an incomplete character).
enum Streamer<'a> {
    Ids,
    Text(TextStream<'a>),
}

impl Streamer<'_> {
    fn push(&mut self, token: i32) -> Result<(), String> {
        let mut out = std::io::stdout().lock();
        match self {
            Streamer::Ids => {
                let _ = write!(out, "{token} ");
            }
            Streamer::Text(stream) => {
                let (text, _) = stream.push(token)?;
                let _ = out.write_all(text.as_bytes());
            }
        }
        let _ = out.flush();
        Ok(())
    }

    /// Prints whatever was held back, then ends the line.
    fn finish(&mut self) -> Result<(), String> {
        let mut out = std::io::stdout().lock();
        if let Streamer::Text(stream) = self {
            let _ = out.write_all(stream.finish()?.as_bytes());
        }
        let _ = writeln!(out);
        let _ = out.flush();
        Ok(())
    }
}

fn generate(ui: &Ui, args: &GenerateArgs, prompt: &Prompt, prints: bool) -> Result<(), String> {
    let model = args.model.as_path();
    let tokenizer = load_tokenizer(model)?;
    let ids: Vec<i32> = match prompt {
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Text(text) => {
            let Some(tokenizer) = &tokenizer else {
                if !model.is_dir() {
                    return Err(format!("{}: not a directory", model.display()));
                }
                return Err(format!(
                    "--prompt needs {} (not found); give token ids with --prompt-ids 1,2,3 instead",
                    model.join("tokenizer.json").display()
                ));
            };
            // add_special_tokens = true: the tokenizer's post-processor
            // decides (for Gemma it prepends <bos>), as mlx-lm and
            // transformers do for a plain prompt. With --chat the text is
            // one user turn in the chat template, which writes the special
            // tokens itself.
            let (text, add_special_tokens) = match args.chat {
                true => (crate::chat::one_user_turn(model, text)?, false),
                false => (text.clone(), true),
            };
            let encoding = tokenizer
                .encode(text.as_str(), add_special_tokens)
                .map_err(|e| format!("--prompt: cannot encode the text: {e}"))?;
            let ids: Result<Vec<i32>, _> = encoding
                .get_ids()
                .iter()
                .map(|&t| i32::try_from(t))
                .collect();
            ids.map_err(|_| "--prompt: the tokenizer gave an id beyond i32".to_string())?
        }
    };
    if ids.is_empty() {
        return Err("--prompt: the text encodes to no tokens; give a non-empty prompt".into());
    }
    let what = match prompt {
        Prompt::Ids(_) => "--prompt-ids",
        Prompt::Text(_) => "--prompt (encoded)",
    };
    let eos = if args.ignore_eos {
        Vec::new()
    } else {
        eos_ids(model)?
    };
    let task = GenerateTask {
        ids: &ids,
        what,
        eos: &eos,
        tokenizer: tokenizer.as_ref(),
        max_tokens: args.max_tokens,
        temp: args.temp,
        top_p: args.top_p,
        seed: args.seed,
        ui,
        prints,
    };
    with_model(ui, model, args.implementation, args.require_tier, task)
}

struct GenerateTask<'a> {
    ids: &'a [i32],
    what: &'a str,
    eos: &'a [i32],
    tokenizer: Option<&'a Tokenizer>,
    max_tokens: usize,
    temp: f32,
    top_p: f32,
    seed: u64,
    ui: &'a Ui,
    /// False on tensor-parallel ranks other than 0: they generate the same
    /// tokens (the collectives need every step) and print nothing.
    prints: bool,
}

impl ModelTask for GenerateTask<'_> {
    type Output = Result<(), String>;

    fn run<M: CausalLm>(self, m: &M) -> Self::Output {
        let GenerateTask {
            ids,
            what,
            eos,
            tokenizer,
            max_tokens,
            temp,
            top_p,
            seed,
            ui,
            prints,
        } = self;
        check_ids(what, ids, m.vocab_size())?;
        let mut streamer = match tokenizer {
            None => Streamer::Ids,
            Some(tokenizer) => Streamer::Text(TextStream::new(tokenizer, &[])),
        };
        let sampling = Sampling {
            max_tokens,
            temp,
            top_p,
            seed,
        };
        let done = crate::engine::generate(m, ids, &sampling, eos, |token| {
            if prints {
                streamer.push(token)?;
            }
            Ok(Flow::Continue)
        })?;
        if prints {
            streamer.finish()?;
        }
        let stop = match done.eos {
            Some(t) => format!("; stopped at EOS id {t}"),
            None => String::new(),
        };
        let median = done.median_step_seconds;
        ui.note(&format!(
            "prompt {} tokens in {:.3} s; generated {} tokens at {:.1} tokens/s{stop}; median step {:.3} ms ({:.1} tokens/s)",
            ids.len(),
            done.prefill_seconds,
            done.produced,
            done.produced as f64 / done.decode_seconds.max(1e-9),
            median * 1e3,
            1.0 / median.max(1e-12)
        ));
        Ok(())
    }
}

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
    // A rank of a tensor-parallel run (started by `archgen launch` or
    // mlx.launch) joins its group first; ranks other than 0 stay quiet.
    let group = match &cli.command {
        Command::Logits(_) | Command::Generate(_) => crate::launch::join_from_env()?,
        Command::Chat(_) | Command::Serve(_) | Command::Init(_) | Command::Launch(_)
            if std::env::var_os("MLX_RANK").is_some() =>
        {
            return Err(Failure::Runtime(
                "MLX_RANK is set: a launched rank runs `logits` or `generate` only \
                 (chat, serve, init and launch run as one process)"
                    .into(),
            ));
        }
        Command::Chat(_)
        | Command::Serve(_)
        | Command::Init(_)
        | Command::Launch(_)
        | Command::Completions(_) => None,
    };
    let rank = group.map_or(0, |g| g.rank());
    let ui = Ui::new(cli.quiet || rank != 0);
    match cli.command {
        Command::Init(args) => Ok(init(&ui, &args)?),
        Command::Launch(args) => Ok(crate::launch::launch(&args)?),
        Command::Logits(args) => Ok(logits(&ui, &args, rank == 0)?),
        Command::Generate(args) => {
            let prompt = args.prompt().map_err(Failure::Usage)?;
            Ok(generate(&ui, &args, &prompt, rank == 0)?)
        }
        Command::Chat(args) => Ok(crate::chat::chat(&ui, &args)?),
        Command::Serve(args) => Ok(crate::serve::serve(ui, &args)?),
        Command::Completions(args) => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(args.shell, &mut cmd, "archgen", &mut std::io::stdout());
            Ok(())
        }
    }
}

fn init(ui: &Ui, args: &InitArgs) -> Result<(), String> {
    crate::init::init(ui, args)
}
