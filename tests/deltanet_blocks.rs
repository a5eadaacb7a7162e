//! The Qwen3.5 / Qwen3.6 runtime blocks (`archgen_runtime::deltanet`)
//! against mlx-lm 0.32.2's own modules (tests/python/deltanet_blocks.py),
//! byte for byte on the CPU: the Gated DeltaNet layer (both in_proj
//! layouts) with every intermediate (projections, conv output and conv
//! state, normalised q/k, the recurrence output and its float32 state, the
//! gated norm) over a prefill in two chunks and decode steps; the gated
//! delta rule alone over 64 tokens; gated full attention (partial RoPE,
//! sigmoid output gate) over a KV cache; the shared-expert MoE block; whole
//! decoder layers of both kinds; and the raw-HF sanitize and cast rules.
//! bf16 and f32, unquantized and 4-bit, at tiny widths and at Qwen3.5-4B's.
//! Python runs once for all cases.

use std::collections::HashMap;

use archgen_runtime::attention::Mask;
use archgen_runtime::blocks::{Activation, AttentionShape, Mlp, Scores, ValueNorm};
use archgen_runtime::bytes::array_bytes;
use archgen_runtime::cache::{KvCache, LayerCache};
use archgen_runtime::deltanet::{
    causal_conv1d, deltanet_projections, gated_attention, gated_delta_net, gated_delta_update,
    normalize_qk, rms_norm_gated, ArraysCache, DeltaNetShape, GatedAttention, GatedDeltaNet,
    InProj, MixerCache, SharedExpertMoe,
};
use archgen_runtime::layers::{Linear, QuantForm, Quantized, SwitchLinear};
use archgen_runtime::mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use archgen_runtime::mlx_rs::{self, Array, Dtype};
use archgen_runtime::moe::{SoftmaxTopKRouter, SwitchGlu, TopKProbs};
use archgen_runtime::ops::{rms_norm, scalar_like};
use archgen_runtime::rope::Rope;
use archgen_tests::run_python;
use serde_json::{json, Value};

type R<T> = Result<T, mlx_rs::error::Exception>;

/// Exact f32 values in [-1, 1) from an integer LCG: the same bits on every
/// machine (as in family_blocks.rs).
fn lcg(seed: u64, shape: &[i32]) -> Array {
    let n: i32 = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
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

#[derive(Clone, Copy, Debug)]
enum Dt {
    F32,
    Bf16,
}

impl Dt {
    fn dtype(self) -> Dtype {
        match self {
            Dt::F32 => Dtype::Float32,
            Dt::Bf16 => Dtype::Bfloat16,
        }
    }
    fn tag(self) -> &'static str {
        match self {
            Dt::F32 => "f32",
            Dt::Bf16 => "bf16",
        }
    }
}

/// Affine weight quantization: (bits, group size).
#[derive(Clone, Copy, Debug)]
struct Quant {
    bits: i32,
    group: i32,
}

const Q4G64: Quant = Quant { bits: 4, group: 64 };
const Q4G32: Quant = Quant { bits: 4, group: 32 };
/// What qwen3_5's `quant_predicate` gives the router and the shared expert gate.
const Q8G64: Quant = Quant { bits: 8, group: 64 };

fn quant_tag(q: Option<Quant>) -> String {
    match q {
        None => "dense".into(),
        Some(q) => format!("q{}g{}", q.bits, q.group),
    }
}

fn quant_json(q: Option<Quant>) -> Value {
    match q {
        None => Value::Null,
        Some(q) => json!({"bits": q.bits, "group_size": q.group}),
    }
}

/// One case: what Python is told, the tensors it gets, what Rust computed.
struct Case {
    spec: Value,
    name: String,
    tensors: Vec<(String, Array)>,
    ours: Vec<(String, Array)>,
    seed: u64,
}

fn join(path: &str, leaf: &str) -> String {
    if path.is_empty() {
        leaf.to_string()
    } else {
        format!("{path}.{leaf}")
    }
}

impl Case {
    fn new(block: &str, name: String, mut spec: Value) -> Self {
        spec["block"] = json!(block);
        spec["name"] = json!(name.clone());
        let seed = name
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(b as u64));
        Case {
            spec,
            name,
            tensors: Vec::new(),
            ours: Vec::new(),
            seed,
        }
    }

    /// Fresh random values `[-1, 1) * scale + offset`, cast to `dt`.
    fn rand_at(&mut self, shape: &[i32], scale: f32, offset: f32, dt: Dtype) -> Array {
        self.seed += 1;
        let a = lcg(self.seed, shape)
            .multiply(Array::from_f32(scale))
            .unwrap()
            .add(Array::from_f32(offset))
            .unwrap();
        a.as_dtype(dt).unwrap()
    }

    fn rand(&mut self, shape: &[i32], scale: f32, dt: Dt) -> Array {
        self.rand_at(shape, scale, 0.0, dt.dtype())
    }

    fn param(&mut self, path: &str, a: &Array) {
        self.tensors.push((path.to_string(), a.clone()));
    }

    fn input(&mut self, name: &str, a: &Array) {
        self.tensors.push((format!("@{name}"), a.clone()));
    }

    fn out(&mut self, name: &str, a: Array) {
        self.ours.push((name.to_string(), a));
    }

    /// Weight, optional quantization, written under `path` (mlx nn names).
    fn weight(&mut self, path: &str, w: &Array, q: Option<Quant>) -> (Array, Option<Quantized>) {
        match q {
            None => {
                self.param(&join(path, "weight"), w);
                (w.clone(), None)
            }
            Some(q) => {
                let (wq, scales, biases) = mlx_rs::ops::quantize(w, q.group, q.bits).unwrap();
                self.param(&join(path, "weight"), &wq);
                self.param(&join(path, "scales"), &scales);
                self.param(&join(path, "biases"), &biases);
                (
                    wq,
                    Some(Quantized {
                        scales,
                        form: QuantForm::Affine { biases },
                        group_size: q.group,
                        bits: q.bits,
                    }),
                )
            }
        }
    }

    /// A random `[out, in]` Linear (`scale / sqrt(in)`) under `path`.
    fn linear_scaled(
        &mut self,
        path: &str,
        out: i32,
        inp: i32,
        scale: f32,
        dt: Dt,
        q: Option<Quant>,
    ) -> Linear {
        let w = self.rand(&[out, inp], scale / (inp as f32).sqrt(), dt);
        let (weight, quant) = self.weight(path, &w, q);
        Linear {
            weight,
            quant,
            weight_t: None,
            bias: None,
        }
    }

    fn linear(&mut self, path: &str, out: i32, inp: i32, dt: Dt, q: Option<Quant>) -> Linear {
        self.linear_scaled(path, out, inp, 1.0, dt, q)
    }

    fn switch_linear(
        &mut self,
        path: &str,
        e: i32,
        out: i32,
        inp: i32,
        dt: Dt,
        q: Option<Quant>,
    ) -> SwitchLinear {
        let w = self.rand(&[e, out, inp], 1.0 / (inp as f32).sqrt(), dt);
        let (weight, quant) = self.weight(path, &w, q);
        SwitchLinear {
            weight,
            quant,
            bias: None,
        }
    }

    /// A norm weight around 1 (what converted checkpoints hold).
    fn norm(&mut self, path: &str, n: i32, dt: Dt) -> Array {
        let w = self.rand_at(&[n], 0.25, 1.0, dt.dtype());
        self.param(path, &w);
        w
    }
}

// ---------------------------------------------------------------- shapes

/// The text config of one case: what Python builds `TextModelArgs` from.
#[derive(Clone, Copy, Debug)]
struct Dims {
    hidden: i32,
    // Gated DeltaNet
    hk: i32,
    hv: i32,
    dk: i32,
    dv: i32,
    kernel: i32,
    // Gated full attention
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    partial_rotary_factor: f64,
    rope_theta: f64,
    // Feed-forward
    inter: i32,
    experts: i32,
    top_k: i32,
    moe_inter: i32,
    shared_inter: i32,
}

const EPS: f32 = 1e-6;

/// Tiny widths: 2 key heads, 4 value heads (q/k repeated twice).
const TINY: Dims = Dims {
    hidden: 64,
    hk: 2,
    hv: 4,
    dk: 32,
    dv: 16,
    kernel: 4,
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    partial_rotary_factor: 0.25,
    rope_theta: 10_000_000.0,
    inter: 128,
    experts: 8,
    top_k: 2,
    moe_inter: 64,
    shared_inter: 64,
};

/// Qwen3.6-27B's head ratio (48 value heads over 16 key heads: q/k repeated
/// three times), at a tiny width.
const TINY_R3: Dims = Dims {
    hk: 2,
    hv: 6,
    dk: 16,
    dv: 32,
    kernel: 4,
    ..TINY
};

/// Qwen3.5-4B's widths (config values as in specs/configs/).
const QWEN35_4B: Dims = Dims {
    hidden: 2560,
    hk: 16,
    hv: 32,
    dk: 128,
    dv: 128,
    kernel: 4,
    heads: 16,
    kv_heads: 4,
    head_dim: 256,
    partial_rotary_factor: 0.25,
    rope_theta: 10_000_000.0,
    inter: 9216,
    experts: 0,
    top_k: 0,
    moe_inter: 0,
    shared_inter: 0,
};

/// Qwen3.6-27B's widths: 48 value heads over 16 key heads (q/k repeated
/// three times), hidden 5120.
const QWEN36_27B: Dims = Dims {
    hidden: 5120,
    hv: 48,
    heads: 24,
    inter: 17408,
    ..QWEN35_4B
};

/// Qwen3.6-35B-A3B's widths (hidden 2048, top-8 of experts 512 wide, a
/// shared expert 512 wide) with 16 of its 256 experts.
const QWEN36_35B_A3B_16E: Dims = Dims {
    hidden: 2048,
    heads: 16,
    kv_heads: 2,
    experts: 16,
    top_k: 8,
    moe_inter: 512,
    shared_inter: 512,
    ..QWEN35_4B
};

impl Dims {
    fn tag(&self) -> String {
        format!(
            "{}h{}k{}v{}x{}",
            self.hidden, self.hk, self.hv, self.dk, self.dv
        )
    }

    fn delta(&self) -> DeltaNetShape {
        DeltaNetShape {
            hidden: self.hidden,
            num_k_heads: self.hk,
            num_v_heads: self.hv,
            head_k_dim: self.dk,
            head_v_dim: self.dv,
            conv_kernel: self.kernel,
            eps: EPS,
        }
    }

    fn attention(&self) -> AttentionShape {
        AttentionShape {
            n_heads: self.heads,
            n_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            eps: EPS,
            scale: f64::from(self.head_dim).powf(-0.5) as f32,
            value_norm: ValueNorm::None,
            scores: Scores::FusedSdpa,
        }
    }

    fn rope(&self) -> Rope {
        Rope::base(
            partial_rope_dims(self.head_dim, self.partial_rotary_factor),
            self.rope_theta as f32,
        )
    }

    /// qwen3_5's `TextModelArgs` (`moe` picks the MoE feed-forward).
    fn qwen3_5_args(&self, moe: bool) -> Value {
        let (experts, top_k) = if moe {
            (self.experts, self.top_k)
        } else {
            (0, 0)
        };
        json!({
            "model_type": "qwen3_5_text", "hidden_size": self.hidden,
            "intermediate_size": self.inter, "num_hidden_layers": 4,
            "num_attention_heads": self.heads, "rms_norm_eps": EPS, "vocab_size": 1,
            "num_key_value_heads": self.kv_heads, "linear_num_value_heads": self.hv,
            "linear_num_key_heads": self.hk, "linear_key_head_dim": self.dk,
            "linear_value_head_dim": self.dv, "linear_conv_kernel_dim": self.kernel,
            "head_dim": self.head_dim, "full_attention_interval": 4,
            "num_experts": experts, "num_experts_per_tok": top_k,
            "shared_expert_intermediate_size": self.shared_inter,
            "moe_intermediate_size": self.moe_inter, "norm_topk_prob": true,
            "rope_parameters": {"type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor},
        })
    }

    /// qwen3_next's `ModelArgs` (the fused in_proj layout).
    fn qwen3_next_args(&self) -> Value {
        json!({
            "model_type": "qwen3_next", "hidden_size": self.hidden, "num_hidden_layers": 4,
            "intermediate_size": self.inter, "num_attention_heads": self.heads,
            "linear_num_value_heads": self.hv, "linear_num_key_heads": self.hk,
            "linear_key_head_dim": self.dk, "linear_value_head_dim": self.dv,
            "linear_conv_kernel_dim": self.kernel, "num_experts": 0, "num_experts_per_tok": 0,
            "decoder_sparse_step": 1, "shared_expert_intermediate_size": 0,
            "mlp_only_layers": [], "moe_intermediate_size": 0, "rms_norm_eps": EPS,
            "vocab_size": 1, "num_key_value_heads": self.kv_heads,
            "rope_theta": self.rope_theta, "partial_rotary_factor": self.partial_rotary_factor,
            "max_position_embeddings": 4096, "head_dim": self.head_dim,
        })
    }
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    /// qwen3_5: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a.
    Split,
    /// qwen3_next: in_proj_qkvz, in_proj_ba.
    Fused,
}

/// A Gated DeltaNet layer's weights under `p` (mlx-lm's parameter names).
fn deltanet_weights(
    c: &mut Case,
    p: &str,
    d: &Dims,
    layout: Layout,
    dt: Dt,
    q: Option<Quant>,
) -> GatedDeltaNet {
    let s = d.delta();
    let in_proj = match layout {
        Layout::Split => InProj::Split {
            qkv: c.linear(&join(p, "in_proj_qkv"), s.conv_dim(), d.hidden, dt, q),
            z: c.linear(&join(p, "in_proj_z"), s.value_dim(), d.hidden, dt, q),
            b: c.linear_scaled(&join(p, "in_proj_b"), d.hv, d.hidden, 2.0, dt, q),
            a: c.linear_scaled(&join(p, "in_proj_a"), d.hv, d.hidden, 2.0, dt, q),
        },
        Layout::Fused => InProj::Fused {
            qkvz: c.linear(
                &join(p, "in_proj_qkvz"),
                s.conv_dim() + s.value_dim(),
                d.hidden,
                dt,
                q,
            ),
            ba: c.linear_scaled(&join(p, "in_proj_ba"), 2 * d.hv, d.hidden, 2.0, dt, q),
        },
    };
    let conv1d = c.rand(&[s.conv_dim(), d.kernel, 1], 0.6, dt);
    c.param(&join(p, "conv1d.weight"), &conv1d);
    let dt_bias = c.rand(&[d.hv], 1.0, dt);
    c.param(&join(p, "dt_bias"), &dt_bias);
    // mlx-lm initialises A_log = log(uniform(0, 16)); stored float32.
    let a_log = c.rand_at(&[d.hv], 1.5, 0.5, Dtype::Float32);
    c.param(&join(p, "A_log"), &a_log);
    let norm = c.norm(&join(p, "norm.weight"), d.dv, dt);
    let out_proj = c.linear(&join(p, "out_proj"), d.hidden, s.value_dim(), dt, q);
    GatedDeltaNet {
        in_proj,
        conv1d,
        dt_bias,
        a_log,
        norm,
        out_proj,
        shape: s,
    }
}

fn gated_attention_weights(
    c: &mut Case,
    p: &str,
    d: &Dims,
    dt: Dt,
    q: Option<Quant>,
) -> GatedAttention {
    GatedAttention {
        q_proj: c.linear(
            &join(p, "q_proj"),
            2 * d.heads * d.head_dim,
            d.hidden,
            dt,
            q,
        ),
        k_proj: c.linear(&join(p, "k_proj"), d.kv_heads * d.head_dim, d.hidden, dt, q),
        v_proj: c.linear(&join(p, "v_proj"), d.kv_heads * d.head_dim, d.hidden, dt, q),
        o_proj: c.linear(&join(p, "o_proj"), d.hidden, d.heads * d.head_dim, dt, q),
        q_norm: c.norm(&join(p, "q_norm.weight"), d.head_dim, dt),
        k_norm: c.norm(&join(p, "k_norm.weight"), d.head_dim, dt),
    }
}

fn mlp_weights(c: &mut Case, p: &str, hidden: i32, inter: i32, dt: Dt, q: Option<Quant>) -> Mlp {
    Mlp {
        gate_up: archgen_runtime::blocks::GateUp::Separate {
            gate_proj: c.linear(&join(p, "gate_proj"), inter, hidden, dt, q),
            up_proj: c.linear(&join(p, "up_proj"), inter, hidden, dt, q),
        },
        down_proj: c.linear(&join(p, "down_proj"), hidden, inter, dt, q),
        activation: Activation::Silu,
    }
}

/// `Qwen3NextSparseMoeBlock` under `p`; the router and the shared expert
/// gate at 8 bits when the rest is quantized (qwen3_5's `quant_predicate`).
fn moe_weights(c: &mut Case, p: &str, d: &Dims, dt: Dt, q: Option<Quant>) -> SharedExpertMoe {
    let gate_q = q.map(|_| Q8G64);
    let gw = c.rand(&[d.experts, d.hidden], 4.0 / (d.hidden as f32).sqrt(), dt);
    let (weight, quant) = c.weight(&join(p, "gate"), &gw, gate_q);
    let router = SoftmaxTopKRouter {
        gate: Linear {
            weight,
            quant,
            weight_t: None,
            bias: None,
        },
        top_k: d.top_k,
        probs: TopKProbs::Renormalized,
    };
    let sw = join(p, "switch_mlp");
    let experts = SwitchGlu {
        gate_proj: c.switch_linear(
            &join(&sw, "gate_proj"),
            d.experts,
            d.moe_inter,
            d.hidden,
            dt,
            q,
        ),
        up_proj: c.switch_linear(
            &join(&sw, "up_proj"),
            d.experts,
            d.moe_inter,
            d.hidden,
            dt,
            q,
        ),
        down_proj: c.switch_linear(
            &join(&sw, "down_proj"),
            d.experts,
            d.hidden,
            d.moe_inter,
            dt,
            q,
        ),
    };
    let shared_expert = mlp_weights(
        c,
        &join(p, "shared_expert"),
        d.hidden,
        d.shared_inter,
        dt,
        q,
    );
    let shared_expert_gate =
        c.linear_scaled(&join(p, "shared_expert_gate"), 1, d.hidden, 3.0, dt, gate_q);
    SharedExpertMoe {
        router,
        experts,
        shared_expert,
        shared_expert_gate,
    }
}

/// The token chunks a sequence runs in: a prefill in two chunks (the second
/// continues from the caches, as mlx-lm's chunked prefill does), then
/// one-token decode steps.
fn chunks_of(x: &Array, sizes: &[i32]) -> R<Vec<Array>> {
    let mut start = 0;
    sizes
        .iter()
        .map(|&n| {
            let a = x.try_index((.., start..start + n))?;
            start += n;
            Ok(a)
        })
        .collect()
}

// ---------------------------------------------------------------- cases

/// A Gated DeltaNet layer (`GatedDeltaNet` / `Qwen3NextGatedDeltaNet`) with
/// its ArraysCache over the chunks: the module output, the caches after each
/// call, and every intermediate mlx-lm hands `gated_delta_update` and the
/// gated norm. The intermediates come from the sub-blocks composed in the
/// test; `y` also from `gated_delta_net` itself.
fn deltanet(dt: Dt, q: Option<Quant>, d: &Dims, layout: Layout, sizes: &[i32]) -> R<Case> {
    let lay = match layout {
        Layout::Split => "qwen3_5",
        Layout::Fused => "qwen3_next",
    };
    let name = format!(
        "deltanet_{lay}_{}_{}_{}_t{}",
        dt.tag(),
        quant_tag(q),
        d.tag(),
        sizes
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join("+")
    );
    let args = match layout {
        Layout::Split => d.qwen3_5_args(false),
        Layout::Fused => d.qwen3_next_args(),
    };
    let spec = json!({"module": lay, "args": args, "quant": quant_json(q), "chunks": sizes});
    let mut c = Case::new("deltanet", name, spec);
    let w = deltanet_weights(&mut c, "", d, layout, dt, q);
    let s = w.shape;
    let total: i32 = sizes.iter().sum();
    let x = c.rand(&[1, total, d.hidden], 1.5, dt);
    c.input("x", &x);
    let mut cache = ArraysCache::default();
    let mut comp = ArraysCache::default();
    for (i, xi) in chunks_of(&x, sizes)?.iter().enumerate() {
        let (bsz, len) = (xi.shape()[0], xi.shape()[1]);
        c.out(&format!("c{i}/y"), gated_delta_net(xi, &w, &mut cache)?);
        c.out(&format!("c{i}/conv_state"), cache.conv.clone().unwrap());
        c.out(&format!("c{i}/state"), cache.state.clone().unwrap());
        // The same layer from its sub-blocks.
        let (qkv, z, b, a) = deltanet_projections(xi, &w.in_proj, &s)?;
        let (conv_out, conv_state) =
            causal_conv1d(&qkv, &w.conv1d, comp.conv.as_ref(), xi.dtype())?;
        let kd = s.key_dim();
        let parts = conv_out.split_at_indices(&[kd, 2 * kd], -1)?;
        let qh = parts[0].reshape(&[bsz, len, s.num_k_heads, s.head_k_dim])?;
        let kh = parts[1].reshape(&[bsz, len, s.num_k_heads, s.head_k_dim])?;
        let vh = parts[2].reshape(&[bsz, len, s.num_v_heads, s.head_v_dim])?;
        let (qn, kn) = normalize_qk(&qh, &kh, s.head_k_dim)?;
        let (rec, state) = gated_delta_update(
            &qn,
            &kn,
            &vh,
            &a,
            &b,
            &w.a_log,
            &w.dt_bias,
            comp.state.as_ref(),
        )?;
        let normed = rms_norm_gated(&rec, &z, &w.norm, s.eps)?;
        let y = w.out_proj.forward(&normed.reshape(&[bsz, len, -1])?)?;
        for (k, v) in [
            ("q", qn),
            ("k", kn),
            ("v", vh),
            ("a", a),
            ("b", b),
            ("z", z),
            ("rec", rec),
            ("normed", normed),
        ] {
            c.out(&format!("c{i}/{k}"), v);
        }
        c.out(&format!("c{i}/y@composed"), y);
        c.out(&format!("c{i}/conv_state@composed"), conv_state.clone());
        c.out(&format!("c{i}/state@composed"), state.clone());
        comp.conv = Some(conv_state);
        comp.state = Some(state);
    }
    Ok(c)
}

/// `gated_delta_update` alone over many tokens, from zeros or a given state.
fn recurrence(dt: Dt, d: &Dims, t: i32, with_state: bool) -> R<Case> {
    let start = if with_state { "state" } else { "zeros" };
    let name = format!("recurrence_{}_{}_t{t}_{start}", dt.tag(), d.tag());
    let mut c = Case::new("recurrence", name, json!({"with_state": with_state}));
    let q = c.rand(&[1, t, d.hk, d.dk], 0.3, dt);
    let k = c.rand(&[1, t, d.hk, d.dk], 0.3, dt);
    let (qn, kn) = normalize_qk(&q, &k, d.dk)?;
    let v = c.rand(&[1, t, d.hv, d.dv], 1.0, dt);
    let a = c.rand(&[1, t, d.hv], 3.0, dt);
    let b = c.rand(&[1, t, d.hv], 3.0, dt);
    let a_log = c.rand_at(&[d.hv], 1.5, 0.5, Dtype::Float32);
    let dt_bias = c.rand(&[d.hv], 1.0, dt);
    for (n, arr) in [
        ("q", &q),
        ("k", &k),
        ("v", &v),
        ("a", &a),
        ("b", &b),
        ("A_log", &a_log),
        ("dt_bias", &dt_bias),
    ] {
        c.input(n, arr);
    }
    let state = if with_state {
        let s = c.rand_at(&[1, d.hv, d.dv, d.dk], 0.5, 0.0, Dtype::Float32);
        c.input("state", &s);
        Some(s)
    } else {
        None
    };
    let (y, state) = gated_delta_update(&qn, &kn, &v, &a, &b, &a_log, &dt_bias, state.as_ref())?;
    c.out("y", y);
    c.out("state", state);
    Ok(c)
}

/// `Qwen3NextAttention` with a KVCache over the chunks.
fn attention(dt: Dt, q: Option<Quant>, d: &Dims, sizes: &[i32]) -> R<Case> {
    let name = format!(
        "gated_attention_{}_{}_{}x{}h{}kv_rope{}",
        dt.tag(),
        quant_tag(q),
        d.hidden,
        d.heads,
        d.kv_heads,
        partial_rope_dims(d.head_dim, d.partial_rotary_factor)
    );
    let spec = json!({"args": d.qwen3_5_args(false), "quant": quant_json(q), "chunks": sizes});
    let mut c = Case::new("gated_attention", name, spec);
    let w = gated_attention_weights(&mut c, "", d, dt, q);
    let total: i32 = sizes.iter().sum();
    let x = c.rand(&[1, total, d.hidden], 1.5, dt);
    c.input("x", &x);
    let mut cache = LayerCache::Full(KvCache::default());
    let rope = d.rope();
    for (i, xi) in chunks_of(&x, sizes)?.iter().enumerate() {
        let mask = match &cache {
            LayerCache::Full(kv) => kv.make_mask(xi.shape()[1]),
            _ => unreachable!("a full KV cache was made above"),
        };
        let y = gated_attention(xi, &w, d.attention(), &rope, &mut cache, &mask)?;
        c.out(&format!("c{i}/y"), y);
    }
    Ok(c)
}

/// `Qwen3NextSparseMoeBlock`: routed experts plus the gated shared expert.
fn moe(dt: Dt, q: Option<Quant>, d: &Dims, tokens: i32) -> R<Case> {
    let name = format!(
        "shared_expert_moe_{}_{}_{}e{}k{}_t{tokens}",
        dt.tag(),
        quant_tag(q),
        d.hidden,
        d.experts,
        d.top_k
    );
    let spec = json!({"args": d.qwen3_5_args(true), "quant": quant_json(q)});
    let mut c = Case::new("moe", name, spec);
    let m = moe_weights(&mut c, "", d, dt, q);
    let x = c.rand(&[1, tokens, d.hidden], 2.0, dt);
    c.input("x", &x);
    c.out("y", m.forward(&x)?);
    Ok(c)
}

/// A whole `DecoderLayer` (pre-norm, mixer, feed-forward) with its cache
/// over the chunks. `index` 0 is a linear layer, 3 a full-attention one.
fn layer(dt: Dt, q: Option<Quant>, d: &Dims, index: usize, moe: bool, sizes: &[i32]) -> R<Case> {
    let linear = (index + 1) % 4 != 0;
    let name = format!(
        "layer{index}_{}_{}_{}_{}_{}",
        if linear { "linear" } else { "full" },
        if moe { "moe" } else { "mlp" },
        dt.tag(),
        quant_tag(q),
        d.tag()
    );
    let spec = json!({
        "args": d.qwen3_5_args(moe), "quant": quant_json(q), "chunks": sizes, "index": index,
    });
    let mut c = Case::new("layer", name, spec);
    let (mixer, mut cache) = if linear {
        let w = deltanet_weights(&mut c, "linear_attn", d, Layout::Split, dt, q);
        (
            Mixer::GatedDeltaNet(w),
            MixerCache::Arrays(ArraysCache::default()),
        )
    } else {
        let attention = gated_attention_weights(&mut c, "self_attn", d, dt, q);
        (
            Mixer::GatedAttention {
                attention,
                shape: d.attention(),
                rope: d.rope(),
            },
            MixerCache::Kv(LayerCache::Full(KvCache::default())),
        )
    };
    let input_norm = c.norm("input_layernorm.weight", d.hidden, dt);
    let post_norm = c.norm("post_attention_layernorm.weight", d.hidden, dt);
    let ffn = if moe {
        LayerMlp::SharedExpertMoe(moe_weights(&mut c, "mlp", d, dt, q))
    } else {
        LayerMlp::Dense(mlp_weights(&mut c, "mlp", d.hidden, d.inter, dt, q))
    };
    let total: i32 = sizes.iter().sum();
    let x = c.rand(&[1, total, d.hidden], 1.0, dt);
    c.input("x", &x);
    for (i, xi) in chunks_of(&x, sizes)?.iter().enumerate() {
        let mask = match &cache {
            MixerCache::Kv(LayerCache::Full(kv)) => kv.make_mask(xi.shape()[1]),
            MixerCache::Kv(_) => unreachable!("a full KV cache was made above"),
            MixerCache::Arrays(_) => Mask::None,
        };
        let y = hybrid_decoder_layer(
            xi,
            &mixer,
            &ffn,
            &input_norm,
            &post_norm,
            EPS,
            &mut cache,
            &mask,
        )?;
        c.out(&format!("c{i}/y"), y);
        if let MixerCache::Arrays(a) = &cache {
            c.out(&format!("c{i}/conv_state"), a.conv.clone().unwrap());
            c.out(&format!("c{i}/state"), a.state.clone().unwrap());
        }
    }
    Ok(c)
}

/// mlx-lm's `Model.sanitize` (qwen3_5 or qwen3_5_moe) on a raw HF checkpoint
/// of a tiny model (or an already converted one), then `mlx_lm.convert`'s
/// cast to bf16 with the model's `cast_predicate`.
fn sanitize(variant: Qwen35Variant, raw: bool, tied: bool) -> R<Case> {
    let d = TINY;
    let moe = variant == Qwen35Variant::Moe;
    let name = format!(
        "sanitize_{}_{}_{}",
        if moe { "moe" } else { "dense" },
        if raw { "raw" } else { "converted" },
        if tied { "tied" } else { "untied" }
    );
    let mut args = d.qwen3_5_args(moe);
    args["tie_word_embeddings"] = json!(tied);
    args["model_type"] = json!(if moe { "qwen3_5_moe" } else { "qwen3_5" });
    let spec = json!({"config": {"model_type": args["model_type"], "text_config": args}});
    let mut c = Case::new("sanitize", name, spec);
    let s = d.delta();
    let lm = "model.language_model";
    let mut tensors: Vec<(String, Array)> = Vec::new();
    let mut t = |c: &mut Case, k: String, shape: &[i32], dt: Dtype| {
        let a = c.rand_at(shape, 0.5, 0.0, dt);
        tensors.push((k, a));
    };
    t(
        &mut c,
        format!("{lm}.embed_tokens.weight"),
        &[8, d.hidden],
        Dtype::Float32,
    );
    t(
        &mut c,
        format!("{lm}.norm.weight"),
        &[d.hidden],
        Dtype::Bfloat16,
    );
    t(
        &mut c,
        "lm_head.weight".into(),
        &[8, d.hidden],
        Dtype::Float32,
    );
    t(
        &mut c,
        "model.visual.blocks.0.attn.qkv.weight".into(),
        &[4, 4],
        Dtype::Float32,
    );
    t(
        &mut c,
        "mtp.layers.0.input_layernorm.weight".into(),
        &[d.hidden],
        Dtype::Float32,
    );
    t(
        &mut c,
        "mtp.fc.weight".into(),
        &[d.hidden, 2 * d.hidden],
        Dtype::Float32,
    );
    for l in 0..4 {
        let p = format!("{lm}.layers.{l}");
        t(
            &mut c,
            format!("{p}.input_layernorm.weight"),
            &[d.hidden],
            Dtype::Bfloat16,
        );
        t(
            &mut c,
            format!("{p}.post_attention_layernorm.weight"),
            &[d.hidden],
            Dtype::Float32,
        );
        if l == 3 {
            let a = format!("{p}.self_attn");
            t(
                &mut c,
                format!("{a}.q_norm.weight"),
                &[d.head_dim],
                Dtype::Bfloat16,
            );
            t(
                &mut c,
                format!("{a}.k_norm.weight"),
                &[d.head_dim],
                Dtype::Float32,
            );
            t(
                &mut c,
                format!("{a}.q_proj.weight"),
                &[2 * d.heads * d.head_dim, d.hidden],
                Dtype::Float32,
            );
        } else {
            let a = format!("{p}.linear_attn");
            let conv = if raw {
                [s.conv_dim(), 1, d.kernel]
            } else {
                [s.conv_dim(), d.kernel, 1]
            };
            t(&mut c, format!("{a}.conv1d.weight"), &conv, Dtype::Bfloat16);
            t(&mut c, format!("{a}.A_log"), &[d.hv], Dtype::Float32);
            t(&mut c, format!("{a}.dt_bias"), &[d.hv], Dtype::Float32);
            t(&mut c, format!("{a}.norm.weight"), &[d.dv], Dtype::Float32);
            t(
                &mut c,
                format!("{a}.in_proj_a.weight"),
                &[d.hv, d.hidden],
                Dtype::Bfloat16,
            );
        }
        let m = format!("{p}.mlp");
        if moe {
            t(
                &mut c,
                format!("{m}.experts.gate_up_proj"),
                &[d.experts, 2 * d.moe_inter, d.hidden],
                Dtype::Float32,
            );
            t(
                &mut c,
                format!("{m}.experts.down_proj"),
                &[d.experts, d.hidden, d.moe_inter],
                Dtype::Float32,
            );
            t(
                &mut c,
                format!("{m}.gate.weight"),
                &[d.experts, d.hidden],
                Dtype::Float32,
            );
            t(
                &mut c,
                format!("{m}.shared_expert_gate.weight"),
                &[1, d.hidden],
                Dtype::Float32,
            );
        } else {
            t(
                &mut c,
                format!("{m}.up_proj.weight"),
                &[d.inter, d.hidden],
                Dtype::Float32,
            );
        }
    }
    for (k, a) in &tensors {
        c.input(&format!("ckpt/{k}"), a);
    }
    let sanitized = sanitize_qwen3_5(tensors.into_iter().collect(), variant, 4, tied)?;
    for (k, v) in sanitized {
        let cast = convert_dtype(&k, &v, Dtype::Bfloat16)?;
        c.out(&format!("sanitized/{k}"), v);
        c.out(&format!("converted/{k}"), cast);
    }
    Ok(c)
}

fn all_cases() -> R<Vec<Case>> {
    let mut cases = Vec::new();
    // Gated DeltaNet: a 19 + 11 token prefill, then three decode steps.
    let steps = [19, 11, 1, 1, 1];
    for layout in [Layout::Split, Layout::Fused] {
        cases.push(deltanet(Dt::F32, None, &TINY, layout, &steps)?);
        cases.push(deltanet(Dt::Bf16, None, &TINY, layout, &steps)?);
        cases.push(deltanet(Dt::Bf16, Some(Q4G64), &TINY, layout, &steps)?);
    }
    cases.push(deltanet(
        Dt::Bf16,
        Some(Q4G32),
        &TINY_R3,
        Layout::Split,
        &steps,
    )?);
    cases.push(deltanet(
        Dt::F32,
        Some(Q4G64),
        &TINY_R3,
        Layout::Split,
        &steps,
    )?);
    // Qwen3.5-4B's widths (32 value heads over 16 key heads, Dk = Dv = 128).
    cases.push(deltanet(
        Dt::Bf16,
        Some(Q4G64),
        &QWEN35_4B,
        Layout::Split,
        &[5, 3, 1],
    )?);
    cases.push(deltanet(
        Dt::Bf16,
        None,
        &QWEN35_4B,
        Layout::Split,
        &[4, 1],
    )?);
    // Qwen3.6-27B's (48 value heads over 16: q/k repeated three times).
    cases.push(deltanet(
        Dt::Bf16,
        Some(Q4G64),
        &QWEN36_27B,
        Layout::Split,
        &[4, 1],
    )?);
    // The recurrence alone over 64 tokens.
    for dt in [Dt::F32, Dt::Bf16] {
        for with_state in [false, true] {
            cases.push(recurrence(dt, &TINY_R3, 64, with_state)?);
        }
    }
    // Gated full attention.
    for (dt, q) in [(Dt::F32, None), (Dt::Bf16, None), (Dt::Bf16, Some(Q4G64))] {
        cases.push(attention(dt, q, &TINY, &steps)?);
    }
    cases.push(attention(Dt::Bf16, Some(Q4G64), &QWEN35_4B, &[5, 3, 1])?);
    // The MoE block: 5 tokens x top-2 = 10 indices (unsorted experts), 40 x
    // 2 = 80 (sorted). bf16 experts need quantization on the CPU.
    for tokens in [5, 40] {
        cases.push(moe(Dt::F32, None, &TINY, tokens)?);
        cases.push(moe(Dt::Bf16, Some(Q4G64), &TINY, tokens)?);
        cases.push(moe(Dt::F32, Some(Q4G32), &TINY, tokens)?);
    }
    // Qwen3.6-35B-A3B's widths: 3 x 8 = 24 indices (unsorted), 9 x 8 = 72 (sorted).
    for tokens in [3, 9] {
        cases.push(moe(Dt::Bf16, Some(Q4G64), &QWEN36_35B_A3B_16E, tokens)?);
    }
    // Whole decoder layers of both kinds.
    for (dt, q) in [(Dt::F32, None), (Dt::Bf16, None), (Dt::Bf16, Some(Q4G64))] {
        cases.push(layer(dt, q, &TINY, 0, false, &steps)?);
        cases.push(layer(dt, q, &TINY, 3, false, &steps)?);
    }
    for (dt, q) in [(Dt::F32, None), (Dt::Bf16, Some(Q4G64))] {
        cases.push(layer(dt, q, &TINY, 0, true, &steps)?);
        cases.push(layer(dt, q, &TINY, 3, true, &steps)?);
    }
    // sanitize and the conversion cast.
    for variant in [Qwen35Variant::Dense, Qwen35Variant::Moe] {
        cases.push(sanitize(variant, true, false)?);
        cases.push(sanitize(variant, true, true)?);
        cases.push(sanitize(variant, false, false)?);
    }
    Ok(cases)
}

#[test]
fn deltanet_blocks_match_mlx_lm_bit_for_bit() {
    let cases = all_cases().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (in_path, spec_path, out_path) = (
        dir.path().join("in.safetensors"),
        dir.path().join("cases.json"),
        dir.path().join("out.safetensors"),
    );
    let mut inputs: Vec<(String, Array)> = Vec::new();
    let mut ours: HashMap<String, Array> = HashMap::new();
    let mut specs = Vec::new();
    for c in &cases {
        for (k, a) in &c.tensors {
            inputs.push((format!("{}/{k}", c.name), a.clone()));
        }
        for (k, a) in &c.ours {
            ours.insert(format!("{}/{k}", c.name), a.clone());
        }
        specs.push(c.spec.clone());
    }
    let names: std::collections::HashSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), cases.len(), "case names must be unique");
    Array::save_safetensors(inputs.iter().map(|(k, a)| (k.as_str(), a)), None, &in_path).unwrap();
    std::fs::write(&spec_path, serde_json::to_string_pretty(&specs).unwrap()).unwrap();
    run_python(
        "deltanet_blocks.py",
        &[
            in_path.as_os_str(),
            spec_path.as_os_str(),
            out_path.as_os_str(),
        ],
    );
    let theirs = Array::load_safetensors(&out_path).unwrap();

    let mut keys: Vec<&String> = ours.keys().collect();
    keys.sort();
    let mut mismatched = Vec::new();
    for key in &keys {
        // "<x>@composed" is compared with Python's "<x>".
        let py_key = key.split('@').next().unwrap();
        let Some(b) = theirs.get(py_key) else {
            mismatched.push(format!("{key}: Python produced no {py_key}"));
            continue;
        };
        let a = &ours[*key];
        let same = a.dtype() == b.dtype()
            && a.shape() == b.shape()
            && array_bytes(a).unwrap() == array_bytes(b).unwrap();
        if !same {
            mismatched.push(format!(
                "{key}: rust {:?}{:?} vs python {:?}{:?}",
                a.dtype(),
                a.shape(),
                b.dtype(),
                b.shape()
            ));
        }
    }
    let ours_plain: std::collections::HashSet<&str> =
        keys.iter().map(|k| k.split('@').next().unwrap()).collect();
    for k in theirs.keys() {
        if !ours_plain.contains(k.as_str()) {
            mismatched.push(format!("{k}: Python output with no Rust counterpart"));
        }
    }
    assert!(
        mismatched.is_empty(),
        "{} of {} outputs not byte-identical:\n{}",
        mismatched.len(),
        keys.len(),
        mismatched.join("\n")
    );
    // The comparisons can fail: the recurrent state moves between chunks
    // (so decode steps start from a prefilled state, not zeros), and the
    // raw-HF sanitize changed the norms it should (+1) and not the gated one.
    for c in cases.iter().filter(|c| c.spec["block"] == "deltanet") {
        let state = |i: usize| array_bytes(&theirs[&format!("{}/c{i}/state", c.name)]).unwrap();
        assert_ne!(state(0), state(1), "{}: state did not move", c.name);
        assert!(state(0).iter().any(|&b| b != 0), "{}: zero state", c.name);
    }
    let raw = cases
        .iter()
        .find(|c| c.name == "sanitize_dense_raw_untied")
        .unwrap();
    let ckpt = |k: &str| {
        let key = format!("@ckpt/model.language_model.{k}");
        array_bytes(&raw.tensors.iter().find(|(n, _)| *n == key).unwrap().1).unwrap()
    };
    let sanitized = |k: &str| {
        array_bytes(&theirs[&format!("{}/sanitized/language_model.model.{k}", raw.name)]).unwrap()
    };
    let norm = "layers.0.input_layernorm.weight";
    assert_ne!(ckpt(norm), sanitized(norm), "the raw norm was not offset");
    let gated = "layers.0.linear_attn.norm.weight";
    assert_eq!(ckpt(gated), sanitized(gated), "the gated norm was offset");
    eprintln!(
        "{} outputs of {} cases byte-identical with mlx-lm",
        keys.len(),
        cases.len()
    );
}

// ---- Oracles: mlx-lm's eager decoder layer and its checkpoint rules,
// written out for these tests (the models compose the same blocks in the
// monolith and the generated code, and sanitize through the IR's rules).

fn refused(what: String) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(what)
}

/// The RoPE width of a partial rotary factor: Python's
/// `int(head_dim * partial_rotary_factor)` (truncated).
fn partial_rope_dims(head_dim: i32, partial_rotary_factor: f64) -> i32 {
    (f64::from(head_dim) * partial_rotary_factor) as i32
}

/// What mixes the sequence in one layer: the layer kind is
/// `(index + 1) % full_attention_interval != 0` → linear.
#[derive(Debug, Clone)]
enum Mixer {
    GatedDeltaNet(GatedDeltaNet),
    GatedAttention {
        attention: GatedAttention,
        shape: AttentionShape,
        rope: Rope,
    },
}

/// The layer's `self.mlp` as `DecoderLayer` calls it: the dense MLP or
/// the MoE block, written out here to hold against mlx-lm apart from the
/// runtime's own feed-forward composition (`feed_forward::FeedForward`).
// One per test layer: boxing would only add a hop.
#[allow(clippy::large_enum_variant)]
enum LayerMlp {
    Dense(Mlp),
    SharedExpertMoe(SharedExpertMoe),
}

impl LayerMlp {
    fn forward(&self, x: &Array) -> R<Array> {
        Ok(match self {
            LayerMlp::Dense(m) => m.forward(x)?,
            LayerMlp::SharedExpertMoe(m) => m.forward(x)?,
        })
    }
}

/// One decoder layer (`DecoderLayer`, pre-norm): `h = x + mixer(norm(x))`,
/// `out = h + ffn(norm(h))`. `mask` is what a full-attention layer gets
/// (`create_attention_mask` of the first full layer's cache); linear layers
/// of one unpadded sequence run without a mask (`create_ssm_mask` is None).
#[allow(clippy::too_many_arguments)]
fn hybrid_decoder_layer(
    x: &Array,
    mixer: &Mixer,
    ffn: &LayerMlp,
    input_norm: &Array,
    post_attention_norm: &Array,
    eps: f32,
    cache: &mut MixerCache,
    mask: &Mask,
) -> R<Array> {
    let normed = rms_norm(x, Some(input_norm), eps)?;
    let r =
        match (mixer, cache) {
            (Mixer::GatedDeltaNet(w), MixerCache::Arrays(c)) => gated_delta_net(&normed, w, c)?,
            (
                Mixer::GatedAttention {
                    attention,
                    shape,
                    rope,
                },
                MixerCache::Kv(c),
            ) => gated_attention(&normed, attention, *shape, rope, c, mask)?,
            (Mixer::GatedDeltaNet(_), MixerCache::Kv(_)) => return Err(refused(
                "a Gated DeltaNet layer was given a KV cache: linear layers take an ArraysCache"
                    .into(),
            )),
            (Mixer::GatedAttention { .. }, MixerCache::Arrays(_)) => {
                return Err(refused(
                    "a full-attention layer was given an ArraysCache: it takes a KV cache".into(),
                ))
            }
        };
    let h = x.add(&r)?;
    h.add(ffn.forward(&rms_norm(&h, Some(post_attention_norm), eps)?)?)
}

// ---- Checkpoint rules (`sanitize`, `cast_predicate`)

/// Which of the two model files sanitizes the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Qwen35Variant {
    /// `qwen3_5.Model.sanitize`.
    Dense,
    /// `qwen3_5_moe.Model.sanitize`: also splits `experts.gate_up_proj`.
    Moe,
}

/// The norms that raw HF checkpoints store as offsets around 0 (mlx-lm adds
/// 1 to them). The gated norm of the linear layers is not among them.
const OFFSET_NORMS: [&str; 5] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// The wrapper renames of `Model.sanitize`: vision towers dropped,
/// `model.language_model.*` → `language_model.model.*`, everything else not
/// under `language_model.` moved there.
fn unwrap_language_model(key: &str) -> Option<String> {
    if key.starts_with("vision_tower") || key.starts_with("model.visual") {
        return None;
    }
    Some(if key.starts_with("model.language_model") {
        key.replace("model.language_model", "language_model.model")
    } else if key.starts_with("language_model.") {
        key.to_string()
    } else {
        format!("language_model.{key}")
    })
}

/// mlx-lm's `sanitize` of qwen3_5 / qwen3_5_moe, rule for rule, on a
/// checkpoint's tensors: names come out as mlx-lm's module tree has them
/// (`language_model.model.layers.0.linear_attn.conv1d.weight`). A raw HF
/// checkpoint is recognised by a conv1d weight whose last dim is not 1:
/// then every such conv weight is moved to mlx's [C, K, 1] layout
/// (`moveaxis(2, 1)`) and the 1-D norm weights of [`OFFSET_NORMS`] get `+ 1.0`
/// (a weak scalar, so in the weight's dtype). `mtp.*` is dropped, and
/// `lm_head.weight` when `tied` (mlx-lm pops that exact key, after the
/// wrapper renamed it, so a wrapped checkpoint keeps its head).
fn sanitize_qwen3_5(
    tensors: HashMap<String, Array>,
    variant: Qwen35Variant,
    num_layers: usize,
    tied: bool,
) -> R<HashMap<String, Array>> {
    let mut weights: HashMap<String, Array> = tensors
        .into_iter()
        .filter_map(|(k, v)| unwrap_language_model(&k).map(|k| (k, v)))
        .collect();
    if variant == Qwen35Variant::Moe {
        for l in 0..num_layers {
            let prefix = format!("language_model.model.layers.{l}.mlp");
            let Some(gate_up) = weights.remove(&format!("{prefix}.experts.gate_up_proj")) else {
                continue;
            };
            let shape = gate_up.shape();
            if shape.len() < 2 {
                return Err(refused(format!(
                    "{prefix}.experts.gate_up_proj: expected at least 2 dims, got shape {shape:?}"
                )));
            }
            let mid = shape[shape.len() - 2] / 2;
            let down_key = format!("{prefix}.experts.down_proj");
            let Some(down) = weights.remove(&down_key) else {
                return Err(refused(format!(
                    "missing tensor '{down_key}' (the checkpoint has {prefix}.experts.gate_up_proj)"
                )));
            };
            weights.insert(
                format!("{prefix}.switch_mlp.gate_proj.weight"),
                gate_up.try_index((Ellipsis, ..mid, ..))?,
            );
            weights.insert(
                format!("{prefix}.switch_mlp.up_proj.weight"),
                gate_up.try_index((Ellipsis, mid.., ..))?,
            );
            weights.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
        }
    }
    let unsanitized_conv = |k: &str, v: &Array| {
        k.contains("conv1d.weight") && v.shape().last().is_some_and(|&d| d != 1)
    };
    let has_unsanitized_conv1d = weights.iter().any(|(k, v)| unsanitized_conv(k, v));
    weights.retain(|k, _| !k.contains("mtp."));
    if tied {
        weights.remove("lm_head.weight");
    }
    let mut out = HashMap::with_capacity(weights.len());
    for (k, v) in weights {
        let v = if unsanitized_conv(&k, &v) {
            if v.ndim() != 3 {
                return Err(refused(format!(
                    "{k}: a conv1d weight [C, 1, K] or [C, K, 1] expected, got shape {:?}",
                    v.shape()
                )));
            }
            v.swap_axes(1, 2)?
        } else if has_unsanitized_conv1d
            && OFFSET_NORMS.iter().any(|s| k.ends_with(s))
            && v.ndim() == 1
        {
            v.add(scalar_like(1.0, &v))?
        } else {
            v
        };
        out.insert(k, v);
    }
    Ok(out)
}

/// `cast_predicate`: whether `mlx_lm.convert --dtype` casts the parameter at
/// `path` (everything floating but `A_log`, which stays float32).
fn casts_on_conversion(path: &str) -> bool {
    !path.ends_with("A_log")
}

/// What `mlx_lm.convert --dtype` does to one parameter: floating ones cast
/// to `dtype` unless [`casts_on_conversion`] says no.
fn convert_dtype(path: &str, v: &Array, dtype: Dtype) -> R<Array> {
    let floating = matches!(
        v.dtype(),
        Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 | Dtype::Float64
    );
    if casts_on_conversion(path) && floating {
        v.as_dtype(dtype)
    } else {
        Ok(v.clone())
    }
}
