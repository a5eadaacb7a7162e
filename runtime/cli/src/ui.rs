//! What the CLI tells a person on stderr besides errors: status notes and
//! progress bars (indicatif). `--quiet` turns both off; progress bars are
//! also off when stderr is not a terminal (pipes, CI logs, tests), and then
//! nothing about the work changes (a checkpoint loads lazily as before).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Status notes and progress on stderr.
#[derive(Debug, Clone, Copy)]
pub struct Ui {
    quiet: bool,
    terminal: bool,
}

impl Ui {
    pub fn new(quiet: bool) -> Self {
        Ui {
            quiet,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// A one-line status note (`archgen: ...`), unless --quiet.
    pub fn note(&self, message: &str) {
        if !self.quiet {
            eprintln!("archgen: {message}");
        }
    }

    /// Whether progress bars are drawn: stderr is a terminal and no --quiet.
    pub fn shows_progress(&self) -> bool {
        self.terminal && !self.quiet
    }

    /// A byte-count bar (`what [====>   ] 1.2 GiB/4.8 GiB 310 MiB/s 12s`),
    /// or `None` when progress is not shown.
    pub fn bytes_bar(&self, what: &str, total: u64) -> Option<ProgressBar> {
        if !self.shows_progress() {
            return None;
        }
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_message(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        Some(bar)
    }

    /// A spinner for a step with no measurable progress, or `None`.
    pub fn spinner(&self, what: &str) -> Option<ProgressBar> {
        if !self.shows_progress() {
            return None;
        }
        let bar = ProgressBar::new_spinner();
        bar.set_message(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        Some(bar)
    }
}
