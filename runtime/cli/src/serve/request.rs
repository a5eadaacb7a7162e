//! Request bodies: what each field of OpenAI's API means to this server,
//! and the 400s for a body it cannot take.
//!
//! A body is read as a JSON object first. A field whose value is `null`
//! counts as absent (clients send `"response_format": null` and the like
//! for "not set"). Every other field is classed by [`Route::support`]:
//! served, accepted without effect, not served (refused unless its value is
//! the API's default, since the answer would not be what was asked for), or
//! unknown (ignored, and named back to the client in a header and in the
//! request's log line). The served fields are then deserialized with their
//! JSON path kept, so a wrong type names the field and what it should be.

use axum::http::HeaderName;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::ApiError;

/// The routes whose bodies are read here.
#[derive(Clone, Copy)]
pub enum Route {
    Completions,
    Chat,
    Tokenize,
    Detokenize,
    Embeddings,
}

/// What this server does with a request field.
#[derive(Clone, Copy)]
enum Support {
    /// Read and served.
    Served,
    /// Accepted, and without effect on the answer (an end-user id, storage
    /// and tier choices, a hint that parallel tool calls are fine).
    NoOp,
    /// Part of OpenAI's API and not served: any value but the default is
    /// refused.
    NotServed(NotServed),
}

/// A field this server does not serve, and the values it still accepts
/// (those that ask for what it does anyway).
#[derive(Clone, Copy)]
struct NotServed {
    is_default: fn(&Value) -> bool,
    /// The value a client may give instead (None: none but leaving it out).
    instead: Option<&'static str>,
}

const fn not_served(is_default: fn(&Value) -> bool, instead: Option<&'static str>) -> Support {
    Support::NotServed(NotServed {
        is_default,
        instead,
    })
}

fn is_one(v: &Value) -> bool {
    v.as_f64() == Some(1.0)
}

fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}

fn is_empty_string(v: &Value) -> bool {
    v.as_str() == Some("")
}

fn is_text_modality(v: &Value) -> bool {
    v.as_array()
        .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")) && !a.is_empty())
}

fn never(_: &Value) -> bool {
    false
}

/// Fields every route accepts, without effect: the model's name (one is
/// served), an end-user id, storage and tier choices.
fn accepted_everywhere(name: &str) -> bool {
    matches!(
        name,
        "model" | "user" | "metadata" | "store" | "service_tier"
    )
}

/// The fields both generation routes (completions, chat) share: OpenAI's
/// sampling fields and mlx-lm server's extensions (top-k, min-p, the
/// repetition penalty and each penalty's context size), all served by
/// [`crate::sampling`].
fn generation_field(name: &str) -> Option<Support> {
    match name {
        "max_tokens"
        | "temperature"
        | "top_p"
        | "top_k"
        | "min_p"
        | "repetition_penalty"
        | "repetition_context_size"
        | "presence_penalty"
        | "presence_context_size"
        | "frequency_penalty"
        | "frequency_context_size"
        | "logit_bias"
        | "seed"
        | "stop"
        | "stream"
        | "stream_options"
        | "n" => Some(Support::Served),
        _ => None,
    }
}

impl Route {
    /// The class of a field of this route's body; None: unknown to it.
    fn support(self, name: &str) -> Option<Support> {
        if accepted_everywhere(name) {
            return Some(Support::NoOp);
        }
        let own = match (self, name) {
            (Route::Completions, "prompt" | "logprobs") => Some(Support::Served),
            (Route::Completions, "echo") => Some(not_served(is_false, Some("false"))),
            (Route::Completions, "suffix") => Some(not_served(is_empty_string, Some("\"\""))),
            (Route::Completions, "best_of") => Some(not_served(is_one, Some("1"))),
            (
                Route::Chat,
                "messages"
                | "max_completion_tokens"
                | "logprobs"
                | "top_logprobs"
                | "tools"
                | "tool_choice"
                | "response_format"
                | "chat_template_kwargs"
                | "reasoning_effort",
            ) => Some(Support::Served),
            (Route::Chat, "parallel_tool_calls") => Some(Support::NoOp),
            (Route::Chat, "modalities") => Some(not_served(is_text_modality, Some("[\"text\"]"))),
            (
                Route::Chat,
                "audio" | "prediction" | "functions" | "function_call" | "web_search_options",
            ) => Some(not_served(never, None)),
            (
                Route::Tokenize,
                "prompt"
                | "messages"
                | "tools"
                | "add_special_tokens"
                | "add_generation_prompt"
                | "chat_template_kwargs",
            )
            | (Route::Detokenize, "tokens")
            | (Route::Embeddings, "input" | "encoding_format" | "dimensions") => {
                Some(Support::Served)
            }
            (
                Route::Completions
                | Route::Chat
                | Route::Tokenize
                | Route::Detokenize
                | Route::Embeddings,
                _,
            ) => None,
        };
        match self {
            Route::Completions | Route::Chat => own.or_else(|| generation_field(name)),
            Route::Tokenize | Route::Detokenize | Route::Embeddings => own,
        }
    }

    /// What a served top-level field must be, for a type error's message.
    fn expected(self, name: &str) -> Option<&'static str> {
        Some(match (self, name) {
            (
                _,
                "max_tokens"
                | "max_completion_tokens"
                | "seed"
                | "repetition_context_size"
                | "presence_context_size"
                | "frequency_context_size"
                | "dimensions",
            ) => "an unsigned integer",
            (_, "top_k") => "an integer (0 or -1: off)",
            (
                _,
                "temperature" | "top_p" | "min_p" | "repetition_penalty" | "presence_penalty"
                | "frequency_penalty",
            ) => "a number",
            (_, "logit_bias") => "an object like {\"token id\": bias}",
            (_, "stop") => "a string or a list of strings",
            (_, "stream" | "add_special_tokens" | "add_generation_prompt") => {
                "a boolean (true or false)"
            }
            (_, "stream_options") => "an object like {\"include_usage\": true}",
            (Route::Completions, "logprobs") => "an unsigned integer (0 to 5)",
            (_, "logprobs") => "a boolean (true or false)",
            (_, "top_logprobs") => "an unsigned integer (0 to 20)",
            (Route::Tokenize, "prompt") => "a string",
            (_, "prompt") => "a string, a list of token ids, or a list of one of those",
            (_, "messages") => "a list of messages like {\"role\": \"user\", \"content\": \"...\"}",
            (_, "tools") => "a list of tools like {\"type\": \"function\", \"function\": {...}}",
            (_, "tokens") => "a list of token ids (unsigned integers)",
            (_, "chat_template_kwargs") => {
                "an object of chat template variables like {\"enable_thinking\": false}"
            }
            _ => return None,
        })
    }
}

/// The response header naming the request's unknown fields, which were ignored.
pub const IGNORED_FIELDS_HEADER: HeaderName = HeaderName::from_static("x-archgen-ignored-fields");

/// The response header that gives the seed a request was sampled with (its
/// `seed`, or a fresh one): the same request with that `seed` replays it.
pub const SEED_HEADER: HeaderName = HeaderName::from_static("x-archgen-seed");

/// The most ignored fields a response's header names (the log line has
/// the count of the rest too).
const MAX_NAMED_IGNORED: usize = 32;

/// A request body as JSON, with the fields it gives (nulls dropped) and the
/// unknown ones this server ignores.
pub struct Body {
    route: Route,
    fields: Value,
    /// Unknown fields given a value, by JSON path, sorted.
    pub ignored: Vec<String>,
    /// A field not served, given a value other than its default.
    refused: Option<Refusal>,
}

/// Why a body is refused for a field it gives.
struct Refusal {
    field: String,
    message: String,
}

/// The fields of a chat message, and of `stream_options`.
const MESSAGE_FIELDS: [&str; 7] = [
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning",
    "reasoning_content",
];
const STREAM_OPTIONS_FIELDS: [&str; 1] = ["include_usage"];

/// The keys of `object` outside `known` with a non-null value, by path under `at`.
fn unknown_under(object: &Value, known: &[&str], at: &str, out: &mut Vec<String>) {
    if let Some(object) = object.as_object() {
        for (key, value) in object {
            if !value.is_null() && !known.contains(&key.as_str()) {
                out.push(format!("{at}.{key}"));
            }
        }
    }
}

impl Body {
    /// Reads a body as a JSON object and classes its fields; a field this
    /// route does not serve, given a value that asks for something else,
    /// is refused when the fields are read ([`Body::fields`]), so the
    /// refusal still names the ignored fields.
    pub fn parse(route: Route, body: &[u8]) -> Result<Body, ApiError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the request body is not valid JSON: {e}"), None)
        })?;
        let Value::Object(mut object) = value else {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object of fields",
                None,
            ));
        };
        object.retain(|_, v| !v.is_null());
        let mut ignored = Vec::new();
        let mut refused = None;
        for (name, value) in &object {
            match route.support(name) {
                Some(Support::Served | Support::NoOp) => {}
                Some(Support::NotServed(field)) if (field.is_default)(value) => {}
                Some(Support::NotServed(field)) => {
                    // The first by name is the one refused.
                    let value = shown(value);
                    refused.get_or_insert_with(|| Refusal {
                        field: name.clone(),
                        message: match field.instead {
                            Some(instead) => format!(
                                "{name}: {value} is not supported by this server; leave it out \
                                 or give {instead}"
                            ),
                            None => format!(
                                "{name}: {value} is not supported by this server; leave it out"
                            ),
                        },
                    });
                }
                None => ignored.push(name.clone()),
            }
        }
        if let Some(messages) = object.get("messages").and_then(Value::as_array) {
            for (i, message) in messages.iter().enumerate() {
                unknown_under(
                    message,
                    &MESSAGE_FIELDS,
                    &format!("messages[{i}]"),
                    &mut ignored,
                );
            }
        }
        if let Some(options) = object.get("stream_options") {
            unknown_under(
                options,
                &STREAM_OPTIONS_FIELDS,
                "stream_options",
                &mut ignored,
            );
        }
        ignored.sort_unstable();
        Ok(Body {
            route,
            fields: Value::Object(object),
            ignored,
            refused,
        })
    }

    /// The served fields as `T`; a wrong type is a 400 naming its path.
    pub fn fields<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        if let Some(refusal) = &self.refused {
            return Err(ApiError::bad_request(
                refusal.message.clone(),
                Some(&refusal.field),
            ));
        }
        serde_path_to_error::deserialize(&self.fields).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." || path.is_empty() {
                return ApiError::bad_request(
                    format!("the request does not fit the API: {inner}"),
                    None,
                );
            }
            let top = path.split(['.', '[']).next().unwrap_or(&path);
            let message = match (self.route.expected(top), self.fields.get(&path)) {
                (Some(expected), Some(got)) => {
                    format!("{path}: expected {expected}, got {}", kind_of(got))
                }
                _ => format!("{path}: {inner}"),
            };
            ApiError::bad_request(message, Some(&path))
        })
    }

    /// The header value naming the ignored fields (at most
    /// [`MAX_NAMED_IGNORED`], then how many more); None when there are none.
    pub fn ignored_header(ignored: &[String]) -> Option<String> {
        if ignored.is_empty() {
            return None;
        }
        // Header values are visible ASCII: other characters are escaped.
        let mut names: Vec<String> = ignored
            .iter()
            .take(MAX_NAMED_IGNORED)
            .map(|n| n.escape_default().to_string())
            .collect();
        if ignored.len() > MAX_NAMED_IGNORED {
            names.push(format!("+{} more", ignored.len() - MAX_NAMED_IGNORED));
        }
        Some(names.join(","))
    }
}

/// The most characters of a refused value an error message repeats.
const MAX_SHOWN_CHARS: usize = 60;

/// A value as an error message repeats it: its JSON, cut short when long.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(MAX_SHOWN_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// A JSON value's kind, as a type error says what it got.
fn kind_of(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// `stop`: one string or a list of them.
#[derive(Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// The served fields both generation routes take.
#[derive(Deserialize)]
pub struct CommonFields {
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Top-k: 0 (mlx-lm) and -1 (vLLM) both turn it off.
    pub top_k: Option<i64>,
    /// Min-p (0: off).
    pub min_p: Option<f64>,
    /// The repetition penalty (0: off) and each penalty's context size.
    pub repetition_penalty: Option<f64>,
    pub repetition_context_size: Option<u64>,
    pub presence_penalty: Option<f64>,
    pub presence_context_size: Option<u64>,
    pub frequency_penalty: Option<f64>,
    pub frequency_context_size: Option<u64>,
    /// `{"token id": bias}`, checked where the sampler is built.
    pub logit_bias: Option<Map<String, Value>>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Choices to generate for the one prompt, each its own sequence in the
    /// batch with its own seed.
    pub n: Option<u64>,
}

/// `prompt` of /v1/completions: text, or token ids (one prompt only).
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a string, a list of token ids, or a list of one of those"
)]
pub enum PromptField {
    Text(String),
    Ids(Vec<i64>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<i64>>),
}

/// /v1/completions' own served fields.
#[derive(Deserialize)]
pub struct CompletionFields {
    pub prompt: PromptField,
    /// Log-probabilities of each token with this many alternatives (0-5).
    pub logprobs: Option<u32>,
}

/// A message's `content`: text, or a list of parts of which only text ones
/// are served.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a string or a list of {\"type\": \"text\", \"text\": ...} parts"
)]
pub enum ContentField {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<ContentField>,
    /// Accepted and not passed on (a participant's name).
    #[allow(dead_code)]
    pub name: Option<String>,
    /// An assistant turn's calls: `[{"id", "type": "function", "function":
    /// {"name", "arguments": JSON text}}]`.
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` turn: the call it answers.
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning, under the names clients send it back
    /// by (the answer's `reasoning`, vLLM's `reasoning_content`): given to
    /// the template as it is, as mlx-lm gives a message's every field
    /// (Qwen3's template writes `reasoning_content` into the turn).
    pub reasoning: Option<String>,
    pub reasoning_content: Option<String>,
}

/// /v1/chat/completions' own served fields.
#[derive(Deserialize)]
pub struct ChatFields {
    pub messages: Vec<ChatMessage>,
    /// The newer name of `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// Log-probabilities of each token...
    pub logprobs: Option<bool>,
    /// ...with this many alternatives (0-20).
    pub top_logprobs: Option<u32>,
    /// Function schemas (`[{"type": "function", "function": {...}}]`), given
    /// to the chat template as `tools`.
    pub tools: Option<Vec<Value>>,
    /// "auto" (the default), "none", "required" or `{"type": "function",
    /// "function": {"name": ...}}` (serve/structured.rs reads it).
    pub tool_choice: Option<Value>,
    /// The answer's shape: text (the default), one JSON object, or JSON
    /// valid against a schema (serve/structured.rs reads it).
    pub response_format: Option<Value>,
    /// Chat template variables over the server's `--chat-template-args`
    /// (mlx-lm's and vLLM's field), e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// OpenAI's reasoning effort, given to the chat template as the variable
    /// `reasoning_effort` where the template reads it (gpt-oss's does), as
    /// vLLM gives it; ignored (and named so) where it does not.
    pub reasoning_effort: Option<ReasoningEffort>,
}

/// OpenAI's values of `reasoning_effort`.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::None => "none",
            ReasoningEffort::Minimal => "minimal",
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }
}

/// POST /tokenize: text, or a conversation.
#[derive(Deserialize)]
pub struct TokenizeFields {
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub tools: Option<Vec<Value>>,
    /// Text: true by default (as a completion's prompt); a conversation:
    /// false (its template writes them).
    pub add_special_tokens: Option<bool>,
    /// A conversation: end with the assistant's turn opening (true by default).
    pub add_generation_prompt: Option<bool>,
    /// A conversation: its template variables, as a chat request's.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

/// POST /detokenize.
#[derive(Deserialize)]
pub struct DetokenizeFields {
    pub tokens: Vec<i64>,
}
