//! Tool calls in generated text, read as mlx-lm 0.32.2's tool parsers read
//! them (mlx_lm/tool_parsers): Qwen3's hermes-style
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (json_tools.py)
//! and Gemma 4's `<|tool_call>call:name{key:<|"|>text<|"|>,n:1}<tool_call|>`
//! (gemma4.py), returned in OpenAI's `tool_calls` shape as mlx_lm/server.py's
//! `ToolCallFormatter` returns them.
//!
//! One difference from mlx-lm: a call whose markup does not parse (a
//! truncated or garbled one) stays in `content` as the text the model wrote,
//! where mlx-lm logs a warning and drops it; the client then still sees what
//! the model said.

use serde_json::{json, Value};

/// The markup a checkpoint's chat template teaches its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>` + a JSON object with `name` and `arguments` + `</tool_call>`
    /// (Qwen 2.5 / Qwen 3, hermes).
    Hermes,
    /// `<|tool_call>call:name{...}<tool_call|>` with `<|"|>` string quotes
    /// and bare keys (Gemma 4).
    Gemma4,
}

impl ToolFormat {
    /// The format a chat template writes tool calls in, found as mlx-lm's
    /// `_infer_tool_parser` finds it: by markers in the template's text,
    /// checked in its order. `Ok(None)` when the template knows no tool
    /// calls; `Err(parser)` when mlx-lm would pick a parser archgen does not
    /// have (so its markup is not misread as one archgen has).
    pub fn of_template(source: &str) -> Result<Option<ToolFormat>, &'static str> {
        let has = |marker: &str| source.contains(marker);
        let has_any = |markers: &[&str]| markers.iter().any(|m| source.contains(m));
        if has("<minimax:tool_call>") {
            Err("minimax_m2")
        } else if has("<|tool_call>") && has("<tool_call|>") {
            Ok(Some(ToolFormat::Gemma4))
        } else if has("<start_function_call>") {
            Err("function_gemma")
        } else if has("<longcat_tool_call>") {
            Err("longcat")
        } else if has("<arg_key>") {
            Err("glm47")
        } else if has_any(&["<|tool_list_start|>", "<|tool_call_start|>"]) {
            Err("pythonic")
        } else if has_any(&["<tool_call>\\n<function=", "<tool_call>\n<function="]) {
            Err("qwen3_coder")
        } else if has("<|tool_calls_section_begin|>") {
            Err("kimi_k2")
        } else if has("<function name=\"") && has("<param name=\"") {
            Err("minicpm5")
        } else if has("[TOOL_CALLS]") {
            Err("mistral")
        } else if has("<atem:function_calls>") {
            Err("muse_spark")
        } else if has("<tool_call>") && has("tool_call.name") {
            Ok(Some(ToolFormat::Hermes))
        } else {
            Ok(None)
        }
    }

    pub fn start(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Gemma4 => "<|tool_call>",
        }
    }

    pub fn end(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "</tool_call>",
            ToolFormat::Gemma4 => "<tool_call|>",
        }
    }

    /// The calls between one pair of markers; `None` when the text does not
    /// parse (it then stays text).
    fn parse(self, inner: &str) -> Option<Vec<ToolCall>> {
        match self {
            ToolFormat::Hermes => parse_hermes(inner).map(|call| vec![call]),
            ToolFormat::Gemma4 => parse_gemma4(inner),
        }
    }
}

/// One parsed call: the function's name and its arguments (a JSON value).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Value,
}

impl ToolCall {
    /// OpenAI's `{"id", "type": "function", "function": {"name",
    /// "arguments"}}`, the arguments as a JSON string; a streamed one also
    /// carries its `index` among the answer's calls.
    pub fn to_openai(&self, id: &str, index: Option<usize>) -> Value {
        let mut call = json!({
            "id": id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments.to_string()},
        });
        if let Some(index) = index {
            call["index"] = json!(index);
        }
        call
    }
}

/// `json.loads(text.strip())` with a `name` string and an `arguments` value
/// (mlx-lm's formatter needs both).
fn parse_hermes(inner: &str) -> Option<ToolCall> {
    let value: Value = serde_json::from_str(inner.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = value.get("arguments")?.clone();
    Some(ToolCall { name, arguments })
}

/// Gemma 4's string delimiter.
pub(super) const GEMMA4_QUOTE: &str = "<|\"|>";

/// Every `call:NAME{ARGS}` in `inner` (NAME of word characters and `-`, ARGS
/// with balanced braces outside `<|"|>` strings), as gemma4.py's regex finds
/// them; `None` when there is none or one's arguments are not JSON once
/// converted.
fn parse_gemma4(inner: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = inner;
    while let Some(at) = rest.find("call:") {
        let after = &rest[at + "call:".len()..];
        let name_len = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(after.len());
        let (name, tail) = after.split_at(name_len);
        match (
            name.is_empty(),
            tail.starts_with('{'),
            balanced_braces(tail),
        ) {
            (false, true, Some(len)) => {
                let arguments = serde_json::from_str(&gemma4_args_to_json(&tail[..len])).ok()?;
                calls.push(ToolCall {
                    name: name.to_string(),
                    arguments,
                });
                rest = &tail[len..];
            }
            // Not a call here: look further on, as a regex search does.
            _ => rest = after,
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// The byte length of the `{...}` group `text` starts with, braces inside
/// `<|"|>` strings not counted; `None` when it does not close.
fn balanced_braces(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        if let Some(string) = rest.strip_prefix(GEMMA4_QUOTE) {
            let close = string.find(GEMMA4_QUOTE)?;
            i += GEMMA4_QUOTE.len() * 2 + close;
            continue;
        }
        let c = rest.chars().next()?;
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += c.len_utf8();
    }
    None
}

/// gemma4.py's `_gemma4_args_to_json`: each `<|"|>...<|"|>` becomes a JSON
/// string, and a bare key right after `{` or `,` (`key:`) is quoted.
fn gemma4_args_to_json(args: &str) -> String {
    let mut out = String::with_capacity(args.len());
    // The character before the current position once strings are taken out
    // (a string ends in a placeholder in gemma4.py, which is neither `{`
    // nor `,`).
    let mut previous: Option<char> = None;
    let mut i = 0;
    while i < args.len() {
        let rest = &args[i..];
        if let Some(string) = rest.strip_prefix(GEMMA4_QUOTE) {
            if let Some(close) = string.find(GEMMA4_QUOTE) {
                out.push_str(&Value::from(&string[..close]).to_string());
                i += GEMMA4_QUOTE.len() * 2 + close;
                previous = None;
                continue;
            }
        }
        if matches!(previous, Some('{' | ',')) {
            let key_len = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if key_len > 0 && rest[key_len..].starts_with(':') {
                out.push('"');
                out.push_str(&rest[..key_len]);
                out.push_str("\":");
                i += key_len + 1;
                previous = Some(':');
                continue;
            }
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        previous = Some(c);
        i += c.len_utf8().max(1);
    }
    out
}

/// A whole answer split into its text and its tool calls: each complete
/// pair of markers that parses becomes calls and leaves `content`; markup
/// that does not parse, and a start marker never closed (the answer was
/// cut), stay as text.
#[cfg(test)]
pub fn split_answer(text: &str, format: ToolFormat) -> (String, Vec<ToolCall>) {
    let mut splitter = ToolStream::new(format);
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in splitter.push(text).into_iter().chain(splitter.finish()) {
        match piece {
            Piece::Text(t) => content.push_str(&t),
            Piece::Calls(c) => calls.extend(c),
        }
    }
    (content, calls)
}

/// What a streamed answer emits: text to send as content, or calls whose
/// markup just closed.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Calls(Vec<ToolCall>),
}

/// Splits text arriving in pieces: text before a start marker passes on at
/// once; from a start marker (or what may become one) on, text is held until
/// the end marker comes.
pub struct ToolStream {
    format: ToolFormat,
    held: String,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> Self {
        ToolStream {
            format,
            held: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let (start, end) = (self.format.start(), self.format.end());
        let mut out = Vec::new();
        loop {
            let Some(at) = self.held.find(start) else {
                // Pass on all but a tail that may begin a start marker.
                let keep = partial_marker_len(&self.held, start);
                let send = self.held.len() - keep;
                if send > 0 {
                    out.push(Piece::Text(self.held[..send].to_string()));
                    self.held.drain(..send);
                }
                break;
            };
            if at > 0 {
                out.push(Piece::Text(self.held[..at].to_string()));
                self.held.drain(..at);
            }
            let Some(close) = self.held[start.len()..].find(end) else {
                break;
            };
            let markup_len = start.len() + close + end.len();
            let inner = &self.held[start.len()..start.len() + close];
            match self.format.parse(inner) {
                Some(calls) => out.push(Piece::Calls(calls)),
                // Malformed markup: the client gets the model's text.
                None => out.push(Piece::Text(self.held[..markup_len].to_string())),
            }
            self.held.drain(..markup_len);
        }
        out
    }

    /// The held text at the end of the answer (an unclosed call stays text).
    pub fn finish(&mut self) -> Vec<Piece> {
        match self.held.is_empty() {
            true => Vec::new(),
            false => vec![Piece::Text(std::mem::take(&mut self.held))],
        }
    }
}

/// The length of the longest tail of `text` that is a proper prefix of
/// `marker`: text that must be held, as it may begin the marker.
pub(super) fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len().saturating_sub(n))
                && marker.is_char_boundary(n)
                && text.ends_with(&marker[..n])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn hermes_calls_leave_the_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = split_answer(text, ToolFormat::Hermes);
        assert_eq!(content, "Let me check.\n\n");
        assert_eq!(
            calls,
            vec![
                call("get_weather", json!({"city": "Paris", "days": [1, 2]})),
                call("now", json!({})),
            ]
        );
        assert_eq!(
            calls[0].to_openai("call_1", None),
            json!({"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"days\":[1,2]}"}})
        );
    }

    #[test]
    fn malformed_hermes_markup_stays_text() {
        for text in [
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }</tool_call> after",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>[1, 2]</tool_call>",
            "cut short <tool_call>{\"name\": \"f\", \"argu",
        ] {
            let (content, calls) = split_answer(text, ToolFormat::Hermes);
            assert_eq!(content, text);
            assert!(calls.is_empty(), "{text}");
        }
        // A good call after a bad one is still found.
        let text = "<tool_call>nope</tool_call><tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
        let (content, calls) = split_answer(text, ToolFormat::Hermes);
        assert_eq!(content, "<tool_call>nope</tool_call>");
        assert_eq!(calls, vec![call("f", json!({"x": 1}))]);
    }

    #[test]
    fn gemma4_calls_parse_as_mlx_lm_does() {
        let text = "Sure.<|tool_call>call:get_weather{city:<|\"|>Paris, {the} \"capital\"<|\"|>,days:[1,2],deep:{ok:true,n:null}}<tool_call|>";
        let (content, calls) = split_answer(text, ToolFormat::Gemma4);
        assert_eq!(content, "Sure.");
        assert_eq!(
            calls,
            vec![call(
                "get_weather",
                json!({"city": "Paris, {the} \"capital\"", "days": [1, 2], "deep": {"ok": true, "n": null}})
            )]
        );
        // Several calls inside one pair of markers, names with '-'.
        let text = "<|tool_call>call:a-b{x:1} call:c{}<tool_call|>";
        let (content, calls) = split_answer(text, ToolFormat::Gemma4);
        assert_eq!(content, "");
        assert_eq!(
            calls,
            vec![call("a-b", json!({"x": 1})), call("c", json!({}))]
        );
    }

    #[test]
    fn malformed_gemma4_markup_stays_text() {
        for text in [
            "<|tool_call>no call here<tool_call|>",
            "<|tool_call>call:f{x:<|\"|>open string}<tool_call|>",
            "<|tool_call>call:f{x:bare}<tool_call|>",
            "<|tool_call>call:f{x:1<tool_call|>",
        ] {
            let (content, calls) = split_answer(text, ToolFormat::Gemma4);
            assert_eq!(content, text);
            assert!(calls.is_empty(), "{text}");
        }
    }

    #[test]
    fn streamed_pieces_hold_only_the_markup() {
        let text =
            "Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"é\"}}</tool_call> bye <tool";
        let whole = split_answer(text, ToolFormat::Hermes);
        // Every split into two pieces, at every character, gives the same.
        for (at, _) in text.char_indices() {
            let mut stream = ToolStream::new(ToolFormat::Hermes);
            let mut pieces = stream.push(&text[..at]);
            pieces.extend(stream.push(&text[at..]));
            pieces.extend(stream.finish());
            let mut content = String::new();
            let mut calls = Vec::new();
            for p in pieces {
                match p {
                    Piece::Text(t) => content.push_str(&t),
                    Piece::Calls(c) => calls.extend(c),
                }
            }
            assert_eq!((content, calls), whole, "split at {at}");
        }
        assert_eq!(whole.0, "Hi  bye <tool");
        // Text before a marker is not held back.
        let mut stream = ToolStream::new(ToolFormat::Hermes);
        assert_eq!(stream.push("Hello <to"), vec![Piece::Text("Hello ".into())]);
        assert_eq!(stream.push("ol_call>{"), vec![]);
    }

    #[test]
    fn the_template_names_the_format() {
        assert_eq!(
            ToolFormat::of_template("{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}"),
            Ok(Some(ToolFormat::Hermes))
        );
        assert_eq!(
            ToolFormat::of_template("{{- '<|tool_call>call:' }}{{- '<tool_call|>' }}"),
            Ok(Some(ToolFormat::Gemma4))
        );
        assert_eq!(
            ToolFormat::of_template("{{- '<tool_call>\\n<function=' }}{{- tool_call.name }}"),
            Err("qwen3_coder")
        );
        assert_eq!(ToolFormat::of_template("{{ messages }}"), Ok(None));
        let qwen3 = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/chat_templates/qwen3.jinja"),
        )
        .unwrap();
        assert_eq!(
            ToolFormat::of_template(&qwen3),
            Ok(Some(ToolFormat::Hermes))
        );
    }
}
