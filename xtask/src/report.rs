//! How spec errors reach the user: the excerpt form on stderr (colour on a
//! terminal), or with `--message-format json` one JSON object per line on
//! stdout (docs/errors.md#json-messages).

use std::io::{IsTerminal, Write};

use archgen_families::render::Style;
use archgen_families::Diagnostics;

use crate::cli::MessageFormat;

#[derive(Debug, Clone, Copy, Default)]
pub struct Reporter {
    pub format: MessageFormat,
}

impl Reporter {
    pub fn new(format: MessageFormat) -> Self {
        Reporter { format }
    }

    /// Whether output is JSON lines (then stdout carries only JSON).
    pub fn json(&self) -> bool {
        self.format == MessageFormat::Json
    }

    /// Prints one JSON object as a line on stdout.
    pub fn emit(&self, value: &serde_json::Value) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{value}");
    }

    /// Reports the errors of one spec; returns the text for the task's error
    /// (the full excerpt form for people, a one-line count with JSON, whose
    /// objects are already on stdout).
    pub fn spec_errors(&self, diags: &Diagnostics) -> String {
        match self.format {
            MessageFormat::Human => {
                let style = if std::io::stderr().is_terminal() {
                    Style::Color
                } else {
                    Style::Plain
                };
                diags.render_excerpts(style)
            }
            MessageFormat::Json => {
                for v in diags.to_json() {
                    self.emit(&v);
                }
                let n = diags.len();
                let file = diags.iter().next().map_or("", |d| d.file.as_str());
                format!(
                    "{n} error{} in {file} (JSON on stdout)",
                    if n == 1 { "" } else { "s" }
                )
            }
        }
    }
}

/// A bar over `len` items (`gen --all`'s models), or `None` when stderr is
/// not a terminal or with --quiet.
pub fn items_bar(len: u64, what: &str, quiet: bool) -> Option<indicatif::ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    Some(bar)
}
