//! The runtime's MLX from Rust against Python mlx in the project venv, on the
//! same inputs: every output must be byte-identical. Plus proof that MLX's CPU
//! `compile` really JIT-built kernels (it silently falls back without g++).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use archgen_runtime::bytes::array_bytes;
use archgen_runtime::mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use archgen_runtime::mlx_rs::transforms::compile::compile;
use archgen_runtime::mlx_rs::{self, Array, Dtype};
use archgen_runtime::ops::gelu_approx;
use archgen_tests::run_python;

/// Exact f32 values in [-1, 1) from an integer LCG: the same bits on every machine.
fn lcg(seed: u64, shape: &[i32]) -> Array {
    let n: i32 = shape.iter().product();
    let mut s = seed;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as i32 - (1 << 23)) as f32 / (1 << 23) as f32
        })
        .collect();
    Array::from_slice(&data, shape)
}

fn geglu(args: (&Array, &Array)) -> Result<Array, mlx_rs::error::Exception> {
    gelu_approx(args.0)?.multiply(args.1)
}

fn compute(
    inp: &HashMap<String, Array>,
) -> Result<HashMap<String, Array>, mlx_rs::error::Exception> {
    let mut out = HashMap::new();
    for dt in ["f32", "bf16"] {
        let i = |k: &str| &inp[&format!("{k}_{dt}")];
        out.insert(format!("matmul_{dt}"), i("a").matmul(i("b"))?);
        out.insert(
            format!("rms_norm_{dt}"),
            fast::rms_norm(i("x"), Some(i("w")), 1e-6)?,
        );
        out.insert(
            format!("rope_base_{dt}"),
            fast::rope(i("r"), 32, false, 10000.0, 1.0, 3, None)?,
        );
        out.insert(
            format!("rope_freqs_{dt}"),
            fast::rope_dynamic(
                i("r"),
                32,
                false,
                None,
                1.0,
                Array::from_int(3),
                &inp["freqs"],
            )?,
        );
        out.insert(
            format!("sdpa_causal_{dt}"),
            fast::scaled_dot_product_attention(
                i("q"),
                i("k"),
                i("v"),
                1.0,
                ScaledDotProductAttentionMask::Causal,
                None,
            )?,
        );
        let mut compiled = compile(geglu, true);
        out.insert(format!("compiled_geglu_{dt}"), compiled((i("g"), i("u")))?);
        out.insert(format!("eager_geglu_{dt}"), geglu((i("g"), i("u")))?);
        out.insert(
            format!("swiglu_{dt}"),
            archgen_runtime::ops::swiglu(i("g"), i("u"))?,
        );
    }
    for dims in [32, 64] {
        let rope = archgen_runtime::rope::Rope::llama3(dims, 500000.0, 32.0, 1.0, 4.0, 8192.0)?;
        let archgen_runtime::rope::Rope::Freqs { freqs, .. } = rope else {
            panic!("Llama-3 RoPE passes freqs");
        };
        out.insert(format!("llama3_freqs_{dims}"), freqs);
    }
    for bits in [4, 8] {
        let (wq, scales, biases) = mlx_rs::ops::quantize(&inp["qw_f32"], 64, bits)?;
        for dt in ["f32", "bf16"] {
            let x = &inp[&format!("qx_{dt}")];
            let s = scales.as_dtype(x.dtype())?;
            let b = biases.as_dtype(x.dtype())?;
            let y = mlx_rs::ops::quantized_matmul(x, &wq, &s, &b, true, 64, bits)?;
            out.insert(format!("qmm{bits}_{dt}"), y);
        }
        out.insert(format!("quantize{bits}_w"), wq);
        out.insert(format!("quantize{bits}_scales"), scales);
        out.insert(format!("quantize{bits}_biases"), biases);
    }
    Ok(out)
}

fn inputs() -> HashMap<String, Array> {
    let mut inp = HashMap::new();
    let base: [(&str, &[i32]); 11] = [
        ("a", &[4, 64]),
        ("b", &[64, 32]),
        ("x", &[2, 5, 64]),
        ("w", &[64]),
        ("r", &[1, 2, 5, 32]),
        ("q", &[1, 4, 5, 16]),
        ("k", &[1, 2, 5, 16]),
        ("v", &[1, 2, 5, 16]),
        // gelu's tails: scale so some inputs reach |x| ~ 4.
        ("g", &[3, 64]),
        ("u", &[3, 64]),
        ("qx", &[3, 128]),
    ];
    for (n, (name, shape)) in base.iter().enumerate() {
        let mut a = lcg(n as u64 + 1, shape);
        if *name == "g" {
            a = a.multiply(Array::from_f32(4.0)).unwrap();
        }
        inp.insert(format!("{name}_bf16"), a.as_dtype(Dtype::Bfloat16).unwrap());
        inp.insert(format!("{name}_f32"), a);
    }
    inp.insert("qw_f32".into(), lcg(99, &[32, 128]));
    // Proportional-rope style periods: finite for the first pairs, inf after.
    let freqs: Vec<f32> = (0..16)
        .map(|i| {
            if i < 4 {
                1e6f32.powf(2.0 * i as f32 / 32.0)
            } else {
                f32::INFINITY
            }
        })
        .collect();
    inp.insert("freqs".into(), Array::from_slice(&freqs, &[16]));
    inp
}

#[test]
fn rust_and_python_mlx_agree_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (in_path, out_path) = (
        dir.path().join("in.safetensors"),
        dir.path().join("out.safetensors"),
    );
    let inp = inputs();
    Array::save_safetensors(inp.iter(), None, &in_path).unwrap();
    let ours = compute(&inp).unwrap();
    run_python("smoke_ops.py", &[in_path.as_os_str(), out_path.as_os_str()]);
    let theirs = Array::load_safetensors(&out_path).unwrap();

    let mut names: Vec<_> = ours.keys().cloned().collect();
    names.sort();
    assert_eq!(
        names.len(),
        theirs.len(),
        "Python produced {:?}",
        theirs.keys()
    );
    let mut mismatched = Vec::new();
    for name in &names {
        let (a, b) = (&ours[name], &theirs[name]);
        let same = a.dtype() == b.dtype()
            && a.shape() == b.shape()
            && array_bytes(a).unwrap() == array_bytes(b).unwrap();
        if !same {
            mismatched.push(format!(
                "{name}: rust {:?}{:?} vs python {:?}{:?}",
                a.dtype(),
                a.shape(),
                b.dtype(),
                b.shape()
            ));
        }
    }
    assert!(
        mismatched.is_empty(),
        "not byte-identical:\n{}",
        mismatched.join("\n")
    );
    // The bf16 outputs must really be bf16 (weak scalars keep the dtype).
    assert_eq!(ours["compiled_geglu_bf16"].dtype(), Dtype::Bfloat16);
    eprintln!("{} outputs byte-identical with Python mlx", names.len());
}

/// Child half of `compile_really_builds_kernels`: compiles and runs geglu once.
#[test]
#[ignore = "run by compile_really_builds_kernels in a child process"]
fn compile_probe_child() {
    let mut compiled = compile(geglu, true);
    let g = lcg(5, &[7, 96]).as_dtype(Dtype::Bfloat16).unwrap();
    let u = lcg(6, &[7, 96]).as_dtype(Dtype::Bfloat16).unwrap();
    compiled((&g, &u)).unwrap().eval().unwrap();
}

fn kernel_libraries(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                walk(&p, found);
            } else if p.extension() == Some(OsStr::new("so")) {
                found.push(p.display().to_string());
            }
        }
    }
    let mut found = Vec::new();
    walk(dir, &mut found);
    found
}

fn run_probe(tmp: &Path, path_env: Option<&str>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "compile_probe_child", "--ignored", "--nocapture"])
        .env("TMPDIR", tmp);
    if let Some(p) = path_env {
        cmd.env("PATH", p);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// MLX's CPU compile JIT-builds a fused kernel with g++ into its kernel cache
/// under TMPDIR. Without g++ on PATH it silently runs the uncompiled graph. So:
/// with a fresh TMPDIR the probe must leave a kernel library behind, and the
/// same probe without g++ must leave none (which shows the check can fail).
#[test]
fn compile_really_builds_kernels() {
    let with = tempfile::tempdir().unwrap();
    run_probe(with.path(), None);
    let built = kernel_libraries(with.path());
    assert!(
        !built.is_empty(),
        "MLX compile built no kernel under {}: is g++ installed? (cargo xtask setup)",
        with.path().display()
    );

    let without = tempfile::tempdir().unwrap();
    run_probe(without.path(), Some("/nonexistent"));
    assert!(
        kernel_libraries(without.path()).is_empty(),
        "a kernel was built with no g++ on PATH; the probe cannot tell compile from fallback"
    );
}
