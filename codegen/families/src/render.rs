//! Diagnostics for people and for tools.
//!
//! The plain form (`Display` of [`Diagnostic`] / [`Diagnostics`]) is the
//! catalogue's text, pinned by the snapshots in tests/bad/snapshots. The
//! excerpt form adds, between the located message line and the hint, the
//! source line with a caret under the span (drawn by annotate-snippets):
//!
//! ```text
//! tests/bad/unknown-field.yaml:11:3: error at model.hiden_size: unknown field `hiden_size` (expected ...)
//!    |
//! 11 |   hiden_size: 64
//!    |   ^^^^^^^^^^
//!   hint: check the spelling; docs/spec-format.md lists every field
//! ```
//!
//! The JSON form is one object per diagnostic (docs/errors.md#json-messages).

use std::collections::BTreeMap;
use std::ops::Range;

use annotate_snippets::{Level, Renderer, Snippet};

use crate::{Diagnostic, Diagnostics};

/// Whether the excerpt form carries ANSI colours (for a terminal) or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Plain,
    Color,
}

/// The 1-based line `line` of `source`, without its line break.
fn source_line(source: &str, line: usize) -> Option<&str> {
    let text = source.split('\n').nth(line.checked_sub(1)?)?;
    Some(text.strip_suffix('\r').unwrap_or(text))
}

/// Byte range of the token that starts at 1-based character column `column`
/// of `line`: a quoted scalar or a flow collection up to its closing
/// character, else the plain scalar or key up to `: `, ` #`, a flow
/// separator or the end. Always at least one character; a column past the
/// end points at the end (`line` is then padded by one space by the caller).
fn token_span(line: &str, column: usize) -> Range<usize> {
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    let start_index = column.saturating_sub(1);
    let Some(&(start, first)) = chars.get(start_index) else {
        return line.len()..line.len() + 1;
    };
    let rest = &chars[start_index..];
    let end_of = |i: usize| rest.get(i).map_or(line.len(), |&(b, _)| b);
    let end = match first {
        // A tab, a stray blank or an undecodable byte: that one character.
        c if c.is_whitespace() || c == char::REPLACEMENT_CHARACTER => end_of(1),
        '"' | '\'' => {
            // Up to the closing quote ("" escapes are rare in specs; a
            // backslash skips the next character in double quotes).
            let mut i = 1;
            while i < rest.len() {
                match rest[i].1 {
                    '\\' if first == '"' => i += 1,
                    c if c == first => break,
                    _ => {}
                }
                i += 1;
            }
            end_of(i + 1)
        }
        '[' | '{' => {
            let mut depth = 0i32;
            let mut i = 0;
            while i < rest.len() {
                match rest[i].1 {
                    '[' | '{' => depth += 1,
                    ']' | '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            end_of(i + 1)
        }
        _ => {
            let mut i = 0;
            while i < rest.len() {
                let c = rest[i].1;
                let next = rest.get(i + 1).map(|&(_, c)| c);
                let stop = match c {
                    ',' | ']' | '}' => i > 0,
                    ':' => next.is_none_or(char::is_whitespace),
                    '#' => i > 0 && rest[i - 1].1.is_whitespace(),
                    _ => false,
                };
                if stop {
                    break;
                }
                i += 1;
            }
            // Trailing blanks before a comment or the end are not the token.
            while i > 1 && rest[i - 1].1.is_whitespace() {
                i -= 1;
            }
            end_of(i.max(1))
        }
    };
    start..end.max(start + first.len_utf8())
}

impl Diagnostic {
    /// The plain message line and hint with, between them, the source line
    /// and a caret under the span. `source` is the text of `self.file`;
    /// without it (or when the line is not in it) this is the plain form.
    pub fn render_excerpt(&self, source: Option<&str>, style: Style) -> String {
        let plain = self.to_string();
        // A blank line (an empty file, say) has nothing to point at.
        let Some(line) = source
            .and_then(|s| source_line(s, self.line))
            .filter(|l| !l.trim().is_empty())
        else {
            return plain;
        };
        let (head, hint) = plain.split_once('\n').unwrap_or((plain.as_str(), ""));
        let mut span = token_span(line, self.column);
        let padded;
        let line = if span.end > line.len() {
            padded = format!("{line} ");
            span.end = padded.len();
            padded.as_str()
        } else {
            line
        };
        let message = Level::Error.title("").snippet(
            Snippet::source(line)
                .line_start(self.line)
                .annotation(Level::Error.span(span)),
        );
        let renderer = match style {
            Style::Plain => Renderer::plain(),
            Style::Color => Renderer::styled(),
        };
        let drawn = renderer.render(message).to_string();
        // annotate-snippets' own title line ("error: ") goes: the first line
        // of the plain form already says where and what, in the catalogue's
        // file:line:column format that editors parse.
        let excerpt = drawn.split_once('\n').map_or("", |(_, rest)| rest);
        let mut out = format!("{head}\n{excerpt}");
        if !hint.is_empty() {
            out.push('\n');
            out.push_str(hint);
        }
        out
    }

    /// One JSON object: location (1-based line and column, end column of
    /// the span, exclusive, in characters), field path, message, expected,
    /// hint, and `rendered` (the plain excerpt form).
    pub fn to_json(&self, source: Option<&str>) -> serde_json::Value {
        let end_column = source
            .and_then(|s| source_line(s, self.line))
            .map(|line| {
                let span = token_span(line, self.column);
                let chars_before_end = line
                    .get(..span.end.min(line.len()))
                    .map_or(0, |t| t.chars().count());
                (chars_before_end + 1).max(self.column + 1)
            })
            .unwrap_or(self.column + 1);
        serde_json::json!({
            "type": "diagnostic",
            "severity": "error",
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "end_line": self.line,
            "end_column": end_column,
            "path": self.path.to_string(),
            "message": self.message,
            "expected": self.expected,
            "hint": self.hint,
            "rendered": self.render_excerpt(source, Style::Plain),
        })
    }
}

/// The text of every file the diagnostics name, read once each (lossy UTF-8,
/// so a file rejected for bad UTF-8 still shows its line). Unreadable files
/// are left out: their diagnostics render without an excerpt.
fn sources(diags: &Diagnostics) -> BTreeMap<&str, String> {
    let mut out = BTreeMap::new();
    for d in diags.iter() {
        if out.contains_key(d.file.as_str()) {
            continue;
        }
        if let Ok(bytes) = std::fs::read(&d.file) {
            out.insert(
                d.file.as_str(),
                String::from_utf8_lossy(&bytes).into_owned(),
            );
        }
    }
    out
}

impl Diagnostics {
    /// Every diagnostic in the excerpt form (source read from each
    /// diagnostic's file), then the `N error(s)` line, like `Display`.
    pub fn render_excerpts(&self, style: Style) -> String {
        let sources = sources(self);
        let mut out = String::new();
        for d in self.iter() {
            let source = sources.get(d.file.as_str()).map(String::as_str);
            out.push_str(&d.render_excerpt(source, style));
            out.push('\n');
        }
        let n = self.len();
        out.push_str(&format!("{n} error{}", if n == 1 { "" } else { "s" }));
        out
    }

    /// One JSON object per diagnostic (see [`Diagnostic::to_json`]).
    pub fn to_json(&self) -> Vec<serde_json::Value> {
        let sources = sources(self);
        self.iter()
            .map(|d| d.to_json(sources.get(d.file.as_str()).map(String::as_str)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::token_span;

    fn token(line: &str, column: usize) -> &str {
        let r = token_span(line, column);
        line.get(r).unwrap_or("<past the end>")
    }

    #[test]
    fn spans_cover_the_token_at_the_column() {
        // (line, 1-based column, the token there)
        for (line, column, want) in [
            ("  hiden_size: 64", 3, "hiden_size"),
            ("  hidden_size: big  # a comment", 16, "big"),
            ("  hidden_size: 64", 16, "64"),
            ("  name: \"a b\" # x", 9, "\"a b\""),
            ("  pattern: [sliding, full]", 12, "[sliding, full]"),
            ("  pattern: [sliding, full]", 13, "sliding"),
            ("  a: {b: 1, c: 2}", 6, "{b: 1, c: 2}"),
            ("key: http://x", 6, "http://x"),
            ("x", 1, "x"),
            ("é: ünit", 4, "ünit"),
            ("\thidden_size: 64", 1, "\t"),
            ("  repo: \"caf\u{FFFD}\"", 13, "\u{FFFD}"),
            ("abc", 9, "<past the end>"),
        ] {
            assert_eq!(token(line, column), want, "{line:?} at column {column}");
        }
        assert_eq!(token_span("abc", 9), 3..4);
    }
}
