//! The runtime blocks of the qwen2 / gemma2 / qwen3_moe / minicpm / granite /
//! phi3 / olmo2 / gemma3_text / lfm2 / glm4_moe / deepseek_v3 families
//! against mlx-lm 0.32.2's own modules (tests/python/family_blocks.py), byte
//! for byte, in bf16 and f32, unquantized and 4-bit (group 64 and 32) where
//! the block has weights, at a tiny width and at one real model's width.
//! Python runs once for all cases.

use std::collections::HashMap;

use archgen_runtime::attention::{causal_mask, softcapped_attention, Mask};
use archgen_runtime::blocks::{Activation, GateUp, GroupRoutedMoe, Mlp};
use archgen_runtime::bytes::array_bytes;
use archgen_runtime::cache::{KvCache, LayerCache};
use archgen_runtime::layers::{Embedding, Linear, QuantForm, Quantized, SwitchLinear};
use archgen_runtime::mlx_rs::ops::indexing::TryIndexOp;
use archgen_runtime::mlx_rs::{self, Array, Dtype};
use archgen_runtime::moe::{
    biased_experts_moe, softmax_topk_moe, GroupTopK, SigmoidGroupRouter, SoftmaxTopKRouter,
    SwitchGlu, TopKProbs, TopKSoftmaxRouter,
};
use archgen_runtime::ops::{
    divide_weak, gelu_approx_times, multiply_weak, one_plus, rms_norm, softcap_eager,
};
use archgen_runtime::rope::Rope;
use archgen_runtime::weights::Weights;
use archgen_tests::run_python;
use serde_json::{json, Value};

type R<T> = Result<T, mlx_rs::error::Exception>;

/// Exact f32 values in [-1, 1) from an integer LCG: the same bits on every
/// machine (as in runtime_smoke.rs).
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

    /// Fresh random values `[-1, 1) * scale`, cast to `dt`.
    fn rand(&mut self, shape: &[i32], scale: f32, dt: Dt) -> Array {
        self.seed += 1;
        let a = lcg(self.seed, shape);
        let a = if scale == 1.0 {
            a
        } else {
            a.multiply(Array::from_f32(scale)).unwrap()
        };
        a.as_dtype(dt.dtype()).unwrap()
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
        let join = |leaf: &str| {
            if path.is_empty() {
                leaf.to_string()
            } else {
                format!("{path}.{leaf}")
            }
        };
        match q {
            None => {
                self.param(&join("weight"), w);
                (w.clone(), None)
            }
            Some(q) => {
                let (wq, scales, biases) = mlx_rs::ops::quantize(w, q.group, q.bits).unwrap();
                self.param(&join("weight"), &wq);
                self.param(&join("scales"), &scales);
                self.param(&join("biases"), &biases);
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

    /// A random `[out, in]` Linear (unit-variance outputs) under `path`.
    fn linear(&mut self, path: &str, out: i32, inp: i32, dt: Dt, q: Option<Quant>) -> Linear {
        let w = self.rand(&[out, inp], 1.0 / (inp as f32).sqrt(), dt);
        let (weight, quant) = self.weight(path, &w, q);
        Linear {
            weight,
            quant,
            weight_t: None,
            bias: None,
        }
    }

    fn embedding(
        &mut self,
        path: &str,
        rows: i32,
        dims: i32,
        dt: Dt,
        q: Option<Quant>,
    ) -> Embedding {
        let w = self.rand(&[rows, dims], 1.0, dt);
        let (weight, quant) = self.weight(path, &w, q);
        Embedding {
            table: Linear {
                weight,
                quant,
                weight_t: None,
                bias: None,
            },
        }
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
}

fn ids(case: &mut Case, n: i32, vocab: i32) -> Array {
    case.seed += 1;
    let v: Vec<i32> = (0..n)
        .map(|i| ((case.seed % 1009 * 7919 + i as u64 * 104729) % vocab as u64) as i32)
        .collect();
    Array::from_slice(&v, &[1, n])
}

// ---------------------------------------------------------------- blocks

/// qwen2's q/k/v: `nn.Linear(bias=True)` (addmm) / `QuantizedLinear` + bias.
fn linear_bias(dt: Dt, q: Option<Quant>, (inp, out, tokens): (i32, i32, i32)) -> R<Case> {
    let name = format!("linear_bias_{}_{}_{inp}x{out}", dt.tag(), quant_tag(q));
    let spec = json!({"in": inp, "out": out, "quant": quant_json(q)});
    let mut c = Case::new("linear_bias", name, spec);
    let mut lin = c.linear("", out, inp, dt, q);
    let bias = c.rand(&[out], 1.0, dt);
    c.param("bias", &bias);
    lin.bias = Some(bias);
    let x = c.rand(&[1, tokens, inp], 1.0, dt);
    c.input("x", &x);
    c.out("y", lin.forward(&x)?);
    // The same layer through the checkpoint loader, as `{path}.weight`,
    // `.scales`, `.biases` and `.bias` with config.json's quantization.
    let tensors: HashMap<String, Array> = c
        .tensors
        .iter()
        .filter(|(k, _)| !k.starts_with('@'))
        .map(|(k, a)| (format!("self_attn.q_proj.{k}"), a.clone()))
        .collect();
    let quantization = quant_json(q);
    let mut weights = Weights::new(tensors, Some(&quantization).filter(|v| !v.is_null()));
    let loaded = linear_with_bias(&mut weights, "self_attn.q_proj", out, inp);
    weights
        .finish()
        .unwrap_or_else(|e| panic!("loading {}: {e}", c.name));
    c.out("y@loaded", loaded.forward(&x)?);
    if q.is_none() {
        // The pretransposed weight (generated models) must give the same bits.
        let mut pre = lin.clone();
        pre.pretranspose();
        assert!(pre.weight_t.is_some());
        c.out("y@pretransposed", pre.forward(&x)?);
    }
    Ok(c)
}

/// gemma2's `RMSNorm`: `rms_norm(x, 1.0 + w, eps)`.
fn gemma2_norm(dt: Dt, hidden: i32) -> R<Case> {
    let name = format!("gemma2_norm_{}_{hidden}", dt.tag());
    let eps = 1e-6f32;
    let mut c = Case::new("gemma2_norm", name, json!({"hidden": hidden, "eps": eps}));
    // Stored gemma2 norm weights are offsets around 0.
    let w = c.rand(&[hidden], 0.7, dt);
    c.param("weight", &w);
    let x = c.rand(&[2, 3, hidden], 2.0, dt);
    c.input("x", &x);
    // As the models run it: `1 + w` folded at load (`Weights::param_one_plus`),
    // then the plain RMSNorm.
    c.out("y", rms_norm(&x, Some(&one_plus(&w)?), eps)?);
    Ok(c)
}

/// gemma2's MLP: `down(gelu_approx(gate(x)) * up(x))`.
fn gemma2_mlp(dt: Dt, q: Option<Quant>, (hidden, inter): (i32, i32)) -> R<Case> {
    let name = format!("gemma2_mlp_{}_{}_{hidden}x{inter}", dt.tag(), quant_tag(q));
    let spec = json!({"hidden": hidden, "intermediate": inter, "quant": quant_json(q)});
    let mut c = Case::new("gemma2_mlp", name, spec);
    let gate = c.linear("gate_proj", inter, hidden, dt, q);
    let up = c.linear("up_proj", inter, hidden, dt, q);
    let down = c.linear("down_proj", hidden, inter, dt, q);
    // Scaled so gate outputs reach gelu's tails.
    let x = c.rand(&[1, 4, hidden], 3.0, dt);
    c.input("x", &x);
    let y = down.forward(&gelu_approx_times(&gate.forward(&x)?, &up.forward(&x)?)?)?;
    c.out("y", y);
    // The block the IR lowers gemma2's MLP to
    // (`Activation::GeluApproxThenMultiply`: gelu_approx compiled alone, the
    // multiply eager, as mlx-lm's gemma2 runs it), and Gemma-4's compiled
    // geglu (gelu and the multiply in one kernel), which gives the same
    // bits on the CPU but not on CUDA (docs/parity.md, "On the GPU").
    let mut mlp = archgen_runtime::blocks::Mlp {
        gate_up: archgen_runtime::blocks::GateUp::Separate {
            gate_proj: gate,
            up_proj: up,
        },
        down_proj: down,
        activation: archgen_runtime::blocks::Activation::GeluApproxThenMultiply,
    };
    c.out("y@mlp_block", mlp.forward(&x)?);
    mlp.activation = archgen_runtime::blocks::Activation::GeluApprox;
    c.out("y@geglu_block", mlp.forward(&x)?);
    Ok(c)
}

struct AttnShape {
    hidden: i32,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    query_pre_attn_scalar: f64,
    softcap: f64,
    rope_theta: f32,
}

struct Gemma2Attn {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    rope: Rope,
    scale: f64,
    softcap: f64,
    s: (i32, i32, i32),
}

impl Gemma2Attn {
    /// gemma2.py `Attention.__call__` from the runtime's blocks.
    fn forward(&self, x: &Array, mask: &Mask, cache: Option<&mut KvCache>) -> R<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let (h, kvh, d) = self.s;
        let heads = |a: Array, n: i32| -> R<Array> {
            a.reshape(&[b, l, n, d])?.transpose_axes(&[0, 2, 1, 3])
        };
        let q = heads(self.q.forward(x)?, h)?;
        let k = heads(self.k.forward(x)?, kvh)?;
        let v = heads(self.v.forward(x)?, kvh)?;
        let offset = Array::from_int(cache.as_ref().map_or(0, |c| c.offset));
        let q = self.rope.apply(&q, &offset)?;
        let k = self.rope.apply(&k, &offset)?;
        let (k, v) = match cache {
            Some(c) => c.update_and_fetch(&k, &v)?,
            None => (k, v),
        };
        let out = softcapped_attention(&q, &k, &v, self.scale, self.softcap, mask)?;
        self.o
            .forward(&out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}

#[derive(Clone, Copy)]
enum AttnMode {
    /// Prefill of `prefill` tokens, one step, then a chunk, through a KVCache.
    Cached { prefill: i32 },
    /// One call with an additive float mask, no cache.
    Additive,
}

/// gemma2's hand-written softcapped attention, inside the whole `Attention`.
fn gemma2_attention(
    dt: Dt,
    q: Option<Quant>,
    a: &AttnShape,
    mode: AttnMode,
    tokens: i32,
) -> R<Case> {
    let mode_tag = match mode {
        AttnMode::Cached { .. } => "cached",
        AttnMode::Additive => "additive",
    };
    let name = format!(
        "gemma2_attention_{}_{}_{}h{}kv{}d{}_{mode_tag}",
        dt.tag(),
        quant_tag(q),
        a.hidden,
        a.heads,
        a.kv_heads,
        a.head_dim
    );
    let mut spec = json!({
        "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim,
        "query_pre_attn_scalar": a.query_pre_attn_scalar, "attn_softcap": a.softcap,
        "rope_theta": a.rope_theta, "quant": quant_json(q),
        "mode": mode_tag,
    });
    if let AttnMode::Cached { prefill } = mode {
        spec["prefill"] = json!(prefill);
    }
    let mut c = Case::new("gemma2_attention", name, spec);
    let (h, kvh, d) = (a.heads, a.kv_heads, a.head_dim);
    let attn = Gemma2Attn {
        q: c.linear("q_proj", h * d, a.hidden, dt, q),
        k: c.linear("k_proj", kvh * d, a.hidden, dt, q),
        v: c.linear("v_proj", kvh * d, a.hidden, dt, q),
        o: c.linear("o_proj", a.hidden, h * d, dt, q),
        rope: Rope::base(d, a.rope_theta),
        scale: query_pre_attn_scale(a.query_pre_attn_scalar),
        softcap: a.softcap,
        s: (h, kvh, d),
    };
    // Large enough that the scores reach the softcap's non-linear range.
    let x = c.rand(&[1, tokens, a.hidden], 4.0, dt);
    c.input("x", &x);
    match mode {
        AttnMode::Additive => {
            let mask = c.rand(&[tokens, tokens], 3.0, dt);
            c.input("mask", &mask);
            c.out("y", attn.forward(&x, &Mask::Array(mask), None)?);
        }
        AttnMode::Cached { prefill } => {
            let mut cache = KvCache::default();
            let part = |from: i32, to: i32| x.try_index((.., from..to, ..));
            let y0 = attn.forward(
                &part(0, prefill)?,
                &Mask::Array(causal_mask(prefill, 0, None)?),
                Some(&mut cache),
            )?;
            let y1 = attn.forward(&part(prefill, prefill + 1)?, &Mask::None, Some(&mut cache))?;
            let n = tokens - prefill - 1;
            let offset = cache.offset;
            let y2 = attn.forward(
                &part(prefill + 1, tokens)?,
                &Mask::Array(causal_mask(n, offset, None)?),
                Some(&mut cache),
            )?;
            c.out("prefill", y0);
            c.out("step", y1);
            c.out("chunk", y2);
        }
    }
    Ok(c)
}

struct MoeShape {
    hidden: i32,
    inter: i32,
    experts: i32,
    top_k: i32,
}

/// qwen3_moe's sparse block: softmax router, SwiGLU SwitchGLU, combine.
/// Quantized as mlx-lm's quant_predicate does: the router gate at 8 bits,
/// group 64, the experts at `q`.
fn qwen3_moe(dt: Dt, q: Option<Quant>, m: &MoeShape, tokens: i32, probs: TopKProbs) -> R<Case> {
    let probs_tag = match probs {
        TopKProbs::Renormalized => "norm",
        TopKProbs::AsTaken => "raw",
    };
    let name = format!(
        "qwen3_moe_{}_{}_{}x{}e{}k{}_t{tokens}_{probs_tag}",
        dt.tag(),
        quant_tag(q),
        m.hidden,
        m.inter,
        m.experts,
        m.top_k
    );
    let spec = json!({
        "hidden": m.hidden, "intermediate": m.inter, "experts": m.experts, "top_k": m.top_k,
        "norm_topk_prob": matches!(probs, TopKProbs::Renormalized), "quant": quant_json(q),
    });
    let mut c = Case::new("qwen3_moe", name, spec);
    let gate_q = q.map(|_| Quant { bits: 8, group: 64 });
    // Router logits a few units wide, so the softmax is far from uniform.
    let gw = c.rand(&[m.experts, m.hidden], 4.0 / (m.hidden as f32).sqrt(), dt);
    let (weight, quant) = c.weight("gate", &gw, gate_q);
    let router = SoftmaxTopKRouter {
        gate: Linear {
            weight,
            quant,
            weight_t: None,
            bias: None,
        },
        top_k: m.top_k,
        probs,
    };
    let glu = SwitchGlu {
        gate_proj: c.switch_linear("switch_mlp.gate_proj", m.experts, m.inter, m.hidden, dt, q),
        up_proj: c.switch_linear("switch_mlp.up_proj", m.experts, m.inter, m.hidden, dt, q),
        down_proj: c.switch_linear("switch_mlp.down_proj", m.experts, m.hidden, m.inter, dt, q),
    };
    let x = c.rand(&[1, tokens, m.hidden], 2.0, dt);
    c.input("x", &x);
    c.out("y", softmax_topk_moe(&router, &glu, &x)?);
    Ok(c)
}

/// How a gpt_oss `MLPBlock` case quantizes its experts.
#[derive(Clone, Copy, Debug)]
enum ExpertQuant {
    /// As every other module: unquantized, or affine at the case's `q`.
    AsTheRest,
    /// mxfp4 (4 bits, groups of 32, uint8 scales, no biases), as
    /// mlx-community's gpt-oss-20b-MXFP4-Q8 stores them.
    Mxfp4,
}

/// gpt_oss's `MLPBlock`: the biased `router`, top-k of its logits, a precise
/// softmax over the k, SwitchGLU experts with a bias per projection and the
/// compiled `swiglu_oai`, weighted and summed. Quantized as mlx-lm's
/// quant_predicate does: the router at 8 bits, group 64, the experts at `q`
/// or in mxfp4.
fn gpt_oss_mlp(dt: Dt, q: Option<Quant>, eq: ExpertQuant, m: &MoeShape, tokens: i32) -> R<Case> {
    let experts_tag = match eq {
        ExpertQuant::AsTheRest => "",
        ExpertQuant::Mxfp4 => "_mxfp4",
    };
    let name = format!(
        "gpt_oss_mlp_{}_{}{experts_tag}_{}x{}e{}k{}_t{tokens}",
        dt.tag(),
        quant_tag(q),
        m.hidden,
        m.inter,
        m.experts,
        m.top_k
    );
    let spec = json!({
        "hidden": m.hidden, "intermediate": m.inter, "experts": m.experts, "top_k": m.top_k,
        "quant": quant_json(q), "experts_mxfp4": matches!(eq, ExpertQuant::Mxfp4),
    });
    let mut c = Case::new("gpt_oss_mlp", name, spec);
    let router_q = q.map(|_| Quant { bits: 8, group: 64 });
    // Router logits a few units wide, so the top-k and softmax are far from uniform.
    let rw = c.rand(&[m.experts, m.hidden], 4.0 / (m.hidden as f32).sqrt(), dt);
    let (weight, quant) = c.weight("router", &rw, router_q);
    let router_bias = c.rand(&[m.experts], 0.5, dt);
    c.param("router.bias", &router_bias);
    let router = TopKSoftmaxRouter {
        router: Linear {
            weight,
            quant,
            weight_t: None,
            bias: Some(router_bias),
        },
        top_k: m.top_k,
    };
    let proj = |c: &mut Case, name: &str, out: i32, inp: i32| -> R<SwitchLinear> {
        let path = format!("experts.{name}");
        let mut l = match eq {
            ExpertQuant::AsTheRest => c.switch_linear(&path, m.experts, out, inp, dt, q),
            ExpertQuant::Mxfp4 => {
                let w = c.rand(&[m.experts, out, inp], 1.0 / (inp as f32).sqrt(), dt);
                let parts = archgen_runtime::mlx_c::quantize_with_mode(&w, (32, 4), c"mxfp4")?;
                let [wq, scales] = <[Array; 2]>::try_from(parts).map_err(|p| {
                    mlx_rs::error::Exception::custom(format!(
                        "mxfp4 quantize gave {} arrays",
                        p.len()
                    ))
                })?;
                c.param(&format!("{path}.weight"), &wq);
                c.param(&format!("{path}.scales"), &scales);
                SwitchLinear {
                    weight: wq,
                    quant: Some(Quantized {
                        scales,
                        form: QuantForm::Mxfp4,
                        group_size: 32,
                        bits: 4,
                    }),
                    bias: None,
                }
            }
        };
        let bias = c.rand(&[m.experts, out], 0.5, dt);
        c.param(&format!("{path}.bias"), &bias);
        l.bias = Some(bias);
        Ok(l)
    };
    let glu = SwitchGlu {
        gate_proj: proj(&mut c, "gate_proj", m.inter, m.hidden)?,
        up_proj: proj(&mut c, "up_proj", m.inter, m.hidden)?,
        down_proj: proj(&mut c, "down_proj", m.hidden, m.inter)?,
    };
    let x = c.rand(&[1, tokens, m.hidden], 2.0, dt);
    c.input("x", &x);
    c.out("y", biased_experts_moe(&router, &glu, &x)?);
    Ok(c)
}

/// The sizes and routing of a glm4_moe `MoE` case.
struct GlmMoeShape {
    hidden: i32,
    inter: i32,
    experts: i32,
    top_k: i32,
    n_group: i32,
    topk_group: i32,
    n_shared: i32,
}

/// glm4_moe's `MoE`: the `noaux_tc` router (`MoEGate`: `x @ weight.T`, then
/// the compiled `group_expert_select`), SwiGLU SwitchGLU, the float32-weighted
/// combine cast back, plus the shared experts' MLP. Quantized as
/// mlx_lm.convert quantizes it: every Linear and SwitchLinear at `q`, the
/// gate's plain `weight` left as it is, `e_score_correction_bias` float32
/// (the module's cast_predicate) in every dtype.
fn glm4_moe(
    dt: Dt,
    q: Option<Quant>,
    m: &GlmMoeShape,
    tokens: i32,
    probs: TopKProbs,
    routed_scaling_factor: f64,
) -> R<Case> {
    let probs_tag = match probs {
        TopKProbs::Renormalized => "norm",
        TopKProbs::AsTaken => "raw",
    };
    let name = format!(
        "glm4_moe_{}_{}_{}x{}e{}k{}g{}of{}s{}_t{tokens}_{probs_tag}_x{routed_scaling_factor}",
        dt.tag(),
        quant_tag(q),
        m.hidden,
        m.inter,
        m.experts,
        m.top_k,
        m.topk_group,
        m.n_group,
        m.n_shared
    );
    let spec = json!({
        "hidden": m.hidden, "intermediate": m.inter, "experts": m.experts, "top_k": m.top_k,
        "n_group": m.n_group, "topk_group": m.topk_group, "n_shared": m.n_shared,
        "routed_scaling_factor": routed_scaling_factor,
        "norm_topk_prob": matches!(probs, TopKProbs::Renormalized), "quant": quant_json(q),
    });
    let mut c = Case::new("glm4_moe", name, spec);
    // Gate logits a few units wide, a correction small beside the sigmoid's
    // (0, 1) so that it changes some choices and not all.
    let gate = c.rand(&[m.experts, m.hidden], 4.0 / (m.hidden as f32).sqrt(), dt);
    c.param("gate.weight", &gate);
    let correction_bias = c.rand(&[m.experts], 0.2, Dt::F32);
    c.param("gate.e_score_correction_bias", &correction_bias);
    let facts = GroupTopK {
        top_k: m.top_k,
        n_group: m.n_group,
        topk_group: m.topk_group,
        probs,
        routed_scaling_factor,
    };
    let router = SigmoidGroupRouter {
        gate: Linear {
            weight: gate,
            quant: None,
            weight_t: None,
            bias: None,
        },
        correction_bias,
        facts,
    };
    let experts = SwitchGlu {
        gate_proj: c.switch_linear("switch_mlp.gate_proj", m.experts, m.inter, m.hidden, dt, q),
        up_proj: c.switch_linear("switch_mlp.up_proj", m.experts, m.inter, m.hidden, dt, q),
        down_proj: c.switch_linear("switch_mlp.down_proj", m.experts, m.hidden, m.inter, dt, q),
    };
    let sw = m.inter * m.n_shared;
    let shared_experts = Mlp {
        gate_up: GateUp::Separate {
            gate_proj: c.linear("shared_experts.gate_proj", sw, m.hidden, dt, q),
            up_proj: c.linear("shared_experts.up_proj", sw, m.hidden, dt, q),
        },
        down_proj: c.linear("shared_experts.down_proj", m.hidden, sw, dt, q),
        activation: Activation::Silu,
    };
    let moe = GroupRoutedMoe {
        router,
        experts,
        shared_experts,
    };
    let x = c.rand(&[1, tokens, m.hidden], 2.0, dt);
    c.input("x", &x);
    c.out("y", moe.forward(&x)?);
    Ok(c)
}

/// gemma2's `embed_tokens(ids) * hidden_size**0.5`.
fn gemma2_embed(dt: Dt, q: Option<Quant>, hidden: i32) -> R<Case> {
    let name = format!("gemma2_embed_{}_{}_{hidden}", dt.tag(), quant_tag(q));
    let vocab = 96;
    let spec = json!({"hidden": hidden, "vocab": vocab, "quant": quant_json(q)});
    let mut c = Case::new("gemma2_embed", name, spec);
    let e = c.embedding("embed_tokens", vocab, hidden, dt, q);
    let ids = ids(&mut c, 6, vocab);
    c.input("ids", &ids);
    let h = multiply_weak(&e.lookup(&ids)?, (hidden as f64).powf(0.5))?;
    c.out("h", h);
    Ok(c)
}

/// gemma3_text's `h *= mx.array(hidden_size**0.5, mx.bfloat16).astype(h.dtype)`,
/// with the scale the lowering of `spec` gives (gemma-3-1b: sqrt(1152) =
/// 33.94 in bf16 is 34.0, which f32 activations tell from a weak sqrt).
fn gemma3_embed(dt: Dt, spec: &str) -> R<Case> {
    let ir = archgen_families::load(archgen_tests::repo_root().join("specs").join(spec))
        .map_err(|d| mlx_rs::error::Exception::custom(d.to_string()))?
        .lower();
    let hidden = ir.hidden_size as i32;
    let archgen_ir::EmbedScale::Constant(scale) = ir.embedding.scale else {
        return Err(mlx_rs::error::Exception::custom(format!(
            "{spec}: not a constant embedding scale"
        )));
    };
    let name = format!("gemma3_embed_{}_{hidden}", dt.tag());
    let vocab = 96;
    let mut c = Case::new(
        "gemma3_embed",
        name,
        json!({"hidden": hidden, "vocab": vocab}),
    );
    let e = c.embedding("embed_tokens", vocab, hidden, dt, None);
    let ids = ids(&mut c, 6, vocab);
    c.input("ids", &ids);
    c.out("h", multiply_weak(&e.lookup(&ids)?, scale)?);
    Ok(c)
}

/// rope_utils' `linear` scaling, `nn.RoPE(dims, base=theta, scale=1 / factor)`,
/// at a position past the start, as the runtime builds it from the IR.
fn gemma3_linear_rope(dt: Dt, dims: i32, theta: f32, factor: f64) -> R<Case> {
    let name = format!("gemma3_linear_rope_{}_{dims}_f{factor}", dt.tag());
    let offset = 37;
    let spec = json!({"dims": dims, "theta": theta, "factor": factor, "offset": offset});
    let mut c = Case::new("gemma3_linear_rope", name, spec);
    let x = c.rand(&[1, 4, 7, dims], 2.0, dt);
    c.input("x", &x);
    let attention = archgen_ir::Attention {
        rope: archgen_ir::RopeForm {
            kind: archgen_ir::RopeKind::Linear { theta, factor },
            traditional: false,
            rotated_dims: dims as usize,
        },
        ..one_attention_of("gemma-3-1b-tiny.yaml", dims)?
    };
    let rope = archgen_monolith::rope_for(&attention)?;
    c.out("y", rope.apply(&x, &Array::from_int(offset))?);
    Ok(c)
}

/// rope_utils' `YarnRoPE` (`initialize_rope` with a `yarn` scaling) as the
/// runtime builds it from the IR, at a position past the start: its
/// frequencies and its output on `x` whose last axis is `extra` wider than
/// the rotated dims (the input scale reaches only those).
fn yarn_rope(
    dt: Dt,
    dims: i32,
    extra: i32,
    kind: archgen_ir::RopeKind,
    traditional: bool,
) -> R<Case> {
    let archgen_ir::RopeKind::Yarn {
        theta,
        factor,
        original_max_position_embeddings,
        beta_fast,
        beta_slow,
        mscale,
        mscale_all_dim,
    } = kind
    else {
        return Err(mlx_rs::error::Exception::custom(
            "yarn_rope takes a YaRN kind",
        ));
    };
    let name = format!(
        "yarn_rope_{}_{dims}+{extra}_f{factor}_m{mscale}_{mscale_all_dim}_{}",
        dt.tag(),
        if traditional { "traditional" } else { "halves" }
    );
    let offset = 37;
    let spec = json!({
        "dims": dims, "theta": theta, "offset": offset, "traditional": traditional,
        "scaling": {
            "rope_type": "yarn", "factor": factor,
            "original_max_position_embeddings": original_max_position_embeddings,
            "beta_fast": beta_fast, "beta_slow": beta_slow,
            "mscale": mscale, "mscale_all_dim": mscale_all_dim,
        },
    });
    let mut c = Case::new("yarn_rope", name, spec);
    let x = c.rand(&[1, 4, 7, dims + extra], 2.0, dt);
    c.input("x", &x);
    let attention = archgen_ir::Attention {
        rope: archgen_ir::RopeForm {
            kind,
            traditional,
            rotated_dims: dims as usize,
        },
        ..one_attention_of("gemma-3-1b-tiny.yaml", dims + extra)?
    };
    let rope = archgen_monolith::rope_for(&attention)?;
    let archgen_runtime::rope::Rope::Yarn(archgen_runtime::rope::YarnTables { freqs, .. }) = &rope
    else {
        return Err(mlx_rs::error::Exception::custom(
            "a YaRN kind builds Rope::Yarn",
        ));
    };
    c.out("freqs", freqs.clone());
    c.out("y", rope.apply(&x, &Array::from_int(offset))?);
    Ok(c)
}

/// The sizes of a DeepSeek-V3 attention case.
struct MlaShape {
    hidden: i32,
    heads: i32,
    nope: i32,
    rope: i32,
    v: i32,
    rank: i32,
    q_lora: Option<i32>,
}

/// deepseek_v3's `DeepseekV3Attention` (multi-head latent attention with
/// DeepSeek-V3's YaRN, traditional pairs) with its `KVCache`: a prefill,
/// one token (the absorbed form), then a chunk (the expanded form over the
/// cached latent), each with the mask `create_attention_mask(h, cache,
/// return_array=True)` gives; the weights through the checkpoint loader.
fn deepseek_mla(dt: Dt, q: Option<Quant>, m: &MlaShape, prefill: i32) -> R<Case> {
    use archgen_runtime::mla::{latent_attention, load_latent_attention, LatentShape};
    let name = format!(
        "deepseek_mla_{}_{}_{}x{}h_q{}",
        dt.tag(),
        quant_tag(q),
        m.hidden,
        m.heads,
        m.q_lora.map_or("direct".to_string(), |r| r.to_string())
    );
    let (factor, mscale_all_dim, theta) = (40.0, 1.0, 10000.0f32);
    let scaling = json!({
        "type": "yarn", "factor": factor, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": mscale_all_dim,
    });
    let spec = json!({
        "hidden": m.hidden, "heads": m.heads, "nope": m.nope, "rope": m.rope, "v": m.v,
        "rank": m.rank, "q_lora": m.q_lora, "rope_theta": theta, "rope_scaling": scaling,
        "prefill": prefill, "quant": quant_json(q),
    });
    let mut c = Case::new("deepseek_mla", name, spec);
    let q_width = m.heads * (m.nope + m.rope);
    match m.q_lora {
        None => {
            c.linear("q_proj", q_width, m.hidden, dt, q);
        }
        Some(r) => {
            c.linear("q_a_proj", r, m.hidden, dt, q);
            let norm = c.rand(&[r], 0.5, dt).add(Array::from_f32(1.0))?;
            c.param("q_a_layernorm.weight", &norm.as_dtype(dt.dtype())?);
            c.linear("q_b_proj", q_width, r, dt, q);
        }
    }
    c.linear("kv_a_proj_with_mqa", m.rank + m.rope, m.hidden, dt, q);
    let norm = c.rand(&[m.rank], 0.5, dt).add(Array::from_f32(1.0))?;
    c.param("kv_a_layernorm.weight", &norm.as_dtype(dt.dtype())?);
    let embed_q = c.rand(&[m.heads, m.rank, m.nope], 1.0 / (m.nope as f32).sqrt(), dt);
    c.weight("embed_q", &embed_q, q);
    let unembed = c.rand(&[m.heads, m.v, m.rank], 1.0 / (m.rank as f32).sqrt(), dt);
    c.weight("unembed_out", &unembed, q);
    c.linear("o_proj", m.hidden, m.heads * m.v, dt, q);
    let tensors: HashMap<String, Array> = c
        .tensors
        .iter()
        .filter(|(k, _)| !k.starts_with('@'))
        .map(|(k, a)| (format!("self_attn.{k}"), a.clone()))
        .collect();
    let quantization = quant_json(q);
    let mut weights = Weights::new(tensors, Some(&quantization).filter(|v| !v.is_null()));
    // The module's scale: `q_head_dim ** -0.5`, times `s * s` for YaRN's
    // mscale_all_dim, as Python floats.
    let s = 0.1 * mscale_all_dim * f64::ln(factor) + 1.0;
    let shape = LatentShape {
        heads: m.heads,
        nope_dim: m.nope,
        rope_dim: m.rope,
        v_dim: m.v,
        kv_lora_rank: m.rank,
        scale: f64::from(m.nope + m.rope).powf(-0.5) * s * s,
    };
    let mut attention =
        load_latent_attention(&mut weights, "self_attn", m.hidden, m.q_lora, &shape);
    weights
        .finish()
        .unwrap_or_else(|e| panic!("loading {}: {e}", c.name));
    attention.pretranspose();
    let rope = Rope::yarn(
        m.rope,
        theta,
        archgen_runtime::rope::YarnScaling {
            factor,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim,
        },
        archgen_runtime::rope::Pairs::Interleaved,
    )?;
    let total = prefill + 4;
    let x = c.rand(&[1, total, m.hidden], 1.0, dt);
    c.input("x", &x);
    let mut cache = LayerCache::Full(KvCache::default());
    for (key, from, to) in [
        ("prefill", 0, prefill),
        ("step", prefill, prefill + 1),
        ("chunk", prefill + 1, total),
    ] {
        let part = x.try_index((.., from..to, ..))?;
        c.out(
            key,
            latent_attention(&part, &attention, &shape, &rope, &mut cache)?,
        );
    }
    Ok(c)
}

/// The first layer's attention of a spec, with `head_dim` set to `dims`.
fn one_attention_of(spec: &str, dims: i32) -> R<archgen_ir::Attention> {
    let ir = archgen_families::load(archgen_tests::repo_root().join("specs").join(spec))
        .map_err(|d| mlx_rs::error::Exception::custom(d.to_string()))?
        .lower();
    let mut a = ir.layers[0]
        .attention()
        .ok_or_else(|| mlx_rs::error::Exception::custom(format!("{spec}: no attention")))?
        .clone();
    a.head_dim = dims as usize;
    Ok(a)
}

/// gemma2's head: `embed_tokens.as_linear(h)`, then eager `tanh(x / c) * c`.
fn gemma2_final(dt: Dt, q: Option<Quant>, hidden: i32, softcap: f64) -> R<Case> {
    let name = format!("gemma2_final_{}_{}_{hidden}", dt.tag(), quant_tag(q));
    let vocab = 128;
    let spec =
        json!({"hidden": hidden, "vocab": vocab, "final_softcap": softcap, "quant": quant_json(q)});
    let mut c = Case::new("gemma2_final", name, spec);
    let e = c.embedding("", vocab, hidden, dt, q);
    // Logits of tens of units: the softcap bends them.
    let h = c.rand(&[1, 3, hidden], 8.0 / (hidden as f32).sqrt() * 4.0, dt);
    c.input("h", &h);
    c.out("logits", softcap_eager(&e.as_linear(&h)?, softcap)?);
    Ok(c)
}

/// minicpm's `embed_tokens(ids) * scale_emb`.
fn minicpm_embed(dt: Dt, q: Option<Quant>, hidden: i32, scale_emb: f64) -> R<Case> {
    let name = format!("minicpm_embed_{}_{}_{hidden}", dt.tag(), quant_tag(q));
    let vocab = 80;
    let spec =
        json!({"hidden": hidden, "vocab": vocab, "scale_emb": scale_emb, "quant": quant_json(q)});
    let mut c = Case::new("minicpm_embed", name, spec);
    let e = c.embedding("embed_tokens", vocab, hidden, dt, q);
    let ids = ids(&mut c, 5, vocab);
    c.input("ids", &ids);
    c.out("h", multiply_weak(&e.lookup(&ids)?, scale_emb)?);
    Ok(c)
}

/// minicpm's two residuals: `x + r * (scale_depth / num_hidden_layers**0.5)`.
fn minicpm_residual(dt: Dt, hidden: i32, scale_depth: f64, num_layers: usize) -> R<Case> {
    let name = format!("minicpm_residual_{}_{hidden}_l{num_layers}", dt.tag());
    let spec = json!({"hidden": hidden, "scale_depth": scale_depth, "num_layers": num_layers});
    let mut c = Case::new("minicpm_residual", name, spec);
    let x = c.rand(&[1, 4, hidden], 3.0, dt);
    let r_attn = c.rand(&[1, 4, hidden], 2.0, dt);
    let r_mlp = c.rand(&[1, 4, hidden], 2.0, dt);
    c.input("x", &x);
    c.input("r_attn", &r_attn);
    c.input("r_mlp", &r_mlp);
    let h = scaled_residual(&x, &r_attn, scale_depth, num_layers)?;
    c.out("out", scaled_residual(&h, &r_mlp, scale_depth, num_layers)?);
    Ok(c)
}

/// minicpm's untied head: `lm_head(h / (hidden_size / dim_model_base))`.
fn minicpm_logits(dt: Dt, q: Option<Quant>, hidden: i32, dim_model_base: i32) -> R<Case> {
    let name = format!("minicpm_logits_{}_{}_{hidden}", dt.tag(), quant_tag(q));
    let vocab = 64;
    let spec = json!({"hidden": hidden, "vocab": vocab, "dim_model_base": dim_model_base, "quant": quant_json(q)});
    let mut c = Case::new("minicpm_logits", name, spec);
    let head = c.linear("lm_head", vocab, hidden, dt, q);
    let h = c.rand(&[1, 3, hidden], 5.0, dt);
    c.input("h", &h);
    let scaled = divide_weak(&h, hidden as f64 / dim_model_base as f64)?;
    c.out("logits", head.forward(&scaled)?);
    Ok(c)
}

/// granite's two residuals: `x + r * residual_multiplier`, through the
/// same weak multiply as minicpm's, another factor.
fn granite_residual(dt: Dt, hidden: i32, multiplier: f64) -> R<Case> {
    let name = format!("granite_residual_{}_{hidden}_{multiplier}", dt.tag());
    let spec = json!({"hidden": hidden, "residual_multiplier": multiplier});
    let mut c = Case::new("granite_residual", name, spec);
    let x = c.rand(&[1, 4, hidden], 3.0, dt);
    let r_attn = c.rand(&[1, 4, hidden], 2.0, dt);
    let r_mlp = c.rand(&[1, 4, hidden], 2.0, dt);
    c.input("x", &x);
    c.input("r_attn", &r_attn);
    c.input("r_mlp", &r_mlp);
    let h = x.add(multiply_weak(&r_attn, multiplier)?)?;
    c.out("out", h.add(multiply_weak(&r_mlp, multiplier)?)?);
    Ok(c)
}

/// granite's head: the final norm, `embed_tokens.as_linear(out)` (tied) or
/// `lm_head(out)`, then `/ logits_scaling` after the head (a weak scalar
/// divide), as `blocks::logits_scaled` runs `LogitScale::DivideLogitsBy`.
fn granite_logits(dt: Dt, q: Option<Quant>, hidden: i32, tied: bool, scaling: f64) -> R<Case> {
    use archgen_runtime::blocks::{logits_scaled, Head, LogitScale};
    let head_tag = if tied { "tied" } else { "untied" };
    let name = format!(
        "granite_logits_{}_{}_{hidden}_{head_tag}_{scaling}",
        dt.tag(),
        quant_tag(q)
    );
    let vocab = 64;
    let eps = 1e-5;
    let spec = json!({"hidden": hidden, "vocab": vocab, "logits_scaling": scaling, "tied": tied, "eps": eps, "quant": quant_json(q)});
    let mut c = Case::new("granite_logits", name, spec);
    let e = c.embedding("model.embed_tokens", vocab, hidden, dt, q);
    let norm = c.rand(&[hidden], 1.0, dt);
    c.param("model.norm.weight", &norm);
    let lm_head = (!tied).then(|| c.linear("lm_head", vocab, hidden, dt, q));
    let head = match &lm_head {
        Some(l) => Head::Untied(l),
        None => Head::Tied(&e),
    };
    let h = c.rand(&[1, 3, hidden], 5.0, dt);
    c.input("h", &h);
    let scale = LogitScale::DivideLogitsBy(scaling);
    c.out(
        "logits",
        logits_scaled(&h, &norm, head, scale, None, eps as f32)?,
    );
    Ok(c)
}

/// phi3's MLP: one `gate_up_proj` matmul, `mx.split(x, 2, axis=-1)`, the
/// compiled swiglu, `down_proj` (IR `GateUpProjection::Fused`).
fn phi3_mlp(dt: Dt, q: Option<Quant>, (hidden, inter): (i32, i32)) -> R<Case> {
    use archgen_runtime::blocks::{Activation, GateUp, Mlp};
    let name = format!("phi3_mlp_{}_{}_{hidden}x{inter}", dt.tag(), quant_tag(q));
    let spec = json!({"hidden": hidden, "intermediate": inter, "quant": quant_json(q)});
    let mut c = Case::new("phi3_mlp", name, spec);
    let mut mlp = Mlp {
        gate_up: GateUp::Fused {
            gate_up_proj: c.linear("gate_up_proj", 2 * inter, hidden, dt, q),
        },
        down_proj: c.linear("down_proj", hidden, inter, dt, q),
        activation: Activation::Silu,
    };
    let x = c.rand(&[1, 5, hidden], 3.0, dt);
    c.input("x", &x);
    c.out("y", mlp.forward(&x)?);
    // As generated models hold it: the projections pretransposed.
    mlp.pretranspose();
    c.out("y@pretransposed", mlp.forward(&x)?);
    Ok(c)
}

/// phi3's attention: one `qkv_proj` matmul split at `[q, q + kv]`, RoPE,
/// the cache, fused SDPA at `head_dim ** -0.5`, `o_proj` (IR
/// `QkvProjection::Fused`, `blocks::attention_fused_qkv`), over a KVCache as
/// mlx-lm generates: a prefill (`"causal"`), one-token steps (no mask), a
/// chunk at an offset.
fn phi3_attention(dt: Dt, q: Option<Quant>, a: &AttnShape, prefill: i32, tokens: i32) -> R<Case> {
    use archgen_runtime::blocks::{
        attention_own_kv, mask_for, AttentionShape, FusedQkvAttention, OwnQkv, Scores, ValueNorm,
    };
    use archgen_runtime::cache::LayerCache;
    let (h, kvh, d) = (a.heads, a.kv_heads, a.head_dim);
    let name = format!(
        "phi3_attention_{}_{}_{}h{h}kv{kvh}d{d}",
        dt.tag(),
        quant_tag(q),
        a.hidden
    );
    let spec = json!({
        "hidden": a.hidden, "heads": h, "kv_heads": kvh, "rope_theta": a.rope_theta,
        "quant": quant_json(q), "prefill": prefill,
    });
    let mut c = Case::new("phi3_attention", name, spec);
    let attn = FusedQkvAttention {
        qkv_proj: c.linear("qkv_proj", (h + 2 * kvh) * d, a.hidden, dt, q),
        o_proj: c.linear("o_proj", a.hidden, h * d, dt, q),
    };
    let shape = AttentionShape {
        n_heads: h,
        n_kv_heads: kvh,
        head_dim: d,
        eps: 1e-5,
        scale: (d as f64).powf(-0.5) as f32,
        value_norm: ValueNorm::None,
        scores: Scores::FusedSdpa,
    };
    let rope = Rope::base(d, a.rope_theta);
    let x = c.rand(&[1, tokens, a.hidden], 3.0, dt);
    c.input("x", &x);
    let mut cache = LayerCache::Full(KvCache::default());
    let mut run = |from: i32, to: i32| -> R<Array> {
        let part = x.try_index((.., from..to, ..))?;
        let mask = mask_for(&cache, to - from, 0)?;
        Ok(attention_own_kv(&part, OwnQkv::Fused(&attn), shape, &rope, &mut cache, &mask)?.0)
    };
    let y0 = run(0, prefill)?;
    let y1 = run(prefill, prefill + 1)?;
    let y2 = run(prefill + 1, tokens)?;
    c.out("prefill", y0);
    c.out("step", y1);
    c.out("chunk", y2);
    Ok(c)
}

/// olmo2's `TransformerBlock` sizes.
struct Olmo2Shape {
    hidden: i32,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    inter: i32,
}

/// olmo2's whole layer, `h = x + post_attention_layernorm(attn(x))`, `out =
/// h + post_feedforward_layernorm(mlp(h))`, with q/k RMSNorm over the whole
/// projections (IR `NormArrangement::PostNorm`, `QkNorm::RmsWholeProjection`),
/// loaded by the blocks' loaders and run as a generated post-norm kind runs
/// it: a prefill, one token, then a chunk through one KV cache.
fn olmo2_block(dt: Dt, q: Option<Quant>, o: &Olmo2Shape, prefill: i32, tokens: i32) -> R<Case> {
    use archgen_runtime::blocks as b;
    let name = format!(
        "olmo2_block_{}_{}_{}h{}kv{}d{}",
        dt.tag(),
        quant_tag(q),
        o.hidden,
        o.heads,
        o.kv_heads,
        o.head_dim
    );
    let (eps, theta) = (1e-6f32, 500000.0f32);
    let spec = json!({
        "hidden": o.hidden, "heads": o.heads, "kv_heads": o.kv_heads, "head_dim": o.head_dim,
        "intermediate": o.inter, "eps": eps, "rope_theta": theta, "quant": quant_json(q),
        "prefill": prefill,
    });
    let mut c = Case::new("olmo2_block", name, spec);
    let (qd, kd) = (o.heads * o.head_dim, o.kv_heads * o.head_dim);
    for (path, out, inp) in [
        ("self_attn.q_proj", qd, o.hidden),
        ("self_attn.k_proj", kd, o.hidden),
        ("self_attn.v_proj", kd, o.hidden),
        ("self_attn.o_proj", o.hidden, qd),
        ("mlp.gate_proj", o.inter, o.hidden),
        ("mlp.up_proj", o.inter, o.hidden),
        ("mlp.down_proj", o.hidden, o.inter),
    ] {
        c.linear(path, out, inp, dt, q);
    }
    // Norm weights in [0.5, 1.5): a missed or misplaced norm shows.
    for (path, width) in [
        ("self_attn.q_norm.weight", qd),
        ("self_attn.k_norm.weight", kd),
        ("post_attention_layernorm.weight", o.hidden),
        ("post_feedforward_layernorm.weight", o.hidden),
    ] {
        let w = c
            .rand(&[width], 0.5, Dt::F32)
            .add(Array::from_f32(1.0))?
            .as_dtype(dt.dtype())?;
        c.param(path, &w);
    }
    let tensors: HashMap<String, Array> = c
        .tensors
        .iter()
        .map(|(k, a)| (format!("layers.0.{k}"), a.clone()))
        .collect();
    let quantization = quant_json(q);
    let mut w = Weights::new(tensors, Some(&quantization).filter(|v| !v.is_null()));
    let shape = b::AttentionShape {
        n_heads: o.heads,
        n_kv_heads: o.kv_heads,
        head_dim: o.head_dim,
        eps,
        scale: (o.head_dim as f64).powf(-0.5) as f32,
        value_norm: b::ValueNorm::None,
        scores: b::Scores::FusedSdpa,
    };
    let qk = b::QkNorm::RmsWholeProjection;
    let attn = b::load_attention(&mut w, 0, o.hidden, shape, qk);
    let kv = b::load_kv(&mut w, 0, o.hidden, shape, qk, b::Values::Projected);
    let norms = b::load_post_norms(&mut w, 0, o.hidden, b::NormWeight::Direct);
    let mlp = b::load_mlp(&mut w, 0, o.hidden, o.inter, b::Activation::Silu);
    w.finish()
        .unwrap_or_else(|e| panic!("loading {}: {e}", c.name));
    let rope = Rope::base(o.head_dim, theta);
    // Large enough inputs that the norms' means matter.
    let x = c.rand(&[1, tokens, o.hidden], 2.0, dt);
    c.input("x", &x);
    // The span matters: normalized per head, the queries get other bits.
    assert!(matches!(
        attn.q_norm,
        Some(b::QkNormWeight::WholeProjection(_))
    ));
    let proj = attn.q_proj.forward(&x)?;
    let per_head = rms_norm(&proj.reshape(&[1, tokens, o.heads, o.head_dim])?, None, eps)?
        .reshape(&[1, tokens, qd])?;
    assert_ne!(
        array_bytes(&rms_norm(&proj, None, eps)?)?,
        array_bytes(&per_head)?,
        "{}: per-head and whole-projection normalization agree here",
        c.name
    );
    let mut cache = LayerCache::Full(KvCache::default());
    for (key, from, to) in [
        ("prefill", 0, prefill),
        ("step", prefill, prefill + 1),
        ("chunk", prefill + 1, tokens),
    ] {
        let part = x.try_index((.., from..to, ..))?;
        let mask = b::mask_for(&cache, to - from, 0)?;
        let (a, _) = b::attention_own_kv(
            &part,
            b::OwnQkv::Separate {
                attn: &attn,
                kv: &kv,
            },
            shape,
            &rope,
            &mut cache,
            &mask,
        )?;
        let h = b::post_norm_attention_residual(&part, &a, &norms, eps)?;
        c.out(key, b::post_norm_feed_forward(&h, &norms, &mlp, eps)?);
    }
    Ok(c)
}

/// lfm2's `ShortConv` (`runtime/core/src/short_conv.rs`) with its
/// `ArraysCache(size=1)`: one sequence (a prefill, one token, then a chunk),
/// then a batch of two right-padded rows as `BatchGenerator` prefills them
/// (`merge` of empty caches, `prepare(lengths)`, the mask of `make_mask`,
/// `finalize`) and one step after it.
fn lfm2_short_conv(dt: Dt, q: Option<Quant>, hidden: i32, kernel: i32) -> R<Case> {
    use archgen_runtime::batch_deltanet::BatchArraysCache;
    use archgen_runtime::deltanet::ArraysCache;
    use archgen_runtime::short_conv::{load_short_conv, short_conv, short_conv_batch};
    let name = format!(
        "lfm2_short_conv_{}_{}_{hidden}k{kernel}",
        dt.tag(),
        quant_tag(q)
    );
    let (prefill, tokens, batch_tokens) = (5, 9, 6);
    let lengths = [batch_tokens, batch_tokens - 3];
    let spec = json!({
        "hidden": hidden, "kernel": kernel, "quant": quant_json(q), "prefill": prefill,
        "batch_tokens": batch_tokens, "lengths": lengths,
    });
    let mut c = Case::new("lfm2_short_conv", name, spec);
    c.linear("in_proj", 3 * hidden, hidden, dt, q);
    c.linear("out_proj", hidden, hidden, dt, q);
    let conv = c.rand(&[hidden, kernel, 1], 1.0 / (kernel as f32).sqrt(), dt);
    c.param("conv.weight", &conv);
    let tensors: HashMap<String, Array> = c
        .tensors
        .iter()
        .map(|(k, a)| (format!("layers.0.conv.{k}"), a.clone()))
        .collect();
    let quantization = quant_json(q);
    let mut w = Weights::new(tensors, Some(&quantization).filter(|v| !v.is_null()));
    let mut layer = load_short_conv(&mut w, 0, hidden, kernel);
    w.finish()
        .unwrap_or_else(|e| panic!("loading {}: {e}", c.name));
    layer.pretranspose();
    let x = c.rand(&[1, tokens, hidden], 1.0, dt);
    c.input("x", &x);
    let mut cache = ArraysCache::default();
    for (key, from, to) in [
        ("prefill", 0, prefill),
        ("step", prefill, prefill + 1),
        ("chunk", prefill + 1, tokens),
    ] {
        let part = x.try_index((.., from..to, ..))?;
        c.out(key, short_conv(&part, &layer, &mut cache)?);
    }
    let xb = c.rand(&[2, batch_tokens + 1, hidden], 1.0, dt);
    c.input("xb", &xb);
    let mut batch = BatchArraysCache::merged_empty(2);
    batch.prepare(&lengths);
    let mask = batch.make_mask(batch_tokens)?;
    let part = xb.try_index((.., 0..batch_tokens, ..))?;
    c.out(
        "batch_prefill",
        short_conv_batch(&part, &layer, &mut batch, mask.as_ref())?,
    );
    batch.finalize();
    let mask = batch.make_mask(1)?;
    let part = xb.try_index((.., batch_tokens.., ..))?;
    c.out(
        "batch_step",
        short_conv_batch(&part, &layer, &mut batch, mask.as_ref())?,
    );
    Ok(c)
}

// ---------------------------------------------------------------- the test

fn all_cases() -> R<Vec<Case>> {
    let mut cases = Vec::new();
    let dts = [Dt::F32, Dt::Bf16];
    let quants = [None, Some(Q4G64), Some(Q4G32)];
    for dt in dts {
        for q in quants {
            // Tiny, and Qwen2.5-0.5B's q_proj (896 -> 896) and k_proj (896 -> 128).
            for shape in [(64, 48, 5), (896, 896, 7), (896, 128, 7)] {
                cases.push(linear_bias(dt, q, shape)?);
            }
            cases.push(gemma2_mlp(dt, q, (64, 128))?);
            // Gemma-2-2b's MLP (2304 -> 9216); in f32 unquantized only, to
            // keep the test's memory and time down.
            if matches!(dt, Dt::Bf16) || q.is_none() {
                cases.push(gemma2_mlp(dt, q, (2304, 9216))?);
            }
            cases.push(gemma2_embed(dt, q, 64)?);
            cases.push(gemma2_final(dt, q, 64, 30.0)?);
            cases.push(minicpm_embed(dt, q, 64, 12.0)?);
            cases.push(minicpm_logits(dt, q, 64, 16)?);
            // Granite-3.3-2B's logits_scaling 8, and 3 (not a power of two:
            // a divide and a multiply by 1/3 differ).
            for (tied, scaling) in [(true, 8.0), (false, 3.0), (true, 3.0)] {
                cases.push(granite_logits(dt, q, 64, tied, scaling)?);
            }
        }
        // Gemma-2-2b's and -9b's widths (sqrt(3584) is not a bf16 number).
        for hidden in [2304, 3584] {
            cases.push(gemma2_embed(dt, None, hidden)?);
            cases.push(gemma2_norm(dt, hidden)?);
        }
        cases.push(gemma2_norm(dt, 64)?);
        // Gemma 3: the bf16-rounded embedding scale at gemma-3-1b's width,
        // and linear RoPE (factor 8, as 4b/12b/27b) at head_dim 256 and 16.
        cases.push(gemma3_embed(dt, "gemma-3-1b.yaml")?);
        cases.push(gemma3_linear_rope(dt, 256, 1e6, 8.0)?);
        cases.push(gemma3_linear_rope(dt, 16, 1e6, 8.0)?);
        // YaRN: DeepSeek-V3's (traditional pairs, mscale equal to
        // mscale_all_dim: no input scale) and an input scale of 1 + 0.1 ln 32
        // (no mscale keys, as a config that leaves them out), both pairings.
        let yarn = |theta, factor, mscale, mscale_all_dim| archgen_ir::RopeKind::Yarn {
            theta,
            factor,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale,
            mscale_all_dim,
        };
        cases.push(yarn_rope(dt, 64, 0, yarn(10000.0, 40.0, 1.0, 1.0), true)?);
        cases.push(yarn_rope(dt, 64, 0, yarn(150000.0, 32.0, 1.0, 0.0), false)?);
        cases.push(yarn_rope(dt, 64, 64, yarn(150000.0, 32.0, 1.0, 0.0), true)?);
        cases.push(yarn_rope(
            dt,
            16,
            16,
            yarn(10000.0, 4.0, 0.707, 1.0),
            false,
        )?);
        cases.push(gemma2_final(dt, None, 2304, 30.0)?);
        // MiniCPM-2B: scale_emb 12, scale_depth 1.4, 40 layers, dim_model_base 256.
        cases.push(minicpm_embed(dt, None, 2304, 12.0)?);
        cases.push(minicpm_residual(dt, 2304, 1.4, 40)?);
        cases.push(minicpm_residual(dt, 64, 1.4, 3)?);
        cases.push(minicpm_logits(dt, None, 2304, 256)?);
        // Granite's residual_multiplier (0.22, not a bf16 number) is the same
        // weak multiply with another factor: IR `Residual::Scaled`.
        cases.push(granite_residual(dt, 2048, 0.22)?);
        cases.push(granite_logits(dt, None, 2048, true, 8.0)?);
        // phi3's fused projections: tiny (GQA 2:1, so the split's three
        // widths differ) in every quantization, and Phi-3-mini-4k's widths
        // (3072 hidden, 32 heads of 96, MHA; MLP 8192) unquantized and 4-bit.
        let phi3_tiny = AttnShape {
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            query_pre_attn_scalar: 0.0,
            softcap: 0.0,
            rope_theta: 10000.0,
        };
        let phi3_mini = AttnShape {
            hidden: 3072,
            heads: 32,
            kv_heads: 32,
            head_dim: 96,
            ..phi3_tiny
        };
        for q in quants {
            cases.push(phi3_mlp(dt, q, (64, 128))?);
            cases.push(phi3_attention(dt, q, &phi3_tiny, 5, 9)?);
        }
        for q in [None, Some(Q4G64)] {
            cases.push(phi3_mlp(dt, q, (3072, 8192))?);
            cases.push(phi3_attention(dt, q, &phi3_mini, 4, 7)?);
        }

        let tiny = AttnShape {
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            // 144**-0.5 = 1/12 is not a bf16 number: the weak scalar rounds.
            query_pre_attn_scalar: 144.0,
            softcap: 50.0,
            rope_theta: 10000.0,
        };
        let mha = AttnShape {
            kv_heads: 4,
            ..tiny
        };
        for q in quants {
            cases.push(gemma2_attention(
                dt,
                q,
                &tiny,
                AttnMode::Cached { prefill: 5 },
                9,
            )?);
        }
        cases.push(gemma2_attention(
            dt,
            None,
            &mha,
            AttnMode::Cached { prefill: 4 },
            7,
        )?);
        cases.push(gemma2_attention(dt, None, &tiny, AttnMode::Additive, 6)?);
        // gemma-2-2b: 2304 hidden, 8 heads over 4 KV heads of 256, scalar 256.
        let g2b = AttnShape {
            hidden: 2304,
            heads: 8,
            kv_heads: 4,
            head_dim: 256,
            query_pre_attn_scalar: 256.0,
            softcap: 50.0,
            rope_theta: 10000.0,
        };
        cases.push(gemma2_attention(
            dt,
            None,
            &g2b,
            AttnMode::Cached { prefill: 6 },
            9,
        )?);
        cases.push(gemma2_attention(
            dt,
            Some(Q4G64),
            &g2b,
            AttnMode::Cached { prefill: 6 },
            9,
        )?);
    }

    // qwen3_moe: unquantized gather_mm runs only in f32 on the CPU, so bf16
    // is quantized (as Gemma-4's MoE). 5 tokens x top-2 = 10 < 64 indices
    // takes the unsorted path, 40 x 2 = 80 the sorted one.
    let tiny = MoeShape {
        hidden: 64,
        inter: 64,
        experts: 8,
        top_k: 2,
    };
    for probs in [TopKProbs::Renormalized, TopKProbs::AsTaken] {
        for tokens in [5, 40] {
            cases.push(qwen3_moe(Dt::F32, None, &tiny, tokens, probs)?);
            for q in [Some(Q4G64), Some(Q4G32)] {
                cases.push(qwen3_moe(Dt::Bf16, q, &tiny, tokens, probs)?);
                cases.push(qwen3_moe(Dt::F32, q, &tiny, tokens, probs)?);
            }
        }
    }
    // Qwen3-30B-A3B's widths (2048 hidden, 768 per expert, top-8) with 16 of
    // its 128 experts: 3 tokens (24 indices, unsorted) and 9 (72, sorted).
    let real = MoeShape {
        hidden: 2048,
        inter: 768,
        experts: 16,
        top_k: 8,
    };
    for tokens in [3, 9] {
        cases.push(qwen3_moe(
            Dt::Bf16,
            Some(Q4G64),
            &real,
            tokens,
            TopKProbs::Renormalized,
        )?);
    }
    cases.push(qwen3_moe(Dt::F32, None, &real, 9, TopKProbs::Renormalized)?);

    // deepseek_v3's latent attention: tiny (q through q_lora_rank or one
    // q_proj; f32, bf16, 4-bit g32), and DeepSeek-V3's widths (7168 hidden,
    // q_lora_rank 1536, kv_lora_rank 512, 128 + 64 per query head, values
    // of 128) with 2 of its 128 heads, bf16 and 4-bit g64.
    for q_lora in [Some(64), None] {
        let tiny = MlaShape {
            hidden: 64,
            heads: 4,
            nope: 32,
            rope: 16,
            v: 32,
            rank: 64,
            q_lora,
        };
        for dt in dts {
            for q in [None, Some(Q4G32)] {
                cases.push(deepseek_mla(dt, q, &tiny, 5)?);
            }
        }
    }
    let v3 = MlaShape {
        hidden: 7168,
        heads: 2,
        nope: 128,
        rope: 64,
        v: 128,
        rank: 512,
        q_lora: Some(1536),
    };
    for q in [None, Some(Q4G64)] {
        cases.push(deepseek_mla(Dt::Bf16, q, &v3, 6)?);
    }

    // glm4_moe: 16 experts, top-4, with and without group-limited routing
    // (4 groups, the 2 best eligible), renormalized or as taken times 2.5;
    // 5 tokens x 4 = 20 < 64 indices (unsorted), 20 x 4 = 80 (sorted).
    // Unquantized experts run in f32 only on the CPU; bf16 is quantized.
    let routings = [
        (1, 1, TopKProbs::Renormalized, 1.0),
        (4, 2, TopKProbs::AsTaken, 2.5),
    ];
    for (n_group, topk_group, probs, scaling) in routings {
        let tiny = GlmMoeShape {
            hidden: 64,
            inter: 64,
            experts: 16,
            top_k: 4,
            n_group,
            topk_group,
            n_shared: 2,
        };
        for tokens in [5, 20] {
            cases.push(glm4_moe(Dt::F32, None, &tiny, tokens, probs, scaling)?);
            for q in [Some(Q4G64), Some(Q4G32)] {
                cases.push(glm4_moe(Dt::Bf16, q, &tiny, tokens, probs, scaling)?);
            }
        }
    }
    // GLM-4.5-Air's widths (4096 hidden, 1408 per expert and shared expert,
    // top-8) with 8 of its 128 experts: 9 tokens (72 indices, sorted).
    let air = GlmMoeShape {
        hidden: 4096,
        inter: 1408,
        experts: 8,
        top_k: 8,
        n_group: 1,
        topk_group: 1,
        n_shared: 1,
    };
    cases.push(glm4_moe(
        Dt::Bf16,
        Some(Q4G64),
        &air,
        9,
        TopKProbs::Renormalized,
        1.0,
    )?);

    // olmo2: GQA 2:1 at a tiny width (q_norm and k_norm of different
    // widths), every dtype and quantization; OLMo-2-0425-1B's layer (2048
    // hidden, 16 heads of 128, SwiGLU 8192) in bf16.
    let tiny = Olmo2Shape {
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        inter: 128,
    };
    for dt in dts {
        for q in quants {
            cases.push(olmo2_block(dt, q, &tiny, 5, 9)?);
        }
    }
    let olmo2_1b = Olmo2Shape {
        hidden: 2048,
        heads: 16,
        kv_heads: 16,
        head_dim: 128,
        inter: 8192,
    };
    cases.push(olmo2_block(Dt::Bf16, None, &olmo2_1b, 6, 9)?);

    // lfm2's short conv: a tiny width in every dtype and quantization, and
    // LFM2-1.2B's (2048 channels, kernel 3) in bf16.
    for dt in dts {
        for q in quants {
            cases.push(lfm2_short_conv(dt, q, 64, 3)?);
        }
    }
    cases.push(lfm2_short_conv(Dt::Bf16, None, 2048, 3)?);

    // gpt_oss's MLPBlock: 8 experts of width 64, top-4, 5 tokens (20 routed
    // pairs: no sort) and 20 (80: SwitchGLU's sort path), f32 dense and bf16
    // 4-bit g64 with the router at 8 bits; mxfp4 experts with the rest 8-bit
    // g64 (mlx-community's MXFP4-Q8); gpt-oss-20b's 2880 widths, 8 of its
    // experts, both quantized forms.
    let tiny = MoeShape {
        hidden: 64,
        inter: 64,
        experts: 8,
        top_k: 4,
    };
    let q8 = Quant { bits: 8, group: 64 };
    for tokens in [5, 20] {
        cases.push(gpt_oss_mlp(
            Dt::F32,
            None,
            ExpertQuant::AsTheRest,
            &tiny,
            tokens,
        )?);
        cases.push(gpt_oss_mlp(
            Dt::Bf16,
            Some(Q4G64),
            ExpertQuant::AsTheRest,
            &tiny,
            tokens,
        )?);
        cases.push(gpt_oss_mlp(
            Dt::Bf16,
            Some(q8),
            ExpertQuant::Mxfp4,
            &tiny,
            tokens,
        )?);
    }
    let oss20b = MoeShape {
        hidden: 2880,
        inter: 2880,
        experts: 8,
        top_k: 4,
    };
    cases.push(gpt_oss_mlp(
        Dt::Bf16,
        Some(Q4G64),
        ExpertQuant::AsTheRest,
        &oss20b,
        9,
    )?);
    cases.push(gpt_oss_mlp(
        Dt::Bf16,
        Some(q8),
        ExpertQuant::Mxfp4,
        &oss20b,
        9,
    )?);
    Ok(cases)
}

#[test]
fn family_blocks_match_mlx_lm_bit_for_bit() {
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
        "family_blocks.py",
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
        // "y@pretransposed" and "y@loaded" are compared with Python's "y".
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

    // The comparison can fail: in bf16, `x @ W.T + b` (what the bias would
    // be without addmm) differs from mlx nn's Linear somewhere.
    let c = cases
        .iter()
        .find(|c| c.name == "linear_bias_bf16_dense_896x896")
        .unwrap();
    let get = |k: &str| &c.tensors.iter().find(|(n, _)| n == k).unwrap().1;
    let naive = get("@x")
        .matmul(get("weight").t())
        .unwrap()
        .add(get("bias"))
        .unwrap();
    assert_ne!(
        array_bytes(&naive).unwrap(),
        array_bytes(&theirs[&format!("{}/y", c.name)]).unwrap(),
        "bf16 matmul + add equals addmm here: this case cannot tell them apart"
    );
    eprintln!(
        "{} outputs of {} cases byte-identical with mlx-lm",
        keys.len(),
        cases.len()
    );
}

/// A biased linear whose checkpoint lacks the bias is a load error that
/// names the tensor.
#[test]
fn a_missing_bias_is_named() {
    let w = lcg(1, &[8, 16]);
    let tensors = HashMap::from([("model.layers.0.self_attn.k_proj.weight".to_string(), w)]);
    let mut weights = Weights::new(tensors, None);
    let _ = linear_with_bias(&mut weights, "model.layers.0.self_attn.k_proj", 8, 16);
    let err = weights.finish().unwrap_err().to_string();
    assert!(
        err.contains("missing tensor 'model.layers.0.self_attn.k_proj.bias'"),
        "{err}"
    );
}

// ---- Oracles: mlx-lm's formulas written out for these tests

/// A linear layer [out, in] with its `[out]` bias (`{path}.bias`), loaded as
/// `blocks::load_biases` puts qwen2's q/k/v biases on its projections.
fn linear_with_bias(weights: &mut Weights, path: &str, out: i32, in_dims: i32) -> Linear {
    let mut linear = weights.linear(path, out, in_dims);
    linear.bias = Some(weights.param(&format!("{path}.bias"), &[out]));
    linear
}

/// gemma2's query scale, `1.0 / (query_pre_attn_scalar**0.5)` computed in
/// f64 as Python does (a divide of a `pow`, not `pow(x, -0.5)`); it meets
/// the queries as a weak scalar in `softcapped_attention`.
fn query_pre_attn_scale(query_pre_attn_scalar: f64) -> f64 {
    1.0 / query_pre_attn_scalar.powf(0.5)
}

/// minicpm's residual: `x + r * (scale_depth / num_hidden_layers**0.5)`, the
/// factor a Python float computed in f64 first, then a weak scalar.
fn scaled_residual(x: &Array, r: &Array, scale_depth: f64, num_layers: usize) -> R<Array> {
    let factor = scale_depth / (num_layers as f64).powf(0.5);
    x.add(multiply_weak(r, factor)?)
}
