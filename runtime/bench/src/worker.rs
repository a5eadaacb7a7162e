//! `archgen-bench worker --impl generated|monolith --model DIR`: a benchmark worker
//! driven by `cargo xtask bench` over stdin/stdout, one JSON object per line.
//! tests/python/bench_mlx_lm.py speaks the same protocol for mlx-lm.
//!
//! After loading and one evaluated 1-token forward on a throwaway cache (MLX
//! reads weights lazily; this makes it read them all) it prints
//! `{"ready": true, "impl", "load_s", "vmhwm_kb", "decode_choices"}` (VmHWM =
//! the process's peak RSS so far, i.e. while loading; `decode_choices`: the
//! levers the environment's variables set, read before the model loads, a
//! value the worker cannot read refused), then answers:
//!   `prefill N`  fresh cache, one forward over N prompt ids, logits evaluated
//!                -> `{"prefill_s": T}`; this cache is the one `steps` extends
//!   `steps W S`  W untimed then S timed one-token decode steps, pipelined
//!                as mlx-lm's generate_step runs them (and `archgen generate`):
//!                the next token is the argmax of the logits row kept as a
//!                lazy array, step n+1 is built and queued with async_eval
//!                before step n's token is read; a step's time is the
//!                interval between two tokens becoming available
//!                -> `{"steps_s": [T...], "tokens": [...]}` (the W + S tokens
//!                fed, so the driver can check that every implementation did
//!                the same work)
//!   `steps W S sequential`  the same, one step at a time: forward + eval
//!                of the logits row timed alone, the argmax outside the timed
//!                span (how the change log's CPU runs 1-11 were measured)
//!   `nodes`      one more decode step whose graph is counted before it is
//!                evaluated: the primitive nodes MLX's `export_to_dot` lists
//!                -> `{"nodes": N, "by_op": {op: count}}`
//!   `dot prefill N FILE`  fresh cache, one forward over N prompt ids; the
//!                graph of the logits (`[N, vocab]`) is written to FILE as
//!                DOT (MLX's `export_to_dot`) before it is evaluated; then it
//!                is evaluated and its cache is the one `steps`/`dot step`
//!                extend -> `{"dot": FILE, "nodes": N}`
//!   `dot step FILE`  one more decode step (the argmax of the last logits
//!                row) whose logits row's graph is written to FILE the same
//!                way -> `{"dot": FILE, "nodes": N}`
//!                runtime/mlx-cuda/graph_diff.py compares two such files
//!   `batch B P W S`  batched decode through the model's batched forward
//!                (`CausalLm::batched`: today the monolith's `BatchLm`;
//!                generated models have none yet and answer `{"error"}`):
//!                B sequences of P prompt ids (sequence j's ids shifted by
//!                101 * j, so the rows differ) join one `BatchSession` with
//!                mlx-lm's `BatchGenerator` defaults; steps run untimed until
//!                one step returns a token for all B (all prefilled, one
//!                generation batch), then W untimed and S timed steps; a
//!                step is one `BatchSession::step` (one batched forward over
//!                B tokens, its B logprobs rows and greedy tokens evaluated,
//!                as `archgen serve` runs it) and its time the interval
//!                between two steps' tokens -> `{"batch": B, "fill_s": T,
//!                "steps_s": [T...], "tokens": [[B tokens]...]}` (the tokens
//!                of the timed steps, in sequence order); the sequences then
//!                leave the session
//!   `batch-parts B P W S`  the batched forward of a decode step without the
//!                session: B such prompts prefilled in one forward on a
//!                fresh batched cache, then W untimed and S timed one-token
//!                steps, each one's graph (forward, logprobs rows, greedy
//!                tokens) built, then evaluated, nothing overlapping; then
//!                one more step's graph counted as `nodes` does
//!                -> `{"batch": B, "build_s": [T...], "eval_s": [T...],
//!                "nodes": N, "by_op": {op: count}}`
//!   `quit`
//! Prompt ids are `(i * 37 + 11) % vocab`, as in the parity tests.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use archgen_runtime::batch::BatchLm;
use archgen_runtime::batch_session::{BatchConfig, BatchSession, SeqId};
use archgen_runtime::device::{set_decode_choices, DecodeChoices};
use archgen_runtime::mlx_rs::ops::indexing::TryIndexOp;
use archgen_runtime::model::{CausalLm, ModelTask};
use archgen_runtime::protocol::argmax;
use archgen_runtime::Array;
use serde_json::json;

/// Peak resident set size of this process in KiB (VmHWM), if readable.
fn vmhwm_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn prompt_ids(n: usize, vocab: i32) -> Vec<i32> {
    (0..n as i64)
        .map(|i| ((i * 37 + 11) % vocab as i64) as i32)
        .collect()
}

fn reply(value: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    // A closed pipe means the driver is gone; nothing to report to.
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

struct Worker {
    name: &'static str,
    started: Instant,
    choices: DecodeChoices,
}

/// The decode choices as the ready line reports them: what a benchmark log
/// shows ran (a variant's variables reached the worker or they did not).
fn choices_json(c: &DecodeChoices) -> serde_json::Value {
    json!({
        "eager_decode": c.eager_decode,
        "gpu_decode": c.gpu_decode,
        "gpu_decode_on_cpu": c.gpu_decode_on_cpu,
        "gpu_decode_blocks": format!("{:?}", c.gpu_blocks),
        "gpu_one_token_sdpa": c.gpu_one_token_sdpa,
        "gpu_stacked_projections": c.gpu_stacked_projections,
        "cuda_head_norm_rope": c.cuda_head_norm_rope,
        "deltanet_chunked_prefill": c.deltanet_chunked_prefill,
    })
}

impl ModelTask for Worker {
    type Output = Result<(), String>;

    fn run<M: CausalLm>(self, m: &M) -> Result<(), String> {
        // MLX loads safetensors lazily: one evaluated 1-token forward on a
        // throwaway cache materializes every weight, so `load_s` and VmHWM
        // cover the whole load (the Python worker does the same).
        let first = m
            .forward(&Array::from_slice(&[0], &[1, 1]), &mut m.make_cache())
            .map_err(|e| e.to_string())?;
        first.eval().map_err(|e| e.to_string())?;
        reply(json!({
            "ready": true,
            "impl": self.name,
            "load_s": self.started.elapsed().as_secs_f64(),
            "vmhwm_kb": vmhwm_kb(),
            "decode_choices": choices_json(&self.choices),
        }));
        let mut cache = m.make_cache();
        let mut last: Option<Array> = None;
        for line in std::io::stdin().lock().lines() {
            let line = line.map_err(|e| e.to_string())?;
            let words: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| -> Result<usize, String> {
                words
                    .get(i)
                    .and_then(|w| w.parse().ok())
                    .ok_or_else(|| format!("bad command '{line}'"))
            };
            match words.first().copied() {
                Some("prefill") => {
                    let n = num(1)?;
                    cache = m.make_cache();
                    let ids = prompt(m, n);
                    let t = Instant::now();
                    let logits = prefill_logits(m, &mut cache, &ids)?;
                    logits.eval().map_err(|e| e.to_string())?;
                    let secs = t.elapsed().as_secs_f64();
                    last = Some(logits.try_index(-1).map_err(|e| e.to_string())?);
                    reply(json!({ "prefill_s": secs }));
                }
                Some("steps") => {
                    let (warm, timed) = (num(1)?, num(2)?);
                    let row = last.as_ref().ok_or("steps before prefill")?;
                    let steps = match words.get(3).copied() {
                        None | Some("pipelined") => pipelined_steps,
                        Some("sequential") => sequential_steps,
                        Some(other) => {
                            return Err(format!(
                                "steps: unknown mode '{other}' (pipelined or sequential)"
                            ))
                        }
                    };
                    let (times, tokens, row) =
                        steps(m, &mut cache, row, warm, timed).map_err(|e| e.to_string())?;
                    last = Some(row);
                    reply(json!({ "steps_s": times, "tokens": tokens }));
                }
                Some("nodes") => {
                    // One decode step's graph, counted before it is evaluated.
                    let row = last.as_ref().ok_or("nodes before prefill")?;
                    let row = next_step_row(m, &mut cache, row)?;
                    let path = std::env::temp_dir()
                        .join(format!("archgen-bench-nodes-{}.dot", std::process::id()));
                    write_dot(&row, &path)?;
                    let dot = std::fs::read_to_string(&path).map_err(|e| e.to_string());
                    let _ = std::fs::remove_file(&path);
                    let by_op = nodes_by_op(&dot?);
                    row.eval().map_err(|e| e.to_string())?;
                    let total: usize = by_op.values().sum();
                    last = Some(row);
                    reply(json!({ "nodes": total, "by_op": by_op }));
                }
                Some("dot") => {
                    let (logits, file) = match (words.get(1).copied(), words.len()) {
                        (Some("prefill"), 4) => {
                            cache = m.make_cache();
                            (prefill_logits(m, &mut cache, &prompt(m, num(2)?))?, words[3])
                        }
                        (Some("step"), 3) => {
                            let row = last.as_ref().ok_or("dot step before prefill")?;
                            (next_step_row(m, &mut cache, row)?, words[2])
                        }
                        _ => {
                            return Err(format!(
                                "bad command '{line}': expected 'dot prefill N FILE' or 'dot step FILE'"
                            ))
                        }
                    };
                    let path = PathBuf::from(file);
                    write_dot(&logits, &path)?;
                    let dot = std::fs::read_to_string(&path)
                        .map_err(|e| format!("cannot read back {}: {e}", path.display()))?;
                    let total: usize = nodes_by_op(&dot).values().sum();
                    logits.eval().map_err(|e| e.to_string())?;
                    last = Some(match logits.ndim() {
                        // prefill: [N, vocab] -> the last row
                        2 => logits.try_index(-1).map_err(|e| e.to_string())?,
                        _ => logits,
                    });
                    reply(json!({ "dot": file, "nodes": total }));
                }
                Some("batch") => {
                    let (b, p, warm, timed) = (num(1)?, num(2)?, num(3)?, num(4)?);
                    if b == 0 || p == 0 {
                        return Err(format!("bad command '{line}': B and P must be at least 1"));
                    }
                    // A model without a batched forward is an answer, not a
                    // crash: the driver reports it and goes on.
                    match m.batched() {
                        None => reply(json!({
                            "error": format!(
                                "{}: no batched forward (CausalLm::batched is None; \
                                 generated models do not implement BatchLm yet)",
                                self.name
                            )
                        })),
                        Some(batched) => {
                            let run = batched_steps(batched, b, p, warm, timed)
                                .map_err(|e| e.to_string())?;
                            reply(json!({
                                "batch": b,
                                "fill_s": run.fill_s,
                                "steps_s": run.steps_s,
                                "tokens": run.tokens,
                            }));
                        }
                    }
                }
                Some("batch-parts") => {
                    let (b, p, warm, timed) = (num(1)?, num(2)?, num(3)?, num(4)?);
                    if b == 0 || p == 0 {
                        return Err(format!("bad command '{line}': B and P must be at least 1"));
                    }
                    match m.batched() {
                        None => reply(json!({
                            "error": format!("{}: no batched forward", self.name)
                        })),
                        Some(batched) => {
                            let parts = batched_step_parts(batched, b, p, warm, timed)
                                .map_err(|e| e.to_string())?;
                            reply(json!({
                                "batch": b,
                                "build_s": parts.build_s,
                                "eval_s": parts.eval_s,
                                "nodes": parts.nodes,
                                "by_op": parts.by_op,
                            }));
                        }
                    }
                }
                Some("quit") | None => break,
                Some(other) => return Err(format!("unknown command '{other}'")),
            }
        }
        Ok(())
    }
}

/// The `[1, n]` prompt of the parity tests for `m`'s vocabulary.
fn prompt<M: CausalLm>(m: &M, n: usize) -> Array {
    Array::from_slice(&prompt_ids(n, m.vocab_size()), &[1, n as i32])
}

/// The unevaluated logits [N, vocab] of a forward over `ids` on `cache`.
fn prefill_logits<M: CausalLm>(m: &M, cache: &mut M::Cache, ids: &Array) -> Result<Array, String> {
    m.forward(ids, cache)
        .and_then(|l| l.try_index(0))
        .map_err(|e| e.to_string())
}

/// The unevaluated logits row of one greedy step after `row` on `cache`.
fn next_step_row<M: CausalLm>(m: &M, cache: &mut M::Cache, row: &Array) -> Result<Array, String> {
    let tok = argmax(row).map_err(|e| e.to_string())?;
    m.forward(&Array::from_slice(&[tok], &[1, 1]), cache)
        .and_then(|l| l.try_index((0, -1)))
        .map_err(|e| e.to_string())
}

/// `W + S` pipelined decode steps from the logits `row` of the previous
/// forward: returns the times of the last S steps, the W + S tokens fed and
/// the last logits row (evaluated).
fn pipelined_steps<M: CausalLm>(
    m: &M,
    cache: &mut M::Cache,
    row: &Array,
    warm: usize,
    timed: usize,
) -> archgen_runtime::ops::Result<(Vec<f64>, Vec<i32>, Array)> {
    use archgen_runtime::mlx_rs::transforms::async_eval;
    // argmax as an int32 [1, 1] array: the next step's input, unevaluated.
    let lazy_token = |row: &Array| -> archgen_runtime::ops::Result<Array> {
        archgen_runtime::mlx_rs::ops::indexing::argmax_axis(row, -1, false)?
            .as_dtype(archgen_runtime::Dtype::Int32)?
            .reshape(&[1, 1])
    };
    let value = |t: &Array| {
        t.try_item_exact::<i32>()
            .map_err(|e| archgen_runtime::mlx_rs::error::Exception::custom(e.to_string()))
    };
    let total = warm + timed;
    if total == 0 {
        return Ok((Vec::new(), Vec::new(), row.clone()));
    }
    let mut token = lazy_token(row)?;
    async_eval([&token])?;
    let mut last = row.clone();
    let (mut intervals, mut tokens) = (Vec::with_capacity(total), Vec::with_capacity(total));
    let mut since = Instant::now();
    for i in 0..total {
        let next_row = m.forward(&token, cache)?.try_index((0, -1))?;
        let next = lazy_token(&next_row)?;
        async_eval([&next_row, &next])?;
        // Waits for the previous step; the step just queued runs meanwhile.
        tokens.push(value(&token)?);
        if i > 0 {
            intervals.push(since.elapsed().as_secs_f64());
            since = Instant::now();
        }
        last = next_row;
        token = next;
    }
    // The last step's token.
    value(&token)?;
    last.eval()?;
    intervals.push(since.elapsed().as_secs_f64());
    Ok((intervals.split_off(warm), tokens, last))
}

/// `W + S` decode steps one at a time, as the change log's CPU runs 1-11
/// measured them (docs/benchmarks.md): each step is a forward plus the
/// evaluation of its logits row, timed alone; the next token is the argmax
/// of that row, taken outside the timed span. Kept so that later runs can
/// be set beside those results.
fn sequential_steps<M: CausalLm>(
    m: &M,
    cache: &mut M::Cache,
    row: &Array,
    warm: usize,
    timed: usize,
) -> archgen_runtime::ops::Result<(Vec<f64>, Vec<i32>, Array)> {
    let mut last = row.clone();
    let (mut times, mut tokens) = (Vec::with_capacity(timed), Vec::with_capacity(warm + timed));
    for i in 0..warm + timed {
        // `archgen logits`' argmax of an evaluated row.
        let tok = argmax(&last)?;
        tokens.push(tok);
        let x = Array::from_slice(&[tok], &[1, 1]);
        let t = Instant::now();
        let next = m.forward(&x, cache)?.try_index((0, -1))?;
        next.eval()?;
        if i >= warm {
            times.push(t.elapsed().as_secs_f64());
        }
        last = next;
    }
    Ok((times, tokens, last))
}

/// What `batch B P W S` measured.
struct BatchRun {
    /// From the first join to the first step that returned a token for all
    /// B sequences (their prefills and the generation batch's first steps).
    fill_s: f64,
    /// The S timed steps' intervals.
    steps_s: Vec<f64>,
    /// Each timed step's greedy tokens, in sequence (join) order.
    tokens: Vec<Vec<i32>>,
}

/// `batch B P W S` (see the module comment): B sequences through one
/// `BatchSession` as `archgen serve` drives it, timed per step once all B
/// are in the generation batch.
fn batched_steps(
    m: &dyn BatchLm,
    b: usize,
    p: usize,
    warm: usize,
    timed: usize,
) -> archgen_runtime::ops::Result<BatchRun> {
    let fail = |what: String| archgen_runtime::mlx_rs::error::Exception::custom(what);
    let vocab = i64::from(m.vocab_size());
    // Room for all B in the generation batch (its default holds 32), as
    // `archgen serve --max-batch B` gives.
    let defaults = BatchConfig::default();
    let config = BatchConfig {
        completion_batch_size: defaults.completion_batch_size.max(b),
        ..defaults
    };
    let mut session = BatchSession::new(m, config);
    // A budget no sequence reaches before the timed steps end: the first
    // sequences start generating while later ones still prefill (at most
    // one step per prefill chunk and per admission of 8), so they have
    // returned fewer than `p + b` tokens when the last one starts.
    let budget = warm + timed + p + b + 8;
    let mut seqs: Vec<SeqId> = Vec::with_capacity(b);
    let started = Instant::now();
    for j in 0..b as i64 {
        let ids: Vec<i32> = (0..p as i64)
            .map(|i| ((i * 37 + 11 + 101 * j) % vocab) as i32)
            .collect();
        seqs.push(session.join(&ids, budget)?);
    }
    let mut steps = 0;
    while session.step()?.len() < b {
        steps += 1;
        if steps > budget {
            return Err(fail(format!(
                "batch {b}: not all sequences were generating after {steps} steps"
            )));
        }
    }
    let fill_s = started.elapsed().as_secs_f64();
    let (mut steps_s, mut tokens) = (Vec::with_capacity(timed), Vec::with_capacity(timed));
    let mut since = Instant::now();
    for i in 0..warm + timed {
        let out = session.step()?;
        let elapsed = since.elapsed().as_secs_f64();
        since = Instant::now();
        if out.len() != b || out.iter().any(|o| o.finished) {
            return Err(fail(format!(
                "batch {b}: step {i} returned {} tokens (finished: {}), expected {b} running",
                out.len(),
                out.iter().filter(|o| o.finished).count()
            )));
        }
        if i >= warm {
            steps_s.push(elapsed);
            let mut row = vec![0; b];
            for o in &out {
                let at = seqs
                    .iter()
                    .position(|s| *s == o.seq)
                    .ok_or_else(|| fail(format!("batch {b}: unknown sequence {:?}", o.seq)))?;
                row[at] = o.token;
            }
            tokens.push(row);
        }
    }
    for seq in seqs {
        session.leave(seq)?;
    }
    Ok(BatchRun {
        fill_s,
        steps_s,
        tokens,
    })
}

/// What `batch-parts B P W S` measured.
struct BatchParts {
    /// Per timed step: building the graph (the batched forward, the
    /// logprobs rows and the greedy tokens, as `BatchSession` builds them).
    build_s: Vec<f64>,
    /// Per timed step: evaluating it.
    eval_s: Vec<f64>,
    /// Primitive nodes of one such step's graph, and by op.
    nodes: usize,
    by_op: std::collections::BTreeMap<String, usize>,
}

/// `batch-parts B P W S`: the forward of a batched decode step without the
/// session around it. B prompts of P ids (as `batch`) prefilled in one
/// forward on a fresh batched cache, then W untimed and S timed one-token
/// steps, each built and then evaluated with nothing overlapping, so the
/// two times separate graph building from evaluation; then one more step
/// whose graph is counted before it is evaluated.
fn batched_step_parts(
    m: &dyn BatchLm,
    b: usize,
    p: usize,
    warm: usize,
    timed: usize,
) -> Result<BatchParts, String> {
    use archgen_runtime::mlx_rs::ops::indexing::argmax_axis;
    let e = |e: archgen_runtime::mlx_rs::error::Exception| e.to_string();
    let vocab = i64::from(m.vocab_size());
    let mut cache = m.make_batch_cache(b).map_err(e)?;
    let mut ids = Vec::with_capacity(b * p);
    for j in 0..b as i64 {
        ids.extend((0..p as i64).map(|i| ((i * 37 + 11 + 101 * j) % vocab) as i32));
    }
    let logits = m
        .forward_batch(&Array::from_slice(&ids, &[b as i32, p as i32]), &mut cache)
        .map_err(e)?;
    let mut tokens = argmax_axis(&logits.try_index((.., -1, ..)).map_err(e)?, -1, false)
        .and_then(|t| t.as_dtype(archgen_runtime::Dtype::Int32))
        .map_err(e)?;
    tokens.eval().map_err(e)?;
    cache.eval().map_err(e)?;
    // `sample_next`'s graph: logits, logprobs rows, greedy tokens.
    let step = |cache: &mut archgen_runtime::batch::BatchCache,
                tokens: &Array|
     -> archgen_runtime::ops::Result<(Array, Vec<Array>)> {
        let logits = m.forward_batch(&tokens.reshape(&[b as i32, 1])?, cache)?;
        let logits = logits.try_index((.., -1, ..))?;
        let logprobs = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
        let next = argmax_axis(&logprobs, -1, false)?.as_dtype(archgen_runtime::Dtype::Int32)?;
        let rows = (0..b as i32)
            .map(|i| logprobs.try_index(i))
            .collect::<archgen_runtime::ops::Result<Vec<Array>>>()?;
        Ok((next, rows))
    };
    let (mut build_s, mut eval_s) = (Vec::new(), Vec::new());
    for i in 0..warm + timed {
        let t = Instant::now();
        let (next, rows) = step(&mut cache, &tokens).map_err(e)?;
        let built = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut outputs: Vec<&Array> = rows.iter().collect();
        outputs.push(&next);
        archgen_runtime::mlx_rs::transforms::eval(outputs).map_err(e)?;
        cache.eval().map_err(e)?;
        if i >= warm {
            build_s.push(built);
            eval_s.push(t.elapsed().as_secs_f64());
        }
        tokens = next;
    }
    let (next, _) = step(&mut cache, &tokens).map_err(e)?;
    let path = std::env::temp_dir().join(format!("archgen-bench-batch-{}.dot", std::process::id()));
    write_dot(&next, &path)?;
    let dot = std::fs::read_to_string(&path).map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    let by_op = nodes_by_op(&dot?);
    next.eval().map_err(e)?;
    Ok(BatchParts {
        build_s,
        eval_s,
        nodes: by_op.values().sum(),
        by_op: by_op.into_iter().collect(),
    })
}

/// Writes the unevaluated graph behind `out` to `path` as DOT, with MLX's
/// `export_to_dot` (the Python worker calls `mx.export_to_dot`, the same code).
fn write_dot(out: &Array, path: &std::path::Path) -> Result<(), String> {
    extern "C" {
        fn fopen(
            path: *const std::ffi::c_char,
            mode: *const std::ffi::c_char,
        ) -> *mut std::ffi::c_void;
        fn fclose(f: *mut std::ffi::c_void) -> i32;
    }
    let cpath = std::ffi::CString::new(path.to_string_lossy().as_bytes())
        .map_err(|_| format!("{}: a path with a NUL byte", path.display()))?;
    // SAFETY: `f` is checked non-null and closed once; the vector and namer
    // are created and freed here; `out` outlives the call.
    let status = unsafe {
        let f = fopen(cpath.as_ptr(), c"w".as_ptr());
        if f.is_null() {
            return Err(format!("cannot write {}", path.display()));
        }
        let outputs = mlx_sys::mlx_vector_array_new_data(&out.as_ptr(), 1);
        let namer = mlx_sys::mlx_node_namer_new();
        let status = mlx_sys::mlx_export_to_dot(f.cast(), namer, outputs);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(outputs);
        fclose(f);
        status
    };
    if status != 0 {
        return Err(format!(
            "mlx_export_to_dot failed writing {}",
            path.display()
        ));
    }
    Ok(())
}

/// Primitive nodes (by operation) of a DOT graph from `write_dot`: what a
/// step schedules on the stream.
fn nodes_by_op(dot: &str) -> std::collections::BTreeMap<String, usize> {
    let mut by_op = std::collections::BTreeMap::new();
    for line in dot.lines() {
        if let Some(rest) = line.split("[label =\"").nth(1) {
            if line.contains("shape=rectangle") {
                let op = rest.split('"').next().unwrap_or("?");
                *by_op.entry(op.to_string()).or_insert(0) += 1;
            }
        }
    }
    by_op
}

pub fn main(args: &[String]) -> ExitCode {
    let (mut which, mut dir) = (None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--impl" => which = it.next().cloned(),
            "--model" => dir = it.next().map(PathBuf::from),
            _ => {}
        }
    }
    let (Some(which), Some(dir)) = (which, dir) else {
        eprintln!("usage: archgen-bench worker --impl generated|monolith --model DIR");
        return ExitCode::from(2);
    };
    // Read here, not at the first step, so a value the runtime cannot read
    // stops the worker instead of running the defaults under a variant's name.
    let choices = match DecodeChoices::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("archgen-bench: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(fixed) = set_decode_choices(choices) {
        eprintln!("archgen-bench: decode choices were fixed before the worker set them: {fixed:?}");
        return ExitCode::FAILURE;
    }
    let started = Instant::now();
    let result = match which.as_str() {
        "generated" => archgen_checkpoint::read_dir(&dir)
            .map_err(|e| e.to_string())
            .and_then(|(arch, weights)| {
                let fingerprint = archgen_plan::fingerprint(&arch);
                let task = Worker {
                    name: "generated",
                    started,
                    choices,
                };
                match archgen_generated::run(&fingerprint, weights, task) {
                    Some(r) => r.map_err(|e| e.to_string()).and_then(|r| r),
                    None => Err(format!("no generated model has fingerprint {fingerprint}")),
                }
            }),
        "monolith" => archgen_monolith::load_dir(&dir)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                Worker {
                    name: "monolith",
                    started,
                    choices,
                }
                .run(&m)
            }),
        other => Err(format!("unknown --impl '{other}'")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("archgen-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
