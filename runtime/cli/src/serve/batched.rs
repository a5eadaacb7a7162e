//! The model thread's scheduler when the model has a batched forward
//! ([`CausalLm::batched`]): one [`BatchSession`] computes every sequence in
//! flight, so each step is one batched forward of all sequences in decode
//! plus one batched chunk of the prompts in prefill, scheduled exactly as
//! mlx-lm's `BatchGenerator` (one-step-ahead sampling, chunked prefill,
//! extend / filter; runtime/core/src/batch_session.rs). While a prompt is
//! in prefill and other sequences generate, decode-only steps run between
//! the chunks, as long in all as the last chunk's step took, so the
//! generating sequences are not held to one token per chunk
//! ([`BatchedScheduler::next_step`]).
//!
//! The server keeps what is a request's: admission up to `max_batch`,
//! cancellation (the session's `leave`), text streaming with stop strings,
//! log-probabilities, metrics. Greedy requests (temperature 0) take the
//! session's own argmax, so their tokens are `BatchGenerator`'s; the others
//! carry their own seeded [`TokenSampler`] (crate::sampling), its key split
//! once per draw as `archgen generate` splits it, on the session's logprobs
//! row. A request with logits processors, which need the logits the session
//! does not hand out, runs beside the session as a batch of one of its own
//! ([`Solo`]), computed as `generate_step` computes it; so does a request
//! with an output grammar (`response_format`, a required tool call), whose
//! mask is its last processor.
//!
//! The prompt cache (prompt_cache.rs, `--prompt-cache-bytes`) is mlx-lm's
//! server's: a request whose prompt extends a stored one's tokens joins
//! the session with that entry's cache and prefills only the rest. A prompt
//! joins as its segments (segments.rs: a chat's system turns, its user
//! turn, a reasoning tail), each fed in chunks that end at its end; where a
//! segment ends before the prompt's last token its cache is copied out
//! (`extract_cache`) and stored under the tokens fed so far, and a sequence
//! that ends gives its cache back (`extract`) to be stored under its prompt
//! and every token it returned.
//!
//! [`CausalLm::batched`]: archgen_runtime::model::CausalLm::batched

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use archgen_runtime::batch::{BatchCache, BatchLm};
use archgen_runtime::batch_session::{
    BatchConfig, BatchSession, PromptLanes, Sampler, SeqId, StepOutput,
};
use archgen_runtime::mlx_rs::error::Exception;
use archgen_runtime::mlx_rs::ops::indexing::TryIndexOp;
use archgen_runtime::mlx_rs::Array;
use archgen_runtime::seq_cache;
use archgen_runtime::Dtype;
use tokenizers::Tokenizer;

use super::metrics::{Metrics, SchedulerStep};
use super::prompt_cache::{Hit, PromptCache};
use super::scheduler::{
    deliver, describe, fail, finish, most_likely, panic_message, Job, Limits, Outcome, Steps,
    Stream,
};
use super::segments::{store_points, SegmentKind};
use crate::constrained::GrammarState;
use crate::engine::{Finish, Sampling};
use crate::sampling::TokenSampler;
use crate::tokens::{mlx, token_value};

/// `BatchGenerator`'s default number of sequences in prefill at once.
const PREFILL_BATCH: usize = 8;

pub(super) struct BatchedScheduler<'a> {
    model: &'a (dyn BatchLm + 'a),
    config: BatchConfig,
    session: BatchSession<'a, dyn BatchLm + 'a>,
    tokenizer: &'a Tokenizer,
    eos: &'a [i32],
    metrics: &'a Metrics,
    /// Every admitted request, whether waiting in the session, in prefill
    /// or generating.
    active: Vec<(SeqId, Stream<'a>)>,
    /// Requests with logits processors or an output grammar, each run as a
    /// batch of one beside the session ([`Solo`]).
    solo: Vec<Solo<'a>>,
    /// `None` when `--prompt-cache-bytes` is 0.
    prompt_cache: Option<PromptCache>,
    /// What each admitted sequence's cache is stored under, when the
    /// server keeps a prompt cache.
    cache_keys: HashMap<SeqId, CacheKeys>,
    /// How long the last full step (with its prefill chunk) took, and how
    /// long the decode-only steps since then took: see [`Self::next_step`].
    last_full_step: Duration,
    decoded_since_full_step: Duration,
}

/// A sequence's prompt cache keys.
struct CacheKeys {
    /// Its tokens as its cache will hold them: its prompt, then every
    /// token the session returned for it (each was fed back in the step
    /// that returned it).
    tokens: Vec<i32>,
    /// Where it stores its cache while in prefill: the ends of its
    /// segments still to feed, in the order the session reports them
    /// ([`BatchSession::take_ended_segments`]), with their kinds.
    store_points: VecDeque<(usize, SegmentKind)>,
}

/// What the next step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepKind {
    /// One `BatchGenerator.next()`: decode, admission, the prefill chunk.
    Full,
    /// The same without admission and the prefill chunk
    /// ([`BatchSession::step_generation`]).
    DecodeOnly,
}

/// The metrics' name for a batched step.
impl From<StepKind> for SchedulerStep {
    fn from(kind: StepKind) -> Self {
        match kind {
            StepKind::Full => SchedulerStep::Full,
            StepKind::DecodeOnly => SchedulerStep::DecodeOnly,
        }
    }
}

impl Steps for BatchedScheduler<'_> {
    fn in_flight(&self) -> usize {
        self.active.len() + self.solo.len()
    }
    fn admit(&mut self, job: Job) {
        BatchedScheduler::admit(self, job)
    }
    fn step_once(&mut self) {
        self.drop_cancelled();
        if !self.active.is_empty() {
            self.step();
        }
        self.step_solo();
    }
}

/// A request with logits processors or an output grammar. The session
/// hands a sampler the batch's logprobs row, and mlx-lm's processors (and
/// the grammar's mask, the last processor) need the logits, so such a
/// request runs as a batch of one of its own (`make_batch_cache(1)`, no
/// padding: the single-sequence computation): one prefill chunk per step,
/// then one forward per step whose logits go through its [`TokenSampler`],
/// as `generate_step` runs it. It starts from the prompt cache's entry as
/// a batched sequence does, its chunks end at its segments' ends, where
/// their caches are stored, and its cache is stored when it ends.
struct Solo<'a> {
    stream: Stream<'a>,
    cache: BatchCache,
    sampler: TokenSampler,
    /// Prompt tokens in the cache; all but the last are fed by prefill
    /// chunks (the last is the first decode step's input).
    fed: usize,
    /// The token the next decode step feeds.
    input: i32,
    /// Where a prefill chunk must end so the cache of the tokens fed so far
    /// is stored (with the prompt cache on), and as what.
    store_points: VecDeque<(usize, SegmentKind)>,
    /// The tokens handed to the client so far.
    answered: Vec<i32>,
}

impl<'a> BatchedScheduler<'a> {
    pub(super) fn new(
        model: &'a (dyn BatchLm + 'a),
        tokenizer: &'a Tokenizer,
        eos: &'a [i32],
        limits: Limits,
        metrics: &'a Metrics,
    ) -> Self {
        let config = BatchConfig {
            prefill_step_size: limits.prefill_step,
            prefill_batch_size: PREFILL_BATCH.min(limits.max_batch),
            completion_batch_size: limits.max_batch,
            // A short prompt sent while a long one is in prefill gets a
            // prompt batch of its own instead of waiting for (and being
            // padded to) the long prompt's chunks.
            prompt_lanes: PromptLanes::ShortFirst,
            prefill_buffer_pool: limits.prefill_buffer_pool,
            first_steps: limits.first_steps,
            chunk_after_start: limits.chunk_after_start,
            prefill_step_while_generating: limits.prefill_step_while_generating,
        };
        let prompt_cache = match limits.prompt_cache_bytes {
            0 => None,
            bytes => Some(PromptCache::new(bytes, limits.prompt_cache_size)),
        };
        BatchedScheduler {
            model,
            config,
            session: new_session(model, config, prompt_cache.is_some()),
            tokenizer,
            eos,
            metrics,
            active: Vec::new(),
            solo: Vec::new(),
            prompt_cache,
            cache_keys: HashMap::new(),
            last_full_step: Duration::ZERO,
            decoded_since_full_step: Duration::ZERO,
        }
    }

    fn admit(&mut self, job: Job) {
        self.metrics.queue_depth.dec();
        self.metrics
            .queue_wait
            .observe(job.queued_at.elapsed().as_secs_f64());
        if job.cancel.is_cancelled() {
            // The client left while the request waited: nothing to compute.
            return;
        }
        if job.sampling.params.has_processors() || job.constraint.is_some() {
            return self.admit_solo(job);
        }
        let sampler = match seeded_sampler(&job.sampling) {
            Ok(sampler) => sampler,
            Err(message) => return fail(&job, message),
        };
        let (cache, cached_tokens) = match self.fetch_cached(&job.prompt) {
            Some(Hit {
                cache,
                cached_tokens,
            }) => (Some(cache), cached_tokens),
            None => (None, 0),
        };
        let segments = job.segments.after(&job.prompt, cached_tokens);
        let points = store_points(&segments, cached_tokens);
        let segments = segments.into_iter().map(|(tokens, _)| tokens).collect();
        let joined = self
            .session
            .join_segments(segments, cache, job.sampling.max_tokens, sampler);
        match joined {
            Ok(seq) => {
                if self.prompt_cache.is_some() {
                    let keys = CacheKeys {
                        tokens: job.prompt.clone(),
                        store_points: points.into(),
                    };
                    self.cache_keys.insert(seq, keys);
                }
                let mut stream = Stream::new(job, self.tokenizer);
                stream.cached_tokens = cached_tokens;
                self.active.push((seq, stream));
            }
            Err(e) => fail(&job, e.to_string()),
        }
        self.metrics.active_sequences.set(self.active.len() as i64);
    }

    /// Admits a request with logits processors or an output grammar as a
    /// [`Solo`] sequence.
    fn admit_solo(&mut self, mut job: Job) {
        let Some((&last, head)) = job.prompt.split_last() else {
            return fail(&job, "the prompt has no tokens".into());
        };
        let sampler = match TokenSampler::new(&job.sampling.params, job.sampling.seed, head) {
            Ok(sampler) => sampler,
            Err(message) => return fail(&job, message),
        };
        let sampler = match job.constraint.take() {
            Some(constraint) => sampler.constrained(constraint),
            None => sampler,
        };
        let fresh = match self.model.make_batch_cache(1) {
            Ok(cache) => cache,
            Err(e) => return fail(&job, e.to_string()),
        };
        let (cache, cached_tokens) = match self.fetch_cached(&job.prompt) {
            Some(hit) => match seq_cache::merge(&fresh, &[Some(&hit.cache)]) {
                Ok(cache) => (cache, hit.cached_tokens),
                Err(e) => {
                    eprintln!("archgen: serve: prompt cache: {e}; computing the whole prompt");
                    (fresh, 0)
                }
            },
            None => (fresh, 0),
        };
        let store_points = match self.prompt_cache {
            Some(_) => store_points(
                &job.segments.after(&job.prompt, cached_tokens),
                cached_tokens,
            ),
            None => Vec::new(),
        };
        let mut stream = Stream::new(job, self.tokenizer);
        stream.cached_tokens = cached_tokens;
        self.solo.push(Solo {
            stream,
            cache,
            sampler,
            fed: cached_tokens,
            input: last,
            store_points: store_points.into(),
            answered: Vec::new(),
        });
        self.metrics
            .active_sequences
            .set((self.active.len() + self.solo.len()) as i64);
    }

    /// One step of every [`Solo`] sequence: a prefill chunk, or a decode
    /// forward and its token handed to the client.
    fn step_solo(&mut self) {
        let model = self.model;
        let config = self.config;
        let mut at = 0;
        while at < self.solo.len() {
            let seq = &mut self.solo[at];
            let ran = std::panic::catch_unwind(AssertUnwindSafe(|| solo_step(model, seq, config)));
            // A sequence that failed leaves no cache to store.
            let mut computed = true;
            let outcome = match ran {
                Ok(Ok(None)) => {
                    self.store_solo_segment(at);
                    Outcome::Running
                }
                Ok(Ok(Some((token, logprob, grammar)))) => {
                    self.metrics.decode_batch_size.observe(1.0);
                    let logprob = logprob.map(|l| describe(self.tokenizer, token, l));
                    let now = Instant::now();
                    let seq = &mut self.solo[at];
                    seq.answered.push(token);
                    match deliver(&mut seq.stream, token, logprob, now, self.eos, self.metrics) {
                        // The output grammar is complete: nothing more may
                        // follow.
                        Outcome::Running if grammar == GrammarState::Complete => {
                            finish(&mut seq.stream, Finish::Stop)
                        }
                        Outcome::Running => {
                            seq.input = token;
                            Outcome::Running
                        }
                        Outcome::Finished => Outcome::Finished,
                    }
                }
                Ok(Err(message)) => {
                    fail(&self.solo[at].stream.job, message);
                    computed = false;
                    Outcome::Finished
                }
                Err(panic) => {
                    fail(&self.solo[at].stream.job, panic_message(&*panic));
                    computed = false;
                    Outcome::Finished
                }
            };
            match outcome {
                Outcome::Running => at += 1,
                Outcome::Finished => {
                    let seq = self.solo.remove(at);
                    if computed {
                        self.store_solo(seq);
                    }
                }
            }
        }
    }

    /// A [`Solo`] sequence's cache where its last prefill chunk ended a
    /// segment, stored under the tokens fed so far.
    fn store_solo_segment(&mut self, at: usize) {
        let seq = &mut self.solo[at];
        let Some(&(end, kind)) = seq.store_points.front() else {
            return;
        };
        if seq.fed != end {
            return;
        }
        seq.store_points.pop_front();
        let tokens = seq.stream.job.prompt[..end].to_vec();
        match seq_cache::extract(&seq.cache, 0) {
            Ok(cache) => self.insert_cached(tokens, cache, kind),
            Err(e) => not_stored(e),
        }
    }

    /// A finished [`Solo`] sequence's cache, stored under what it holds: the
    /// prompt and every answered token but the last, which was sampled and
    /// never fed.
    fn store_solo(&mut self, seq: Solo<'_>) {
        if self.prompt_cache.is_none() {
            return;
        }
        let fed_answer = seq.answered.len().saturating_sub(1);
        let mut tokens = seq.stream.job.prompt.clone();
        tokens.extend_from_slice(&seq.answered[..fed_answer]);
        match seq_cache::extract(&seq.cache, 0) {
            Ok(cache) => self.insert_cached(tokens, cache, SegmentKind::Assistant),
            Err(e) => not_stored(e),
        }
    }

    /// The prompt cache's entry to start `prompt` from, counted as a hit or
    /// a miss. A failure to copy it is a miss (and said on stderr).
    fn fetch_cached(&mut self, prompt: &[i32]) -> Option<Hit> {
        let pc = self.prompt_cache.as_mut()?;
        let hit = pc.fetch(prompt).unwrap_or_else(|e| {
            eprintln!("archgen: serve: prompt cache: {e}; computing the whole prompt");
            None
        });
        match &hit {
            Some(h) => {
                self.metrics.prompt_cache_hits.inc();
                self.metrics
                    .prompt_cache_tokens
                    .inc_by(h.cached_tokens as u64);
            }
            None => {
                self.metrics.prompt_cache_misses.inc();
            }
        }
        hit
    }

    /// Stores a finished sequence's cache under its tokens.
    fn store(&mut self, seq: SeqId, cache: Option<archgen_runtime::seq_cache::SeqCache>) {
        if let (Some(keys), Some(cache)) = (self.cache_keys.remove(&seq), cache) {
            self.insert_cached(keys.tokens, cache, SegmentKind::Assistant);
        }
    }

    fn insert_cached(
        &mut self,
        tokens: Vec<i32>,
        cache: archgen_runtime::seq_cache::SeqCache,
        kind: SegmentKind,
    ) {
        if let Some(pc) = self.prompt_cache.as_mut() {
            pc.insert(tokens, cache, kind);
            self.metrics.prompt_cache_bytes.set(pc.bytes() as i64);
            self.metrics.prompt_cache_entries.set(pc.len() as i64);
        }
    }

    /// Stores the cache of every sequence whose last prefill chunk ended a
    /// segment before its prompt's last token (mlx-lm's server: the
    /// "system" and "user" entries), under the tokens fed so far. A copy
    /// that fails is said on stderr and not stored: the request goes on.
    fn store_segment_ends(&mut self) {
        for seq in self.session.take_ended_segments() {
            let Some(keys) = self.cache_keys.get_mut(&seq) else {
                continue;
            };
            let Some((end, kind)) = keys.store_points.pop_front() else {
                continue;
            };
            let tokens = keys.tokens[..end].to_vec();
            match self.session.prompt_member_cache(seq) {
                Ok(Some(cache)) => self.insert_cached(tokens, cache, kind),
                Ok(None) => {}
                Err(e) => not_stored(e),
            }
        }
    }

    /// Sequences whose client left leave the batch (and the solo ones).
    fn drop_cancelled(&mut self) {
        let before = self.solo.len();
        self.solo.retain(|s| !s.stream.job.cancel.is_cancelled());
        self.metrics
            .cancelled
            .inc_by((before - self.solo.len()) as u64);
        let mut at = 0;
        while at < self.active.len() {
            let (seq, stream) = &self.active[at];
            if !stream.job.cancel.is_cancelled() {
                at += 1;
                continue;
            }
            let seq = *seq;
            self.active.remove(at);
            self.cache_keys.remove(&seq);
            self.metrics.cancelled.inc();
            if let Err(e) = self.session.leave(seq) {
                return self.fail_all(format!("a cancelled sequence could not leave: {e}"));
            }
        }
    }

    /// Decode-only steps while a prompt is in prefill, until they have
    /// taken as long as the last full step did; then a full step.
    ///
    /// `BatchGenerator.next()` runs one decode forward per prefill chunk, so
    /// while a long prompt is in prefill every generating sequence gets one
    /// token per chunk (tens of seconds per token for 2048-token chunks at
    /// a 12k context on a 2-core CPU). Alternating by time gives the prefill
    /// about half the model thread and the generating sequences the other
    /// half. A newcomer that the session can admit gets a full step at once,
    /// so it joins the prompt batch at the next chunk as in `next()`.
    fn next_step(&self) -> StepKind {
        let session = &self.session;
        if session.prefilling()
            && session.can_decode()
            && !session.can_admit()
            && self.decoded_since_full_step < self.last_full_step
        {
            StepKind::DecodeOnly
        } else {
            StepKind::Full
        }
    }

    /// One step ([`Self::next_step`]), its tokens handed to their clients
    /// before its prefill chunk runs, so they do not wait for it.
    fn step(&mut self) {
        let kind = self.next_step();
        let started = Instant::now();
        let session = &mut self.session;
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| match kind {
            StepKind::Full => session.step_before_chunk(),
            StepKind::DecodeOnly => session.step_generation(),
        }));
        let outputs = match result {
            Ok(Ok(outputs)) => outputs,
            Ok(Err(e)) => return self.fail_all(format!("the generation failed: {e}")),
            Err(panic) => return self.fail_all(panic_message(&*panic)),
        };
        if !self.hand_out(outputs) {
            return;
        }
        if kind == StepKind::Full {
            // A chunk may wait for sequences that start generating while
            // the generating side is within its share of the time (see
            // `next_step`); the deferring step counts as its time.
            let may_defer = self.decoded_since_full_step < self.last_full_step;
            let session = &mut self.session;
            let chunk = || session.step_chunk_deferring_if(may_defer);
            match std::panic::catch_unwind(AssertUnwindSafe(chunk)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return self.fail_all(format!("the generation failed: {e}")),
                Err(panic) => return self.fail_all(panic_message(&*panic)),
            }
            self.store_segment_ends();
        }
        let took = started.elapsed();
        let phases = self.session.last_phases();
        self.metrics.step_took(kind.into(), took.as_secs_f64());
        self.metrics.phases_took(phases);
        match (kind, phases.chunk_deferred) {
            (StepKind::Full, false) => {
                self.last_full_step = took;
                self.decoded_since_full_step = Duration::ZERO;
            }
            // The chunk waited: this step was the generating side's, and
            // decode-only steps follow while that side has time left, so
            // the sequences that just started get their first tokens now.
            (StepKind::Full, true) => self.decoded_since_full_step += took,
            (StepKind::DecodeOnly, _) => self.decoded_since_full_step += took,
        }
    }

    /// Hands a step's tokens to their clients; `false` when a sequence
    /// could not leave the session and every request in flight failed.
    fn hand_out(&mut self, outputs: Vec<StepOutput>) -> bool {
        if !outputs.is_empty() {
            // The generation batch's forward of this step.
            self.metrics.decode_batch_size.observe(outputs.len() as f64);
        }
        let now = Instant::now();
        for out in outputs {
            // A sequence that already ended (a stop string, a failure) has
            // left the session; nothing of it can come back.
            let Some(at) = self.active.iter().position(|(seq, _)| *seq == out.seq) else {
                continue;
            };
            if let Some(keys) = self.cache_keys.get_mut(&out.seq) {
                keys.tokens.push(out.token);
            }
            let stream = &mut self.active[at].1;
            let logprob = stream.job.logprobs.map(|top| {
                logprob_of(&out, top).and_then(|l| describe(self.tokenizer, out.token, l))
            });
            let outcome = match deliver(stream, out.token, logprob, now, self.eos, self.metrics) {
                // The session's budget is the request's max_tokens, and
                // deliver ends the stream there too; this only guards it.
                Outcome::Running if out.finished => finish(stream, Finish::Length),
                outcome => outcome,
            };
            match outcome {
                Outcome::Running => {}
                Outcome::Finished => {
                    self.active.remove(at);
                    let cache = match (out.finished, self.prompt_cache.is_some()) {
                        // It left the session at its budget, with its cache
                        // when the session keeps them.
                        (true, _) => out.cache,
                        (false, true) => match self.session.leave_keeping_cache(out.seq) {
                            Ok(cache) => cache,
                            Err(e) => {
                                self.fail_all(format!("a finished sequence could not leave: {e}"));
                                return false;
                            }
                        },
                        (false, false) => match self.session.leave(out.seq) {
                            Ok(_) => None,
                            Err(e) => {
                                self.fail_all(format!("a finished sequence could not leave: {e}"));
                                return false;
                            }
                        },
                    };
                    self.store(out.seq, cache);
                }
            }
        }
        true
    }

    /// A step is shared: when it fails, every sequence in flight ends with
    /// its message and the server starts over with an empty batch.
    fn fail_all(&mut self, message: String) {
        for (_, stream) in self.active.drain(..) {
            fail(&stream.job, message.clone());
        }
        for solo in self.solo.drain(..) {
            fail(&solo.stream.job, message.clone());
        }
        self.cache_keys.clear();
        self.session = new_session(self.model, self.config, self.prompt_cache.is_some());
    }
}

/// A session that hands back finished sequences' caches when the server
/// keeps a prompt cache.
fn new_session<'a>(
    model: &'a (dyn BatchLm + 'a),
    config: BatchConfig,
    keep_caches: bool,
) -> BatchSession<'a, dyn BatchLm + 'a> {
    let mut session = BatchSession::new(model, config);
    session.keep_finished_caches(keep_caches);
    session
}

/// A cache copy that failed is said on stderr and not stored: the request
/// goes on.
fn not_stored(e: impl std::fmt::Display) {
    eprintln!("archgen: serve: prompt cache: cannot copy a cache ({e}); not stored");
}

/// A [`Solo`] decode step's token, its log-probabilities when asked for,
/// and where its output grammar stands after it.
type SoloToken = (i32, Option<super::scheduler::Logprobs>, GrammarState);

/// One step of a [`Solo`] sequence: a prefill chunk (`None`), or a decode
/// forward of its input, sampled and evaluated: the token and, when asked
/// for, its log-probabilities (after the processors, as `generate_step`
/// yields them).
fn solo_step(
    model: &dyn BatchLm,
    seq: &mut Solo<'_>,
    config: BatchConfig,
) -> Result<Option<SoloToken>, String> {
    let head = seq.stream.job.prompt.len() - 1;
    if seq.fed < head {
        // A chunk ends where a segment's cache is stored.
        let point = seq.store_points.front().map_or(head, |&(p, _)| p);
        let end = (seq.fed + config.prefill_step_size)
            .min(head)
            .min(point.max(seq.fed + 1));
        let chunk = &seq.stream.job.prompt[seq.fed..end];
        let x = Array::from_slice(chunk, &[1, chunk.len() as i32]);
        mlx(mlx(model.forward_batch(&x, &mut seq.cache))?.eval())?;
        // As after every prefill chunk of the one-by-one scheduler.
        mlx(config.prefill_buffer_pool.after_chunk())?;
        seq.fed = end;
        return Ok(None);
    }
    let x = Array::from_slice(&[seq.input], &[1, 1]);
    let logits = mlx(mlx(model.forward_batch(&x, &mut seq.cache))?.try_index((.., -1, ..)))?;
    let step = seq.sampler.step(&logits, &x)?;
    let row = match seq.stream.job.logprobs {
        None => None,
        Some(_) => Some(mlx(
            mlx(step.logprobs.reshape(&[-1]))?.as_dtype(Dtype::Float32)
        )?),
    };
    mlx(archgen_runtime::mlx_rs::transforms::eval(
        std::iter::once(&step.token).chain(row.iter()),
    ))?;
    let token = token_value(&step.token)?;
    let logprobs = match (row, seq.stream.job.logprobs) {
        (Some(row), Some(top)) => Some(most_likely(row.as_slice::<f32>(), token, top)?),
        (None, _) | (_, None) => None,
    };
    let grammar = seq.sampler.accept(token)?;
    Ok(Some((token, logprobs, grammar)))
}

/// A request's sampler (one without logits processors: those run as
/// [`Solo`] sequences): `None` (the session's greedy argmax) at temperature
/// 0; otherwise its [`TokenSampler`] over the session's logprobs row,
/// seeded with the request's seed.
fn seeded_sampler(sampling: &Sampling) -> Result<Option<Sampler>, String> {
    if sampling.params.is_plain_greedy() {
        return Ok(None);
    }
    let mut sampler = TokenSampler::new(&sampling.params, sampling.seed, &[])?;
    Ok(Some(Box::new(move |row: &Array| {
        sampler.sample_logprobs(row).map_err(Exception::custom)
    })))
}

/// The sampled token's log-probability and the `top` most likely, from the
/// step's logprobs row (mlx-lm's `logits - logsumexp(logits)`).
fn logprob_of(out: &StepOutput, top: usize) -> Result<super::scheduler::Logprobs, String> {
    let row = mlx(out.logprobs.as_dtype(Dtype::Float32))?;
    mlx(row.eval())?;
    most_likely(row.as_slice::<f32>(), out.token, top)
}
