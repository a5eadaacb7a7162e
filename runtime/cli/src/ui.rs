//! What the CLI tells a person on stderr besides errors: status notes and
//! progress bars. `--quiet` turns both off; progress bars are also off when
//! stderr is not a terminal (pipes, CI logs, tests).

/// Status notes and progress on stderr.
#[derive(Debug, Clone, Copy)]
pub struct Ui {
    quiet: bool,
}

impl Ui {
    pub fn new(quiet: bool) -> Self {
        Ui { quiet }
    }

    /// A one-line status note (`archgen: ...`), unless --quiet.
    pub fn note(&self, message: &str) {
        if !self.quiet {
            eprintln!("archgen: {message}");
        }
    }
}
