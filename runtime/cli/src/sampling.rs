//! Token sampling as mlx-lm 0.32.2 composes it in `generate_step`
//! (sample_utils.py): the logits processors of `make_logits_processors`
//! (logit bias, then the repetition, presence and frequency penalties) on
//! the step's logits, then `logprobs = logits - logsumexp(logits)`, then the
//! chain of `make_sampler` (top-p, min-p, top-k) and `categorical_sampling`,
//! or the argmax at temperature 0.
//!
//! Bit-exactness rests on three things, each mirrored here op for op:
//! - mlx's weak Python scalars: a Python float meeting an array takes the
//!   array's dtype (through f32: mlx builds the scalar from a C++ float), so
//!   every constant is made as an f32 array cast to its operand's dtype, and
//!   values Python computes in double (`1.0 / temp`, `math.log(min_p)`) are
//!   computed in f64 first.
//! - The random stream: `mx.random.seed(seed)` sets the global key to
//!   `key(seed)`; each `mx.random.categorical` without a key splits it and
//!   draws with the second half. One [`TokenSampler`] owns that key, so a
//!   sequence draws exactly the keys `generate_step` draws after
//!   `mx.random.seed(seed)`. Only categorical sampling draws (greedy and the
//!   filters never do).
//! - The processors' token context: `generate_step` feeds them every prompt
//!   token and every generated token fed back, the last `context` of them.
//!
//! A constrained request ([`crate::constrained`]) adds one processor after
//! mlx-lm's: its grammar's mask, every token it does not allow next set to
//! -inf, so the logprobs and the sampler see only the allowed tokens.
//!
//! mlx-lm wraps the filters and the draw in `mx.compile`; running the same
//! ops uncompiled gives the same bytes (checked by hand, docs/parity.md,
//! "Sampling"). runtime/cli/tests/sampling.rs compares `archgen generate`
//! with `generate_step` (tests/python/sampling_oracle.py).

use archgen_runtime::mlx_rs::ops::indexing::{argmax_axis, TryIndexOp};
use archgen_runtime::mlx_rs::{self, Array};
use archgen_runtime::Dtype;

use crate::constrained::{GrammarState, TokenConstraint};
use crate::tokens::mlx;

/// A penalty of `make_logits_processors` and how many of the latest tokens
/// it looks at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalty {
    pub value: f64,
    /// At least 1.
    pub context: usize,
}

/// mlx-lm's default context of every penalty.
pub const DEFAULT_PENALTY_CONTEXT: usize = 20;

/// What `make_sampler` and `make_logits_processors` are given. The numbers
/// are f64, as Python holds them; each becomes an array where mlx-lm's
/// arithmetic meets one.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy (argmax).
    pub temp: f64,
    /// Nucleus sampling, applied when in (0, 1).
    pub top_p: f64,
    /// Min-p sampling, applied when not 0; in [0, 1].
    pub min_p: f64,
    /// Tokens min-p always keeps; at least 1.
    pub min_tokens_to_keep: usize,
    /// Top-k sampling, applied when not 0; below the vocabulary size.
    pub top_k: usize,
    /// Added to the logits of these token ids (distinct ids).
    pub logit_bias: Vec<(i32, f64)>,
    /// Sign-aware multiplicative penalty (applied when not 0; >= 0).
    pub repetition_penalty: Option<Penalty>,
    /// Subtracted once from the logit of every token in the context.
    pub presence_penalty: Option<Penalty>,
    /// Subtracted from a token's logit once per occurrence in the context.
    pub frequency_penalty: Option<Penalty>,
}

impl Default for SamplingParams {
    /// Greedy, no filter, no processor.
    fn default() -> Self {
        SamplingParams {
            temp: 0.0,
            top_p: 1.0,
            min_p: 0.0,
            min_tokens_to_keep: 1,
            top_k: 0,
            logit_bias: Vec::new(),
            repetition_penalty: None,
            presence_penalty: None,
            frequency_penalty: None,
        }
    }
}

/// Which of `make_logits_processors`'s penalties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PenaltyKind {
    Repetition,
    Presence,
    Frequency,
}

impl SamplingParams {
    /// The penalties `make_logits_processors` builds, in its order: those
    /// given and not 0.
    fn penalties(&self) -> Vec<(PenaltyKind, Penalty)> {
        [
            (PenaltyKind::Repetition, self.repetition_penalty),
            (PenaltyKind::Presence, self.presence_penalty),
            (PenaltyKind::Frequency, self.frequency_penalty),
        ]
        .into_iter()
        .filter_map(|(kind, p)| p.filter(|p| p.value != 0.0).map(|p| (kind, p)))
        .collect()
    }

    /// Whether any logits processor applies (they need the logits).
    pub fn has_processors(&self) -> bool {
        !self.logit_bias.is_empty() || !self.penalties().is_empty()
    }

    /// Whether a token is the argmax of the logprobs (greedy, no processor).
    pub fn is_plain_greedy(&self) -> bool {
        self.temp == 0.0 && !self.has_processors()
    }

    /// The checks mlx-lm makes when it builds or runs the sampler, as
    /// messages naming the setting (`names` gives each setting's name as
    /// the caller spells it: a flag or a request field).
    pub fn check(&self, vocab: usize, names: &SettingNames) -> Result<(), (String, &'static str)> {
        let fail = |name: &'static str, message: String| Err((format!("{name}: {message}"), name));
        if !(self.temp.is_finite() && self.temp >= 0.0) {
            return fail(
                names.temp,
                format!("{} must be a finite number >= 0", self.temp),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return fail(names.top_p, format!("{} is outside (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return fail(names.min_p, format!("{} is outside [0, 1]", self.min_p));
        }
        if self.min_tokens_to_keep == 0 {
            return fail(names.min_tokens_to_keep, "must be at least 1".into());
        }
        if self.top_k >= vocab {
            return fail(
                names.top_k,
                format!(
                    "{} must be below the vocabulary size ({vocab}); 0 turns top-k off",
                    self.top_k
                ),
            );
        }
        for &(id, bias) in &self.logit_bias {
            if id < 0 || id as usize >= vocab {
                return fail(
                    names.logit_bias,
                    format!("token id {id} is out of the vocabulary (size {vocab})"),
                );
            }
            if !bias.is_finite() {
                return fail(
                    names.logit_bias,
                    format!("the bias of token {id} is {bias}, not a finite number"),
                );
            }
        }
        for (kind, penalty) in [
            (PenaltyKind::Repetition, self.repetition_penalty),
            (PenaltyKind::Presence, self.presence_penalty),
            (PenaltyKind::Frequency, self.frequency_penalty),
        ] {
            let Some(p) = penalty else { continue };
            let (name, context) = match kind {
                PenaltyKind::Repetition => (names.repetition_penalty, names.repetition_context),
                PenaltyKind::Presence => (names.presence_penalty, names.presence_context),
                PenaltyKind::Frequency => (names.frequency_penalty, names.frequency_context),
            };
            if !p.value.is_finite() {
                return fail(name, format!("{} is not a finite number", p.value));
            }
            if kind == PenaltyKind::Repetition && p.value < 0.0 {
                return fail(name, format!("{} must be >= 0 (0 turns it off)", p.value));
            }
            if p.context == 0 {
                return fail(context, "must be at least 1".into());
            }
        }
        Ok(())
    }
}

/// How the caller names each setting in messages.
pub struct SettingNames {
    pub temp: &'static str,
    pub top_p: &'static str,
    pub min_p: &'static str,
    pub min_tokens_to_keep: &'static str,
    pub top_k: &'static str,
    pub logit_bias: &'static str,
    pub repetition_penalty: &'static str,
    pub repetition_context: &'static str,
    pub presence_penalty: &'static str,
    pub presence_context: &'static str,
    pub frequency_penalty: &'static str,
    pub frequency_context: &'static str,
}

/// The flags of `archgen generate` and `chat`.
pub const FLAG_NAMES: SettingNames = SettingNames {
    temp: "--temp",
    top_p: "--top-p",
    min_p: "--min-p",
    min_tokens_to_keep: "--min-tokens-to-keep",
    top_k: "--top-k",
    logit_bias: "--logit-bias",
    repetition_penalty: "--repetition-penalty",
    repetition_context: "--repetition-context-size",
    presence_penalty: "--presence-penalty",
    presence_context: "--presence-context-size",
    frequency_penalty: "--frequency-penalty",
    frequency_context: "--frequency-context-size",
};

/// The request fields of `archgen serve` (OpenAI's and mlx-lm server's names).
pub const FIELD_NAMES: SettingNames = SettingNames {
    temp: "temperature",
    top_p: "top_p",
    min_p: "min_p",
    min_tokens_to_keep: "min_tokens_to_keep",
    top_k: "top_k",
    logit_bias: "logit_bias",
    repetition_penalty: "repetition_penalty",
    repetition_context: "repetition_context_size",
    presence_penalty: "presence_penalty",
    presence_context: "presence_context_size",
    frequency_penalty: "frequency_penalty",
    frequency_context: "frequency_context_size",
};

/// A fresh seed from the operating system's random source, for a run or a
/// request that gives none (it is reported, so the run can be replayed).
pub fn fresh_seed() -> Result<u64, String> {
    getrandom::u64().map_err(|e| format!("cannot read the system's random source for a seed: {e}"))
}

/// A Python float meeting an array of `dtype` (mlx's weak scalar).
fn weak(value: f64, dtype: Dtype) -> Result<Array, String> {
    mlx(Array::from_f32(value as f32).as_dtype(dtype))
}

/// The tokens the processors have seen: the prompt and every token fed
/// back, lazily concatenated as `generate_step` concatenates them.
struct History {
    tokens: Array,
    len: usize,
}

/// One sequence's sampler: its settings, its key (the global key of
/// `mx.random.seed(seed)`) and its processors' token history.
pub struct TokenSampler {
    params: SamplingParams,
    key: Array,
    /// `None` without processors (mlx-lm keeps no tokens then either).
    history: Option<History>,
    /// The logit bias as `make_logits_processors` builds it: ids (int32)
    /// and values (float32), [1, n] each.
    bias: Option<(Array, Array)>,
    /// The output grammar, whose mask is the last processor.
    constraint: Option<TokenConstraint>,
}

/// One step's results, both lazy.
pub struct Step {
    /// The sampled token, int32 [1, 1]: the next step's input.
    pub token: Array,
    /// `logits - logsumexp(logits)` after the processors, [1, vocab] in the
    /// logits' dtype (what `generate_step` yields).
    pub logprobs: Array,
}

impl TokenSampler {
    /// A sampler for a sequence whose prompt is `prompt_head` and then the
    /// first step's input (the prompt's last token, given to [`Self::step`]).
    pub fn new(params: &SamplingParams, seed: u64, prompt_head: &[i32]) -> Result<Self, String> {
        let history = match params.has_processors() {
            true => Some(History {
                tokens: Array::from_slice(prompt_head, &[prompt_head.len() as i32]),
                len: prompt_head.len(),
            }),
            false => None,
        };
        let bias = match params.logit_bias.is_empty() {
            true => None,
            false => {
                let n = params.logit_bias.len() as i32;
                let ids: Vec<i32> = params.logit_bias.iter().map(|&(id, _)| id).collect();
                let values: Vec<f32> = params.logit_bias.iter().map(|&(_, v)| v as f32).collect();
                Some((
                    Array::from_slice(&ids, &[1, n]),
                    Array::from_slice(&values, &[1, n]),
                ))
            }
        };
        Ok(TokenSampler {
            params: params.clone(),
            key: mlx(mlx_rs::random::key(seed))?,
            history,
            bias,
            constraint: None,
        })
    }

    /// The sampler with an output grammar: its mask applies after the
    /// other processors, and [`Self::accept`] moves it past each token.
    pub fn constrained(mut self, constraint: TokenConstraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Whether the sampler needs the logits ([`Self::step`]), not a logprobs
    /// row: it has logits processors or an output grammar.
    pub fn needs_logits(&self) -> bool {
        self.history.is_some() || self.constraint.is_some()
    }

    /// Feeds the token just sampled (evaluated) to the output grammar, if
    /// any: whether the answer may go on.
    pub fn accept(&mut self, token: i32) -> Result<GrammarState, String> {
        match &mut self.constraint {
            None => Ok(GrammarState::Open),
            Some(constraint) => constraint.accept(token),
        }
    }

    /// One step of `generate_step._step`: `logits` [1, vocab] are the model's
    /// last logits after feeding `input` (the tokens fed, any shape); returns
    /// the sampled token and the logprobs, unevaluated.
    pub fn step(&mut self, logits: &Array, input: &Array) -> Result<Step, String> {
        let mut logits = logits.clone();
        if let Some(history) = self.history.as_mut() {
            let fed = mlx(input.reshape(&[-1]))?;
            history.len += fed.size();
            history.tokens = mlx(mlx_rs::ops::concatenate(&[&history.tokens, &fed], 0))?;
            if let Some((ids, values)) = &self.bias {
                logits = add_logit_bias(&logits, ids, values)?;
            }
            for (kind, penalty) in self.params.penalties() {
                let start = history.len.saturating_sub(penalty.context) as i32;
                let context = mlx(history.tokens.try_index(start..))?;
                logits = apply_penalty(&logits, &context, kind, penalty.value)?;
            }
        }
        if let Some(constraint) = self.constraint.as_mut() {
            logits = apply_mask(&logits, &constraint.allowed()?)?;
        }
        let norm = mlx(logits.logsumexp(true))?;
        let logprobs = mlx(logits.subtract(&norm))?;
        let token = match self.params.temp == 0.0 {
            true => mlx(argmax_axis(&logprobs, -1, false))?,
            false => self.sample(&logprobs)?,
        };
        let token = mlx(mlx(token.as_dtype(Dtype::Int32))?.reshape(&[1, 1]))?;
        Ok(Step { token, logprobs })
    }

    /// A token from a row that is already `logits - logsumexp(logits)`
    /// ([vocab]; the batched server's rows): the sampler runs on it as it
    /// is, as `BatchGenerator`'s per-sequence sampler does. Logits
    /// processors need the logits, so a sampler with them refuses. Returns
    /// the token, int32 [1, 1].
    pub fn sample_logprobs(&mut self, row: &Array) -> Result<Array, String> {
        if self.needs_logits() {
            return Err(
                "a sampler with logits processors or an output grammar needs the logits, \
                 not logprobs"
                    .into(),
            );
        }
        let row = mlx(row.reshape(&[1, -1]))?;
        let token = match self.params.temp == 0.0 {
            true => mlx(argmax_axis(&row, -1, false))?,
            false => self.sample(&row)?,
        };
        mlx(mlx(token.as_dtype(Dtype::Int32))?.reshape(&[1, 1]))
    }

    /// `make_sampler`'s chain at a temperature above 0: the filters in
    /// mlx-lm's order, then `categorical_sampling` with the next key.
    fn sample(&mut self, logprobs: &Array) -> Result<Array, String> {
        let p = &self.params;
        let mut x = logprobs.clone();
        if 0.0 < p.top_p && p.top_p < 1.0 {
            x = apply_top_p(&x, p.top_p)?;
        }
        if p.min_p != 0.0 {
            x = apply_min_p(&x, p.min_p, p.min_tokens_to_keep)?;
        }
        if p.top_k > 0 {
            x = apply_top_k(&x, p.top_k)?;
        }
        let scaled = mlx(x.multiply(weak(1.0 / p.temp, x.dtype())?))?;
        let (next, draw) = mlx(mlx_rs::random::split(&self.key, 2))?;
        self.key = next;
        mlx(mlx_rs::random::categorical(&scaled, -1, None, &draw))
    }
}

/// The grammar's processor: every token not `allowed` gets -inf (the
/// allowed ones keep their logits, so their relative odds are the model's).
fn apply_mask(logits: &Array, allowed: &[bool]) -> Result<Array, String> {
    let vocab = logits.shape().last().copied().unwrap_or(0);
    if allowed.len() != vocab as usize {
        return Err(format!(
            "the output grammar's mask has {} tokens, the logits {vocab}",
            allowed.len()
        ));
    }
    let allowed = Array::from_slice(allowed, &[1, vocab]);
    mlx(mlx_rs::ops::select(
        &allowed,
        logits,
        weak(f64::NEG_INFINITY, logits.dtype())?,
    ))
}

/// `logits.at[:, indices].add(values)`: the values take the logits' dtype,
/// then a scatter-add.
fn add_logit_bias(logits: &Array, ids: &Array, values: &Array) -> Result<Array, String> {
    let n = ids.size() as i32;
    let updates = mlx(mlx(values.as_dtype(logits.dtype()))?.reshape(&[n, 1, 1]))?;
    let ids = mlx(ids.reshape(&[n]))?;
    mlx(mlx_rs::ops::indexing::scatter_add_single(
        logits, &ids, &updates, 1,
    ))
}

/// One penalty of `make_logits_processors` over the context's tokens (1-D).
fn apply_penalty(
    logits: &Array,
    context: &Array,
    kind: PenaltyKind,
    value: f64,
) -> Result<Array, String> {
    let dtype = logits.dtype();
    let penalty = weak(value, dtype)?;
    let n = context.size() as i32;
    match kind {
        // selected = logits[:, tokens]; where(selected < 0, selected *
        // penalty, selected / penalty); logits[:, tokens] = selected.
        PenaltyKind::Repetition => {
            let selected = mlx(logits.take_axis(context, 1))?;
            let negative = mlx(selected.lt(weak(0.0, dtype)?))?;
            let scaled = mlx(mlx_rs::ops::select(
                &negative,
                mlx(selected.multiply(&penalty))?,
                mlx(selected.divide(&penalty))?,
            ))?;
            let at = mlx(context.reshape(&[1, n]))?;
            mlx(logits.put_along_axis(&at, &scaled, -1))
        }
        // logits[:, tokens] -= penalty: a token repeated in the context is
        // written, not subtracted, again.
        PenaltyKind::Presence => {
            let selected = mlx(logits.take_axis(context, 1))?;
            let lowered = mlx(selected.subtract(&penalty))?;
            let at = mlx(context.reshape(&[1, n]))?;
            mlx(logits.put_along_axis(&at, &lowered, -1))
        }
        // logits.at[:, tokens].subtract(penalty): once per occurrence.
        PenaltyKind::Frequency => {
            let updates = mlx(mlx_rs::ops::broadcast_to(
                mlx(penalty.negative())?,
                &[n, 1, 1],
            ))?;
            mlx(mlx_rs::ops::indexing::scatter_add_single(
                logits, context, &updates, 1,
            ))
        }
    }
}

/// `apply_top_p`: drop the least likely tokens whose mass together is below
/// `1 - top_p` of the whole (computed in float32).
fn apply_top_p(logprobs: &Array, top_p: f64) -> Result<Array, String> {
    let sorted = mlx(mlx_rs::ops::sort_axis(logprobs, -1))?;
    let probs = mlx(mlx(sorted.as_dtype(Dtype::Float32))?.exp())?;
    let mass_above = mlx(mlx_rs::ops::cumsum(&probs, -1, true, false))?;
    let total = mlx(mlx(mass_above.try_index((.., ..1)))?.add(mlx(probs.try_index((.., ..1)))?))?;
    let bar = mlx(weak(top_p, Dtype::Float32)?.multiply(&total))?;
    let dropped = mlx(mlx(mass_above.ge(&bar))?.sum_axis(-1, true))?;
    let threshold = mlx(sorted.take_along_axis(&dropped, -1))?;
    let below = mlx(logprobs.lt(&threshold))?;
    mlx(mlx_rs::ops::select(
        &below,
        weak(f64::NEG_INFINITY, logprobs.dtype())?,
        logprobs,
    ))
}

/// `apply_min_p`: drop tokens less likely than `min_p` times the most
/// likely one, keeping the `min_tokens_to_keep` most likely.
fn apply_min_p(logprobs: &Array, min_p: f64, min_tokens_to_keep: usize) -> Result<Array, String> {
    let dtype = logprobs.dtype();
    let top = mlx(logprobs.max_axis(-1, true))?;
    let scaled_min_p = mlx(top.add(weak(min_p.ln(), dtype)?))?;
    let mut remove = mlx(logprobs.lt(&scaled_min_p))?;
    if min_tokens_to_keep > 1 {
        let keep = min_tokens_to_keep as i32;
        let order = mlx(mlx_rs::ops::argpartition_axis(logprobs, -keep, -1))?;
        let top_ids = mlx(order.try_index((.., -keep..)))?;
        remove = mlx(remove.put_along_axis(&top_ids, Array::from_bool(false), -1))?;
    }
    mlx(mlx_rs::ops::select(
        &remove,
        weak(f64::NEG_INFINITY, dtype)?,
        logprobs,
    ))
}

/// `apply_top_k`: keep the `top_k` most likely tokens.
fn apply_top_k(logprobs: &Array, top_k: usize) -> Result<Array, String> {
    let k = top_k as i32;
    let order = mlx(mlx_rs::ops::argpartition_axis(
        mlx(logprobs.negative())?,
        k - 1,
        -1,
    ))?;
    let dropped = mlx(order.try_index((.., k..)))?;
    mlx(logprobs.put_along_axis(&dropped, weak(f64::NEG_INFINITY, logprobs.dtype())?, -1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(params: SamplingParams) -> (String, &'static str) {
        params.check(512, &FIELD_NAMES).unwrap_err()
    }

    #[test]
    fn checks_name_the_setting_and_say_what_is_expected() {
        assert!(SamplingParams::default().check(512, &FIELD_NAMES).is_ok());
        let top_k = failure(SamplingParams {
            top_k: 512,
            ..Default::default()
        });
        assert_eq!(top_k.1, "top_k");
        assert!(
            top_k.0.contains("below the vocabulary size (512)"),
            "{}",
            top_k.0
        );
        let bias = failure(SamplingParams {
            logit_bias: vec![(3, 1.0), (512, 1.0)],
            ..Default::default()
        });
        assert_eq!(bias.1, "logit_bias");
        assert!(bias.0.contains("token id 512"), "{}", bias.0);
        let context = failure(SamplingParams {
            frequency_penalty: Some(Penalty {
                value: 0.5,
                context: 0,
            }),
            ..Default::default()
        });
        assert_eq!(context.1, "frequency_context_size");
        let flag = SamplingParams {
            min_p: 1.5,
            ..Default::default()
        }
        .check(512, &FLAG_NAMES)
        .unwrap_err();
        assert_eq!(flag.1, "--min-p");
    }

    #[test]
    fn penalties_of_zero_are_left_out_as_mlx_lm_leaves_them_out() {
        let off = SamplingParams {
            repetition_penalty: Some(Penalty {
                value: 0.0,
                context: 20,
            }),
            presence_penalty: Some(Penalty {
                value: 0.0,
                context: 20,
            }),
            ..Default::default()
        };
        assert!(off.is_plain_greedy());
        let on = SamplingParams {
            frequency_penalty: Some(Penalty {
                value: -0.5,
                context: 20,
            }),
            ..Default::default()
        };
        assert!(!on.is_plain_greedy());
        assert_eq!(on.penalties().len(), 1);
    }
}
