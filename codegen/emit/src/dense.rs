//! The model file of a dense-family spec (Qwen3, Llama): constants baked from
//! the plan, one field and one cache per layer, and the forward pass unrolled
//! over the layers. Every layer has the same kind, so the runtime's
//! `dense::Layer` is the layer type.

use archgen_plan::Plan;
use archgen_spec::{Family, LayerFacts, RopeKind};
use proc_macro2::{Literal, TokenStream};
use quote::quote;

use crate::model::{layer_field, lit_f32, lit_i32};

fn rope_init(f: &LayerFacts) -> Result<TokenStream, String> {
    let hd = lit_i32(f.head_dim)?;
    Ok(match f.rope {
        RopeKind::Default { theta } => {
            let theta = lit_f32(theta);
            quote! { Rope::base(#hd, #theta) }
        }
        RopeKind::Llama3 {
            theta,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let theta = lit_f32(theta);
            let [factor, low, high, original] = [
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            ]
            .map(Literal::f64_suffixed);
            quote! {
                Rope::llama3(#hd, #theta, #factor, #low, #high, #original)
                    .map_err(|e| ModelError(e.to_string()))?
            }
        }
        RopeKind::Proportional { .. } => {
            return Err("proportional RoPE is a Gemma-4 form; a dense spec cannot have it".into())
        }
    })
}

/// The whole model module (without the file header).
pub fn model_tokens(plan: &Plan) -> Result<TokenStream, String> {
    let a = &plan.arch;
    let name = &plan.name;
    let fingerprint = &plan.fingerprint;
    let spec_hash = &plan.spec_hash;
    let first = a
        .layers
        .first()
        .ok_or_else(|| format!("{name}: a model without layers"))?;
    if a.layers.iter().any(|f| {
        (f.n_heads, f.n_kv_heads, f.head_dim, f.mlp_width, f.rope)
            != (
                first.n_heads,
                first.n_kv_heads,
                first.head_dim,
                first.mlp_width,
                first.rope,
            )
    }) {
        return Err(format!(
            "{name}: dense layers must all have one shape (the dense emitter bakes one)"
        ));
    }
    let hidden = lit_i32(a.hidden_size)?;
    let vocab = lit_i32(a.vocab_size)?;
    let n_layers = lit_i32(a.num_layers)?;
    let mlp_width = lit_i32(first.mlp_width)?;
    let eps = lit_f32(a.rms_norm_eps);
    let (h, kv, hd) = (
        lit_i32(first.n_heads)?,
        lit_i32(first.n_kv_heads)?,
        lit_i32(first.head_dim)?,
    );
    // `head_dim ** -0.5`, the Python float mlx-lm passes, as SDPA's f32.
    let scale = lit_f32((first.head_dim as f64).powf(-0.5) as f32);
    let qk_norm = a.qk_norm;
    let rope = rope_init(first)?;

    let mut fields = Vec::new();
    let mut loads = Vec::new();
    let mut cache_fields = Vec::new();
    let mut cache_inits = Vec::new();
    let mut steps = Vec::new();
    for f in &a.layers {
        let field = layer_field(f.index);
        let i = f.index;
        fields.push(quote! { #field: d::Layer, });
        loads.push(quote! { #field: load_layer(&mut w, #i), });
        cache_fields.push(quote! { #field: KvCache, });
        cache_inits.push(quote! { #field: KvCache::default(), });
        steps.push(quote! {
            let h = decode::dense_layer::<QK_NORM>(&h, &self.#field, SHAPE, &self.rope, tables.as_ref(), &mut cache.#field, &mask)?;
        });
    }
    let (head_field, head_load, head, linear_import, head_t) = if a.tie_word_embeddings {
        (
            None,
            None,
            quote! { d::Head::Tied(&self.embed) },
            None,
            quote! { model.embed.pretranspose(); },
        )
    } else {
        (
            Some(quote! { lm_head: Linear, }),
            Some(quote! { lm_head: w.linear("lm_head", VOCAB, HIDDEN), }),
            quote! { d::Head::Untied(&self.lm_head) },
            Some(quote! { use archgen_runtime::layers::Linear; }),
            quote! { model.lm_head.pretranspose(); },
        )
    };
    let family = match a.family {
        Family::Qwen3 => "Qwen3",
        Family::Llama => "Llama",
        Family::Gemma4 => return Err(format!("{name}: not a dense family")),
    };
    let doc_model = format!(
        " The `{name}` model ({family}): {} layers, hidden size {}.",
        a.num_layers, a.hidden_size
    );
    let doc_layer = if qk_norm {
        " Attention of every layer; queries and keys get a per-head RMSNorm."
    } else {
        " Attention of every layer."
    };
    Ok(quote! {
        use archgen_runtime::attention::Mask;
        use archgen_runtime::cache::KvCache;
        use archgen_runtime::decode;
        use archgen_runtime::dense::{self as d, Shape};
        use archgen_runtime::layers::Embedding;
        #linear_import
        use archgen_runtime::model::{CausalLm, ModelError};
        use archgen_runtime::ops::Result;
        use archgen_runtime::rope::Rope;
        use archgen_runtime::weights::Weights;
        use archgen_runtime::Array;

        pub const NAME: &str = #name;
        pub const FINGERPRINT: &str = #fingerprint;
        pub const SPEC_SHA256: &str = #spec_hash;

        const HIDDEN: i32 = #hidden;
        const VOCAB: i32 = #vocab;
        #[allow(dead_code)]
        const LAYERS: i32 = #n_layers;
        const MLP_WIDTH: i32 = #mlp_width;
        const EPS: f32 = #eps;
        const QK_NORM: bool = #qk_norm;
        #[doc = #doc_layer]
        const SHAPE: Shape = Shape { n_heads: #h, n_kv_heads: #kv, head_dim: #hd, eps: EPS, scale: #scale };

        #[doc = #doc_model]
        pub struct Model {
            embed: Embedding,
            rope: Rope,
            #(#fields)*
            norm: Array,
            #head_field
        }

        /// One KVCache per layer.
        pub struct Cache {
            #(#cache_fields)*
        }

        /// Layer `i`, its projections kept transposed for the decode path.
        fn load_layer(w: &mut Weights, i: usize) -> d::Layer {
            let mut layer = d::load_layer(w, i, HIDDEN, SHAPE, QK_NORM, MLP_WIDTH);
            layer.pretranspose();
            layer
        }

        /// Loads the model from sanitized weights; every tensor is checked.
        pub fn load(mut w: Weights) -> std::result::Result<Model, ModelError> {
            let mut model = Model {
                embed: w.embedding("embed_tokens", VOCAB, HIDDEN),
                rope: #rope,
                #(#loads)*
                norm: w.param("norm.weight", &[HIDDEN]),
                #head_load
            };
            w.finish().map_err(|e| ModelError(e.to_string()))?;
            #head_t
            Ok(model)
        }

        impl CausalLm for Model {
            type Cache = Cache;

            fn vocab_size(&self) -> i32 {
                VOCAB
            }

            fn make_cache(&self) -> Cache {
                Cache { #(#cache_inits)* }
            }

            fn forward(&self, ids: &Array, cache: &mut Cache) -> Result<Array> {
                let n = ids.shape()[1];
                let h = self.embed.lookup(ids)?;
                let mask: Mask = cache.layer_0.make_mask(n);
                // One-token steps take the compiled decode blocks (CPU only).
                let tables = if n == 1 && decode::enabled() {
                    Some(self.rope.tables(cache.layer_0.offset, n, h.dtype())?)
                } else {
                    None
                };
                let h = if tables.is_some() { h.reshape(&[-1, HIDDEN])? } else { h };
                #(#steps)*
                let logits = d::logits(&h, &self.norm, #head, None, EPS)?;
                if tables.is_some() { logits.reshape(&[-1, 1, VOCAB]) } else { Ok(logits) }
            }
        }
    })
}
