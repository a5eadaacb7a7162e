//! The server's metrics, served by `GET /metrics` in the Prometheus text
//! format (prometheus-client's OpenMetrics text encoder, which Prometheus
//! scrapes). The scheduler thread and the HTTP handlers update them; every
//! metric is an atomic, so neither waits on the other.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use archgen_runtime::batch_session::StepPhases;

/// What one step of the model thread ran (the label of
/// `archgen_scheduler_step_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulerStep {
    /// Batched: the generation batch's forward, then admission and a
    /// prefill chunk (`BatchGenerator.next()`).
    Full,
    /// Batched: the generation batch's forward alone, between two chunks of
    /// a prompt in prefill.
    DecodeOnly,
    /// One by one: one prompt's prefill chunk.
    PrefillChunk,
    /// One by one: a decode forward of every sequence past its prompt.
    Decode,
}

impl SchedulerStep {
    fn label(self) -> &'static str {
        match self {
            SchedulerStep::Full => "full",
            SchedulerStep::DecodeOnly => "decode_only",
            SchedulerStep::PrefillChunk => "prefill_chunk",
            SchedulerStep::Decode => "decode",
        }
    }
}

/// A part of a batched step (the label of `archgen_step_phase_seconds`):
/// [`StepPhases`]' fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepPhase {
    Generation,
    Admission,
    Joining,
    Prefill,
}

impl StepPhase {
    fn label(self) -> &'static str {
        match self {
            StepPhase::Generation => "generation",
            StepPhase::Admission => "admission",
            StepPhase::Joining => "joining",
            StepPhase::Prefill => "prefill",
        }
    }
}

type StepLabel = Vec<(&'static str, &'static str)>;

/// Step-time histograms by one label (a step's kind, a part's name).
type StepHistograms = Family<StepLabel, Histogram, fn() -> Histogram>;

/// 0.5 ms .. ~16 s: a step of a tiny model on a CPU to a long prompt's chunk.
fn step_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Registers a [`StepHistograms`] under `name`.
fn register_step_histograms(registry: &mut Registry, name: &str, help: &str) -> StepHistograms {
    let family = StepHistograms::new_with_constructor(step_histogram);
    registry.register(name, help, family.clone());
    family
}

/// The label set of `archgen_requests`: the HTTP status of the answer.
type StatusLabel = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    /// Requests accepted and waiting for a place in the batch.
    pub queue_depth: Gauge,
    /// Sequences in flight (prefilling or decoding).
    pub active_sequences: Gauge,
    /// Completion tokens handed to clients (their rate is the throughput).
    pub generated_tokens: Counter,
    /// Prompt tokens of the requests accepted.
    pub prompt_tokens: Counter,
    /// Sequences dropped because their client disconnected.
    pub cancelled: Counter,
    /// Prefill chunks that waited a step for sequences that started
    /// generating (`defer-chunk-on-start`).
    pub chunks_deferred: Counter,
    requests: Family<StatusLabel, Counter>,
    /// From queueing a request to its first generated token, in seconds.
    pub time_to_first_token: Histogram,
    /// From queueing a completion request to its admission into the batch
    /// (the part of the time to first token spent waiting for a place).
    pub queue_wait: Histogram,
    /// Each model-thread step's wall time, by what it ran: with
    /// `queue_wait`, where the time to first token goes.
    steps: StepHistograms,
    /// A batched step's parts, by name: which part of a step is slow.
    phases: StepHistograms,
    /// Between two tokens of one sequence, in seconds.
    pub inter_token_latency: Histogram,
    /// Sequences computed by one decode forward: 1 each when the model
    /// serves one by one, the generation batch when it batches.
    pub decode_batch_size: Histogram,
    /// Requests that started from a prompt cache entry.
    pub prompt_cache_hits: Counter,
    /// Requests the prompt cache had nothing for.
    pub prompt_cache_misses: Counter,
    /// Prompt tokens supplied by the prompt cache (not computed).
    pub prompt_cache_tokens: Counter,
    /// Bytes of the arrays the prompt cache holds.
    pub prompt_cache_bytes: Gauge,
    /// Sequences the prompt cache holds.
    pub prompt_cache_entries: Gauge,
    /// The memory gauges, read when the metrics are rendered.
    memory: MemoryGauges,
}

/// What the process and MLX hold, read at each scrape: the numbers a long
/// run is watched with (a leak shows as resident or active bytes that keep
/// rising after the load levels off).
struct MemoryGauges {
    /// The process's resident set (physical memory), in bytes.
    resident: Gauge,
    /// Bytes of MLX arrays alive now.
    mlx_active: Gauge,
    /// Bytes MLX keeps in its buffer pool for reuse (returned to the system
    /// after each prefill chunk and every few hundred decode steps).
    mlx_cache: Gauge,
    /// The most MLX arrays have held at once since the server started.
    mlx_peak: Gauge,
}

impl MemoryGauges {
    fn register(registry: &mut Registry) -> Self {
        let gauges = MemoryGauges {
            resident: Gauge::default(),
            mlx_active: Gauge::default(),
            mlx_cache: Gauge::default(),
            mlx_peak: Gauge::default(),
        };
        for (name, help, gauge) in [
            (
                "process_resident_bytes",
                "Physical memory the server process holds",
                &gauges.resident,
            ),
            (
                "mlx_active_bytes",
                "Bytes of MLX arrays alive now",
                &gauges.mlx_active,
            ),
            (
                "mlx_cache_bytes",
                "Bytes in MLX's buffer pool, kept for reuse",
                &gauges.mlx_cache,
            ),
            (
                "mlx_peak_bytes",
                "Most bytes MLX arrays held at once since the start",
                &gauges.mlx_peak,
            ),
        ] {
            registry.register(name, help, gauge.clone());
        }
        gauges
    }

    /// Reads the numbers now. A number that cannot be read keeps its last
    /// value rather than failing the scrape.
    fn refresh(&self) {
        fn set(gauge: &Gauge, bytes: Option<usize>) {
            if let Some(bytes) = bytes {
                gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
        set(
            &self.resident,
            memory_stats::memory_stats().map(|m| m.physical_mem),
        );
        let mlx = archgen_runtime::device::mlx_memory().ok();
        set(&self.mlx_active, mlx.map(|m| m.active));
        set(&self.mlx_cache, mlx.map(|m| m.pool));
        set(&self.mlx_peak, mlx.map(|m| m.peak));
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("archgen");
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Requests waiting for a place in the batch",
            queue_depth.clone(),
        );
        let active_sequences = Gauge::default();
        registry.register(
            "active_sequences",
            "Sequences in flight (prefilling or decoding)",
            active_sequences.clone(),
        );
        let generated_tokens = Counter::default();
        registry.register(
            "generated_tokens",
            "Completion tokens generated (rate() of it is tokens/s)",
            generated_tokens.clone(),
        );
        let prompt_tokens = Counter::default();
        registry.register(
            "prompt_tokens",
            "Prompt tokens of accepted requests",
            prompt_tokens.clone(),
        );
        let cancelled = Counter::default();
        registry.register(
            "cancelled_sequences",
            "Sequences dropped because their client disconnected",
            cancelled.clone(),
        );
        let chunks_deferred = Counter::default();
        registry.register(
            "prefill_chunks_deferred",
            "Prefill chunks that waited a step so that sequences starting to generate got their first tokens first",
            chunks_deferred.clone(),
        );
        let requests = Family::<StatusLabel, Counter>::default();
        registry.register(
            "requests",
            "Completion requests answered, by HTTP status",
            requests.clone(),
        );
        // 1 ms .. ~33 s.
        let time_to_first_token = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "time_to_first_token_seconds",
            "From queueing a request to its first generated token",
            time_to_first_token.clone(),
        );
        let queue_wait = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "queue_wait_seconds",
            "From queueing a completion request to its admission into the batch",
            queue_wait.clone(),
        );
        let steps = register_step_histograms(
            &mut registry,
            "scheduler_step_seconds",
            "Wall time of one model-thread step, by what it ran",
        );
        let phases = register_step_histograms(
            &mut registry,
            "step_phase_seconds",
            "Wall time of one part of a batched step: the generation forward, admission, \
             joining the generation batch, the prefill chunk",
        );
        // 0.5 ms .. ~4 s.
        let inter_token_latency = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "inter_token_latency_seconds",
            "Between two consecutive tokens of one sequence",
            inter_token_latency.clone(),
        );
        // 1 .. 128 sequences.
        let decode_batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 8));
        registry.register(
            "decode_batch_size",
            "Sequences computed by one decode forward",
            decode_batch_size.clone(),
        );
        let prompt_cache_hits = Counter::default();
        registry.register(
            "prompt_cache_hits",
            "Requests that started from a prompt cache entry",
            prompt_cache_hits.clone(),
        );
        let prompt_cache_misses = Counter::default();
        registry.register(
            "prompt_cache_misses",
            "Requests the prompt cache had no entry for",
            prompt_cache_misses.clone(),
        );
        let prompt_cache_tokens = Counter::default();
        registry.register(
            "prompt_cache_tokens",
            "Prompt tokens supplied by the prompt cache instead of computed",
            prompt_cache_tokens.clone(),
        );
        let prompt_cache_bytes = Gauge::default();
        registry.register(
            "prompt_cache_bytes",
            "Bytes of the KV arrays the prompt cache holds",
            prompt_cache_bytes.clone(),
        );
        let prompt_cache_entries = Gauge::default();
        registry.register(
            "prompt_cache_entries",
            "Sequences the prompt cache holds",
            prompt_cache_entries.clone(),
        );
        let memory = MemoryGauges::register(&mut registry);
        Metrics {
            registry,
            memory,
            prompt_cache_hits,
            prompt_cache_misses,
            prompt_cache_tokens,
            prompt_cache_bytes,
            prompt_cache_entries,
            decode_batch_size,
            queue_depth,
            active_sequences,
            generated_tokens,
            prompt_tokens,
            cancelled,
            chunks_deferred,
            requests,
            time_to_first_token,
            queue_wait,
            steps,
            phases,
            inter_token_latency,
        }
    }

    /// Records one model-thread step of `kind` that took `seconds`.
    pub fn step_took(&self, kind: SchedulerStep, seconds: f64) {
        self.steps
            .get_or_create(&vec![("kind", kind.label())])
            .observe(seconds);
    }

    /// Records the parts of a batched step that ran.
    pub fn phases_took(&self, phases: StepPhases) {
        let StepPhases {
            generation,
            admission,
            joining,
            prefill,
            started: _,
            chunk_deferred,
        } = phases;
        if chunk_deferred {
            self.chunks_deferred.inc();
        }
        for (phase, took) in [
            (StepPhase::Generation, generation),
            (StepPhase::Admission, admission),
            (StepPhase::Joining, joining),
            (StepPhase::Prefill, prefill),
        ] {
            if let Some(took) = took {
                self.phases
                    .get_or_create(&vec![("phase", phase.label())])
                    .observe(took.as_secs_f64());
            }
        }
    }

    /// Counts an answered request by its HTTP status (499: the client left).
    pub fn answered(&self, status: u16) {
        self.requests
            .get_or_create(&vec![("status", status.to_string())])
            .inc();
    }

    /// The metrics in the text exposition format.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        self.memory.refresh();
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_counted_by_kind_and_queue_waits_observed() {
        let metrics = Metrics::new();
        for (kind, seconds) in [
            (SchedulerStep::Full, 0.020),
            (SchedulerStep::Full, 0.030),
            (SchedulerStep::DecodeOnly, 0.010),
            (SchedulerStep::PrefillChunk, 0.5),
            (SchedulerStep::Decode, 0.004),
        ] {
            metrics.step_took(kind, seconds);
        }
        metrics.queue_wait.observe(0.25);
        let ms = std::time::Duration::from_millis;
        metrics.phases_took(StepPhases {
            generation: Some(ms(8)),
            admission: None,
            joining: Some(ms(2)),
            prefill: Some(ms(40)),
            started: 0,
            chunk_deferred: false,
        });
        metrics.phases_took(StepPhases {
            generation: Some(ms(8)),
            started: 2,
            chunk_deferred: true,
            ..StepPhases::default()
        });
        let text = metrics.render().unwrap();
        for line in [
            "archgen_scheduler_step_seconds_count{kind=\"full\"} 2",
            "archgen_scheduler_step_seconds_sum{kind=\"full\"} 0.05",
            "archgen_scheduler_step_seconds_count{kind=\"decode_only\"} 1",
            "archgen_scheduler_step_seconds_count{kind=\"prefill_chunk\"} 1",
            "archgen_scheduler_step_seconds_count{kind=\"decode\"} 1",
            "archgen_queue_wait_seconds_sum 0.25",
            "archgen_queue_wait_seconds_count 1",
            "archgen_step_phase_seconds_count{phase=\"generation\"} 2",
            "archgen_step_phase_seconds_sum{phase=\"generation\"} 0.016",
            "archgen_step_phase_seconds_count{phase=\"joining\"} 1",
            "archgen_step_phase_seconds_count{phase=\"prefill\"} 1",
            "archgen_prefill_chunks_deferred_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
        // A part that did not run is not counted.
        assert!(!text.contains("phase=\"admission\"} "), "{text}");
    }
}
