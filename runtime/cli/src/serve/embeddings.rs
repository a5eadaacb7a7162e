//! POST /v1/embeddings: its `input` read into token lists (every refusal a
//! 400 naming the JSON path at fault, before any compute), and the model
//! thread's [`Embedder`], which runs one input's forward per scheduler
//! step ([`crate::embed::embed_one`], the same as `archgen embed`).

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;

use archgen_runtime::model::CausalLm;
use serde::Deserialize;
use serde_json::Value;
use tokenizers::Tokenizer;

use super::error::ApiError;
use super::scheduler::{panic_message, Cancel};
use crate::embed::{embed_one, values, EmbeddingHead};

/// The most inputs one request may embed: each is one forward of at most
/// the prompt limit's tokens, so this bounds a request's work.
pub const MAX_INPUTS: usize = 256;

/// `encoding_format`: the values as JSON numbers, or as base64 of their
/// little-endian f32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    Float,
    Base64,
}

/// /v1/embeddings' served fields (`input` is read by [`inputs_of`], which
/// names the element at fault).
#[derive(Deserialize)]
pub struct EmbeddingFields {
    pub input: Value,
    pub encoding_format: Option<EncodingFormat>,
    pub dimensions: Option<u64>,
}

/// What one request's inputs are checked against.
pub struct InputLimits<'a> {
    pub tokenizer: &'a Tokenizer,
    pub vocab_size: i32,
    /// The longest input served, in tokens.
    pub max_tokens: usize,
    /// Where `max_tokens` comes from, for the 400.
    pub max_tokens_origin: String,
}

/// `input` as token lists: a string, a list of strings, a list of token
/// ids (one input), or a list of token-id lists; text is encoded with
/// special tokens added (as the tokenizer's post-processor says, e.g. an
/// EOS that last-token pooling reads).
pub fn inputs_of(input: &Value, limits: &InputLimits<'_>) -> Result<Vec<Vec<i32>>, ApiError> {
    let items: Vec<(String, &Value)> = match input {
        Value::String(_) => vec![("input".into(), input)],
        Value::Array(list) if list.is_empty() => {
            return Err(ApiError::bad_request(
                "input: an empty list; give a string, a list of strings, a list of token ids \
                 or a list of token-id lists",
                Some("input"),
            ))
        }
        // A list of numbers is one input of token ids.
        Value::Array(list) if list[0].is_number() => vec![("input".into(), input)],
        Value::Array(list) => list
            .iter()
            .enumerate()
            .map(|(i, item)| (format!("input[{i}]"), item))
            .collect(),
        other => {
            return Err(ApiError::bad_request(
                format!(
                    "input: expected a string, a list of strings, a list of token ids or a list \
                     of token-id lists, got {}",
                    kind_of(other)
                ),
                Some("input"),
            ))
        }
    };
    if items.len() > MAX_INPUTS {
        return Err(ApiError::bad_request(
            format!(
                "input: {} inputs, more than the {MAX_INPUTS} one request may embed; split it \
                 into several requests",
                items.len()
            ),
            Some("input"),
        ));
    }
    items
        .iter()
        .map(|(path, item)| one_input(path, item, limits))
        .collect()
}

/// One input (text or token ids) as token ids, checked.
fn one_input(path: &str, item: &Value, limits: &InputLimits<'_>) -> Result<Vec<i32>, ApiError> {
    let ids = match item {
        Value::String(text) => {
            let encoding = limits
                .tokenizer
                .encode_fast(text.as_str(), true)
                .map_err(|e| {
                    ApiError::bad_request(format!("{path}: cannot be encoded: {e}"), Some(path))
                })?;
            encoding.get_ids().iter().map(|&t| t as i32).collect()
        }
        Value::Array(list) => {
            let mut ids = Vec::with_capacity(list.len());
            for (j, token) in list.iter().enumerate() {
                let id = token
                    .as_u64()
                    .and_then(|t| i32::try_from(t).ok())
                    .filter(|&t| t < limits.vocab_size);
                let Some(id) = id else {
                    let at = format!("{path}[{j}]");
                    return Err(ApiError::bad_request(
                        format!(
                            "{at}: expected a token id of this model (an integer from 0 to {}), \
                             got {}",
                            limits.vocab_size - 1,
                            kind_of(token)
                        ),
                        Some(&at),
                    ));
                };
                ids.push(id);
            }
            ids
        }
        other => {
            return Err(ApiError::bad_request(
                format!(
                    "{path}: expected a string or a list of token ids, got {}",
                    kind_of(other)
                ),
                Some(path),
            ))
        }
    };
    if ids.is_empty() {
        return Err(ApiError::bad_request(
            format!("{path}: no tokens to embed; give a non-empty text or token list"),
            Some(path),
        ));
    }
    if ids.len() > limits.max_tokens {
        return Err(ApiError::bad_request(
            format!(
                "{path}: {} tokens, more than the {} an input may have ({}); shorten it",
                ids.len(),
                limits.max_tokens,
                limits.max_tokens_origin
            ),
            Some(path),
        ));
    }
    Ok(ids)
}

/// A JSON value's kind, for a 400.
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

/// Little-endian f32 bytes in base64 (OpenAI's `encoding_format: "base64"`).
pub fn base64_f32(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::encode(bytes)
}

/// What the model thread answers an embedding request with: each input's
/// embedding as f32 values, in order.
pub type EmbedReply = Result<Vec<Vec<f32>>, String>;

/// One queued embedding request, checked.
pub struct EmbedJob {
    pub inputs: Vec<Vec<i32>>,
    pub reply: tokio::sync::oneshot::Sender<EmbedReply>,
    pub cancel: Cancel,
}

/// A request being embedded: the embeddings of its first inputs.
struct Embedding {
    job: EmbedJob,
    done: Vec<Vec<f32>>,
}

/// The model thread's embedding queue: each step embeds one input of one
/// request (one forward of at most the prompt limit's tokens), round robin
/// among the requests, so generation steps run between any two inputs and
/// a short request is not held behind a long one's inputs.
pub struct Embedder<'m, M: CausalLm> {
    model: &'m M,
    /// None: the checkpoint's embedding head cannot run (the server then
    /// queues no embedding request).
    head: Option<EmbeddingHead>,
    queue: VecDeque<Embedding>,
}

impl<'m, M: CausalLm> Embedder<'m, M> {
    pub fn new(model: &'m M, head: Option<EmbeddingHead>) -> Self {
        Embedder {
            model,
            head,
            queue: VecDeque::new(),
        }
    }

    /// Requests admitted and not yet answered.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn admit(&mut self, job: EmbedJob) {
        if self.head.is_none() {
            let _ = job.reply.send(Err(
                "this checkpoint's embedding head cannot run (see the server's start-up notes)"
                    .into(),
            ));
            return;
        }
        if !job.cancel.is_cancelled() {
            self.queue.push_back(Embedding {
                done: Vec::with_capacity(job.inputs.len()),
                job,
            });
        }
    }

    /// Embeds the next input of the request at the front (requests whose
    /// client left are dropped first) and answers it when that was its last
    /// input, else moves it to the back.
    pub fn step_once(&mut self) {
        self.queue.retain(|e| !e.job.cancel.is_cancelled());
        let Some(current) = self.queue.front_mut() else {
            return;
        };
        let Some(head) = &self.head else {
            return;
        };
        let ids = &current.job.inputs[current.done.len()];
        let model = self.model;
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
            embed_one(model, ids, head).and_then(|e| values(&e))
        }));
        let embedded = match ran {
            Ok(embedded) => embedded,
            Err(panic) => Err(panic_message(&*panic)),
        };
        match embedded {
            Ok(row) => current.done.push(row),
            Err(message) => {
                eprintln!("archgen: serve: embedding failed: {message}");
                if let Some(failed) = self.queue.pop_front() {
                    let _ = failed.job.reply.send(Err(message));
                }
                return;
            }
        }
        let finished = current.done.len() == current.job.inputs.len();
        let Some(served) = self.queue.pop_front() else {
            return;
        };
        match finished {
            true => {
                let _ = served.job.reply.send(Ok(served.done));
            }
            false => self.queue.push_back(served),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        // 1.0f32 = 00 00 80 3f; 2.0f32 = 00 00 00 40.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(base64_f32(&[]), "");
        // Three f32s are 12 bytes: no padding.
        assert_eq!(base64_f32(&[0.0, 0.0, 0.0]), "AAAAAAAAAAAAAAAA");
    }
}
