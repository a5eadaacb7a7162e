//! Seeded sampling against mlx-lm 0.32.2: `archgen generate --seed S` draws
//! the tokens `generate_step` draws after `mx.random.seed(S)` with the same
//! `make_sampler` and `make_logits_processors` (tests/python/sampling_oracle.py),
//! for plain temperature, each filter and each processor; a run without a
//! seed reports a fresh one that replays it; bad settings are usage errors.

use std::path::Path;
use std::process::{Command, Output};

use archgen_tests::{repo_root, run_python};
use serde_json::{json, Value};

fn archgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_archgen"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A random-weight Qwen3 (vocab 512, bf16) written by `archgen init`. Its
/// distributions are peaked (random weights), so the cases sample at
/// temperatures near 3, where each setting moves the tokens.
fn tiny_model(root: &Path) -> String {
    let dir = root.join("qwen3-tiny");
    let spec = repo_root().join("specs/qwen3-0.6b-tiny.yaml");
    let o = archgen(&[
        "init",
        "--spec",
        spec.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--seed",
        "9",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    dir.display().to_string()
}

const PROMPT: &str = "1,2,3,1,2,3,4,5";
const MAX_TOKENS: usize = 12;

/// The token ids `archgen generate` prints for these extra flags.
fn generate(model: &str, extra: &[&str]) -> (Vec<i64>, String) {
    let max_tokens = MAX_TOKENS.to_string();
    let mut args = vec![
        "generate",
        "--model",
        model,
        "--prompt-ids",
        PROMPT,
        "--max-tokens",
        &max_tokens,
        "--ignore-eos",
    ];
    args.extend_from_slice(extra);
    let o = archgen(&args);
    assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
    let ids = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    (ids, stderr(&o))
}

/// One case: archgen's flags and the oracle's settings for them.
struct Case {
    name: &'static str,
    flags: &'static [&'static str],
    oracle: Value,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "temperature",
            flags: &["--temp", "2.7", "--seed", "7"],
            oracle: json!({"seed": 7, "temp": 2.7}),
        },
        Case {
            name: "temperature, another seed",
            flags: &["--temp", "2.7", "--seed", "8"],
            oracle: json!({"seed": 8, "temp": 2.7}),
        },
        Case {
            name: "top_p",
            flags: &["--temp", "3", "--top-p", "0.6", "--seed", "7"],
            oracle: json!({"seed": 7, "temp": 3.0, "top_p": 0.6}),
        },
        Case {
            name: "top_k",
            flags: &["--temp", "2.3", "--top-k", "3", "--seed", "7"],
            oracle: json!({"seed": 7, "temp": 2.3, "top_k": 3}),
        },
        Case {
            name: "min_p, min_tokens_to_keep",
            flags: &[
                "--temp",
                "3.1",
                "--min-p",
                "0.6",
                "--min-tokens-to-keep",
                "3",
                "--seed",
                "7",
            ],
            oracle: json!({"seed": 7, "temp": 3.1, "min_p": 0.6, "min_tokens_to_keep": 3}),
        },
        Case {
            name: "repetition, presence and frequency penalties",
            flags: &[
                "--temp",
                "2.7",
                "--repetition-penalty",
                "1.7",
                "--repetition-context-size",
                "6",
                "--presence-penalty",
                "0.9",
                "--presence-context-size",
                "11",
                "--frequency-penalty",
                "0.45",
                "--seed",
                "7",
            ],
            oracle: json!({"seed": 7, "temp": 2.7,
                "repetition_penalty": 1.7, "repetition_context_size": 6,
                "presence_penalty": 0.9, "presence_context_size": 11,
                "frequency_penalty": 0.45}),
        },
        Case {
            name: "logit_bias",
            flags: &[
                "--temp",
                "2.7",
                "--logit-bias",
                "17=2.5,200=-100",
                "--logit-bias",
                "42=1.75",
                "--seed",
                "7",
            ],
            oracle: json!({"seed": 7, "temp": 2.7,
                "logit_bias": {"17": 2.5, "200": -100.0, "42": 1.75}}),
        },
        Case {
            name: "greedy with processors",
            flags: &[
                "--repetition-penalty",
                "3",
                "--frequency-penalty",
                "0.5",
                "--logit-bias",
                "9=1.5",
            ],
            oracle: json!({"seed": 0, "temp": 0.0, "repetition_penalty": 3.0,
                "frequency_penalty": 0.5, "logit_bias": {"9": 1.5}}),
        },
        Case {
            name: "every filter and processor at once",
            flags: &[
                "--temp",
                "2.9",
                "--top-p",
                "0.9",
                "--min-p",
                "0.1",
                "--top-k",
                "30",
                "--repetition-penalty",
                "2",
                "--repetition-context-size",
                "3",
                "--presence-penalty",
                "1.1",
                "--frequency-penalty",
                "0.7",
                "--frequency-context-size",
                "4",
                "--logit-bias",
                "7=3",
                "--seed",
                "3",
            ],
            oracle: json!({"seed": 3, "temp": 2.9, "top_p": 0.9, "min_p": 0.1, "top_k": 30,
                "repetition_penalty": 2.0, "repetition_context_size": 3,
                "presence_penalty": 1.1, "frequency_penalty": 0.7,
                "frequency_context_size": 4, "logit_bias": {"7": 3.0}}),
        },
    ]
}

#[test]
fn seeded_sampling_draws_mlx_lm_generate_step_tokens() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_model(root.path());
    let cases = cases();
    let prompt: Vec<i64> = PROMPT.split(',').map(|t| t.parse().unwrap()).collect();
    let job = json!({
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "cases": cases.iter().map(|c| c.oracle.clone()).collect::<Vec<_>>(),
    });
    let job_path = root.path().join("job.json");
    std::fs::write(&job_path, job.to_string()).unwrap();
    let out = run_python(
        "sampling_oracle.py",
        &[model.as_ref(), job_path.as_os_str()],
    );
    let oracle: Value = serde_json::from_str(out.trim()).unwrap();
    let expected: Vec<Vec<i64>> = serde_json::from_value(oracle["tokens"].clone()).unwrap();
    let mut got = Vec::new();
    for (case, want) in cases.iter().zip(&expected) {
        let (ids, _) = generate(&model, case.flags);
        assert_eq!(&ids, want, "{}: archgen != mlx-lm", case.name);
        got.push(ids);
    }
    // The cases are not vacuous: sampling is not greedy, seeds matter, and
    // each filter or processor changed what plain temperature draws.
    let (greedy, _) = generate(&model, &[]);
    assert_ne!(got[0], greedy, "temperature 2.7 drew the greedy tokens");
    assert_ne!(got[0], got[1], "seeds 7 and 8 drew the same tokens");
    for (i, case) in cases.iter().enumerate().skip(2) {
        let plain = match i {
            7 => &greedy,
            _ => &got[0],
        };
        assert_ne!(&got[i], plain, "{}: no effect on the tokens", case.name);
    }
}

#[test]
fn a_run_without_a_seed_reports_one_that_replays_it() {
    let root = tempfile::tempdir().unwrap();
    let model = tiny_model(root.path());
    let (ids, note) = generate(&model, &["--temp", "1.0", "--top-k", "40"]);
    let seed = note
        .split("seed ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no seed in the status note: {note}"));
    let (replayed, _) = generate(&model, &["--temp", "1.0", "--top-k", "40", "--seed", seed]);
    assert_eq!(ids, replayed, "--seed {seed} did not replay the run");

    // Settings the model's vocabulary rules out: a clean error naming the flag.
    for (flags, expected) in [
        (
            &["--top-k", "512"][..],
            "--top-k: 512 must be below the vocabulary size (512)",
        ),
        (
            &["--logit-bias", "600=1"][..],
            "--logit-bias: token id 600 is out of the vocabulary",
        ),
    ] {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--prompt-ids",
            "1",
            "--temp",
            "1",
        ];
        args.extend_from_slice(flags);
        let o = archgen(&args);
        assert_eq!(o.status.code(), Some(1), "{flags:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(expected), "{flags:?}: {}", stderr(&o));
    }
    // Values no model takes: usage errors before anything runs.
    for (flags, expected) in [
        (&["--min-p", "1.5"][..], "1.5 is outside [0, 1]"),
        (&["--logit-bias", "5"][..], "'5' is not ID=BIAS"),
        (&["--logit-bias", "5=x"][..], "'x' is not a number"),
        (&["--logit-bias", "5=1,5=2"][..], "token 5 is given twice"),
        (&["--repetition-penalty", "-1"][..], "-1 must be >= 0"),
        (
            &["--presence-context-size", "0"][..],
            "--presence-context-size",
        ),
        (&["--min-tokens-to-keep", "0"][..], "--min-tokens-to-keep"),
        (
            &["--frequency-penalty", "inf"][..],
            "must be a finite number",
        ),
    ] {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--prompt-ids",
            "1",
            "--temp",
            "1",
        ];
        args.extend_from_slice(flags);
        let o = archgen(&args);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(expected), "{flags:?}: {}", stderr(&o));
        assert!(
            !stderr(&o).contains("panicked"),
            "{flags:?}: {}",
            stderr(&o)
        );
    }
}
