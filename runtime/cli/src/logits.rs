//! `archgen logits`: the parity protocol (docs/parity.md §2), the contract
//! outside tools compare with mlx-lm.

use std::path::Path;

use archgen_runtime::mlx_rs::{self, Array};
use archgen_runtime::model::{CausalLm, ModelTask};

use crate::args::{LogitsArgs, TokenIds};
use crate::checkpoint::with_model;
use crate::tokens::{check_ids, mlx};
use crate::ui::Ui;

/// Writes `tensors` to `out` atomically: a temporary beside it, then rename.
pub(crate) fn save_atomically(tensors: &[(&str, &Array)], out: &Path) -> Result<(), String> {
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if out.extension().and_then(|e| e.to_str()) != Some("safetensors") {
        return Err(format!(
            "--out {}: the file name must end in .safetensors",
            out.display()
        ));
    }
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp.safetensors", std::process::id()));
    let saved = Array::save_safetensors(tensors.iter().copied(), None, &tmp);
    if let Err(e) = saved {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("cannot write {}: {e}", out.display()));
    }
    std::fs::rename(&tmp, out).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", out.display())
    })
}

/// The single-sequence protocol of `prompt_ids` (a `--batch` schedule runs
/// in batch.rs; run.rs dispatches between them).
pub(crate) fn logits(
    ui: &Ui,
    args: &LogitsArgs,
    ids: &TokenIds,
    writes: bool,
) -> Result<(), String> {
    let task = LogitsTask {
        ids: &ids.0,
        steps: args.decode_steps,
        out: &args.out,
        writes,
    };
    let levers = crate::checkpoint::run_levers(&args.levers, &args.model, args.require_tier)?;
    with_model(
        ui,
        &args.model,
        args.implementation,
        args.require_tier,
        &levers,
        task,
    )?;
    if levers.values.first_token_in_decode_step {
        ui.note(
            "first-token-in-decode-step: not applied: one sequence runs no decode batch (the \
             lever acts with --batch)",
        );
    }
    if levers.values.prefill_step_while_generating.is_some() {
        ui.note(
            "prefill-step-while-generating: not applied: one sequence has no others generating \
             (the lever acts with --batch)",
        );
    }
    Ok(())
}

struct LogitsTask<'a> {
    ids: &'a [i32],
    steps: usize,
    out: &'a Path,
    /// False on tensor-parallel ranks other than 0: they run every step
    /// (the collectives need them) and write nothing.
    writes: bool,
}

impl ModelTask for LogitsTask<'_> {
    type Output = Result<(), String>;

    fn run<M: CausalLm>(self, m: &M) -> Self::Output {
        check_ids("--prompt-ids", self.ids, m.vocab_size())?;
        let run = mlx(archgen_runtime::protocol::run_logits(
            m, self.ids, self.steps,
        ))?;
        if !self.writes {
            return mlx(mlx_rs::transforms::eval([
                &run.prefill_logits,
                &run.decode_logits,
                &run.tokens,
            ]));
        }
        save_atomically(
            &[
                ("prefill_logits", &run.prefill_logits),
                ("decode_logits", &run.decode_logits),
                ("tokens", &run.tokens),
            ],
            self.out,
        )
    }
}
