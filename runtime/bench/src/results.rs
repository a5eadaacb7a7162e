//! What a benchmark run measured (timings per implementation, spec and
//! cache length; the machine) and the statistics over them: filled by the
//! driver, read by the report.

/// Timings of one implementation at one spec and cache length.
#[derive(Default, Clone)]
pub struct Cell {
    /// Seconds per prefill of `cache` tokens.
    pub prefill_s: Vec<f64>,
    /// Seconds per decode step, one Vec per round.
    pub rounds: Vec<Vec<f64>>,
    /// Primitive nodes in one decode step's graph (after the rounds).
    pub nodes: Option<u64>,
}

impl Cell {
    pub fn steps(&self) -> Vec<f64> {
        self.rounds.iter().flatten().copied().collect()
    }
}

pub struct SpecResult {
    pub spec: String,
    pub params: u64,
    /// Per implementation: load seconds and VmHWM (KiB) right after loading.
    pub load: Vec<(f64, Option<u64>)>,
    /// Per cache length, per implementation.
    pub cells: Vec<(usize, Vec<Cell>)>,
}

pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub mlx: String,
    pub mlx_lm: String,
    pub load_before: String,
    pub load_after: String,
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

pub fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}
