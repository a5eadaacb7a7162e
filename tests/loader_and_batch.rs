//! Loader paths and shapes the logits protocol does not exercise: the raw
//! Hugging Face key layout (sanitize: renames, fused experts, dropped towers)
//! must give the same model; a batch of 2 must match mlx-lm byte for byte.

use archgen_runtime::bytes::array_bytes;
use archgen_runtime::model::CausalLm;
use archgen_runtime::protocol::run_logits;
use archgen_runtime::Array;
use archgen_tests::run_python;

fn build(root: &std::path::Path, case: &str) -> std::path::PathBuf {
    run_python(
        "run_oracle.py",
        &[
            "--cases-out".as_ref(),
            root.as_os_str(),
            "--only".as_ref(),
            case.as_ref(),
        ],
    );
    root.join(case).join("model")
}

#[test]
fn hugging_face_key_layout_loads_to_the_same_model() {
    let root = tempfile::tempdir().unwrap();
    // Raw Hugging Face checkpoints are unquantized (fused experts included).
    for case in ["e2b-tiny-bf16", "26b-a4b-tiny-f32"] {
        let mlx_dir = build(root.path(), case);
        let hf_dir = root.path().join(format!("{case}-hf"));
        run_python(
            "variants.py",
            &[
                "hf-layout".as_ref(),
                mlx_dir.as_os_str(),
                hf_dir.as_os_str(),
            ],
        );
        let ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5];
        let a = run_logits(&archgen_monolith::load_dir(&mlx_dir).unwrap(), &ids, 3).unwrap();
        let b = run_logits(&archgen_monolith::load_dir(&hf_dir).unwrap(), &ids, 3).unwrap();
        assert_eq!(
            array_bytes(&a.prefill_logits).unwrap(),
            array_bytes(&b.prefill_logits).unwrap(),
            "{case}"
        );
        assert_eq!(
            array_bytes(&a.decode_logits).unwrap(),
            array_bytes(&b.decode_logits).unwrap(),
            "{case}"
        );
    }
}

#[test]
fn a_batch_of_two_matches_mlx_lm() {
    let root = tempfile::tempdir().unwrap();
    for case in ["e2b-tiny-bf16", "12b-tiny-q4", "26b-a4b-tiny-f32"] {
        let dir = build(root.path(), case);
        let ids: [[i32; 12]; 2] = [
            [5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43],
            [2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377],
        ];
        let out = root.path().join(format!("{case}-batch.safetensors"));
        let json = serde_json::to_string(&ids).unwrap();
        run_python(
            "variants.py",
            &[
                "batch".as_ref(),
                dir.as_os_str(),
                out.as_os_str(),
                json.as_ref(),
            ],
        );
        let m = archgen_monolith::load_dir(&dir).unwrap();
        let flat: Vec<i32> = ids.iter().flatten().copied().collect();
        let ours = m
            .forward(&Array::from_slice(&flat, &[2, 12]), &mut m.make_cache())
            .unwrap();
        let theirs = Array::load_safetensors(&out)
            .unwrap()
            .remove("logits")
            .unwrap();
        assert_eq!(ours.shape(), theirs.shape(), "{case}");
        assert_eq!(
            array_bytes(&ours).unwrap(),
            array_bytes(&theirs).unwrap(),
            "{case}: batch 2 differs from mlx-lm"
        );
    }
}
