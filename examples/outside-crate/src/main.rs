//! `outside-crate MODEL_DIR PROMPT_IDS DECODE_STEPS OUT.safetensors`: runs the
//! model that `specialize!` makes from `specs/gemma4-walkthrough-tiny.yaml` on a
//! checkpoint directory (for example one written by `archgen init`) and writes
//! `prefill_logits`, `decode_logits` and `tokens` under archgen's logits
//! protocol (docs/parity.md §2), as `archgen logits` does.

use std::path::Path;
use std::process::ExitCode;

use archgen_runtime::model::CausalLm;
use archgen_runtime::protocol::run_logits;
use archgen_runtime::Array;

mod my_model {
    // The path is relative to this crate's Cargo.toml; editing the spec rebuilds.
    archgen_macros::specialize!("specs/gemma4-walkthrough-tiny.yaml");
}

const USAGE: &str = "usage: outside-crate MODEL_DIR PROMPT_IDS DECODE_STEPS OUT.safetensors
  PROMPT_IDS: comma-separated token ids, e.g. 1,2,3";

fn parse_ids(text: &str) -> Result<Vec<i32>, String> {
    text.split(',')
        .enumerate()
        .map(|(i, item)| {
            item.trim().parse::<i32>().map_err(|_| {
                format!(
                    "PROMPT_IDS: item {} ('{item}') is not a token id; expected e.g. 1,2,3",
                    i + 1
                )
            })
        })
        .collect()
}

/// Writes a temporary file beside `out`, then renames it: never a half-written `out`.
fn save_atomically(tensors: [(&str, &Array); 3], out: &Path) -> Result<(), String> {
    let (Some(name), Some("safetensors")) =
        (out.file_name(), out.extension().and_then(|e| e.to_str()))
    else {
        return Err(format!(
            "{}: the output file name must end in .safetensors",
            out.display()
        ));
    };
    let tmp = out.with_file_name(format!(
        ".{}.{}.tmp.safetensors",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = Array::save_safetensors(tensors, None, &tmp)
        .map_err(|e| e.to_string())
        .and_then(|()| std::fs::rename(&tmp, out).map_err(|e| e.to_string()));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", out.display())
    })
}

fn run(args: &[String]) -> Result<(), String> {
    let [model_dir, ids, steps, out] = args else {
        return Err(format!("expected 4 arguments, got {}\n{USAGE}", args.len()));
    };
    let ids = parse_ids(ids)?;
    let steps: usize = steps
        .parse()
        .map_err(|_| format!("DECODE_STEPS: '{steps}' is not a non-negative integer"))?;
    let (_, weights) =
        archgen_checkpoint::read_dir(Path::new(model_dir)).map_err(|e| e.to_string())?;
    let model = my_model::load(weights).map_err(|e| format!("{model_dir}: {e}"))?;
    // MLX does not bounds-check an embedding lookup.
    let vocab = model.vocab_size();
    if let Some(i) = ids.iter().position(|&id| !(0..vocab).contains(&id)) {
        return Err(format!(
            "PROMPT_IDS: id {} at position {} is out of the vocabulary (size {vocab})",
            ids[i],
            i + 1
        ));
    }
    let logits = run_logits(&model, &ids, steps).map_err(|e| format!("MLX: {e}"))?;
    let tensors: [(&str, &Array); 3] = [
        ("prefill_logits", &logits.prefill_logits),
        ("decode_logits", &logits.decode_logits),
        ("tokens", &logits.tokens),
    ];
    save_atomically(tensors, Path::new(out))?;
    eprintln!(
        "outside-crate: {} (fingerprint {}) wrote {out}",
        my_model::NAME,
        my_model::FINGERPRINT
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("outside-crate: error: {message}");
            ExitCode::FAILURE
        }
    }
}
