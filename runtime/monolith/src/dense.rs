//! The dense-family monolith (Qwen3, Llama): branches at run time on q/k
//! norms, the RoPE form and the head.

use archgen_runtime::attention::Mask;
use archgen_runtime::cache::{KvCache, LayerCache};
use archgen_runtime::dense::{self, Layer, Outer, Shape};
use archgen_runtime::mlx_rs::error::Exception;
use archgen_runtime::model::{CausalLm, ModelError};
use archgen_runtime::ops::Result;
use archgen_runtime::rope::Rope;
use archgen_runtime::weights::Weights;
use archgen_runtime::Array;
use archgen_spec::Architecture;

pub struct DenseMonolith {
    arch: Architecture,
    outer: Outer,
    layers: Vec<(Layer, Shape, Rope)>,
}

impl DenseMonolith {
    /// Builds the model from sanitized weights, checking every tensor.
    pub fn new(arch: Architecture, mut w: Weights) -> std::result::Result<Self, ModelError> {
        let hidden = arch.hidden_size as i32;
        let outer = dense::load_outer(
            &mut w,
            arch.vocab_size as i32,
            hidden,
            arch.tie_word_embeddings,
        );
        let mut layers = Vec::with_capacity(arch.num_layers);
        for f in &arch.layers {
            let shape = Shape::new(
                f.n_heads as i32,
                f.n_kv_heads as i32,
                f.head_dim as i32,
                arch.rms_norm_eps,
            );
            let layer = dense::load_layer(
                &mut w,
                f.index,
                hidden,
                shape,
                arch.qk_norm,
                f.mlp_width as i32,
            );
            let rope = crate::rope_for(f).map_err(|e| ModelError(e.to_string()))?;
            layers.push((layer, shape, rope));
        }
        w.finish().map_err(|e| ModelError(e.to_string()))?;
        Ok(DenseMonolith {
            arch,
            outer,
            layers,
        })
    }

    pub fn architecture(&self) -> &Architecture {
        &self.arch
    }
}

impl CausalLm for DenseMonolith {
    type Cache = Vec<Option<LayerCache>>;

    fn vocab_size(&self) -> i32 {
        self.arch.vocab_size as i32
    }

    /// A `KVCache` per layer.
    fn make_cache(&self) -> Self::Cache {
        self.layers
            .iter()
            .map(|_| Some(LayerCache::Full(KvCache::default())))
            .collect()
    }

    fn forward(&self, ids: &Array, caches: &mut Self::Cache) -> Result<Array> {
        let n = ids.shape()[1];
        let mut h = self.outer.embed.lookup(ids)?;
        // `create_attention_mask(h, cache[0])`, before any update.
        let mut mask: Option<Mask> = None;
        for (i, ((layer, shape, rope), slot)) in
            self.layers.iter().zip(caches.iter_mut()).enumerate()
        {
            let Some(LayerCache::Full(cache)) = slot else {
                return Err(Exception::custom(format!(
                    "layer {i}: a dense model needs a KVCache per layer"
                )));
            };
            let m = mask.get_or_insert_with(|| cache.make_mask(n));
            h = if self.arch.qk_norm {
                dense::layer::<true>(&h, layer, *shape, rope, cache, m)?
            } else {
                dense::layer::<false>(&h, layer, *shape, rope, cache, m)?
            };
        }
        dense::logits(
            &h,
            &self.outer.norm,
            self.outer.head(),
            None,
            self.arch.rms_norm_eps,
        )
    }
}
