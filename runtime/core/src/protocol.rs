//! The `archgen logits` protocol (docs/parity.md §2), shared by the CLI and the
//! parity tests: one forward over the whole prompt on a fresh cache, then N
//! greedy one-token steps on the same cache.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use crate::model::CausalLm;
use crate::ops::Result;

/// `prefill_logits` [L, V], `decode_logits` [N, V] and `tokens` [N] int32.
pub struct LogitsRun {
    pub prefill_logits: Array,
    pub decode_logits: Array,
    pub tokens: Array,
}

/// `mx.argmax` of a row: the first index among equal maxima.
pub fn argmax(row: &Array) -> Result<i32> {
    let i = mlx_rs::ops::indexing::argmax_axis(row, -1, false)?;
    i.try_item_exact::<u32>()
        .map(|v| v as i32)
        .map_err(|e| mlx_rs::error::Exception::custom(e.to_string()))
}

pub fn run_logits<M: CausalLm>(model: &M, ids: &[i32], steps: usize) -> Result<LogitsRun> {
    let vocab = model.vocab_size();
    let mut cache = model.make_cache();
    let prompt = Array::from_slice(ids, &[1, ids.len() as i32]);
    let prefill = model.forward(&prompt, &mut cache)?.try_index(0)?;
    prefill.eval()?;
    let mut last = prefill.try_index(-1)?;
    let (mut rows, mut tokens) = (Vec::with_capacity(steps), Vec::with_capacity(steps));
    for _ in 0..steps {
        let tok = argmax(&last)?;
        tokens.push(tok);
        let x = Array::from_slice(&[tok], &[1, 1]);
        let row = model.forward(&x, &mut cache)?.try_index((0, -1))?;
        row.eval()?;
        rows.push(row.clone());
        last = row;
    }
    let decode_logits = if rows.is_empty() {
        mlx_rs::ops::zeros_dtype(&[0, vocab], prefill.dtype())?
    } else {
        mlx_rs::ops::stack(&rows, 0)?
    };
    Ok(LogitsRun {
        prefill_logits: prefill,
        decode_logits,
        tokens: Array::from_slice(&tokens, &[tokens.len() as i32]),
    })
}
