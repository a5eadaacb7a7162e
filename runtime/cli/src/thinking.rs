//! A model's reasoning markers and the chat template variables that follow
//! from them, as mlx-lm 0.32.2's `TokenizerWrapper` reads them
//! (`mlx_lm/tokenizer_utils.py`: `_infer_thinking`, `apply_chat_template`).
//!
//! mlx-lm renders every chat prompt (`mlx_lm.server`, `mlx_lm.chat`,
//! `mlx_lm.generate`) with `enable_thinking` set to whether the tokenizer
//! has reasoning markers, unless the caller gives it. Templates read it:
//! Qwen3's closes an empty `<think>` block when it is false, Gemma-4's opens
//! a thinking turn when it is true. A prompt rendered without it is not the
//! prompt mlx-lm computes, so archgen sets it the same way.

use serde_json::{Map, Value};
use tokenizers::Tokenizer;

/// Chat template variables by name (`--chat-template-args`,
/// `chat_template_kwargs`).
pub type TemplateArgs = Map<String, Value>;

/// One variable as the template is rendered with it.
pub type TemplateVariable = (String, minijinja::Value);

/// The template variable mlx-lm sets (`_thinking_kwarg` for a tokenizer
/// without a renderer of its own).
pub const ENABLE_THINKING: &str = "enable_thinking";

/// Marker pairs that are one token each, in mlx-lm's order: the first
/// pair whose two tokens are both in the vocabulary is the model's.
const ONE_TOKEN_MARKERS: [(&str, &str); 3] = [
    ("<think>", "</think>"),
    ("<longcat_think>", "</longcat_think>"),
    ("<|think:start|>", "<|think:end|>"),
];

/// Gemma-4's markers: a channel named `thought`, several tokens long.
const CHANNEL_TOKENS: (&str, &str) = ("<|channel>", "<channel|>");
const CHANNEL_MARKERS: (&str, &str) = ("<|channel>thought", "<channel|>");

/// A vocabulary of open/close/sep message tokens and its markers.
const XTML_TOKENS: [&str; 4] = ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"];
const XTML_MARKERS: (&str, &str) = ("<|open|>think<|sep|>", "<|close|>think<|sep|>");

/// Where a model's reasoning starts and ends, as token ids and as the
/// text they decode to (an answer is split at the text, as mlx-lm's
/// `TextStateMachine` splits it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingMarkers {
    pub start: Vec<i32>,
    pub end: Vec<i32>,
    pub start_text: String,
    pub end_text: String,
}

impl ThinkingMarkers {
    /// The tokenizer's markers (`_infer_thinking`), `None` when it has
    /// none.
    pub fn of(tokenizer: &Tokenizer) -> Result<Option<Self>, String> {
        let has = |token: &str| tokenizer.token_to_id(token).is_some();
        for (start, end) in ONE_TOKEN_MARKERS {
            if let (Some(s), Some(e)) = (tokenizer.token_to_id(start), tokenizer.token_to_id(end)) {
                return Ok(Some(ThinkingMarkers {
                    start: vec![s as i32],
                    end: vec![e as i32],
                    start_text: start.to_string(),
                    end_text: end.to_string(),
                }));
            }
        }
        let encoded = |(start, end): (&str, &str)| -> Result<Option<Self>, String> {
            Ok(Some(ThinkingMarkers {
                start: encode(tokenizer, start)?,
                end: encode(tokenizer, end)?,
                start_text: start.to_string(),
                end_text: end.to_string(),
            }))
        };
        if has(CHANNEL_TOKENS.0) && has(CHANNEL_TOKENS.1) {
            return encoded(CHANNEL_MARKERS);
        }
        if XTML_TOKENS.iter().all(|t| has(t)) {
            return encoded(XTML_MARKERS);
        }
        Ok(None)
    }

    /// The last place `start` begins at or after `from` (`rfind_think_start`
    /// with `start=from`; a negative `from` counts as 0).
    pub fn rfind_start(&self, tokens: &[i32], from: usize) -> Option<usize> {
        rfind(tokens, &self.start, from)
    }

    /// Whether a prompt leaves its answer inside a reasoning block: its
    /// last start marker comes after its last end marker (mlx-lm's
    /// server picks the answer's `initial_state` so).
    pub fn prompt_opens_reasoning(&self, prompt: &[i32]) -> bool {
        match (rfind(prompt, &self.start, 0), rfind(prompt, &self.end, 0)) {
            (Some(start), Some(end)) => start > end,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

/// The last position at or after `from` where `needle` occurs in `tokens`.
fn rfind(tokens: &[i32], needle: &[i32], from: usize) -> Option<usize> {
    if needle.is_empty() || needle.len() > tokens.len() {
        return None;
    }
    (from..=tokens.len() - needle.len())
        .rev()
        .find(|&i| tokens[i..i + needle.len()] == *needle)
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<i32>, String> {
    let encoding = tokenizer
        .encode(text, false)
        .map_err(|e| format!("cannot encode the reasoning marker {text:?}: {e}"))?;
    Ok(encoding.get_ids().iter().map(|&t| t as i32).collect())
}

/// The variables a chat template is rendered with besides the messages
/// and tools: `defaults` (a server's `--chat-template-args`), then a
/// request's own (`chat_template_kwargs`) over them, then
/// `enable_thinking` = whether the model has reasoning markers where
/// neither gave it (mlx-lm's `apply_chat_template`).
pub fn template_variables(
    has_thinking: bool,
    defaults: &TemplateArgs,
    request: Option<&TemplateArgs>,
) -> Vec<TemplateVariable> {
    let mut merged = defaults.clone();
    if let Some(request) = request {
        merged.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    merged
        .entry(ENABLE_THINKING)
        .or_insert(Value::Bool(has_thinking));
    merged
        .into_iter()
        .map(|(k, v)| (k, minijinja::Value::from_serialize(&v)))
        .collect()
}

/// `--chat-template-args`: a JSON object, or an error that says what the
/// flag takes.
pub fn parse_template_args(text: &str) -> Result<TemplateArgs, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!(
            "--chat-template-args: expected a JSON object such as '{{\"enable_thinking\": false}}', got {}",
            json_kind(&other)
        )),
        Err(e) => Err(format!(
            "--chat-template-args: not valid JSON at line {} column {}: {e}",
            e.line(),
            e.column()
        )),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer of `words` (ids in order) whose `specials`
    /// are added tokens, so text splits at them.
    fn tokenizer(words: &[&str], specials: &[&str]) -> Tokenizer {
        use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
        use tokenizers::AddedToken;
        let mut tokenizer = crate::tokens::word_level(words);
        tokenizer.with_pre_tokenizer(Some(WhitespaceSplit));
        let added: Vec<AddedToken> = specials
            .iter()
            .map(|s| AddedToken::from(s.to_string(), true))
            .collect();
        tokenizer.add_special_tokens(&added);
        tokenizer
    }

    #[test]
    fn markers_are_found_in_mlx_lms_order() {
        // No markers.
        let plain = tokenizer(&["<unk>", "hello"], &[]);
        assert_eq!(ThinkingMarkers::of(&plain).unwrap(), None);
        // One-token pairs: <think> wins over a later pair; both halves needed.
        let both = tokenizer(
            &[
                "<unk>",
                "<|think:start|>",
                "<|think:end|>",
                "<think>",
                "</think>",
            ],
            &[],
        );
        let m = ThinkingMarkers::of(&both).unwrap().unwrap();
        assert_eq!((m.start, m.end), (vec![3], vec![4]));
        let half = tokenizer(
            &["<unk>", "<think>", "<|think:start|>", "<|think:end|>"],
            &[],
        );
        let m = ThinkingMarkers::of(&half).unwrap().unwrap();
        assert_eq!((m.start, m.end), (vec![2], vec![3]));
        // Gemma-4's channel: "<|channel>thought" is two tokens.
        let channel = tokenizer(
            &["<unk>", "<|channel>", "<channel|>", "thought"],
            &["<|channel>", "<channel|>"],
        );
        let m = ThinkingMarkers::of(&channel).unwrap().unwrap();
        assert_eq!((&m.start, &m.end), (&vec![1, 3], &vec![2]));
        assert_eq!(m.rfind_start(&[1, 3, 0, 1, 3, 2], 0), Some(3));
        assert_eq!(
            (m.start_text.as_str(), m.end_text.as_str()),
            CHANNEL_MARKERS
        );
        // A prompt opens reasoning when its last start follows its last end.
        assert!(m.prompt_opens_reasoning(&[0, 1, 3]));
        assert!(m.prompt_opens_reasoning(&[1, 3, 0, 2, 1, 3, 0]));
        assert!(!m.prompt_opens_reasoning(&[1, 3, 0, 2]));
        assert!(!m.prompt_opens_reasoning(&[0, 2]));
        assert!(!m.prompt_opens_reasoning(&[0, 1]));
    }

    #[test]
    fn rfind_takes_the_last_match_at_or_after_from() {
        let tokens = [5, 1, 2, 7, 1, 2, 9];
        assert_eq!(rfind(&tokens, &[1, 2], 0), Some(4));
        assert_eq!(rfind(&tokens, &[1, 2], 5), None);
        assert_eq!(rfind(&tokens, &[1], 2), Some(4));
        assert_eq!(rfind(&tokens, &[9, 9], 0), None);
        assert_eq!(rfind(&[1], &[1, 2], 0), None);
    }

    #[test]
    fn enable_thinking_follows_the_markers_unless_given() {
        let none = Map::new();
        let vars = |has, defaults: &Map<String, Value>, request| {
            template_variables(has, defaults, request)
                .into_iter()
                .map(|(k, v)| format!("{k}={}", serde_json::to_string(&v).unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(vars(true, &none, None), ["enable_thinking=true"]);
        assert_eq!(vars(false, &none, None), ["enable_thinking=false"]);
        let server = parse_template_args(r#"{"enable_thinking": false, "x": 1}"#).unwrap();
        assert_eq!(vars(true, &server, None), ["enable_thinking=false", "x=1"]);
        let request = parse_template_args(r#"{"enable_thinking": true}"#).unwrap();
        assert_eq!(
            vars(false, &server, Some(&request)),
            ["enable_thinking=true", "x=1"]
        );
    }

    #[test]
    fn template_args_must_be_an_object() {
        let e = parse_template_args("[1]").unwrap_err();
        assert!(
            e.contains("expected a JSON object") && e.contains("a list"),
            "{e}"
        );
        let e = parse_template_args("{\"a\": ").unwrap_err();
        assert!(e.contains("line 1 column"), "{e}");
    }
}
