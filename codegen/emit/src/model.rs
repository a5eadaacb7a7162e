//! The model file: constants baked from the plan, one struct per layer kind
//! with its load and forward, a typed cache, and the forward pass unrolled
//! over the layers with every branch resolved at generation time.

use archgen_plan::{KindKey, Plan};
use archgen_spec::ir::{FeedForward, KvSource, LayerInput, Values, Window};
use archgen_spec::{LayerFacts, LayerType, RopeKind};

/// The Gemma-4 emitter's view of a kind.
struct KindFacts {
    layer_type: LayerType,
    own_kv: bool,
    k_eq_v: bool,
    moe: bool,
    ple: bool,
}

fn kind_facts(key: &KindKey) -> KindFacts {
    let a = key.0.attention();
    KindFacts {
        layer_type: match a.window {
            Window::Sliding(_) => LayerType::Sliding,
            Window::Full => LayerType::Full,
        },
        own_kv: a.owns_kv(),
        k_eq_v: matches!(
            a.kv,
            KvSource::Own {
                values: Values::SameAsKeys,
                ..
            }
        ),
        moe: matches!(key.0.ffn, FeedForward::MlpAndMoe { .. }),
        ple: matches!(key.0.input, LayerInput::Gated { .. }),
    }
}
use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::quote;

pub(crate) fn ident(s: &str) -> Ident {
    Ident::new(s, Span::call_site())
}

pub(crate) fn lit_i32(v: usize) -> Result<Literal, String> {
    i32::try_from(v)
        .map(Literal::i32_unsuffixed)
        .map_err(|_| format!("{v} does not fit the i32 shapes MLX uses"))
}

pub(crate) fn lit_f32(v: f32) -> Literal {
    Literal::f32_suffixed(v)
}

pub(crate) fn layer_field(i: usize) -> Ident {
    ident(&format!("layer_{i}"))
}

fn shape_const(t: LayerType) -> Ident {
    ident(match t {
        LayerType::Sliding => "SLIDING",
        LayerType::Full => "FULL",
    })
}

fn rope_field(t: LayerType) -> Ident {
    ident(match t {
        LayerType::Sliding => "rope_sliding",
        LayerType::Full => "rope_full",
    })
}

fn tables_var(t: LayerType) -> Ident {
    ident(match t {
        LayerType::Sliding => "sliding_tables",
        LayerType::Full => "full_tables",
    })
}

fn mask_var(t: LayerType) -> Ident {
    ident(match t {
        LayerType::Sliding => "sliding_mask",
        LayerType::Full => "full_mask",
    })
}

fn type_words(t: LayerType) -> &'static str {
    match t {
        LayerType::Sliding => "sliding-window attention",
        LayerType::Full => "full attention",
    }
}

/// The struct and impl of one layer kind.
fn kind_tokens(kind_key: &KindKey, type_name: &str, layers: &[usize]) -> TokenStream {
    let key = &kind_facts(kind_key);
    let name = ident(type_name);
    let shape = shape_const(key.layer_type);
    let list = layers
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let doc = format!(
        " {} {list}: {}, {}{}{}{}.",
        if layers.len() == 1 { "Layer" } else { "Layers" },
        type_words(key.layer_type),
        if key.own_kv {
            "computes its own K/V"
        } else {
            "reads a donor's K/V"
        },
        if key.k_eq_v {
            " (V = K projection, no v_proj)"
        } else {
            ""
        },
        if key.moe {
            ", dense MLP + routed experts"
        } else {
            ", dense GeGLU MLP"
        },
        if key.ple {
            ", per-layer input gate"
        } else {
            ""
        },
    );
    let kv_field = key
        .own_kv
        .then(|| quote! { kv: g::KvWeights, qkv: Option<decode::FusedQkv>, });
    let moe_field = key.moe.then(|| quote! { moe: g::MoeBlock, });
    let ple_field = key.ple.then(|| quote! { ple: g::PleGate, });
    let k_eq_v = key.k_eq_v;
    let kv_load = key
        .own_kv
        .then(|| quote! { kv: g::load_kv(w, i, HIDDEN, #shape, #k_eq_v), qkv: None, });
    let moe_load = key
        .moe
        .then(|| quote! { moe: g::load_moe(w, i, HIDDEN, EXPERTS, TOP_K, MOE_WIDTH, EPS), });
    let ple_load = key
        .ple
        .then(|| quote! { ple: g::load_ple_gate(w, i, HIDDEN, PLE_WIDTH), });
    let ple_arg = key.ple.then(|| quote! { , pli: &Array });
    let kv_pre = key.own_kv.then(|| {
        quote! {
            layer.qkv = decode::FusedQkv::new(&mut layer.attn, &mut layer.kv, #shape);
            w.release(&format!("layers.{i}."));
            layer.kv.pretranspose();
        }
    });
    let moe_pre = key.moe.then(|| quote! { layer.moe.pretranspose(); });
    let ple_pre = key.ple.then(|| quote! { layer.ple.pretranspose(); });
    let ff = if key.moe {
        quote! { g::feed_forward_moe(&h, &self.norms, &self.mlp, &self.moe, EPS)? }
    } else {
        quote! { g::feed_forward_dense(&h, &self.norms, &self.mlp, EPS)? }
    };
    let ple_use = if key.ple {
        quote! { Some((&self.ple, pli)) }
    } else {
        quote! { None }
    };
    let moe_ref = if key.moe {
        quote! { Some(&self.moe) }
    } else {
        quote! { None }
    };
    let (kv_arg, attn, decode_step, ret_ty, ret) = if key.own_kv {
        (
            quote! { cache: &mut LayerCache },
            quote! {
                let (a, kv) = g::attention_own_kv(&x, &self.attn, &self.kv, #shape, rope, cache, mask)?;
            },
            quote! { decode::own_kv(h, &layer, &self.kv, self.qkv.as_ref(), tables, cache, mask) },
            quote! { (Array, g::SharedKv) },
            quote! { Ok((h, kv)) },
        )
    } else {
        (
            quote! { shared: &g::SharedKv },
            quote! {
                let a = g::attention_shared_kv(&x, &self.attn, #shape, rope, shared, mask)?;
            },
            quote! { decode::shared_kv(h, &layer, tables, shared, mask) },
            quote! { Array },
            quote! { Ok(h) },
        )
    };
    quote! {
        #[doc = #doc]
        struct #name {
            norms: g::LayerNorms,
            attn: g::AttentionWeights,
            #kv_field
            mlp: g::Mlp,
            #moe_field
            #ple_field
            layer_scalar: Array,
        }

        impl #name {
            fn load(w: &mut Weights, i: usize, mlp_width: i32) -> Self {
                let mut layer = Self {
                    norms: g::load_norms(w, i, HIDDEN),
                    attn: g::load_attention(w, i, HIDDEN, #shape),
                    #kv_load
                    mlp: g::load_mlp(w, i, HIDDEN, mlp_width),
                    #moe_load
                    #ple_load
                    layer_scalar: g::load_layer_scalar(w, i),
                };
                #kv_pre
                layer.attn.pretranspose();
                layer.mlp.pretranspose();
                #moe_pre
                #ple_pre
                layer
            }

            fn forward(&self, h: &Array, rope: &Rope, step: Option<&RopeTables>, mask: &Mask, #kv_arg #ple_arg) -> Result<#ret_ty> {
                if let Some(tables) = step {
                    // One token: the compiled blocks around attention.
                    let layer = decode::Layer {
                        norms: &self.norms,
                        attn: &self.attn,
                        mlp: &self.mlp,
                        moe: #moe_ref,
                        ple: #ple_use,
                        layer_scalar: &self.layer_scalar,
                        shape: #shape,
                        eps: EPS,
                    };
                    return #decode_step;
                }
                let x = rms_norm(h, Some(&self.norms.input), EPS)?;
                #attn
                let h = g::attention_residual(h, &a, &self.norms, EPS)?;
                let h = #ff;
                let h = g::finish_layer(&h, #ple_use, &self.layer_scalar, EPS)?;
                #ret
            }
        }
    }
}

fn rope_init(f: &LayerFacts) -> Result<TokenStream, String> {
    let hd = lit_i32(f.head_dim)?;
    Ok(match f.rope {
        RopeKind::Default { theta } => {
            let theta = lit_f32(theta);
            quote! { Rope::base(#hd, #theta) }
        }
        RopeKind::Proportional { theta, factor, .. } => {
            let (theta, factor) = (lit_f32(theta), lit_f32(factor));
            let rotated = lit_i32(f.rotated_dims)?;
            quote! { Rope::proportional(#hd, #rotated, #theta, #factor).map_err(|e| ModelError(e.to_string()))? }
        }
        RopeKind::Llama3 { .. } => {
            return Err("Llama-3 RoPE is a dense-family form; a Gemma-4 spec cannot have it".into())
        }
    })
}

/// The whole model module (without the file header), by family.
pub fn model_tokens(plan: &Plan) -> Result<TokenStream, String> {
    if plan.arch.family.is_dense() {
        crate::dense::model_tokens(plan)
    } else {
        gemma4_tokens(plan)
    }
}

fn gemma4_tokens(plan: &Plan) -> Result<TokenStream, String> {
    let a = &plan.arch;
    let name = &plan.name;
    let fingerprint = &plan.fingerprint;
    let spec_hash = &plan.spec_hash;
    let hidden = lit_i32(a.hidden_size)?;
    let vocab = lit_i32(a.vocab_size)?;
    let n_layers = lit_i32(a.num_layers)?;
    let window = lit_i32(a.sliding_window)?;
    let eps = lit_f32(a.rms_norm_eps);

    // Attention geometry per layer type (the same for every layer of a type).
    let mut shapes = Vec::new();
    let mut ropes_struct = Vec::new();
    let mut ropes_init = Vec::new();
    for t in [LayerType::Sliding, LayerType::Full] {
        let Some(f) = a.layers.iter().find(|f| f.layer_type == t) else {
            continue;
        };
        let c = shape_const(t);
        let (h, kv, hd) = (
            lit_i32(f.n_heads)?,
            lit_i32(f.n_kv_heads)?,
            lit_i32(f.head_dim)?,
        );
        let doc = format!(" Attention geometry of every {} layer.", type_words(t));
        shapes.push(quote! {
            #[doc = #doc]
            const #c: AttentionShape = AttentionShape { n_heads: #h, n_kv_heads: #kv, head_dim: #hd, eps: EPS };
        });
        let field = rope_field(t);
        ropes_struct.push(quote! { #field: Rope, });
        let init = rope_init(f)?;
        ropes_init.push(quote! { #field: #init, });
    }

    let mut extra_consts = Vec::new();
    if let Some(p) = a.per_layer_input {
        let (w, v) = (lit_i32(p.width)?, lit_i32(p.vocab)?);
        extra_consts.push(quote! {
            const PLE_WIDTH: i32 = #w;
            const PLE_VOCAB: i32 = #v;
        });
    }
    if let Some(m) = a.moe {
        let (e, k, w) = (
            lit_i32(m.num_experts)?,
            lit_i32(m.top_k)?,
            lit_i32(m.width)?,
        );
        extra_consts.push(quote! {
            const EXPERTS: i32 = #e;
            const TOP_K: i32 = #k;
            const MOE_WIDTH: i32 = #w;
        });
    }

    let kinds: Vec<TokenStream> = plan
        .kinds
        .iter()
        .map(|k| kind_tokens(&k.key, &k.name, &k.layers))
        .collect();

    // Model fields and loading.
    let mut fields = Vec::new();
    let mut loads = Vec::new();
    let mut cache_fields = Vec::new();
    let mut cache_inits = Vec::new();
    for f in &a.layers {
        let field = layer_field(f.index);
        let kind = ident(&plan.kinds[plan.layer_kind[f.index]].name);
        let (i, width) = (f.index, lit_i32(f.mlp_width)?);
        fields.push(quote! { #field: #kind, });
        loads.push(quote! { #field: #kind::load(&mut w, #i, #width), });
        if f.has_kv {
            cache_fields.push(quote! { #field: LayerCache, });
            cache_inits.push(match (f.layer_type, f.kv_quant) {
                (LayerType::Sliding, _) => {
                    quote! { #field: LayerCache::Sliding(RotatingKvCache::new(WINDOW, 0)), }
                }
                (LayerType::Full, None) => quote! { #field: LayerCache::Full(KvCache::default()), },
                (LayerType::Full, Some(q)) => {
                    let (group, bits) =
                        (lit_i32(q.group_size as usize)?, lit_i32(q.bits as usize)?);
                    quote! { #field: LayerCache::Quantized(QuantizedKvCache::new(#group, #bits)), }
                }
            });
        }
    }
    let ple_field = a
        .per_layer_input
        .map(|_| quote! { per_layer: g::PerLayerInputs, });
    let ple_load = a.per_layer_input.map(|_| {
        quote! { per_layer: g::load_per_layer_inputs(&mut w, LAYERS, PLE_WIDTH, PLE_VOCAB, HIDDEN), }
    });
    let head_field = (!a.tie_word_embeddings).then(|| quote! { lm_head: Linear, });
    let head_load =
        (!a.tie_word_embeddings).then(|| quote! { lm_head: w.linear("lm_head", VOCAB, HIDDEN), });
    let head_pre = if a.tie_word_embeddings {
        quote! { model.embed.pretranspose(); }
    } else {
        quote! { model.lm_head.pretranspose(); }
    };
    let ple_model_pre = a
        .per_layer_input
        .map(|_| quote! { model.per_layer.pretranspose(); });
    let head = if a.tie_word_embeddings {
        quote! { g::Head::Tied(&self.embed) }
    } else {
        quote! { g::Head::Untied(&self.lm_head) }
    };
    let softcap = match a.final_logit_softcapping {
        Some(c) => {
            let c = lit_f32(c);
            quote! { Some(#c) }
        }
        None => quote! { None },
    };

    // The forward pass, one statement per layer.
    let ple_inputs = a.per_layer_input.map(|_| {
        quote! {
            let per_layer = g::per_layer_inputs(
                ids, &h, &self.per_layer.embed, &self.per_layer.model_projection,
                &self.per_layer.projection_norm, LAYERS, PLE_WIDTH, HIDDEN, EPS,
            )?;
        }
    });
    let mut masks = Vec::new();
    let mut step_tables = Vec::new();
    let first_of = |full: bool| {
        plan.first_of_window
            .iter()
            .find(|(w, _)| matches!(w, Window::Full) == full)
            .map(|(_, l)| *l)
    };
    for (t, first) in [
        (LayerType::Sliding, first_of(false)),
        (LayerType::Full, first_of(true)),
    ] {
        if let Some(first) = first {
            let var = mask_var(t);
            let field = layer_field(first);
            masks.push(quote! { let #var = g::mask_for(&cache.#field, n, WINDOW)?; });
            let (tables, rope) = (tables_var(t), rope_field(t));
            step_tables.push(quote! {
                let #tables = if step { Some(self.#rope.tables(offset, n, h.dtype())?) } else { None };
            });
        }
    }
    let mut steps = Vec::new();
    for f in &a.layers {
        let field = layer_field(f.index);
        let rope = rope_field(f.layer_type);
        let mask = mask_var(f.layer_type);
        let tables = tables_var(f.layer_type);
        let li = lit_i32(f.index)?;
        let pli = a
            .per_layer_input
            .map(|_| quote! { , &g::per_layer_slice(&per_layer, #li)? });
        if f.has_kv {
            let kv = if plan.donors_read.contains(&f.index) {
                ident(&format!("kv_{}", f.index))
            } else {
                ident("_")
            };
            steps.push(quote! {
                let (h, #kv) = self.#field.forward(&h, &self.#rope, #tables.as_ref(), &#mask, &mut cache.#field #pli)?;
            });
        } else {
            let kv = ident(&format!("kv_{}", f.kv_source));
            steps.push(quote! {
                let h = self.#field.forward(&h, &self.#rope, #tables.as_ref(), &#mask, &#kv #pli)?;
            });
        }
    }

    let linear_import =
        (!a.tie_word_embeddings).then(|| quote! { use archgen_runtime::layers::Linear; });
    let quantized_kv = a
        .layers
        .iter()
        .any(|f| f.kv_quant.is_some())
        .then(|| quote! { use archgen_runtime::cache::QuantizedKvCache; });
    let doc_model = format!(
        " The `{name}` model: {} layers, hidden size {}.",
        a.num_layers, a.hidden_size
    );
    Ok(quote! {
        use archgen_runtime::attention::Mask;
        use archgen_runtime::cache::{KvCache, LayerCache, RotatingKvCache};
        #quantized_kv
        use archgen_runtime::decode;
        use archgen_runtime::gemma4::{self as g, AttentionShape};
        use archgen_runtime::layers::Embedding;
        #linear_import
        use archgen_runtime::model::{CausalLm, ModelError};
        use archgen_runtime::ops::{rms_norm, Result};
        use archgen_runtime::rope::{Rope, RopeTables};
        use archgen_runtime::weights::Weights;
        use archgen_runtime::Array;

        pub const NAME: &str = #name;
        pub const FINGERPRINT: &str = #fingerprint;
        pub const SPEC_SHA256: &str = #spec_hash;

        const HIDDEN: i32 = #hidden;
        const VOCAB: i32 = #vocab;
        #[allow(dead_code)]
        const LAYERS: i32 = #n_layers;
        const WINDOW: i32 = #window;
        const EPS: f32 = #eps;
        #(#extra_consts)*
        #(#shapes)*

        #(#kinds)*

        #[doc = #doc_model]
        pub struct Model {
            embed: Embedding,
            #ple_field
            #(#ropes_struct)*
            #(#fields)*
            norm: Array,
            #head_field
        }

        /// One cache per layer that computes its own K/V.
        pub struct Cache {
            #(#cache_fields)*
        }

        /// Loads the model from sanitized weights; every tensor is checked.
        pub fn load(mut w: Weights) -> std::result::Result<Model, ModelError> {
            let mut model = Model {
                embed: w.embedding("embed_tokens", VOCAB, HIDDEN),
                #ple_load
                #(#ropes_init)*
                #(#loads)*
                norm: w.param("norm.weight", &[HIDDEN]),
                #head_load
            };
            w.finish().map_err(|e| ModelError(e.to_string()))?;
            #head_pre
            #ple_model_pre
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
                let h = g::embed(&self.embed, ids, HIDDEN)?;
                #ple_inputs
                #(#masks)*
                // One token: this step's RoPE tables, one per RoPE form,
                // shared by all its layers (Q and K alike).
                let offset = cache.layer_0.offset();
                let step = n == 1 && decode::enabled();
                #(#step_tables)*
                let h = if step { h.reshape(&[-1, HIDDEN])? } else { h };
                #(#steps)*
                let logits = g::logits(&h, &self.norm, #head, #softcap, EPS)?;
                if step { logits.reshape(&[-1, 1, VOCAB]) } else { Ok(logits) }
            }
        }
    })
}
