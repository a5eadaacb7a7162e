//! Reporting: JSON, the docs/benchmarks.md results section, the SVG plot.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::plan::{Plan, IMPLS};
use crate::results::{median, min_max, Cell, Machine, SpecResult};

pub const BEGIN: &str =
    "<!-- bench:results:begin (written by `cargo xtask bench`; edits inside are lost) -->";
pub const END: &str = "<!-- bench:results:end -->";

/// (min, median, max) of `v`.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let (lo, hi) = min_max(v);
    (lo, median(v), hi)
}

/// Per-round ratios of decode-step medians, implementation `a` over `b`.
fn round_ratios(cells: &[Cell], a: usize, b: usize) -> Vec<f64> {
    cells[a]
        .rounds
        .iter()
        .zip(&cells[b].rounds)
        .map(|(x, y)| median(x) / median(y))
        .collect()
}

fn pooled_ratio(cells: &[Cell], a: usize, b: usize) -> f64 {
    median(&cells[a].steps()) / median(&cells[b].steps())
}

fn prefill_tok_s(cell: &Cell, cache: usize) -> Vec<f64> {
    cell.prefill_s.iter().map(|s| cache as f64 / s).collect()
}

pub fn to_json(plan: &Plan, m: &Machine, results: &[SpecResult], extra: &Value) -> Value {
    let specs: Vec<Value> = results
        .iter()
        .map(|r| {
            let impls: Vec<Value> = IMPLS
                .iter()
                .zip(&r.load)
                .map(|(i, (s, kb))| json!({"impl": i, "load_s": s, "vmhwm_kb": kb}))
                .collect();
            let caches: Vec<Value> = r
                .cells
                .iter()
                .map(|(cache, cells)| {
                    let per: Vec<Value> = IMPLS
                        .iter()
                        .zip(cells)
                        .map(|(i, c)| {
                            json!({"impl": i, "prefill_s": c.prefill_s, "steps_s": c.rounds, "nodes": c.nodes})
                        })
                        .collect();
                    json!({
                        "cache": cache,
                        "impls": per,
                        "gen_over_mono": pooled_ratio(cells, 0, 1),
                        "gen_over_mlx_lm": pooled_ratio(cells, 0, 2),
                    })
                })
                .collect();
            json!({"spec": r.spec, "params": r.params, "load": impls, "caches": caches})
        })
        .collect();
    json!({
        "machine": {
            "cpu": m.cpu, "cores": m.cores, "mlx": m.mlx, "mlx_lm": m.mlx_lm,
            "loadavg_before": m.load_before, "loadavg_after": m.load_after,
        },
        "plan": {
            "rounds": plan.rounds, "warmup": plan.warmup, "steps": plan.steps,
            "reprefill_up_to": plan.reprefill_up_to,
        },
        "specs": specs,
        "extra": extra,
    })
}

fn ms3((a, b, c): (f64, f64, f64)) -> String {
    format!("{:.3} / **{:.3}** / {:.3}", a * 1e3, b * 1e3, c * 1e3)
}

fn r3((a, b, c): (f64, f64, f64)) -> String {
    format!("{a:.3} / {b:.3} / {c:.3}")
}

pub fn markdown(
    plan: &Plan,
    m: &Machine,
    results: &[SpecResult],
    extra: &Value,
    svg: Option<&Path>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### Machine\n");
    let _ = writeln!(
        s,
        "- CPU: {} ({} logical cores in /proc/cpuinfo)\n- libmlx {} (the pip wheel `mlx[cpu]`, CPU backend; the Rust build links the same library), mlx-lm {}\n- load average (1/5/15 min) before the run: {}, after: {}\n",
        m.cpu, m.cores, m.mlx, m.mlx_lm, m.load_before, m.load_after
    );
    let _ = writeln!(
        s,
        "{} rounds; in each round generated, monolith, mlx-lm in turn run {} untimed + {} timed decode steps ({} timed steps per implementation and cache length). Cache lengths up to {} are prefilled afresh before every round; longer ones once, before round 1 (they then grow by {} tokens over the rounds).\n",
        plan.rounds,
        plan.warmup,
        plan.steps,
        plan.rounds * plan.steps,
        plan.reprefill_up_to,
        plan.rounds * (plan.warmup + plan.steps)
    );
    let _ = writeln!(s, "### Decode step and prefill\n");
    let _ = writeln!(
        s,
        "| spec | cache | implementation | decode step ms min / **median** / max | graph nodes per step | prefill tokens/s min / median / max (n) |\n|---|---:|---|---|---:|---|"
    );
    for r in results {
        for (cache, cells) in &r.cells {
            for (i, c) in IMPLS.iter().zip(cells) {
                let p = prefill_tok_s(c, *cache);
                let (lo, md, hi) = stats(&p);
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {:.0} / {:.0} / {:.0} ({}) |",
                    r.spec,
                    cache,
                    i,
                    ms3(stats(&c.steps())),
                    c.nodes.map_or("-".to_string(), |n| n.to_string()),
                    lo,
                    md,
                    hi,
                    p.len()
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "\n### Ratios (decode step time; < 1 means generated is faster)\n"
    );
    let _ = writeln!(
        s,
        "Median of all timed steps over median of all timed steps, and the same ratio per round (min / median / max over the rounds).\n\n| spec | cache | gen/mono | per round | gen/mlx-lm | per round | prefill gen/mono | prefill gen/mlx-lm |\n|---|---:|---:|---|---:|---|---:|---:|"
    );
    for r in results {
        for (cache, cells) in &r.cells {
            let pre =
                |a: usize, b: usize| median(&cells[a].prefill_s) / median(&cells[b].prefill_s);
            let _ = writeln!(
                s,
                "| {} | {} | {:.3} | {} | {:.3} | {} | {:.3} | {:.3} |",
                r.spec,
                cache,
                pooled_ratio(cells, 0, 1),
                r3(stats(&round_ratios(cells, 0, 1))),
                pooled_ratio(cells, 0, 2),
                r3(stats(&round_ratios(cells, 0, 2))),
                pre(0, 1),
                pre(0, 2),
            );
        }
    }
    let _ = writeln!(s, "\n### Loading\n");
    let _ = writeln!(
        s,
        "Load = process start to the checkpoint read and one evaluated 1-token forward on a throwaway cache (MLX reads safetensors lazily; the forward makes every implementation read every weight). Peak RSS = the worker's VmHWM (/proc/self/status) at that point; the mlx-lm figures include starting Python and importing mlx-lm.\n\n| spec | parameters | checkpoint | implementation | load s | peak RSS MiB |\n|---|---:|---:|---|---:|---:|"
    );
    for r in results {
        for (i, (secs, kb)) in IMPLS.iter().zip(&r.load) {
            let rss = kb.map_or("?".to_string(), |k| format!("{:.1}", k as f64 / 1024.0));
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} MiB bf16 | {} | {:.3} | {} |",
                r.spec,
                r.params,
                r.params as f64 * 2.0 / (1024.0 * 1024.0),
                i,
                secs,
                rss
            );
        }
    }
    let _ = writeln!(s, "\n### Code generation and compile time\n");
    let field = |k: &str| -> String {
        match &extra[k] {
            Value::Number(n) => format!("{:.2} s", n.as_f64().unwrap_or(f64::NAN)),
            Value::String(t) => t.clone(),
            _ => "not measured".into(),
        }
    };
    let _ = writeln!(
        s,
        "- `cargo xtask gen --all` wall time (cargo's up-to-date xtask build included): {}\n- clean build of the generated crate (`cargo build -p archgen-generated` after `cargo clean -p archgen-generated`, dev profile, own CARGO_TARGET_DIR with its dependencies already built): {}\n",
        field("gen_all_s"),
        field("compile_generated_s")
    );
    if let Some(p) = svg {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        let _ = writeln!(
            s,
            "### Plot\n\n![decode step time relative to mlx-lm]({})\n",
            name.unwrap_or_default()
        );
    }
    s
}

/// Replaces the text between BEGIN and END in `path` (creating the file with
/// just the markers when it does not exist); the rest is kept.
pub fn write_section(path: &Path, section: &str) -> Result<(), String> {
    let old = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => format!("{BEGIN}\n{END}\n"),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let (Some(b), Some(e)) = (old.find(BEGIN), old.find(END)) else {
        return Err(format!(
            "{} lacks the markers {BEGIN} / {END}",
            path.display()
        ));
    };
    if e < b {
        return Err(format!("{}: markers out of order", path.display()));
    }
    let new = format!("{}{BEGIN}\n\n{section}\n{}", &old[..b], &old[e..]);
    std::fs::write(path, new).map_err(|e| format!("{}: {e}", path.display()))
}

/// A few lines for the terminal.
pub fn summary(results: &[SpecResult]) -> String {
    let mut s = String::from("decode step median ms (min..max):");
    for r in results {
        for (cache, cells) in &r.cells {
            let _ = write!(s, "\n  {} cache={}:", r.spec, cache);
            for (i, c) in IMPLS.iter().zip(cells) {
                let (lo, md, hi) = stats(&c.steps());
                let _ = write!(s, " {i} {:.3} ({:.3}..{:.3})", md * 1e3, lo * 1e3, hi * 1e3);
                if let Some(n) = c.nodes {
                    let _ = write!(s, " [{n} nodes]");
                }
            }
        }
    }
    s
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The `q` quantile of `v` (linear interpolation).
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    let pos = q * (s.len() - 1) as f64;
    let (i, frac) = (pos.floor() as usize, pos.fract());
    s[i] + (s[(i + 1).min(s.len() - 1)] - s[i]) * frac
}

/// Grouped bars: per spec and cache length, each implementation's median
/// decode step time relative to mlx-lm's (1.0 = mlx-lm), whiskers the
/// quartiles (min and max are in the table), absolute medians in ms above.
pub fn svg(results: &[SpecResult]) -> String {
    const COLORS: [&str; 3] = ["#1f77b4", "#ff7f0e", "#2ca02c"];
    let groups: Vec<(String, usize, &Vec<Cell>)> = results
        .iter()
        .flat_map(|r| r.cells.iter().map(|(c, cells)| (r.spec.clone(), *c, cells)))
        .collect();
    let rel = |cells: &[Cell], i: usize| -> (f64, f64, f64) {
        let base = median(&cells[2].steps());
        let steps = cells[i].steps();
        let (lo, md, hi) = (
            quantile(&steps, 0.25),
            median(&steps),
            quantile(&steps, 0.75),
        );
        (lo / base, md / base, hi / base)
    };
    let top = groups
        .iter()
        .flat_map(|(_, _, cells)| (0..3).map(|i| rel(cells, i).2))
        .fold(1.0f64, f64::max);
    let ymax = ((top * 1.15) * 2.0).ceil() / 2.0;
    let (left, right, top_pad, bottom) = (60.0, 20.0, 50.0, 70.0);
    let gw = 190.0;
    let width = left + right + gw * groups.len() as f64;
    let height = 380.0;
    let plot_h = height - top_pad - bottom;
    let y = |v: f64| top_pad + plot_h * (1.0 - v.min(ymax) / ymax);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">Decode step time relative to mlx-lm (bars: median, whiskers: quartiles, labels: median ms)</text>"#,
        width / 2.0
    );
    let mut tick = 0.0;
    while tick <= ymax + 1e-9 {
        let ty = y(tick);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{ty:.1}" y2="{ty:.1}" stroke="{}" stroke-width="1"/><text x="{}" y="{:.1}" text-anchor="end">{tick:.1}</text>"##,
            width - right,
            if (tick - 1.0).abs() < 1e-9 {
                "#888"
            } else {
                "#eee"
            },
            left - 6.0,
            ty + 4.0
        );
        tick += 0.5;
    }
    for (g, (spec, cache, cells)) in groups.iter().enumerate() {
        let x0 = left + gw * g as f64 + 25.0;
        for i in 0..3 {
            let (lo, md, hi) = rel(cells, i);
            let bx = x0 + 48.0 * i as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{bx:.1}" y="{:.1}" width="40" height="{:.1}" fill="{}"/>"#,
                y(md),
                y(0.0) - y(md),
                COLORS[i]
            );
            let cx = bx + 20.0;
            let _ = writeln!(
                s,
                r#"<line x1="{cx:.1}" x2="{cx:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/><line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/><line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/>"#,
                y(lo),
                y(hi),
                cx - 6.0,
                cx + 6.0,
                y(lo),
                y(lo),
                cx - 6.0,
                cx + 6.0,
                y(hi),
                y(hi)
            );
            let ms = median(&cells[i].steps()) * 1e3;
            let _ = writeln!(
                s,
                r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="10">{ms:.2}</text>"#,
                y(hi) - 4.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="{:.1}" y="{:.1}" text-anchor="middle">cache {cache}</text>"#,
            x0 + 68.0,
            height - bottom + 18.0,
            esc(spec),
            x0 + 68.0,
            height - bottom + 34.0
        );
    }
    for (i, name) in IMPLS.iter().enumerate() {
        let lx = left + 10.0 + 130.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            height - 22.0,
            COLORS[i],
            lx + 16.0,
            height - 12.0
        );
    }
    s.push_str("</svg>\n");
    s
}
