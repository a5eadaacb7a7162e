//! One generation as `archgen chat` and `archgen serve` run it: the same
//! prefill, sampling and key schedule as `archgen generate` (run.rs), so a
//! prompt, seed and temperature give the same tokens through every command;
//! plus text streaming with stop strings.

use std::borrow::Cow;
use std::path::Path;
use std::time::Instant;

use archgen_runtime::device::{release_buffer_pool, SEQUENCE_TOKENS_PER_POOL_RELEASE};
use archgen_runtime::mlx_rs::ops::indexing::TryIndexOp;
use archgen_runtime::mlx_rs::{self, Array};
use archgen_runtime::model::CausalLm;
use tokenizers::Tokenizer;

use crate::constrained::{GrammarState, TokenConstraint};
use crate::sampling::{SamplingParams, TokenSampler};
use crate::tokens::{check_ids, decode, mlx, token_value};

/// How tokens are drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub max_tokens: usize,
    /// mlx-lm's sampler and logits processors ([`crate::sampling`]).
    pub params: SamplingParams,
    /// The seed of `mx.random.seed(seed)`: the sampler's first key.
    pub seed: u64,
}

/// What a consumer of tokens wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop here (a stop string matched, or nobody listens any more).
    Stop,
}

/// Why a generation ended, as OpenAI's `finish_reason` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An EOS token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What one generation did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Generated {
    /// Tokens passed to `on_token`.
    pub produced: usize,
    pub finish: Finish,
    /// The EOS id that ended the generation, if one did.
    pub eos: Option<i32>,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// The median interval between two tokens becoming available (one step
    /// of the pipelined loop; it leaves out one-off costs such as first-use
    /// kernel compiles); 0 when no token was produced.
    pub median_step_seconds: f64,
}

/// The one decode loop of `archgen generate`, `chat` and `serve`: tokens are
/// passed to `on_token` as they come. mlx-lm's `generate_step`: prefill all
/// but the last prompt token in chunks of 2048, then feed the last as the
/// first step; the sampler and processors of [`TokenSampler`], whose key
/// starts as `mx.random.seed(seed)` sets it and is split once per draw. The token
/// stays a lazy array fed to the next forward, and step n+1 is built and
/// queued (`async_eval`) before step n's token is read, so building the graph
/// on the host overlaps the device running the previous step. The values are
/// those of the one-step-at-a-time loop; after an EOS or a `Flow::Stop` the
/// step already queued behind it runs too, and its result is dropped. An EOS
/// token ends generation and is not passed on.
///
/// With an output grammar (`constraint`) a step's mask needs the token
/// before it, so each step is built once the previous token is read (no
/// step is queued ahead), and generation ends when the grammar is complete.
pub fn generate<M: CausalLm>(
    m: &M,
    prompt: &[i32],
    sampling: &Sampling,
    constraint: Option<TokenConstraint>,
    eos: &[i32],
    mut on_token: impl FnMut(i32) -> Result<Flow, String>,
) -> Result<Generated, String> {
    check_ids("prompt", prompt, m.vocab_size())?;
    let Some((&last, head)) = prompt.split_last() else {
        return Err("the prompt has no tokens".into());
    };
    let mut cache = m.make_cache();
    let start = Instant::now();
    for chunk in head.chunks(2048) {
        let x = Array::from_slice(chunk, &[1, chunk.len() as i32]);
        mlx(mlx(m.forward(&x, &mut cache))?.eval())?;
        mlx(release_buffer_pool())?;
    }
    let prefill_seconds = start.elapsed().as_secs_f64();
    let mut sampler = TokenSampler::new(&sampling.params, sampling.seed, head)?;
    // Whether step n+1 is queued before token n is read.
    let ahead = match constraint {
        None => true,
        Some(constraint) => {
            sampler = sampler.constrained(constraint);
            false
        }
    };
    let max_tokens = sampling.max_tokens;
    let decode_start = Instant::now();
    // One step: forward of `input` (a lazy [1, 1] token), sampled lazily,
    // queued with async_eval. Nothing here waits for the device.
    let mut step = |sampler: &mut TokenSampler, input: &Array| -> Result<Array, String> {
        let logits = mlx(mlx(m.forward(input, &mut cache))?.try_index((.., -1, ..)))?;
        let token = sampler.step(&logits, input)?.token;
        mlx(mlx_rs::transforms::async_eval([&token]))?;
        Ok(token)
    };
    let mut pending = match max_tokens {
        0 => None,
        _ => Some(step(&mut sampler, &Array::from_slice(&[last], &[1, 1]))?),
    };
    let mut step_times = Vec::with_capacity(max_tokens);
    let mut since = Instant::now();
    let mut produced = 0;
    let mut ended = (Finish::Length, None);
    for n in 0..max_tokens {
        let Some(current) = pending.take() else { break };
        if ahead && n + 1 < max_tokens {
            pending = Some(step(&mut sampler, &current)?);
        }
        let token = token_value(&current)?;
        if eos.contains(&token) {
            ended = (Finish::Stop, Some(token));
            break;
        }
        step_times.push(since.elapsed().as_secs_f64());
        since = Instant::now();
        produced += 1;
        if on_token(token)? == Flow::Stop {
            ended = (Finish::Stop, None);
            break;
        }
        match sampler.accept(token)? {
            // The output grammar is complete: nothing more may follow.
            GrammarState::Complete => {
                ended = (Finish::Stop, None);
                break;
            }
            GrammarState::Open if !ahead && n + 1 < max_tokens => {
                pending = Some(step(&mut sampler, &current)?);
            }
            GrammarState::Open => {}
        }
        if n % SEQUENCE_TOKENS_PER_POOL_RELEASE == 0 {
            mlx(release_buffer_pool())?;
        }
    }
    let decode_seconds = decode_start.elapsed().as_secs_f64();
    step_times.sort_by(f64::total_cmp);
    Ok(Generated {
        produced,
        finish: ended.0,
        eos: ended.1,
        prefill_seconds,
        decode_seconds,
        median_step_seconds: step_times.get(step_times.len() / 2).copied().unwrap_or(0.0),
    })
}

/// How many positions (prompt + completion) a model takes, and where that
/// number comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelContext {
    pub tokens: usize,
    pub origin: ContextOrigin,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContextOrigin {
    /// config.json's `max_position_embeddings` (top level or text_config).
    Config,
    /// config.json omits it: the default of the family's mlx-lm `ModelArgs`,
    /// as the spec importer applies it (the reason says which).
    FamilyDefault { reason: String },
}

impl ModelContext {
    /// Where the number comes from, for messages.
    pub fn describe(&self) -> String {
        match &self.origin {
            ContextOrigin::Config => "config.json's max_position_embeddings".into(),
            ContextOrigin::FamilyDefault { reason } => {
                format!("max_position_embeddings: config.json omits it; {reason}")
            }
        }
    }
}

/// The model's context: what the spec importer reads from config.json, the
/// one place that knows each family's mlx-lm default for a field config.json
/// leaves out (e.g. 131072 for gemma4's text config).
pub fn model_context(model: &Path) -> Result<ModelContext, String> {
    let file = model.join("config.json");
    let json = crate::chat_template::read_json(&file)?;
    let (spec, defaults) = archgen_families::import::from_config_json(&json, None, "checkpoint")
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let tokens = spec.lower().max_position_embeddings;
    let applied = defaults.into_iter().find(|d| {
        d.field == "max_position_embeddings" || d.field == "text_config.max_position_embeddings"
    });
    let origin = match applied {
        None => ContextOrigin::Config,
        Some(d) => ContextOrigin::FamilyDefault {
            reason: format!("{} = {} ({})", d.field, d.value, d.reason),
        },
    };
    Ok(ModelContext { tokens, origin })
}

/// The model's hidden size (the length of its embeddings), from config.json
/// through the spec importer.
pub fn hidden_size(model: &Path) -> Result<usize, String> {
    let file = model.join("config.json");
    let json = crate::chat_template::read_json(&file)?;
    let (spec, _) = archgen_families::import::from_config_json(&json, None, "checkpoint")
        .map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(spec.lower().hidden_size)
}

/// The model's context length (see [`model_context`]).
pub fn context_length(model: &Path) -> Result<Option<usize>, String> {
    model_context(model).map(|c| Some(c.tokens))
}

/// Generated tokens turned into text as they come, cut at the first stop
/// string (which is not part of the text).
///
/// Each step decodes the whole generated id list and hands out only what is
/// new, so a character split over byte-level tokens comes out whole: text
/// ending in U+FFFD (an incomplete UTF-8 sequence) is held back, and so is a
/// tail that could be the start of a stop string.
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    stops: Cow<'a, [String]>,
    ids: Vec<u32>,
    /// Bytes of the decoded text handed out so far.
    sent: usize,
    stopped: bool,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a Tokenizer, stops: &'a [String]) -> Self {
        Self::owning(tokenizer, Cow::Borrowed(stops))
    }

    /// A stream that keeps its stop strings (one that outlives the request
    /// that gave them, as the server's scheduler holds it).
    pub fn owning(tokenizer: &'a Tokenizer, stops: Cow<'a, [String]>) -> Self {
        TextStream {
            tokenizer,
            stops,
            ids: Vec::new(),
            sent: 0,
            stopped: false,
        }
    }

    /// Adds a token; returns the new text and whether a stop string ended it.
    pub fn push(&mut self, token: i32) -> Result<(String, Flow), String> {
        if self.stopped {
            return Ok((String::new(), Flow::Stop));
        }
        self.ids.push(token as u32);
        let text = decode(self.tokenizer, &self.ids)?;
        if text.ends_with('\u{FFFD}') {
            return Ok((String::new(), Flow::Continue));
        }
        Ok(self.advance(&text, false))
    }

    /// The text held back at the end (an incomplete character or a partial
    /// stop string that never completed).
    pub fn finish(&mut self) -> Result<String, String> {
        if self.stopped || self.ids.is_empty() {
            return Ok(String::new());
        }
        let text = decode(self.tokenizer, &self.ids)?;
        Ok(self.advance(&text, true).0)
    }

    fn advance(&mut self, text: &str, last: bool) -> (String, Flow) {
        // A decoder that rewrote text already handed out (rare): what was
        // sent stays, and only text past it counts.
        let start = if text.is_char_boundary(self.sent.min(text.len())) {
            self.sent.min(text.len())
        } else {
            return (String::new(), Flow::Continue);
        };
        let earliest_stop = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| find_from(text, s, start))
            .min();
        if let Some(at) = earliest_stop {
            self.stopped = true;
            let delta = text
                .get(start..at.max(start))
                .unwrap_or_default()
                .to_string();
            self.sent = at.max(start);
            return (delta, Flow::Stop);
        }
        let end = if last {
            text.len()
        } else {
            text.len() - self.partial_stop_len(text, start)
        };
        let delta = text[start..end].to_string();
        self.sent = end;
        (delta, Flow::Continue)
    }

    /// The length of the longest tail of `text[start..]` that is a proper
    /// prefix of a stop string (held back until the next token decides).
    fn partial_stop_len(&self, text: &str, start: usize) -> usize {
        let tail = &text[start..];
        self.stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len().min(tail.len() + 1))
                    .filter(|&n| stop.is_char_boundary(n) && tail.ends_with(&stop[..n]))
            })
            .max()
            .unwrap_or(0)
    }
}

/// The first occurrence of `needle` that ends after byte `from` (a stop
/// string may begin in text already handed out only if it ends in new text;
/// text handed out never contains a whole stop string).
fn find_from(text: &str, needle: &str, from: usize) -> Option<usize> {
    let mut search = from.saturating_sub(needle.len().saturating_sub(1));
    while !text.is_char_boundary(search) {
        search -= 1;
    }
    text[search..].find(needle).map(|i| search + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tokenizer whose tokens decode to their names joined by spaces.
    fn words() -> Tokenizer {
        crate::tokens::word_level(&["<unk>", "a", "b", "STOP", "c"])
    }

    fn run(tokens: &[i32], stops: &[&str]) -> (Vec<String>, Flow) {
        let tokenizer = words();
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut stream = TextStream::new(&tokenizer, &stops);
        let mut deltas = Vec::new();
        for &t in tokens {
            let (delta, flow) = stream.push(t).unwrap();
            deltas.push(delta);
            if flow == Flow::Stop {
                return (deltas, Flow::Stop);
            }
        }
        deltas.push(stream.finish().unwrap());
        (deltas, Flow::Continue)
    }

    #[test]
    fn stop_strings_cut_the_text_and_partial_ones_are_held_back() {
        // No stop: every token's text comes out as it comes.
        assert_eq!(
            run(&[1, 2, 4], &[]),
            (
                vec!["a".into(), " b".into(), " c".into(), "".into()],
                Flow::Continue
            )
        );
        // "b S" is a prefix of "b STOP": " b" is held until STOP completes it.
        let (deltas, flow) = run(&[1, 2, 3, 4], &["b STOP"]);
        assert_eq!(flow, Flow::Stop);
        assert_eq!(deltas.concat(), "a ");
        // A stop string that starts in a token's middle.
        let (deltas, flow) = run(&[1, 3, 4], &["OP c"]);
        assert_eq!((deltas.concat().as_str(), flow), ("a ST", Flow::Stop));
        // A held-back partial match that never completes is released.
        let (deltas, flow) = run(&[1, 2], &["b STOP"]);
        assert_eq!((deltas.concat().as_str(), flow), ("a b", Flow::Continue));
        // The earliest of several stops wins.
        let (deltas, _) = run(&[1, 2, 4, 3], &["STOP", "b"]);
        assert_eq!(deltas.concat(), "a ");
    }
}
