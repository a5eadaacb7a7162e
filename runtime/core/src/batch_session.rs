//! Continuous batching as mlx-lm 0.32.2's `BatchGenerator` schedules it
//! (`mlx_lm/generate.py`): the same model calls, on the same batches, in the
//! same order, so each sequence's logprobs are mlx-lm's to the byte
//! (docs/parity.md, "Batches").
//!
//! [`BatchSession`] is the API a server drives: [`BatchSession::join`] a
//! prompt, call [`BatchSession::step`] until its sequences are done,
//! [`BatchSession::leave`] to cancel one. [`run_schedule`] replays a fixed
//! schedule of arrivals ([`Schedule`]), what `archgen logits --batch` and
//! tests/batch_parity.rs run against tests/python/batch_oracle.py.
//!
//! One step is one `BatchGenerator.next()`:
//! 1. the generation batch (sequences past their prompt) runs one forward
//!    on the tokens sampled last step; each member returns the token and
//!    logprobs computed by the *previous* forward (mlx-lm samples one step
//!    ahead), and members that reached their token budget leave after that
//!    forward (`filter`);
//! 2. waiting sequences join the prompt batch, up to `prefill_batch_size`
//!    prompt members and `completion_batch_size` members in all;
//! 3. prompt members with only their last prompt token left move to the
//!    generation batch: their first forward runs on that token in a batch of
//!    their own, then their caches join the generation batch's (`extend`).
//!    With [`FirstSteps::InGenerationBatch`] (a serving lever, not
//!    `BatchGenerator`'s schedule) they join before the next step's
//!    generation forward instead, which runs that token beside the other
//!    members' sampled tokens: one forward fewer;
//! 4. every other prompt member feeds its next chunk of at most
//!    `prefill_step_size` tokens, right-padded to the longest chunk, as one
//!    forward (`prepare`, forward, `finalize`).
//!
//! Steps pipeline as mlx-lm's do (`_step` ends in `mx.async_eval`, `next`
//! reads the previous step's tokens after queueing the new forward): a
//! generation forward is built on the previous step's tokens as lazy
//! arrays and queued with `async_eval`, and only then are that previous
//! step's tokens read back, so building step n + 1's graph overlaps
//! evaluating step n. Which forwards run on which rows is unchanged.
//!
//! A server may ask for [`PromptLanes::ShortFirst`] instead of mlx-lm's one
//! prompt batch ([`PromptLanes::One`], the default and what [`run_schedule`]
//! replays): a prompt that arrives while a long one is in prefill then does
//! not join its batch (where it would be padded to the long prompt's chunk
//! and wait for its chunks) but forms a prompt batch of its own, and each
//! step feeds the batch with the fewest tokens left. Every forward is still
//! one that `BatchGenerator` runs, on the members it would hold had the
//! prompts arrived apart; what moves is which prompts share a batch.
//!
//! It may also ask for [`ChunkAfterStart::NextStep`]: a step in which
//! sequences start generating feeds no prompt chunk, so their first tokens
//! come back at the next step instead of after another prompt's chunk
//! (seconds for a long prompt on a CPU). The chunk is the same forward on
//! the same members one step later, and the generation batch runs the same
//! forwards it runs when that prompt arrives a step later. A server runs
//! a step in two calls ([`BatchSession::step_before_chunk`], then
//! [`BatchSession::step_chunk`]) and hands the tokens out in between.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use crate::batch::{BatchCache, BatchLm};
use crate::device::{release_buffer_pool, PrefillBufferPool, BATCH_STEPS_PER_POOL_RELEASE};
use crate::ops::Result;
use crate::seq_cache::{self, SeqCache};

fn error(what: String) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what)
}

/// A sequence's handle in a [`BatchSession`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// How prompts in prefill are batched (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PromptLanes {
    /// One prompt batch, as `BatchGenerator`: every admitted prompt joins
    /// it, and each step feeds all its members a chunk.
    #[default]
    One,
    /// A prompt batch still more than one chunk from its end takes no new
    /// members; they form the next batch. Each step feeds one chunk to the
    /// batch with the fewest tokens left, so a short prompt is not held
    /// behind (or padded to) a long one.
    ShortFirst,
}

/// Where a sequence whose prompt is done runs its last prompt token (see
/// the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FirstSteps {
    /// `BatchGenerator`'s: a forward of the sequences that start generating
    /// together, in a batch of their own, before their caches join the
    /// generation batch.
    #[default]
    OwnForward,
    /// Their caches join the generation batch at the start of the next
    /// step, and its forward runs their last prompt tokens beside the other
    /// members' sampled tokens: one forward fewer each time prompts finish,
    /// and a first token computed in other rows' company than mlx-lm's (its
    /// bits may differ). A prompt that finishes its prefill in one step
    /// still returns its first token at the step after, as with
    /// [`FirstSteps::OwnForward`]; one of a single token (or one cached up to
    /// its last token) returns it a step later.
    InGenerationBatch,
}

/// Whether a step's prefill chunk runs when sequences started generating
/// in that step (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChunkAfterStart {
    /// `BatchGenerator`'s: every step feeds a prompt batch its next chunk.
    #[default]
    SameStep,
    /// A step in which sequences started generating feeds no chunk to a
    /// prompt batch with more than one chunk left, so the next step returns
    /// their first tokens without waiting for a long prompt's chunk (seconds
    /// on a CPU); a batch on its last chunk, about to start, is fed.
    /// [`BatchSession::step`] never defers in two steps in a row, so a
    /// stream of arrivals cannot starve a prompt in prefill; a server bounds
    /// it by time instead ([`BatchSession::step_chunk_deferring_if`]). The
    /// chunk is the same forward on the same members, a step later; the
    /// generation batch's forwards are those of the same members, as when a
    /// prompt arrives later.
    NextStep,
}

/// `BatchGenerator`'s sizes, with its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// The most prompt tokens a sequence feeds in one step (mlx-lm: 2048).
    pub prefill_step_size: usize,
    /// The most sequences in prefill at once (mlx-lm: 8).
    pub prefill_batch_size: usize,
    /// The most sequences in the generation batch (mlx-lm: 32; raised to
    /// `prefill_batch_size` if smaller, as mlx-lm does).
    pub completion_batch_size: usize,
    /// How prompts in prefill are batched (mlx-lm: one batch).
    pub prompt_lanes: PromptLanes,
    /// What a prefill chunk does with MLX's buffer pool (mlx-lm: releases it).
    pub prefill_buffer_pool: PrefillBufferPool,
    /// Where the last prompt token runs (mlx-lm: a forward of its own).
    pub first_steps: FirstSteps,
    /// Whether a step that starts sequences generating feeds a prompt
    /// chunk too (mlx-lm: it does).
    pub chunk_after_start: ChunkAfterStart,
    /// The most prompt tokens a sequence feeds in one step while others
    /// generate or wait, when fewer than `prefill_step_size` (mlx-lm: no
    /// such bound). A long prompt's chunk is one forward that holds every
    /// other sequence; a smaller one holds them for less time.
    pub prefill_step_while_generating: Option<usize>,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            prefill_step_size: 2048,
            prefill_batch_size: 8,
            completion_batch_size: 32,
            prompt_lanes: PromptLanes::One,
            prefill_buffer_pool: PrefillBufferPool::Released,
            first_steps: FirstSteps::OwnForward,
            chunk_after_start: ChunkAfterStart::SameStep,
            prefill_step_while_generating: None,
        }
    }
}

/// Where one step's wall time went, by the parts of `next()` that ran
/// (`None`: not run). Host time: MLX is lazy, so a part that reads a
/// result also waits for the work queued before it (the generation part
/// waits for the previous step's tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepPhases {
    /// The generation batch's forward, its tokens sampled and read.
    pub generation: Option<Duration>,
    /// Waiting sequences joining the prompt batch, their caches merged.
    pub admission: Option<Duration>,
    /// Prompt members down to their last token moving to the generation
    /// batch (its caches extended).
    pub joining: Option<Duration>,
    /// The prompt batch's prefill chunk.
    pub prefill: Option<Duration>,
    /// Sequences that started generating in the step.
    pub started: usize,
    /// A prompt batch was in prefill and its chunk waited for the next step
    /// ([`ChunkAfterStart::NextStep`]).
    pub chunk_deferred: bool,
}

/// Runs `part` and returns its result with the time it took.
fn timed<T>(part: impl FnOnce() -> Result<T>) -> Result<(T, Duration)> {
    let started = Instant::now();
    let out = part()?;
    Ok((out, started.elapsed()))
}

/// Picks a sequence's next token from its logprobs row [vocab] (compute
/// dtype), lazily: an unevaluated integer array of one element, evaluated
/// together with the batch's other tokens. A sequence joined without one
/// takes the greedy token, as `BatchGenerator`'s default sampler.
pub type Sampler = Box<dyn FnMut(&Array) -> Result<Array>>;

/// What one sequence got from one step.
#[derive(Debug, Clone)]
pub struct StepOutput {
    pub seq: SeqId,
    /// The sampled token (greedy, `argmax` of `logprobs`, unless the
    /// sequence joined with a [`Sampler`]), the one fed back.
    pub token: i32,
    /// `logits - logsumexp(logits)` [vocab], the compute dtype.
    pub logprobs: Array,
    /// The sequence reached its token budget and has left the batch.
    pub finished: bool,
    /// A finished sequence's cache (its prompt and every token returned,
    /// the last one included), when the session keeps them
    /// ([`BatchSession::keep_finished_caches`]).
    pub cache: Option<SeqCache>,
}

struct Waiting {
    seq: SeqId,
    /// The prompt without its last token, then the last token alone
    /// (`insert_segments`); an empty first segment is dropped.
    segments: VecDeque<Vec<i32>>,
    max_tokens: usize,
    /// The cache it starts from (`insert(..., caches=[cache])`): the
    /// prompt's first tokens, already computed; `None`: a fresh one.
    cache: Option<SeqCache>,
}

/// `PromptProcessingBatch` with its `_currently_processing` entries.
#[derive(Default)]
struct PromptBatch {
    seqs: Vec<SeqId>,
    segments: Vec<VecDeque<Vec<i32>>>,
    max_tokens: Vec<usize>,
    cache: Option<BatchCache>,
}

impl PromptBatch {
    /// The most prompt tokens a member has left to feed.
    fn tokens_left(&self) -> usize {
        self.segments
            .iter()
            .map(|s| s.iter().map(Vec::len).sum::<usize>())
            .max()
            .unwrap_or(0)
    }

    fn filter(&mut self, keep: &[usize]) -> Result<()> {
        self.seqs = keep.iter().map(|&i| self.seqs[i]).collect();
        self.segments = keep.iter().map(|&i| self.segments[i].clone()).collect();
        self.max_tokens = keep.iter().map(|&i| self.max_tokens[i]).collect();
        filter_cache(&mut self.cache, keep)
    }
}

/// `GenerationBatch`: `next` holds what the last forward produced for each
/// member (its logprobs row and the token sampled from it), queued for
/// evaluation and not yet read back.
#[derive(Default)]
struct GenerationBatch {
    seqs: Vec<SeqId>,
    /// int32 [members] (`None` without members): what the next forward
    /// feeds each member.
    next_tokens: Option<Array>,
    /// The logprobs row each member's next token was sampled from; `None`
    /// where that token is the member's last prompt token
    /// ([`FirstSteps::InGenerationBatch`]), which returns nothing.
    next_logprobs: Vec<Option<Array>>,
    num_tokens: Vec<usize>,
    max_tokens: Vec<usize>,
    cache: Option<BatchCache>,
}

impl GenerationBatch {
    fn filter(&mut self, keep: &[usize]) -> Result<()> {
        self.seqs = keep.iter().map(|&i| self.seqs[i]).collect();
        self.next_tokens = match (&self.next_tokens, keep.is_empty()) {
            (Some(t), false) => Some(t.take_axis(index_vector(keep), 0)?),
            (Some(_), true) | (None, _) => None,
        };
        self.next_logprobs = keep
            .iter()
            .map(|&i| self.next_logprobs[i].clone())
            .collect();
        self.num_tokens = keep.iter().map(|&i| self.num_tokens[i]).collect();
        self.max_tokens = keep.iter().map(|&i| self.max_tokens[i]).collect();
        filter_cache(&mut self.cache, keep)
    }

    /// `GenerationBatch.extend`.
    fn extend(&mut self, other: GenerationBatch) -> Result<()> {
        self.seqs.extend(other.seqs);
        self.next_tokens = match (self.next_tokens.take(), other.next_tokens) {
            (Some(a), Some(b)) => Some(mlx_rs::ops::concatenate(&[a, b], 0)?),
            (a, b) => a.or(b),
        };
        self.next_logprobs.extend(other.next_logprobs);
        self.num_tokens.extend(other.num_tokens);
        self.max_tokens.extend(other.max_tokens);
        extend_cache(&mut self.cache, other.cache)
    }
}

/// Row indices as an int32 vector (to `take` rows of a lazy array).
fn index_vector(rows: &[usize]) -> Array {
    let rows: Vec<i32> = rows.iter().map(|&i| i as i32).collect();
    Array::from_slice(&rows, &[rows.len() as i32])
}

/// A prompt member whose only segment left is its last token: it starts
/// generating at the next split instead of feeding a chunk.
fn down_to_last_token(segments: &VecDeque<Vec<i32>>) -> bool {
    segments.len() == 1 && segments[0].len() == 1
}

/// `filter(keep)`, or `prompt_cache.clear()` when nothing is kept.
fn filter_cache(cache: &mut Option<BatchCache>, keep: &[usize]) -> Result<()> {
    if keep.is_empty() {
        *cache = None;
    } else if let Some(c) = cache {
        c.filter(keep)?;
    }
    Ok(())
}

/// `_extend_cache`: either side may be empty.
fn extend_cache(cache: &mut Option<BatchCache>, other: Option<BatchCache>) -> Result<()> {
    match (cache.as_mut(), other) {
        (_, None) => Ok(()),
        (None, Some(o)) => {
            *cache = Some(o);
            Ok(())
        }
        (Some(c), Some(o)) => c.extend(o),
    }
}

/// Continuous batching over one model, step by step as `BatchGenerator`.
///
/// ```no_run
/// # use archgen_runtime::batch::BatchLm;
/// # use archgen_runtime::batch_session::{BatchConfig, BatchSession};
/// # fn demo<M: BatchLm>(model: &M) -> archgen_runtime::ops::Result<()> {
/// let mut session = BatchSession::new(model, BatchConfig::default());
/// let a = session.join(&[1, 2, 3], 8)?;
/// let b = session.join(&[4, 5], 8)?;
/// while !session.is_idle() {
///     for out in session.step()? {
///         // out.seq is a or b; out.token, out.logprobs; out.finished
///     }
/// }
/// # let _ = (a, b); Ok(()) }
/// ```
pub struct BatchSession<'m, M: BatchLm + ?Sized> {
    model: &'m M,
    /// The samplers of sequences that joined with one.
    samplers: HashMap<SeqId, Sampler>,
    config: BatchConfig,
    next_seq: u64,
    waiting: VecDeque<Waiting>,
    /// The prompt batches in prefill: at most one with [`PromptLanes::One`];
    /// none is empty.
    prompts: Vec<PromptBatch>,
    generation: GenerationBatch,
    /// Whether a finished sequence's cache comes back with its last
    /// [`StepOutput`] (mlx-lm's `Response.prompt_cache`).
    keep_caches: bool,
    /// Generation-batch forwards so far (`_counters.generation_steps`),
    /// which time the buffer pool's release.
    generation_steps: usize,
    /// Where the last step's time went.
    last_phases: StepPhases,
    /// The last step deferred its prefill chunk ([`ChunkAfterStart::NextStep`]).
    deferred_chunk: bool,
    /// [`Self::step_before_chunk`] ran and [`Self::step_chunk`] has not.
    chunk_due: bool,
    /// The prompt members whose chunk in the last prefill forward ended one
    /// of their segments (`Response.end_of_segment`), in batch order.
    ended_segments: Vec<SeqId>,
}

impl<'m, M: BatchLm + ?Sized> BatchSession<'m, M> {
    pub fn new(model: &'m M, config: BatchConfig) -> Self {
        let config = BatchConfig {
            completion_batch_size: config.completion_batch_size.max(config.prefill_batch_size),
            ..config
        };
        BatchSession {
            model,
            samplers: HashMap::new(),
            config,
            next_seq: 0,
            waiting: VecDeque::new(),
            prompts: Vec::new(),
            generation: GenerationBatch::default(),
            keep_caches: false,
            generation_steps: 0,
            last_phases: StepPhases::default(),
            deferred_chunk: false,
            chunk_due: false,
            ended_segments: Vec::new(),
        }
    }

    /// Whether a sequence that reaches its budget returns its cache
    /// ([`StepOutput::cache`], `extract` before the batch `filter`s it out),
    /// for a prompt cache to store. Off by default: extracting copies.
    pub fn keep_finished_caches(&mut self, keep: bool) {
        self.keep_caches = keep;
    }

    /// Queues a prompt (`insert`): it joins the batch at a later step, is
    /// prefilled in chunks of `prefill_step_size` tokens, then returns
    /// `max_tokens` tokens, one per step, and leaves.
    pub fn join(&mut self, prompt: &[i32], max_tokens: usize) -> Result<SeqId> {
        self.join_sampled(prompt, max_tokens, None)
    }

    /// [`Self::join`] with the sequence's own sampler (`None`: greedy).
    pub fn join_sampled(
        &mut self,
        prompt: &[i32],
        max_tokens: usize,
        sampler: Option<Sampler>,
    ) -> Result<SeqId> {
        self.join_from(prompt, None, max_tokens, sampler)
    }

    /// A prompt given as segments (`insert_segments`): each is fed in
    /// chunks that end at its end, so a caller can take the cache there
    /// ([`Self::take_ended_segments`], [`Self::prompt_member_cache`]), as
    /// mlx-lm's server stores a chat's system prompt. Empty segments are
    /// dropped and the last token is a segment of its own; `cache`, when
    /// given, holds the tokens before the first segment.
    pub fn join_segments(
        &mut self,
        segments: Vec<Vec<i32>>,
        cache: Option<SeqCache>,
        max_tokens: usize,
        sampler: Option<Sampler>,
    ) -> Result<SeqId> {
        let seq = SeqId(self.next_seq);
        let mut segments: VecDeque<Vec<i32>> =
            segments.into_iter().filter(|s| !s.is_empty()).collect();
        let Some(last) = segments.back_mut() else {
            return Err(error(format!("sequence {}: the prompt is empty", seq.0)));
        };
        if max_tokens == 0 {
            return Err(error(format!(
                "sequence {}: max_tokens must be at least 1",
                seq.0
            )));
        }
        if last.len() != 1 {
            let token = last.pop().expect("a kept segment is not empty");
            segments.push_back(vec![token]);
        }
        self.waiting.push_back(Waiting {
            seq,
            segments,
            max_tokens,
            cache,
        });
        if let Some(sampler) = sampler {
            self.samplers.insert(seq, sampler);
        }
        self.next_seq += 1;
        Ok(seq)
    }

    /// The prompt members whose last prefill chunk ended one of their
    /// segments, taken (the next chunk starts a new list).
    pub fn take_ended_segments(&mut self) -> Vec<SeqId> {
        std::mem::take(&mut self.ended_segments)
    }

    /// A copy of a prompt member's cache as it stands (`extract_cache` of
    /// a sequence in prefill): the tokens fed so far. `Ok(None)` when the
    /// sequence is not in prefill.
    pub fn prompt_member_cache(&self, seq: SeqId) -> Result<Option<SeqCache>> {
        for prompt in &self.prompts {
            if let Some(i) = prompt.seqs.iter().position(|s| *s == seq) {
                let cache = prompt
                    .cache
                    .as_ref()
                    .ok_or_else(|| error("the prompt batch has no cache".into()))?;
                return seq_cache::extract(cache, i).map(Some);
            }
        }
        Ok(None)
    }

    /// [`Self::join_sampled`] from a cache that already holds the prompt's
    /// first tokens (a prompt cache's hit): only `rest`, the tokens after
    /// them, is prefilled (`insert(..., caches=[cache])`). The cache joins
    /// the prompt batch as mlx-lm merges it (`_merge_caches`).
    pub fn join_cached(
        &mut self,
        rest: &[i32],
        cache: SeqCache,
        max_tokens: usize,
        sampler: Option<Sampler>,
    ) -> Result<SeqId> {
        self.join_from(rest, Some(cache), max_tokens, sampler)
    }

    /// One segment: the prompt without its last token, then that token.
    fn join_from(
        &mut self,
        prompt: &[i32],
        cache: Option<SeqCache>,
        max_tokens: usize,
        sampler: Option<Sampler>,
    ) -> Result<SeqId> {
        self.join_segments(vec![prompt.to_vec()], cache, max_tokens, sampler)
    }

    /// Cancels a sequence wherever it is (`remove`): waiting, in prefill or
    /// generating. Returns whether it was there.
    pub fn leave(&mut self, seq: SeqId) -> Result<bool> {
        self.samplers.remove(&seq);
        if let Some(i) = self.waiting.iter().position(|w| w.seq == seq) {
            self.waiting.remove(i);
            return Ok(true);
        }
        for b in 0..self.prompts.len() {
            let prompt = &mut self.prompts[b];
            if let Some(i) = prompt.seqs.iter().position(|s| *s == seq) {
                let keep: Vec<usize> = (0..prompt.seqs.len()).filter(|&j| j != i).collect();
                prompt.filter(&keep)?;
                self.prompts.retain(|p| !p.seqs.is_empty());
                return Ok(true);
            }
        }
        if let Some(i) = self.generation.seqs.iter().position(|s| *s == seq) {
            let keep: Vec<usize> = (0..self.generation.seqs.len())
                .filter(|&j| j != i)
                .collect();
            self.generation.filter(&keep)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// [`Self::leave`] that also returns the sequence's cache when it was
    /// generating (`remove(uids, return_prompt_caches=True)`): its prompt
    /// and every token [`Self::step`] returned for it. `Ok(None)` when it
    /// was not generating (waiting, in prefill, or gone).
    pub fn leave_keeping_cache(&mut self, seq: SeqId) -> Result<Option<SeqCache>> {
        let generating = self.generation.seqs.iter().position(|s| *s == seq);
        // A member whose last prompt token is not yet fed
        // ([`FirstSteps::InGenerationBatch`]) has returned nothing and its
        // cache lacks that token: it leaves as one in prefill does.
        let Some(i) = generating.filter(|&i| self.generation.next_logprobs[i].is_some()) else {
            self.leave(seq)?;
            return Ok(None);
        };
        let cache = match &self.generation.cache {
            Some(c) => seq_cache::extract(c, i)?,
            None => return Err(error("the generation batch has no cache".into())),
        };
        self.leave(seq)?;
        Ok(Some(cache))
    }

    /// No sequence is waiting, in prefill or generating.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.prompts.is_empty() && self.generation.seqs.is_empty()
    }

    /// Sequences in the generation batch.
    pub fn generating(&self) -> usize {
        self.generation.seqs.len()
    }

    /// Some prompt member still has a chunk to feed (it is not yet down to
    /// its last token), so [`Self::step`] would run a prefill forward.
    pub fn prefilling(&self) -> bool {
        self.prompt_segments().any(|s| !down_to_last_token(s))
    }

    /// [`Self::step_generation`] would run a forward: the generation batch
    /// has members, or a prompt member is down to its last token.
    pub fn can_decode(&self) -> bool {
        !self.generation.seqs.is_empty() || self.prompt_segments().any(down_to_last_token)
    }

    /// A waiting sequence would join the prompt batch at the next
    /// [`Self::step`] (there is room for it).
    pub fn can_admit(&self) -> bool {
        !self.waiting.is_empty()
            && self.prompt_members() < self.config.prefill_batch_size
            && self.generation.seqs.len() < self.config.completion_batch_size
    }

    /// One `BatchGenerator.next()` (see the module comment): the tokens the
    /// generation batch returns this step.
    pub fn step(&mut self) -> Result<Vec<StepOutput>> {
        let out = self.step_before_chunk()?;
        self.step_chunk()?;
        Ok(out)
    }

    /// [`Self::step`]'s parts 1 to 3: the generation batch's forward,
    /// admission and the sequences that start generating, with the tokens
    /// the generation batch returns. [`Self::step_chunk`] runs part 4; a
    /// server hands these tokens to their clients in between, so they do
    /// not wait for the chunk (its forward comes after theirs either way).
    pub fn step_before_chunk(&mut self) -> Result<Vec<StepOutput>> {
        let out = self.timed_generation_step()?;
        if self.generation.seqs.len() >= self.config.completion_batch_size {
            return Ok(out);
        }
        let n = (self
            .config
            .prefill_batch_size
            .saturating_sub(self.prompt_members()))
        .min(self.config.completion_batch_size - self.generation.seqs.len())
        .min(self.waiting.len());
        if n > 0 {
            self.last_phases.admission = Some(timed(|| self.admit(n))?.1);
        }
        // Each part counts where it had prompt members to work on.
        let joinable = self.prompt_members() > 0;
        let (_, took) = timed(|| self.start_generating())?;
        self.last_phases.joining = joinable.then_some(took);
        self.chunk_due = true;
        Ok(out)
    }

    /// [`Self::step`]'s part 4, after [`Self::step_before_chunk`] (and only
    /// then: a full generation batch admits no one and feeds no chunk, as in
    /// `next()`): a prompt batch's next chunk, or with
    /// [`ChunkAfterStart::NextStep`] none when sequences started generating
    /// in this step, the chunk is not a prompt's last, and the last step
    /// fed one.
    pub fn step_chunk(&mut self) -> Result<()> {
        self.step_chunk_deferring_if(!self.deferred_chunk)
    }

    /// [`Self::step_chunk`], with the caller's bound on deferring instead of
    /// "not twice in a row": with [`ChunkAfterStart::NextStep`] the chunk
    /// waits when sequences started generating in this step, it is not a
    /// prompt's last, and `may_defer` (a server passes whether the
    /// generating side is within its share of the model's time).
    pub fn step_chunk_deferring_if(&mut self, may_defer: bool) -> Result<()> {
        if !std::mem::take(&mut self.chunk_due) {
            return Ok(());
        }
        let prefilling = self.prompt_members() > 0;
        let defer = match self.config.chunk_after_start {
            ChunkAfterStart::SameStep => false,
            ChunkAfterStart::NextStep => {
                may_defer
                    && self.last_phases.started > 0
                    && self
                        .next_chunk_at()
                        .is_some_and(|at| self.prompts[at].tokens_left() > self.chunk_tokens())
            }
        };
        self.deferred_chunk = defer;
        self.last_phases.chunk_deferred = defer;
        if !defer {
            let (_, took) = timed(|| self.prefill_chunk())?;
            self.last_phases.prefill = prefilling.then_some(took);
        }
        Ok(())
    }

    /// Where the last [`Self::step`] or [`Self::step_generation`] spent its
    /// time.
    pub fn last_phases(&self) -> StepPhases {
        self.last_phases
    }

    /// [`Self::step`] without its prompt side's forward: the generation
    /// batch's forward (1), and prompt members already down to their last
    /// token moving to the generation batch (3), as `next()` runs them; no
    /// sequence is admitted (2) and no prefill chunk runs (4).
    ///
    /// A server calls it to decode between two prefill chunks, so a long
    /// prompt does not hold every generating sequence to one token per
    /// chunk. The two batches share no cache, so each forward is the one
    /// `next()` runs on the same members; what moves is only which
    /// generation steps fall between which chunks, that is, which members
    /// the generation batch holds when a prompt member joins it (as for a
    /// prompt that arrived some steps later).
    pub fn step_generation(&mut self) -> Result<Vec<StepOutput>> {
        let out = self.timed_generation_step()?;
        if self.generation.seqs.len() < self.config.completion_batch_size {
            let joinable = self.prompt_members() > 0;
            let (_, took) = timed(|| self.start_generating())?;
            self.last_phases.joining = joinable.then_some(took);
        }
        Ok(out)
    }

    /// The first part of [`Self::step`] and [`Self::step_generation`]:
    /// clears the last step's phases and runs the generation batch's
    /// forward (1), timed, when it has members. With
    /// [`FirstSteps::InGenerationBatch`], prompt members down to their last
    /// token join the generation batch first (3), so this forward runs
    /// their last prompt tokens.
    fn timed_generation_step(&mut self) -> Result<Vec<StepOutput>> {
        self.last_phases = StepPhases::default();
        self.chunk_due = false;
        match self.config.first_steps {
            FirstSteps::OwnForward => {}
            FirstSteps::InGenerationBatch => {
                if self.generation.seqs.len() < self.config.completion_batch_size {
                    let joinable = self.prompt_members() > 0;
                    let (_, took) = timed(|| self.start_generating())?;
                    self.last_phases.joining = joinable.then_some(took);
                }
            }
        }
        if self.generation.seqs.is_empty() {
            return Ok(Vec::new());
        }
        let (tokens, took) = timed(|| self.generation_step())?;
        self.last_phases.generation = Some(took);
        Ok(tokens)
    }

    /// `GenerationBatch.next`.
    fn generation_step(&mut self) -> Result<Vec<StepOutput>> {
        let g = &mut self.generation;
        let tokens = g
            .next_tokens
            .take()
            .ok_or_else(|| error("the generation batch has no tokens to feed".into()))?;
        let logprobs = std::mem::take(&mut g.next_logprobs);
        let cache = g
            .cache
            .as_mut()
            .ok_or_else(|| error("the generation batch has no cache".into()))?;
        let (next_tokens, next_logprobs) =
            sample_next(self.model, &tokens, cache, &g.seqs, &mut self.samplers)?;
        g.next_tokens = Some(next_tokens);
        g.next_logprobs = next_logprobs.into_iter().map(Some).collect();
        // Waits for the previous step only; the one just queued runs on.
        let tokens = token_values(&tokens, &g.seqs)?;
        let mut out = Vec::with_capacity(tokens.len());
        let mut keep = Vec::with_capacity(tokens.len());
        for (i, (token, row)) in tokens.into_iter().zip(logprobs).enumerate() {
            // A last prompt token was fed: the member's first token is the
            // one this forward samples.
            let Some(row) = row else {
                keep.push(i);
                continue;
            };
            g.num_tokens[i] += 1;
            let finished = g.num_tokens[i] >= g.max_tokens[i];
            if finished {
                self.samplers.remove(&g.seqs[i]);
            } else {
                keep.push(i);
            }
            let cache = match (finished && self.keep_caches, &g.cache) {
                (true, Some(c)) => Some(seq_cache::extract(c, i)?),
                (true, None) => return Err(error("the generation batch has no cache".into())),
                (false, _) => None,
            };
            out.push(StepOutput {
                seq: g.seqs[i],
                token,
                logprobs: row,
                finished,
                cache,
            });
        }
        if keep.len() < g.seqs.len() {
            g.filter(&keep)?;
        }
        self.generation_steps += 1;
        if self.generation_steps % BATCH_STEPS_PER_POOL_RELEASE == 0 {
            release_buffer_pool()?;
        }
        Ok(out)
    }

    /// `_make_batch(n)` and `PromptProcessingBatch.extend`: `n` waiting
    /// sequences join the prompt batch, with fresh (empty) caches or the
    /// ones they joined with, merged in one `_merge_caches`.
    fn admit(&mut self, n: usize) -> Result<()> {
        let admitted: Vec<Waiting> = self.waiting.drain(..n).collect();
        let merged = if admitted.iter().all(|w| w.cache.is_none()) {
            self.model.make_batch_cache(n)?
        } else {
            let rows: Vec<Option<&SeqCache>> = admitted.iter().map(|w| w.cache.as_ref()).collect();
            seq_cache::merge(&self.model.make_batch_cache(1)?, &rows)?
        };
        let step = self.config.prefill_step_size;
        // With `ShortFirst`, a batch with more than one chunk left takes no
        // new members: they start the next batch.
        let joinable = match (self.config.prompt_lanes, self.prompts.last()) {
            (_, None) => false,
            (PromptLanes::One, Some(_)) => true,
            (PromptLanes::ShortFirst, Some(last)) => last.tokens_left() <= step,
        };
        if !joinable {
            self.prompts.push(PromptBatch::default());
        }
        let prompt = self
            .prompts
            .last_mut()
            .ok_or_else(|| error("no prompt batch to admit into".into()))?;
        for w in admitted {
            prompt.seqs.push(w.seq);
            prompt.segments.push(w.segments);
            prompt.max_tokens.push(w.max_tokens);
        }
        extend_cache(&mut prompt.cache, Some(merged))
    }

    /// Every prompt member's segments left, batch after batch.
    fn prompt_segments(&self) -> impl Iterator<Item = &VecDeque<Vec<i32>>> {
        self.prompts.iter().flat_map(|p| p.segments.iter())
    }

    /// Sequences in prefill, in every prompt batch.
    fn prompt_members(&self) -> usize {
        self.prompts.iter().map(|p| p.seqs.len()).sum()
    }

    /// The split in `_next`, batch by batch: prompt members whose only
    /// segment left is their last token start generating.
    fn start_generating(&mut self) -> Result<()> {
        let before = self.generation.seqs.len();
        for b in 0..self.prompts.len() {
            self.start_generating_from(b)?;
        }
        self.prompts.retain(|p| !p.seqs.is_empty());
        self.last_phases.started += self.generation.seqs.len() - before;
        Ok(())
    }

    fn start_generating_from(&mut self, b: usize) -> Result<()> {
        let prompt = &mut self.prompts[b];
        let (split, keep): (Vec<usize>, Vec<usize>) =
            (0..prompt.seqs.len()).partition(|&i| down_to_last_token(&prompt.segments[i]));
        if split.is_empty() {
            return Ok(());
        }
        // `PromptProcessingBatch.split`: a copy filtered to `split`, the
        // original to the rest.
        let mut cache = prompt.cache.clone();
        filter_cache(&mut cache, &split)?;
        let seqs: Vec<SeqId> = split.iter().map(|&i| prompt.seqs[i]).collect();
        let last: Vec<i32> = split.iter().map(|&i| prompt.segments[i][0][0]).collect();
        let last = Array::from_slice(&last, &[last.len() as i32]);
        let max_tokens: Vec<usize> = split.iter().map(|&i| prompt.max_tokens[i]).collect();
        prompt.filter(&keep)?;
        let mut cache =
            cache.ok_or_else(|| error("a sequence starts generating without a cache".into()))?;
        let (next_tokens, next_logprobs) = match self.config.first_steps {
            // `GenerationBatch.__init__` runs its first step at once.
            FirstSteps::OwnForward => {
                let (tokens, rows) =
                    sample_next(self.model, &last, &mut cache, &seqs, &mut self.samplers)?;
                (tokens, rows.into_iter().map(Some).collect())
            }
            // The generation batch's next forward feeds the last tokens.
            FirstSteps::InGenerationBatch => (last, vec![None; seqs.len()]),
        };
        self.generation.extend(GenerationBatch {
            num_tokens: vec![0; seqs.len()],
            seqs,
            next_tokens: Some(next_tokens),
            next_logprobs,
            max_tokens,
            cache: Some(cache),
        })
    }

    /// Where the prompt batch that [`Self::prefill_chunk`] feeds next is in
    /// `prompts`: the one with the fewest tokens left (the earliest of
    /// equals).
    fn next_chunk_at(&self) -> Option<usize> {
        self.prompts
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.seqs.is_empty())
            .min_by_key(|(_, p)| p.tokens_left())
            .map(|(at, _)| at)
    }

    /// The most tokens a prompt member feeds in the next chunk:
    /// `prefill_step_size`, or `prefill_step_while_generating` when it is
    /// smaller and other sequences generate or wait.
    fn chunk_tokens(&self) -> usize {
        let busy = !self.generation.seqs.is_empty() || !self.waiting.is_empty();
        match (self.config.prefill_step_while_generating, busy) {
            (Some(n), true) => n.min(self.config.prefill_step_size).max(1),
            (Some(_), false) | (None, _) => self.config.prefill_step_size,
        }
    }

    /// `PromptProcessingBatch.prompt` on the next chunk of every member of
    /// one prompt batch: the only one, or with [`PromptLanes::ShortFirst`]
    /// the one with the fewest tokens left (the earliest of equals).
    fn prefill_chunk(&mut self) -> Result<()> {
        let Some(at) = self.next_chunk_at() else {
            return Ok(());
        };
        let step = self.chunk_tokens();
        let prompt = &mut self.prompts[at];
        let mut chunks = Vec::with_capacity(prompt.seqs.len());
        self.ended_segments.clear();
        for (segments, &seq) in prompt.segments.iter_mut().zip(&prompt.seqs) {
            let first = segments
                .front_mut()
                .ok_or_else(|| error("a prompt member has no tokens left".into()))?;
            let n = first.len().min(step);
            chunks.push(first.drain(..n).collect::<Vec<i32>>());
            if first.is_empty() {
                segments.pop_front();
                self.ended_segments.push(seq);
            }
        }
        let cache = prompt
            .cache
            .as_mut()
            .ok_or_else(|| error("the prompt batch has no cache".into()))?;
        let max_len = chunks.iter().map(Vec::len).max().unwrap_or(0);
        let padding: Vec<i32> = chunks.iter().map(|c| (max_len - c.len()) as i32).collect();
        let padded = padding.iter().any(|&p| p > 0);
        let mut ids = Vec::with_capacity(chunks.len() * max_len);
        for c in &chunks {
            ids.extend_from_slice(c);
            ids.resize(ids.len() + (max_len - c.len()), 0);
        }
        if padded {
            let lengths: Vec<i32> = chunks.iter().map(|c| c.len() as i32).collect();
            cache.prepare_right_padding(&lengths, &padding)?;
        }
        let ids = Array::from_slice(&ids, &[chunks.len() as i32, max_len as i32]);
        // Chunks are at most `chunk_tokens()` long: one forward.
        self.model.forward_batch(&ids, cache)?;
        cache.eval()?;
        self.config.prefill_buffer_pool.after_chunk()?;
        if padded {
            cache.finalize()?;
            cache.eval()?;
            self.config.prefill_buffer_pool.after_chunk()?;
        }
        Ok(())
    }
}

/// `GenerationBatch._step`'s forward on `tokens` (int32 [B], possibly
/// still being evaluated): the last logits as logprobs rows, and the tokens
/// sampled from them (int32 [B]): greedy, or by the sampler of the row's
/// sequence (`seqs`, in row order) when it has one. Both are queued for
/// evaluation (`async_eval`), not waited for.
fn sample_next<M: BatchLm + ?Sized>(
    model: &M,
    tokens: &Array,
    cache: &mut BatchCache,
    seqs: &[SeqId],
    samplers: &mut HashMap<SeqId, Sampler>,
) -> Result<(Array, Vec<Array>)> {
    let b = seqs.len() as i32;
    let logits = model.forward_batch(&tokens.reshape(&[b, 1])?, cache)?;
    let logits = logits.try_index((.., -1, ..))?;
    let logprobs = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
    let sampled =
        mlx_rs::ops::indexing::argmax_axis(&logprobs, -1, false)?.as_dtype(mlx_rs::Dtype::Int32)?;
    let rows: Vec<Array> = (0..b)
        .map(|i| logprobs.try_index(i))
        .collect::<Result<_>>()?;
    let mut own: Vec<Option<Array>> = Vec::with_capacity(rows.len());
    for (seq, row) in seqs.iter().zip(&rows) {
        own.push(match samplers.get_mut(seq) {
            Some(sampler) => {
                let token = sampler(row)?.as_dtype(mlx_rs::Dtype::Int32)?;
                if token.size() != 1 {
                    return Err(error(format!(
                        "sequence {}: its sampler gave {} tokens, expected 1",
                        seq.0,
                        token.size()
                    )));
                }
                Some(token.reshape(&[1])?)
            }
            None => None,
        });
    }
    // Greedy rows take their argmax; the others their sampler's token.
    let next = if own.iter().all(Option::is_none) {
        sampled
    } else {
        let pieces = own
            .into_iter()
            .enumerate()
            .map(|(i, t)| match t {
                Some(t) => Ok(t),
                None => sampled.try_index(i as i32..i as i32 + 1),
            })
            .collect::<Result<Vec<Array>>>()?;
        mlx_rs::ops::concatenate(&pieces, 0)?
    };
    let mut outputs: Vec<&Array> = rows.iter().collect();
    outputs.push(&next);
    mlx_rs::transforms::async_eval(outputs)?;
    Ok((next, rows))
}

/// The host values of a step's tokens (int32 [B], one per sequence of
/// `seqs`), waiting for their evaluation.
fn token_values(tokens: &Array, seqs: &[SeqId]) -> Result<Vec<i32>> {
    tokens.eval()?;
    let values = tokens.as_slice::<i32>();
    if values.len() != seqs.len() {
        return Err(error(format!(
            "a step gave {} tokens for {} sequences",
            values.len(),
            seqs.len()
        )));
    }
    Ok(values.to_vec())
}

/// A fixed schedule of arrivals (the JSON of `archgen logits --batch` and
/// tests/python/batch_oracle.py).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub config: BatchConfig,
    pub sequences: Vec<ScheduledSeq>,
}

/// One sequence of a [`Schedule`]: it joins just before step `arrival` and
/// returns `decode` tokens, unless it is cancelled ([`BatchSession::leave`])
/// just before step `leave`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledSeq {
    pub prompt: Vec<i32>,
    pub arrival: usize,
    pub decode: usize,
    pub leave: Option<usize>,
}

impl Schedule {
    /// Reads the schedule JSON: `{"prefill_step_size"?, "prefill_batch_size"?,
    /// "completion_batch_size"?, "sequences": [{"prompt": [ids], "arrival":
    /// step, "decode": n, "leave"?: step}]}`. Errors name the field path.
    /// Token ids must be below `vocab`.
    pub fn from_json(v: &serde_json::Value, vocab: i32) -> std::result::Result<Self, String> {
        let count = |v: &serde_json::Value, path: &str| -> std::result::Result<usize, String> {
            v.as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| format!("{path}: expected a non-negative integer, found {v}"))
        };
        let obj = v
            .as_object()
            .ok_or_else(|| "expected a JSON object with \"sequences\"".to_string())?;
        for key in obj.keys() {
            if ![
                "prefill_step_size",
                "prefill_batch_size",
                "completion_batch_size",
                "sequences",
            ]
            .contains(&key.as_str())
            {
                return Err(format!(
                    "{key}: unknown field (expected prefill_step_size, prefill_batch_size, completion_batch_size, sequences)"
                ));
            }
        }
        let mut config = BatchConfig::default();
        for (key, slot) in [
            ("prefill_step_size", &mut config.prefill_step_size),
            ("prefill_batch_size", &mut config.prefill_batch_size),
            ("completion_batch_size", &mut config.completion_batch_size),
        ] {
            if let Some(x) = obj.get(key) {
                *slot = count(x, key)?;
                if *slot == 0 {
                    return Err(format!("{key}: must be at least 1"));
                }
            }
        }
        let seqs = obj
            .get("sequences")
            .and_then(|s| s.as_array())
            .ok_or_else(|| "sequences: expected an array of sequences".to_string())?;
        if seqs.is_empty() {
            return Err("sequences: the schedule has no sequences".to_string());
        }
        let mut sequences = Vec::with_capacity(seqs.len());
        for (i, s) in seqs.iter().enumerate() {
            let at = |f: &str| format!("sequences[{i}].{f}");
            let fields = s
                .as_object()
                .ok_or_else(|| format!("sequences[{i}]: expected an object"))?;
            if let Some(key) = fields
                .keys()
                .find(|k| !["prompt", "arrival", "decode", "leave"].contains(&k.as_str()))
            {
                return Err(format!(
                    "{}: unknown field (expected prompt, arrival, decode, leave)",
                    at(key)
                ));
            }
            let field = |f: &str| s.get(f).ok_or_else(|| format!("{}: missing", at(f)));
            let prompt = field("prompt")?
                .as_array()
                .ok_or_else(|| format!("{}: expected an array of token ids", at("prompt")))?
                .iter()
                .enumerate()
                .map(|(j, t)| match t.as_i64() {
                    Some(t) if (0..i64::from(vocab)).contains(&t) => Ok(t as i32),
                    _ => Err(format!(
                        "{}[{j}]: expected a token id in 0..{vocab}, found {t}",
                        at("prompt")
                    )),
                })
                .collect::<std::result::Result<Vec<i32>, String>>()?;
            if prompt.is_empty() {
                return Err(format!("{}: the prompt is empty", at("prompt")));
            }
            let decode = count(field("decode")?, &at("decode"))?;
            if decode == 0 {
                return Err(format!("{}: must be at least 1", at("decode")));
            }
            let arrival = count(field("arrival")?, &at("arrival"))?;
            let leave = match s.get("leave") {
                None => None,
                Some(l) => {
                    let l = count(l, &at("leave"))?;
                    if l <= arrival {
                        return Err(format!(
                            "{}: step {l} is not after the arrival (step {arrival})",
                            at("leave")
                        ));
                    }
                    Some(l)
                }
            };
            sequences.push(ScheduledSeq {
                prompt,
                arrival,
                decode,
                leave,
            });
        }
        Ok(Schedule { config, sequences })
    }
}

/// One sequence's result under a schedule: its logprobs rows [N, vocab],
/// greedy tokens [N] and the step that returned each token.
#[derive(Debug)]
pub struct SeqRun {
    pub logprobs: Array,
    pub tokens: Vec<i32>,
    pub steps: Vec<i32>,
}

/// Replays `schedule` as tests/python/batch_oracle.py drives mlx-lm's
/// `BatchGenerator`: before each step (one `next()`), the sequences whose
/// `leave` it is are cancelled, then those whose `arrival` it is join, in
/// schedule order. A sequence cancelled before its first token gets an
/// empty [0, vocab] logprobs.
pub fn run_schedule<M: BatchLm + ?Sized>(model: &M, schedule: &Schedule) -> Result<Vec<SeqRun>> {
    let mut session = BatchSession::new(model, schedule.config);
    let n = schedule.sequences.len();
    let mut rows: Vec<Vec<Array>> = vec![Vec::new(); n];
    let mut tokens: Vec<Vec<i32>> = vec![Vec::new(); n];
    let mut steps: Vec<Vec<i32>> = vec![Vec::new(); n];
    let mut index_of: Vec<(SeqId, usize)> = Vec::with_capacity(n);
    let last_event = schedule
        .sequences
        .iter()
        .map(|s| s.arrival.max(s.leave.unwrap_or(0)))
        .max()
        .unwrap_or(0);
    // The same bound as the oracle's: no schedule needs more steps.
    let limit = last_event
        + schedule
            .sequences
            .iter()
            .map(|s| s.prompt.len() + s.decode + 2)
            .sum::<usize>();
    let mut step = 0;
    while step <= last_event || !session.is_idle() {
        if step > limit {
            return Err(error(format!(
                "the schedule did not finish within {limit} steps"
            )));
        }
        for (seq, i) in &index_of {
            if schedule.sequences[*i].leave == Some(step) {
                session.leave(*seq)?;
            }
        }
        for (i, s) in schedule.sequences.iter().enumerate() {
            if s.arrival == step {
                index_of.push((session.join(&s.prompt, s.decode)?, i));
            }
        }
        for out in session.step()? {
            let i = index_of
                .iter()
                .find(|(seq, _)| *seq == out.seq)
                .map(|(_, i)| *i)
                .ok_or_else(|| error(format!("step {step}: unknown sequence {:?}", out.seq)))?;
            rows[i].push(out.logprobs);
            tokens[i].push(out.token);
            steps[i].push(step as i32);
        }
        step += 1;
    }
    let dtype = rows
        .iter()
        .flatten()
        .next()
        .map(Array::dtype)
        .ok_or_else(|| error("no sequence of the schedule returned a token".into()))?;
    rows.into_iter()
        .zip(tokens)
        .zip(steps)
        .map(|((rows, tokens), steps)| {
            let logprobs = if rows.is_empty() {
                mlx_rs::ops::zeros_dtype(&[0, model.vocab_size()], dtype)?
            } else {
                mlx_rs::ops::stack(&rows, 0)?
            };
            Ok(SeqRun {
                logprobs,
                tokens,
                steps,
            })
        })
        .collect()
}
