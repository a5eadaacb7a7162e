//! `archgen serve`: an OpenAI-compatible HTTP server (GET /v1/models and
//! /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions,
//! streamed as server-sent events or not; POST /v1/embeddings
//! ([`embeddings`]); POST /tokenize and /detokenize;
//! GET /health and GET /metrics for operations). Request bodies are read by
//! [`request`]; `--api-key` is [`auth`], `--allowed-origins` [`cors`];
//! `response_format` and a required tool call become an output grammar in
//! [`structured`].
//!
//! The model lives on one thread (MLX arrays and the model stay there) whose
//! [`scheduler`] keeps up to `--max-batch` sequences in flight, interleaving
//! prefill chunks with decode steps. HTTP handlers tokenize and check a
//! request (everything that can be refused is refused before any compute),
//! then queue it on a bounded queue (`--max-queue`; full: 429). The scheduler
//! streams text back over a per-request channel. A client that disconnects
//! drops its handler or its response stream, which cancels the sequence at
//! the next step. Each request ends with one JSON log line on stderr.

mod answer_text;
mod auth;
mod batched;
mod cors;
mod embeddings;
mod error;
mod gemma4_call_grammar;
mod metrics;
mod prompt_cache;
mod request;
mod scheduler;
mod segments;
mod structured;
mod token_bytes;
mod tools;
mod worker;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::IntoFuture;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use archgen_runtime::device::PrefillBufferPool;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokenizers::Tokenizer;
use tokio::sync::mpsc::unbounded_channel;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{StreamExt, StreamMap};

use crate::args::ServeArgs;
use crate::chat_template::ChatTemplate;
use crate::constrained::{GrammarCompiler, TokenConstraint};
use crate::embed::{EmbeddingHead, EmbeddingList};
use crate::engine::{self, Finish, ModelContext, Sampling};
use crate::sampling::{fresh_seed, Penalty, SamplingParams, DEFAULT_PENALTY_CONTEXT, FIELD_NAMES};
use crate::thinking::{self, TemplateArgs, ThinkingMarkers};
use crate::ui::Ui;
use answer_text::{AnswerFormat, AnswerSplitter, Piece, ReasoningFormat};
use embeddings::{EmbedJob, EmbeddingFields, EncodingFormat, InputLimits};
use error::ApiError;
use metrics::Metrics;
use request::{
    Body, ChatFields, CommonFields, CompletionFields, ContentField, DetokenizeFields, PromptField,
    Route, StopField, TokenizeFields, IGNORED_FIELDS_HEADER, SEED_HEADER,
};
use scheduler::{Cancel, GenEvent, Job, Limits, TokenLogprob};
use segments::Segments;
use structured::{output_shape, OutputShape, ResponseFormat, ToolChoice};
use token_bytes::TokenText;
use tools::ToolFormat;
use worker::{Work, Worker};

/// `max_tokens` when a request gives none (mlx-lm's server default).
const DEFAULT_MAX_TOKENS: usize = 512;
/// The most alternatives per token OpenAI's API returns: `logprobs` of
/// /v1/completions, `top_logprobs` of /v1/chat/completions.
const MAX_COMPLETION_LOGPROBS: u32 = 5;
const MAX_CHAT_TOP_LOGPROBS: u32 = 20;
/// The most choices (`n`) one request may ask for: each is a sequence in the
/// batch, so a request's share of the batch stays bounded.
const MAX_CHOICES: u64 = 16;

/// What every handler shares.
struct AppState {
    jobs: mpsc::SyncSender<Work>,
    /// The queue's capacity (`--max-queue`), for the 429's message.
    max_queue: usize,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    /// The tokenizer's reasoning markers: whether `enable_thinking` is on
    /// by default (thinking.rs).
    thinking: Option<ThinkingMarkers>,
    /// `--chat-template-args`: every chat's template variables.
    template_args: TemplateArgs,
    /// The model's id in responses and /v1/models: the directory's name.
    model_name: String,
    model_dir: String,
    vocab_size: i32,
    /// The model's end-of-sequence ids (an output grammar allows them where
    /// it accepts).
    eos: Vec<i32>,
    /// The output grammars' compiler, built on the first request that
    /// needs one; its error when the tokenizer cannot drive one.
    grammars: OnceLock<Result<GrammarCompiler, String>>,
    context: ModelContext,
    /// The model's hidden size: an embedding's length.
    hidden_size: usize,
    /// Why /v1/embeddings cannot run on this checkpoint (its
    /// sentence-transformers files ask for what the runtime does not do).
    embeddings_refused: Option<String>,
    /// `--max-prompt-tokens`, when given.
    max_prompt_tokens: Option<usize>,
    /// `--max-tokens`, when given.
    max_tokens_ceiling: Option<usize>,
    next_id: AtomicU64,
    metrics: Arc<Metrics>,
    /// Set on SIGTERM / Ctrl-C: /health and new completions answer 503 while
    /// in-flight requests finish.
    draining: AtomicBool,
    /// Requests queued or running (their [`InFlight`]s): the drain ends
    /// when none is left.
    live: Arc<tokio::sync::watch::Sender<usize>>,
}

/// A checked request: what to queue, and how to answer.
struct Plan {
    prompt: Vec<i32>,
    /// Where the batch may stop feeding the prompt to store its cache.
    segments: Segments,
    sampling: Sampling,
    stops: Vec<String>,
    /// Log-probabilities wanted, with this many alternatives per token.
    logprobs: Option<usize>,
    stream: bool,
    include_usage: bool,
    /// How to read the answer: reasoning markers, and the tool-call markup
    /// (chat only).
    answer: AnswerFormat,
    /// Choices (`n`): sequences of the one prompt, choice i sampling with
    /// seed + i.
    choices: usize,
    /// The output grammar (`response_format`, a required tool call).
    constraint: Option<TokenConstraint>,
    /// Fields found to be without effect once the request was read (named
    /// back with the unknown ones).
    ignored: Vec<String>,
}

fn plan(
    state: &AppState,
    prompt: Vec<i32>,
    common: CommonFields,
    max_tokens: Option<u64>,
    logprobs: Option<usize>,
) -> Result<Plan, ApiError> {
    let params = sampling_params(state, &common)?;
    let stops = match common.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s],
        Some(StopField::Many(v)) => v,
    };
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::bad_request(
            "stop: a stop string must not be empty",
            Some("stop"),
        ));
    }
    if prompt.is_empty() {
        return Err(ApiError::bad_request(
            "the prompt encodes to no tokens; give a non-empty prompt",
            None,
        ));
    }
    if let Some(at) = prompt.iter().position(|&t| t < 0 || t >= state.vocab_size) {
        return Err(ApiError::bad_request(
            format!(
                "prompt: token id {} at position {} is out of the vocabulary (size {})",
                prompt[at],
                at + 1,
                state.vocab_size
            ),
            Some("prompt"),
        ));
    }
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "max_tokens: must be at least 1",
            Some("max_tokens"),
        ));
    }
    let choices = match common.n {
        None => 1,
        Some(n @ 1..=MAX_CHOICES) => n as usize,
        Some(n) => {
            return Err(ApiError::bad_request(
                format!("n: {n} choices asked; give 1 to {MAX_CHOICES}"),
                Some("n"),
            ))
        }
    };
    let asked = max_tokens.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let max_tokens = bounded_max_tokens(state, prompt.len(), asked)?;
    let stream = common.stream.unwrap_or(false);
    let include_usage = common
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    Ok(Plan {
        segments: Segments::whole(prompt.len()),
        prompt,
        sampling: Sampling {
            max_tokens,
            params,
            seed: match common.seed {
                Some(seed) => seed,
                None => fresh_seed().map_err(|message| {
                    ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, message)
                })?,
            },
        },
        stops,
        logprobs,
        stream,
        include_usage,
        answer: AnswerFormat::default(),
        choices,
        constraint: None,
        ignored: Vec::new(),
    })
}

/// The request's sampler and logits processors, each field checked (a 400
/// naming it): mlx-lm server's defaults and ranges, and OpenAI's ranges of
/// the penalties (-2 to 2) and of logit_bias (-100 to 100).
fn sampling_params(state: &AppState, common: &CommonFields) -> Result<SamplingParams, ApiError> {
    let bad = |field: &'static str, message: String| {
        ApiError::bad_request(format!("{field}: {message}"), Some(field))
    };
    let context = |field: &'static str, value: Option<u64>| match value {
        None => Ok(DEFAULT_PENALTY_CONTEXT),
        Some(0) => Err(bad(field, "must be at least 1".into())),
        Some(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let openai_penalty = |field: &'static str, value: Option<f64>| match value {
        Some(v) if !(-2.0..=2.0).contains(&v) => Err(bad(field, format!("{v} is outside [-2, 2]"))),
        v => Ok(v),
    };
    // vLLM's clients send -1 for "no top-k", mlx-lm's 0.
    let top_k = match common.top_k {
        None | Some(-1) => 0,
        Some(k) => usize::try_from(k)
            .map_err(|_| bad("top_k", format!("{k} must be >= 0 (0 or -1 turns it off)")))?,
    };
    let presence = openai_penalty("presence_penalty", common.presence_penalty)?;
    let frequency = openai_penalty("frequency_penalty", common.frequency_penalty)?;
    let mut logit_bias = Vec::new();
    for (key, value) in common.logit_bias.iter().flatten() {
        let id = key.trim().parse::<i32>().map_err(|_| {
            bad(
                "logit_bias",
                format!("key \"{key}\" is not a token id; give {{\"token id\": bias}}"),
            )
        })?;
        let bias = value.as_f64().ok_or_else(|| {
            bad(
                "logit_bias",
                format!("the bias of token {key} is {value}, not a number"),
            )
        })?;
        if !(-100.0..=100.0).contains(&bias) {
            return Err(bad(
                "logit_bias",
                format!("the bias of token {key} is {bias}, outside [-100, 100]"),
            ));
        }
        // Two keys naming one token ("5", "05"): the later one counts, as
        // in mlx-lm server's dict.
        match logit_bias.iter_mut().find(|(seen, _)| *seen == id) {
            Some(entry) => entry.1 = bias,
            None => logit_bias.push((id, bias)),
        }
    }
    // The context sizes are checked whether or not their penalty is given,
    // as mlx-lm server checks them.
    let repetition_context = context("repetition_context_size", common.repetition_context_size)?;
    let presence_context = context("presence_context_size", common.presence_context_size)?;
    let frequency_context = context("frequency_context_size", common.frequency_context_size)?;
    let penalty =
        |value: Option<f64>, context: usize| value.map(|value| Penalty { value, context });
    let params = SamplingParams {
        temp: common.temperature.unwrap_or(1.0),
        top_p: common.top_p.unwrap_or(1.0),
        min_p: common.min_p.unwrap_or(0.0),
        min_tokens_to_keep: 1,
        top_k,
        logit_bias,
        repetition_penalty: penalty(common.repetition_penalty, repetition_context),
        presence_penalty: penalty(presence, presence_context),
        frequency_penalty: penalty(frequency, frequency_context),
    };
    params
        .check(state.vocab_size as usize, &FIELD_NAMES)
        .map_err(|(message, field)| ApiError::bad_request(message, Some(field)))?;
    Ok(params)
}

/// The request's `max_tokens` checked against the server's ceilings and the
/// model's context (prompt + completion must fit), or the default when it
/// gives none: every refusal happens here, before any compute.
fn bounded_max_tokens(
    state: &AppState,
    prompt_tokens: usize,
    asked: Option<usize>,
) -> Result<usize, ApiError> {
    let context = state.context.tokens;
    let room = context.saturating_sub(prompt_tokens);
    let too_long = match asked {
        Some(n) => prompt_tokens.saturating_add(n) > context,
        None => room == 0,
    };
    if too_long {
        let completion = asked
            .map(|n| format!(" + {n} in the completion"))
            .unwrap_or_default();
        return Err(ApiError::bad_request(
            format!(
                "this model's maximum context length is {context} tokens ({}), \
                 but the request needs {} ({prompt_tokens} in the prompt{completion}); \
                 shorten the prompt or lower max_tokens",
                state.context.describe(),
                prompt_tokens.saturating_add(asked.unwrap_or(0)),
            ),
            Some("messages"),
        ));
    }
    if let Some(limit) = state.max_prompt_tokens.filter(|&l| prompt_tokens > l) {
        return Err(ApiError::bad_request(
            format!(
                "the prompt is {prompt_tokens} tokens; this server takes at most {limit} \
                 (--max-prompt-tokens); shorten the prompt"
            ),
            Some("messages"),
        ));
    }
    if let (Some(n), Some(limit)) = (asked, state.max_tokens_ceiling) {
        if n > limit {
            return Err(ApiError::bad_request(
                format!(
                    "max_tokens: {n} is more than this server gives one request ({limit}, \
                     --max-tokens); ask for at most {limit}"
                ),
                Some("max_tokens"),
            ));
        }
    }
    let default = DEFAULT_MAX_TOKENS
        .min(room)
        .min(state.max_tokens_ceiling.unwrap_or(usize::MAX));
    Ok(asked.unwrap_or(default))
}

fn encode(
    tokenizer: &Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<i32>, ApiError> {
    // Ids only: no offsets, which cost most of the time on a long prompt.
    let encoding = tokenizer
        .encode_fast(text, add_special_tokens)
        .map_err(|e| ApiError::bad_request(format!("the prompt cannot be encoded: {e}"), None))?;
    Ok(encoding.get_ids().iter().map(|&t| t as i32).collect())
}

#[derive(Clone, Copy)]
enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    fn route(self) -> Route {
        match self {
            Endpoint::Completions => Route::Completions,
            Endpoint::Chat => Route::Chat,
        }
    }

    fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The parts of a response every chunk repeats.
struct Reply {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
    /// How to read the answer: reasoning markers, and the tool-call markup
    /// (chat only).
    answer: AnswerFormat,
    /// Prompt tokens the prompt cache supplied (known when the answer ends).
    cached_tokens: usize,
}

impl Reply {
    /// `choices[0].logprobs` for `entries` (null when not asked for), in the
    /// endpoint's OpenAI shape. `offset` is the completion text's length in
    /// characters before them (completions' `text_offset`).
    fn logprobs(&self, entries: &[TokenLogprob], offset: &mut usize) -> serde_json::Value {
        if !self.logprobs {
            return serde_json::Value::Null;
        }
        match self.endpoint {
            Endpoint::Completions => {
                let mut text_offset = Vec::with_capacity(entries.len());
                for e in entries {
                    text_offset.push(*offset);
                    *offset += e.token.chars();
                }
                let top: Vec<serde_json::Map<String, serde_json::Value>> =
                    entries.iter().map(|e| completion_top(&e.top)).collect();
                json!({
                    "tokens": entries.iter().map(|e| e.token.label()).collect::<Vec<_>>(),
                    "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
                    "top_logprobs": top,
                    "text_offset": text_offset,
                })
            }
            Endpoint::Chat => {
                let one = |token: &TokenText, logprob: f32| json!({"token": token.label(), "logprob": logprob, "bytes": token.bytes});
                let content: Vec<serde_json::Value> = entries
                    .iter()
                    .map(|e| {
                        let mut v = one(&e.token, e.logprob);
                        v["top_logprobs"] = e.top.iter().map(|(t, lp)| one(t, *lp)).collect();
                        v
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
        }
    }

    fn usage(&self, completion_tokens: usize) -> serde_json::Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    /// A streamed chunk of choice `index` carrying `delta` (and the finish
    /// reason at the end).
    fn chunk(
        &self,
        index: usize,
        delta: Delta,
        finish: Option<&'static str>,
        first: bool,
        logprobs: serde_json::Value,
    ) -> serde_json::Value {
        match self.endpoint {
            Endpoint::Completions => {
                // A completion's text is never split (answer_text.rs), so
                // it has no reasoning delta.
                let text = match delta {
                    Delta::Content(t) | Delta::Reasoning(t) => t,
                    Delta::Nothing => "",
                };
                json!({
                    "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                    "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
                })
            }
            Endpoint::Chat => {
                let mut delta = match delta {
                    Delta::Content(t) => json!({"content": t}),
                    Delta::Reasoning(t) => json!({"reasoning": t}),
                    Delta::Nothing => json!({}),
                };
                if first {
                    delta["role"] = json!("assistant");
                    if delta.get("content").is_none() {
                        delta["content"] = json!("");
                    }
                }
                json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                })
            }
        }
    }

    fn usage_chunk(&self, completion_tokens: usize) -> serde_json::Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "usage": self.usage(completion_tokens),
        })
    }

    /// Choice `index` of a non-streamed answer.
    fn choice(&self, index: usize, answer: &ChoiceAnswer) -> serde_json::Value {
        let finish = answer.end.finish.as_str();
        let logprobs = self.logprobs(&answer.entries, &mut 0);
        let text = answer.text.as_str();
        match self.endpoint {
            Endpoint::Completions => {
                json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
            }
            Endpoint::Chat => {
                let answer = AnswerSplitter::whole(&self.answer, text);
                let mut message = json!({"role": "assistant", "content": answer.content});
                if !answer.reasoning.is_empty() {
                    message["reasoning"] = json!(answer.reasoning);
                }
                if !answer.calls.is_empty() {
                    if answer.content.is_empty() {
                        message["content"] = serde_json::Value::Null;
                    }
                    message["tool_calls"] = answer
                        .calls
                        .iter()
                        .enumerate()
                        .map(|(i, call)| call.to_openai(&self.call_id(index, i), None))
                        .collect();
                }
                let finish = self.chat_finish(finish, message.get("tool_calls").is_some());
                json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
            }
        }
    }

    /// A non-streamed answer of every choice; usage counts the prompt once,
    /// as OpenAI's does for `n` choices.
    fn whole(&self, answers: &[ChoiceAnswer]) -> serde_json::Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion",
        };
        let choices: Vec<serde_json::Value> = answers
            .iter()
            .enumerate()
            .map(|(index, answer)| self.choice(index, answer))
            .collect();
        let completion_tokens = answers.iter().map(|a| a.end.completion_tokens).sum();
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": choices,
            "usage": self.usage(completion_tokens),
        })
    }

    /// The id of choice `choice`'s `index`-th tool call (choice 0's keep
    /// the form they had before `n`).
    fn call_id(&self, choice: usize, index: usize) -> String {
        match choice {
            0 => format!("call-{}-{index}", self.id),
            _ => format!("call-{}-{choice}-{index}", self.id),
        }
    }

    /// `finish_reason`: "tool_calls" when the model stopped after calling
    /// tools (as mlx-lm says it; a cut answer stays "length").
    fn chat_finish(&self, finish: &'static str, called: bool) -> &'static str {
        match (finish, called) {
            ("stop", true) => "tool_calls",
            _ => finish,
        }
    }

    /// A streamed chunk of choice `choice` carrying complete tool calls,
    /// numbered from `first_index`.
    fn tool_chunk(
        &self,
        choice: usize,
        calls: &[tools::ToolCall],
        first_index: usize,
        logprobs: serde_json::Value,
    ) -> serde_json::Value {
        let calls: Vec<serde_json::Value> = calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                call.to_openai(
                    &self.call_id(choice, first_index + i),
                    Some(first_index + i),
                )
            })
            .collect();
        json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": choice, "delta": {"tool_calls": calls}, "logprobs": logprobs, "finish_reason": null}],
        })
    }
}

/// A completions `top_logprobs` entry: token label to log-probability, one
/// key per token. Labels are the tokens' bytes (text, or `bytes:\x..`), so
/// they differ unless two ids have the same bytes (an added token that
/// spells a vocabulary piece); such a later one is keyed `token_id:N`, as
/// vLLM keys tokens by id.
fn completion_top(top: &[(TokenText, f32)]) -> serde_json::Map<String, serde_json::Value> {
    let mut map = serde_json::Map::with_capacity(top.len());
    for (token, logprob) in top {
        let label = token.label();
        let key = match map.contains_key(&label) {
            false => label,
            true => format!("token_id:{}", token.id),
        };
        map.insert(key, json!(logprob));
    }
    map
}

fn worker_gone() -> ApiError {
    ApiError::with_status(
        StatusCode::SERVICE_UNAVAILABLE,
        "the model worker has stopped; restart the server",
    )
}

/// Writes one JSON line on stderr: the server's access log.
fn log_line(line: serde_json::Value) {
    eprintln!("{line}");
}

/// How a queued request was answered.
struct Answered {
    status: u16,
    completion_tokens: usize,
    finish: Option<Finish>,
    ttft: Option<Duration>,
    error: Option<String>,
}

impl Answered {
    /// A whole answer (200), however it finished.
    fn completed(completion_tokens: usize, finish: Finish, ttft: Option<Duration>) -> Self {
        Self {
            status: 200,
            completion_tokens,
            finish: Some(finish),
            ttft,
            error: None,
        }
    }

    /// Embeddings answered (200): no tokens generated, no finish reason.
    fn embedded() -> Self {
        Self {
            status: 200,
            completion_tokens: 0,
            finish: None,
            ttft: None,
            error: None,
        }
    }

    /// No answer: the request failed with this status and message.
    fn failed(status: u16, message: String) -> Self {
        Self {
            status,
            completion_tokens: 0,
            finish: None,
            ttft: None,
            error: Some(message),
        }
    }
}

/// A queued request from the HTTP side: dropped with its handler or its
/// response stream (also when the client disconnects), it cancels the
/// sequence (a no-op once it finished) and writes the request's log line.
struct InFlight {
    id: String,
    /// The route's path, for the log line.
    path: &'static str,
    stream: bool,
    prompt_tokens: usize,
    /// The seed the request samples with (also in the response's header);
    /// None for an embedding request, which samples nothing.
    seed: Option<u64>,
    start: Instant,
    cancel: Cancel,
    answered: Option<Answered>,
    /// Prompt tokens the prompt cache supplied, once the answer ended.
    cached_tokens: Option<usize>,
    metrics: Arc<Metrics>,
    /// What the log line warns of (unknown fields the request gave).
    warning: Option<String>,
    /// The count of live requests, this one among them.
    live: Arc<tokio::sync::watch::Sender<usize>>,
}

impl InFlight {
    fn answer(&mut self, answered: Answered) {
        self.answered = Some(answered);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.live.send_modify(|n| *n -= 1);
        // 499 (nginx's "client closed request"): nobody was left to answer.
        let answered = self
            .answered
            .take()
            .unwrap_or_else(|| Answered::failed(499, "the client disconnected".into()));
        self.metrics.answered(answered.status);
        log_line(json!({
            "log": "request",
            "id": self.id,
            "endpoint": self.path,
            "stream": self.stream,
            "status": answered.status,
            "prompt_tokens": self.prompt_tokens,
            "seed": self.seed,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": answered.completion_tokens,
            "finish_reason": answered.finish.map(Finish::as_str),
            "ttft_s": answered.ttft.map(|t| t.as_secs_f64()),
            "duration_s": self.start.elapsed().as_secs_f64(),
            "error": answered.error,
            "warning": self.warning,
        }));
    }
}

/// A request refused before it was queued (a 4xx): its log line.
fn log_refusal(
    path: &'static str,
    error: &ApiError,
    start: Instant,
    metrics: &Metrics,
    warning: Option<String>,
) {
    metrics.answered(error.status.as_u16());
    log_line(json!({
        "log": "request",
        "id": null,
        "endpoint": path,
        "status": error.status.as_u16(),
        "duration_s": start.elapsed().as_secs_f64(),
        "error": error.message,
        "warning": warning,
    }));
}

/// Queues a checked request and answers it, streamed or whole, with the
/// seed it used in [`SEED_HEADER`].
async fn respond(
    state: Arc<AppState>,
    endpoint: Endpoint,
    plan: Plan,
    start: Instant,
    warning: Option<String>,
) -> Response {
    let seed = plan.sampling.seed;
    let mut response = queue_and_answer(state, endpoint, plan, start, warning).await;
    response
        .headers_mut()
        .insert(SEED_HEADER, header::HeaderValue::from(seed));
    response
}

async fn queue_and_answer(
    state: Arc<AppState>,
    endpoint: Endpoint,
    plan: Plan,
    start: Instant,
    warning: Option<String>,
) -> Response {
    let serial = state.next_id.fetch_add(1, Ordering::Relaxed);
    let reply = Reply {
        endpoint,
        id: match endpoint {
            Endpoint::Completions => format!("cmpl-{serial}"),
            Endpoint::Chat => format!("chatcmpl-{serial}"),
        },
        created: unix_now(),
        model: state.model_name.clone(),
        prompt_tokens: plan.prompt.len(),
        logprobs: plan.logprobs.is_some(),
        answer: plan.answer.clone(),
        cached_tokens: 0,
    };
    let cancel = Cancel::default();
    let mut flight = InFlight {
        id: reply.id.clone(),
        path: endpoint.path(),
        stream: plan.stream,
        prompt_tokens: plan.prompt.len(),
        seed: Some(plan.sampling.seed),
        start,
        cancel: cancel.clone(),
        answered: None,
        cached_tokens: None,
        metrics: state.metrics.clone(),
        warning,
        live: state.live.clone(),
    };
    state.live.send_modify(|n| *n += 1);
    // One sequence per choice, all cancelled together; choice i samples
    // with seed + i, so choice 0 is what the request gives with n = 1.
    let mut events = StreamMap::new();
    let mut jobs = Vec::with_capacity(plan.choices);
    let mut constraint = plan.constraint;
    for index in 0..plan.choices {
        // Each choice follows the grammar on its own: the last takes the
        // request's matcher, the others a deep copy of it.
        let constraint = match index + 1 == plan.choices {
            true => constraint.take(),
            false => constraint.as_ref().map(TokenConstraint::fork),
        };
        let (sender, receiver) = unbounded_channel();
        events.insert(index, UnboundedReceiverStream::new(receiver));
        jobs.push(Job {
            prompt: plan.prompt.clone(),
            segments: plan.segments.clone(),
            sampling: Sampling {
                seed: plan.sampling.seed.wrapping_add(index as u64),
                ..plan.sampling.clone()
            },
            stops: plan.stops.clone(),
            logprobs: plan.logprobs,
            constraint,
            events: sender,
            cancel: cancel.clone(),
            queued_at: Instant::now(),
        });
    }
    let mut refused = None;
    for job in jobs {
        state.metrics.queue_depth.inc();
        refused = match state.jobs.try_send(Work::Generate(Box::new(job))) {
            Ok(()) => None,
            Err(mpsc::TrySendError::Full(_)) => Some(ApiError::with_status(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "the server is busy: {} requests already wait (--max-queue); retry later",
                    state.max_queue
                ),
            )),
            Err(mpsc::TrySendError::Disconnected(_)) => Some(worker_gone()),
        };
        if refused.is_some() {
            // The choices already queued are cancelled with `flight`.
            state.metrics.queue_depth.dec();
            break;
        }
    }
    if let Some(error) = refused {
        flight.answer(Answered::failed(
            error.status.as_u16(),
            error.message.clone(),
        ));
        return error.into_response();
    }
    state
        .metrics
        .prompt_tokens
        .inc_by(flight.prompt_tokens as u64);
    if plan.stream {
        let body = SseBody {
            events,
            reply,
            include_usage: plan.include_usage,
            choices: (0..plan.choices)
                .map(|_| ChoiceStream::new(&plan.answer))
                .collect(),
            ends: ChoiceEnds::new(plan.choices),
            pending: VecDeque::new(),
            ended: false,
            flight,
        };
        // Comment lines while nothing else is sent (a long prefill): writing
        // them is how a client that left is noticed.
        let keep_alive = KeepAlive::new().interval(Duration::from_millis(500));
        return Sse::new(body).keep_alive(keep_alive).into_response();
    }
    whole_answer(events, plan.choices, reply, flight).await
}

/// The scheduler's events of each choice, keyed by the choice's index.
type ChoiceEvents = StreamMap<usize, UnboundedReceiverStream<GenEvent>>;

/// One choice of a non-streamed answer, once its sequence ended.
struct ChoiceAnswer {
    text: String,
    entries: Vec<TokenLogprob>,
    end: ChoiceEnd,
}

/// How one choice's sequence ended.
#[derive(Clone, Copy)]
struct ChoiceEnd {
    completion_tokens: usize,
    finish: Finish,
    ttft: Option<Duration>,
    cached_tokens: usize,
}

/// How each choice of a request ended, by index, once it did.
struct ChoiceEnds(Vec<Option<ChoiceEnd>>);

impl ChoiceEnds {
    fn new(choices: usize) -> Self {
        ChoiceEnds(vec![None; choices])
    }

    /// Records how choice `index` ended; how the request ended, once every
    /// choice has.
    fn record(&mut self, index: usize, end: ChoiceEnd) -> Option<Ended> {
        self.0[index] = Some(end);
        let ends: Option<Vec<ChoiceEnd>> = self.0.iter().copied().collect();
        ends.map(|ends| Ended::of(&ends))
    }
}

/// How a request's choices ended: what its log line and usage report.
struct Ended {
    completion_tokens: usize,
    /// Choice 0's finish (the log line names one).
    finish: Finish,
    /// The first token of any choice.
    ttft: Option<Duration>,
    /// Prompt tokens the prompt cache supplied, most over the choices.
    cached_tokens: usize,
}

impl Ended {
    /// `ends` in choice order.
    fn of(ends: &[ChoiceEnd]) -> Self {
        Ended {
            completion_tokens: ends.iter().map(|e| e.completion_tokens).sum(),
            finish: ends.first().map_or(Finish::Length, |e| e.finish),
            ttft: ends.iter().filter_map(|e| e.ttft).min(),
            cached_tokens: ends.iter().map(|e| e.cached_tokens).max().unwrap_or(0),
        }
    }

    /// The request answered: its usage's cached tokens, and its log line.
    fn settle(&self, reply: &mut Reply, flight: &mut InFlight) {
        reply.cached_tokens = self.cached_tokens;
        flight.cached_tokens = Some(self.cached_tokens);
        flight.answer(Answered::completed(
            self.completion_tokens,
            self.finish,
            self.ttft,
        ));
    }
}

/// Collects a non-streamed answer of `choices` choices. Dropped when the
/// client disconnects, which drops `flight` and so cancels the sequences.
async fn whole_answer(
    mut events: ChoiceEvents,
    choices: usize,
    mut reply: Reply,
    mut flight: InFlight,
) -> Response {
    let mut partial: Vec<(String, Vec<TokenLogprob>)> =
        (0..choices).map(|_| Default::default()).collect();
    let mut answers: Vec<Option<ChoiceAnswer>> = (0..choices).map(|_| None).collect();
    let mut ends = ChoiceEnds::new(choices);
    while let Some((index, event)) = events.next().await {
        match event {
            GenEvent::Text { text, logprobs } => {
                partial[index].0.push_str(&text);
                partial[index].1.extend(logprobs);
            }
            GenEvent::Done {
                completion_tokens,
                finish,
                ttft,
                cached_tokens,
            } => {
                let end = ChoiceEnd {
                    completion_tokens,
                    finish,
                    ttft,
                    cached_tokens,
                };
                let (text, entries) = std::mem::take(&mut partial[index]);
                answers[index] = Some(ChoiceAnswer { text, entries, end });
                if let Some(ended) = ends.record(index, end) {
                    ended.settle(&mut reply, &mut flight);
                    let answers: Vec<ChoiceAnswer> = answers.into_iter().flatten().collect();
                    return Json(reply.whole(&answers)).into_response();
                }
            }
            GenEvent::Failed(message) => {
                flight.answer(Answered::failed(500, message.clone()));
                return ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, message)
                    .into_response();
            }
        }
    }
    let error = worker_gone();
    flight.answer(Answered::failed(
        error.status.as_u16(),
        error.message.clone(),
    ));
    error.into_response()
}

/// What a streamed answer keeps per choice.
struct ChoiceStream {
    /// No chunk was sent yet (the first carries the assistant role).
    first: bool,
    /// Characters of completion text sent so far (completions' `text_offset`).
    text_offset: usize,
    /// Reads reasoning and tool calls out of the text (chat only); text
    /// that may begin a marker, and a tool call from its start marker on,
    /// is held until it is known.
    splitter: AnswerSplitter,
    /// Tool calls sent so far.
    calls_sent: usize,
    /// Log-probabilities of tokens whose text is held, sent with the next chunk.
    held_logprobs: Vec<TokenLogprob>,
}

impl ChoiceStream {
    fn new(format: &AnswerFormat) -> Self {
        ChoiceStream {
            first: true,
            text_offset: 0,
            splitter: AnswerSplitter::new(format),
            calls_sent: 0,
            held_logprobs: Vec::new(),
        }
    }

    /// The chunks of choice `index` for `pieces`: content, reasoning, and
    /// each complete tool call as `delta.tool_calls`; held log-probabilities
    /// go with the first chunk.
    fn chunks(
        &mut self,
        reply: &Reply,
        index: usize,
        pieces: Vec<Piece>,
    ) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for piece in pieces {
            let held = std::mem::take(&mut self.held_logprobs);
            let logprobs = reply.logprobs(&held, &mut self.text_offset);
            let delta = match &piece {
                Piece::Content(text) => Delta::Content(text),
                Piece::Reasoning(text) => Delta::Reasoning(text),
                Piece::Calls(calls) => {
                    if self.first {
                        out.push(reply.chunk(
                            index,
                            Delta::Nothing,
                            None,
                            true,
                            serde_json::Value::Null,
                        ));
                        self.first = false;
                    }
                    out.push(reply.tool_chunk(index, calls, self.calls_sent, logprobs));
                    self.calls_sent += calls.len();
                    continue;
                }
            };
            out.push(reply.chunk(index, delta, None, self.first, logprobs));
            self.first = false;
        }
        out
    }

    /// The chunks of new text of choice `index`.
    fn text(
        &mut self,
        reply: &Reply,
        index: usize,
        text: String,
        logprobs: Vec<TokenLogprob>,
    ) -> Vec<serde_json::Value> {
        if self.splitter.is_plain() {
            let logprobs = reply.logprobs(&logprobs, &mut self.text_offset);
            let chunk = reply.chunk(index, Delta::Content(&text), None, self.first, logprobs);
            self.first = false;
            return vec![chunk];
        }
        let pieces = self.splitter.push(&text);
        self.held_logprobs.extend(logprobs);
        self.chunks(reply, index, pieces)
    }

    /// The last chunks of choice `index`: what the splitter held, and the
    /// finish reason.
    fn finish(&mut self, reply: &Reply, index: usize, finish: Finish) -> Vec<serde_json::Value> {
        let pieces = self.splitter.finish();
        let mut out = self.chunks(reply, index, pieces);
        if self.first {
            out.push(reply.chunk(index, Delta::Nothing, None, true, serde_json::Value::Null));
            self.first = false;
        }
        let finish_reason = match reply.endpoint {
            Endpoint::Chat => reply.chat_finish(finish.as_str(), self.calls_sent > 0),
            Endpoint::Completions => finish.as_str(),
        };
        out.push(reply.chunk(
            index,
            Delta::Nothing,
            Some(finish_reason),
            false,
            serde_json::Value::Null,
        ));
        out
    }
}

/// What one streamed chunk carries besides its finish reason.
enum Delta<'t> {
    Content(&'t str),
    Reasoning(&'t str),
    Nothing,
}

/// A streamed answer: server-sent events made from the scheduler's events
/// as they come, each choice's chunks with its index. Dropping it (the
/// client left) drops `flight`, which cancels the sequences.
struct SseBody {
    events: ChoiceEvents,
    reply: Reply,
    include_usage: bool,
    choices: Vec<ChoiceStream>,
    ends: ChoiceEnds,
    pending: VecDeque<Event>,
    ended: bool,
    flight: InFlight,
}

impl SseBody {
    fn push(&mut self, values: Vec<serde_json::Value>) {
        for value in values {
            self.pending
                .push_back(Event::default().data(value.to_string()));
        }
    }

    fn on_event(&mut self, event: Option<(usize, GenEvent)>) {
        match event {
            Some((index, GenEvent::Text { text, logprobs })) => {
                let chunks = self.choices[index].text(&self.reply, index, text, logprobs);
                self.push(chunks);
                return;
            }
            Some((
                index,
                GenEvent::Done {
                    completion_tokens,
                    finish,
                    ttft,
                    cached_tokens,
                },
            )) => {
                let chunks = self.choices[index].finish(&self.reply, index, finish);
                self.push(chunks);
                let end = ChoiceEnd {
                    completion_tokens,
                    finish,
                    ttft,
                    cached_tokens,
                };
                let Some(ended) = self.ends.record(index, end) else {
                    return;
                };
                // Settled first: the usage chunk reports the cached tokens.
                ended.settle(&mut self.reply, &mut self.flight);
                if self.include_usage {
                    let usage = self.reply.usage_chunk(ended.completion_tokens);
                    self.push(vec![usage]);
                }
            }
            Some((_, GenEvent::Failed(message))) => {
                self.push(vec![json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}})]);
                self.flight.answer(Answered::failed(500, message));
            }
            None => {
                let error = worker_gone();
                self.push(vec![json!({"error": {"message": error.message, "type": "server_error", "param": null, "code": null}})]);
                self.flight
                    .answer(Answered::failed(error.status.as_u16(), error.message));
            }
        }
        self.pending.push_back(Event::default().data("[DONE]"));
        self.ended = true;
    }
}

impl tokio_stream::Stream for SseBody {
    type Item = Result<Event, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(event)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match tokio_stream::Stream::poll_next(Pin::new(&mut this.events), cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(event) => this.on_event(event),
            }
        }
    }
}

async fn completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(state, body, Endpoint::Completions).await
}

/// Checks and tokenizes a request off the async workers (a long prompt
/// takes a while to tokenize, and /v1/models, /health and /metrics stay
/// answered meanwhile), then queues and answers it.
async fn answer(state: Arc<AppState>, body: Bytes, endpoint: Endpoint) -> Response {
    let start = Instant::now();
    if state.draining.load(Ordering::Relaxed) {
        let error = ApiError::with_status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down: it finishes the requests in flight and takes no new \
             ones; retry on another instance",
        );
        log_refusal(endpoint.path(), &error, start, &state.metrics, None);
        return error.into_response();
    }
    let planning = state.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let body = match Body::parse(endpoint.route(), &body) {
            Ok(body) => body,
            Err(error) => return (Vec::new(), Err(error)),
        };
        let plan = match endpoint {
            Endpoint::Completions => plan_completion(&planning, &body),
            Endpoint::Chat => plan_chat(&planning, &body),
        };
        let mut ignored = body.ignored;
        if let Ok(plan) = &plan {
            ignored.extend(plan.ignored.iter().cloned());
            ignored.sort_unstable();
        }
        (ignored, plan)
    })
    .await;
    let (ignored, planned) = checked.unwrap_or_else(|e| {
        let error = ApiError::with_status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("checking the request failed: {e}"),
        );
        (Vec::new(), Err(error))
    });
    let ignored = Body::ignored_header(&ignored);
    let warning = ignored
        .as_ref()
        .map(|names| format!("unknown fields ignored: {names}"));
    let response = match planned {
        Ok(plan) => respond(state, endpoint, plan, start, warning).await,
        Err(error) => {
            log_refusal(endpoint.path(), &error, start, &state.metrics, warning);
            error.into_response()
        }
    };
    with_ignored_header(response, ignored)
}

/// `response` with the header naming the request's ignored fields, if any.
fn with_ignored_header(mut response: Response, ignored: Option<String>) -> Response {
    if let Some(names) = ignored {
        // Escaped to visible ASCII, so always a valid header value.
        if let Ok(value) = HeaderValue::from_str(&names) {
            response.headers_mut().insert(IGNORED_FIELDS_HEADER, value);
        }
    }
    response
}

fn plan_completion(state: &AppState, body: &Body) -> Result<Plan, ApiError> {
    let common: CommonFields = body.fields()?;
    let request: CompletionFields = body.fields()?;
    let one = |n: usize| {
        ApiError::bad_request(
            format!(
                "prompt: a list of {n} prompts was given; this server takes one prompt per request"
            ),
            Some("prompt"),
        )
    };
    let ids = |ids: Vec<i64>| -> Result<Vec<i32>, ApiError> {
        ids.iter()
            .map(|&t| i32::try_from(t))
            .collect::<Result<_, _>>()
            .map_err(|_| {
                ApiError::bad_request("prompt: a token id does not fit in 32 bits", Some("prompt"))
            })
    };
    let prompt = match request.prompt {
        PromptField::Text(text) => encode(&state.tokenizer, &text, true)?,
        PromptField::Ids(list) => ids(list)?,
        PromptField::Texts(mut texts) if texts.len() == 1 => {
            encode(&state.tokenizer, &texts.remove(0), true)?
        }
        PromptField::Texts(texts) => return Err(one(texts.len())),
        PromptField::IdLists(mut lists) if lists.len() == 1 => ids(lists.remove(0))?,
        PromptField::IdLists(lists) => return Err(one(lists.len())),
    };
    let logprobs = match request.logprobs {
        Some(n) if n > MAX_COMPLETION_LOGPROBS => {
            return Err(ApiError::bad_request(
                format!("logprobs: {n} is more than {MAX_COMPLETION_LOGPROBS}"),
                Some("logprobs"),
            ))
        }
        n => n.map(|n| n as usize),
    };
    let max_tokens = common.max_tokens;
    plan(state, prompt, common, max_tokens, logprobs)
}

async fn chat_completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(state, body, Endpoint::Chat).await
}

fn plan_chat(state: &AppState, body: &Body) -> Result<Plan, ApiError> {
    let common: CommonFields = body.fields()?;
    let request: ChatFields = body.fields()?;
    let choice = ToolChoice::of_request(request.tool_choice.as_ref(), request.tools.as_deref())?;
    let (template_kwargs, ignored) = with_reasoning_effort(
        state,
        request.chat_template_kwargs,
        request.reasoning_effort,
    );
    let chat = prepare_chat(
        state,
        request.messages,
        request.tools.clone(),
        &choice,
        template_kwargs.as_ref(),
    )?;
    let (text, tool_format, ending) = (chat.render(true)?, chat.tool_format, chat.ending()?);
    let response_format = ResponseFormat::of_request(request.response_format.as_ref())?;
    let shape = output_shape(
        response_format,
        &choice,
        request.tools.as_deref(),
        tool_format,
    )?;
    // The template writes the special tokens (like <bos>) itself.
    let prompt = encode(&state.tokenizer, &text, false)?;
    let logprobs = match (request.logprobs, request.top_logprobs) {
        (_, Some(n)) if n > MAX_CHAT_TOP_LOGPROBS => {
            return Err(ApiError::bad_request(
                format!("top_logprobs: {n} is more than {MAX_CHAT_TOP_LOGPROBS}"),
                Some("top_logprobs"),
            ))
        }
        (Some(true), top) => Some(top.unwrap_or(0) as usize),
        (Some(false) | None, Some(_)) => {
            return Err(ApiError::bad_request(
                "top_logprobs: needs logprobs: true",
                Some("top_logprobs"),
            ))
        }
        (Some(false) | None, None) => None,
    };
    let max_tokens = request.max_completion_tokens.or(common.max_tokens);
    let segments = chat_segments(state, &prompt, &ending)?;
    let mut plan = plan(state, prompt, common, max_tokens, logprobs)?;
    // A grammar holds the answer from its first token (structured.rs), so
    // the answer holds no reasoning: its text is all content, even after a
    // prompt that opened a reasoning block.
    let reasoning = match &shape {
        Some(_) => None,
        None => state
            .thinking
            .as_ref()
            .map(|markers| ReasoningFormat::for_prompt(markers, &plan.prompt)),
    };
    plan.answer = AnswerFormat {
        reasoning,
        tools: tool_format,
    };
    plan.segments = segments;
    plan.ignored = ignored;
    // Compiled last, once everything cheaper to check has passed (this
    // runs off the async executor, as every request's check does).
    plan.constraint = shape
        .map(|shape| shape.compile(grammar_compiler(state, &shape)?))
        .transpose()?;
    Ok(plan)
}

/// A chat's template variables with `reasoning_effort` among them (under
/// the request's own `chat_template_kwargs`, which win), and the fields
/// that had no effect: `reasoning_effort` when the template does not read
/// it.
fn with_reasoning_effort(
    state: &AppState,
    kwargs: Option<TemplateArgs>,
    effort: Option<request::ReasoningEffort>,
) -> (Option<TemplateArgs>, Vec<String>) {
    const VARIABLE: &str = "reasoning_effort";
    let Some(effort) = effort else {
        return (kwargs, Vec::new());
    };
    let reads = state
        .template
        .as_ref()
        .is_some_and(|t| t.reads_variable(VARIABLE));
    match reads {
        true => {
            let mut kwargs = kwargs.unwrap_or_default();
            kwargs
                .entry(VARIABLE)
                .or_insert_with(|| json!(effort.as_str()));
            (Some(kwargs), Vec::new())
        }
        false => (kwargs, vec![VARIABLE.to_string()]),
    }
}

/// The server's grammar compiler, built on first use; a tokenizer
/// llguidance cannot read is a 400 naming the field that asked for a
/// grammar.
fn grammar_compiler<'s>(
    state: &'s AppState,
    shape: &OutputShape,
) -> Result<&'s GrammarCompiler, ApiError> {
    let built = state.grammars.get_or_init(|| {
        GrammarCompiler::new(
            &std::path::Path::new(&state.model_dir).join("tokenizer.json"),
            state.vocab_size as usize,
            &state.eos,
        )
    });
    built.as_ref().map_err(|message| {
        let field = shape.field();
        ApiError::bad_request(
            format!("{field}: this model's tokenizer cannot drive a constrained answer: {message}"),
            Some(field),
        )
    })
}

/// How a conversation ends, which decides its prompt's segments
/// (mlx-lm's `_tokenize`).
enum ChatEnding {
    /// Not with a user turn: the prompt is one segment.
    OtherTurn,
    /// With a user turn; `system_text` is the template's rendering of the
    /// leading system turns and an empty user turn, when there are any.
    UserTurn { system_text: Option<String> },
}

/// A chat prompt's segments (segments.rs): the system segment ends where
/// the prompt leaves the rendering of its system turns.
fn chat_segments(
    state: &AppState,
    prompt: &[i32],
    ending: &ChatEnding,
) -> Result<Segments, ApiError> {
    let system_text = match ending {
        ChatEnding::OtherTurn => return Ok(Segments::whole(prompt.len())),
        ChatEnding::UserTurn { system_text } => system_text,
    };
    let system_end = match system_text {
        None => 0,
        Some(text) => encode(&state.tokenizer, text, false)?
            .iter()
            .zip(prompt)
            .position(|(a, b)| a != b)
            .unwrap_or(0),
    };
    Ok(Segments::of_chat(
        prompt,
        system_end,
        state.thinking.as_ref(),
    ))
}

/// A conversation ready for the model's chat template: its messages as
/// the template takes them, the tools and variables it is rendered with,
/// and the tool-call markup to read from the answer (when tools are
/// offered).
struct PreparedChat<'s> {
    template: &'s ChatTemplate,
    messages: Vec<serde_json::Value>,
    tools: minijinja::Value,
    variables: Vec<thinking::TemplateVariable>,
    tool_format: Option<ToolFormat>,
}

impl PreparedChat<'_> {
    /// The conversation's prompt text.
    fn render(&self, add_generation_prompt: bool) -> Result<String, ApiError> {
        self.render_turns(&self.messages, add_generation_prompt)
    }

    fn render_turns(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, ApiError> {
        self.template
            .render_with_tools(
                minijinja::Value::from_serialize(messages),
                self.tools.clone(),
                add_generation_prompt,
                &self.variables,
            )
            .map_err(|e| ApiError::bad_request(e, Some("messages")))
    }

    /// How the conversation ends: with a user turn, its system turns
    /// followed by an empty user turn rendered the same way (mlx-lm's
    /// server finds where the system prompt ends from it:
    /// [`chat_segments`]).
    fn ending(&self) -> Result<ChatEnding, ApiError> {
        let role = |m: &serde_json::Value| m["role"].as_str().map(str::to_owned);
        let system_turns = self
            .messages
            .iter()
            .take_while(|m| role(m).as_deref() == Some("system"))
            .count();
        Ok(
            match (self.messages.last().and_then(role).as_deref(), system_turns) {
                (Some("user"), 0) => ChatEnding::UserTurn { system_text: None },
                (Some("user"), _) => {
                    let mut turns = self.messages[..system_turns].to_vec();
                    turns.push(json!({"role": "user", "content": ""}));
                    ChatEnding::UserTurn {
                        system_text: Some(self.render_turns(&turns, false)?),
                    }
                }
                _ => ChatEnding::OtherTurn,
            },
        )
    }
}

/// A conversation checked and made ready for the model's chat template
/// ([`PreparedChat`]).
fn prepare_chat<'s>(
    state: &'s AppState,
    conversation: Vec<request::ChatMessage>,
    offered_tools: Option<Vec<serde_json::Value>>,
    tool_choice: &ToolChoice,
    template_kwargs: Option<&TemplateArgs>,
) -> Result<PreparedChat<'s>, ApiError> {
    let Some(template) = &state.template else {
        return Err(ApiError::bad_request(
            format!(
                "{} has no chat template (chat_template in tokenizer_config.json, or chat_template.jinja); \
                 use /v1/completions",
                state.model_dir
            ),
            None,
        ));
    };
    if conversation.is_empty() {
        return Err(ApiError::bad_request(
            "messages: give at least one message",
            Some("messages"),
        ));
    }
    let mut messages = Vec::with_capacity(conversation.len());
    for (i, m) in conversation.into_iter().enumerate() {
        let content = match m.content {
            None => String::new(),
            Some(ContentField::Text(t)) => t,
            Some(ContentField::Parts(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::bad_request(
                                format!("messages[{i}].content: a '{kind}' part is not served (text parts only)"),
                                Some("messages"),
                            ))
                        }
                    }
                }
                text
            }
        };
        let mut message = serde_json::Map::new();
        message.insert("role".into(), json!(m.role));
        message.insert("content".into(), json!(content));
        if let Some(calls) = m.tool_calls {
            message.insert("tool_calls".into(), history_tool_calls(i, calls)?);
        }
        if let Some(id) = m.tool_call_id {
            message.insert("tool_call_id".into(), json!(id));
        }
        for (key, text) in [
            ("reasoning", m.reasoning),
            ("reasoning_content", m.reasoning_content),
        ] {
            if let Some(text) = text {
                message.insert(key.into(), json!(text));
            }
        }
        messages.push(serde_json::Value::Object(message));
    }
    let tool_format = match (&offered_tools, tool_choice) {
        (None, _) => None,
        // "none": the model is not told of the tools, and its answer is text.
        (Some(_), ToolChoice::None) => None,
        (Some(_), ToolChoice::Auto | ToolChoice::Required | ToolChoice::Function(_)) => {
            tool_format_of(state, template)?
        }
    };
    let tools = match (tool_format, offered_tools) {
        (Some(_), Some(tools)) => minijinja::Value::from_serialize(&tools),
        _ => minijinja::Value::from(()),
    };
    let variables = thinking::template_variables(
        state.thinking.is_some(),
        &state.template_args,
        template_kwargs,
    );
    Ok(PreparedChat {
        template,
        messages,
        tools,
        variables,
        tool_format,
    })
}

/// POST /tokenize and /detokenize (vLLM's names and shapes): checked and
/// run off the async workers, as a completion's prompt is.
async fn tokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    tokens_route(state, body, Route::Tokenize, tokenize_body).await
}

async fn detokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    tokens_route(state, body, Route::Detokenize, detokenize_body).await
}

/// How /tokenize or /detokenize answers a parsed body.
type TokensAnswer = fn(&AppState, &Body) -> Result<serde_json::Value, ApiError>;

async fn tokens_route(
    state: Arc<AppState>,
    body: Bytes,
    route: Route,
    answer: TokensAnswer,
) -> Response {
    let done = tokio::task::spawn_blocking(move || {
        let body = Body::parse(route, &body)?;
        let answer = answer(&state, &body)?;
        Ok::<_, ApiError>((answer, Body::ignored_header(&body.ignored)))
    })
    .await;
    let (answer, ignored) = match done {
        Ok(Ok(done)) => done,
        Ok(Err(error)) => return error.into_response(),
        Err(e) => {
            return ApiError::with_status(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("tokenizing failed: {e}"),
            )
            .into_response()
        }
    };
    with_ignored_header(Json(answer).into_response(), ignored)
}

/// `{"prompt": text}` (special tokens added unless `add_special_tokens`
/// is false) or `{"messages": [...]}` (rendered by the chat template as
/// /v1/chat/completions renders them) to `{"tokens", "count", "max_model_len"}`.
fn tokenize_body(state: &AppState, body: &Body) -> Result<serde_json::Value, ApiError> {
    let request: TokenizeFields = body.fields()?;
    let tokens = match (request.prompt, request.messages) {
        (Some(text), None) => encode(
            &state.tokenizer,
            &text,
            request.add_special_tokens.unwrap_or(true),
        )?,
        (None, Some(messages)) => {
            let generation_prompt = request.add_generation_prompt.unwrap_or(true);
            let text = prepare_chat(
                state,
                messages,
                request.tools,
                &ToolChoice::Auto,
                request.chat_template_kwargs.as_ref(),
            )?
            .render(generation_prompt)?;
            encode(
                &state.tokenizer,
                &text,
                request.add_special_tokens.unwrap_or(false),
            )?
        }
        (Some(_), Some(_)) | (None, None) => {
            return Err(ApiError::bad_request(
                "give either prompt (text) or messages (a conversation), exactly one",
                None,
            ))
        }
    };
    Ok(json!({"tokens": tokens, "count": tokens.len(), "max_model_len": state.context.tokens}))
}

/// `{"tokens": [...]}` to `{"prompt": text}` (special tokens kept); an id
/// the tokenizer does not have is a 400 naming its index.
fn detokenize_body(state: &AppState, body: &Body) -> Result<serde_json::Value, ApiError> {
    let request: DetokenizeFields = body.fields()?;
    let mut ids = Vec::with_capacity(request.tokens.len());
    for (i, &token) in request.tokens.iter().enumerate() {
        let known = u32::try_from(token)
            .ok()
            .filter(|&id| state.tokenizer.id_to_token(id).is_some());
        let Some(id) = known else {
            return Err(ApiError::bad_request(
                format!(
                    "tokens[{i}]: {token} is not a token id of this model's tokenizer \
                     (it has {} tokens)",
                    state.tokenizer.get_vocab_size(true)
                ),
                Some(&format!("tokens[{i}]")),
            ));
        };
        ids.push(id);
    }
    let text = crate::tokens::decode(&state.tokenizer, &ids)
        .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    Ok(json!({"prompt": text}))
}

/// The tool-call markup the model's chat template teaches; a request with
/// tools for a template that knows none is refused (as mlx-lm refuses it).
fn tool_format_of(
    state: &AppState,
    template: &ChatTemplate,
) -> Result<Option<ToolFormat>, ApiError> {
    match ToolFormat::of_template(template.source()) {
        Ok(Some(format)) => Ok(Some(format)),
        Err(parser) => Err(ApiError::bad_request(
            format!(
                "tools: the chat template of {} writes tool calls in mlx-lm's `{parser}` format, \
                 which this server does not parse (it reads Qwen's <tool_call> JSON and Gemma 4's \
                 <|tool_call>); leave tools out",
                state.model_dir
            ),
            Some("tools"),
        )),
        Ok(None) => Err(ApiError::bad_request(
            format!(
                "tools: the chat template of {} does not teach tool calls (no <tool_call> markup); \
                 leave tools out",
                state.model_dir
            ),
            Some("tools"),
        )),
    }
}

/// An assistant turn's `tool_calls` as templates take them: each
/// function's `arguments`, JSON text in the API, becomes the object it
/// spells (as mlx-lm and transformers' templates expect).
fn history_tool_calls(
    i: usize,
    calls: Vec<serde_json::Value>,
) -> Result<serde_json::Value, ApiError> {
    let mut out = Vec::with_capacity(calls.len());
    for (j, mut call) in calls.into_iter().enumerate() {
        let arguments = call
            .get_mut("function")
            .and_then(|f| f.get_mut("arguments"));
        if let Some(arguments) = arguments {
            if let serde_json::Value::String(text) = arguments {
                *arguments = serde_json::from_str(text).map_err(|e| {
                    ApiError::bad_request(
                        format!(
                            "messages[{i}].tool_calls[{j}].function.arguments: not JSON text: {e}"
                        ),
                        Some("messages"),
                    )
                })?;
            }
        }
        out.push(call);
    }
    Ok(serde_json::Value::Array(out))
}

/// The model object of the served model (OpenAI's `Model`).
/// The path of the embeddings route, for log lines.
const EMBEDDINGS_PATH: &str = "/v1/embeddings";

/// A checked embedding request.
struct EmbedPlan {
    inputs: Vec<Vec<i32>>,
    format: EncodingFormat,
}

/// POST /v1/embeddings: checked and tokenized off the async workers (as a
/// completion is), queued for the model thread, which embeds one input per
/// scheduler step between generation steps (worker.rs), and answered as
/// OpenAI's embeddings list.
async fn embeddings(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let start = Instant::now();
    if state.draining.load(Ordering::Relaxed) {
        let error = ApiError::with_status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down: it finishes the requests in flight and takes no new \
             ones; retry on another instance",
        );
        log_refusal(EMBEDDINGS_PATH, &error, start, &state.metrics, None);
        return error.into_response();
    }
    let planning = state.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let body = match Body::parse(Route::Embeddings, &body) {
            Ok(body) => body,
            Err(error) => return (Vec::new(), Err(error)),
        };
        let plan = plan_embeddings(&planning, &body);
        (body.ignored, plan)
    })
    .await;
    let (ignored, planned) = checked.unwrap_or_else(|e| {
        let error = ApiError::with_status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("checking the request failed: {e}"),
        );
        (Vec::new(), Err(error))
    });
    let ignored = Body::ignored_header(&ignored);
    let warning = ignored
        .as_ref()
        .map(|names| format!("unknown fields ignored: {names}"));
    let response = match planned {
        Ok(plan) => embed_and_answer(state, plan, start, warning).await,
        Err(error) => {
            log_refusal(EMBEDDINGS_PATH, &error, start, &state.metrics, warning);
            error.into_response()
        }
    };
    with_ignored_header(response, ignored)
}

fn plan_embeddings(state: &AppState, body: &Body) -> Result<EmbedPlan, ApiError> {
    if let Some(reason) = &state.embeddings_refused {
        return Err(ApiError::with_status(
            StatusCode::NOT_IMPLEMENTED,
            format!("/v1/embeddings cannot run on this checkpoint: {reason}"),
        ));
    }
    let fields: EmbeddingFields = body.fields()?;
    let hidden = state.hidden_size;
    match fields.dimensions {
        Some(d) if d != hidden as u64 => {
            return Err(ApiError::bad_request(
                format!(
                    "dimensions: {d} is not served: this server returns the model's full \
                     {hidden} dimensions (no truncation); leave it out or give {hidden}"
                ),
                Some("dimensions"),
            ))
        }
        Some(_) | None => {}
    }
    let (max_tokens, max_tokens_origin) = match state.max_prompt_tokens {
        Some(n) if n < state.context.tokens => (n, "--max-prompt-tokens".to_string()),
        Some(_) | None => (
            state.context.tokens,
            format!("the model's context: {}", state.context.describe()),
        ),
    };
    let limits = InputLimits {
        tokenizer: &state.tokenizer,
        vocab_size: state.vocab_size,
        max_tokens,
        max_tokens_origin,
    };
    Ok(EmbedPlan {
        inputs: embeddings::inputs_of(&fields.input, &limits)?,
        format: fields.encoding_format.unwrap_or(EncodingFormat::Float),
    })
}

/// Queues a checked embedding request and answers it whole. Dropped when
/// the client disconnects, which drops `flight` and so cancels the request
/// before its next input.
async fn embed_and_answer(
    state: Arc<AppState>,
    plan: EmbedPlan,
    start: Instant,
    warning: Option<String>,
) -> Response {
    let serial = state.next_id.fetch_add(1, Ordering::Relaxed);
    let prompt_tokens = plan.inputs.iter().map(Vec::len).sum();
    let cancel = Cancel::default();
    let mut flight = InFlight {
        id: format!("embd-{serial}"),
        path: EMBEDDINGS_PATH,
        stream: false,
        prompt_tokens,
        seed: None,
        start,
        cancel: cancel.clone(),
        answered: None,
        cached_tokens: None,
        metrics: state.metrics.clone(),
        warning,
        live: state.live.clone(),
    };
    state.live.send_modify(|n| *n += 1);
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = EmbedJob {
        inputs: plan.inputs,
        reply,
        cancel,
    };
    state.metrics.queue_depth.inc();
    let refused = match state.jobs.try_send(Work::Embed(job)) {
        Ok(()) => None,
        Err(mpsc::TrySendError::Full(_)) => Some(ApiError::with_status(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the server is busy: {} requests already wait (--max-queue); retry later",
                state.max_queue
            ),
        )),
        Err(mpsc::TrySendError::Disconnected(_)) => Some(worker_gone()),
    };
    if let Some(error) = refused {
        state.metrics.queue_depth.dec();
        flight.answer(Answered::failed(
            error.status.as_u16(),
            error.message.clone(),
        ));
        return error.into_response();
    }
    state.metrics.prompt_tokens.inc_by(prompt_tokens as u64);
    let rows = match answer.await {
        Ok(Ok(rows)) => rows,
        Ok(Err(message)) => {
            flight.answer(Answered::failed(500, message.clone()));
            return ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, message)
                .into_response();
        }
        Err(_) => {
            let error = worker_gone();
            flight.answer(Answered::failed(
                error.status.as_u16(),
                error.message.clone(),
            ));
            return error.into_response();
        }
    };
    flight.answer(Answered::embedded());
    let model = state.model_name.clone();
    let body = match plan.format {
        EncodingFormat::Float => {
            serde_json::to_value(EmbeddingList::new(model, rows, prompt_tokens))
        }
        EncodingFormat::Base64 => {
            let encoded = rows.iter().map(|r| embeddings::base64_f32(r)).collect();
            serde_json::to_value(EmbeddingList::new(model, encoded, prompt_tokens))
        }
    };
    match body {
        Ok(body) => Json(body).into_response(),
        Err(e) => ApiError::with_status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot write the embeddings as JSON: {e}"),
        )
        .into_response(),
    }
}

fn model_object(state: &AppState) -> serde_json::Value {
    json!({"id": state.model_name, "object": "model", "created": 0, "owned_by": "archgen"})
}

async fn models(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": [model_object(&state)]}))
}

/// GET /v1/models/{id}: the served model, or OpenAI's 404 for another id
/// (which may hold slashes, as hub ids do).
async fn model_by_id(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if id == state.model_name {
        return Json(model_object(&state)).into_response();
    }
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "the model `{id}` does not exist: this server serves `{}`",
            state.model_name
        ),
        param: Some("model".into()),
        code: Some("model_not_found"),
    }
    .into_response()
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.draining.load(Ordering::Relaxed) {
        false => Json(json!({"status": "ok"})).into_response(),
        true => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        )
            .into_response(),
    }
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    match state.metrics.render() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => ApiError::with_status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the metrics: {e}"),
        )
        .into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::with_status(
        StatusCode::NOT_FOUND,
        "no such endpoint: this server has GET /v1/models, GET /v1/models/{id}, \
                  POST /v1/completions, POST /v1/chat/completions, POST /v1/embeddings, \
                  POST /tokenize, POST /detokenize, \
                  GET /health and GET /metrics",
    )
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
async fn stop_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(e) => {
                eprintln!("archgen: serve: cannot listen for SIGTERM ({e}); Ctrl-C still stops");
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

pub fn serve(ui: Ui, args: &ServeArgs) -> Result<(), String> {
    let levers = crate::checkpoint::run_levers(&args.levers, &args.model, args.require_tier)?;
    // MLX's CUDA graph cache size (the cuda-graph-cache lever, whose
    // environment source is this variable): before the model loads, so
    // before MLX's CUDA backend reads it. Continuous batching runs a new
    // graph shape for every batch size and prefill length; past MLX
    // 0.32.2's default of 400 graphs its CUDA backend throws "Cache
    // thrashing is happening" and fails the step (seen on an H200: 63 of 64
    // requests at 32 clients), hence the lever's default (levers.rs).
    std::env::set_var(
        crate::levers::CUDA_GRAPH_CACHE_VAR,
        levers.values.cuda_graph_cache.to_string(),
    );
    let model = args.model.as_path();
    if !model.is_dir() {
        return Err(format!("{}: not a directory", model.display()));
    }
    let tokenizer = crate::checkpoint::load_tokenizer(model)?.ok_or_else(|| {
        format!(
            "serve needs {} (not found) to turn text into tokens",
            model.join("tokenizer.json").display()
        )
    })?;
    let thinking = ThinkingMarkers::of(&tokenizer)?;
    let template_args = crate::chat::template_args(args.chat_template_args.as_deref())?;
    let tokenizer = Arc::new(tokenizer);
    let template = ChatTemplate::load(model)?;
    if template.is_none() {
        ui.note(&format!(
            "serve: {} has no chat template: /v1/chat/completions will answer 400",
            model.display()
        ));
    }
    let eos = crate::checkpoint::eos_ids(model)?;
    let context = engine::model_context(model)?;
    let hidden_size = engine::hidden_size(model)?;
    // A checkpoint whose embedding head cannot run still serves generation.
    let (embedding_head, embeddings_refused) = match EmbeddingHead::read(model) {
        Ok(head) => {
            ui.note(&format!("serve: /v1/embeddings: {}", head.describe()));
            (Some(head), None)
        }
        Err(reason) => {
            ui.note(&format!("serve: /v1/embeddings will answer 501: {reason}"));
            (None, Some(reason))
        }
    };
    ui.note(&format!(
        "serve: context {} tokens ({})",
        context.tokens,
        context.describe()
    ));
    let to_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let limits = Limits {
        max_batch: to_usize(levers.values.max_batch),
        prefill_step: to_usize(levers.values.prefill_step),
        prompt_cache_bytes: usize::try_from(args.prompt_cache_bytes).unwrap_or(usize::MAX),
        prompt_cache_size: args.prompt_cache_size as usize,
        prefill_buffer_pool: match levers.values.keep_buffer_pool {
            true => PrefillBufferPool::Kept,
            false => PrefillBufferPool::Released,
        },
        first_steps: levers.values.first_steps(),
        chunk_after_start: levers.values.chunk_after_start(),
        prefill_step_while_generating: levers.values.prefill_step_while_generating_tokens(),
    };
    let max_queue = args.max_queue as usize;
    let metrics = Arc::new(Metrics::new());
    let (jobs_tx, jobs_rx) = mpsc::sync_channel(max_queue);
    let (ready_tx, ready_rx) = mpsc::channel();
    let worker = Worker {
        model_label: model.display().to_string(),
        jobs: jobs_rx,
        ready: ready_tx,
        tokenizer: tokenizer.clone(),
        eos: eos.clone(),
        limits,
        metrics: metrics.clone(),
        embedding_head,
    };
    let model_path = model.to_path_buf();
    // Every implementation batches (the generated models and the monolith
    // share the batched blocks), so `--impl` picks as in every command.
    let implementation = args.implementation;
    let require_tier = args.require_tier;
    let worker_thread = std::thread::Builder::new()
        .name("archgen-model".into())
        .spawn(move || {
            crate::checkpoint::with_model(
                &ui,
                &model_path,
                implementation,
                require_tier,
                &levers,
                worker,
            )
        })
        .map_err(|e| format!("cannot start the model thread: {e}"))?;
    let vocab_size = match ready_rx.recv() {
        Ok(v) => v,
        // The worker ended before it was ready: the load failed.
        Err(_) => {
            return Err(match worker_thread.join() {
                Ok(Err(message)) => message,
                Ok(Ok(())) => "the model thread ended before loading the model".into(),
                Err(_) => "the model thread panicked while loading the model".into(),
            })
        }
    };
    let model_name = model
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| model.display().to_string());
    let state = Arc::new(AppState {
        jobs: jobs_tx,
        max_queue,
        tokenizer,
        template,
        thinking,
        template_args,
        model_name: model_name.clone(),
        model_dir: model.display().to_string(),
        vocab_size,
        eos,
        grammars: OnceLock::new(),
        context,
        hidden_size,
        embeddings_refused,
        max_prompt_tokens: args.max_prompt_tokens.map(to_usize),
        max_tokens_ceiling: args.max_tokens.map(to_usize),
        next_id: AtomicU64::new(1),
        metrics,
        draining: AtomicBool::new(false),
        live: Arc::new(tokio::sync::watch::Sender::new(0)),
    });
    let api_key = args.api_key.clone().map(auth::ApiKey::new).transpose()?;
    let cors = cors::Cors::new(&args.allowed_origins)?;
    let app = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model_by_id))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .with_state(state.clone());
    let keyed = api_key.is_some();
    let app = match api_key {
        Some(key) => app.layer(axum::middleware::from_fn_with_state(
            Arc::new(key),
            auth::require_key,
        )),
        None => app,
    };
    // Outside the key check: a browser's preflight carries no key.
    let app = cors.wrap(app);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let (host, port) = (args.host.as_str(), args.port);
    let drain = Duration::from_secs(args.drain_seconds);
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host, port))
            .await
            .map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("cannot read the listening address: {e}"))?;
        if !keyed && !addr.ip().is_loopback() {
            eprintln!(
                "archgen: serve: warning: listening on {addr}, beyond this machine, with no \
                 --api-key (or ARCHGEN_API_KEY): anyone who reaches it can run the model"
            );
        }
        eprintln!(
            "archgen: serving {model_name} at http://{addr}/v1 (OpenAI API: /v1/models, /v1/completions, \
             /v1/chat/completions, /v1/embeddings; /tokenize, /detokenize, /health, /metrics; Ctrl-C or SIGTERM stops)"
        );
        let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
        let draining = state.clone();
        // The listener keeps accepting while the drain runs (so /health's
        // 503 and new requests' 503 are seen), and stops when no request is
        // left in flight.
        let drained = async move {
            stop_signal().await;
            draining.draining.store(true, Ordering::Relaxed);
            eprintln!(
                "archgen: serve: stopping: new requests get 503; in-flight requests finish \
                 (for at most {} s)",
                drain.as_secs()
            );
            let _ = stopping_tx.send(true);
            let mut live = draining.live.subscribe();
            // Err: the sender is gone with the state, so nothing is in flight.
            let _ = live.wait_for(|&n| n == 0).await;
        };
        let server = axum::serve(listener, app)
            .with_graceful_shutdown(drained)
            .into_future();
        // Past the drain bound the server stops waiting for in-flight requests.
        let bound = async move {
            let mut stopping = stopping_rx;
            if stopping.wait_for(|&stop| stop).await.is_err() {
                // The server ended without a signal: nothing to bound.
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(drain).await;
        };
        tokio::select! {
            served = server => served.map_err(|e| format!("the server failed: {e}"))?,
            _ = bound => eprintln!(
                "archgen: serve: in-flight requests still running after {} s (--drain-seconds); stopping anyway",
                drain.as_secs()
            ),
        }
        Ok(())
    });
    // Dropping the runtime drops every request still held (cancelling its
    // sequence) and so the queue's last sender: the scheduler ends after its
    // current step. The model (and MLX's arrays) must be gone before the
    // process exits, or MLX's teardown races the model thread.
    drop(runtime);
    if worker_thread.join().is_err() {
        eprintln!("archgen: serve: the model thread panicked while stopping");
    }
    eprintln!("archgen: serve: stopped");
    served
}

#[cfg(test)]
mod tests {
    //! The chat answer built from a text with tool-call markup (a
    //! random-weight model writes none, so the server end to end cannot
    //! show it).

    use super::*;

    fn reply(tool_format: Option<ToolFormat>) -> Reply {
        let answer = AnswerFormat {
            reasoning: None,
            tools: tool_format,
        };
        Reply {
            endpoint: Endpoint::Chat,
            id: "chatcmpl-7".into(),
            created: 0,
            model: "m".into(),
            prompt_tokens: 3,
            logprobs: false,
            answer,
            cached_tokens: 0,
        }
    }

    /// A whole answer of one choice.
    fn one_choice(reply: &Reply, text: &str, finish: Finish) -> serde_json::Value {
        reply.whole(&[ChoiceAnswer {
            text: text.to_string(),
            entries: Vec::new(),
            end: ChoiceEnd {
                completion_tokens: 5,
                finish,
                ttft: None,
                cached_tokens: 0,
            },
        }])
    }

    const TEXT: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    #[test]
    fn a_whole_answer_returns_the_calls() {
        let whole = one_choice(&reply(Some(ToolFormat::Hermes)), TEXT, Finish::Stop);
        let choice = &whole["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(
            choice["message"],
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "call-chatcmpl-7-0", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]})
        );
        // Cut by max_tokens: the reason stays "length".
        let cut = one_choice(&reply(Some(ToolFormat::Hermes)), TEXT, Finish::Length);
        assert_eq!(cut["choices"][0]["finish_reason"], "length");
        // Without tools in the request the markup is text.
        let plain = one_choice(&reply(None), TEXT, Finish::Stop);
        assert_eq!(plain["choices"][0]["message"]["content"], TEXT);
        assert_eq!(plain["choices"][0]["finish_reason"], "stop");
        assert!(plain["choices"][0]["message"].get("tool_calls").is_none());
        // Malformed markup stays text, and the reason stays "stop".
        let bad = "Hi <tool_call>{\"name\": }</tool_call>";
        let kept = one_choice(&reply(Some(ToolFormat::Hermes)), bad, Finish::Stop);
        assert_eq!(kept["choices"][0]["message"]["content"], bad);
        assert_eq!(kept["choices"][0]["finish_reason"], "stop");
    }

    /// Two tokens that are parts of characters (the bytes 0xE2 and 0xE3)
    /// both decode to U+FFFD: each keeps its own entry, keyed and given
    /// with its bytes.
    #[test]
    fn logprobs_keep_every_token_apart() {
        let byte = |id: i32, b: u8| TokenText { id, bytes: vec![b] };
        let entry = TokenLogprob {
            token: byte(200, 0xE2),
            logprob: -0.5,
            top: vec![
                (byte(200, 0xE2), -0.5),
                (byte(201, 0xE3), -1.0),
                (byte(7, b'a'), -3.0),
            ],
        };
        let mut completions = reply(None);
        completions.endpoint = Endpoint::Completions;
        completions.logprobs = true;
        let v = completions.logprobs(std::slice::from_ref(&entry), &mut 0);
        assert_eq!(
            v["top_logprobs"][0],
            json!({"bytes:\\xe2": -0.5, "bytes:\\xe3": -1.0, "a": -3.0})
        );
        assert_eq!(v["tokens"][0], "bytes:\\xe2");
        let mut chat = reply(None);
        chat.logprobs = true;
        let v = chat.logprobs(&[entry], &mut 0);
        let content = &v["content"][0];
        assert_eq!(content["bytes"], json!([0xE2]));
        assert_eq!(
            content["top_logprobs"][1],
            json!({"token": "bytes:\\xe3", "logprob": -1.0, "bytes": [0xE3]})
        );
        // Two ids with the same bytes still get two keys.
        let same = completion_top(&[(byte(3, b'a'), -1.0), (byte(9, b'a'), -2.0)]);
        assert_eq!(json!(same), json!({"a": -1.0, "token_id:9": -2.0}));
    }

    #[test]
    fn a_streamed_call_is_one_delta() {
        let (_, calls) = tools::split_answer(TEXT, ToolFormat::Hermes);
        let chunk =
            reply(Some(ToolFormat::Hermes)).tool_chunk(0, &calls, 2, serde_json::Value::Null);
        assert_eq!(
            chunk["choices"][0]["delta"],
            json!({"tool_calls": [{"index": 2, "id": "call-chatcmpl-7-2", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]})
        );
        assert_eq!(chunk["object"], "chat.completion.chunk");
    }
}
