//! Tokens in and out of a model: id checks, a sampled token's value,
//! detokenizing; and MLX's errors as this CLI's messages (sampling itself
//! is crate::sampling).

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

/// The value of a sampled token array (waits for it to be computed).
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

/// A word-level tokenizer for tests: `words` get ids in order, `<unk>`
/// stands for anything else.
#[cfg(test)]
pub(crate) fn word_level(words: &[&str]) -> Tokenizer {
    use tokenizers::models::wordlevel::WordLevel;
    let vocab = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i as u32))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab)
        .unk_token("<unk>".into())
        .build()
        .expect("a word-level vocabulary with <unk>");
    Tokenizer::new(model)
}
