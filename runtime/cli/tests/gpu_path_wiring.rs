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

fn logits(dir: &Path, out: &Path, gpu_path: bool) {
    // 17 prompt ids, 9 decode steps: the ids stay below every tiny vocabulary.
    let o = archgen(
        &[
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
        ],
        gpu_path,
    );
    assert!(o.status.success(), "{}", stderr(&o));
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
