//! The model thread's scheduler for a model without a batched forward
//! ([`CausalLm::batched`] is `None`, or its caches cannot be batched): it
//! owns every sequence in flight and moves them forward one step at a time.
//! A model with one is served by [`super::batched`] instead, which drives a
//! `BatchSession` (mlx-lm's `BatchGenerator` schedule); [`Worker::run`]
//! picks, and says which on stderr.
//!
//! Each step, at its boundary, it
//! 1. admits queued requests while fewer than `max_batch` sequences are in
//!    flight (a request whose client already left is dropped unseen),
//! 2. drops sequences whose client disconnected,
//! 3. runs one prefill chunk (at most `prefill_step` prompt tokens) of one
//!    sequence still in prefill, round robin among them, so a long prompt
//!    holds the others back by one chunk per step at most,
//! 4. runs one decode step of every sequence in decode ([`StepAll::step_all`]).
//!
//! The model math of a step is behind [`StepAll`]: today each sequence keeps
//! its own cache and [`OneByOne`] runs one single-sequence forward per
//! sequence, so every request computes exactly what `archgen generate`
//! computes for it alone (prefill in chunks of `prefill_step`, the default
//! 2048 being generate's; the same sampler, processors and key schedule).

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use archgen_runtime::batch_session::{ChunkAfterStart, FirstSteps};
use archgen_runtime::device::{
    release_buffer_pool, PrefillBufferPool, SEQUENCE_TOKENS_PER_POOL_RELEASE,
};
use archgen_runtime::mlx_rs::ops::indexing::TryIndexOp;
use archgen_runtime::mlx_rs::{self, Array};
use archgen_runtime::model::CausalLm;
use archgen_runtime::Dtype;
use tokenizers::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::{Metrics, SchedulerStep};
use super::token_bytes::{token_text, TokenText};
use crate::constrained::{GrammarState, TokenConstraint};
use crate::engine::{Finish, Flow, Sampling, TextStream};
use crate::sampling::TokenSampler;
use crate::tokens::{mlx, token_value};

/// One generated token's log-probability, for a request that asked for
/// them: the token with its bytes, and the most likely tokens at its
/// position (most likely first).
pub struct TokenLogprob {
    pub token: TokenText,
    pub logprob: f32,
    pub top: Vec<(TokenText, f32)>,
}

/// What the scheduler streams back for one request.
pub enum GenEvent {
    /// New text, and the log-probabilities of the tokens that made it (when
    /// asked for; a token whose text is held back, e.g. half a character,
    /// comes with the text that completes it).
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        completion_tokens: usize,
        finish: Finish,
        /// From queueing to the first generated token (None: none came).
        ttft: Option<Duration>,
        /// Prompt tokens taken from the prompt cache, not computed.
        cached_tokens: usize,
    },
    Failed(String),
}

/// Set by the HTTP side when nobody waits for a request's answer any more
/// (the client disconnected); the scheduler drops the sequence at its next
/// step boundary.
#[derive(Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// One queued request, checked and tokenized.
pub struct Job {
    pub prompt: Vec<i32>,
    /// The prompt's segments (segments.rs): where its cache may be stored.
    pub segments: super::segments::Segments,
    pub sampling: Sampling,
    pub stops: Vec<String>,
    /// Log-probabilities wanted, with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// The output grammar (`response_format`, a required tool call).
    pub constraint: Option<TokenConstraint>,
    pub events: UnboundedSender<GenEvent>,
    pub cancel: Cancel,
    pub queued_at: Instant,
}

/// How much the scheduler does per step.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Sequences in flight at once.
    pub max_batch: usize,
    /// Prompt tokens per prefill chunk.
    pub prefill_step: usize,
    /// The prompt cache's bound in bytes (0: no prompt cache).
    pub prompt_cache_bytes: usize,
    /// The prompt cache's bound in sequences.
    pub prompt_cache_size: usize,
    /// What a prefill chunk does with MLX's buffer pool.
    pub prefill_buffer_pool: PrefillBufferPool,
    /// Where a batched sequence's last prompt token runs.
    pub first_steps: FirstSteps,
    /// Whether a step that starts sequences generating runs a prefill chunk.
    pub chunk_after_start: ChunkAfterStart,
    /// Prompt tokens per prefill chunk while others generate, when fewer.
    pub prefill_step_while_generating: Option<usize>,
}

/// One sequence's model state: its cache, the token it feeds next and its
/// sampler (seeded, its processors fed every token, as `archgen generate`'s).
pub struct SeqState<C> {
    pub cache: C,
    pub input: i32,
    pub sampler: TokenSampler,
    /// Whether to return the token's log-probability, and how many of the
    /// most likely alternatives with it.
    pub top_logprobs: Option<usize>,
}

/// A sampled token's log-probability under the model (before temperature,
/// after the logits processors: mlx-lm's `logits - logsumexp(logits)`, in
/// the logits' dtype) and the most
/// likely token ids with theirs, most likely first.
pub struct Logprobs {
    pub logprob: f32,
    pub top: Vec<(i32, f32)>,
}

/// One sequence's decode step result.
pub struct Sampled {
    pub token: i32,
    /// Present when the sequence asked for log-probabilities.
    pub logprobs: Option<Logprobs>,
    /// Where its output grammar stands after the token (always open
    /// without one).
    pub grammar: GrammarState,
}

/// The model math of a scheduler step: the one seam a batched forward
/// replaces.
pub trait StepAll<M: CausalLm> {
    /// Feeds a chunk of prompt tokens into one sequence's cache.
    fn prefill(&mut self, m: &M, seq: &mut SeqState<M::Cache>, chunk: &[i32])
        -> Result<(), String>;
    /// One decode step of every given sequence: a forward of its `input`,
    /// its key split and its next token sampled (with its log-probabilities
    /// when asked). Returns them in the order of `seqs`; each sequence's
    /// `input` is left for the caller.
    fn step_all(
        &mut self,
        m: &M,
        seqs: &mut [&mut SeqState<M::Cache>],
    ) -> Result<Vec<Sampled>, String>;
}

/// Each sequence on its own: one single-sequence forward per sequence, all
/// sampled tokens evaluated together.
#[derive(Default)]
pub struct OneByOne {
    /// Decode steps so far, which time the buffer pool's release as
    /// `generate_step` times it.
    steps: usize,
    /// What a prefill chunk does with the buffer pool.
    prefill_buffer_pool: PrefillBufferPool,
}

impl<M: CausalLm> StepAll<M> for OneByOne {
    fn prefill(
        &mut self,
        m: &M,
        seq: &mut SeqState<M::Cache>,
        chunk: &[i32],
    ) -> Result<(), String> {
        let x = Array::from_slice(chunk, &[1, chunk.len() as i32]);
        mlx(mlx(m.forward(&x, &mut seq.cache))?.eval())?;
        mlx(self.prefill_buffer_pool.after_chunk())
    }

    fn step_all(
        &mut self,
        m: &M,
        seqs: &mut [&mut SeqState<M::Cache>],
    ) -> Result<Vec<Sampled>, String> {
        let mut tokens = Vec::with_capacity(seqs.len());
        let mut logprob_rows = Vec::with_capacity(seqs.len());
        for seq in seqs.iter_mut() {
            let x = Array::from_slice(&[seq.input], &[1, 1]);
            let logits = mlx(mlx(m.forward(&x, &mut seq.cache))?.try_index((.., -1, ..)))?;
            let step = seq.sampler.step(&logits, &x)?;
            tokens.push(step.token);
            logprob_rows.push(match seq.top_logprobs {
                None => None,
                Some(_) => Some(mlx(
                    mlx(step.logprobs.reshape(&[-1]))?.as_dtype(Dtype::Float32)
                )?),
            });
        }
        mlx(mlx_rs::transforms::eval(
            tokens.iter().chain(logprob_rows.iter().flatten()),
        ))?;
        let mut sampled = Vec::with_capacity(seqs.len());
        for ((token, row), seq) in tokens.iter().zip(&logprob_rows).zip(seqs.iter_mut()) {
            let token = token_value(token)?;
            let logprobs = match (row, seq.top_logprobs) {
                (Some(row), Some(top)) => Some(most_likely(row.as_slice::<f32>(), token, top)?),
                (None, _) | (_, None) => None,
            };
            let grammar = seq.sampler.accept(token)?;
            sampled.push(Sampled {
                token,
                logprobs,
                grammar,
            });
        }
        self.steps += 1;
        if self.steps.is_multiple_of(SEQUENCE_TOKENS_PER_POOL_RELEASE) {
            mlx(release_buffer_pool())?;
        }
        Ok(sampled)
    }
}

/// `token`'s log-probability in `row` and the `top` most likely ids among
/// the possible ones (an output grammar's mask gives the tokens it rules
/// out -inf: they are not alternatives, and JSON has no -inf).
pub(super) fn most_likely(row: &[f32], token: i32, top: usize) -> Result<Logprobs, String> {
    let logprob = usize::try_from(token)
        .ok()
        .and_then(|t| row.get(t))
        .copied()
        .ok_or_else(|| format!("token {token} is outside the logits row ({})", row.len()))?;
    let mut ids: Vec<usize> = (0..row.len())
        .filter(|&i| row[i] != f32::NEG_INFINITY)
        .collect();
    let top = top.min(ids.len());
    let by_logprob = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, by_logprob);
    }
    ids.truncate(top);
    ids.sort_by(by_logprob);
    Ok(Logprobs {
        logprob,
        top: ids.into_iter().map(|i| (i as i32, row[i])).collect(),
    })
}

enum Phase {
    /// `fed` prompt tokens are in the cache; all but the last one are fed by
    /// prefill chunks (the last is the first decode step's input).
    Prefill {
        fed: usize,
    },
    Decode,
}

/// A request's side of a sequence, whichever stepping computes it: its
/// text on the way to the client and its counts.
pub(super) struct Stream<'t> {
    pub(super) job: Job,
    text: TextStream<'t>,
    /// Log-probabilities of tokens whose text is not sent yet.
    pending_logprobs: Vec<TokenLogprob>,
    /// Tokens handed to the client (EOS is not one).
    produced: usize,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    /// Prompt tokens its cache started with (a prompt cache hit).
    pub(super) cached_tokens: usize,
}

impl<'t> Stream<'t> {
    pub(super) fn new(mut job: Job, tokenizer: &'t Tokenizer) -> Self {
        let stops = std::mem::take(&mut job.stops);
        Stream {
            job,
            text: TextStream::owning(tokenizer, Cow::Owned(stops)),
            pending_logprobs: Vec::new(),
            produced: 0,
            first_token_at: None,
            last_token_at: None,
            cached_tokens: 0,
        }
    }
}

struct Sequence<'t, C> {
    stream: Stream<'t>,
    state: SeqState<C>,
    phase: Phase,
    /// The step that last ran a prefill chunk of this sequence (round robin).
    last_prefill: u64,
}

/// What became of a sequence after a step.
pub(super) enum Outcome {
    Running,
    Finished,
}

/// The one-by-one scheduler: each sequence keeps its own cache and a decode
/// step is one single-sequence forward per sequence (the path of models
/// without a batched forward).
pub(super) struct Scheduler<'a, M: CausalLm, S> {
    model: &'a M,
    stepper: S,
    tokenizer: &'a Tokenizer,
    eos: &'a [i32],
    limits: Limits,
    metrics: &'a Metrics,
    active: Vec<Sequence<'a, M::Cache>>,
    step: u64,
}

/// The message of a caught panic.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic");
    format!("the generation failed: {what}")
}

impl<'a, M: CausalLm> Scheduler<'a, M, OneByOne> {
    pub(super) fn one_by_one(
        model: &'a M,
        tokenizer: &'a Tokenizer,
        eos: &'a [i32],
        limits: Limits,
        metrics: &'a Metrics,
    ) -> Self {
        Scheduler {
            model,
            stepper: OneByOne {
                steps: 0,
                prefill_buffer_pool: limits.prefill_buffer_pool,
            },
            tokenizer,
            eos,
            limits,
            metrics,
            active: Vec::new(),
            step: 0,
        }
    }
}

/// What the model thread's loop (`worker::serve`) drives: either scheduler.
pub(super) trait Steps {
    /// Requests admitted and not yet answered.
    fn in_flight(&self) -> usize;
    /// Takes a request off the queue (it may be answered at once: a client
    /// that already left, a prompt that cannot run).
    fn admit(&mut self, job: Job);
    /// One step of the requests in flight, those whose client left dropped
    /// first.
    fn step_once(&mut self);
}

impl<M: CausalLm, S: StepAll<M>> Steps for Scheduler<'_, M, S> {
    fn in_flight(&self) -> usize {
        self.active.len()
    }
    fn admit(&mut self, job: Job) {
        Scheduler::admit(self, job)
    }
    fn step_once(&mut self) {
        self.run_step()
    }
}

impl<'a, M: CausalLm, S: StepAll<M>> Scheduler<'a, M, S> {
    fn admit(&mut self, mut job: Job) {
        self.metrics.queue_depth.dec();
        self.metrics
            .queue_wait
            .observe(job.queued_at.elapsed().as_secs_f64());
        if job.cancel.is_cancelled() {
            // The client left while the request waited: nothing to compute.
            return;
        }
        let Some(&last) = job.prompt.last() else {
            let _ = job
                .events
                .send(GenEvent::Failed("the prompt has no tokens".into()));
            return;
        };
        let head = &job.prompt[..job.prompt.len() - 1];
        let sampler = match TokenSampler::new(&job.sampling.params, job.sampling.seed, head) {
            Ok(sampler) => sampler,
            Err(message) => {
                let _ = job.events.send(GenEvent::Failed(message));
                return;
            }
        };
        let sampler = match job.constraint.take() {
            Some(constraint) => sampler.constrained(constraint),
            None => sampler,
        };
        let state = SeqState {
            cache: self.model.make_cache(),
            input: last,
            sampler,
            top_logprobs: job.logprobs,
        };
        let phase = match job.prompt.len() {
            1 => Phase::Decode,
            _ => Phase::Prefill { fed: 0 },
        };
        self.active.push(Sequence {
            stream: Stream::new(job, self.tokenizer),
            state,
            phase,
            last_prefill: 0,
        });
        self.metrics.active_sequences.set(self.active.len() as i64);
    }

    fn run_step(&mut self) {
        self.step += 1;
        let before = self.active.len();
        self.active.retain(|s| !s.stream.job.cancel.is_cancelled());
        self.metrics
            .cancelled
            .inc_by((before - self.active.len()) as u64);
        self.prefill_one_chunk();
        self.decode_all();
    }

    /// One chunk of the sequence in prefill that waited longest for one.
    fn prefill_one_chunk(&mut self) {
        let Some(at) = (0..self.active.len())
            .filter(|&i| matches!(self.active[i].phase, Phase::Prefill { .. }))
            .min_by_key(|&i| self.active[i].last_prefill)
        else {
            return;
        };
        let step = self.step;
        let prefill_step = self.limits.prefill_step;
        let seq = &mut self.active[at];
        let Phase::Prefill { fed } = seq.phase else {
            return;
        };
        let head = seq.stream.job.prompt.len() - 1;
        let end = (fed + prefill_step).min(head);
        let chunk = &seq.stream.job.prompt[fed..end];
        let model = self.model;
        let stepper = &mut self.stepper;
        let state = &mut seq.state;
        let started = Instant::now();
        let ran =
            std::panic::catch_unwind(AssertUnwindSafe(|| stepper.prefill(model, state, chunk)));
        self.metrics
            .step_took(SchedulerStep::PrefillChunk, started.elapsed().as_secs_f64());
        let failure = match ran {
            Ok(Ok(())) => None,
            Ok(Err(message)) => Some(message),
            Err(panic) => Some(panic_message(&*panic)),
        };
        seq.last_prefill = step;
        match failure {
            None => {
                seq.phase = match end == head {
                    true => Phase::Decode,
                    false => Phase::Prefill { fed: end },
                };
            }
            Some(message) => {
                let seq = self.active.remove(at);
                fail(&seq.stream.job, message);
            }
        }
    }

    /// One decode step of every sequence in decode.
    fn decode_all(&mut self) {
        let decoding: Vec<usize> = (0..self.active.len())
            .filter(|&i| matches!(self.active[i].phase, Phase::Decode))
            .collect();
        if decoding.is_empty() {
            return;
        }
        // One single-sequence forward per sequence.
        for _ in &decoding {
            self.metrics.decode_batch_size.observe(1.0);
        }
        let model = self.model;
        let stepper = &mut self.stepper;
        let mut states: Vec<&mut SeqState<M::Cache>> = self
            .active
            .iter_mut()
            .filter(|s| matches!(s.phase, Phase::Decode))
            .map(|s| &mut s.state)
            .collect();
        let started = Instant::now();
        let ran =
            std::panic::catch_unwind(AssertUnwindSafe(|| stepper.step_all(model, &mut states)));
        self.metrics
            .step_took(SchedulerStep::Decode, started.elapsed().as_secs_f64());
        let stepped = match ran {
            Ok(stepped) => stepped,
            Err(panic) => Err(panic_message(&*panic)),
        };
        let tokens = match stepped {
            Ok(tokens) => tokens,
            Err(message) => {
                // The step is shared: every sequence in it ends.
                for &i in decoding.iter().rev() {
                    let seq = self.active.remove(i);
                    fail(&seq.stream.job, message.clone());
                }
                return;
            }
        };
        let now = Instant::now();
        let mut finished = Vec::new();
        for (&i, sampled) in decoding.iter().zip(tokens) {
            let token = sampled.token;
            let logprob = sampled
                .logprobs
                .map(|l| describe(self.tokenizer, sampled.token, l));
            let stream = &mut self.active[i].stream;
            let outcome = match deliver(stream, token, logprob, now, self.eos, self.metrics) {
                // The output grammar is complete: nothing more may follow.
                Outcome::Running if sampled.grammar == GrammarState::Complete => {
                    finish(stream, Finish::Stop)
                }
                outcome => outcome,
            };
            match outcome {
                Outcome::Running => self.active[i].state.input = token,
                Outcome::Finished => finished.push(i),
            }
        }
        for &i in finished.iter().rev() {
            self.active.remove(i);
        }
    }
}

/// Hands a sampled token (with its log-probabilities, when asked for) to its
/// client.
pub(super) fn deliver(
    seq: &mut Stream<'_>,
    token: i32,
    logprob: Option<Result<TokenLogprob, String>>,
    now: Instant,
    eos: &[i32],
    metrics: &Metrics,
) -> Outcome {
    let logprob = match logprob {
        None => None,
        Some(Ok(described)) => Some(described),
        Some(Err(message)) => {
            fail(&seq.job, message);
            return Outcome::Finished;
        }
    };
    match (seq.first_token_at, seq.last_token_at) {
        (None, _) => {
            seq.first_token_at = Some(now);
            metrics
                .time_to_first_token
                .observe((now - seq.job.queued_at).as_secs_f64());
        }
        (Some(_), Some(last)) => metrics
            .inter_token_latency
            .observe((now - last).as_secs_f64()),
        (Some(_), None) => {}
    }
    seq.last_token_at = Some(now);
    if eos.contains(&token) {
        return finish(seq, Finish::Stop);
    }
    seq.produced += 1;
    metrics.generated_tokens.inc();
    seq.pending_logprobs.extend(logprob);
    let (text, flow) = match seq.text.push(token) {
        Ok(pushed) => pushed,
        Err(message) => {
            fail(&seq.job, message);
            return Outcome::Finished;
        }
    };
    let logprobs = match text.is_empty() {
        // Held back (half a character, or maybe a stop string): its
        // log-probabilities wait for the text.
        true => Vec::new(),
        false => std::mem::take(&mut seq.pending_logprobs),
    };
    if !text.is_empty()
        && seq
            .job
            .events
            .send(GenEvent::Text { text, logprobs })
            .is_err()
    {
        // Nobody listens any more.
        seq.job.cancel.cancel();
        metrics.cancelled.inc();
        return Outcome::Finished;
    }
    match flow {
        Flow::Stop => finish(seq, Finish::Stop),
        Flow::Continue if seq.produced >= seq.job.sampling.max_tokens => {
            finish(seq, Finish::Length)
        }
        Flow::Continue => Outcome::Running,
    }
}

/// A token's log-probabilities with each token's bytes (two tokens that
/// are parts of characters both decode to U+FFFD; their bytes differ).
pub(super) fn describe(
    tokenizer: &Tokenizer,
    token: i32,
    logprobs: Logprobs,
) -> Result<TokenLogprob, String> {
    let text = |id: i32| token_text(tokenizer, id);
    Ok(TokenLogprob {
        token: text(token)?,
        logprob: logprobs.logprob,
        top: logprobs
            .top
            .into_iter()
            .map(|(id, lp)| Ok((text(id)?, lp)))
            .collect::<Result<_, String>>()?,
    })
}

pub(super) fn finish(seq: &mut Stream<'_>, finish: Finish) -> Outcome {
    match seq.text.finish() {
        Ok(tail) if !tail.is_empty() || !seq.pending_logprobs.is_empty() => {
            let _ = seq.job.events.send(GenEvent::Text {
                text: tail,
                logprobs: std::mem::take(&mut seq.pending_logprobs),
            });
        }
        Ok(_) => {}
        Err(message) => {
            fail(&seq.job, message);
            return Outcome::Finished;
        }
    }
    let _ = seq.job.events.send(GenEvent::Done {
        completion_tokens: seq.produced,
        finish,
        ttft: seq.first_token_at.map(|t| t - seq.job.queued_at),
        cached_tokens: seq.cached_tokens,
    });
    Outcome::Finished
}

pub(super) fn fail(job: &Job, message: String) {
    eprintln!("archgen: serve: {message}");
    let _ = job.events.send(GenEvent::Failed(message));
}

#[cfg(test)]
mod tests {
    use super::most_likely;

    #[test]
    fn most_likely_gives_the_token_and_the_top_ids_in_order() {
        let row = [-3.0, -0.5, -2.0, -0.5, -9.0];
        let got = most_likely(&row, 2, 3).unwrap();
        assert_eq!(got.logprob, -2.0);
        // Ties go to the smaller id, as a stable sort would give.
        assert_eq!(got.top, vec![(1, -0.5), (3, -0.5), (2, -2.0)]);
        assert!(most_likely(&row, 4, 0).unwrap().top.is_empty());
        assert_eq!(most_likely(&row, 0, 9).unwrap().top.len(), 5);
        let outside = most_likely(&row, 5, 1).err().unwrap();
        assert!(outside.contains("outside the logits row (5)"), "{outside}");
        // Tokens a grammar ruled out (-inf) are no alternatives.
        let masked = [f32::NEG_INFINITY, -0.1, f32::NEG_INFINITY, -2.5];
        let got = most_likely(&masked, 1, 3).unwrap();
        assert_eq!(got.top, vec![(1, -0.1), (3, -2.5)]);
    }
}
