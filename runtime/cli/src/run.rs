//! The commands: the `logits` protocol (the contract outside tools compare
//! with mlx-lm) and `generate` for people.

use std::path::Path;
use std::time::Instant;

use archgen_runtime::mlx_rs::ops::indexing::TryIndexOp;
use archgen_runtime::mlx_rs::{self, Array};
use archgen_runtime::model::CausalLm;

use crate::args::{Command, Impl, USAGE};

fn mlx<T>(r: Result<T, mlx_rs::error::Exception>) -> Result<T, String> {
    r.map_err(|e| format!("MLX: {e}"))
}

fn load(model: &Path, implementation: Impl) -> Result<Box<dyn CausalLm>, String> {
    if implementation == Impl::Generated {
        return Err(format!(
            "--impl generated: no generated model is built into this archgen yet (codegen issue); \
             use --impl monolith for {}",
            model.display()
        ));
    }
    let m = archgen_monolith::load_dir(model).map_err(|e| e.to_string())?;
    if implementation == Impl::Auto {
        eprintln!("archgen: --impl auto: running the monolith (no generated model is built in)");
    }
    Ok(Box::new(m))
}

fn check_ids(ids: &[i32], vocab: i32) -> Result<(), String> {
    match ids.iter().position(|&t| t >= vocab) {
        Some(i) => Err(format!(
            "--prompt-ids: id {} at position {} is out of the vocabulary (size {vocab})",
            ids[i],
            i + 1
        )),
        None => Ok(()),
    }
}

fn argmax(row: &Array) -> Result<i32, String> {
    mlx(archgen_runtime::protocol::argmax(row))
}

/// Writes `tensors` to `out` atomically: a temporary beside it, then rename.
fn save_atomically(tensors: &[(&str, &Array)], out: &Path) -> Result<(), String> {
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

fn logits(
    model: &Path,
    ids: &[i32],
    steps: usize,
    implementation: Impl,
    out: &Path,
) -> Result<(), String> {
    let m = load(model, implementation)?;
    check_ids(ids, m.vocab_size())?;
    let run = mlx(archgen_runtime::protocol::run_logits(
        m.as_ref(),
        ids,
        steps,
    ))?;
    save_atomically(
        &[
            ("prefill_logits", &run.prefill_logits),
            ("decode_logits", &run.decode_logits),
            ("tokens", &run.tokens),
        ],
        out,
    )
}

/// Samples one token: greedy at temp 0, else seeded categorical over
/// `logits / temp` restricted to the top-p nucleus.
fn sample(logits: &Array, temp: f32, top_p: f32, key: &Array) -> Result<i32, String> {
    if temp == 0.0 {
        return argmax(logits);
    }
    let scaled = mlx(logits.as_dtype(archgen_runtime::Dtype::Float32))?;
    let scaled = mlx(scaled.multiply(Array::from_f32(1.0 / temp)))?;
    let scaled = if top_p < 1.0 {
        let probs = mlx(mlx_rs::ops::softmax_axis(&scaled, -1, true))?;
        let order = mlx(mlx_rs::ops::argsort_axis(&probs, -1))?;
        let sorted = mlx(probs.take_along_axis(&order, -1))?;
        let cum = mlx(mlx_rs::ops::cumsum(&sorted, -1, None, None))?;
        // Keep the smallest top set whose mass reaches top_p (ascending order).
        let keep_sorted = mlx(cum.gt(Array::from_f32(1.0 - top_p)))?;
        let inverse = mlx(mlx_rs::ops::argsort_axis(&order, -1))?;
        let keep = mlx(keep_sorted.take_along_axis(&inverse, -1))?;
        mlx(mlx_rs::ops::select(
            &keep,
            &scaled,
            Array::from_f32(f32::NEG_INFINITY),
        ))?
    } else {
        scaled
    };
    let t = mlx(mlx_rs::random::categorical(&scaled, -1, None, key))?;
    t.try_item_exact::<u32>()
        .map(|v| v as i32)
        .map_err(|e| format!("MLX: {e}"))
}

#[allow(clippy::too_many_arguments)]
fn generate(
    model: &Path,
    ids: &[i32],
    max_tokens: usize,
    temp: f32,
    top_p: f32,
    seed: u64,
    implementation: Impl,
) -> Result<(), String> {
    let m = load(model, implementation)?;
    check_ids(ids, m.vocab_size())?;
    let mut cache = m.make_cache();
    let start = Instant::now();
    // mlx-lm's generate_step: prefill all but the last prompt token in chunks
    // of 2048, then feed the last one as the first step.
    let (head, last) = ids.split_at(ids.len() - 1);
    for chunk in head.chunks(2048) {
        let x = Array::from_slice(chunk, &[1, chunk.len() as i32]);
        mlx(mlx(m.forward(&x, &mut cache))?.eval())?;
    }
    let prefill_time = start.elapsed();
    let mut key = mlx(mlx_rs::random::key(seed))?;
    let mut token = last[0];
    let decode_start = Instant::now();
    let mut produced = 0;
    for _ in 0..max_tokens {
        let x = Array::from_slice(&[token], &[1, 1]);
        let row = mlx(mlx(m.forward(&x, &mut cache))?.try_index((0, -1)))?;
        let (k, sub) = mlx(mlx_rs::random::split(&key, 2))?;
        key = k;
        token = sample(&row, temp, top_p, &sub)?;
        produced += 1;
        print!("{token} ");
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    println!();
    let decode_time = decode_start.elapsed().as_secs_f64();
    eprintln!(
        "archgen: prompt {} tokens in {:.3} s; generated {produced} tokens at {:.1} tokens/s",
        ids.len(),
        prefill_time.as_secs_f64(),
        produced as f64 / decode_time.max(1e-9)
    );
    Ok(())
}

pub fn run(cmd: Command) -> Result<(), String> {
    match cmd {
        Command::Help => {
            println!("{USAGE}");
            Ok(())
        }
        Command::Logits {
            model,
            prompt_ids,
            decode_steps,
            implementation,
            out,
        } => logits(&model, &prompt_ids, decode_steps, implementation, &out),
        Command::Generate {
            model,
            prompt_ids,
            max_tokens,
            temp,
            top_p,
            seed,
            implementation,
        } => generate(
            &model,
            &prompt_ids,
            max_tokens,
            temp,
            top_p,
            seed,
            implementation,
        ),
    }
}
