//! The benchmark driver: builds (or reuses) a checkpoint per spec, starts one
//! worker per implementation on it, and alternates them round by round
//! (generated, monolith, mlx-lm, generated, ...), then reports.

use std::io::{BufRead, BufReader, IsTerminal, Write};

use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

use crate::plan::{Plan, StepMode, IMPLS};
use crate::report;
use crate::results::{median, Cell, Machine, SpecResult};

pub const USAGE: &str = "\
usage: archgen-bench run [--quick] [--quiet] [--sequential] [--spec NAME]... [--cache-dir DIR]
                         [--json FILE] [--doc FILE --svg FILE] [--extra FILE]
       archgen-bench worker --impl generated|monolith --model DIR

run: checkpoints into --cache-dir (default target/bench-cache, reused when the
     spec's config.json is unchanged), three workers per spec alternating
     round by round, results to --json, the results section of --doc (between
     its markers) and --svg; the ratio lines are printed last.
     --quick: gemma4-12b-tiny at cache 128 only, 2 rounds of 3 steps.
     --spec: bench these specs instead of the plan's (repeatable).
     --extra: JSON from `cargo xtask bench` (gen and compile timings).
     --sequential: decode steps one at a time (forward + eval of the logits
     row timed alone), as the change log's CPU runs 1-11 were measured,
     instead of pipelined as mlx-lm's generate_step; not with --doc.
     --quiet: no progress bar (there is none either when stderr is not a terminal).";

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

pub fn venv_python() -> PathBuf {
    std::env::var_os("ARCHGEN_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv"))
        .join("bin/python")
}

/// The line the bench prints last, per spec and cache length.
pub fn ratio_line(spec: &str, cache: usize, cells: &[Cell]) -> String {
    let m: Vec<f64> = cells.iter().map(|c| median(&c.steps())).collect();
    format!(
        "ratio spec={spec} cache={cache} gen/mono={:.3} gen/mlx-lm={:.3}",
        m[0] / m[1],
        m[0] / m[2]
    )
}

/// cache_dir/NAME/model: a random bf16 checkpoint with the spec's structure
/// (tests/python/make_checkpoint.py), rebuilt only when its config changed.
/// Returns the model dir and the parameter count.
pub fn checkpoint(cache_dir: &Path, name: &str) -> Result<(PathBuf, u64), String> {
    let spec_path = repo_root().join("specs").join(format!("{name}.yaml"));
    let spec = archgen_families::load(&spec_path).map_err(|d| d.to_string())?;
    let params = spec.lower().param_count();
    let config = serde_json::to_string_pretty(&archgen_families::to_config_json(&spec))
        .map_err(|e| e.to_string())?;
    // A quantized spec's checkpoint is quantized by mlx-lm's own convert path
    // (its quant_predicate writes the per-module overrides the spec lists):
    // unquantized experts would run only in float32 on the CPU.
    let quantize: Vec<String> = match spec.quantization() {
        None => Vec::new(),
        Some(q) => match q.default.mode {
            archgen_ir::QuantMode::Affine => vec![
                "--quantize".to_string(),
                q.default.bits.to_string(),
                "--group-size".to_string(),
                q.default.group_size.to_string(),
            ],
            other => {
                return Err(format!(
                    "{name}: the bench builds affine checkpoints only, not {}",
                    other.as_str()
                ))
            }
        },
    };
    // The reuse stamp: the config.json, plus the quantization when there is one.
    let config = if quantize.is_empty() {
        config
    } else {
        format!("{config}\n{}", quantize.join(" "))
    };
    let dir = cache_dir.join(name);
    let model = dir.join("model");
    let stamp = dir.join("config.input.json");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(config.as_str())
        && model.join("config.json").is_file()
    {
        return Ok((model, params));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _ = std::fs::remove_dir_all(&model);
    let input = dir.join("config.hf.json");
    let hf = serde_json::to_string_pretty(&archgen_families::to_config_json(&spec))
        .map_err(|e| e.to_string())?;
    std::fs::write(&input, &hf).map_err(|e| e.to_string())?;
    eprintln!("bench: building checkpoint {}", model.display());
    let status = Command::new(venv_python())
        .arg(repo_root().join("tests/python/make_checkpoint.py"))
        .arg("--config")
        .arg(&input)
        .arg("--out")
        .arg(&model)
        .args(["--seed", "1", "--dtype", "bfloat16"])
        .args(&quantize)
        .status()
        .map_err(|e| format!("cannot start {}: {e}", venv_python().display()))?;
    if !status.success() {
        return Err(format!("make_checkpoint.py failed for {name} ({status})"));
    }
    std::fs::write(&stamp, &config).map_err(|e| e.to_string())?;
    Ok((model, params))
}

struct Worker {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(name: &'static str, model: &Path) -> Result<(Self, Value), String> {
        let mut cmd = if name == "mlx-lm" {
            let mut c = Command::new(venv_python());
            c.arg(repo_root().join("tests/python/bench_mlx_lm.py"));
            c
        } else {
            let mut c = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
            c.args(["worker", "--impl", name]);
            c
        };
        let mut child = cmd
            .arg("--model")
            .arg(model)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the {name} worker: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut w = Worker {
            name,
            child,
            stdin,
            stdout,
        };
        let ready = w.read()?;
        Ok((w, ready))
    }

    fn read(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("the {} worker exited early", self.name));
        }
        serde_json::from_str(&line).map_err(|e| format!("{} worker said {line:?}: {e}", self.name))
    }

    fn ask(&mut self, command: &str) -> Result<Value, String> {
        writeln!(self.stdin, "{command}")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| format!("{} worker: {e}", self.name))?;
        self.read()
    }

    fn finish(mut self) -> Result<(), String> {
        let _ = writeln!(self.stdin, "quit");
        drop(self.stdin);
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("the {} worker failed ({status})", self.name))
        }
    }
}

fn seconds(v: &Value, key: &str) -> Result<f64, String> {
    v[key]
        .as_f64()
        .filter(|t| t.is_finite())
        .ok_or_else(|| format!("no finite '{key}' in {v}"))
}

/// Runs `plan` on one spec: three workers, alternating every round.
/// `bar` counts rounds (hidden when stderr is not a terminal or with --quiet).
pub fn bench_spec(
    plan: &Plan,
    name: &str,
    model: &Path,
    params: u64,
    versions: &mut (String, String),
    bar: &ProgressBar,
) -> Result<SpecResult, String> {
    let mut workers = Vec::new();
    let mut load = Vec::new();
    for which in IMPLS {
        let (w, ready) = Worker::start(which, model)?;
        load.push((seconds(&ready, "load_s")?, ready["vmhwm_kb"].as_u64()));
        if let Some(v) = ready["mlx"].as_str() {
            versions.0 = v.to_string();
        }
        if let Some(v) = ready["mlx_lm"].as_str() {
            versions.1 = v.to_string();
        }
        workers.push(w);
    }
    let mut cells = Vec::new();
    for &cache in &plan.caches {
        let mut row = vec![Cell::default(); IMPLS.len()];
        for round in 0..plan.rounds {
            let mut fed: Option<Value> = None;
            for (w, cell) in workers.iter_mut().zip(row.iter_mut()) {
                if round == 0 || cache <= plan.reprefill_up_to {
                    let r = w.ask(&format!("prefill {cache}"))?;
                    cell.prefill_s.push(seconds(&r, "prefill_s")?);
                }
                let r = w.ask(&format!(
                    "steps {} {} {}",
                    plan.warmup,
                    plan.steps,
                    plan.step_mode.word()
                ))?;
                let times: Vec<f64> = r["steps_s"]
                    .as_array()
                    .ok_or_else(|| format!("no steps_s in {r}"))?
                    .iter()
                    .map(|t| t.as_f64().filter(|t| t.is_finite()))
                    .collect::<Option<_>>()
                    .ok_or_else(|| format!("a step time is not finite in {r}"))?;
                if times.len() != plan.steps {
                    return Err(format!("{} gave {} step times", w.name, times.len()));
                }
                cell.rounds.push(times);
                // Bit-exact implementations feed the same greedy tokens.
                match &fed {
                    None => fed = Some(r["tokens"].clone()),
                    Some(t) if *t == r["tokens"] => {}
                    Some(t) => {
                        return Err(format!(
                            "{name} cache={cache} round {round}: {} fed tokens {} but generated fed {t}",
                            w.name, r["tokens"]
                        ))
                    }
                }
            }
            bar.suspend(|| {
                eprintln!(
                    "bench: {name} cache={cache} round {}/{}: decode medians {}",
                    round + 1,
                    plan.rounds,
                    IMPLS
                        .iter()
                        .zip(&row)
                        .map(|(i, c)| format!(
                            "{i} {:.3} ms",
                            1e3 * median(c.rounds.last().unwrap())
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            });
            bar.inc(1);
        }
        // After the timed rounds: one more step each, its graph counted.
        for (w, cell) in workers.iter_mut().zip(row.iter_mut()) {
            cell.nodes = w.ask("nodes")?["nodes"].as_u64();
        }
        cells.push((cache, row));
    }
    for w in workers {
        w.finish()?;
    }
    Ok(SpecResult {
        spec: name.to_string(),
        params,
        load,
        cells,
    })
}

/// A bar over the timed rounds of the whole run; hidden (draws nothing)
/// when stderr is not a terminal or with --quiet.
fn rounds_bar(rounds: u64, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(rounds);
    bar.set_style(
        ProgressStyle::with_template("bench [{bar:30}] round {pos}/{len} {msg} {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn machine_cpu() -> (String, usize) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = info
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cores = info.lines().filter(|l| l.starts_with("processor")).count();
    (cpu, cores)
}

pub fn main(args: &[String]) -> Result<(), String> {
    let (mut quick, mut quiet, mut sequential) = (false, false, false);
    let root = repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let mut cache_dir = target.join("bench-cache");
    let (mut json_out, mut doc, mut svg, mut extra) = (None, None, None, None);
    let mut specs: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut path = || {
            it.next()
                .map(PathBuf::from)
                .ok_or_else(|| format!("{a} needs a path\n\n{USAGE}"))
        };
        match a.as_str() {
            "--quick" => quick = true,
            "--quiet" => quiet = true,
            "--sequential" => sequential = true,
            "--cache-dir" => cache_dir = path()?,
            "--json" => json_out = Some(path()?),
            "--doc" => doc = Some(path()?),
            "--svg" => svg = Some(path()?),
            "--extra" => extra = Some(path()?),
            "--spec" => specs.push(
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("--spec needs a spec name\n\n{USAGE}"))?,
            ),
            other => return Err(format!("unknown option '{other}'\n\n{USAGE}")),
        }
    }
    let mut plan = if quick { Plan::quick() } else { Plan::full() };
    if sequential {
        if doc.is_some() {
            return Err(format!(
                "--sequential measures the earlier way and cannot write the results section (--doc)\n\n{USAGE}"
            ));
        }
        plan.step_mode = StepMode::Sequential;
    }
    if !specs.is_empty() {
        plan.specs = specs;
    }
    let (cpu, cores) = machine_cpu();
    let load_before = loadavg();
    let mut versions = (String::from("unknown"), String::from("unknown"));
    let mut results = Vec::new();
    let rounds = plan.specs.len() * plan.caches.len() * plan.rounds;
    let bar = rounds_bar(rounds as u64, quiet);
    for name in &plan.specs {
        let (model, params) = bar.suspend(|| checkpoint(&cache_dir, name))?;
        bar.set_message(name.clone());
        results.push(bench_spec(
            &plan,
            name,
            &model,
            params,
            &mut versions,
            &bar,
        )?);
    }
    bar.finish_and_clear();
    let machine = Machine {
        cpu,
        cores,
        mlx: versions.0,
        mlx_lm: versions.1,
        load_before,
        load_after: loadavg(),
    };
    let extra: Value = match &extra {
        Some(p) => std::fs::read_to_string(p)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .ok_or_else(|| format!("cannot read {}", p.display()))?,
        None => Value::Null,
    };
    if let Some(p) = &json_out {
        let v = report::to_json(&plan, &machine, &results, &extra);
        std::fs::write(p, serde_json::to_string_pretty(&v).unwrap())
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &svg {
        std::fs::write(p, report::svg(&results)).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &doc {
        let section = report::markdown(&plan, &machine, &results, &extra, svg.as_deref());
        report::write_section(p, &section)?;
    }
    eprintln!("{}", report::summary(&results));
    // Last: one line per spec and cache length.
    for r in &results {
        for (cache, cells) in &r.cells {
            println!("{}", ratio_line(&r.spec, *cache, cells));
        }
    }
    Ok(())
}
