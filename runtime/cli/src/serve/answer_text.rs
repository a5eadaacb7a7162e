//! A chat answer's text split into reasoning, content and tool calls, as
//! mlx-lm 0.32.2's server splits it (`TextStateMachine` in
//! mlx_lm/generate.py, driven by `handle_completion` in mlx_lm/server.py).
//!
//! The model's reasoning markers (thinking.rs) are matched in the decoded
//! text: from the start marker to the end marker the text is reasoning,
//! returned as the message's `reasoning` (`delta.reasoning` when streamed),
//! and the markers themselves are dropped. A tool-call start marker inside
//! reasoning ends it, as mlx-lm's `reasoning -> tool` edge does, and inside
//! a tool call neither reasoning marker is read. An answer starts in
//! reasoning when its prompt left a reasoning block open (a template that
//! writes the start marker into the generation prompt).
//!
//! Differences from mlx-lm, each so the client sees the model's text:
//! * text held because it may begin a marker is sent when the answer ends,
//!   where mlx-lm drops it on a stop (its buffer also holds stop words,
//!   which archgen cuts before this point);
//! * text completions are not split: their response has no reasoning
//!   field, and mlx-lm drops the reasoning from them.

use super::tools::{self, partial_marker_len, ToolCall, ToolFormat, ToolStream};
use crate::thinking::ThinkingMarkers;

/// How to read a chat answer: the reasoning markers and where the answer
/// starts, and the tool-call markup (chat with tools only).
#[derive(Debug, Clone, Default)]
pub struct AnswerFormat {
    pub reasoning: Option<ReasoningFormat>,
    pub tools: Option<ToolFormat>,
}

/// The reasoning markers as text, and whether the answer begins inside
/// reasoning.
#[derive(Debug, Clone)]
pub struct ReasoningFormat {
    start: String,
    end: String,
    begins_in_reasoning: bool,
}

impl ReasoningFormat {
    /// The format for an answer to `prompt` (mlx-lm's `initial_state`).
    pub fn for_prompt(markers: &ThinkingMarkers, prompt: &[i32]) -> Self {
        ReasoningFormat {
            start: markers.start_text.clone(),
            end: markers.end_text.clone(),
            begins_in_reasoning: markers.prompt_opens_reasoning(prompt),
        }
    }
}

/// What a streamed answer emits, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Content(String),
    Reasoning(String),
    /// Calls whose markup just closed.
    Calls(Vec<ToolCall>),
}

/// A whole answer's parts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WholeAnswer {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
}

impl WholeAnswer {
    /// `piece` appended to its part.
    fn add(&mut self, piece: Piece) {
        match piece {
            Piece::Content(t) => self.content.push_str(&t),
            Piece::Reasoning(t) => self.reasoning.push_str(&t),
            Piece::Calls(c) => self.calls.extend(c),
        }
    }
}

/// Splits an answer arriving in pieces of text.
pub struct AnswerSplitter {
    reasoning: Option<ReasoningStream>,
    tools: Option<ToolStream>,
}

impl AnswerSplitter {
    pub fn new(format: &AnswerFormat) -> Self {
        AnswerSplitter {
            reasoning: format
                .reasoning
                .as_ref()
                .map(|r| ReasoningStream::new(r, format.tools)),
            tools: format.tools.map(ToolStream::new),
        }
    }

    /// Whether the text passes through unchanged (no markers to read).
    pub fn is_plain(&self) -> bool {
        self.reasoning.is_none() && self.tools.is_none()
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let parts = match self.reasoning.as_mut() {
            Some(stream) => stream.push(text),
            None => vec![Part::Content(text.to_string())],
        };
        self.route(parts)
    }

    /// What is held when the answer ends: a marker never completed, or a
    /// tool call never closed, is the model's text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let parts = match self.reasoning.as_mut() {
            Some(stream) => stream.finish(),
            None => Vec::new(),
        };
        let mut out = self.route(parts);
        if let Some(tools) = self.tools.as_mut() {
            out.extend(tools.finish().into_iter().map(Piece::from));
        }
        out
    }

    /// A whole answer's reasoning, content and calls.
    pub fn whole(format: &AnswerFormat, text: &str) -> WholeAnswer {
        let mut splitter = AnswerSplitter::new(format);
        let mut answer = WholeAnswer::default();
        for piece in splitter.push(text).into_iter().chain(splitter.finish()) {
            answer.add(piece);
        }
        answer
    }

    /// Content goes on to the tool reader (when there is one); reasoning
    /// is emitted as it is.
    fn route(&mut self, parts: Vec<Part>) -> Vec<Piece> {
        let mut out = Vec::new();
        for part in parts {
            match (part, self.tools.as_mut()) {
                (Part::Reasoning(t), _) => out.push(Piece::Reasoning(t)),
                (Part::Content(t), Some(tools)) => {
                    out.extend(tools.push(&t).into_iter().map(Piece::from))
                }
                (Part::Content(t), None) => out.push(Piece::Content(t)),
            }
        }
        out
    }
}

impl From<tools::Piece> for Piece {
    fn from(piece: tools::Piece) -> Self {
        match piece {
            tools::Piece::Text(t) => Piece::Content(t),
            tools::Piece::Calls(c) => Piece::Calls(c),
        }
    }
}

/// Reasoning or content, before tool calls are read.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Content(String),
    Reasoning(String),
}

/// Where the reasoning reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Content,
    Reasoning,
    /// Inside a tool call's markup, which passes on as content (the tool
    /// reader parses it) and where reasoning markers are not read.
    ToolCall,
}

/// One marker the current state watches for.
struct Edge<'m> {
    marker: &'m str,
    to: State,
    /// The marker is content (the tool reader needs its markup); the
    /// reasoning markers are dropped.
    kept: bool,
}

struct ReasoningStream {
    start: String,
    end: String,
    tool_markers: Option<(&'static str, &'static str)>,
    state: State,
    /// Text that may begin a marker.
    held: String,
}

impl ReasoningStream {
    fn new(format: &ReasoningFormat, tools: Option<ToolFormat>) -> Self {
        ReasoningStream {
            start: format.start.clone(),
            end: format.end.clone(),
            tool_markers: tools.map(|t| (t.start(), t.end())),
            state: match format.begins_in_reasoning {
                true => State::Reasoning,
                false => State::Content,
            },
            held: String::new(),
        }
    }

    /// The markers that leave the current state (mlx-lm's transitions).
    fn edges(&self) -> Vec<Edge<'_>> {
        let mut edges = Vec::with_capacity(2);
        match self.state {
            State::Content => edges.push(Edge {
                marker: &self.start,
                to: State::Reasoning,
                kept: false,
            }),
            State::Reasoning => edges.push(Edge {
                marker: &self.end,
                to: State::Content,
                kept: false,
            }),
            State::ToolCall => {}
        }
        if let Some((call_start, call_end)) = self.tool_markers {
            match self.state {
                State::Content | State::Reasoning => edges.push(Edge {
                    marker: call_start,
                    to: State::ToolCall,
                    kept: true,
                }),
                State::ToolCall => edges.push(Edge {
                    marker: call_end,
                    to: State::Content,
                    kept: true,
                }),
            }
        }
        edges
    }

    fn part(&self, text: &str) -> Option<Part> {
        if text.is_empty() {
            return None;
        }
        Some(match self.state {
            State::Reasoning => Part::Reasoning(text.to_string()),
            State::Content | State::ToolCall => Part::Content(text.to_string()),
        })
    }

    fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            // The marker whose match ends first, as a matcher reading the
            // text character by character meets it.
            let found = self
                .edges()
                .into_iter()
                .filter_map(|edge| {
                    let at = self.held.find(edge.marker)?;
                    Some((
                        at + edge.marker.len(),
                        at,
                        edge.marker.len(),
                        edge.to,
                        edge.kept,
                    ))
                })
                .min_by_key(|&(end, ..)| end);
            let Some((_, at, len, to, kept)) = found else {
                let keep = self
                    .edges()
                    .iter()
                    .map(|edge| partial_marker_len(&self.held, edge.marker))
                    .max()
                    .unwrap_or(0);
                let send = self.held.len() - keep;
                let sent: String = self.held.drain(..send).collect();
                out.extend(self.part(&sent));
                break;
            };
            let before: String = self.held.drain(..at).collect();
            out.extend(self.part(&before));
            let marker: String = self.held.drain(..len).collect();
            self.state = to;
            if kept {
                out.extend(self.part(&marker));
            }
        }
        merge(out)
    }

    fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.held);
        self.part(&rest).into_iter().collect()
    }
}

/// Neighbouring parts of one kind as one (a kept marker and its call).
fn merge(parts: Vec<Part>) -> Vec<Part> {
    let mut out: Vec<Part> = Vec::with_capacity(parts.len());
    for part in parts {
        match (out.last_mut(), part) {
            (Some(Part::Content(a)), Part::Content(b)) => a.push_str(&b),
            (Some(Part::Reasoning(a)), Part::Reasoning(b)) => a.push_str(&b),
            (_, part) => out.push(part),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn format(begins_in_reasoning: bool, tools: Option<ToolFormat>) -> AnswerFormat {
        AnswerFormat {
            reasoning: Some(ReasoningFormat {
                start: "<think>".into(),
                end: "</think>".into(),
                begins_in_reasoning,
            }),
            tools,
        }
    }

    fn whole(format: &AnswerFormat, text: &str) -> (String, String, Vec<String>) {
        let a = AnswerSplitter::whole(format, text);
        let calls = a.calls.iter().map(|c| c.name.clone()).collect();
        (a.reasoning, a.content, calls)
    }

    #[test]
    fn reasoning_leaves_the_content_and_the_markers_are_dropped() {
        let f = format(false, None);
        assert_eq!(
            whole(&f, "<think>\nplan</think>\n\nHello"),
            ("\nplan".into(), "\n\nHello".into(), vec![])
        );
        // Begun by the prompt: the text up to the end marker is reasoning.
        let open = format(true, None);
        assert_eq!(
            whole(&open, "plan</think>Hi"),
            ("plan".into(), "Hi".into(), vec![])
        );
        // Never closed: all reasoning (a cut answer).
        assert_eq!(whole(&f, "a<think>b"), ("b".into(), "a".into(), vec![]));
        // A marker never completed is the model's text.
        assert_eq!(whole(&f, "x </thi"), ("".into(), "x </thi".into(), vec![]));
        // No markers: plain text.
        assert_eq!(
            whole(&AnswerFormat::default(), "<think>a</think>"),
            ("".into(), "<think>a</think>".into(), vec![])
        );
    }

    #[test]
    fn tool_calls_end_reasoning_and_hide_reasoning_markers() {
        let f = format(false, Some(ToolFormat::Hermes));
        let call = r#"<tool_call>{"name": "f", "arguments": {"q": "<think>"}}</tool_call>"#;
        // A call inside reasoning ends it (mlx-lm's reasoning -> tool edge).
        let (reasoning, content, calls) = whole(&f, &format!("<think>r{call} after"));
        assert_eq!((reasoning.as_str(), content.as_str()), ("r", " after"));
        assert_eq!(calls, ["f"]);
        // A reasoning marker inside a call's markup is the call's text.
        let a = AnswerSplitter::whole(&f, &format!("say{call}<think>x</think>y"));
        assert_eq!(a.content, "sayy");
        assert_eq!(a.reasoning, "x");
        assert_eq!(a.calls[0].arguments, json!({"q": "<think>"}));
    }

    #[test]
    fn every_split_of_the_stream_gives_the_whole_answer() {
        let f = format(false, Some(ToolFormat::Hermes));
        let text =
            "é<think>a é</think>b<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>c</th";
        let whole = AnswerSplitter::whole(&f, text);
        assert_eq!(
            (whole.reasoning.as_str(), whole.content.as_str()),
            ("a é", "ébc</th")
        );
        for (at, _) in text.char_indices() {
            for (at2, _) in text[at..].char_indices() {
                let mut s = AnswerSplitter::new(&f);
                let mut pieces = s.push(&text[..at]);
                pieces.extend(s.push(&text[at..at + at2]));
                pieces.extend(s.push(&text[at + at2..]));
                pieces.extend(s.finish());
                let mut got = WholeAnswer::default();
                for p in pieces {
                    got.add(p);
                }
                assert_eq!(got, whole, "split at {at} and {}", at + at2);
            }
        }
        // Text that cannot begin a marker is not held back.
        let mut s = AnswerSplitter::new(&format(false, None));
        assert_eq!(s.push("Hi <th"), vec![Piece::Content("Hi ".into())]);
        assert_eq!(s.push("ink>plan</"), vec![Piece::Reasoning("plan".into())]);
        assert_eq!(s.push("think>!"), vec![Piece::Content("!".into())]);
    }
}
