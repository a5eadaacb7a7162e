//! What a benchmark run measures: the specs, cache lengths, rounds and
//! steps, and the implementations in the order each round runs them.

/// The three implementations, in the order each round runs them.
pub const IMPLS: [&str; 3] = ["generated", "monolith", "mlx-lm"];

pub struct Plan {
    pub specs: Vec<String>,
    pub caches: Vec<usize>,
    pub rounds: usize,
    pub warmup: usize,
    pub steps: usize,
    pub step_mode: StepMode,
    /// A fresh prefill before every round (rather than once, round 0) when
    /// the cache length is at most this: cheap prefills give more samples and
    /// keep the short cache near its nominal length.
    pub reprefill_up_to: usize,
}

/// How the workers run and time decode steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepMode {
    /// As mlx-lm's generate_step: step n+1 queued before step n's token is
    /// read; a step is the interval between two tokens.
    Pipelined,
    /// One step at a time, forward + eval timed alone (the change log's CPU runs 1-11).
    Sequential,
}

impl StepMode {
    pub fn word(self) -> &'static str {
        match self {
            StepMode::Pipelined => "pipelined",
            StepMode::Sequential => "sequential",
        }
    }
}

impl Plan {
    pub fn full() -> Self {
        Plan {
            specs: [
                "gemma4-12b-tiny",
                "gemma4-12b-bench",
                "qwen3-0.6b-tiny",
                "qwen2.5-0.5b-tiny",
                "gemma-2-2b-tiny",
                "qwen3-30b-a3b-tiny-q4",
                "minicpm-2b-tiny",
                "mistral-7b-v0.3-tiny",
                "qwen3.5-4b-tiny",
                "glm-4.5-air-tiny-q4",
                "gpt-oss-20b-tiny-q4",
            ]
            .map(String::from)
            .to_vec(),
            caches: vec![128, 2048],
            rounds: 5,
            warmup: 2,
            steps: 12,
            step_mode: StepMode::Pipelined,
            reprefill_up_to: 512,
        }
    }
    pub fn quick() -> Self {
        Plan {
            specs: vec!["gemma4-12b-tiny".to_string()],
            caches: vec![128],
            rounds: 2,
            warmup: 1,
            steps: 3,
            step_mode: StepMode::Pipelined,
            reprefill_up_to: 512,
        }
    }
}
