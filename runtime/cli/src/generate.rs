//! `archgen generate`: sampled tokens for people, streamed as text (or ids)
//! with the timings at the end.

use std::io::Write;
use std::path::{Path, PathBuf};

use archgen_runtime::model::{CausalLm, ModelTask};
use llguidance::api::TopLevelGrammar;
use tokenizers::Tokenizer;

use crate::args::{GenerateArgs, Prompt};
use crate::checkpoint::{eos_ids, load_tokenizer, with_model};
use crate::constrained::{json_grammar, json_object_grammar, GrammarCompiler};
use crate::engine::{Flow, Sampling, TextStream};
use crate::sampling::{fresh_seed, SamplingParams, FLAG_NAMES};
use crate::tokens::check_ids;
use crate::ui::Ui;

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

/// Where a run's tokens go.
pub(crate) struct Destination {
    /// False on tensor-parallel ranks other than 0.
    pub prints: bool,
    /// The tensor-parallel group's size (1 alone).
    pub ranks: usize,
}

pub(crate) fn generate(
    ui: &Ui,
    args: &GenerateArgs,
    prompt: &Prompt,
    params: SamplingParams,
    to: Destination,
) -> Result<(), String> {
    let Destination { prints, ranks } = to;
    let model = args.model.as_path();
    let levers = crate::checkpoint::run_levers(&args.levers, model, args.require_tier)?;
    let seed = match (args.sampling.seed, ranks > 1 && params.temp > 0.0) {
        (Some(seed), _) => seed,
        // Every rank must draw the same tokens, and each would pick its own.
        (None, true) => {
            return Err(
                "a tensor-parallel run at --temp above 0 needs --seed S (every rank must draw \
                 the same tokens)"
                    .into(),
            )
        }
        (None, false) => fresh_seed()?,
    };
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
                true => {
                    let variables = crate::chat::template_variables(
                        tokenizer,
                        args.chat_template_args.as_deref(),
                    )?;
                    let text = crate::chat::one_user_turn(model, &variables, text)?;
                    (text, false)
                }
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
    let output = output_grammar(args, model)?;
    let task = GenerateTask {
        ids: &ids,
        what,
        eos: &eos,
        output,
        tokenizer: tokenizer.as_ref(),
        sampling: Sampling {
            max_tokens: args.max_tokens,
            params,
            seed,
        },
        ui,
        prints,
    };
    with_model(
        ui,
        model,
        args.implementation,
        args.require_tier,
        &levers,
        task,
    )
}

/// `--json-schema FILE` or `--json-object`: the grammar the output follows,
/// the flag that asked for it, and the tokenizer it is compiled against.
struct OutputGrammar {
    grammar: TopLevelGrammar,
    flag: String,
    tokenizer_json: PathBuf,
}

/// The output grammar the flags ask for, the schema file read and parsed
/// before the model loads (its errors name the file).
fn output_grammar(args: &GenerateArgs, model: &Path) -> Result<Option<OutputGrammar>, String> {
    let (grammar, flag) = match (&args.json_schema, args.json_object) {
        (None, false) => return Ok(None),
        (None, true) => (json_object_grammar(), "--json-object".to_string()),
        (Some(file), _) => {
            let flag = format!("--json-schema {}", file.display());
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("{flag}: cannot read the schema: {e}"))?;
            let schema: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| format!("{flag}: the schema is not JSON: {e}"))?;
            if !schema.is_object() {
                return Err(format!(
                    "{flag}: expected a JSON schema object ({{\"type\": ...}}), got {schema}"
                ));
            }
            (json_grammar(&schema), flag)
        }
    };
    let tokenizer_json = model.join("tokenizer.json");
    if !tokenizer_json.is_file() {
        return Err(format!(
            "{flag} needs {} (not found) to constrain the output",
            tokenizer_json.display()
        ));
    }
    Ok(Some(OutputGrammar {
        grammar,
        flag,
        tokenizer_json,
    }))
}

struct GenerateTask<'a> {
    ids: &'a [i32],
    what: &'a str,
    eos: &'a [i32],
    output: Option<OutputGrammar>,
    tokenizer: Option<&'a Tokenizer>,
    sampling: Sampling,
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
            output,
            tokenizer,
            sampling,
            ui,
            prints,
        } = self;
        check_ids(what, ids, m.vocab_size())?;
        sampling
            .params
            .check(m.vocab_size() as usize, &FLAG_NAMES)
            .map_err(|(message, _)| message)?;
        let mut streamer = match tokenizer {
            None => Streamer::Ids,
            Some(tokenizer) => Streamer::Text(TextStream::new(tokenizer, &[])),
        };
        let constraint = match output {
            None => None,
            Some(OutputGrammar {
                grammar,
                flag,
                tokenizer_json,
            }) => {
                let compiler = GrammarCompiler::new(&tokenizer_json, m.vocab_size() as usize, eos)?;
                Some(compiler.compile(grammar).map_err(|e| {
                    format!("{flag}: the schema cannot be compiled into a grammar: {e}")
                })?)
            }
        };
        let done = crate::engine::generate(m, ids, &sampling, constraint, eos, |token| {
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
            "prompt {} tokens in {:.3} s; generated {} tokens at {:.1} tokens/s{stop}; median step {:.3} ms ({:.1} tokens/s); seed {}",
            ids.len(),
            done.prefill_seconds,
            done.produced,
            done.produced as f64 / done.decode_seconds.max(1e-9),
            median * 1e3,
            1.0 / median.max(1e-12),
            sampling.seed
        ));
        Ok(())
    }
}
