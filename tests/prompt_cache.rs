//! The prompt cache's split, byte for byte: a request's cache taken out of
//! the batch when it finishes (`extract`), then a second prompt that extends
//! it prefilled from that cache (`join_cached`: mlx-lm's `_merge_caches` of
//! a given cache), as `archgen serve` runs it over a `BatchSession`, must
//! give what mlx-lm 0.32.2 gives for the same split
//! (tests/python/prompt_cache_oracle.py): its `BatchGenerator` with
//! `insert(..., caches=[cache])` (mlx_lm.server's batched path) and its
//! `generate_step(prompt_cache=...)` (the one-by-one path), logprobs rows
//! and greedy tokens (docs/parity.md, "Prompt cache").
//!
//! The cached request is also admitted in one step with a fresh one and
//! with one from a shorter stored cache (the merge left-pads the shorter
//! cached row; chunks are right-padded), as under load. Mutation check:
//! padding a merged row on the right instead makes `mixed.other` differ on
//! the first three specs (qwen3, gemma4, qwen3.5).
//!
//! One spec per cache kind: full attention (`KVCache`, also trimmed to a
//! shorter prefix as `trim_prompt_cache`), Gemma-4's sliding window
//! (`RotatingKVCache`, window 8: the stored ring has wrapped, so it is only
//! extended, never trimmed) with shared K/V, Qwen3.5's Gated DeltaNet
//! (`ArraysCache`, extended only) and LFM2's short convs (an `ArraysCache`
//! with the conv state alone, beside attention; extended only).

use archgen_runtime::batch::BatchLm;
use archgen_runtime::batch_session::{BatchConfig, BatchSession};
use archgen_runtime::bytes::array_bytes;
use archgen_runtime::seq_cache::SeqCache;
use archgen_runtime::Array;
use archgen_tests::{config_for, repo_root, run_python};
use serde_json::json;

/// (spec, whether its stored cache can be trimmed).
const SPECS: [(&str, bool); 4] = [
    ("qwen3-0.6b-tiny", true),
    ("gemma4-e2b-tiny", false),
    ("qwen3.5-4b-tiny", false),
    ("lfm2-1.2b-tiny", false),
];

const PREFILL_STEP: usize = 4;

fn same(a: &Array, b: &Array) -> bool {
    a.dtype() == b.dtype()
        && a.shape() == b.shape()
        && array_bytes(a).unwrap() == array_bytes(b).unwrap()
}

/// One request alone in `session`: its logprobs rows [n, vocab], tokens,
/// and the cache it finished with.
fn request<M: BatchLm>(
    session: &mut BatchSession<'_, M>,
    prompt: &[i32],
    cache: Option<SeqCache>,
    n: usize,
) -> (Array, Vec<i32>, SeqCache) {
    let seq = match cache {
        Some(cache) => session.join_cached(prompt, cache, n, None).unwrap(),
        None => session.join(prompt, n).unwrap(),
    };
    let (mut rows, mut tokens, mut last) = (Vec::new(), Vec::new(), None);
    for _ in 0..prompt.len() + n + 2 {
        for out in session.step().unwrap() {
            assert_eq!(out.seq, seq);
            rows.push(out.logprobs);
            tokens.push(out.token);
            if out.finished {
                last = Some(out.cache.expect("a kept cache"));
            }
        }
        if session.is_idle() {
            break;
        }
    }
    assert!(session.is_idle(), "the request did not finish");
    let rows = archgen_runtime::mlx_rs::ops::stack(&rows, 0).unwrap();
    (rows, tokens, last.expect("a finished sequence"))
}

/// Three requests joined before the same step (one `_merge_caches` of
/// their caches, given or fresh): each one's rows and tokens, as
/// `mixed.cached`, `mixed.fresh`, `mixed.other`.
fn together<M: BatchLm>(
    session: &mut BatchSession<'_, M>,
    requests: [(&[i32], Option<SeqCache>); 3],
    n: usize,
) -> Vec<(&'static str, Array, Vec<i32>)> {
    let steps: usize = requests.iter().map(|r| r.0.len()).sum::<usize>() + n + 2;
    let seqs: Vec<_> = requests
        .into_iter()
        .map(|(prompt, cache)| match cache {
            Some(cache) => session.join_cached(prompt, cache, n, None).unwrap(),
            None => session.join(prompt, n).unwrap(),
        })
        .collect();
    let mut got: Vec<(Vec<Array>, Vec<i32>)> = vec![Default::default(); 3];
    for _ in 0..steps {
        for out in session.step().unwrap() {
            let i = seqs
                .iter()
                .position(|s| *s == out.seq)
                .expect("a joined sequence");
            got[i].0.push(out.logprobs);
            got[i].1.push(out.token);
        }
        if session.is_idle() {
            break;
        }
    }
    assert!(session.is_idle(), "the requests did not finish");
    ["mixed.cached", "mixed.fresh", "mixed.other"]
        .into_iter()
        .zip(got)
        .map(|(key, (rows, tokens))| {
            (
                key,
                archgen_runtime::mlx_rs::ops::stack(&rows, 0).unwrap(),
                tokens,
            )
        })
        .collect()
}

#[test]
fn a_prompt_from_a_stored_cache_matches_mlx_lm_split() {
    let root = tempfile::tempdir().unwrap();
    let jobs: Vec<serde_json::Value> = SPECS
        .iter()
        .enumerate()
        .map(|(k, (name, _))| {
            let spec =
                archgen_families::load(repo_root().join("specs").join(format!("{name}.yaml")))
                    .unwrap_or_else(|d| panic!("{d}"));
            json!({
                "config": config_for(&spec),
                "out": root.path().join(name),
                "seed": 5100 + k,
                "dtype": "bfloat16",
                "bits": null,
                "group_size": null,
                "kv_quant": null,
                "mixed_kv": null,
                "prompt_ids": [1, 2, 3],
                "decode_steps": 1,
            })
        })
        .collect();
    let jobs_path = root.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    run_python("spec_cases.py", &[jobs_path.as_os_str()]);

    let mut failures = Vec::new();
    for (name, trimmable) in SPECS {
        let model_dir = root.path().join(name).join("model");
        let model = archgen_monolith::load_dir(&model_dir).unwrap();
        let vocab = model.vocab_size();
        let ids =
            |n: i32, seed: i32| -> Vec<i32> { (0..n).map(|i| (i * 31 + seed) % vocab).collect() };
        // The prefix and its answer (9 tokens) pass Gemma-4's window of 8.
        let (prefix, suffix) = (ids(6, 13), ids(5, 71));
        let (k, n, trim) = (3, 4, 2);
        // Admitted in the same step as the cached one (a longer prompt, so
        // the merge pads the cached row and the chunks are right-padded).
        // With them, `suffix` from the cache of a shorter request (the merge
        // left-pads it to the longer cached row).
        let (fresh, other) = (ids(12, 5), ids(3, 101));
        let case = json!({
            "prefix": prefix, "prefix_decode": k, "suffix": suffix, "decode": n,
            "prefill_step_size": PREFILL_STEP, "trim": trim, "fresh": fresh,
            "other_prefix": other,
        });
        let case_path = root.path().join(format!("{name}.case.json"));
        std::fs::write(&case_path, serde_json::to_vec(&case).unwrap()).unwrap();
        let oracle_path = root.path().join(format!("{name}.oracle.safetensors"));
        run_python(
            "prompt_cache_oracle.py",
            &[
                model_dir.as_os_str(),
                case_path.as_os_str(),
                oracle_path.as_os_str(),
            ],
        );
        let oracle = Array::load_safetensors(&oracle_path).unwrap();
        let config = BatchConfig {
            prefill_step_size: PREFILL_STEP,
            ..BatchConfig::default()
        };
        let mut session = BatchSession::new(&model, config);
        session.keep_finished_caches(true);
        let (rows, first, stored) = request(&mut session, &prefix, None, k);
        // The stored sequence is the prefix and every returned token.
        let expected_len = (prefix.len() + k) as i32;
        let mut checks = vec![("batch.first", rows, first.clone())];
        let kept = stored.clone();
        let mixed = stored.clone();
        let (rows, second, _) = request(&mut session, &suffix, Some(stored), n);
        checks.push(("batch.second", rows.clone(), second.clone()));
        // mlx-lm's generate_step split: the same rows on the CPU.
        checks.push(("step.second", rows, second));
        assert_eq!(oracle["cached_tokens"].as_slice::<i32>(), [expected_len]);
        assert_eq!(kept.is_trimmable(), trimmable, "{name}");
        if trimmable {
            let mut cut = kept;
            cut.truncate(expected_len as usize - trim).unwrap();
            let (rows, tokens, _) = request(&mut session, &suffix, Some(cut), n);
            checks.push(("batch.trimmed", rows, tokens));
        } else {
            assert!(
                !oracle.contains_key("batch.trimmed.tokens"),
                "{name}: mlx-lm trimmed a cache archgen calls untrimmable"
            );
        }
        let (rows, other_first, other_cache) = request(&mut session, &other, None, k);
        checks.push(("other.first", rows, other_first));
        let mixed = [
            (&suffix[..], Some(mixed)),
            (&fresh[..], None),
            (&suffix[..], Some(other_cache)),
        ];
        for (key, rows, tokens) in together(&mut session, mixed, n) {
            checks.push((key, rows, tokens));
        }
        let before = failures.len();
        for (key, rows, tokens) in &checks {
            let tokens = Array::from_slice(tokens, &[tokens.len() as i32]);
            for (what, ours) in [("logprobs", rows), ("tokens", &tokens)] {
                if !same(ours, &oracle[&format!("{key}.{what}")]) {
                    failures.push(format!("{name}: {key}.{what}: archgen != mlx-lm"));
                }
            }
        }
        let whole_same = same(&oracle["whole.tokens"], &oracle["step.second.tokens"])
            && same(&oracle["whole.logprobs"], &oracle["step.second.logprobs"]);
        if failures.len() == before {
            eprintln!(
                "{name}: split == mlx-lm (BatchGenerator alone and merged with fresh and cached rows, generate_step{}); \
                 mlx-lm's split {} its whole-prompt prefill",
                if trimmable { ", and trimmed" } else { "" },
                if whole_same { "equals" } else { "differs from" }
            );
        }
    }
    assert!(
        failures.is_empty(),
        "prompt cache parity failures:\n{}",
        failures.join("\n")
    );
}
