//! The model thread's task: picks how the server steps its sequences. A
//! model with a batched forward runs them through one `BatchSession`
//! (batched.rs); any other runs them one by one (scheduler.rs). Both
//! schedulers sit below this file, so neither reaches into the other.
//! Its loop ([`serve`]) also runs the embedding requests (embeddings.rs):
//! one input's forward after each generation step.

use std::sync::{mpsc, Arc};

use archgen_runtime::batch_session::FirstSteps;
use archgen_runtime::model::{CausalLm, ModelTask, Runs};
use tokenizers::Tokenizer;

use super::batched::BatchedScheduler;
use super::embeddings::{EmbedJob, Embedder};
use super::metrics::Metrics;
use super::scheduler::{Job, Limits, Scheduler, Steps};
use crate::embed::EmbeddingHead;

/// What the server queues for the model thread (a generation's job is
/// boxed: it is many times an embedding job's size).
pub enum Work {
    Generate(Box<Job>),
    Embed(EmbedJob),
}

/// Runs the scheduler on the model thread until the queue's senders are
/// gone and no sequence is left.
pub struct Worker {
    /// The model as the operator named it, for notes.
    pub model_label: String,
    pub jobs: mpsc::Receiver<Work>,
    pub ready: mpsc::Sender<i32>,
    pub tokenizer: Arc<Tokenizer>,
    pub eos: Vec<i32>,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    /// How /v1/embeddings pools and normalises (the server refuses the
    /// route, queueing nothing, when the checkpoint's head cannot run).
    pub embedding_head: Option<EmbeddingHead>,
}

impl ModelTask for Worker {
    type Output = Result<(), String>;

    /// Up to `max_batch` sequences share a forward (a batch of one row is
    /// one sequence's graph).
    fn runs(&self) -> Runs {
        match self.limits.max_batch {
            0 | 1 => Runs::OneSequence,
            _ => Runs::Batches,
        }
    }

    fn run<M: CausalLm>(self, m: &M) -> Self::Output {
        // The notes come before `ready`, so they precede the address line.
        let unbatched = match m.batched() {
            Some(batched) => match batched.make_batch_cache(1) {
                Ok(_) => {
                    let first_steps = match self.limits.first_steps {
                        FirstSteps::OwnForward => "",
                        FirstSteps::InGenerationBatch => {
                            "; a prompt's last token runs in the next decode forward \
                             (first-token-in-decode-step)"
                        }
                    };
                    eprintln!(
                        "archgen: serve: {}: concurrent requests decode as one batched forward \
                         (mlx-lm's BatchGenerator schedule), up to {} at once{first_steps}",
                        self.model_label, self.limits.max_batch
                    );
                    let _ = self.ready.send(m.vocab_size());
                    let mut scheduler = BatchedScheduler::new(
                        batched,
                        &self.tokenizer,
                        &self.eos,
                        self.limits,
                        &self.metrics,
                    );
                    let mut embedder = Embedder::new(m, self.embedding_head.clone());
                    serve(
                        &mut scheduler,
                        &mut embedder,
                        &self.jobs,
                        self.limits.max_batch,
                        &self.metrics,
                    );
                    return Ok(());
                }
                Err(e) => format!("its batched forward cannot batch this model's caches ({e})"),
            },
            None => "this implementation has no batched forward".to_string(),
        };
        eprintln!(
            "archgen: serve: {}: {unbatched}; requests run one by one \
             (one forward per sequence per step, no batching speedup)",
            self.model_label
        );
        match self.limits.first_steps {
            FirstSteps::OwnForward => {}
            FirstSteps::InGenerationBatch => eprintln!(
                "archgen: serve: first-token-in-decode-step acts on no step here: no decode \
                 batch runs"
            ),
        }
        let _ = self.ready.send(m.vocab_size());
        let mut scheduler =
            Scheduler::one_by_one(m, &self.tokenizer, &self.eos, self.limits, &self.metrics);
        let mut embedder = Embedder::new(m, self.embedding_head.clone());
        serve(
            &mut scheduler,
            &mut embedder,
            &self.jobs,
            self.limits.max_batch,
            &self.metrics,
        );
        Ok(())
    }
}

/// The model thread's loop: idle, wait for a request; then admit queued
/// requests while fewer than `max_batch` generations are in flight and
/// fewer than `max_batch` embedding requests wait, run one generation step
/// and one embedding input, and again, until the queue's senders are gone
/// and nothing is in flight. An embedding input is one whole forward of at
/// most the prompt limit's tokens (not cut into prefill chunks: that would
/// change its bytes against mlx-lm's single forward), so generation waits
/// for at most one input between two of its steps, and an embedding request
/// advances while generations run.
fn serve<M: CausalLm>(
    scheduler: &mut impl Steps,
    embedder: &mut Embedder<'_, M>,
    work: &mpsc::Receiver<Work>,
    max_batch: usize,
    metrics: &Metrics,
) {
    let mut open = true;
    loop {
        if scheduler.in_flight() == 0 && embedder.queued() == 0 {
            if !open {
                return;
            }
            // Idle: wait for work.
            match work.recv() {
                Ok(w) => admit(w, scheduler, embedder, metrics),
                Err(mpsc::RecvError) => return,
            }
        }
        while open && scheduler.in_flight() < max_batch && embedder.queued() < max_batch {
            match work.try_recv() {
                Ok(w) => admit(w, scheduler, embedder, metrics),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        scheduler.step_once();
        embedder.step_once();
        metrics.active_sequences.set(scheduler.in_flight() as i64);
    }
}

/// Hands a queued request to the scheduler or the embedder.
fn admit<M: CausalLm>(
    work: Work,
    scheduler: &mut impl Steps,
    embedder: &mut Embedder<'_, M>,
    metrics: &Metrics,
) {
    match work {
        Work::Generate(job) => scheduler.admit(*job),
        Work::Embed(job) => {
            metrics.queue_depth.dec();
            embedder.admit(job)
        }
    }
}
