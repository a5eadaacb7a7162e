//! What a checkpoint directory gives a command: the model, loaded and run on
//! the implementation `--impl` selects (split over the ranks of a
//! tensor-parallel run), its tokenizer and its stop ids.

use std::path::Path;

use archgen_runtime::device::{self, Path as DecodePath};
use archgen_runtime::distributed::Split;
use archgen_runtime::model::{ModelTask, Runs};
use tokenizers::Tokenizer;

use crate::args::{Impl, RequiredTier};
use crate::levers::{CommandScope, LeverFlags, RunLevers};
use crate::ui::Ui;

/// The run's levers (flags over the alias over the environment over the
/// defaults), refused before anything is read when one of them is above
/// `require_tier`.
pub(crate) fn run_levers<S: CommandScope>(
    flags: &LeverFlags<S>,
    model: &Path,
    require_tier: Option<RequiredTier>,
) -> Result<RunLevers, String> {
    let levers = flags.resolve()?;
    if let Some(required) = require_tier {
        if let Some(why) = levers.refusal(required.tier()) {
            return Err(format!(
                "--require-tier {}: refusing to run {}: {why}",
                required.tier(),
                model.display()
            ));
        }
    }
    Ok(levers)
}

/// Loads the checkpoint at `model` and runs `task` on the implementation that
/// `--impl` selects: the generated model whose fingerprint matches the
/// checkpoint, or the monolith, with the run's `levers` (from [`run_levers`]).
/// States the run's parity tier (the highest of the model's and the
/// levers') and the levers on, and refuses the run when its tier is below
/// `require_tier`.
pub(crate) fn with_model<T: ModelTask<Output = Result<(), String>>>(
    ui: &Ui,
    model: &Path,
    implementation: Impl,
    require_tier: Option<RequiredTier>,
    levers: &RunLevers,
    task: T,
) -> Result<(), String> {
    // Before any step, which fixes the choices for the process.
    let wanted = levers.values.decode_choices();
    if let Err(in_force) = device::set_decode_choices(wanted) {
        if in_force != wanted {
            return Err(format!(
                "the decode choices were fixed before the levers were applied \
                 ({in_force:?}, not {wanted:?})"
            ));
        }
    }
    let bar = ui.bytes_bar(&format!("loading {}", model.display()), 0);
    let loaded = match &bar {
        Some(bar) => {
            let shown = bar.clone();
            let report = move |done: u64, total: u64| {
                shown.set_length(total);
                shown.set_position(done);
            };
            archgen_runtime::weights::with_load_progress(Box::new(report), || {
                archgen_checkpoint::read_dir(model)
            })
        }
        None => archgen_checkpoint::read_dir(model),
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let (arch, mut weights) = loaded.map_err(|e| e.to_string())?;
    // A tensor-parallel rank: split the IR's blocks as mlx-lm's shard()
    // does and load only this rank's slices.
    if let Some(group) = crate::launch::group() {
        let split = archgen_plan::tensor_parallel::split(&arch, group.size() as usize)
            .map_err(|e| format!("rank {} of {}: {e}", group.rank(), group.size()))?;
        ui.note(&format!(
            "tensor parallel: rank {} of {} ({} backend), {} all_sums per forward pass",
            group.rank(),
            group.size(),
            group.backend().name(),
            split.all_sums_per_forward()
        ));
        let splits = split.modules().map(|(m, s)| {
            let s = match s {
                archgen_plan::tensor_parallel::Split::AllToSharded => Split::AllToSharded,
                archgen_plan::tensor_parallel::Split::ShardedToAll => Split::ShardedToAll,
                archgen_plan::tensor_parallel::Split::Segmented { at } => Split::Segmented {
                    at: at.map(|i| i as i32),
                },
                archgen_plan::tensor_parallel::Split::Vector => Split::Vector,
                archgen_plan::tensor_parallel::Split::RepeatedHeads { heads, times } => {
                    Split::RepeatedHeads {
                        heads: heads as i32,
                        times: times as i32,
                    }
                }
            };
            (m.to_string(), s)
        });
        weights
            .shard(group, splits.collect::<Vec<_>>())
            .map_err(|e| format!("{}: {e}", model.display()))?;
    }
    // Both implementations reproduce the same oracle, so the tier is the
    // model's (split over ranks, that of its sharded oracle).
    let ranks = crate::launch::group().map_or(1, |g| g.size() as usize);
    let tier = archgen_ir::tier::sharded_tier(&arch, ranks);
    let tier = match task.runs() {
        Runs::OneSequence => tier,
        Runs::Batches => archgen_ir::tier::batch_tier(&arch, tier),
    };
    let tier = levers
        .reasons()
        .into_iter()
        .fold(tier, archgen_ir::tier::TierReport::with_reason);
    if let Some(required) = require_tier {
        if tier.tier > required.tier() {
            return Err(format!(
                "--require-tier {}: refusing to run {}: its parity tier is {tier} ({}); \
                 run it without --require-tier {}, or use a checkpoint without these features",
                required.tier(),
                model.display(),
                tier.tier.oracle(),
                required.tier(),
            ));
        }
    }
    ui.note(&format!("parity tier {tier} ({})", tier.tier.oracle()));
    ui.note(&levers.note());
    let fingerprint = archgen_plan::fingerprint(&arch);
    if implementation != Impl::Monolith {
        if let Some(found) = archgen_generated::find(&fingerprint) {
            ui.note(&format!(
                "running generated model {} (fingerprint {fingerprint}, {}); one-token steps: {}",
                found.name,
                found.spec,
                one_token_steps()
            ));
            let output = archgen_generated::run(&fingerprint, weights, task)
                .expect("find() and run() cover the same fingerprints")
                .map_err(|e| format!("{}: {e}", model.display()))?;
            if device::stacked_projections() {
                let n = device::stacked_counts();
                ui.note(&format!(
                    "gpu-stacked-projections: {} layers ran Q/K/V as one matmul, {} gate/up",
                    n.query_key_value, n.gate_up
                ));
            }
            if let Some(note) = head_kernel_note() {
                ui.note(&note);
            }
            if let Some(note) = chunked_prefill_note() {
                ui.note(&note);
            }
            return output;
        }
        let why = format!(
            "no generated model has this checkpoint's fingerprint {fingerprint} \
             ({} generated: `cargo xtask spec import {} --name NAME` then `cargo xtask gen NAME` adds one)",
            archgen_generated::MODELS.len(),
            model.display()
        );
        if implementation == Impl::Generated {
            return Err(format!("--impl generated: {why}"));
        }
        ui.note(&format!("--impl auto: running the monolith: {why}"));
    }
    let m = archgen_monolith::Monolith::new(arch, weights)
        .map_err(|e| format!("{}: {e}", model.display()))?;
    let output = task.run(&m);
    if let Some(note) = chunked_prefill_note() {
        ui.note(&note);
    }
    output
}

/// What the lever `deltanet-chunked-prefill` did: how many Gated DeltaNet
/// layer calls ran a prompt in chunks, or why none did. `None` when the
/// lever is off.
fn chunked_prefill_note() -> Option<String> {
    if !device::decode_choices().deltanet_chunked_prefill {
        return None;
    }
    if !device::chunked_delta_rule() {
        return Some(
            "deltanet-chunked-prefill: not applied: MLX's triangular solve runs on the CPU \
             only, and this run is on a GPU"
                .to_string(),
        );
    }
    Some(match device::chunked_prefill_count() {
        0 => "deltanet-chunked-prefill: not applied: no Gated DeltaNet layer ran a prompt of \
              more than one token"
            .to_string(),
        n => format!(
            "deltanet-chunked-prefill: {n} Gated DeltaNet layer calls ran a prompt in chunks"
        ),
    })
}

/// What the lever `cuda-head-norm-rope` did in a generated model's run:
/// how many one-token attention steps ran its kernel and how many it did not
/// cover, or why it did not run at all. `None` when the lever is off.
fn head_kernel_note() -> Option<String> {
    if !device::decode_choices().cuda_head_norm_rope {
        return None;
    }
    if !device::head_norm_rope_kernel() {
        return Some(
            "cuda-head-norm-rope: not applied: its kernel runs only in one-token steps on \
             CUDA's GPU path (this run's path: "
                .to_string()
                + one_token_steps()
                + ")",
        );
    }
    let n = device::head_kernel_counts();
    Some(format!(
        "cuda-head-norm-rope: {} one-token attention steps ran the kernel, {} were not \
         covered by it (ran the compiled block)",
        n.ran, n.not_covered
    ))
}

/// Which blocks a generated model's one-token steps run, as the levers and
/// the device make them (runtime/core/src/decode.rs).
fn one_token_steps() -> &'static str {
    match (archgen_runtime::decode::enabled(), device::path()) {
        (false, DecodePath::Eager | DecodePath::CpuFallbacks | DecodePath::NativeFastOps) => {
            "eager blocks"
        }
        (true, DecodePath::Eager) => "eager blocks",
        (true, DecodePath::CpuFallbacks) => "compiled blocks of the CPU's fallback ops",
        (true, DecodePath::NativeFastOps) => "compiled blocks with native fast ops (the GPU path)",
    }
}

/// Loads `DIR/tokenizer.json`; `Ok(None)` when the file is absent.
pub(crate) fn load_tokenizer(model: &Path) -> Result<Option<Tokenizer>, String> {
    let path = model.join("tokenizer.json");
    if !path.is_file() {
        return Ok(None);
    }
    Tokenizer::from_file(&path)
        .map(Some)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Adds the ids of an `eos_token_id` value (an int, a list of ints, or null).
fn push_eos(
    value: Option<&serde_json::Value>,
    file: &Path,
    eos: &mut Vec<i32>,
) -> Result<(), String> {
    let bad = || {
        format!(
            "{}: eos_token_id must be an integer or a list of integers",
            file.display()
        )
    };
    let as_id = |v: &serde_json::Value| {
        v.as_u64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(bad)
    };
    match value {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Array(items)) => {
            for v in items {
                eos.push(as_id(v)?);
            }
        }
        Some(v) => eos.push(as_id(v)?),
    }
    Ok(())
}

/// The stop ids: `eos_token_id` from config.json (top level and
/// `text_config`) and from generation_config.json when present, merged.
pub(crate) fn eos_ids(model: &Path) -> Result<Vec<i32>, String> {
    let mut eos = Vec::new();
    for name in ["config.json", "generation_config.json"] {
        let file = model.join(name);
        if !file.is_file() {
            continue;
        }
        let json = crate::chat_template::read_json(&file)?;
        push_eos(json.get("eos_token_id"), &file, &mut eos)?;
        if let Some(text_config) = json.get("text_config") {
            push_eos(text_config.get("eos_token_id"), &file, &mut eos)?;
        }
    }
    eos.sort_unstable();
    eos.dedup();
    Ok(eos)
}
