//! Every checked-in spec lowers to the block IR with the same facts as its
//! resolved architecture: per-layer geometry, K/V sources, RoPE, widths,
//! caches, quantizable modules, quantization and parameter count.

use archgen_spec::ir::*;
use archgen_spec::*;
use std::path::PathBuf;

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

#[test]
fn lowering_keeps_every_resolved_fact() {
    for (path, spec) in specs() {
        let arch = spec.resolve();
        let ir = spec.lower();
        assert_eq!(ir.name, arch.name, "{path}");
        assert_eq!(ir.layers.len(), arch.num_layers, "{path}");
        assert_eq!(ir.hidden_size, arch.hidden_size, "{path}");
        assert_eq!(ir.vocab_size, arch.vocab_size, "{path}");
        assert_eq!(ir.norm_eps, arch.rms_norm_eps, "{path}");
        assert_eq!(ir.module_prefix(), arch.module_prefix, "{path}");
        assert_eq!(ir.lm_head_path(), arch.lm_head_path, "{path}");
        assert_eq!(
            ir.head.logit_softcap, arch.final_logit_softcapping,
            "{path}"
        );
        assert_eq!(
            ir.head.weight == HeadWeight::TiedEmbedding,
            arch.tie_word_embeddings,
            "{path}"
        );
        for (l, f) in ir.layers.iter().zip(&arch.layers) {
            let a = l.attention();
            let at = format!("{path} layer {}", f.index);
            assert_eq!(l.index, f.index, "{at}");
            assert_eq!(
                (a.n_heads, a.n_kv_heads, a.head_dim),
                (f.n_heads, f.n_kv_heads, f.head_dim),
                "{at}"
            );
            assert_eq!(a.owns_kv(), f.has_kv, "{at}");
            assert_eq!(a.kv_layer(l.index), f.kv_source, "{at}");
            assert_eq!(a.rope.kind, f.rope, "{at}");
            assert_eq!(a.rope.traditional, f.rope_traditional, "{at}");
            assert_eq!(a.rope.rotated_dims, f.rotated_dims, "{at}");
            assert_eq!(l.mlp().width, f.mlp_width, "{at}");
            let window = match a.window {
                Window::Full => None,
                Window::Sliding(w) => Some(w),
            };
            assert_eq!(window, f.window, "{at}");
            match a.kv {
                KvSource::Own { values, cache } => {
                    assert_eq!(values == Values::SameAsKeys, f.k_eq_v, "{at}");
                    let q = match cache {
                        // The Architecture view has no mixed_kv (mlx-optiq, L2).
                        KvCache::Plain | KvCache::QuantizedAfterForward { .. } => None,
                        KvCache::Quantized(q) => Some(q),
                    };
                    assert_eq!(q, f.kv_quant, "{at}");
                }
                KvSource::Shared { .. } => assert_eq!(f.kv_quant, None, "{at}"),
            }
            assert_eq!(
                l.moe().map(|m| (m.num_experts, m.top_k, m.width)),
                arch.moe.map(|m| (m.num_experts, m.top_k, m.width)),
                "{at}"
            );
        }
        assert_eq!(
            ir.quantizable_modules(),
            arch.quantizable_modules(),
            "{path}"
        );
        assert_eq!(ir.param_count(), arch.param_count(), "{path}");
        for m in arch.quantizable_modules() {
            assert_eq!(ir.quant_for(&m.path), arch.quant_for(&m.path), "{path}");
        }
    }
}

#[test]
fn families_lower_to_their_blocks() {
    for (path, spec) in specs() {
        let ir = spec.lower();
        let l = &ir.layers[0];
        let a = l.attention();
        match spec.family() {
            Family::Gemma4 => {
                assert_eq!(l.norms.arrangement, NormArrangement::Sandwich, "{path}");
                assert_eq!(a.scale, AttentionScale::One, "{path}");
                assert_eq!(a.value_norm, ValueNorm::RmsScaleFree, "{path}");
                assert_eq!(l.mlp().activation, Activation::GeluApprox, "{path}");
                assert_eq!(ir.embedding.scale, EmbedScale::SqrtHidden, "{path}");
                assert_eq!(l.scalar, LayerScalar::Learned, "{path}");
            }
            Family::Qwen3 | Family::Llama => {
                assert_eq!(l.norms.arrangement, NormArrangement::PreNorm, "{path}");
                assert_eq!(a.scale, AttentionScale::InvSqrtHeadDim, "{path}");
                assert_eq!(a.value_norm, ValueNorm::None, "{path}");
                assert_eq!(l.mlp().activation, Activation::Silu, "{path}");
                assert_eq!(ir.embedding.scale, EmbedScale::None, "{path}");
                assert_eq!(l.scalar, LayerScalar::None, "{path}");
                let qk = if spec.family() == Family::Qwen3 {
                    QkNorm::RmsPerHead
                } else {
                    QkNorm::None
                };
                assert_eq!(a.qk_norm, qk, "{path}");
            }
        }
    }
}
