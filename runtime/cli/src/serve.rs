//! `archgen serve`: an OpenAI-compatible HTTP server (GET /v1/models,
//! POST /v1/completions, POST /v1/chat/completions, streamed as server-sent
//! events or not).
//!
//! The model lives on one worker thread (MLX arrays and the model stay
//! there); HTTP handlers tokenize and check a request, then queue it to the
//! worker over a channel, so requests are served one at a time in arrival
//! order. The worker streams text back over a per-request channel. A request
//! the server cannot serve gets a 400 with an OpenAI-style error body; a
//! failure inside one generation (even a panic) ends that request only.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use archgen_runtime::model::{CausalLm, ModelTask};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokenizers::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::args::Impl;
use crate::chat_template::{ChatTemplate, Message};
use crate::engine::{self, Finish, Flow, Sampling, TextStream};
use crate::ui::Ui;

/// `max_tokens` when a request gives none (mlx-lm's server default).
const DEFAULT_MAX_TOKENS: usize = 512;

/// What the worker streams back for one request.
enum GenEvent {
    Text(String),
    Done {
        completion_tokens: usize,
        finish: Finish,
    },
    Failed(String),
}

/// One queued generation.
struct Job {
    prompt: Vec<i32>,
    sampling: Sampling,
    stops: Vec<String>,
    events: UnboundedSender<GenEvent>,
}

/// Runs queued jobs on the model until every sender is gone.
struct Worker {
    jobs: mpsc::Receiver<Job>,
    ready: mpsc::Sender<i32>,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<i32>,
    ui: Ui,
}

impl ModelTask for Worker {
    type Output = Result<(), String>;

    fn run<M: CausalLm>(self, m: &M) -> Self::Output {
        let _ = self.ready.send(m.vocab_size());
        for job in self.jobs {
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                run_job(m, &job, &self.tokenizer, &self.eos, self.ui)
            }));
            let failure = match outcome {
                Ok(Ok(())) => continue,
                Ok(Err(message)) => message,
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("a panic");
                    format!("the generation failed: {what}")
                }
            };
            eprintln!("archgen: serve: {failure}");
            let _ = job.events.send(GenEvent::Failed(failure));
        }
        Ok(())
    }
}

fn run_job<M: CausalLm>(
    m: &M,
    job: &Job,
    tokenizer: &Tokenizer,
    eos: &[i32],
    ui: Ui,
) -> Result<(), String> {
    let mut stream = TextStream::new(tokenizer, &job.stops);
    let mut client_gone = false;
    let done = engine::generate(m, &job.prompt, &job.sampling, eos, |token| {
        let (text, flow) = stream.push(token)?;
        // Nobody listens any more (the client went away): stop early.
        if !text.is_empty() && job.events.send(GenEvent::Text(text)).is_err() {
            client_gone = true;
            return Ok(Flow::Stop);
        }
        Ok(flow)
    })?;
    let (completion_tokens, finish) = (done.produced, done.finish);
    if client_gone {
        ui.note(&format!(
            "serve: the client went away; stopped after {completion_tokens} tokens"
        ));
        return Ok(());
    }
    let tail = stream.finish()?;
    if !tail.is_empty() {
        let _ = job.events.send(GenEvent::Text(tail));
    }
    let _ = job.events.send(GenEvent::Done {
        completion_tokens,
        finish,
    });
    Ok(())
}

/// What every handler shares.
struct AppState {
    jobs: mpsc::Sender<Job>,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    /// The model's id in responses and /v1/models: the directory's name.
    model_name: String,
    model_dir: String,
    vocab_size: i32,
    /// `max_position_embeddings` from config.json, when it gives one.
    context: Option<usize>,
    next_id: AtomicU64,
    ui: Ui,
}

/// An OpenAI-style error response.
struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<&'static str>,
}

impl ApiError {
    fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::BAD_REQUEST => "invalid_request_error",
            StatusCode::NOT_FOUND => "not_found_error",
            _ => "server_error",
        };
        let body = json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": null,
        }});
        (self.status, Json(body)).into_response()
    }
}

/// `stop`: one string or a list of them.
#[derive(Deserialize)]
#[serde(untagged, expecting = "stop: a string or a list of strings")]
enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// The fields both endpoints take (beside their own).
const COMMON_FIELDS: [&str; 12] = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "user",
];

/// The sampling fields both endpoints share.
#[derive(Deserialize)]
struct CommonFields {
    max_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    seed: Option<u64>,
    stop: Option<StopField>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    /// Only 1 is served.
    n: Option<u64>,
    /// Only 0 is served (no penalties are implemented).
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    /// Accepted and not used (a client's end-user id).
    #[allow(dead_code)]
    user: Option<String>,
}

/// `prompt` of /v1/completions: text, or token ids (one prompt only).
#[derive(Deserialize)]
#[serde(untagged, expecting = "prompt: a string or a list of token ids")]
enum PromptField {
    Text(String),
    Ids(Vec<i64>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<i64>>),
}

#[derive(Deserialize)]
struct CompletionRequest {
    /// Any value: this server serves one model.
    #[allow(dead_code)]
    model: Option<String>,
    prompt: PromptField,
    echo: Option<bool>,
    #[serde(flatten)]
    common: CommonFields,
}

/// A message's `content`: text, or a list of parts of which only text ones
/// are served.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "content: a string or a list of {\"type\": \"text\", \"text\": ...} parts"
)]
enum ContentField {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatMessage {
    role: String,
    content: Option<ContentField>,
    /// Accepted and not passed on (a participant's name).
    #[allow(dead_code)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct ChatRequest {
    #[allow(dead_code)]
    model: Option<String>,
    messages: Vec<ChatMessage>,
    /// The newer name of `max_tokens`.
    max_completion_tokens: Option<u64>,
    #[serde(flatten)]
    common: CommonFields,
}

/// Parses a request body; bad JSON, a field of the wrong type and a field
/// this server does not know are 400s that say what and where.
fn parse_body<T: for<'de> Deserialize<'de>>(
    body: &[u8],
    own_fields: &[&str],
) -> Result<T, ApiError> {
    let parsed: T = serde_json::from_slice(body).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "the request body is not valid JSON"
            }
            serde_json::error::Category::Data => "the request does not fit the API",
            serde_json::error::Category::Io => "the request body could not be read",
        };
        ApiError::bad_request(format!("{what}: {e}"), None)
    })?;
    // serde's deny_unknown_fields does not combine with flatten: check here.
    let fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the request must be a JSON object: {e}"), None)
        })?;
    let known = |k: &str| own_fields.contains(&k) || COMMON_FIELDS.contains(&k);
    if let Some(unknown) = fields.keys().find(|k| !known(k)) {
        let mut all: Vec<&str> = own_fields
            .iter()
            .chain(COMMON_FIELDS.iter())
            .copied()
            .collect();
        all.sort_unstable();
        return Err(ApiError::bad_request(
            format!(
                "unknown field `{unknown}`: this server takes {}",
                all.join(", ")
            ),
            None,
        ));
    }
    Ok(parsed)
}

/// A checked request: what to queue, and how to answer.
struct Plan {
    prompt: Vec<i32>,
    sampling: Sampling,
    stops: Vec<String>,
    stream: bool,
    include_usage: bool,
}

fn plan(
    state: &AppState,
    prompt: Vec<i32>,
    common: CommonFields,
    max_tokens: Option<u64>,
) -> Result<Plan, ApiError> {
    if common.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request(
            "n: only 1 choice per request is served",
            Some("n"),
        ));
    }
    for (name, value) in [
        ("presence_penalty", common.presence_penalty),
        ("frequency_penalty", common.frequency_penalty),
    ] {
        if value.is_some_and(|v| v != 0.0) {
            return Err(ApiError::bad_request(
                format!("{name}: penalties are not implemented; leave it out or give 0"),
                None,
            ));
        }
    }
    let temp = common.temperature.unwrap_or(1.0);
    if !temp.is_finite() || temp < 0.0 {
        return Err(ApiError::bad_request(
            format!("temperature: {temp} must be a finite number >= 0"),
            Some("temperature"),
        ));
    }
    let top_p = common.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(
            format!("top_p: {top_p} is outside (0, 1]"),
            Some("top_p"),
        ));
    }
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
    let asked = max_tokens.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let max_tokens = match (state.context, asked) {
        (Some(context), asked) => {
            let room = context.saturating_sub(prompt.len());
            let too_long = match asked {
                Some(n) => prompt.len().saturating_add(n) > context,
                None => room == 0,
            };
            if too_long {
                let completion = asked
                    .map(|n| format!(" + {n} in the completion"))
                    .unwrap_or_default();
                return Err(ApiError::bad_request(
                    format!(
                        "this model's maximum context length is {context} tokens (max_position_embeddings), \
                         but the request needs {} ({} in the prompt{completion}); shorten the prompt or lower max_tokens",
                        prompt.len().saturating_add(asked.unwrap_or(0)),
                        prompt.len()
                    ),
                    Some("messages"),
                ));
            }
            asked.unwrap_or(DEFAULT_MAX_TOKENS.min(room))
        }
        (None, asked) => asked.unwrap_or(DEFAULT_MAX_TOKENS),
    };
    let stream = common.stream.unwrap_or(false);
    let include_usage = common
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    Ok(Plan {
        prompt,
        sampling: Sampling {
            max_tokens,
            temp,
            top_p,
            seed: common.seed.unwrap_or(0),
        },
        stops,
        stream,
        include_usage,
    })
}

fn encode(
    tokenizer: &Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<i32>, ApiError> {
    let encoding = tokenizer
        .encode(text, add_special_tokens)
        .map_err(|e| ApiError::bad_request(format!("the prompt cannot be encoded: {e}"), None))?;
    Ok(encoding.get_ids().iter().map(|&t| t as i32).collect())
}

#[derive(Clone, Copy)]
enum Endpoint {
    Completions,
    Chat,
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
}

impl Reply {
    fn usage(&self, completion_tokens: usize) -> serde_json::Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }

    /// A streamed chunk carrying `text` (and the finish reason at the end).
    fn chunk(&self, text: Option<&str>, finish: Option<Finish>, first: bool) -> serde_json::Value {
        let finish = finish.map(Finish::as_str);
        match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}],
            }),
            Endpoint::Chat => {
                let delta = match (first, text) {
                    (true, t) => json!({"role": "assistant", "content": t.unwrap_or("")}),
                    (false, Some(t)) => json!({"content": t}),
                    (false, None) => json!({}),
                };
                json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
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

    fn whole(&self, text: &str, finish: Finish, completion_tokens: usize) -> serde_json::Value {
        let finish = finish.as_str();
        match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
                "usage": self.usage(completion_tokens),
            }),
            Endpoint::Chat => json!({
                "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": null, "finish_reason": finish}],
                "usage": self.usage(completion_tokens),
            }),
        }
    }
}

fn worker_gone() -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "the model worker has stopped; restart the server".into(),
        param: None,
    }
}

/// Queues a checked request and answers it, streamed or whole.
async fn respond(
    state: Arc<AppState>,
    endpoint: Endpoint,
    plan: Plan,
) -> Result<Response, ApiError> {
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
    };
    let (events, mut rx) = unbounded_channel();
    let start = Instant::now();
    state
        .jobs
        .send(Job {
            prompt: plan.prompt,
            sampling: plan.sampling,
            stops: plan.stops,
            events,
        })
        .map_err(|_| worker_gone())?;
    let ui = state.ui;
    let log = move |completion_tokens: usize, finish: Finish, prompt_tokens: usize| {
        ui.note(&format!(
            "serve: {} prompt + {completion_tokens} completion tokens in {:.2} s ({})",
            prompt_tokens,
            start.elapsed().as_secs_f64(),
            finish.as_str()
        ));
    };
    if plan.stream {
        let (sse_tx, sse_rx) = unbounded_channel::<Result<Event, Infallible>>();
        let include_usage = plan.include_usage;
        tokio::spawn(async move {
            let send = |v: serde_json::Value| {
                sse_tx
                    .send(Ok(Event::default().data(v.to_string())))
                    .is_ok()
            };
            let mut first = true;
            while let Some(event) = rx.recv().await {
                let alive = match event {
                    GenEvent::Text(text) => {
                        let ok = send(reply.chunk(Some(&text), None, first));
                        first = false;
                        ok
                    }
                    GenEvent::Done {
                        completion_tokens,
                        finish,
                    } => {
                        log(completion_tokens, finish, reply.prompt_tokens);
                        if first {
                            send(reply.chunk(None, None, true));
                        }
                        send(reply.chunk(None, Some(finish), false));
                        if include_usage {
                            send(reply.usage_chunk(completion_tokens));
                        }
                        break;
                    }
                    GenEvent::Failed(message) => {
                        send(
                            json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}}),
                        );
                        break;
                    }
                };
                if !alive {
                    // The client went away; dropping `rx` tells the worker.
                    return;
                }
            }
            let _ = sse_tx.send(Ok(Event::default().data("[DONE]")));
        });
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(sse_rx);
        return Ok(Sse::new(stream).into_response());
    }
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            GenEvent::Text(t) => text.push_str(&t),
            GenEvent::Done {
                completion_tokens,
                finish,
            } => {
                log(completion_tokens, finish, reply.prompt_tokens);
                return Ok(Json(reply.whole(&text, finish, completion_tokens)).into_response());
            }
            GenEvent::Failed(message) => {
                return Err(ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    message,
                    param: None,
                })
            }
        }
    }
    Err(worker_gone())
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse_body(&body, &["prompt", "echo"])?;
    if request.echo == Some(true) {
        return Err(ApiError::bad_request(
            "echo: echoing the prompt is not implemented",
            Some("echo"),
        ));
    }
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
    let max_tokens = request.common.max_tokens;
    let plan = plan(&state, prompt, request.common, max_tokens)?;
    respond(state, Endpoint::Completions, plan).await
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ChatRequest = parse_body(&body, &["messages", "max_completion_tokens"])?;
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
    if request.messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages: give at least one message",
            Some("messages"),
        ));
    }
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, m) in request.messages.into_iter().enumerate() {
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
        messages.push(Message {
            role: m.role,
            content,
        });
    }
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::bad_request(e, Some("messages")))?;
    // The template writes the special tokens (like <bos>) itself.
    let prompt = encode(&state.tokenizer, &text, false)?;
    let max_tokens = request.max_completion_tokens.or(request.common.max_tokens);
    let plan = plan(&state, prompt, request.common, max_tokens)?;
    respond(state, Endpoint::Chat, plan).await
}

async fn models(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": state.model_name, "object": "model", "created": 0, "owned_by": "archgen"}],
    }))
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such endpoint: this server has GET /v1/models, POST /v1/completions and \
                  POST /v1/chat/completions"
            .into(),
        param: None,
    }
}

async fn shutdown_signal() {
    let _ = tokio::signal::ctrl_c().await;
    eprintln!("archgen: serve: stopping");
}

pub fn serve(
    ui: Ui,
    model: &Path,
    host: &str,
    port: u16,
    implementation: Impl,
) -> Result<(), String> {
    if !model.is_dir() {
        return Err(format!("{}: not a directory", model.display()));
    }
    let tokenizer = crate::checkpoint::load_tokenizer(model)?.ok_or_else(|| {
        format!(
            "serve needs {} (not found) to turn text into tokens",
            model.join("tokenizer.json").display()
        )
    })?;
    let tokenizer = Arc::new(tokenizer);
    let template = ChatTemplate::load(model)?;
    if template.is_none() {
        ui.note(&format!(
            "serve: {} has no chat template: /v1/chat/completions will answer 400",
            model.display()
        ));
    }
    let eos = crate::checkpoint::eos_ids(model)?;
    let context = engine::context_length(model)?;
    let (jobs_tx, jobs_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let worker = Worker {
        jobs: jobs_rx,
        ready: ready_tx,
        tokenizer: tokenizer.clone(),
        eos,
        ui,
    };
    let model_path = model.to_path_buf();
    let worker_thread = std::thread::Builder::new()
        .name("archgen-model".into())
        .spawn(move || {
            crate::checkpoint::with_model(&ui, &model_path, implementation, None, worker)
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
        tokenizer,
        template,
        model_name: model_name.clone(),
        model_dir: model.display().to_string(),
        vocab_size,
        context,
        next_id: AtomicU64::new(1),
        ui,
    });
    let app = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .fallback(not_found)
        .with_state(state);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host, port))
            .await
            .map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("cannot read the listening address: {e}"))?;
        eprintln!(
            "archgen: serving {model_name} at http://{addr}/v1 (OpenAI API: /v1/models, /v1/completions, \
             /v1/chat/completions; Ctrl-C stops)"
        );
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .map_err(|e| format!("the server failed: {e}"))
    })
}
