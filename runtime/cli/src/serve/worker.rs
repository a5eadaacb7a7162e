//! The model thread's task: picks how the server steps its sequences. A
//! model with a batched forward runs them through one `BatchSession`
//! (batched.rs); any other runs them one by one (scheduler.rs). Both
//! schedulers sit below this file, so neither reaches into the other.

use std::sync::{mpsc, Arc};

use archgen_runtime::model::{CausalLm, ModelTask, Runs};
use tokenizers::Tokenizer;

use super::batched::BatchedScheduler;
use super::metrics::Metrics;
use super::scheduler::{serve, Job, Limits, Scheduler};

/// Runs the scheduler on the model thread until the queue's senders are
/// gone and no sequence is left.
pub struct Worker {
    /// The model as the operator named it, for notes.
    pub model_label: String,
    pub jobs: mpsc::Receiver<Job>,
    pub ready: mpsc::Sender<i32>,
    pub tokenizer: Arc<Tokenizer>,
    pub eos: Vec<i32>,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
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
                    eprintln!(
                        "archgen: serve: {}: concurrent requests decode as one batched forward \
                         (mlx-lm's BatchGenerator schedule), up to {} at once",
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
                    serve(
                        &mut scheduler,
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
        let _ = self.ready.send(m.vocab_size());
        let mut scheduler =
            Scheduler::one_by_one(m, &self.tokenizer, &self.eos, self.limits, &self.metrics);
        serve(
            &mut scheduler,
            &self.jobs,
            self.limits.max_batch,
            &self.metrics,
        );
        Ok(())
    }
}
