//! The generated models' single-token decode path (`archgen_runtime::decode`:
//! RoPE tables computed once per step, compiled blocks around attention)
//! against the eager blocks the monolith runs, byte for byte, beyond what the
//! tiny specs of the parity tests reach: large positions, both RoPE forms and
//! partial rotation, float32 / bfloat16 / float16, widths whose mean
//! normalizer 1/n MLX's compiler would inline inexactly (3840), and MLX's
//! inexact inlining itself, which is why those widths must stay eager.

use archgen_runtime::attention::Mask;
use archgen_runtime::blocks::{self as b, AttentionShape, AttentionWeights, KvWeights};
use archgen_runtime::bytes::array_bytes;
use archgen_runtime::cache::{KvCache, LayerCache, RotatingKvCache};
use archgen_runtime::decode;
use archgen_runtime::feed_forward::FeedForward;
use archgen_runtime::layers::Linear;
use archgen_runtime::mlx_rs::{self, Array, Dtype};
use archgen_runtime::rope::{apply_tables, Pairs, Rope, YarnScaling};

/// Exact f32 values in [-1, 1) from an integer LCG: the same bits everywhere.
fn lcg(seed: u64, shape: &[i32], scale: f32, offset: f32) -> Array {
    let n: i32 = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            offset + scale * (((s >> 40) as i32 - (1 << 23)) as f32 / (1 << 23) as f32)
        })
        .collect();
    Array::from_slice(&data, shape)
}

fn same(a: &Array, b: &Array) -> bool {
    a.dtype() == b.dtype()
        && a.shape() == b.shape()
        && array_bytes(a).unwrap() == array_bytes(b).unwrap()
}

const DTYPES: [Dtype; 3] = [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16];

/// A YaRN scaling over 4096 positions with `beta_fast` 32, `beta_slow` 1.
fn yarn(factor: f64, mscale: f64, mscale_all_dim: f64) -> YarnScaling {
    YarnScaling {
        factor,
        original_max_position_embeddings: 4096.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        mscale,
        mscale_all_dim,
    }
}

#[test]
fn rope_tables_reproduce_fast_rope() {
    let ropes = [
        ("base 1e4, 16 of 16", Rope::base(16, 10_000.0), 16),
        ("base 1e4, 64 of 128", Rope::base(64, 10_000.0), 128),
        ("base 1e6, 256", Rope::base(256, 1_000_000.0), 256),
        (
            "proportional 8 of 32",
            Rope::proportional(32, 8, 1_000_000.0, 1.0).unwrap(),
            32,
        ),
        (
            "proportional 128 of 512",
            Rope::proportional(512, 128, 1_000_000.0, 1.0).unwrap(),
            512,
        ),
        (
            "llama3 64",
            Rope::llama3(64, 500_000.0, 32.0, 1.0, 4.0, 8192.0).unwrap(),
            64,
        ),
        (
            "llama3 128",
            Rope::llama3(128, 500_000.0, 32.0, 1.0, 4.0, 8192.0).unwrap(),
            128,
        ),
        (
            "yarn traditional 64 (DeepSeek-V3)",
            Rope::yarn(64, 10_000.0, yarn(40.0, 1.0, 1.0), Pairs::Interleaved).unwrap(),
            64,
        ),
        (
            "yarn traditional 32 of 48, input scale",
            Rope::yarn(32, 10_000.0, yarn(32.0, 1.0, 0.0), Pairs::Interleaved).unwrap(),
            48,
        ),
        (
            "yarn halves 64 of 64, input scale",
            Rope::yarn(64, 150_000.0, yarn(32.0, 1.0, 0.0), Pairs::Halves).unwrap(),
            64,
        ),
    ];
    let mut cases = 0;
    for (name, rope, head_dim) in &ropes {
        for (i, dt) in DTYPES.into_iter().enumerate() {
            for (j, &(offset, l)) in [(0, 1), (1, 1), (7, 3), (255, 1), (4097, 1), (131_071, 2)]
                .iter()
                .enumerate()
            {
                let x = lcg((i * 10 + j) as u64, &[1, 4, l, *head_dim], 3.0, 0.0)
                    .as_dtype(dt)
                    .unwrap();
                let want = rope.apply(&x, &Array::from_int(offset)).unwrap();
                let got = apply_tables(&x, &rope.tables(offset, l, dt).unwrap()).unwrap();
                assert!(same(&want, &got), "{name} {dt:?} offset {offset} L {l}");
                // Tables cast to another dtype: apply_tables casts the float32 ones.
                let other = if dt == Dtype::Float32 {
                    Dtype::Bfloat16
                } else {
                    Dtype::Float32
                };
                let got = apply_tables(&x, &rope.tables(offset, l, other).unwrap()).unwrap();
                assert!(same(&want, &got), "{name} {dt:?} offset {offset} L {l}");
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 180);
}

#[test]
fn one_token_sdpa_matches_fast_sdpa() {
    use archgen_runtime::attention::sdpa_one_token;
    use archgen_runtime::mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
    let mut cases = 0;
    for (i, dt) in DTYPES.into_iter().enumerate() {
        for &(h, kv, d) in &[
            (4, 2, 16),
            (4, 1, 32),
            (8, 8, 64),
            (16, 8, 256),
            (16, 4, 512),
        ] {
            for &l in &[1, 8, 129, 2048] {
                let seed = (i * 1000 + h as usize * 10 + l as usize) as u64;
                let q = lcg(seed, &[1, h, 1, d], 2.0, 0.0).as_dtype(dt).unwrap();
                // K/V as a KVCache returns them: a view [..., :L, :] of a
                // longer buffer.
                let k = lcg(seed + 1, &[1, kv, l + 5, d], 2.0, 0.0)
                    .as_dtype(dt)
                    .unwrap();
                let v = lcg(seed + 2, &[1, kv, l + 5, d], 2.0, 0.0)
                    .as_dtype(dt)
                    .unwrap();
                let (k, v) = (
                    k.try_index((Ellipsis, ..l, ..)).unwrap(),
                    v.try_index((Ellipsis, ..l, ..)).unwrap(),
                );
                // Gemma-4 attends at scale 1; Qwen3 / Llama at head_dim ** -0.5.
                for scale in [1.0, (d as f64).powf(-0.5) as f32] {
                    let want =
                        mlx_rs::fast::scaled_dot_product_attention(&q, &k, &v, scale, None, None)
                            .unwrap()
                            .transpose_axes(&[0, 2, 1, 3])
                            .unwrap()
                            .reshape(&[1, -1])
                            .unwrap();
                    let got = sdpa_one_token(&q, &k, &v, scale).unwrap();
                    assert!(
                        same(&want, &got),
                        "{dt:?} H {h} KV {kv} D {d} L {l} scale {scale}"
                    );
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 120);
}

fn linear(seed: u64, out: i32, inp: i32, dt: Dtype) -> Linear {
    let w = lcg(seed, &[out, inp], 1.0 / (inp as f32).sqrt(), 0.0);
    Linear {
        weight: w.as_dtype(dt).unwrap(),
        quant: None,
        weight_t: None,
        bias: None,
    }
}

fn norm(seed: u64, n: i32, dt: Dtype) -> Array {
    lcg(seed, &[n], 0.5, 1.0).as_dtype(dt).unwrap()
}

/// A layer's flavour, as the IR facts of the two block arrangements in use.
#[derive(Clone, Copy, Debug)]
struct Flavour {
    arrangement: b::NormArrangement,
    qk_norm: bool,
    activation: b::Activation,
    scalar: bool,
    /// q/k/v biases (Qwen2).
    bias: bool,
    /// Depth-scaled residual branches (MiniCPM), by this Python float.
    residual: Option<f64>,
    /// One `gate_up_proj` split in halves (phi3's MLP) in place of
    /// `gate_proj` and `up_proj`.
    fused_gate_up: bool,
}

/// Gemma-4's blocks: sandwich norms, q/k/v norms, GeGLU, layer scalar.
const SANDWICH: Flavour = Flavour {
    arrangement: b::NormArrangement::Sandwich,
    qk_norm: true,
    activation: b::Activation::GeluApprox,
    scalar: true,
    bias: false,
    residual: None,
    fused_gate_up: false,
};

/// Qwen3 / Llama blocks: pre-norm, SwiGLU, with or without q/k norms.
const fn pre_norm(qk_norm: bool) -> Flavour {
    Flavour {
        arrangement: b::NormArrangement::PreNorm,
        qk_norm,
        activation: b::Activation::Silu,
        scalar: false,
        bias: false,
        residual: None,
        fused_gate_up: false,
    }
}

/// Qwen2's blocks: pre-norm, SwiGLU, no q/k norms, q/k/v biases.
const QWEN2: Flavour = Flavour {
    bias: true,
    ..pre_norm(false)
};

/// `[n]` bias values (qwen2's are of the order of the projections' outputs).
fn bias(seed: u64, n: i32, dt: Dtype) -> Array {
    lcg(seed, &[n], 1.0, 0.0).as_dtype(dt).unwrap()
}

struct Parts {
    norms: b::LayerNorms,
    attn: AttentionWeights,
    kv: KvWeights,
    mlp: b::Mlp,
    scalar: Option<Array>,
    shape: AttentionShape,
}

/// The eager attention's view of a layer's separate projections.
fn own(p: &Parts) -> b::OwnQkv<'_> {
    b::OwnQkv::Separate {
        attn: &p.attn,
        kv: &p.kv,
    }
}

fn parts(hidden: i32, s: AttentionShape, k_eq_v: bool, f: Flavour, dt: Dtype) -> Parts {
    let (q_out, kv_out) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    Parts {
        norms: match f.arrangement {
            b::NormArrangement::Sandwich => b::LayerNorms::Sandwich {
                input: norm(1, hidden, dt),
                post_attention: norm(2, hidden, dt),
                pre_feedforward: norm(3, hidden, dt),
                post_feedforward: norm(4, hidden, dt),
            },
            b::NormArrangement::PreNorm => b::LayerNorms::PreNorm {
                input: norm(1, hidden, dt),
                ffn: norm(2, hidden, dt),
            },
        },
        attn: AttentionWeights {
            q_proj: Linear {
                bias: f.bias.then(|| bias(15, q_out, dt)),
                ..linear(5, q_out, hidden, dt)
            },
            o_proj: linear(6, hidden, q_out, dt),
            q_norm: f
                .qk_norm
                .then(|| b::QkNormWeight::PerHead(norm(7, s.head_dim, dt))),
            kv: None,
            sinks: None,
        },
        kv: KvWeights {
            k_proj: Linear {
                bias: f.bias.then(|| bias(16, kv_out, dt)),
                ..linear(8, kv_out, hidden, dt)
            },
            v_proj: (!k_eq_v).then(|| Linear {
                bias: f.bias.then(|| bias(17, kv_out, dt)),
                ..linear(9, kv_out, hidden, dt)
            }),
            k_norm: f
                .qk_norm
                .then(|| b::QkNormWeight::PerHead(norm(10, s.head_dim, dt))),
        },
        mlp: b::Mlp {
            gate_up: if f.fused_gate_up {
                b::GateUp::Fused {
                    gate_up_proj: linear(18, 4 * hidden, hidden, dt),
                }
            } else {
                b::GateUp::Separate {
                    gate_proj: linear(11, 2 * hidden, hidden, dt),
                    up_proj: linear(12, 2 * hidden, hidden, dt),
                }
            },
            down_proj: linear(13, hidden, 2 * hidden, dt),
            activation: f.activation,
        },
        scalar: f.scalar.then(|| norm(14, 1, dt)),
        shape: s,
    }
}

/// Several decode steps of one layer, eager (as the monolith) and through
/// `decode` (as generated models), each on its own cache; every step's
/// output must be identical.
#[allow(clippy::too_many_arguments)]
fn run_layer(
    hidden: i32,
    s: AttentionShape,
    rope: &Rope,
    sliding: bool,
    k_eq_v: bool,
    f: Flavour,
    dt: Dtype,
    stack: bool,
) {
    let p = parts(hidden, s, k_eq_v, f, dt);
    // The decode side as generated models load it: Q/K/V stacked (or not),
    // weights pretransposed.
    let mut d = parts(hidden, s, k_eq_v, f, dt);
    let fused = if stack {
        Some(decode::FusedQkv::new(&mut d.attn, &mut d.kv, s).expect("stackable"))
    } else {
        None
    };
    d.attn.pretranspose();
    d.kv.pretranspose();
    d.mlp.pretranspose();
    let ffn = FeedForward::Mlp {
        mlp: d.mlp.clone(),
        moe: None,
    };
    let make = || {
        if sliding {
            LayerCache::Sliding(RotatingKvCache::new(8, 0))
        } else {
            LayerCache::Full(KvCache::default())
        }
    };
    let (mut eager_cache, mut decode_cache) = (make(), make());
    for step in 0..12 {
        let h = lcg(100 + step, &[1, 1, hidden], 4.0, 0.0)
            .as_dtype(dt)
            .unwrap();
        let mask = Mask::None;
        let x = mlx_rs::fast::rms_norm(&h, Some(p.norms.input()), s.eps).unwrap();
        let (a, _) = b::attention_own_kv(&x, own(&p), s, rope, &mut eager_cache, &mask).unwrap();
        let residual = f.residual.map(b::residual_scale);
        let form = match &residual {
            None => b::Residual::Plain,
            Some(r) => b::Residual::Scaled(r),
        };
        let e = b::attention_residual(&h, &a, &p.norms, s.eps, form).unwrap();
        let e = b::feed_forward(&e, &p.norms, &p.mlp, None, s.eps, form).unwrap();
        let want = b::finish_layer(&e, None, p.scalar.as_ref(), s.eps).unwrap();

        let tables = rope.tables(decode_cache.offset(), 1, dt).unwrap();
        let layer = decode::Layer {
            norms: &d.norms,
            attn: &d.attn,
            ffn: &ffn,
            residual: form,
            ple: None,
            layer_scalar: d.scalar.as_ref(),
            shape: d.shape,
            eps: s.eps,
        };
        // The decode path takes and returns rows [B, hidden].
        let rows = h.reshape(&[1, hidden]).unwrap();
        let kv = decode::KvSource::Own {
            weights: &d.kv,
            fused: fused.as_ref(),
            cache: &mut decode_cache,
        };
        let (got, _) = decode::step(&rows, &layer, kv, &tables, &mask).unwrap();
        let got = got.reshape(&[1, 1, hidden]).unwrap();
        assert!(
            same(&want, &got),
            "{f:?} hidden {hidden} head_dim {} {dt:?} step {step}",
            s.head_dim
        );
    }
}

fn shape(n_kv_heads: i32, head_dim: i32, scale: f32, value_norm: b::ValueNorm) -> AttentionShape {
    AttentionShape {
        n_heads: 4,
        n_kv_heads,
        head_dim,
        eps: 1e-6,
        scale,
        value_norm,
        scores: b::Scores::FusedSdpa,
    }
}

#[test]
fn decode_blocks_match_the_eager_layer() {
    let sliding = shape(2, 16, 1.0, b::ValueNorm::RmsScaleFree);
    let full = shape(1, 32, 1.0, b::ValueNorm::RmsScaleFree);
    let base = Rope::base(16, 10_000.0);
    let prop = Rope::proportional(32, 8, 1_000_000.0, 1.0).unwrap();
    for dt in DTYPES {
        // 3840 is gemma4-12b's hidden size: 1/3840 would not survive MLX's
        // constant inlining, so the norms take it as an input.
        for hidden in [64, 3840] {
            for stack in [false, true] {
                run_layer(hidden, sliding, &base, true, false, SANDWICH, dt, stack);
                run_layer(hidden, full, &prop, false, true, SANDWICH, dt, stack);
            }
        }
    }
    // Every block compiled: (2 widths x 2 attention shapes x stacked or not)
    // before attention and 2 widths after, per dtype (dtypes share keys: MLX
    // keys by dtype).
    assert_eq!(decode::block_counts(), (10, 0));
}

/// The GPU form of the blocks (`RopeTables::Native`: `fast.rope` at an
/// offset that is an input of the compiled block, `fast.rms_norm` as called)
/// traced and run on the CPU, where MLX expands those fast ops into their
/// fallbacks with inlined constants: a plumbing check of how the native
/// RoPE travels into and out of the compiled function (both RoPE forms,
/// offsets moving step by step), close to the eager layer in float32. Its
/// bits are for a GPU to check (docs/parity.md, "On the GPU").
#[test]
fn native_rope_blocks_track_the_eager_layer() {
    let hidden = 64;
    for (s, rope, sliding, k_eq_v) in [
        (
            shape(2, 16, 1.0, b::ValueNorm::RmsScaleFree),
            Rope::base(16, 10_000.0),
            true,
            false,
        ),
        (
            shape(1, 32, 1.0, b::ValueNorm::RmsScaleFree),
            Rope::proportional(32, 8, 1_000_000.0, 1.0).unwrap(),
            false,
            true,
        ),
    ] {
        let dt = Dtype::Float32;
        let p = parts(hidden, s, k_eq_v, SANDWICH, dt);
        let make = || {
            if sliding {
                LayerCache::Sliding(RotatingKvCache::new(8, 0))
            } else {
                LayerCache::Full(KvCache::default())
            }
        };
        let (mut eager_cache, mut decode_cache) = (make(), make());
        for step in 0..12 {
            let h = lcg(300 + step, &[1, 1, hidden], 4.0, 0.0);
            let mask = Mask::None;
            let x = mlx_rs::fast::rms_norm(&h, Some(p.norms.input()), s.eps).unwrap();
            let (a, _) =
                b::attention_own_kv(&x, own(&p), s, &rope, &mut eager_cache, &mask).unwrap();
            let e = b::attention_residual(&h, &a, &p.norms, s.eps, b::Residual::Plain).unwrap();
            let e = b::feed_forward(&e, &p.norms, &p.mlp, None, s.eps, b::Residual::Plain).unwrap();
            let want = b::finish_layer(&e, None, p.scalar.as_ref(), s.eps).unwrap();
            let native = archgen_runtime::rope::RopeTables::Native {
                rope: rope.clone(),
                offset: Array::from_int(decode_cache.offset()),
            };
            let ffn = FeedForward::Mlp {
                mlp: p.mlp.clone(),
                moe: None,
            };
            let layer = decode::Layer {
                norms: &p.norms,
                attn: &p.attn,
                ffn: &ffn,
                residual: b::Residual::Plain,
                ple: None,
                layer_scalar: p.scalar.as_ref(),
                shape: s,
                eps: s.eps,
            };
            let rows = h.reshape(&[1, hidden]).unwrap();
            let kv = decode::KvSource::Own {
                weights: &p.kv,
                fused: None,
                cache: &mut decode_cache,
            };
            let (got, _) = decode::step(&rows, &layer, kv, &native, &mask).unwrap();
            let got = got.reshape(&[1, 1, hidden]).unwrap();
            let close = want.all_close(&got, 1e-4, 1e-4, None).unwrap();
            assert!(close, "head_dim {} step {step}", s.head_dim);
        }
    }
}

/// Why the guard exists: compiled, `mean` over 3840 float32 values inlines
/// 1/3840 as `0.0002604167`, one ulp off, and the results differ.
#[test]
fn mlx_compile_inlines_inexact_float_constants() {
    let x = lcg(7, &[64, 3840], 2.0, 0.0);
    let mean = |x: &Array| -> Result<Array, mlx_rs::error::Exception> { x.mean_axis(-1, true) };
    let eager = mean(&x).unwrap();
    let compiled = mlx_rs::transforms::compile::compile(mean, false)(&x).unwrap();
    assert!(
        !same(&eager, &compiled),
        "MLX's compiled mean over 3840 now matches eager: the inlining guard in \
         runtime/core/src/decode.rs may be relaxed"
    );
}

/// The pre-norm (Qwen3 / Llama) decode blocks against the eager layer the
/// monolith runs, several steps each, both RoPE forms, with and without q/k
/// norms, at the tiny width and at Qwen3-4B's 2560 (1/2560 inlines inexactly).
#[test]
fn pre_norm_decode_blocks_match_the_eager_layer() {
    let base = Rope::base(16, 1_000_000.0);
    let llama3 = Rope::llama3(16, 500_000.0, 32.0, 1.0, 4.0, 8192.0).unwrap();
    let s = shape(2, 16, (16f64).powf(-0.5) as f32, b::ValueNorm::None);
    for dt in DTYPES {
        for hidden in [64, 2560] {
            run_layer(hidden, s, &base, false, false, pre_norm(true), dt, false);
            run_layer(hidden, s, &llama3, false, false, pre_norm(false), dt, false);
        }
    }
    // Before attention: 2 widths x (q/k norm or not); after: 2 widths.
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 6 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}

/// Qwen2's decode blocks (q/k/v biases: `addmm` inside the compiled block
/// before attention) against the eager layer, at the tiny width and at
/// Qwen2.5-0.5B's 896 (14 heads there would not matter: the bias is per
/// output column), both dtypes.
#[test]
fn qwen2_decode_blocks_match_the_eager_layer() {
    let base = Rope::base(16, 1_000_000.0);
    let s = shape(2, 16, (16f64).powf(-0.5) as f32, b::ValueNorm::None);
    for dt in DTYPES {
        for hidden in [64, 896] {
            run_layer(hidden, s, &base, false, false, QWEN2, dt, false);
        }
    }
    // A biased layer is never stacked: with every norm FusedQkv needs, the
    // biases alone make it refuse.
    let normed = shape(2, 16, 1.0, b::ValueNorm::RmsScaleFree);
    for (biased, stacks) in [(true, false), (false, true)] {
        let f = Flavour {
            qk_norm: true,
            bias: biased,
            ..QWEN2
        };
        let mut d = parts(64, normed, false, f, Dtype::Float32);
        let fused = decode::FusedQkv::new(&mut d.attn, &mut d.kv, normed);
        assert_eq!(fused.is_some(), stacks, "biased: {biased}");
    }
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 4 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}

/// MiniCPM's blocks against the eager layer: Llama's pre-norm SwiGLU layer
/// with both residual branches times `scale_depth / num_hidden_layers**0.5`
/// (the factor an input of the compiled block, rounded to the branch's dtype
/// there as on the eager path), at the tiny width and at MiniCPM-2B's 2304,
/// for the 4-layer tiny spec's factor (0.7), the 2-layer one's and the
/// 40-layer model's (1.4 / sqrt(40), whose float32 does not survive MLX's
/// 7-digit constant inlining). The scaled layer must also differ from the
/// plain one (the factor reaches the branches).
#[test]
fn minicpm_decode_blocks_match_the_eager_layer() {
    let base = Rope::base(16, 1_000_000.0);
    let s = shape(4, 16, (16f64).powf(-0.5) as f32, b::ValueNorm::None);
    for layers in [4u32, 2, 40] {
        let factor = 1.4 / f64::from(layers).powf(0.5);
        let minicpm = Flavour {
            residual: Some(factor),
            ..pre_norm(false)
        };
        for dt in DTYPES {
            for hidden in [64, 2304] {
                run_layer(hidden, s, &base, false, false, minicpm, dt, false);
            }
        }
    }
    let f = 1.4 / 40f64.powf(0.5);
    assert_ne!(
        format!("{:.6e}", f as f32).parse::<f32>().ok(),
        Some(f as f32)
    );
    // The factor changes the layer's output.
    let dt = Dtype::Float32;
    let p = parts(64, s, false, pre_norm(false), dt);
    let h = lcg(7, &[1, 1, 64], 4.0, 0.0);
    let a = lcg(8, &[1, 1, 64], 4.0, 0.0);
    let plain = b::attention_residual(&h, &a, &p.norms, s.eps, b::Residual::Plain).unwrap();
    let factor = b::residual_scale(f);
    let scaled =
        b::attention_residual(&h, &a, &p.norms, s.eps, b::Residual::Scaled(&factor)).unwrap();
    assert!(!same(&plain, &scaled));
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 4 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}

/// SmolLM3's NoPE layers (`Rope::NoPe`: smollm3.py's `NoPE` returns its
/// input) through the decode blocks: no tables, Q and K as projected, at the
/// tiny width and at SmolLM3-3B's 2048, both dtypes. The NoPE tables are
/// their own compiled-block key, so a rotating layer of the same shape in
/// the same process keeps its rotation.
#[test]
fn nope_decode_blocks_match_the_eager_layer() {
    let base = Rope::base(16, 5_000_000.0);
    let s = shape(2, 16, (16f64).powf(-0.5) as f32, b::ValueNorm::None);
    for dt in DTYPES {
        for hidden in [64, 2048] {
            run_layer(
                hidden,
                s,
                &Rope::NoPe,
                false,
                false,
                pre_norm(false),
                dt,
                false,
            );
            run_layer(hidden, s, &base, false, false, pre_norm(false), dt, false);
        }
    }
    assert!(matches!(
        Rope::NoPe.tables(3, 1, Dtype::Float32).unwrap(),
        archgen_runtime::rope::RopeTables::NoPe
    ));
    // NoPE leaves a [B, H, L, D] tensor as it is; RoPE at offset 3 does not.
    let x = lcg(9, &[1, 2, 1, 16], 1.0, 0.0);
    let offset = Array::from_int(3);
    assert!(same(&Rope::NoPe.apply(&x, &offset).unwrap(), &x));
    assert!(!same(&base.apply(&x, &offset).unwrap(), &x));
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 4 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}

/// A fused `gate_up_proj` (phi3's MLP, IR `GateUpProjection::Fused`: one
/// matmul split in halves) through the compiled block after attention: the
/// same bits as the eager layer, at the tiny width and at Phi-3-mini's 3072,
/// both dtypes. (phi3's own layer kind runs its one-token steps through the
/// eager blocks, its attention being a fused `qkv_proj`; this is the MLP half
/// as the decode path would trace it.)
#[test]
fn fused_gate_up_decode_blocks_match_the_eager_layer() {
    let base = Rope::base(16, 10_000.0);
    let s = shape(2, 16, (16f64).powf(-0.5) as f32, b::ValueNorm::None);
    let fused = Flavour {
        fused_gate_up: true,
        ..pre_norm(false)
    };
    for dt in DTYPES {
        for hidden in [64, 3072] {
            run_layer(hidden, s, &base, false, false, fused, dt, false);
        }
    }
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 4 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}

/// Granite's layer through the decode blocks: SDPA at `attention_multiplier`
/// (0.015625 for granite-3.3-2b, not head_dim ** -0.5) and both residual
/// branches times `residual_multiplier` (0.22, IR `Residual::Scaled`: the
/// same factor input as MiniCPM's), at the tiny width and at 2048.
#[test]
fn granite_decode_blocks_match_the_eager_layer() {
    let base = Rope::base(16, 10_000_000.0);
    let s = shape(2, 16, 0.015625, b::ValueNorm::None);
    let granite = Flavour {
        residual: Some(0.22),
        ..pre_norm(false)
    };
    for dt in DTYPES {
        for hidden in [64, 2048] {
            run_layer(hidden, s, &base, false, false, granite, dt, false);
        }
    }
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 4 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}

/// gemma2's blocks against the eager layer: sandwich norms (their `1 + w`
/// weights are folded at load, so plain arrays here), no q/k/v norms, the
/// GeLU-approx MLP, no layer scalar, and the written-out attention with a
/// score softcap at `1 / query_pre_attn_scalar ** 0.5` (eager between the two
/// compiled blocks, as on the eager path); at the tiny width and at
/// gemma-2-2b's 2304 and gemma-2-9b's 3584.
#[test]
fn gemma2_decode_blocks_match_the_eager_layer() {
    let rope = Rope::base(16, 10_000.0);
    let gemma2 = Flavour {
        arrangement: b::NormArrangement::Sandwich,
        qk_norm: false,
        activation: b::Activation::GeluApprox,
        scalar: false,
        bias: false,
        residual: None,
        fused_gate_up: false,
    };
    for (qpas, cap) in [(256.0f64, 50.0f32), (144.0, 5.0)] {
        let mut s = shape(2, 16, (1.0 / qpas.powf(0.5)) as f32, b::ValueNorm::None);
        s.scores = b::Scores::Softcapped { cap };
        for dt in DTYPES {
            for hidden in [64, 2304, 3584] {
                run_layer(hidden, s, &rope, false, false, gemma2, dt, false);
            }
        }
    }
    // Before attention and after: 3 widths each, every one compiled.
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 6 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}

/// mlx affine quantization of `w` (last axis grouped), as `nn.quantize` stores it.
fn quantized(w: &Array, group_size: i32, bits: i32) -> (Array, archgen_runtime::layers::Quantized) {
    let (wq, scales, biases) = mlx_rs::ops::quantize(w, group_size, bits).unwrap();
    (
        wq,
        archgen_runtime::layers::Quantized {
            scales,
            form: archgen_runtime::layers::QuantForm::Affine { biases },
            group_size,
            bits,
        },
    )
}

/// Qwen3-MoE's sparse block (router `mlp.gate`, softmax then top-k, SwiGLU
/// experts) in place of the MLP: float32 with plain experts (unquantized
/// `gather_mm` runs only in float32 on the CPU) and bfloat16 with 4-bit
/// experts and an 8-bit router, as `qwen3-30b-a3b-tiny-q4` loads them.
fn sparse_moe(
    hidden: i32,
    experts: i32,
    top_k: i32,
    probs: b::TopKProbs,
    dt: Dtype,
) -> b::SparseMoe {
    use archgen_runtime::layers::SwitchLinear;
    let width = 32;
    let quant = dt != Dtype::Float32;
    let switch = |seed: u64, out: i32, inp: i32| {
        let w = lcg(seed, &[experts, out, inp], 1.0 / (inp as f32).sqrt(), 0.0)
            .as_dtype(dt)
            .unwrap();
        match quant {
            false => SwitchLinear {
                weight: w,
                quant: None,
                bias: None,
            },
            true => {
                let (weight, q) = quantized(&w, 32, 4);
                SwitchLinear {
                    weight,
                    quant: Some(q),
                    bias: None,
                }
            }
        }
    };
    let mut gate = linear(20, experts, hidden, dt);
    if quant {
        let (weight, q) = quantized(&gate.weight, 64, 8);
        gate.weight = weight;
        gate.quant = Some(q);
    }
    b::SparseMoe {
        router: archgen_runtime::moe::SoftmaxTopKRouter { gate, top_k, probs },
        experts: archgen_runtime::moe::SwitchGlu {
            gate_proj: switch(21, width, hidden),
            up_proj: switch(22, width, hidden),
            down_proj: switch(23, hidden, width),
        },
    }
}

/// Several decode steps of a pre-norm layer with routed experts in place of
/// the MLP, eager (`blocks::experts_feed_forward`, as the monolith) and through
/// `decode::step` (as generated models), on separate caches.
fn run_experts_layer(hidden: i32, probs: b::TopKProbs, dt: Dtype) {
    let s = shape(2, 16, (16f64).powf(-0.5) as f32, b::ValueNorm::None);
    let rope = Rope::base(16, 1_000_000.0);
    let f = pre_norm(true);
    let p = parts(hidden, s, false, f, dt);
    let mut d = parts(hidden, s, false, f, dt);
    d.attn.pretranspose();
    d.kv.pretranspose();
    let moe = sparse_moe(hidden, 8, 4, probs, dt);
    let mut moe_d = FeedForward::SparseMoe(sparse_moe(hidden, 8, 4, probs, dt));
    moe_d.pretranspose();
    let (mut eager_cache, mut decode_cache) = (
        LayerCache::Full(KvCache::default()),
        LayerCache::Full(KvCache::default()),
    );
    for step in 0..12 {
        let h = lcg(200 + step, &[1, 1, hidden], 4.0, 0.0)
            .as_dtype(dt)
            .unwrap();
        let mask = Mask::None;
        let x = mlx_rs::fast::rms_norm(&h, Some(p.norms.input()), s.eps).unwrap();
        let (a, _) = b::attention_own_kv(&x, own(&p), s, &rope, &mut eager_cache, &mask).unwrap();
        let e = b::attention_residual(&h, &a, &p.norms, s.eps, b::Residual::Plain).unwrap();
        let want = b::experts_feed_forward(&e, &p.norms, &moe, s.eps).unwrap();

        let tables = rope.tables(decode_cache.offset(), 1, dt).unwrap();
        let layer = decode::Layer {
            norms: &d.norms,
            attn: &d.attn,
            ffn: &moe_d,
            residual: b::Residual::Plain,
            ple: None,
            layer_scalar: None,
            shape: d.shape,
            eps: s.eps,
        };
        let rows = h.reshape(&[1, hidden]).unwrap();
        let kv = decode::KvSource::Own {
            weights: &d.kv,
            fused: None,
            cache: &mut decode_cache,
        };
        let (got, _) = decode::step(&rows, &layer, kv, &tables, &mask).unwrap();
        let got = got.reshape(&[1, 1, hidden]).unwrap();
        assert!(
            same(&want, &got),
            "experts {probs:?} hidden {hidden} {dt:?} step {step}"
        );
    }
}

/// The experts layer's decode blocks (Qwen3-MoE) against the eager layer, at
/// the tiny width and at Qwen3-30B-A3B's 2048, with and without
/// renormalized top-k probabilities; every block compiles (the router has no
/// float constant).
#[test]
fn experts_decode_blocks_match_the_eager_layer() {
    for dt in [Dtype::Float32, Dtype::Bfloat16] {
        for hidden in [64, 2048] {
            for probs in [b::TopKProbs::Renormalized, b::TopKProbs::AsTaken] {
                run_experts_layer(hidden, probs, dt);
            }
        }
    }
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 6 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}

/// glm4_moe's MoE (`noaux_tc` router, SwiGLU experts, shared experts): float32
/// unquantized, bfloat16 with 4-bit experts and shared experts; the router's
/// plain `gate.weight` unquantized in both, its correction bias float32.
fn group_routed_moe(hidden: i32, facts: b::GroupTopK, dt: Dtype) -> b::GroupRoutedMoe {
    let (experts, width) = (16, 32);
    let quant = dt != Dtype::Float32;
    let switch = |seed: u64, out: i32, inp: i32| {
        let w = lcg(seed, &[experts, out, inp], 1.0 / (inp as f32).sqrt(), 0.0)
            .as_dtype(dt)
            .unwrap();
        match quant {
            false => archgen_runtime::layers::SwitchLinear {
                weight: w,
                quant: None,
                bias: None,
            },
            true => {
                let (weight, q) = quantized(&w, 32, 4);
                archgen_runtime::layers::SwitchLinear {
                    weight,
                    quant: Some(q),
                    bias: None,
                }
            }
        }
    };
    let dense = |seed: u64, out: i32, inp: i32| {
        let mut l = linear(seed, out, inp, dt);
        if quant {
            let (weight, q) = quantized(&l.weight, 32, 4);
            l.weight = weight;
            l.quant = Some(q);
        }
        l
    };
    b::GroupRoutedMoe {
        router: archgen_runtime::moe::SigmoidGroupRouter {
            gate: linear(30, experts, hidden, dt),
            correction_bias: lcg(31, &[experts], 0.2, 0.0),
            facts,
        },
        experts: archgen_runtime::moe::SwitchGlu {
            gate_proj: switch(32, width, hidden),
            up_proj: switch(33, width, hidden),
            down_proj: switch(34, hidden, width),
        },
        shared_experts: b::Mlp {
            gate_up: b::GateUp::Separate {
                gate_proj: dense(35, width, hidden),
                up_proj: dense(36, width, hidden),
            },
            down_proj: dense(37, hidden, width),
            activation: b::Activation::Silu,
        },
    }
}

/// Decode steps of a glm4_moe MoE layer (q/k/v biases, RoPE on 8 of 16
/// dims, the group router and shared experts), eager (as the monolith) and
/// through `decode::step` (as generated models), on separate caches.
fn run_group_experts_layer(hidden: i32, facts: b::GroupTopK, dt: Dtype) {
    let s = shape(2, 16, (16f64).powf(-0.5) as f32, b::ValueNorm::None);
    let rope = Rope::base(8, 1_000_000.0);
    let f = QWEN2;
    let p = parts(hidden, s, false, f, dt);
    let mut d = parts(hidden, s, false, f, dt);
    d.attn.pretranspose();
    d.kv.pretranspose();
    let moe = group_routed_moe(hidden, facts, dt);
    let mut moe_d = FeedForward::GroupRoutedMoe(group_routed_moe(hidden, facts, dt));
    moe_d.pretranspose();
    let (mut eager_cache, mut decode_cache) = (
        LayerCache::Full(KvCache::default()),
        LayerCache::Full(KvCache::default()),
    );
    for step in 0..8 {
        let h = lcg(400 + step, &[1, 1, hidden], 4.0, 0.0)
            .as_dtype(dt)
            .unwrap();
        let mask = Mask::None;
        let x = mlx_rs::fast::rms_norm(&h, Some(p.norms.input()), s.eps).unwrap();
        let (a, _) = b::attention_own_kv(&x, own(&p), s, &rope, &mut eager_cache, &mask).unwrap();
        let e = b::attention_residual(&h, &a, &p.norms, s.eps, b::Residual::Plain).unwrap();
        let want = b::experts_feed_forward(&e, &p.norms, &moe, s.eps).unwrap();

        let tables = rope.tables(decode_cache.offset(), 1, dt).unwrap();
        let layer = decode::Layer {
            norms: &d.norms,
            attn: &d.attn,
            ffn: &moe_d,
            residual: b::Residual::Plain,
            ple: None,
            layer_scalar: None,
            shape: d.shape,
            eps: s.eps,
        };
        let rows = h.reshape(&[1, hidden]).unwrap();
        let kv = decode::KvSource::Own {
            weights: &d.kv,
            fused: None,
            cache: &mut decode_cache,
        };
        let (got, _) = decode::step(&rows, &layer, kv, &tables, &mask).unwrap();
        let got = got.reshape(&[1, 1, hidden]).unwrap();
        assert!(
            same(&want, &got),
            "group experts {facts:?} hidden {hidden} {dt:?} step {step}"
        );
    }
}

/// glm4_moe's layer: the block before attention compiles (partial RoPE,
/// biases), the one after it runs eagerly (the router is its own compiled
/// trace with its scaling factor baked in, as mlx-lm calls it), and the step
/// gives the eager layer's bytes, with and without group-limited routing.
#[test]
fn group_experts_decode_step_matches_the_eager_layer() {
    let plain = b::GroupTopK {
        top_k: 4,
        n_group: 1,
        topk_group: 1,
        probs: b::TopKProbs::Renormalized,
        routed_scaling_factor: 1.0,
    };
    let grouped = b::GroupTopK {
        n_group: 4,
        topk_group: 2,
        probs: b::TopKProbs::AsTaken,
        routed_scaling_factor: 2.5,
        ..plain
    };
    for dt in [Dtype::Float32, Dtype::Bfloat16] {
        for facts in [plain, grouped] {
            run_group_experts_layer(64, facts, dt);
        }
    }
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 1 && eager >= 2,
        "{compiled} compiled, {eager} eager"
    );
}

/// A layer reading a donor's K/V (Gemma-4's KV-shared layers) through
/// `decode::step` with `KvSource::Shared`, against the eager
/// `attention_shared_kv`: both read the K/V the donor's eager step wrote,
/// and the step hands back exactly the K/V it attended over.
#[test]
fn shared_kv_step_matches_the_eager_layer() {
    let (hidden, dt) = (64, Dtype::Float32);
    let s = shape(2, 16, 1.0, b::ValueNorm::RmsScaleFree);
    let rope = Rope::base(16, 10_000.0);
    let p = parts(hidden, s, false, SANDWICH, dt);
    let mut d = parts(hidden, s, false, SANDWICH, dt);
    d.attn.pretranspose();
    d.mlp.pretranspose();
    let ffn = FeedForward::Mlp {
        mlp: d.mlp.clone(),
        moe: None,
    };
    let mut donor_cache = LayerCache::Full(KvCache::default());
    let calls = decode::compiled_block_calls();
    for step in 0..6 {
        let h = lcg(400 + step, &[1, 1, hidden], 4.0, 0.0);
        let mask = Mask::None;
        let x = mlx_rs::fast::rms_norm(&h, Some(p.norms.input()), s.eps).unwrap();
        let offset = donor_cache.offset();
        let (_, shared) =
            b::attention_own_kv(&x, own(&p), s, &rope, &mut donor_cache, &mask).unwrap();
        let a = b::attention_shared_kv(&x, &p.attn, s, &rope, &shared, &mask).unwrap();
        let e = b::attention_residual(&h, &a, &p.norms, s.eps, b::Residual::Plain).unwrap();
        let e = b::feed_forward(&e, &p.norms, &p.mlp, None, s.eps, b::Residual::Plain).unwrap();
        let want = b::finish_layer(&e, None, p.scalar.as_ref(), s.eps).unwrap();

        let tables = rope.tables(offset, 1, dt).unwrap();
        let layer = decode::Layer {
            norms: &d.norms,
            attn: &d.attn,
            ffn: &ffn,
            residual: b::Residual::Plain,
            ple: None,
            layer_scalar: d.scalar.as_ref(),
            shape: s,
            eps: s.eps,
        };
        let rows = h.reshape(&[1, hidden]).unwrap();
        let kv = decode::KvSource::Shared(&shared);
        let (got, attended) = decode::step(&rows, &layer, kv, &tables, &mask).unwrap();
        let got = got.reshape(&[1, 1, hidden]).unwrap();
        assert!(same(&want, &got), "step {step}");
        assert!(
            same(&attended.keys, &shared.keys) && same(&attended.values, &shared.values),
            "step {step}: the step must hand back the donor's K/V"
        );
    }
    assert!(
        decode::compiled_block_calls() > calls,
        "the shared-K/V step took no compiled block"
    );
}

/// The feed-forward forms no block after plain attention runs are refused
/// with an error that says so, not run some other way: routed experts with
/// scaled residual branches, and a shared-expert MoE (which runs beside the
/// hybrid mixers only).
#[test]
fn step_refuses_feed_forwards_without_a_block() {
    let (hidden, dt) = (64, Dtype::Float32);
    let s = shape(2, 16, 0.25, b::ValueNorm::None);
    let rope = Rope::base(16, 1_000_000.0);
    let p = parts(hidden, s, false, pre_norm(true), dt);
    let experts = FeedForward::SparseMoe(sparse_moe(hidden, 8, 4, b::TopKProbs::Renormalized, dt));
    let (_, _, shared_expert) = delta_net_parts(
        archgen_runtime::deltanet::DeltaNetShape {
            hidden,
            num_k_heads: 1,
            num_v_heads: 1,
            head_k_dim: 16,
            head_v_dim: 16,
            conv_kernel: 4,
            eps: s.eps,
        },
        256,
        true,
        dt,
    );
    let factor = b::residual_scale(0.5);
    let cases = [
        (&experts, b::Residual::Scaled(&factor), "scaled or clipped"),
        (&experts, b::Residual::ClippedInFloat16, "scaled or clipped"),
        (&shared_expert, b::Residual::Plain, "shared-expert"),
    ];
    for (ffn, residual, says) in cases {
        let layer = decode::Layer {
            norms: &p.norms,
            attn: &p.attn,
            ffn,
            residual,
            ple: None,
            layer_scalar: None,
            shape: s,
            eps: s.eps,
        };
        let mut cache = LayerCache::Full(KvCache::default());
        let tables = rope.tables(0, 1, dt).unwrap();
        let h = lcg(500, &[1, hidden], 4.0, 0.0);
        let kv = decode::KvSource::Own {
            weights: &p.kv,
            fused: None,
            cache: &mut cache,
        };
        let err = decode::step(&h, &layer, kv, &tables, &Mask::None)
            .err()
            .unwrap_or_else(|| panic!("a {says} feed-forward must be refused"));
        assert!(err.to_string().contains(says), "{says}: {err}");
    }
}

/// A Gated DeltaNet layer's weights (qwen3_5's split projections), and its
/// feed-forward half: a SwiGLU MLP of `mlp_width`, or (with `moe`) routed
/// experts and a shared expert.
fn delta_net_parts(
    s: archgen_runtime::deltanet::DeltaNetShape,
    mlp_width: i32,
    moe: bool,
    dt: Dtype,
) -> (
    b::LayerNorms,
    archgen_runtime::deltanet::GatedDeltaNet,
    FeedForward,
) {
    use archgen_runtime::deltanet::{GatedDeltaNet, InProj, SharedExpertMoe};
    let (hidden, hv) = (s.hidden, s.num_v_heads);
    let norms = b::LayerNorms::PreNorm {
        input: norm(31, hidden, dt),
        ffn: norm(32, hidden, dt),
    };
    let mixer = GatedDeltaNet {
        in_proj: InProj::Split {
            qkv: linear(33, s.conv_dim(), hidden, dt),
            z: linear(34, s.value_dim(), hidden, dt),
            b: linear(35, hv, hidden, dt),
            a: linear(36, hv, hidden, dt),
        },
        conv1d: lcg(37, &[s.conv_dim(), s.conv_kernel, 1], 0.5, 0.0)
            .as_dtype(dt)
            .unwrap(),
        dt_bias: lcg(38, &[hv], 1.0, 0.0).as_dtype(dt).unwrap(),
        // float32 as mlx-lm keeps it: log of decays in (e^-1, e^1).
        a_log: lcg(39, &[hv], 1.0, 0.0),
        norm: norm(40, s.head_v_dim, dt),
        out_proj: linear(41, hidden, s.value_dim(), dt),
        shape: s,
    };
    let mlp = |seed: u64, width: i32| b::Mlp {
        gate_up: b::GateUp::Separate {
            gate_proj: linear(seed, width, hidden, dt),
            up_proj: linear(seed + 1, width, hidden, dt),
        },
        down_proj: linear(seed + 2, hidden, width, dt),
        activation: b::Activation::Silu,
    };
    let ffn = match moe {
        false => FeedForward::Mlp {
            mlp: mlp(42, mlp_width),
            moe: None,
        },
        true => {
            let m = sparse_moe(hidden, 8, 2, b::TopKProbs::Renormalized, dt);
            FeedForward::SharedExpertMoe(SharedExpertMoe {
                router: m.router,
                experts: m.experts,
                shared_expert: mlp(45, mlp_width),
                shared_expert_gate: linear(48, 1, hidden, dt),
            })
        }
    };
    (norms, mixer, ffn)
}

/// A prefill of `prefill` tokens (eager on both caches; none = the decode
/// path's first step finds an empty cache), then decode steps of one Gated
/// DeltaNet layer: eager (as the monolith and the generated prefill) and
/// through `decode::delta_net` (as generated models), on separate caches;
/// every step's output and both states byte-identical.
fn run_delta_net_layer(
    s: archgen_runtime::deltanet::DeltaNetShape,
    mlp_width: i32,
    moe: bool,
    prefill: i32,
    dt: Dtype,
) {
    use archgen_runtime::deltanet::{self, ArraysCache};
    let (norms, mixer, ffn) = delta_net_parts(s, mlp_width, moe, dt);
    let (mut mixer_d, mut ffn_d) = (mixer.clone(), ffn.clone());
    mixer_d.pretranspose();
    ffn_d.pretranspose();
    let hidden = s.hidden;
    let eager = |h: &Array, cache: &mut ArraysCache| -> Array {
        let x = mlx_rs::fast::rms_norm(h, Some(norms.input()), s.eps).unwrap();
        let a = deltanet::gated_delta_net(&x, &mixer, cache).unwrap();
        let h = b::attention_residual(h, &a, &norms, s.eps, b::Residual::Plain).unwrap();
        // The blocks spelled out, not `FeedForward::after_mixer`, which the
        // decode block runs.
        match &ffn {
            FeedForward::Mlp { mlp, moe } => {
                b::feed_forward(&h, &norms, mlp, moe.as_ref(), s.eps, b::Residual::Plain).unwrap()
            }
            FeedForward::SparseMoe(m) => b::experts_feed_forward(&h, &norms, m, s.eps).unwrap(),
            FeedForward::SharedExpertMoe(m) => {
                b::experts_feed_forward(&h, &norms, m, s.eps).unwrap()
            }
            FeedForward::GroupRoutedMoe(m) => {
                b::experts_feed_forward(&h, &norms, m, s.eps).unwrap()
            }
            FeedForward::BiasedExperts(m) => b::experts_feed_forward(&h, &norms, m, s.eps).unwrap(),
        }
    };
    let (mut eager_cache, mut decode_cache) = (ArraysCache::default(), ArraysCache::default());
    if prefill > 0 {
        let h = lcg(300, &[1, prefill, hidden], 4.0, 0.0)
            .as_dtype(dt)
            .unwrap();
        let a = eager(&h, &mut eager_cache);
        let b = eager(&h, &mut decode_cache);
        assert!(same(&a, &b), "prefill is deterministic");
    }
    let label = format!("delta net hidden {hidden} moe {moe} prefill {prefill} {dt:?}");
    for step in 0..6 {
        let h = lcg(301 + step, &[1, 1, hidden], 4.0, 0.0)
            .as_dtype(dt)
            .unwrap();
        let want = eager(&h, &mut eager_cache);
        let layer = decode::DeltaNetLayer {
            norms: &norms,
            mixer: &mixer_d,
            ffn: &ffn_d,
            eps: s.eps,
        };
        let got = decode::delta_net(&h, &layer, &mut decode_cache).unwrap();
        assert!(same(&want, &got), "{label} step {step}: output");
        let (ec, dc) = (eager_cache.conv.as_ref(), decode_cache.conv.as_ref());
        assert!(
            same(ec.unwrap(), dc.unwrap()),
            "{label} step {step}: conv state"
        );
        let (es, ds) = (eager_cache.state.as_ref(), decode_cache.state.as_ref());
        assert!(
            same(es.unwrap(), ds.unwrap()),
            "{label} step {step}: recurrent state"
        );
    }
}

/// The Gated DeltaNet layer's decode block (Qwen3.5 / Qwen3.6) against the
/// eager layer, at the tiny specs' shape and at Qwen3.5-4B's real one
/// (hidden 2560, 16 key / 32 value heads of 128; a narrower MLP), float32
/// and bfloat16, with a SwiGLU MLP or routed experts with a shared expert;
/// every block compiles (all float constants are inputs).
#[test]
fn delta_net_decode_blocks_match_the_eager_layer() {
    use archgen_runtime::deltanet::DeltaNetShape;
    let tiny = DeltaNetShape {
        hidden: 64,
        num_k_heads: 2,
        num_v_heads: 4,
        head_k_dim: 16,
        head_v_dim: 16,
        conv_kernel: 4,
        eps: 1e-6,
    };
    let real = DeltaNetShape {
        hidden: 2560,
        num_k_heads: 16,
        num_v_heads: 32,
        head_k_dim: 128,
        head_v_dim: 128,
        ..tiny
    };
    for dt in [Dtype::Float32, Dtype::Bfloat16] {
        for prefill in [0, 5] {
            run_delta_net_layer(tiny, 128, false, prefill, dt);
        }
        run_delta_net_layer(tiny, 128, true, 5, dt);
        run_delta_net_layer(real, 512, false, 5, dt);
    }
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 3 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}

/// A prefill of 5 tokens (eager on both caches), then decode steps of one
/// gated full-attention layer (`Qwen3NextAttention`, partial RoPE): eager
/// (`deltanet::gated_attention`, as the monolith and the generated prefill)
/// and through `decode::gated_attention` (as generated models), on
/// separate caches; every step's output byte-identical.
fn run_gated_attention_layer(hidden: i32, s: AttentionShape, rope: Rope, moe: bool, dt: Dtype) {
    use archgen_runtime::deltanet::{self, GatedAttention};
    let (ds, _, ffn) = delta_net_parts(
        archgen_runtime::deltanet::DeltaNetShape {
            hidden,
            num_k_heads: 1,
            num_v_heads: 1,
            head_k_dim: 16,
            head_v_dim: 16,
            conv_kernel: 4,
            eps: s.eps,
        },
        256,
        moe,
        dt,
    );
    let norms = ds;
    let (q, kv) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let attn = GatedAttention {
        q_proj: linear(51, 2 * q, hidden, dt),
        k_proj: linear(52, kv, hidden, dt),
        v_proj: linear(53, kv, hidden, dt),
        o_proj: linear(54, hidden, q, dt),
        q_norm: norm(55, s.head_dim, dt),
        k_norm: norm(56, s.head_dim, dt),
    };
    let (mut attn_d, mut ffn_d) = (attn.clone(), ffn.clone());
    attn_d.pretranspose();
    ffn_d.pretranspose();
    let eager = |h: &Array, cache: &mut LayerCache| -> Array {
        let mask = b::mask_for(cache, h.shape()[1], 0).unwrap();
        let x = mlx_rs::fast::rms_norm(h, Some(norms.input()), s.eps).unwrap();
        let a = deltanet::gated_attention(&x, &attn, s, &rope, cache, &mask).unwrap();
        let h = b::attention_residual(h, &a, &norms, s.eps, b::Residual::Plain).unwrap();
        // The blocks spelled out, not `FeedForward::after_mixer`, which the
        // decode block runs.
        match &ffn {
            FeedForward::Mlp { mlp, moe } => {
                b::feed_forward(&h, &norms, mlp, moe.as_ref(), s.eps, b::Residual::Plain).unwrap()
            }
            FeedForward::SparseMoe(m) => b::experts_feed_forward(&h, &norms, m, s.eps).unwrap(),
            FeedForward::SharedExpertMoe(m) => {
                b::experts_feed_forward(&h, &norms, m, s.eps).unwrap()
            }
            FeedForward::GroupRoutedMoe(m) => {
                b::experts_feed_forward(&h, &norms, m, s.eps).unwrap()
            }
            FeedForward::BiasedExperts(m) => b::experts_feed_forward(&h, &norms, m, s.eps).unwrap(),
        }
    };
    let (mut eager_cache, mut decode_cache) = (
        LayerCache::Full(KvCache::default()),
        LayerCache::Full(KvCache::default()),
    );
    let h = lcg(400, &[1, 5, hidden], 4.0, 0.0).as_dtype(dt).unwrap();
    let a = eager(&h, &mut eager_cache);
    let b = eager(&h, &mut decode_cache);
    assert!(same(&a, &b), "prefill is deterministic");
    let label = format!("gated attention hidden {hidden} moe {moe} {dt:?}");
    for step in 0..6 {
        let h = lcg(401 + step, &[1, 1, hidden], 4.0, 0.0)
            .as_dtype(dt)
            .unwrap();
        let want = eager(&h, &mut eager_cache);
        let layer = decode::GatedAttentionLayer {
            norms: &norms,
            attn: &attn_d,
            ffn: &ffn_d,
            shape: s,
            eps: s.eps,
        };
        let mask = b::mask_for(&decode_cache, 1, 0).unwrap();
        let tables = rope.tables(decode_cache.offset(), 1, dt).unwrap();
        let got = decode::gated_attention(&h, &layer, &tables, &mut decode_cache, &mask).unwrap();
        assert!(same(&want, &got), "{label} step {step}");
    }
}

/// The gated full-attention layer's decode blocks (Qwen3.5 / Qwen3.6)
/// against the eager layer: the tiny specs' shape (4 heads of 16, RoPE on 4
/// dims) and Qwen3.5-4B's (hidden 2560, 16 heads / 4 KV heads of 256, RoPE
/// on 64 dims, base 1e7; a narrower MLP), float32 and bfloat16, MLP or
/// shared-expert MoE; every block compiles.
#[test]
fn gated_attention_decode_blocks_match_the_eager_layer() {
    let tiny = AttentionShape {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        eps: 1e-6,
        scale: (16f64).powf(-0.5) as f32,
        value_norm: b::ValueNorm::None,
        scores: b::Scores::FusedSdpa,
    };
    let real = AttentionShape {
        n_heads: 16,
        n_kv_heads: 4,
        head_dim: 256,
        scale: (256f64).powf(-0.5) as f32,
        ..tiny
    };
    for dt in [Dtype::Float32, Dtype::Bfloat16] {
        run_gated_attention_layer(64, tiny, Rope::base(4, 10_000_000.0), false, dt);
        run_gated_attention_layer(64, tiny, Rope::base(4, 10_000_000.0), true, dt);
        run_gated_attention_layer(2560, real, Rope::base(64, 10_000_000.0), false, dt);
    }
    let (compiled, eager) = decode::block_counts();
    assert!(
        compiled >= 4 && eager == 0,
        "{compiled} compiled, {eager} eager"
    );
}
