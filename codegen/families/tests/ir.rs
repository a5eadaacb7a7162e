//! Every checked-in spec lowers to the block IR with its family's facts:
//! per-layer geometry, K/V sources, RoPE, widths, caches, quantizable modules,
//! quantization and parameter count.

use archgen_families::*;
use archgen_ir::*;
use std::path::PathBuf;

/// The indices of the layers whose feed-forward half is `kind`.
fn layers_where(ir: &ModelIr, kind: impl Fn(&FeedForward) -> bool) -> Vec<usize> {
    ir.layers
        .iter()
        .filter(|l| kind(&l.ffn))
        .map(|l| l.index)
        .collect()
}

/// The paths of the modules `nn.quantize` visits.
fn module_paths(ir: &ModelIr) -> Vec<String> {
    ir.quantizable_modules()
        .into_iter()
        .map(|m| m.path)
        .collect()
}

fn specs() -> Vec<(String, Spec)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../specs");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let spec = load(&path).unwrap_or_else(|d| panic!("{d}"));
            out.push((path.display().to_string(), spec));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 13);
    out
}

/// Per checked-in spec: parameters, quantizable modules, quantized modules.
/// Pinned when the legacy per-layer view (`Architecture`) was removed, whose
/// independent module list and parameter count these equalled for every
/// family it covered (the IR's alone for Qwen3-MoE, Qwen3.5 and Phi-3's fused
/// projections). The real-size counts are the published ones (gemma-2-2b:
/// 2,614,341,888; gemma-3-1b: 999,885,952).
const MODULE_COUNTS: &[(&str, u64, usize, usize)] = &[
    ("deepseek-v3", 671026419200, 725, 0),
    ("deepseek-v3-direct-q-tiny", 279088, 32, 0),
    ("deepseek-v3-l2-q4", 3372768272, 23, 23),
    ("deepseek-v3-tiny", 266896, 35, 0),
    ("deepseek-v3-tiny-q4", 266896, 35, 35),
    ("gemma-2-2b", 2614341888, 183, 0),
    ("gemma-2-2b-l2", 745558272, 15, 0),
    ("gemma-2-2b-tiny", 181312, 29, 0),
    ("gemma-2-2b-tiny-q4", 181312, 29, 29),
    ("gemma-2-9b", 9241705984, 295, 0),
    ("gemma-3-1b", 999885952, 183, 0),
    ("gemma-3-1b-l6", 463043712, 43, 0),
    ("gemma-3-1b-tiny", 255744, 43, 0),
    ("gemma-3-1b-tiny-q4", 255744, 43, 43),
    ("gemma-3-4b", 3880263168, 239, 0),
    ("gemma-3-4b-l6", 1237550592, 43, 0),
    ("gemma-3-4b-tiny", 255744, 43, 0),
    ("gemma4-12b", 11907350320, 329, 0),
    ("gemma4-12b-bench", 40711558, 42, 0),
    ("gemma4-12b-l6", 2369225990, 42, 0),
    ("gemma4-12b-q4", 11907350320, 329, 329),
    ("gemma4-12b-tiny", 491020, 83, 0),
    ("gemma4-12b-tiny-mixed-kv", 491020, 83, 0),
    ("gemma4-12b-tiny-q4", 491020, 83, 83),
    ("gemma4-26b-a4b", 25233141790, 326, 0),
    ("gemma4-26b-a4b-q4", 25233141790, 326, 326),
    ("gemma4-26b-a4b-tiny", 644668, 131, 0),
    ("gemma4-26b-a4b-tiny-q8", 644668, 131, 131),
    ("gemma4-31b", 30697345340, 411, 0),
    ("gemma4-31b-tiny", 491020, 83, 0),
    ("gemma4-31b-tp-tiny", 495116, 83, 0),
    ("gemma4-e2b", 4628569379, 278, 0),
    ("gemma4-e2b-tiny", 628218, 83, 0),
    ("gemma4-e4b", 7463013418, 345, 0),
    ("gemma4-e4b-tiny", 596140, 99, 0),
    ("gemma4-e4b-tiny-kv", 914242, 153, 0),
    ("gemma4-walkthrough-tiny", 246623, 61, 0),
    ("glm-4.5-air", 106852251264, 459, 0),
    ("glm-4.5-air-l2-q4", 1888337936, 19, 19),
    ("glm-4.5-air-tiny", 307800, 39, 0),
    ("glm-4.5-air-tiny-q4", 307800, 39, 39),
    ("glm4-moe-grouped-tiny", 437088, 36, 0),
    ("glm4-moe-grouped-tiny-q8", 437088, 36, 36),
    ("gpt-oss-20b", 20914757184, 194, 0),
    ("gpt-oss-20b-l2-q4", 1609697104, 18, 18),
    ("gpt-oss-20b-tiny", 318832, 34, 0),
    ("gpt-oss-20b-tiny-mxfp4-q8", 517488, 34, 34),
    ("gpt-oss-20b-tiny-q4", 318832, 34, 34),
    ("granite-3.3-2b", 2533539840, 281, 0),
    ("granite-3.3-2b-l2", 222322688, 15, 0),
    ("granite-3.3-2b-tiny", 180800, 29, 0),
    ("granite-3.3-2b-tiny-q4", 180800, 29, 29),
    ("lfm2-1.2b", 1170340608, 93, 0),
    ("lfm2-1.2b-l4", 396398720, 23, 0),
    ("lfm2-1.2b-tiny", 308864, 35, 0),
    ("lfm2-1.2b-tiny-q4", 308864, 35, 35),
    ("llama-3.2-1b", 1235814400, 113, 0),
    ("llama-3.2-1b-tiny", 180800, 29, 0),
    ("llama-3.2-1b-tiny-q4", 180800, 29, 29),
    ("llama-3.2-3b", 3212749824, 197, 0),
    ("minicpm-2b", 3007703808, 282, 0),
    ("minicpm-2b-l2", 687750912, 16, 0),
    ("minicpm-2b-tiny", 467808, 30, 0),
    ("minicpm-2b-tiny-q4", 467808, 30, 30),
    ("mistral-7b-v0.3", 7248023552, 226, 0),
    ("mistral-7b-v0.3-l2", 704663552, 16, 0),
    ("mistral-7b-v0.3-tiny", 213568, 30, 0),
    ("mistral-7b-v0.3-tiny-q4", 213568, 30, 30),
    ("olmo-2-1124-7b", 7298617344, 226, 0),
    ("olmo-2-1124-7b-l2", 1226870784, 16, 0),
    ("olmo-2-1124-7b-tiny", 213952, 30, 0),
    ("olmo-2-1124-7b-tiny-q4", 213952, 30, 30),
    ("phi-3-mini-4k", 3821079552, 130, 0),
    ("phi-3-mini-4k-l2", 423508992, 10, 0),
    ("phi-3-mini-4k-tiny", 213568, 18, 0),
    ("phi-3-mini-4k-tiny-q4", 213568, 18, 18),
    ("qwen2.5-0.5b", 494032768, 169, 0),
    ("qwen2.5-0.5b-l4", 195785088, 29, 0),
    ("qwen2.5-0.5b-tiny", 181312, 29, 0),
    ("qwen2.5-0.5b-tiny-q4", 181312, 29, 29),
    ("qwen2.5-7b", 7615616512, 198, 0),
    ("qwen3-0.6b", 596049920, 197, 0),
    ("qwen3-0.6b-tiny", 180928, 29, 0),
    ("qwen3-0.6b-tiny-mixed-kv", 230208, 29, 0),
    ("qwen3-0.6b-tiny-q4", 180928, 29, 29),
    ("qwen3-1.7b", 1720574976, 197, 0),
    ("qwen3-30b-a3b", 30532122624, 386, 0),
    ("qwen3-30b-a3b-l2-q4", 1868573184, 18, 18),
    ("qwen3-30b-a3b-tiny", 314048, 34, 0),
    ("qwen3-30b-a3b-tiny-q4", 314048, 34, 34),
    ("qwen3-4b", 4022468096, 253, 0),
    ("qwen3-8b", 8190735360, 254, 0),
    ("qwen3-8b-tiny", 213696, 30, 0),
    ("qwen3-moe-mixed-tiny-q8", 218816, 31, 31),
    ("qwen3-next-80b-a3b", 79674391296, 542, 0),
    ("qwen3-next-80b-a3b-l4", 964815936, 47, 0),
    ("qwen3-next-80b-a3b-tiny", 651024, 92, 0),
    ("qwen3-next-80b-a3b-tiny-q4", 651024, 92, 92),
    ("qwen3.5-4b", 4205751296, 249, 0),
    ("qwen3.5-4b-l4", 1081957952, 32, 0),
    ("qwen3.5-4b-tiny", 367888, 63, 0),
    ("qwen3.5-4b-tiny-q4", 367888, 63, 63),
    ("qwen3.5-4b-tp-tiny", 198312, 32, 0),
    ("qwen3.5-9b", 8953803264, 250, 0),
    ("qwen3.6-27b", 26895998464, 498, 0),
    ("qwen3.6-35b-a3b", 34660610688, 512, 0),
    ("qwen3.6-35b-a3b-tiny", 651024, 104, 0),
    ("qwen3.6-35b-a3b-tiny-q4", 651024, 104, 104),
    ("smollm3-3b", 3075098624, 253, 0),
    ("smollm3-3b-l4", 575162368, 29, 0),
    ("smollm3-3b-tiny", 180800, 29, 0),
    ("smollm3-3b-tiny-q4", 180800, 29, 29),
];

#[test]
fn parameter_and_module_counts_are_pinned() {
    let specs = specs();
    assert_eq!(
        specs.len(),
        MODULE_COUNTS.len(),
        "a spec was added or removed: pin it here"
    );
    for (path, spec) in &specs {
        let Some(&(_, params, modules, quantized)) =
            MODULE_COUNTS.iter().find(|row| row.0 == spec.name())
        else {
            panic!("{path}: not pinned in MODULE_COUNTS");
        };
        let ir = spec.lower();
        let list = ir.quantizable_modules();
        let got = (
            ir.param_count(),
            list.len(),
            list.iter()
                .filter(|m| ir.quant_for(&m.path).is_some())
                .count(),
        );
        assert_eq!(got, (params, modules, quantized), "{path}");
    }
}

/// The facts of a layer and its attention that tell the block families
/// apart, compared as one value so that a mismatch shows them all.
#[derive(Debug, PartialEq)]
struct BlockFacts {
    arrangement: NormArrangement,
    scale: AttentionScale,
    value_norm: ValueNorm,
    activation: Option<Activation>,
    embedding: EmbedScale,
    scalar: LayerScalar,
}

impl BlockFacts {
    fn of(ir: &ModelIr, l: &Layer, a: &archgen_ir::Attention) -> BlockFacts {
        BlockFacts {
            arrangement: l.norms.arrangement,
            scale: a.scale,
            value_norm: a.value_norm,
            activation: l.mlp().map(|m| m.activation),
            embedding: ir.embedding.scale,
            scalar: l.scalar,
        }
    }
}

/// What every layer of a family with one kind of layer has in common: its
/// norm arrangement, q/k norm, attention scale, projection bias and residual.
#[derive(Debug, PartialEq)]
struct LayerFacts(
    NormArrangement,
    QkNorm,
    AttentionScale,
    ProjectionBias,
    Residual,
);

/// The [`LayerFacts`] of every layer of `spec`'s model, or None where the
/// family's arm checks its layers itself.
fn every_layer(path: &str, spec: &Spec) -> Option<LayerFacts> {
    use AttentionScale::InvSqrtHeadDim;
    use NormArrangement::PreNorm;
    let unbiased = ProjectionBias::None;
    let pre_norm = |scale, residual| LayerFacts(PreNorm, QkNorm::None, scale, unbiased, residual);
    let dense = || match spec {
        Spec::Dense(d) => d,
        other => panic!("{path}: family {} in a {other:?}", spec.family().as_str()),
    };
    match spec.family() {
        Family::Olmo2 => Some(LayerFacts(
            NormArrangement::PostNorm,
            QkNorm::RmsWholeProjection,
            InvSqrtHeadDim,
            unbiased,
            Residual::Plain,
        )),
        Family::SmolLm3 | Family::Phi3 => Some(pre_norm(InvSqrtHeadDim, Residual::Plain)),
        Family::Gemma3Text => {
            let g = match spec {
                Spec::Gemma2(g) => g,
                other => panic!("{path}: family gemma3_text in a {other:?}"),
            };
            Some(LayerFacts(
                NormArrangement::Sandwich,
                QkNorm::RmsPerHeadOnePlus,
                // `query_pre_attn_scalar**-0.5`, one pow.
                AttentionScale::Constant(g.attention.query_pre_attn_scalar.powf(-0.5)),
                unbiased,
                // `clip_residual` on both branches.
                Residual::ClippedInFloat16,
            ))
        }
        Family::Granite => {
            let g = dense().scales.as_ref().expect("checked");
            let scaled = Residual::Scaled {
                multiplier: g.residual_multiplier,
            };
            Some(pre_norm(
                AttentionScale::Constant(g.attention_multiplier),
                scaled,
            ))
        }
        Family::MiniCpm => {
            let m = match spec {
                Spec::MiniCpm(m) => m,
                other => panic!("{path}: family minicpm in a {other:?}"),
            };
            let depth_scaled = Residual::DepthScaled {
                scale_depth: m.scales.scale_depth,
                num_hidden_layers: m.layers.num_hidden_layers as usize,
            };
            Some(pre_norm(InvSqrtHeadDim, depth_scaled))
        }
        Family::Gemma4
        | Family::Qwen3
        | Family::Llama
        | Family::Qwen2
        | Family::Gemma2
        | Family::Qwen3Moe
        | Family::Qwen35
        | Family::Lfm2
        | Family::Glm4Moe
        | Family::Qwen3Next
        | Family::DeepseekV3
        | Family::GptOss => None,
    }
}

/// DeepSeek-V3's layers: latent attention (its sizes, traditional YaRN, the
/// corrected scale), dense then group-routed feed-forward halves.
fn deepseek_v3_layers(path: &str, s: &DeepseekV3Spec, ir: &ModelIr) {
    let y = s.rope.scaling;
    // `q_head_dim ** -0.5 * m * m`, m = 0.1 * mscale_all_dim * ln(factor) + 1.
    let q_head_dim = f64::from(s.attention.qk_nope_head_dim + s.attention.qk_rope_head_dim);
    let m = 0.1 * y.mscale_all_dim * y.factor.ln() + 1.0;
    for l in &ir.layers {
        assert_eq!(l.norms.arrangement, NormArrangement::PreNorm, "{path}");
        let Mixer::LatentAttention(a) = &l.mixer else {
            panic!("{path}: layer {} is not latent attention", l.index)
        };
        assert_eq!(a.n_heads as u32, s.attention.num_attention_heads, "{path}");
        assert_eq!(a.kv_lora_rank as u32, s.attention.kv_lora_rank, "{path}");
        assert_eq!(
            a.query,
            match s.attention.q_lora_rank {
                None => LatentQuery::Direct,
                Some(r) => LatentQuery::LowRank { rank: r as usize },
            },
            "{path}"
        );
        assert!(
            a.rope.traditional,
            "{path}: DeepSeek-V3 rotates interleaved pairs"
        );
        assert_eq!(a.rope.rotated_dims as u32, s.attention.qk_rope_head_dim);
        assert!(matches!(a.rope.kind, RopeKind::Yarn { .. }), "{path}");
        assert_eq!(a.scale, q_head_dim.powf(-0.5) * m * m, "{path}");
        let dense = (l.index as u32) < s.moe.first_k_dense_replace;
        match l.ffn {
            FeedForward::Mlp(mlp) => {
                assert!(dense && mlp.width as u32 == s.mlp.intermediate_size)
            }
            FeedForward::MoeAndSharedExperts { moe, .. } => {
                assert!(!dense, "{path} layer {}", l.index);
                assert!(matches!(moe.router, Router::SigmoidGroupTopK(_)), "{path}");
            }
            other => panic!("{path}: feed-forward {other:?}"),
        }
    }
    assert_eq!(ir.head.weight, HeadWeight::Untied, "{path}");
    assert!(ir.checkpoint.sanitize.contains(&SanitizeRule::SplitKvBProj));
}

#[test]
fn families_lower_to_their_blocks() {
    for (path, spec) in specs() {
        let ir = spec.lower();
        if let Some(want) = every_layer(&path, &spec) {
            for l in &ir.layers {
                let a = l.attention().expect("every layer is attention");
                let got = LayerFacts(l.norms.arrangement, a.qk_norm, a.scale, a.bias, l.residual);
                assert_eq!(got, want, "{path} layer {}", l.index);
            }
        }
        if let Spec::DeepseekV3(s) = &spec {
            deepseek_v3_layers(&path, s, &ir);
            continue;
        }
        let l = &ir.layers[0];
        let a = ir
            .layers
            .iter()
            .find_map(Layer::attention)
            .unwrap_or_else(|| panic!("{path}: no attention layer"));
        match spec.family() {
            Family::Gemma4 => assert_eq!(
                BlockFacts::of(&ir, l, a),
                BlockFacts {
                    arrangement: NormArrangement::Sandwich,
                    scale: AttentionScale::One,
                    value_norm: ValueNorm::RmsScaleFree,
                    activation: Some(Activation::GeluApprox),
                    embedding: EmbedScale::SqrtHidden,
                    scalar: LayerScalar::Learned,
                },
                "{path}"
            ),
            Family::Qwen3 | Family::Llama | Family::Qwen2 => {
                assert_eq!(
                    BlockFacts::of(&ir, l, a),
                    BlockFacts {
                        arrangement: NormArrangement::PreNorm,
                        scale: AttentionScale::InvSqrtHeadDim,
                        value_norm: ValueNorm::None,
                        activation: Some(Activation::Silu),
                        embedding: EmbedScale::None,
                        scalar: LayerScalar::None,
                    },
                    "{path}"
                );
                let qk = if spec.family() == Family::Qwen3 {
                    QkNorm::RmsPerHead
                } else {
                    QkNorm::None
                };
                assert_eq!(a.qk_norm, qk, "{path}");
                // Qwen2's q/k/v biases, and their tensors in the contract.
                let bias = if spec.family() == Family::Qwen2 {
                    ProjectionBias::QueryKeyValue
                } else {
                    ProjectionBias::None
                };
                assert_eq!(a.bias, bias, "{path}");
                let biases = ir
                    .vector_params()
                    .iter()
                    .filter(|p| p.name.ends_with(".bias"))
                    .count();
                let want = match bias {
                    ProjectionBias::QueryKeyValue => 3 * ir.layers.len(),
                    ProjectionBias::QueryKeyValueOutput => 4 * ir.layers.len(),
                    ProjectionBias::None => 0,
                };
                assert_eq!(biases, want, "{path}");
            }
            Family::SmolLm3 => {
                let d = match &spec {
                    Spec::Dense(d) => d,
                    other => panic!("{path}: family smollm3 in a {other:?}"),
                };
                let n = d.rope.no_rope_layer_interval.expect("checked") as usize;
                for l in &ir.layers {
                    let a = l.attention().expect("smollm3 layers are attention");
                    // smollm3.py: no_rope_layers[i] = int((i + 1) % n != 0).
                    assert_eq!(
                        a.rope.kind == archgen_ir::RopeKind::NoPe,
                        (l.index + 1) % n == 0,
                        "{path} layer {}",
                        l.index
                    );
                }
            }
            Family::Olmo2 => {
                // The contract: post-attention and post-feedforward norms of
                // [hidden], no input norm, and q/k norms over whole projections.
                let vectors = ir.vector_params();
                let len = |name: &str| {
                    vectors
                        .iter()
                        .find(|p| p.name == format!("model.layers.0.{name}.weight"))
                        .map(|p| p.len)
                };
                let h = ir.hidden_size as u64;
                assert_eq!(len("post_attention_layernorm"), Some(h), "{path}");
                assert_eq!(len("post_feedforward_layernorm"), Some(h), "{path}");
                assert_eq!(len("input_layernorm"), None, "{path}");
                assert_eq!(
                    len("self_attn.q_norm"),
                    Some((a.n_heads * a.head_dim) as u64),
                    "{path}"
                );
                assert_eq!(
                    len("self_attn.k_norm"),
                    Some((a.n_kv_heads * a.head_dim) as u64),
                    "{path}"
                );
            }
            Family::Granite => {
                let g = match &spec {
                    Spec::Dense(d) => d.scales.clone().expect("checked"),
                    other => panic!("{path}: family granite in a {other:?}"),
                };
                assert_eq!(
                    ir.embedding.scale,
                    EmbedScale::Constant(g.embedding_multiplier),
                    "{path}"
                );
                for l in &ir.layers {
                    let a = l.attention().expect("granite layers are attention");
                    assert_eq!(a.head_dim * a.n_heads, ir.hidden_size, "{path}");
                }
                assert_eq!(
                    ir.head.logit_scale,
                    LogitScale::DivideLogitsBy(g.logits_scaling),
                    "{path}"
                );
            }
            Family::Phi3 => {
                // phi3.py: one qkv_proj and one gate_up_proj per layer, and
                // their names (not the separate ones) in the contract.
                let names = module_paths(&ir);
                for l in &ir.layers {
                    let a = l.attention().expect("phi3 layers are attention");
                    assert_eq!(a.projection, QkvProjection::Fused, "{path}");
                    assert_eq!(
                        l.mlp().map(|m| m.projection),
                        Some(GateUpProjection::Fused),
                        "{path}"
                    );
                    assert_eq!(a.head_dim * a.n_heads, ir.hidden_size, "{path}");
                    let i = l.index;
                    for (module, present) in [
                        ("self_attn.qkv_proj", true),
                        ("self_attn.q_proj", false),
                        ("self_attn.k_proj", false),
                        ("self_attn.v_proj", false),
                        ("mlp.gate_up_proj", true),
                        ("mlp.gate_proj", false),
                        ("mlp.up_proj", false),
                    ] {
                        let name = format!("model.layers.{i}.{module}");
                        assert_eq!(names.contains(&name), present, "{path}: {name}");
                    }
                }
                assert!(
                    ir.checkpoint.sanitize.is_empty(),
                    "{path}: phi3.py has no sanitize"
                );
            }
            Family::Gemma2 => {
                let g = match &spec {
                    Spec::Gemma2(g) => g,
                    other => panic!("{path}: family gemma2 in a {other:?}"),
                };
                for l in &ir.layers {
                    let a = l.attention().unwrap();
                    assert_eq!(l.norms.arrangement, NormArrangement::Sandwich, "{path}");
                    assert_eq!(l.norms.weight, NormWeight::OnePlus, "{path}");
                    assert_eq!(a.window, Window::Full, "{path}");
                    assert_eq!(a.qk_norm, QkNorm::None, "{path}");
                    assert_eq!(a.value_norm, ValueNorm::None, "{path}");
                    assert_eq!(
                        a.scale,
                        AttentionScale::InvSqrtQueryPreAttnScalar(
                            g.attention.query_pre_attn_scalar
                        ),
                        "{path}"
                    );
                    assert_eq!(
                        a.scores,
                        Scores::Softcapped {
                            cap: g.attention.attn_logit_softcapping.unwrap() as f32
                        },
                        "{path}"
                    );
                    assert_eq!(
                        l.mlp().map(|m| m.activation),
                        Some(Activation::GeluApproxThenMultiply),
                        "{path}"
                    );
                    assert_eq!(l.scalar, LayerScalar::None, "{path}");
                }
                assert_eq!(ir.embedding.scale, EmbedScale::SqrtHidden, "{path}");
                assert_eq!(ir.head.weight, HeadWeight::TiedEmbedding, "{path}");
                assert_eq!(ir.head.norm, NormWeight::OnePlus, "{path}");
                assert_eq!(
                    ir.head.logit_softcap,
                    Some(Softcap {
                        cap: g.model.final_logit_softcapping.unwrap() as f32,
                        form: SoftcapForm::Eager
                    }),
                    "{path}"
                );
                assert!(ir.checkpoint.sanitize.is_empty(), "{path}");
            }
            Family::Gemma3Text => {
                let g = match &spec {
                    Spec::Gemma2(g) => g,
                    other => panic!("{path}: family gemma3_text in a {other:?}"),
                };
                let pattern = g.layers.sliding_window_pattern.expect("checked") as usize;
                let window = g.layers.sliding_window.expect("checked") as usize;
                for l in &ir.layers {
                    let a = l.attention().unwrap();
                    let full = l.index % pattern == pattern - 1;
                    let (want_window, want_rope) = match (full, &g.rope.scaling) {
                        (false, _) => (
                            Window::Sliding(window),
                            RopeKind::Default {
                                theta: g.rope.rope_local_base_freq.expect("checked") as f32,
                            },
                        ),
                        (true, None) => (
                            Window::Full,
                            RopeKind::Default {
                                theta: g.rope.rope_theta as f32,
                            },
                        ),
                        (true, Some(GemmaRopeScaling::Linear { factor })) => (
                            Window::Full,
                            RopeKind::Linear {
                                theta: g.rope.rope_theta as f32,
                                factor: *factor,
                            },
                        ),
                    };
                    assert_eq!(
                        (a.window, a.rope.kind),
                        (want_window, want_rope),
                        "{path} layer {}",
                        l.index
                    );
                    assert_eq!(a.scores, Scores::FusedSdpa, "{path}");
                    assert_eq!(l.norms.weight, NormWeight::OnePlus, "{path}");
                    assert_eq!(
                        l.mlp().map(|m| m.activation),
                        Some(Activation::GeluApproxThenMultiply),
                        "{path}"
                    );
                }
                // `mx.array(hidden_size**0.5, mx.bfloat16)`: sqrt(64) = 8 and
                // sqrt(1152) = 33.94... rounded to bfloat16's 34.0.
                let embed = match ir.hidden_size {
                    64 => 8.0,
                    1152 => 34.0,
                    // sqrt(2560) = 50.59... rounded to bfloat16's 50.5.
                    2560 => 50.5,
                    other => panic!("{path}: no pinned embedding scale for hidden {other}"),
                };
                assert_eq!(ir.embedding.scale, EmbedScale::Constant(embed), "{path}");
                assert_eq!(ir.head.weight, HeadWeight::TiedEmbedding, "{path}");
                assert_eq!(ir.head.norm, NormWeight::OnePlus, "{path}");
                assert_eq!(ir.head.logit_softcap, None, "{path}");
                // gemma3 (the multimodal wrapper) holds the text model under
                // language_model and drops the vision tower first.
                let (prefix, sanitize): (_, &[SanitizeRule]) = match g.identity.source.model_type {
                    ConfigModelType::Gemma3 => (
                        ModulePrefix::LanguageModel,
                        &[SanitizeRule::UnwrapMultimodal],
                    ),
                    _ => (ModulePrefix::Model, &[]),
                };

                assert_eq!(ir.checkpoint.prefix, prefix, "{path}");
                assert_eq!(ir.checkpoint.sanitize, sanitize, "{path}");
            }
            Family::Qwen3Moe => {
                assert_eq!(l.norms.arrangement, NormArrangement::PreNorm, "{path}");
                assert_eq!(a.scale, AttentionScale::InvSqrtHeadDim, "{path}");
                assert_eq!(a.qk_norm, QkNorm::RmsPerHead, "{path}");
                assert_eq!(ir.embedding.scale, EmbedScale::None, "{path}");
                assert!(
                    ir.layers.iter().any(|l| matches!(
                        l.ffn,
                        FeedForward::Moe(archgen_ir::Moe {
                            router: Router::SoftmaxTopK { .. },
                            activation: Activation::Silu,
                            ..
                        })
                    )),
                    "{path}"
                );
            }
            Family::GptOss => {
                let Spec::GptOss(s) = &spec else {
                    panic!("{path}: family gpt_oss in a {:?}", spec.family())
                };
                let types = &s.attention_layers.layer_types;
                assert_eq!(types.len(), ir.layers.len(), "{path}");
                for (l, kind) in ir.layers.iter().zip(types) {
                    let a = l.attention().expect("gpt_oss layers are attention");
                    assert_eq!(l.norms.arrangement, NormArrangement::PreNorm, "{path}");
                    assert_eq!(a.bias, ProjectionBias::QueryKeyValueOutput, "{path}");
                    assert_eq!(a.scores, Scores::FusedSdpaWithSinks, "{path}");
                    let d = f64::from(s.attention.head_dim);
                    assert_eq!(a.scale, AttentionScale::Constant(1.0 / d.sqrt()), "{path}");
                    let window = s.attention_layers.sliding_window as usize;
                    match kind {
                        GptOssLayerType::Sliding => assert_eq!(a.window, Window::Sliding(window)),
                        GptOssLayerType::Full => assert_eq!(a.window, Window::Full),
                    }
                    match (&s.rope.scaling, a.rope.kind) {
                        (None, RopeKind::Default { .. }) => {}
                        (Some(y), RopeKind::Yarn { factor, .. }) => assert_eq!(factor, y.factor),
                        (scaling, kind) => panic!("{path}: rope {kind:?} for {scaling:?}"),
                    }
                    let FeedForward::BiasedExperts(moe) = l.ffn else {
                        panic!("{path}: feed-forward {:?}", l.ffn)
                    };
                    assert_eq!(moe.router, Router::TopKPreciseSoftmax, "{path}");
                    assert_eq!(moe.activation, Activation::ClampedSwiglu, "{path}");
                    assert_eq!(moe.num_experts as u32, s.moe.num_local_experts, "{path}");
                    assert_eq!(moe.width as u32, s.mlp.intermediate_size, "{path}");
                }
                assert_eq!(ir.head.weight, HeadWeight::Untied, "{path}");
                assert!(ir.checkpoint.sanitize.is_empty(), "{path}");
                // The sinks and the router's and experts' biases are tensors of
                // their own, outside the quantizable modules.
                let names: Vec<String> = ir.vector_params().into_iter().map(|p| p.name).collect();
                assert!(names.contains(&"model.layers.0.self_attn.sinks".to_string()));
                assert!(names.contains(&"model.layers.0.self_attn.o_proj.bias".to_string()));
                assert!(names.contains(&"model.layers.0.mlp.router.bias".to_string()));
                let shaped: Vec<String> = ir.shaped_params().into_iter().map(|p| p.name).collect();
                assert!(shaped.contains(&"model.layers.0.mlp.experts.down_proj.bias".to_string()));
            }
            Family::Glm4Moe => {
                let Spec::Glm4Moe(s) = &spec else {
                    panic!("{path}: family glm4_moe in a {:?}", spec.family())
                };
                let o = &s.attention_options;
                let rotated = (s.attention.head_dim as f64 * s.rope.partial_rotary_factor) as usize;
                for l in &ir.layers {
                    let a = l.attention().expect("glm4_moe layers are attention");
                    assert_eq!(l.norms.arrangement, NormArrangement::PreNorm, "{path}");
                    assert_eq!(a.rope.rotated_dims, rotated, "{path}");
                    assert_eq!(a.bias == ProjectionBias::QueryKeyValue, o.attention_bias);
                    assert_eq!(a.qk_norm == QkNorm::RmsPerHead, o.use_qk_norm, "{path}");
                    let dense = (l.index as u32) < s.moe.first_k_dense_replace;
                    match l.ffn {
                        FeedForward::Mlp(m) => {
                            assert!(dense && m.width as u32 == s.mlp.intermediate_size)
                        }
                        FeedForward::MoeAndSharedExperts { moe, shared } => {
                            assert!(!dense, "{path} layer {}", l.index);
                            let Router::SigmoidGroupTopK(g) = moe.router else {
                                panic!("{path}: router {:?}", moe.router)
                            };
                            assert_eq!(g.n_group as u32, s.moe.n_group, "{path}");
                            assert_eq!(g.routed_scaling_factor, s.moe.routed_scaling_factor);
                            let width = s.moe.moe_intermediate_size * s.moe.n_shared_experts;
                            assert_eq!(shared.width as u32, width, "{path}");
                        }
                        other => panic!("{path}: feed-forward {other:?}"),
                    }
                }
                assert_eq!(ir.head.weight, HeadWeight::Untied, "{path}");
                assert_eq!(
                    ir.checkpoint.sanitize,
                    vec![SanitizeRule::StackExperts, SanitizeRule::DropLayerPastStack],
                    "{path}"
                );
            }
            Family::DeepseekV3 => unreachable!("{path}: latent attention is checked above"),
            Family::MiniCpm => {
                let m = match &spec {
                    Spec::MiniCpm(m) => m,
                    other => panic!("{path}: family minicpm in a {other:?}"),
                };
                assert_eq!(
                    ir.embedding.scale,
                    EmbedScale::Constant(m.scales.scale_emb),
                    "{path}"
                );
                let n = ir.layers.len();
                // scale_depth / num_hidden_layers**0.5, the Python float.
                let factor = m.scales.scale_depth / (n as f64).powf(0.5);
                for l in &ir.layers {
                    let a = l.attention().expect("minicpm layers are attention");
                    assert_eq!(a.head_dim * a.n_heads, ir.hidden_size, "{path}");
                    assert_eq!(l.residual.factor(), Some(factor), "{path}");
                }
                assert_eq!(ir.head.weight, HeadWeight::Untied, "{path}");
                assert_eq!(
                    ir.head.logit_scale,
                    LogitScale::DivideBy(
                        ir.hidden_size as f64 / f64::from(m.scales.dim_model_base)
                    ),
                    "{path}"
                );
                assert_eq!(
                    ir.checkpoint.sanitize,
                    vec![archgen_ir::SanitizeRule::CopyEmbeddingToHead],
                    "{path}"
                );
            }
            family @ (Family::Qwen35 | Family::Qwen3Next) => {
                let s = match &spec {
                    Spec::Qwen35(s) => s,
                    other => panic!("{path}: family {family:?} in a {other:?}"),
                };
                // qwen3_next: no multimodal wrapper, the projections grouped
                // per key head, sanitize only on a raw MoE checkpoint.
                let (prefix, in_proj, moves_conv) = match family {
                    Family::Qwen3Next => (
                        ModulePrefix::Model,
                        InProj::GroupedPerKeyHead,
                        s.moe.is_some(),
                    ),
                    _ => (ModulePrefix::LanguageModel, InProj::Split, true),
                };
                let interval = s.layers.full_attention_interval as usize;
                for l in &ir.layers {
                    assert_eq!(l.norms.arrangement, NormArrangement::PreNorm, "{path}");
                    match (&s.moe, l.ffn) {
                        (None, FeedForward::Mlp(m)) => {
                            assert_eq!(m.activation, Activation::Silu, "{path}")
                        }
                        (Some(e), FeedForward::MoeAndSharedExpert { moe, shared }) => {
                            assert_eq!(moe.num_experts as u32, e.num_experts, "{path}");
                            assert_eq!(moe.top_k as u32, e.num_experts_per_tok, "{path}");
                            assert_eq!(
                                shared.width as u32, e.shared_expert_intermediate_size,
                                "{path}"
                            );
                            assert!(matches!(moe.router, Router::SoftmaxTopK { .. }), "{path}");
                        }
                        (_, other) => panic!("{path}: feed-forward {other:?}"),
                    }
                    let full = (l.index + 1) % interval == 0;
                    match &l.mixer {
                        Mixer::Attention(a) => {
                            assert!(full, "{path} layer {}", l.index);
                            assert_eq!(a.output_gate, OutputGate::SigmoidPerHead, "{path}");
                            assert_eq!(a.qk_norm, QkNorm::RmsPerHead, "{path}");
                            assert_eq!(a.scale, AttentionScale::InvSqrtHeadDim, "{path}");
                            assert_eq!(
                                a.rope.rotated_dims,
                                (a.head_dim as f64 * s.rope.partial_rotary_factor) as usize,
                                "{path}"
                            );
                        }
                        Mixer::GatedDeltaNet(d) => {
                            assert!(!full, "{path} layer {}", l.index);
                            assert_eq!(d.k_heads as u32, s.linear_attention.linear_num_key_heads);
                            assert_eq!(d.v_heads as u32, s.linear_attention.linear_num_value_heads);
                            assert_eq!(d.cache, StateCache::ConvAndRecurrent, "{path}");
                            assert_eq!(d.in_proj, in_proj, "{path}");
                        }
                        Mixer::ShortConv(_) => panic!("{path}: a short-conv layer"),
                        Mixer::LatentAttention(_) => panic!("{path}: a latent attention layer"),
                    }
                }
                assert_eq!(ir.checkpoint.prefix, prefix, "{path}");
                assert_eq!(
                    ir.checkpoint.sanitize.contains(&SanitizeRule::MoveConvAxis),
                    moves_conv,
                    "{path}"
                );
                assert_eq!(
                    ir.checkpoint
                        .sanitize
                        .contains(&SanitizeRule::SplitSwitchMlpGateUp),
                    s.identity.source.model_type == ConfigModelType::Qwen35Moe,
                    "{path}"
                );
                // The conv weights are in the contract, with mlx's [C, K, 1].
                let convs = ir.shaped_params();
                let linear = ir.layers.iter().filter(|l| l.delta_net().is_some()).count();
                assert_eq!(convs.len(), linear, "{path}");
                assert!(convs.iter().all(|p| p.shape[2] == 1), "{path}");
            }
            Family::Lfm2 => {
                let c = |s: &Lfm2Spec| u64::from(s.layers.conv_l_cache);
                let s = match &spec {
                    Spec::Lfm2(s) => s,
                    other => panic!("{path}: family lfm2 in a {other:?}"),
                };
                let width = s.feed_forward.width() as usize;
                for l in &ir.layers {
                    let attention = s.layers.full_attn_idxs.contains(&(l.index as u32));
                    assert_eq!(l.norms.arrangement, NormArrangement::PreNorm, "{path}");
                    assert_eq!(l.mlp().map(|m| m.width), Some(width), "{path}");
                    match &l.mixer {
                        Mixer::Attention(a) => {
                            assert!(attention, "{path} layer {}", l.index);
                            assert_eq!(a.qk_norm, QkNorm::RmsPerHead, "{path}");
                            assert_eq!(a.scale, AttentionScale::InvSqrtHeadDim, "{path}");
                            assert!(!a.rope.traditional, "{path}");
                        }
                        Mixer::ShortConv(c) => {
                            assert!(!attention, "{path} layer {}", l.index);
                            assert_eq!(c.kernel as u32, s.layers.conv_l_cache, "{path}");
                        }
                        Mixer::GatedDeltaNet(_) => panic!("{path}: a Gated DeltaNet layer"),
                        Mixer::LatentAttention(_) => panic!("{path}: a latent attention layer"),
                    }
                }
                assert_eq!(ir.head.weight, HeadWeight::TiedEmbedding, "{path}");
                assert_eq!(
                    ir.checkpoint.sanitize,
                    [
                        SanitizeRule::TransposeShortConvWeight,
                        SanitizeRule::RenameLfm2Modules
                    ],
                    "{path}"
                );
                // The conv weights are in the contract, [hidden, K, 1].
                let convs = ir.shaped_params();
                assert_eq!(convs.len(), ir.layers.len() - s.layers.full_attn_idxs.len());
                assert!(
                    convs
                        .iter()
                        .all(|p| p.shape == [ir.hidden_size as u64, c(s), 1]),
                    "{path}"
                );
            }
        }
        // The residual and logit scales are MiniCPM's and Granite's alone, the
        // clipped residual Gemma 3's (checked in its arm); a constant
        // embedding scale theirs and Gemma 3's (checked in its arm).
        if !matches!(
            spec.family(),
            Family::MiniCpm | Family::Granite | Family::Gemma3Text
        ) {
            assert!(
                ir.layers.iter().all(|l| l.residual == Residual::Plain),
                "{path}"
            );
        }
        if !matches!(spec.family(), Family::MiniCpm | Family::Granite) {
            assert_eq!(ir.head.logit_scale, LogitScale::None, "{path}");
        }
        if !matches!(
            spec.family(),
            Family::MiniCpm | Family::Granite | Family::Gemma3Text
        ) {
            assert!(
                !matches!(ir.embedding.scale, EmbedScale::Constant(_)),
                "{path}"
            );
        }
    }
}

/// qwen3_moe: a layer is MoE unless it is in `mlp_only_layers` or off the
/// `decoder_sparse_step` (`Qwen3MoeDecoderLayer.__init__`); MoE layers have the
/// router `mlp.gate` and the stacked experts `mlp.switch_mlp.*`, and no dense MLP.
#[test]
fn qwen3_moe_layers_follow_mlp_only_layers_and_the_sparse_step() {
    let mut spec =
        load(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../specs/qwen3-30b-a3b-tiny.yaml"))
            .unwrap_or_else(|d| panic!("{d}"));
    let Spec::Qwen3Moe(s) = &mut spec else {
        panic!("qwen3-30b-a3b-tiny is not a qwen3_moe spec")
    };
    s.layers.num_hidden_layers = 6;
    s.moe.decoder_sparse_step = 2;
    s.moe.mlp_only_layers = vec![3];
    s.moe.norm_topk_prob = false;
    spec.validate().unwrap_or_else(|d| panic!("{d}"));
    let ir = spec.lower();
    let moe = layers_where(&ir, |f| matches!(f, FeedForward::Moe(_)));
    // (i + 1) % 2 == 0 → 1, 3, 5; 3 is MLP-only.
    assert_eq!(moe, vec![1, 5]);
    let names = module_paths(&ir);
    assert!(names.contains(&"model.layers.1.mlp.gate".to_string()));
    assert!(names.contains(&"model.layers.1.mlp.switch_mlp.down_proj".to_string()));
    assert!(!names.contains(&"model.layers.1.mlp.gate_proj".to_string()));
    assert!(names.contains(&"model.layers.3.mlp.gate_proj".to_string()));
    assert!(!names
        .iter()
        .any(|n| n.starts_with("model.layers.3.mlp.switch_mlp")));
    match ir.layers[1].ffn {
        FeedForward::Moe(m) => assert_eq!(
            m.router,
            Router::SoftmaxTopK {
                probs: TopKProbs::AsTaken
            }
        ),
        other => panic!("layer 1: {other:?}"),
    }
    // Parameter count: every module's weight and every norm, nothing twice.
    let (h, v) = (ir.hidden_size as u64, ir.vocab_size as u64);
    let modules: u64 = ir
        .quantizable_modules()
        .iter()
        .map(|m| m.in_dim * m.out_dim * m.count)
        .sum();
    let norms: u64 = ir.layers.len() as u64
        * (2 * h + 2 * ir.layers[0].attention().unwrap().head_dim as u64)
        + h;
    assert_eq!(ir.param_count(), modules + norms);
    assert!(modules > v * h);
}

/// glm4_moe: layers below `first_k_dense_replace` keep the dense MLP; the MoE
/// layers' router weight is a plain parameter of `MoEGate` (a shaped param,
/// not a module `nn.quantize` visits) beside the float32
/// `e_score_correction_bias`, and the shared experts are `mlp.shared_experts`.
#[test]
fn glm4_moe_router_is_a_plain_parameter_and_dense_layers_come_first() {
    let spec = load(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../specs/glm4-moe-grouped-tiny-q8.yaml"),
    )
    .unwrap_or_else(|d| panic!("{d}"));
    let ir = spec.lower();
    let dense = layers_where(&ir, |f| matches!(f, FeedForward::Mlp(_)));
    assert_eq!(dense, vec![0, 1]);
    let modules = module_paths(&ir);
    assert!(
        !modules.iter().any(|m| m.ends_with("mlp.gate")),
        "{modules:?}"
    );
    for m in [
        "switch_mlp.gate_proj",
        "shared_experts.gate_proj",
        "shared_experts.down_proj",
    ] {
        assert!(modules.contains(&format!("model.layers.2.mlp.{m}")), "{m}");
    }
    let shaped: Vec<(String, Vec<u64>)> = ir
        .shaped_params()
        .into_iter()
        .map(|p| (p.name, p.shape))
        .collect();
    assert_eq!(
        shaped,
        vec![
            ("model.layers.2.mlp.gate.weight".to_string(), vec![16, 64]),
            ("model.layers.3.mlp.gate.weight".to_string(), vec![16, 64]),
        ]
    );
    let bias = ir
        .vector_params()
        .into_iter()
        .find(|p| p.name == "model.layers.3.mlp.gate.e_score_correction_bias")
        .expect("the correction bias is in the contract");
    assert_eq!(bias.len, 16);
    // The shared experts' width is moe_intermediate_size * n_shared_experts.
    let Some(FeedForward::MoeAndSharedExperts { shared, .. }) = ir.layers.get(2).map(|l| l.ffn)
    else {
        panic!("layer 2 is not MoE")
    };
    assert_eq!(shared.width, 64);
}
