//! Tokens in and out of a model: id checks, sampling, a sampled token's
//! value, detokenizing; and MLX's errors as this CLI's messages.

use archgen_runtime::mlx_rs::{self, Array};
use tokenizers::Tokenizer;

pub(crate) fn mlx<T>(r: Result<T, mlx_rs::error::Exception>) -> Result<T, String> {
    r.map_err(|e| format!("MLX: {e}"))
}

pub(crate) fn check_ids(what: &str, ids: &[i32], vocab: i32) -> Result<(), String> {
    match ids.iter().position(|&t| t >= vocab) {
        Some(i) => Err(format!(
            "{what}: id {} at position {} is out of the vocabulary (size {vocab})",
            ids[i],
            i + 1
        )),
        None => Ok(()),
    }
}

/// Samples one token, lazily: greedy at temp 0, else seeded categorical over
/// `logits / temp` restricted to the top-p nucleus. Returns the token as an
/// unevaluated int32 array [1, 1], the next step's input, so the decode loop
/// can build that step before this one has run (see [`crate::engine::generate`]).
pub(crate) fn sample(logits: &Array, temp: f32, top_p: f32, key: &Array) -> Result<Array, String> {
    let token = if temp == 0.0 {
        mlx(mlx_rs::ops::indexing::argmax_axis(logits, -1, false))?
    } else {
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
        mlx(mlx_rs::random::categorical(&scaled, -1, None, key))?
    };
    mlx(mlx(token.as_dtype(archgen_runtime::Dtype::Int32))?.reshape(&[1, 1]))
}

/// The value of a token array from [`sample`] (waits for it to be computed).
pub(crate) fn token_value(token: &Array) -> Result<i32, String> {
    token
        .try_item_exact::<i32>()
        .map_err(|e| format!("MLX: {e}"))
}

/// Decodes with special tokens kept (as mlx-lm's detokenizer does).
pub(crate) fn decode(tokenizer: &Tokenizer, ids: &[u32]) -> Result<String, String> {
    tokenizer
        .decode(ids, false)
        .map_err(|e| format!("tokenizer: cannot decode {ids:?}: {e}"))
}
