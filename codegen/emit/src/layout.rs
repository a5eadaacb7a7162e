//! The layers of a model as data plus a loop: `LAYOUT`, one row per layer
//! with its kind and the facts a kind leaves open (MLP width, a full
//! layer's K/V cache form, the donor a shared layer reads); `Layer`, one
//! variant per kind; and the loops of load, `make_cache`,
//! `make_batch_cache`, `forward` and `forward_batch` over them. A change
//! to one layer of a spec is a change to its row.

use archgen_ir::{KvCache, KvSource, Layer, LayerInput, Mixer, OutputGate, Window};
use archgen_plan::Plan;
use proc_macro2::{Literal, TokenStream};
use quote::quote;

use crate::tokens::{ident, lit_i32, rope_context};

/// What a kind keeps between steps.
#[derive(Clone, Copy)]
enum State {
    /// Its own K/V in a cache of this window.
    Kv(Window),
    /// None: it reads the K/V its donor computed this forward.
    Donor,
    /// A Gated DeltaNet's conv and recurrent state.
    Arrays,
}

/// One kind as the model-level loops see it.
struct KindFacts<'a> {
    name: proc_macro2::Ident,
    /// A layer of the kind (all agree on what is read here).
    layer: &'a Layer,
    state: State,
    /// Whether load takes the layer's MLP width.
    mlp_width: bool,
    /// Whether a row carries a K/V cache form (a full window in a model
    /// where some full layer's cache is quantized).
    cache_form: bool,
    /// Whether forward returns the K/V it computed beside the output.
    returns_kv: bool,
    /// Whether forward takes the layer's per-layer input.
    per_layer_input: bool,
}

/// The model-level pieces.
pub(crate) struct Layout {
    /// `Row`, `LAYOUT`, `Layer`, the row's methods and the cache helpers.
    pub items: TokenStream,
    /// `load`'s field initializer.
    pub load: TokenStream,
    /// `make_cache`'s body.
    pub make_cache: TokenStream,
    /// The `Cache` struct's fields.
    pub cache_fields: TokenStream,
    /// `forward`'s loop over the layers (after `h` is ready; leaves `h`).
    pub forward: TokenStream,
    /// `forward_batch`'s loop over the layers.
    pub forward_batch: TokenStream,
    /// `make_batch_cache`'s layers, when the model batches.
    pub batch_caches: TokenStream,
}

/// Whether any full-attention layer keeps a cache other than plain K/V;
/// then each full row names its cache form.
fn per_layer_cache_forms(plan: &Plan) -> bool {
    plan.ir
        .layers
        .iter()
        .any(|l| match l.attention().map(|a| (a.window, a.kv)) {
            Some((Window::Full, KvSource::Own { cache, .. })) => match cache {
                KvCache::Plain => false,
                KvCache::Quantized(_) | KvCache::QuantizedAfterForward { .. } => true,
            },
            Some((Window::Sliding(_), _) | (Window::Full, KvSource::Shared { .. })) | None => false,
        })
}

/// The position of layer `index`'s cache among the K/V caches (one per
/// layer that computes its own K/V, in layer order).
pub(crate) fn kv_ordinal(plan: &Plan, index: usize) -> usize {
    plan.ir.layers[..index]
        .iter()
        .filter(|l| l.attention().is_some_and(|a| a.owns_kv()))
        .count()
}

fn kind_facts(plan: &Plan, forms: bool) -> Result<Vec<KindFacts<'_>>, String> {
    plan.kinds
        .iter()
        .map(|k| {
            let first = *k
                .layers
                .first()
                .ok_or_else(|| format!("layer kind {}: no layers", k.name))?;
            let layer = &plan.ir.layers[first];
            let (state, returns_kv) = match &layer.mixer {
                Mixer::GatedDeltaNet(_) => (State::Arrays, false),
                Mixer::Attention(a) => match a.kv {
                    KvSource::Own { .. } => (
                        State::Kv(a.window),
                        match a.output_gate {
                            OutputGate::None => true,
                            // The gated block returns no K/V (nothing reads it).
                            OutputGate::SigmoidPerHead => false,
                        },
                    ),
                    KvSource::Shared { .. } => (State::Donor, false),
                },
            };
            let cache_form = forms && matches!(state, State::Kv(Window::Full));
            Ok(KindFacts {
                name: ident(&k.name),
                layer,
                state,
                mlp_width: layer.mlp().is_some(),
                cache_form,
                returns_kv,
                per_layer_input: match layer.input {
                    LayerInput::None => false,
                    LayerInput::Gated { .. } => true,
                },
            })
        })
        .collect()
}

/// A row of `LAYOUT`: `Kind(mlp_width, cache, donor)`, each where the
/// kind has it.
fn row_tokens(kind: &KindFacts, l: &Layer, widths: &[MlpWidth]) -> Result<TokenStream, String> {
    let name = &kind.name;
    let mut fields = Vec::new();
    if kind.mlp_width {
        let width = l
            .mlp()
            .and_then(|m| widths.iter().find(|w| w.width == m.width))
            .map(|w| &w.name)
            .ok_or_else(|| format!("layer {}: its kind has an MLP, it has none", l.index))?;
        fields.push(quote! { #width });
    }
    if kind.cache_form {
        let form = match l.attention().map(|a| a.kv) {
            Some(KvSource::Own { cache, .. }) => match cache {
                KvCache::Plain => quote! { KvForm::Plain },
                KvCache::Quantized(q) => {
                    let (g, b) = (lit_i32(q.group_size as usize)?, lit_i32(q.bits as usize)?);
                    quote! { KvForm::Quantized { group_size: #g, bits: #b } }
                }
                KvCache::QuantizedAfterForward { quant, start } => {
                    let (g, b, s) = (
                        lit_i32(quant.group_size as usize)?,
                        lit_i32(quant.bits as usize)?,
                        lit_i32(start)?,
                    );
                    quote! { KvForm::QuantizedAfterForward { group_size: #g, bits: #b, start: #s } }
                }
            },
            Some(KvSource::Shared { .. }) | None => {
                return Err(format!(
                    "layer {}: a cache form on a layer without K/V",
                    l.index
                ))
            }
        };
        fields.push(form);
    }
    match (kind.state, l.attention().map(|a| a.kv)) {
        (State::Donor, Some(KvSource::Shared { donor })) => {
            let donor = Literal::usize_unsuffixed(donor);
            fields.push(quote! { #donor });
        }
        (State::Donor, _) => {
            return Err(format!("layer {}: a shared kind without a donor", l.index))
        }
        (State::Kv(_) | State::Arrays, _) => {}
    }
    Ok(if fields.is_empty() {
        quote! { Row::#name }
    } else {
        quote! { Row::#name(#(#fields),*) }
    })
}

/// A distinct dense MLP width of the model and the constant naming it, so
/// that a change of `intermediate_size` is a change of one line.
struct MlpWidth {
    width: usize,
    name: proc_macro2::Ident,
}

/// `MLP_WIDTH`, then `MLP_WIDTH_2`, ... in order of first use.
fn mlp_widths(plan: &Plan) -> Vec<MlpWidth> {
    let mut out: Vec<MlpWidth> = Vec::new();
    for m in plan.ir.layers.iter().filter_map(Layer::mlp) {
        if !out.iter().any(|w| w.width == m.width) {
            let name = match out.len() {
                0 => ident("MLP_WIDTH"),
                n => ident(&format!("MLP_WIDTH_{}", n + 1)),
            };
            out.push(MlpWidth {
                width: m.width,
                name,
            });
        }
    }
    out
}

pub(crate) fn layout_tokens(plan: &Plan) -> Result<Layout, String> {
    let ir = &plan.ir;
    let forms = per_layer_cache_forms(plan);
    let kinds = kind_facts(plan, forms)?;
    let any_donor = kinds.iter().any(|k| matches!(k.state, State::Donor));
    let any_arrays = kinds.iter().any(|k| matches!(k.state, State::Arrays));
    let any_ple = kinds.iter().any(|k| k.per_layer_input);
    // Every layer takes its per-layer input: one slice per layer before its
    // kind is matched (else each kind that takes one slices it).
    let every_ple = kinds.iter().all(|k| k.per_layer_input);

    let widths = mlp_widths(plan);
    let width_consts = widths
        .iter()
        .map(|w| {
            let (name, width) = (&w.name, lit_i32(w.width)?);
            Ok(quote! {
                /// The width of a dense MLP (`intermediate_size`).
                const #name: i32 = #width;
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let rows = ir
        .layers
        .iter()
        .map(|l| row_tokens(&kinds[plan.layer_kind[l.index]], l, &widths))
        .collect::<Result<Vec<_>, _>>()?;
    let n = Literal::usize_unsuffixed(ir.layers.len());

    let mut variants = Vec::new();
    let mut layer_variants = Vec::new();
    let mut loads = Vec::new();
    let mut kv_caches = Vec::new();
    let mut states = Vec::new();
    let mut batch_caches = Vec::new();
    let mut steps = Vec::new();
    let mut batch_steps = Vec::new();
    for k in &kinds {
        let name = &k.name;
        // The row's fields in order: (type, what it is, binding in load,
        // binding in kv_cache).
        let mut fields: Vec<(TokenStream, &str, TokenStream, TokenStream)> = Vec::new();
        let mut args = Vec::new();
        if k.mlp_width {
            fields.push((
                quote! { i32 },
                "MLP width",
                quote! { mlp_width },
                quote! { _ },
            ));
            args.push(quote! { , mlp_width });
        }
        if k.cache_form {
            fields.push((
                quote! { KvForm },
                "K/V cache",
                quote! { _ },
                quote! { cache },
            ));
        }
        if let State::Donor = k.state {
            fields.push((
                quote! { usize },
                "the layer whose K/V it reads",
                quote! { donor },
                quote! { _ },
            ));
            args.push(quote! { , donor });
        }
        // The kind's row whatever its fields.
        let any_row = if fields.is_empty() {
            quote! { Row::#name }
        } else {
            quote! { Row::#name(..) }
        };
        let types = fields.iter().map(|f| &f.0);
        let what = fields.iter().map(|f| f.1).collect::<Vec<_>>().join(", ");
        let load_binds = fields.iter().map(|f| &f.2);
        variants.push(if fields.is_empty() {
            quote! { #name, }
        } else {
            let doc = format!(" ({what})");
            quote! { #[doc = #doc] #name(#(#types),*), }
        });
        layer_variants.push(quote! { #name(#name), });
        loads.push(if fields.is_empty() {
            quote! { Row::#name => Layer::#name(#name::load(w, i #(#args)*)), }
        } else {
            quote! { Row::#name(#(#load_binds),*) => Layer::#name(#name::load(w, i #(#args)*)), }
        });
        let ctx = k.layer.attention().map(|a| ident(&rope_context(ir, a)));
        let pli = match (k.per_layer_input, every_ple) {
            (true, true) => Some(quote! { , &per_layer_input }),
            (true, false) => Some(quote! { , &b::per_layer_slice(&per_layer, i as i32)? }),
            (false, _) => None,
        };
        match k.state {
            State::Kv(window) => {
                let cache = match (window, k.cache_form) {
                    (Window::Sliding(w), _) => {
                        let w = lit_i32(w)?;
                        quote! { LayerCache::Sliding(RotatingKvCache::new(#w, 0)) }
                    }
                    (Window::Full, true) => quote! { cache.make() },
                    (Window::Full, false) => quote! { LayerCache::Full(KvCache::default()) },
                };
                let pattern = if k.cache_form {
                    let binds = fields.iter().map(|f| &f.3);
                    quote! { Row::#name(#(#binds),*) }
                } else {
                    quote! { #any_row }
                };
                kv_caches.push(quote! { #pattern => Some(#cache), });
                states.push(quote! { #any_row => None, });
                batch_caches.push(match window {
                    Window::Sliding(w) => {
                        let w = lit_i32(w)?;
                        quote! { #any_row => Some(BatchLayerCache::Sliding(BatchRotatingKvCache::new(#w, no_padding))), }
                    }
                    // A row with a cache form makes the batched cache of
                    // its form (`KvForm::make_batch`).
                    Window::Full if k.cache_form => {
                        quote! { #pattern => Some(cache.make_batch(no_padding)), }
                    }
                    Window::Full => {
                        quote! { #any_row => Some(BatchLayerCache::Full(BatchKvCache::new(no_padding))), }
                    }
                });
                let call = quote! { l.forward(&h, &#ctx, next_cache(&mut kv_caches)? #pli)? };
                let batch_call = quote! { l.forward_batch(&h, &#ctx, cache.layer_mut(i)? #pli)? };
                let (step, batch_step) = match (k.returns_kv, any_donor) {
                    (true, true) => (
                        quote! { { let (h, kv) = #call; (h, Some(kv)) } },
                        quote! { { let (h, kv) = #batch_call; (h, Some(kv)) } },
                    ),
                    (true, false) => (quote! { #call.0 }, quote! { #batch_call.0 }),
                    (false, true) => (quote! { (#call, None) }, quote! { (#batch_call, None) }),
                    (false, false) => (call, batch_call),
                };
                steps.push(quote! { Layer::#name(l) => #step, });
                batch_steps.push(quote! { Layer::#name(l) => #batch_step, });
            }
            State::Donor => {
                kv_caches.push(quote! { #any_row => None, });
                states.push(quote! { #any_row => None, });
                batch_caches.push(quote! { #any_row => None, });
                // A layer reading a donor's K/V attends as in one sequence,
                // batched or not (the donor's K/V carry the rows' offsets).
                steps.push(quote! {
                    Layer::#name(l) => (l.forward(&h, &#ctx, donor_kv(&computed, l.donor)? #pli)?, None),
                });
                batch_steps.push(quote! {
                    Layer::#name(l) => (l.forward_batch(&h, &#ctx, donor_kv(&computed, l.donor)? #pli)?, None),
                });
            }
            State::Arrays => {
                kv_caches.push(quote! { #any_row => None, });
                states.push(quote! { #any_row => Some(deltanet::ArraysCache::default()), });
                batch_caches.push(quote! {
                    #any_row => Some(BatchLayerCache::Arrays(BatchArraysCache::merged_empty(no_padding.len()))),
                });
                // No window, no mask (`create_ssm_mask` is None for one
                // unpadded sequence).
                let call = quote! { l.forward(&h, next_cache(&mut states)?)? };
                let batch_call =
                    quote! { l.forward_batch(&h, cache.arrays_mut(i)?, ssm_mask.as_ref())? };
                let (step, batch_step) = if any_donor {
                    (quote! { (#call, None) }, quote! { (#batch_call, None) })
                } else {
                    (call, batch_call)
                };
                steps.push(quote! { Layer::#name(l) => #step, });
                batch_steps.push(quote! { Layer::#name(l) => #batch_step, });
            }
        }
    }

    let kv_form = forms.then(|| {
        let used = |pick: fn(&KvCache) -> bool| {
            ir.layers.iter().any(|l| match l.attention().map(|a| (a.window, a.kv)) {
                Some((Window::Full, KvSource::Own { cache, .. })) => pick(&cache),
                Some(_) | None => false,
            })
        };
        let plain = used(|c| matches!(c, KvCache::Plain));
        let quantized = used(|c| matches!(c, KvCache::Quantized(_)));
        let mixed = used(|c| matches!(c, KvCache::QuantizedAfterForward { .. }));
        let variants = [
            plain.then(|| quote! { Plain, }),
            quantized.then(|| quote! { Quantized { group_size: i32, bits: i32 }, }),
            mixed.then(|| quote! { QuantizedAfterForward { group_size: i32, bits: i32, start: i32 }, }),
        ]
        .into_iter()
        .flatten();
        let arms = [
            plain.then(|| quote! { KvForm::Plain => LayerCache::Full(KvCache::default()), }),
            quantized.then(|| quote! {
                KvForm::Quantized { group_size, bits } => LayerCache::Quantized(QuantizedKvCache::new(group_size, bits)),
            }),
            mixed.then(|| quote! {
                KvForm::QuantizedAfterForward { group_size, bits, start } => {
                    LayerCache::QuantizedAfterForward(MixedKvCache::new(group_size, bits, start))
                }
            }),
        ]
        .into_iter()
        .flatten();
        let batch_arms = [
            plain.then(|| quote! { KvForm::Plain => BatchLayerCache::Full(BatchKvCache::new(no_padding)), }),
            quantized.then(|| quote! {
                KvForm::Quantized { group_size, bits } => BatchLayerCache::Quantized(
                    BatchQuantizedKvCache::new(KvQuantization { group_size, bits }, no_padding),
                ),
            }),
            mixed.then(|| quote! {
                KvForm::QuantizedAfterForward { group_size, bits, start } => {
                    BatchLayerCache::QuantizedAfterForward(BatchMixedKvCache::new(
                        KvQuantization { group_size, bits },
                        start,
                        no_padding,
                    ))
                }
            }),
        ]
        .into_iter()
        .flatten();
        let make_batch = quote! {
            /// The batched cache of this form for fresh sequences.
            fn make_batch(self, no_padding: &[i32]) -> BatchLayerCache {
                match self {
                    #(#batch_arms)*
                }
            }
        };
        quote! {
            /// The K/V cache of a full-attention layer: mlx-lm's `KVCache`,
            /// or a quantized one.
            #[derive(Clone, Copy)]
            enum KvForm {
                #(#variants)*
            }

            impl KvForm {
                fn make(self) -> LayerCache {
                    match self {
                        #(#arms)*
                    }
                }

                #make_batch
            }
        }
    });

    let states_fn = any_arrays.then(|| {
        quote! {
            /// The layer's conv and recurrent state, for a Gated DeltaNet layer.
            fn state(self) -> Option<deltanet::ArraysCache> {
                match self {
                    #(#states)*
                }
            }
        }
    });
    let batch_cache_fn = quote! {
        /// The layer's merged cache for a batch of fresh sequences
        /// (`BatchGenerator`), none for a layer reading a donor's K/V.
        fn batch_cache(self, no_padding: &[i32]) -> Option<BatchLayerCache> {
            match self {
                #(#batch_caches)*
            }
        }
    };
    let donor_fn = any_donor.then(|| {
        quote! {
            /// The K/V layer `donor` computed in this forward, for a later
            /// layer that reads it (`shared_kv`).
            fn donor_kv(computed: &[Option<b::SharedKv>], donor: usize) -> Result<&b::SharedKv> {
                computed.get(donor).and_then(Option::as_ref).ok_or_else(|| {
                    archgen_runtime::mlx_rs::error::Exception::custom(format!(
                        "{NAME}: layer {donor} computed no K/V to share"
                    ))
                })
            }
        }
    });
    let doc_row = " A layer's kind and the facts its kind leaves open (each variant names them).";
    // The variants are the kinds' names, which share a suffix when every
    // kind has the same trait (`...Ple`): clippy's naming lint is allowed.
    let items = quote! {
        #[doc = #doc_row]
        #[derive(Clone, Copy)]
        #[allow(clippy::enum_variant_names)]
        enum Row {
            #(#variants)*
        }

        #kv_form

        #(#width_consts)*

        /// Every layer in order: layer `i` is row `i`.
        const LAYOUT: [Row; #n] = [
            #(#rows),*
        ];

        /// One loaded layer, by kind.
        #[allow(clippy::enum_variant_names)]
        enum Layer {
            #(#layer_variants)*
        }

        impl Row {
            /// Loads layer `i`, whose row this is.
            fn load(self, w: &mut Weights, i: usize) -> Layer {
                match self {
                    #(#loads)*
                }
            }

            /// The layer's K/V cache for one sequence (`make_prompt_cache`),
            /// for a layer that computes its own K/V.
            fn kv_cache(self) -> Option<LayerCache> {
                match self {
                    #(#kv_caches)*
                }
            }

            #states_fn

            #batch_cache_fn
        }

        /// Cache `k` of those `make_cache` made.
        fn kv_at(caches: &[LayerCache], k: usize) -> Result<&LayerCache> {
            caches.get(k).ok_or_else(missing_cache)
        }

        /// The next layer's cache, in the order `make_cache` made them.
        fn next_cache<'a, T>(caches: &mut std::slice::IterMut<'a, T>) -> Result<&'a mut T> {
            caches.next().ok_or_else(missing_cache)
        }

        /// A cache that does not match the model (not one `make_cache` made).
        fn missing_cache() -> archgen_runtime::mlx_rs::error::Exception {
            archgen_runtime::mlx_rs::error::Exception::custom(format!(
                "{NAME}: the cache holds fewer layers than the model"
            ))
        }

        #donor_fn
    };

    let load = quote! {
        layers: LAYOUT.iter().enumerate().map(|(i, row)| row.load(&mut w, i)).collect(),
    };
    let states_field = any_arrays.then(|| {
        quote! {
            /// One per Gated DeltaNet layer, in layer order.
            states: Vec<deltanet::ArraysCache>,
        }
    });
    let cache_fields = quote! {
        /// One per layer that computes its own K/V, in layer order.
        kv: Vec<LayerCache>,
        #states_field
    };
    let states_init = any_arrays
        .then(|| quote! { states: LAYOUT.iter().filter_map(|row| row.state()).collect(), });
    let make_cache = quote! {
        Cache {
            kv: LAYOUT.iter().filter_map(|row| row.kv_cache()).collect(),
            #states_init
        }
    };
    let states_iter = any_arrays.then(|| quote! { let mut states = cache.states.iter_mut(); });
    let each = if any_ple {
        quote! { for (i, layer) in self.layers.iter().enumerate() }
    } else {
        quote! { for layer in &self.layers }
    };
    let slice = every_ple.then(|| {
        quote! { let per_layer_input = b::per_layer_slice(&per_layer, i as i32)?; }
    });
    let layers_loop = layer_loop(any_donor, &each, &slice, &steps);
    let forward = quote! {
        let mut kv_caches = cache.kv.iter_mut();
        #states_iter
        #layers_loop
    };
    let forward_batch = layer_loop(
        any_donor,
        &quote! { for (i, layer) in self.layers.iter().enumerate() },
        &slice,
        &batch_steps,
    );
    Ok(Layout {
        items,
        load,
        make_cache,
        cache_fields,
        forward,
        forward_batch,
        batch_caches: quote! { LAYOUT.iter().map(|row| row.batch_cache(&no_padding)).collect() },
    })
}

/// The loop over the layers of a forward (batched or not): `each` its
/// header, `slice` what each iteration takes first, `steps` the match arms
/// that run one layer. With donor layers each layer also yields the K/V it
/// computed, kept in `computed` for the later layers that read it.
fn layer_loop(
    any_donor: bool,
    each: &TokenStream,
    slice: &Option<TokenStream>,
    steps: &[TokenStream],
) -> TokenStream {
    if any_donor {
        quote! {
            let mut computed: Vec<Option<b::SharedKv>> = Vec::with_capacity(LAYOUT.len());
            #each {
                #slice
                let (out, kv) = match layer {
                    #(#steps)*
                };
                h = out;
                computed.push(kv);
            }
        }
    } else {
        quote! {
            #each {
                #slice
                h = match layer {
                    #(#steps)*
                };
            }
        }
    }
}
