//! The GPU decode path's blocks (runtime/core/src/decode.rs,
//! `Path::NativeFastOps`, the default on CUDA) run on a GPU only, and CI has
//! none. `ARCHGEN_GPU_DECODE=cpu-too` runs them on the CPU: the same block
//! structure (the split around a GeGLU activation, the blocks left
//! uncompiled for MiniCPM's scaled residuals, the rows form), with MLX's
//! fast ops as their CPU op graphs. For these tiny specs that gives the
//! same bytes as the CPU's own decode path, so a wiring mistake in the GPU
//! blocks (a wrong norm, a missing residual, a dropped PLE gate) fails here
//! instead of on the device. Bit equality on the GPU itself is measured
//! there (docs/parity.md, "On the GPU").

use std::path::Path;
use std::process::{Command, Output};

fn archgen(args: &[&str], gpu_path: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_archgen"));
    cmd.args(args);
    cmd.env_remove("ARCHGEN_EAGER_DECODE");
    cmd.env_remove("ARCHGEN_GPU_STACKED_PROJECTIONS");
    if gpu_path {
        cmd.env("ARCHGEN_GPU_DECODE", "cpu-too");
    } else {
        cmd.env_remove("ARCHGEN_GPU_DECODE");
    }
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn logits(dir: &Path, out: &Path, gpu_path: bool) -> Output {
    logits_with(dir, out, gpu_path, &[])
}

fn logits_with(dir: &Path, out: &Path, gpu_path: bool, levers: &[&str]) -> Output {
    // 17 prompt ids, 9 decode steps: the ids stay below every tiny vocabulary.
    let mut args = vec![
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17",
        "--decode-steps",
        "9",
        "--impl",
        "generated",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(levers);
    let o = archgen(&args, gpu_path);
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

fn init(repo: &Path, spec: &str, dir: &Path) {
    let o = archgen(
        &[
            "init",
            "--spec",
            repo.join(format!("specs/{spec}.yaml")).to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
            "--seed",
            "3",
        ],
        false,
    );
    assert!(o.status.success(), "{spec}: {}", stderr(&o));
}

#[test]
fn gpu_decode_blocks_run_on_the_cpu_give_the_cpu_paths_bytes() {
    let repo = archgen_tests::repo_root();
    let root = tempfile::tempdir().unwrap();
    // One per form of the GPU path's post-attention half: GeGLU split around
    // its activation (gemma4, with and without PLE), one block (gemma-2's
    // GELU-then-multiply, qwen3's SwiGLU), uncompiled (minicpm), and the
    // hybrid blocks (qwen3.5).
    for spec in [
        "gemma4-12b-tiny",
        "gemma4-e2b-tiny",
        "gemma-2-2b-tiny",
        "qwen3-0.6b-tiny",
        "minicpm-2b-tiny",
        "qwen3.5-4b-tiny",
    ] {
        let dir = root.path().join(spec);
        init(&repo, spec, &dir);
        let (cpu, gpu) = (dir.join("cpu.safetensors"), dir.join("gpu.safetensors"));
        logits(&dir, &cpu, false);
        logits(&dir, &gpu, true);
        let (a, b) = (std::fs::read(&cpu).unwrap(), std::fs::read(&gpu).unwrap());
        assert!(
            a == b,
            "{spec}: the GPU decode blocks run on the CPU give other logits than the CPU path"
        );
    }
}

/// The lever `gpu-stacked-projections` on the GPU path run on the CPU: each
/// layer's separate Q/K/V (and gate/up) read as one stacked matmul in
/// one-token steps. Prefill reads row views of the stacked buffers, the
/// numbers loaded, so its logits keep their bytes; the one-token steps
/// must agree with the separate projections within rounding (a wrong split
/// or norm would not), and the run says how many layers stacked.
#[test]
fn stacked_projections_keep_prefill_and_agree_in_decode() {
    let repo = archgen_tests::repo_root();
    let root = tempfile::tempdir().unwrap();
    // Q/K/V norms per head with V's scale-free norm and K = V layers
    // (gemma4), per-head q/k norms with V as is (qwen3), no q/k norm and
    // GELU-then-multiply (gemma-2), and q/k/v biases, which keep Q/K/V
    // apart while gate/up stack (qwen2.5). OLMo-2's post-norm layers take
    // a step of their own, not the one decode composition that reads a
    // stacked Q/K/V, so only their gate/up stack.
    for (spec, layers, qkv) in [
        ("gemma4-12b-tiny", 12, 12),
        ("qwen3-0.6b-tiny", 4, 4),
        ("gemma-2-2b-tiny", 4, 4),
        ("olmo-2-1124-7b-tiny", 4, 0),
        ("qwen2.5-0.5b-tiny", 4, 0),
    ] {
        let dir = root.path().join(spec);
        init(&repo, spec, &dir);
        let (plain, stacked) = (
            dir.join("plain.safetensors"),
            dir.join("stacked.safetensors"),
        );
        logits(&dir, &plain, true);
        let o = logits_with(&dir, &stacked, true, &["--gpu-stacked-projections"]);
        let note = format!(
            "gpu-stacked-projections: {qkv} layers ran Q/K/V as one matmul, {layers} gate/up"
        );
        assert!(stderr(&o).contains(&note), "{spec}: {}", stderr(&o));
        let load = |p: &Path| archgen_runtime::Array::load_safetensors(p).unwrap();
        let (a, b) = (load(&plain), load(&stacked));
        let bytes = |t: &archgen_runtime::Array| archgen_runtime::bytes::array_bytes(t).unwrap();
        let f32s = |t: &archgen_runtime::Array| {
            t.as_dtype(archgen_runtime::Dtype::Float32)
                .unwrap()
                .as_slice::<f32>()
                .to_vec()
        };
        assert_eq!(
            bytes(&a["prefill_logits"]),
            bytes(&b["prefill_logits"]),
            "{spec}: prefill reads the stacked buffers' views"
        );
        assert_eq!(
            bytes(&a["tokens"]),
            bytes(&b["tokens"]),
            "{spec}: greedy tokens"
        );
        let (x, y) = (f32s(&a["decode_logits"]), f32s(&b["decode_logits"]));
        let worst = x
            .iter()
            .zip(&y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        let scale = x.iter().map(|v| v.abs()).fold(0f32, f32::max);
        assert!(
            worst <= 0.02 * scale,
            "{spec}: decode logits differ by {worst} (largest logit {scale})"
        );
    }
}
