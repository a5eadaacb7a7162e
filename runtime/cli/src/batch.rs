//! `archgen logits --batch FILE`: a schedule of sequences run as one
//! continuous batch, as mlx-lm 0.32.2's `BatchGenerator` runs it
//! (`archgen_runtime::batch_session`), one set of tensors per sequence.
//! tests/python/batch_oracle.py writes the same tensors from mlx-lm.

use std::path::Path;

use archgen_runtime::batch_session::{run_schedule, FirstSteps, Schedule};
use archgen_runtime::model::{CausalLm, ModelTask, Runs};
use archgen_runtime::Array;

use crate::args::LogitsArgs;
use crate::checkpoint::with_model;
use crate::logits::save_atomically;
use crate::tokens::mlx;
use crate::ui::Ui;

/// Runs the schedule in `args.batch` on the implementation `--impl` selects
/// (the generated model or the monolith: both batch) and writes, for each
/// sequence i in schedule order, `seq{i}.logprobs` [N, vocab] (compute
/// dtype), `seq{i}.tokens` [N] int32 and `seq{i}.steps` [N] int32 (the step
/// that returned each token).
pub(crate) fn logits(ui: &Ui, args: &LogitsArgs) -> Result<(), String> {
    let levers = crate::checkpoint::run_levers(&args.levers, &args.model, args.require_tier)?;
    let path = args
        .batch
        .as_ref()
        .ok_or("--batch FILE or --prompt-ids is required")?;
    if crate::launch::group().is_some() {
        return Err(format!(
            "--batch {}: a batch runs as one process, not tensor-parallel ranks",
            path.display()
        ));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--batch {}: {e}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("--batch {}: not JSON: {e}", path.display()))?;
    let task = BatchTask {
        ui,
        path,
        json: &json,
        out: &args.out,
        first_steps: levers.values.first_steps(),
        prefill_step_while_generating: levers.values.prefill_step_while_generating_tokens(),
    };
    with_model(
        ui,
        &args.model,
        args.implementation,
        args.require_tier,
        &levers,
        task,
    )
}

struct BatchTask<'a> {
    ui: &'a Ui,
    path: &'a Path,
    json: &'a serde_json::Value,
    out: &'a Path,
    /// Where a finished prompt's last token runs (the
    /// first-token-in-decode-step lever).
    first_steps: FirstSteps,
    /// The chunk cap while others generate (the
    /// prefill-step-while-generating lever).
    prefill_step_while_generating: Option<usize>,
}

impl ModelTask for BatchTask<'_> {
    type Output = Result<(), String>;

    fn runs(&self) -> Runs {
        Runs::Batches
    }

    fn run<M: CausalLm>(self, m: &M) -> Self::Output {
        let mut schedule = Schedule::from_json(self.json, m.vocab_size())
            .map_err(|e| format!("--batch {}: {e}", self.path.display()))?;
        schedule.config.first_steps = self.first_steps;
        schedule.config.prefill_step_while_generating = self.prefill_step_while_generating;
        let batched = m.batched().ok_or_else(|| {
            format!(
                "--batch {}: this implementation has no batched forward",
                self.path.display()
            )
        })?;
        let form = match self.first_steps {
            FirstSteps::OwnForward => "mlx-lm BatchGenerator's schedule",
            FirstSteps::InGenerationBatch => {
                "mlx-lm BatchGenerator's schedule, but a finished prompt's last token runs in \
                 the next decode forward: first-token-in-decode-step"
            }
        };
        let chunks = match self.prefill_step_while_generating {
            None => String::new(),
            Some(n) => format!(
                "; prompts chunked at most {n} tokens while others generate: \
                 prefill-step-while-generating"
            ),
        };
        self.ui.note(&format!(
            "running batched: {} sequences ({form}{chunks})",
            schedule.sequences.len()
        ));
        let runs = mlx(run_schedule(batched, &schedule))?;
        let mut tensors: Vec<(String, Array)> = Vec::with_capacity(3 * runs.len());
        for (i, run) in runs.into_iter().enumerate() {
            let n = run.tokens.len() as i32;
            tensors.push((format!("seq{i}.logprobs"), run.logprobs));
            tensors.push((
                format!("seq{i}.tokens"),
                Array::from_slice(&run.tokens, &[n]),
            ));
            tensors.push((format!("seq{i}.steps"), Array::from_slice(&run.steps, &[n])));
        }
        let named: Vec<(&str, &Array)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        save_atomically(&named, self.out)
    }
}
