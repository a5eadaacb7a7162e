//! Command-line parsing (small and dependency-free on purpose).

use std::path::PathBuf;

pub const USAGE: &str = "\
usage:
  archgen logits --model DIR --prompt-ids 1,2,3 [--decode-steps N]
                 [--impl monolith|generated|auto] --out FILE.safetensors
  archgen generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)
                 [--max-tokens N] [--temp T] [--top-p P] [--seed S]
                 [--ignore-eos] [--chat] [--impl ...]
  archgen chat --model DIR [--system TEXT] [--max-tokens N] [--temp T]
                 [--top-p P] [--seed S] [--impl ...]
  archgen serve --model DIR [--host 127.0.0.1] [--port 8080] [--impl ...]

  archgen init --spec specs/NAME.yaml --out DIR [--seed S]
                 [--dtype bfloat16|float16|float32]

init writes a random-weight checkpoint (config.json + model.safetensors, the
spec's weight quantization applied) with exactly the spec's structure.
logits writes prefill_logits [L, vocab] (one forward over the whole prompt),
decode_logits [N, vocab] (N greedy one-token steps on the same cache) and
tokens [N] int32 (the tokens fed), logits in the model's compute dtype.

generate --prompt encodes TEXT with DIR/tokenizer.json (special tokens added
as its post-processor says, e.g. <bos>) and prints decoded text; with
--prompt-ids it prints text when DIR/tokenizer.json exists, else token ids.
It stops at an EOS id from config.json / generation_config.json unless
--ignore-eos is given. --chat wraps --prompt in the checkpoint's chat template
as one user turn.

chat reads user turns from stdin (/exit or end of input ends, /reset forgets)
and streams replies; serve answers the OpenAI API (/v1/models,
/v1/completions, /v1/chat/completions) on HOST:PORT (port 0: any free port).";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Impl {
    Monolith,
    Generated,
    Auto,
}

#[derive(Debug)]
pub enum Command {
    /// A random-weight checkpoint with a spec's exact structure.
    Init {
        spec: PathBuf,
        out: PathBuf,
        seed: u64,
        dtype: String,
    },
    Logits {
        model: PathBuf,
        prompt_ids: Vec<i32>,
        decode_steps: usize,
        implementation: Impl,
        out: PathBuf,
    },
    Generate {
        model: PathBuf,
        prompt: Prompt,
        max_tokens: usize,
        temp: f32,
        top_p: f32,
        seed: u64,
        ignore_eos: bool,
        chat: bool,
        implementation: Impl,
    },
    Chat {
        model: PathBuf,
        system: Option<String>,
        max_tokens: usize,
        temp: f32,
        top_p: f32,
        seed: u64,
        implementation: Impl,
    },
    Serve {
        model: PathBuf,
        host: String,
        port: u16,
        implementation: Impl,
    },
    Help,
}

/// What `generate` starts from.
#[derive(Debug)]
pub enum Prompt {
    /// Token ids given on the command line.
    Ids(Vec<i32>),
    /// Text to encode with the model directory's tokenizer.json.
    Text(String),
}

fn parse_ids(s: &str) -> Result<Vec<i32>, String> {
    let ids: Result<Vec<i32>, String> = s
        .split(',')
        .map(|t| t.trim())
        .enumerate()
        .map(|(i, t)| {
            t.parse::<i32>().ok().filter(|v| *v >= 0).ok_or_else(|| {
                format!(
                    "--prompt-ids: item {} ('{t}') is not a non-negative integer",
                    i + 1
                )
            })
        })
        .collect();
    let ids = ids?;
    if ids.is_empty() {
        return Err("--prompt-ids: give at least one token id, e.g. --prompt-ids 2,105,7".into());
    }
    Ok(ids)
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: '{v}' is not a valid number"))
}

fn parse_init(rest: &[String]) -> Result<Command, String> {
    let (mut spec, mut out, mut seed, mut dtype) = (None, None, 0u64, "bfloat16".to_string());
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--spec" => spec = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--seed" => seed = number(flag, &value()?)?,
            "--dtype" => {
                dtype = value()?;
                if !["bfloat16", "float16", "float32"].contains(&dtype.as_str()) {
                    return Err(format!(
                        "--dtype: '{dtype}' is not one of bfloat16, float16, float32"
                    ));
                }
            }
            other => return Err(format!("init: unknown option '{other}'\n\n{USAGE}")),
        }
    }
    Ok(Command::Init {
        spec: spec.ok_or("init: --spec FILE.yaml is required")?,
        out: out.ok_or("init: --out DIR is required")?,
        seed,
        dtype,
    })
}

pub fn parse(argv: &[String]) -> Result<Command, String> {
    let Some((cmd, rest)) = argv.split_first() else {
        return Err(format!("no command given\n\n{USAGE}"));
    };
    if matches!(cmd.as_str(), "help" | "--help" | "-h") {
        return Ok(Command::Help);
    }
    if cmd == "init" {
        return parse_init(rest);
    }
    let mut model = None;
    let mut ids = None;
    let mut text = None;
    let mut ignore_eos = false;
    let mut chat = false;
    let mut system = None;
    let mut host = "127.0.0.1".to_string();
    let mut port = 8080u16;
    let mut steps = 0usize;
    let mut max_tokens = 64usize;
    let mut temp = 0.0f32;
    let mut top_p = 1.0f32;
    let mut seed = 0u64;
    let mut implementation = Impl::Auto;
    let mut out = None;
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--ignore-eos" if cmd == "generate" => ignore_eos = true,
            "--chat" if cmd == "generate" => chat = true,
            "--system" if cmd == "chat" => system = Some(value()?),
            "--host" if cmd == "serve" => host = value()?,
            "--port" if cmd == "serve" => port = number(flag, &value()?)?,
            "--prompt" if cmd == "generate" => text = Some(value()?),
            "--model" => model = Some(PathBuf::from(value()?)),
            "--prompt-ids" => ids = Some(parse_ids(&value()?)?),
            "--decode-steps" if cmd == "logits" => steps = number(flag, &value()?)?,
            "--out" if cmd == "logits" => out = Some(PathBuf::from(value()?)),
            "--max-tokens" if cmd == "generate" || cmd == "chat" => {
                max_tokens = number(flag, &value()?)?
            }
            "--temp" if cmd == "generate" || cmd == "chat" => temp = number(flag, &value()?)?,
            "--top-p" if cmd == "generate" || cmd == "chat" => top_p = number(flag, &value()?)?,
            "--seed" if cmd == "generate" || cmd == "chat" => seed = number(flag, &value()?)?,
            "--impl" => {
                implementation = match value()?.as_str() {
                    "monolith" => Impl::Monolith,
                    "generated" => Impl::Generated,
                    "auto" => Impl::Auto,
                    other => {
                        return Err(format!(
                            "--impl: '{other}' is not one of monolith, generated, auto"
                        ))
                    }
                }
            }
            other => return Err(format!("{cmd}: unknown option '{other}'\n\n{USAGE}")),
        }
    }
    let model = model.ok_or_else(|| format!("{cmd}: --model DIR is required"))?;
    match cmd.as_str() {
        "logits" => Ok(Command::Logits {
            model,
            prompt_ids: ids.ok_or("logits: --prompt-ids is required")?,
            decode_steps: steps,
            implementation,
            out: out.ok_or("logits: --out FILE.safetensors is required")?,
        }),
        "generate" => {
            if !(0.0..=1.0).contains(&top_p) || top_p == 0.0 {
                return Err(format!("--top-p: {top_p} is outside (0, 1]"));
            }
            if temp < 0.0 || !temp.is_finite() {
                return Err(format!("--temp: {temp} must be a finite number >= 0"));
            }
            if chat && ids.is_some() {
                return Err(
                    "generate: --chat wraps --prompt TEXT in the chat template; it does not take --prompt-ids"
                        .into(),
                );
            }
            let prompt = match (text, ids) {
                (Some(t), None) => Prompt::Text(t),
                (None, Some(i)) => Prompt::Ids(i),
                (Some(_), Some(_)) => {
                    return Err(
                        "generate: give either --prompt TEXT or --prompt-ids 1,2,3, not both"
                            .into(),
                    )
                }
                (None, None) => {
                    return Err("generate: give --prompt TEXT or --prompt-ids 1,2,3".into())
                }
            };
            Ok(Command::Generate {
                model,
                prompt,
                max_tokens,
                temp,
                top_p,
                seed,
                ignore_eos,
                chat,
                implementation,
            })
        }
        "chat" => Ok(Command::Chat {
            model,
            system,
            max_tokens,
            temp,
            top_p,
            seed,
            implementation,
        }),
        "serve" => Ok(Command::Serve {
            model,
            host,
            port,
            implementation,
        }),
        other => Err(format!("unknown command '{other}'\n\n{USAGE}")),
    }
}
