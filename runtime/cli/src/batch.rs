//! `archgen logits --batch FILE`: a schedule of sequences run as one
//! continuous batch, as mlx-lm 0.32.2's `BatchGenerator` runs it
//! (`archgen_runtime::batch_session`), one set of tensors per sequence.
//! tests/python/batch_oracle.py writes the same tensors from mlx-lm.

use archgen_runtime::batch_session::{run_schedule, Schedule};
use archgen_runtime::Array;

use crate::args::{Impl, LogitsArgs};
use crate::logits::save_atomically;
use crate::tokens::mlx;
use crate::ui::Ui;

/// Runs the schedule in `args.batch` on the monolith and writes, for each
/// sequence i in schedule order, `seq{i}.logprobs` [N, vocab] (compute
/// dtype), `seq{i}.tokens` [N] int32 and `seq{i}.steps` [N] int32 (the step
/// that returned each token).
pub(crate) fn logits(ui: &Ui, args: &LogitsArgs) -> Result<(), String> {
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
    match args.implementation {
        Impl::Generated => {
            return Err(format!(
                "--batch {}: --impl generated: generated models have no batched forward yet; \
                 use --impl monolith (or auto)",
                path.display()
            ))
        }
        Impl::Auto | Impl::Monolith => {}
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--batch {}: {e}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("--batch {}: not JSON: {e}", path.display()))?;
    let (arch, weights) = archgen_checkpoint::read_dir(&args.model).map_err(|e| e.to_string())?;
    let tier = archgen_spec::tier::tier(&arch);
    if let Some(required) = args.require_tier {
        if tier.tier > required.tier() {
            return Err(format!(
                "--require-tier {}: refusing to run {}: its parity tier is {tier}",
                required.tier(),
                args.model.display()
            ));
        }
    }
    ui.note(&format!("parity tier {tier} ({})", tier.tier.oracle()));
    let schedule = Schedule::from_json(&json, arch.vocab_size as i32)
        .map_err(|e| format!("--batch {}: {e}", path.display()))?;
    let model = archgen_monolith::Monolith::new(arch, weights)
        .map_err(|e| format!("{}: {e}", args.model.display()))?;
    ui.note(&format!(
        "running the monolith batched: {} sequences (mlx-lm BatchGenerator's schedule)",
        schedule.sequences.len()
    ));
    let runs = mlx(run_schedule(&model, &schedule))?;
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
    save_atomically(&named, &args.out)
}
