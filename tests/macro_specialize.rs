//! `specialize!` expands to the same model as the checked-in generated file:
//! the same tokens (text-compared after formatting), the same fingerprint,
//! and the same bytes under the logits protocol on a checkpoint.

use archgen_runtime::bytes::array_bytes;
use archgen_runtime::model::{CausalLm, ModelTask};
use archgen_runtime::protocol::{run_logits, LogitsRun};
use archgen_tests::repo_root;

mod user_model {
    archgen_macros::specialize!("../specs/gemma4-walkthrough-tiny.yaml");
}

// A dense-family model expands in a user's crate too.
mod user_llama {
    archgen_macros::specialize!("../specs/llama-3.2-1b-tiny.yaml");
}

#[test]
fn a_dense_expansion_has_the_generated_fingerprint() {
    assert_eq!(
        user_llama::FINGERPRINT,
        archgen_generated::llama_3_2_1b_tiny::FINGERPRINT
    );
}

#[test]
fn expansion_equals_the_checked_in_file() {
    for name in [
        "gemma4-walkthrough-tiny",
        "gemma4-e2b-tiny",
        "gemma4-26b-a4b-tiny-q8",
        "qwen3-8b-tiny",
        "llama-3.2-1b-tiny-q4",
    ] {
        let spec = repo_root().join("specs").join(format!("{name}.yaml"));
        let tokens = archgen_emit::expand(&spec, &format!("specs/{name}.yaml")).unwrap();
        let expanded = archgen_emit::format_rust(tokens).unwrap();
        let file = std::fs::read_to_string(
            repo_root()
                .join("generated/src")
                .join(format!("{}.rs", archgen_emit::module_name(name))),
        )
        .unwrap();
        // The checked-in file is the header, a blank line, then the expansion
        // with line comments (`// ...`, what each line is in mlx-lm's terms)
        // that tokens cannot carry.
        let body = file.split_once("\n\n").map(|(_, b)| b).unwrap();
        let comments = body
            .lines()
            .filter(|l| l.trim_start().starts_with("// "))
            .count();
        assert!(
            comments > 0,
            "{name}: the generated file has no line comments"
        );
        let uncommented: String = body
            .lines()
            .filter(|l| !l.trim_start().starts_with("// "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            uncommented, expanded,
            "{name}: specialize! and generated/ differ"
        );
    }
}

struct Protocol<'a>(&'a [i32], usize);

impl ModelTask for Protocol<'_> {
    type Output = LogitsRun;
    fn run<M: CausalLm>(self, m: &M) -> LogitsRun {
        run_logits(m, self.0, self.1).unwrap()
    }
}

#[test]
fn macro_model_runs_bit_identical_to_the_generated_one() {
    assert_eq!(
        user_model::FINGERPRINT,
        archgen_generated::gemma4_walkthrough_tiny::FINGERPRINT
    );
    let root = tempfile::tempdir().unwrap();
    let spec =
        archgen_families::load(repo_root().join("specs/gemma4-walkthrough-tiny.yaml")).unwrap();
    let job = serde_json::json!([{
        "config": archgen_tests::config_for(&spec),
        "out": root.path(),
        "seed": 5,
        "dtype": "bfloat16",
        "kv_quant": {"2": [8, 32]},
        "prompt_ids": [1, 2, 3],
        "decode_steps": 0,
    }]);
    let jobs = root.path().join("jobs.json");
    std::fs::write(&jobs, job.to_string()).unwrap();
    archgen_tests::run_python("spec_cases.py", &[jobs.as_os_str()]);
    let dir = root.path().join("model");
    let ids: Vec<i32> = (0..13).map(|i| (i * 29 + 5) % 384).collect();
    let (_, w1) = archgen_checkpoint::read_dir(&dir).unwrap();
    let (_, w2) = archgen_checkpoint::read_dir(&dir).unwrap();
    let ours = run_logits(&user_model::load(w1).unwrap(), &ids, 8).unwrap();
    let theirs = archgen_generated::run(user_model::FINGERPRINT, w2, Protocol(&ids, 8))
        .unwrap()
        .unwrap();
    for (a, b) in [
        (&ours.prefill_logits, &theirs.prefill_logits),
        (&ours.decode_logits, &theirs.decode_logits),
        (&ours.tokens, &theirs.tokens),
    ] {
        assert_eq!(array_bytes(a).unwrap(), array_bytes(b).unwrap());
    }
}
