//! The monolith: one generic Gemma-4 model that reads a resolved
//! [`Architecture`] at run time and branches on it per layer. It calls the
//! same runtime blocks as the generated models, so it is their reference.

use archgen_runtime::attention::Mask;
use archgen_runtime::cache::{KvCache, LayerCache, RotatingKvCache};
use archgen_runtime::gemma4::{
    self, AttentionShape, AttentionWeights, Head, KvWeights, LayerNorms, Mlp, MoeBlock, PleGate,
    SharedKv,
};
use archgen_runtime::layers::{Embedding, Linear};
use archgen_runtime::model::{CausalLm, ModelError};
use archgen_runtime::moe::{Router, SwitchGlu};
use archgen_runtime::ops::Result;
use archgen_runtime::rope::Rope;
use archgen_runtime::weights::Weights;
use archgen_runtime::Array;
use archgen_spec::{Architecture, LayerFacts, LayerType, RopeKind};

struct Layer {
    facts: LayerFacts,
    norms: LayerNorms,
    attn: AttentionWeights,
    shape: AttentionShape,
    rope: Rope,
    mlp: Mlp,
    moe: Option<MoeBlock>,
    ple: Option<PleGate>,
    layer_scalar: Array,
}

struct PerLayerInputs {
    embed: Embedding,
    model_projection: Linear,
    projection_norm: Array,
    width: i32,
}

pub struct Monolith {
    arch: Architecture,
    embed: Embedding,
    ple: Option<PerLayerInputs>,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: Option<Linear>,
}

fn rope_for(f: &LayerFacts) -> Result<Rope> {
    match f.rope {
        RopeKind::Default { theta } => Ok(Rope::base(f.head_dim as i32, theta)),
        RopeKind::Proportional { theta, factor, .. } => {
            Rope::proportional(f.head_dim as i32, f.rotated_dims as i32, theta, factor)
        }
    }
}

impl Monolith {
    /// Builds the model from sanitized weights (names relative to the text
    /// model), checking every tensor's presence and shape.
    pub fn new(arch: Architecture, mut w: Weights) -> std::result::Result<Self, ModelError> {
        let hidden = arch.hidden_size as i32;
        let n_layers = arch.num_layers as i32;
        let eps = arch.rms_norm_eps;
        let embed = w.embedding("embed_tokens", arch.vocab_size as i32, hidden);
        let ple = arch.per_layer_input.map(|p| PerLayerInputs {
            embed: w.embedding(
                "embed_tokens_per_layer",
                p.vocab as i32,
                n_layers * p.width as i32,
            ),
            model_projection: w.linear(
                "per_layer_model_projection",
                n_layers * p.width as i32,
                hidden,
            ),
            projection_norm: w.param("per_layer_projection_norm.weight", &[p.width as i32]),
            width: p.width as i32,
        });
        let mut layers = Vec::with_capacity(arch.num_layers);
        for f in &arch.layers {
            let p = format!("layers.{}", f.index);
            let (hd, h, kv) = (f.head_dim as i32, f.n_heads as i32, f.n_kv_heads as i32);
            let norm = |w: &mut Weights, n: &str| w.param(&format!("{p}.{n}.weight"), &[hidden]);
            let norms = LayerNorms {
                input: norm(&mut w, "input_layernorm"),
                post_attention: norm(&mut w, "post_attention_layernorm"),
                pre_feedforward: norm(&mut w, "pre_feedforward_layernorm"),
                post_feedforward: norm(&mut w, "post_feedforward_layernorm"),
            };
            let kv_weights = f.has_kv.then(|| KvWeights {
                k_proj: w.linear(&format!("{p}.self_attn.k_proj"), kv * hd, hidden),
                v_proj: (!f.k_eq_v)
                    .then(|| w.linear(&format!("{p}.self_attn.v_proj"), kv * hd, hidden)),
                k_norm: w.param(&format!("{p}.self_attn.k_norm.weight"), &[hd]),
            });
            let attn = AttentionWeights {
                q_proj: w.linear(&format!("{p}.self_attn.q_proj"), h * hd, hidden),
                o_proj: w.linear(&format!("{p}.self_attn.o_proj"), hidden, h * hd),
                q_norm: w.param(&format!("{p}.self_attn.q_norm.weight"), &[hd]),
                kv: kv_weights,
            };
            let width = f.mlp_width as i32;
            let mlp = Mlp {
                gate_proj: w.linear(&format!("{p}.mlp.gate_proj"), width, hidden),
                up_proj: w.linear(&format!("{p}.mlp.up_proj"), width, hidden),
                down_proj: w.linear(&format!("{p}.mlp.down_proj"), hidden, width),
            };
            let moe = arch.moe.map(|m| {
                let (e, mw) = (m.num_experts as i32, m.width as i32);
                let sw = format!("{p}.experts.switch_glu");
                MoeBlock {
                    router: Router {
                        proj: w.linear(&format!("{p}.router.proj"), e, hidden),
                        scale: w.param(&format!("{p}.router.scale"), &[hidden]),
                        per_expert_scale: w.param(&format!("{p}.router.per_expert_scale"), &[e]),
                        top_k: m.top_k as i32,
                        hidden,
                        eps,
                    },
                    experts: SwitchGlu {
                        gate_proj: w.switch_linear(&format!("{sw}.gate_proj"), e, mw, hidden),
                        up_proj: w.switch_linear(&format!("{sw}.up_proj"), e, mw, hidden),
                        down_proj: w.switch_linear(&format!("{sw}.down_proj"), e, hidden, mw),
                    },
                    pre_feedforward_2: norm(&mut w, "pre_feedforward_layernorm_2"),
                    post_feedforward_1: norm(&mut w, "post_feedforward_layernorm_1"),
                    post_feedforward_2: norm(&mut w, "post_feedforward_layernorm_2"),
                }
            });
            let ple_gate = arch.per_layer_input.map(|pl| PleGate {
                gate: w.linear(
                    &format!("{p}.per_layer_input_gate"),
                    pl.width as i32,
                    hidden,
                ),
                projection: w.linear(
                    &format!("{p}.per_layer_projection"),
                    hidden,
                    pl.width as i32,
                ),
                post_norm: norm(&mut w, "post_per_layer_input_norm"),
            });
            layers.push(Layer {
                facts: f.clone(),
                norms,
                attn,
                shape: AttentionShape {
                    n_heads: h,
                    n_kv_heads: kv,
                    head_dim: hd,
                    eps,
                },
                rope: rope_for(f).map_err(|e| ModelError(e.to_string()))?,
                mlp,
                moe,
                ple: ple_gate,
                layer_scalar: w.param(&format!("{p}.layer_scalar"), &[1]),
            });
        }
        let norm = w.param("norm.weight", &[hidden]);
        let lm_head = (!arch.tie_word_embeddings)
            .then(|| w.linear("lm_head", arch.vocab_size as i32, hidden));
        w.finish().map_err(|e| ModelError(e.to_string()))?;
        Ok(Monolith {
            arch,
            embed,
            ple,
            layers,
            norm,
            lm_head,
        })
    }

    pub fn architecture(&self) -> &Architecture {
        &self.arch
    }
}

impl CausalLm for Monolith {
    fn vocab_size(&self) -> i32 {
        self.arch.vocab_size as i32
    }

    /// mlx-lm's `make_cache`: a cache per layer that owns K/V.
    fn make_cache(&self) -> Vec<Option<LayerCache>> {
        self.arch
            .layers
            .iter()
            .map(|f| {
                f.has_kv.then(|| match f.window {
                    Some(w) => LayerCache::Sliding(RotatingKvCache::new(w as i32, 0)),
                    None => LayerCache::Full(KvCache::default()),
                })
            })
            .collect()
    }

    fn forward(&self, ids: &Array, caches: &mut [Option<LayerCache>]) -> Result<Array> {
        let arch = &self.arch;
        let eps = arch.rms_norm_eps;
        let hidden = arch.hidden_size as i32;
        let mut h = gemma4::embed(&self.embed, ids, hidden)?;
        let per_layer = match &self.ple {
            Some(p) => Some(gemma4::per_layer_inputs(
                ids,
                &h,
                &p.embed,
                &p.model_projection,
                &p.projection_norm,
                arch.num_layers as i32,
                p.width,
                hidden,
                eps,
            )?),
            None => None,
        };
        // One mask per layer type, from the cache of the first layer of that
        // type, before any cache update (`_make_masks`).
        let n = ids.shape()[1];
        let mut full_mask = None;
        let mut sliding_mask = None;
        for (f, c) in arch.layers.iter().zip(caches.iter()) {
            let slot = match f.layer_type {
                LayerType::Full => &mut full_mask,
                LayerType::Sliding => &mut sliding_mask,
            };
            if slot.is_none() {
                *slot = Some(match c {
                    Some(LayerCache::Full(c)) => c.make_mask(n),
                    Some(LayerCache::Sliding(c)) => c.make_mask(n, arch.sliding_window as i32)?,
                    None => {
                        return Err(archgen_runtime::mlx_rs::error::Exception::custom(
                            "first layer of a type has no cache",
                        ))
                    }
                });
            }
        }
        let mut shared: Vec<Option<SharedKv>> = vec![None; self.layers.len()];
        for (i, layer) in self.layers.iter().enumerate() {
            let f = &layer.facts;
            let mask: &Mask = match f.layer_type {
                LayerType::Full => full_mask.as_ref().unwrap(),
                LayerType::Sliding => sliding_mask.as_ref().unwrap(),
            };
            let x = archgen_runtime::ops::rms_norm(&h, Some(&layer.norms.input), eps)?;
            let a = match (&layer.attn.kv, caches[i].as_mut()) {
                (Some(kv), Some(cache)) => {
                    let (a, kvs) = gemma4::attention_own_kv(
                        &x,
                        &layer.attn,
                        kv,
                        layer.shape,
                        &layer.rope,
                        cache,
                        mask,
                    )?;
                    shared[i] = Some(kvs);
                    a
                }
                _ => {
                    let kvs = shared[f.kv_source].clone().ok_or_else(|| {
                        archgen_runtime::mlx_rs::error::Exception::custom(format!(
                            "layer {i}: donor layer {} produced no K/V",
                            f.kv_source
                        ))
                    })?;
                    let a = gemma4::attention_shared_kv(
                        &x,
                        &layer.attn,
                        layer.shape,
                        &layer.rope,
                        &kvs,
                        mask,
                    )?;
                    shared[i] = Some(kvs);
                    a
                }
            };
            let h1 = gemma4::attention_residual(&h, &a, &layer.norms, eps)?;
            let h2 = gemma4::feed_forward(&h1, &layer.norms, &layer.mlp, layer.moe.as_ref(), eps)?;
            let pli = match (&layer.ple, &per_layer) {
                (Some(g), Some(all)) => Some((g, gemma4::per_layer_slice(all, i as i32)?)),
                _ => None,
            };
            h = gemma4::finish_layer(
                &h2,
                pli.as_ref().map(|(g, x)| (*g, x)),
                &layer.layer_scalar,
                eps,
            )?;
        }
        let head = match &self.lm_head {
            Some(l) => Head::Untied(l),
            None => Head::Tied(&self.embed),
        };
        gemma4::logits(&h, &self.norm, head, arch.final_logit_softcapping, eps)
    }
}

/// Loads an mlx-community style checkpoint directory into the monolith: its
/// config.json goes through the spec importer (mlx-lm's defaults, listed), the
/// weights through mlx-lm's sanitize rules.
pub fn load_dir(dir: &std::path::Path) -> std::result::Result<Monolith, ModelError> {
    let ckpt = archgen_runtime::weights::read_checkpoint(dir).map_err(|e| ModelError(e.0))?;
    let arch = architecture_of(&ckpt.config, dir)?;
    let wrapper = arch.module_prefix.starts_with("language_model");
    let tensors = gemma4::sanitize(ckpt.tensors, wrapper, arch.first_kv_shared_layer as i32)
        .map_err(|e| ModelError(format!("{}: {e}", dir.display())))?;
    let quant = quantization_of(&ckpt.config);
    Monolith::new(arch, Weights::new(tensors, quant.as_ref()))
        .map_err(|e| ModelError(format!("{}: {e}", dir.display())))
}

/// The resolved architecture of a config.json, through the spec importer.
pub fn architecture_of(
    config: &serde_json::Value,
    dir: &std::path::Path,
) -> std::result::Result<Architecture, ModelError> {
    // The spec name must be a valid file stem starting with a letter; a
    // directory name need not be one.
    let stem: String = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(90)
        .collect();
    let name = format!("checkpoint-{stem}");
    let (spec, _defaults) = archgen_spec::import::from_config_json(config, None, &name)
        .map_err(|e| ModelError(format!("{}/config.json: {e}", dir.display())))?;
    Ok(spec.resolve())
}

/// config.json's `quantization` (or `quantization_config`, also inside
/// `text_config`), with module paths made relative to the text model like the
/// sanitized tensor names.
fn quantization_of(config: &serde_json::Value) -> Option<serde_json::Value> {
    let q = config
        .get("quantization")
        .or_else(|| config.get("quantization_config"))
        .or_else(|| {
            config
                .get("text_config")
                .and_then(|t| t.get("quantization_config"))
        })?;
    let obj = q.as_object()?;
    let mut out = serde_json::Map::new();
    for (k, v) in obj {
        let k = ["language_model.model.", "language_model.", "model."]
            .iter()
            .find_map(|p| k.strip_prefix(p))
            .unwrap_or(k);
        out.insert(k.to_string(), v.clone());
    }
    Some(serde_json::Value::Object(out))
}
