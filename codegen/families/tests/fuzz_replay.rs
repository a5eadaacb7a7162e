//! The bounded, stable-toolchain stand-in for `cargo fuzz` (see docs/fuzzing.md):
//! the committed seeds of fuzz/seeds/ plus a few thousand inputs mutated from
//! them with a fixed-seed generator go through exactly the fuzz targets'
//! pipelines (tests/fuzz_support/pipeline.rs). Never a panic, and quick.

use std::path::Path;
use std::time::{Duration, Instant};

#[path = "fuzz_support/pipeline.rs"]
mod pipeline;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds(kind: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(kind);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// Tokens worth splicing in: extremes and YAML/JSON structure.
const TOKENS: &[&str] = &[
    "0",
    "-1",
    "1",
    "4294967296",
    "2147483648",
    "18446744073709551615",
    "1e308",
    "-0.0",
    "NaN",
    ".nan",
    ".inf",
    "null",
    "~",
    "true",
    "[]",
    "{}",
    "&a",
    "*a",
    "<<: *a",
    "\"\"",
    "\t",
    "\n",
    "- ",
    ": ",
    "#",
    "!!str",
    "---",
    "\u{feff}",
    "\u{0}",
    "\"full_attention\"",
    "sliding",
];

fn mutate(rng: &mut Rng, pool: &[Vec<u8>]) -> Vec<u8> {
    let mut v = pool[rng.below(pool.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => v.insert(at, rng.next() as u8),
            2 => {
                let end = (at + rng.below(64)).min(v.len());
                v.drain(at..end);
            }
            3 => {
                let end = (at + rng.below(256)).min(v.len());
                let chunk = v[at..end].to_vec();
                let to = rng.below(v.len() + 1);
                v.splice(to..to, chunk);
            }
            4 => {
                // Replace a number with an extreme one.
                let t = TOKENS[rng.below(6)];
                let start = v[at..].iter().position(u8::is_ascii_digit).map(|p| at + p);
                if let Some(s) = start {
                    let e = s + v[s..].iter().take_while(|b| b.is_ascii_digit()).count();
                    v.splice(s..e, t.bytes());
                }
            }
            _ => {
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(at..at, t.bytes());
            }
        }
    }
    v
}

fn replay(kind: &str, run: fn(&[u8]) -> bool, mutants: usize, seed: u64) -> (usize, usize) {
    let pool = seeds(kind);
    assert!(!pool.is_empty(), "no seeds for {kind}");
    let mut accepted = pool.iter().filter(|s| run(s)).count();
    let mut rng = Rng(seed);
    for _ in 0..mutants {
        let input = mutate(&mut rng, &pool);
        let ok = std::panic::catch_unwind(|| run(&input)).unwrap_or_else(|_| {
            panic!(
                "{kind}: panic on mutated input:\n{}",
                String::from_utf8_lossy(&input)
            )
        });
        accepted += ok as usize;
    }
    (pool.len() + mutants, accepted)
}

/// Replays `kind`'s seeds and 10,000 mutants through `run`: none may panic,
/// some must be accepted (else the seeds or the pipeline are broken), and the
/// whole replay stays within 30 s.
fn replay_within_bound(kind: &str, run: fn(&[u8]) -> bool, seed: u64) {
    let t = Instant::now();
    let (n, ok) = replay(kind, run, 10_000, seed);
    println!("{kind}: {n} inputs, {ok} accepted, {:?}", t.elapsed());
    assert!(
        ok > 0,
        "no {kind} input accepted: the seeds or the pipeline are broken"
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[test]
fn spec_pipeline_replays_seeds_and_mutants() {
    replay_within_bound("spec", pipeline::spec_pipeline, 0x5eed_5bec);
}

#[test]
fn config_import_replays_seeds_and_mutants() {
    replay_within_bound("config", pipeline::config_import, 0xc0f1_6000);
}
