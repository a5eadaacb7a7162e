//! The monolith: one generic model per family that reads a resolved
//! [`Architecture`] at run time and branches on it per layer. It calls the
//! same runtime blocks as the generated models, so it is their reference.

mod dense;

pub use dense::DenseMonolith;

use archgen_runtime::attention::Mask;
use archgen_runtime::cache::{KvCache, LayerCache, QuantizedKvCache, RotatingKvCache};
use archgen_runtime::gemma4::{
    self, AttentionShape, AttentionWeights, Head, LayerNorms, Mlp, MoeBlock, PerLayerInputs,
    PleGate, SharedKv,
};
use archgen_runtime::layers::{Embedding, Linear};
use archgen_runtime::mlx_rs::error::Exception;
use archgen_runtime::model::{CausalLm, ModelError};
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

/// The monolith of a checkpoint's family.
pub enum Monolith {
    Gemma4(Gemma4Monolith),
    Dense(DenseMonolith),
}

impl Monolith {
    /// Builds the family's monolith from sanitized weights.
    pub fn new(arch: Architecture, w: Weights) -> std::result::Result<Self, ModelError> {
        if arch.family.is_dense() {
            DenseMonolith::new(arch, w).map(Monolith::Dense)
        } else {
            Gemma4Monolith::new(arch, w).map(Monolith::Gemma4)
        }
    }

    pub fn architecture(&self) -> &Architecture {
        match self {
            Monolith::Gemma4(m) => &m.arch,
            Monolith::Dense(m) => m.architecture(),
        }
    }
}

impl CausalLm for Monolith {
    type Cache = Vec<Option<LayerCache>>;

    fn vocab_size(&self) -> i32 {
        self.architecture().vocab_size as i32
    }

    fn make_cache(&self) -> Self::Cache {
        match self {
            Monolith::Gemma4(m) => m.make_cache(),
            Monolith::Dense(m) => m.make_cache(),
        }
    }

    fn forward(&self, ids: &Array, cache: &mut Self::Cache) -> Result<Array> {
        match self {
            Monolith::Gemma4(m) => m.forward(ids, cache),
            Monolith::Dense(m) => m.forward(ids, cache),
        }
    }
}

/// The Gemma-4 monolith.
pub struct Gemma4Monolith {
    arch: Architecture,
    embed: Embedding,
    ple: Option<PerLayerInputs>,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: Option<Linear>,
}

pub(crate) fn rope_for(f: &LayerFacts) -> Result<Rope> {
    match f.rope {
        RopeKind::Default { theta } => Ok(Rope::base(f.head_dim as i32, theta)),
        RopeKind::Proportional { theta, factor, .. } => {
            Rope::proportional(f.head_dim as i32, f.rotated_dims as i32, theta, factor)
        }
        RopeKind::Llama3 {
            theta,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => Rope::llama3(
            f.head_dim as i32,
            theta,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        ),
    }
}

fn shape_of(f: &LayerFacts, eps: f32) -> AttentionShape {
    AttentionShape {
        n_heads: f.n_heads as i32,
        n_kv_heads: f.n_kv_heads as i32,
        head_dim: f.head_dim as i32,
        eps,
    }
}

impl Gemma4Monolith {
    /// Builds the model from sanitized weights (names relative to the text
    /// model), checking every tensor's presence and shape.
    pub fn new(arch: Architecture, mut w: Weights) -> std::result::Result<Self, ModelError> {
        let hidden = arch.hidden_size as i32;
        let eps = arch.rms_norm_eps;
        let embed = w.embedding("embed_tokens", arch.vocab_size as i32, hidden);
        let ple = arch.per_layer_input.map(|p| {
            gemma4::load_per_layer_inputs(
                &mut w,
                arch.num_layers as i32,
                p.width as i32,
                p.vocab as i32,
                hidden,
            )
        });
        let mut layers = Vec::with_capacity(arch.num_layers);
        for f in &arch.layers {
            let i = f.index;
            let shape = shape_of(f, eps);
            let mut attn = gemma4::load_attention(&mut w, i, hidden, shape);
            attn.kv = f
                .has_kv
                .then(|| gemma4::load_kv(&mut w, i, hidden, shape, f.k_eq_v));
            layers.push(Layer {
                facts: f.clone(),
                norms: gemma4::load_norms(&mut w, i, hidden),
                attn,
                shape,
                rope: rope_for(f).map_err(|e| ModelError(e.to_string()))?,
                mlp: gemma4::load_mlp(&mut w, i, hidden, f.mlp_width as i32),
                moe: arch.moe.map(|m| {
                    gemma4::load_moe(
                        &mut w,
                        i,
                        hidden,
                        m.num_experts as i32,
                        m.top_k as i32,
                        m.width as i32,
                        eps,
                    )
                }),
                ple: arch
                    .per_layer_input
                    .map(|p| gemma4::load_ple_gate(&mut w, i, hidden, p.width as i32)),
                layer_scalar: gemma4::load_layer_scalar(&mut w, i),
            });
        }
        let norm = w.param("norm.weight", &[hidden]);
        let lm_head = (!arch.tie_word_embeddings)
            .then(|| w.linear("lm_head", arch.vocab_size as i32, hidden));
        w.finish().map_err(|e| ModelError(e.to_string()))?;
        Ok(Gemma4Monolith {
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

impl CausalLm for Gemma4Monolith {
    type Cache = Vec<Option<LayerCache>>;

    fn vocab_size(&self) -> i32 {
        self.arch.vocab_size as i32
    }

    /// mlx-lm's `make_cache`: a cache per layer that owns K/V.
    fn make_cache(&self) -> Self::Cache {
        self.arch
            .layers
            .iter()
            .map(|f| {
                f.has_kv.then(|| match (f.window, f.kv_quant) {
                    (Some(w), _) => LayerCache::Sliding(RotatingKvCache::new(w as i32, 0)),
                    // `KVCache.to_quantized`'s target (the spec allows it only
                    // on full layers no KV-shared layer reads).
                    (None, Some(q)) => LayerCache::Quantized(QuantizedKvCache::new(
                        q.group_size as i32,
                        q.bits as i32,
                    )),
                    (None, None) => LayerCache::Full(KvCache::default()),
                })
            })
            .collect()
    }

    fn forward(&self, ids: &Array, caches: &mut Self::Cache) -> Result<Array> {
        let arch = &self.arch;
        let eps = arch.rms_norm_eps;
        let hidden = arch.hidden_size as i32;
        let window = arch.sliding_window as i32;
        let h0 = gemma4::embed(&self.embed, ids, hidden)?;
        let per_layer = match &self.ple {
            Some(p) => Some(gemma4::per_layer_inputs(
                ids,
                &h0,
                &p.embed,
                &p.model_projection,
                &p.projection_norm,
                arch.num_layers as i32,
                arch.per_layer_input.map_or(0, |p| p.width as i32),
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
                let cache = c.as_ref().ok_or_else(|| {
                    Exception::custom(format!(
                        "layer {}: first layer of its type has no cache",
                        f.index
                    ))
                })?;
                *slot = Some(gemma4::mask_for(cache, n, window)?);
            }
        }
        let mut h = h0;
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
                        Exception::custom(format!(
                            "layer {i}: donor layer {} produced no K/V",
                            f.kv_source
                        ))
                    })?;
                    gemma4::attention_shared_kv(
                        &x,
                        &layer.attn,
                        layer.shape,
                        &layer.rope,
                        &kvs,
                        mask,
                    )?
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
    let (arch, weights) = read_dir(dir)?;
    Monolith::new(arch, weights).map_err(|e| ModelError(format!("{}: {e}", dir.display())))
}

/// A checkpoint directory's resolved architecture and its sanitized weights:
/// what the monolith and every generated model are built from.
pub fn read_dir(dir: &std::path::Path) -> std::result::Result<(Architecture, Weights), ModelError> {
    let ckpt = archgen_runtime::weights::read_checkpoint(dir).map_err(|e| ModelError(e.0))?;
    let arch = architecture_of(&ckpt.config, dir)?;
    let tensors = if arch.family.is_dense() {
        archgen_runtime::dense::sanitize(ckpt.tensors, arch.tie_word_embeddings)
    } else {
        let wrapper = arch.module_prefix.starts_with("language_model");
        gemma4::sanitize(ckpt.tensors, wrapper, arch.first_kv_shared_layer as i32)
            .map_err(|e| ModelError(format!("{}: {e}", dir.display())))?
    };
    let quant = quantization_of(&ckpt.config);
    Ok((arch, Weights::new(tensors, quant.as_ref())))
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
    // mlx-optiq's per-layer KV-cache quantization, when the directory has one.
    let kv_path = dir.join("kv_config.json");
    let kv_config: Option<serde_json::Value> = if kv_path.is_file() {
        let text = std::fs::read_to_string(&kv_path)
            .map_err(|e| ModelError(format!("{}: {e}", kv_path.display())))?;
        Some(
            serde_json::from_str(&text)
                .map_err(|e| ModelError(format!("{}: {e}", kv_path.display())))?,
        )
    } else {
        None
    };
    let (spec, _defaults) =
        archgen_spec::import::from_config_json(config, kv_config.as_ref(), &name).map_err(|e| {
            let kv = if kv_config.is_some() {
                " (+ kv_config.json)"
            } else {
                ""
            };
            ModelError(format!("{}/config.json{kv}: {e}", dir.display()))
        })?;
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
