//! The layers of a model as data plus a loop: `LAYOUT`, one row per layer
//! with its kind and the facts a kind leaves open (MLP width, a full
//! layer's K/V cache form, the donor a shared layer reads); `Layer`, one
//! variant per kind; and the loops of load, `make_cache`,
//! `make_batch_cache`, `forward` and `forward_batch` over them. A change
//! to one layer of a spec is a change to its row. Layers that repeat a run
//! of rows (five sliding layers then a full one) list the run once,
//! `PATTERN`, in place of `LAYOUT`. A model whose layers are
//! all alike (one kind, one MLP width, a plain K/V cache) has neither: its
//! loops run the kind's struct over `0..LAYERS`.

use archgen_ir::{KvCache, KvSource, Layer, LayerInput, Mixer, OutputGate, Window};
use archgen_plan::Plan;
use proc_macro2::{Literal, TokenStream};
use quote::quote;

use crate::tokens::{ident, lit_i32, rope_context, window_name};

/// What a kind keeps between steps.
#[derive(Clone, Copy)]
enum State {
    /// Its own K/V in a cache of this window.
    Kv(Window),
    /// None: it reads the K/V its donor computed this forward.
    Donor,
    /// A Gated DeltaNet's conv and recurrent state.
    Arrays,
    /// A latent attention's latent and RoPE key in a plain full K/V cache
    /// (its own RoPE and mask, no window context).
    Latent,
}

/// One kind as the model-level loops see it.
struct KindFacts<'a> {
    /// The kind's struct.
    name: proc_macro2::Ident,
    /// Its variant of `Row` and `Layer` (`variant_names`).
    variant: proc_macro2::Ident,
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
    /// The type of a loaded layer: `Layer`, or the one kind's struct.
    pub layer_type: TokenStream,
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

/// The words of a camel-case name (`FullOwnKv`: `Full`, `Own`, `Kv`).
fn camel_words(name: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let mut start = 0;
    for (i, c) in name.char_indices().skip(1) {
        if c.is_ascii_uppercase() {
            words.push(&name[start..i]);
            start = i;
        }
    }
    words.push(&name[start..]);
    words
}

/// The variants of `Row` and `Layer`: each kind's name less the words at
/// its start and end that every kind's name has (`SlidingOwnKvPle` and
/// `FullOwnKvPle` are `Sliding` and `Full`), so that a variant says what
/// sets its kind apart and no two read alike (clippy's
/// `enum_variant_names`). Where that would leave a name empty (one kind's
/// name is all shared words), or with a single kind, the kinds' names.
fn variant_names(kinds: &[&str]) -> Vec<String> {
    let words: Vec<Vec<&str>> = kinds.iter().map(|k| camel_words(k)).collect();
    let shortest = words.iter().map(Vec::len).min().unwrap_or(0);
    let shared = |at: &dyn Fn(&Vec<&str>, usize) -> String| {
        (0..shortest)
            .take_while(|&i| words.iter().all(|w| at(w, i) == at(&words[0], i)))
            .count()
    };
    let prefix = shared(&|w, i| w[i].to_string());
    let suffix = shared(&|w, i| w[w.len() - 1 - i].to_string());
    if kinds.len() < 2 || prefix + suffix >= shortest {
        return kinds.iter().map(|k| k.to_string()).collect();
    }
    words
        .iter()
        .map(|w| w[prefix..w.len() - suffix].concat())
        .collect()
}

fn kind_facts(plan: &Plan, forms: bool) -> Result<Vec<KindFacts<'_>>, String> {
    let variants = variant_names(
        &plan
            .kinds
            .iter()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>(),
    );
    plan.kinds
        .iter()
        .zip(variants)
        .map(|(k, variant)| {
            let first = *k
                .layers
                .first()
                .ok_or_else(|| format!("layer kind {}: no layers", k.name))?;
            let layer = &plan.ir.layers[first];
            let (state, returns_kv) = match &layer.mixer {
                Mixer::GatedDeltaNet(_) | Mixer::ShortConv(_) => (State::Arrays, false),
                Mixer::LatentAttention(_) => (State::Latent, false),
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
                variant: ident(&variant),
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
fn row_tokens(
    kind: &KindFacts,
    l: &Layer,
    widths: &[MlpWidth],
    donors: &[Donor],
) -> Result<TokenStream, String> {
    let name = &kind.variant;
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
            let name = donors
                .iter()
                .find(|d| d.layer == donor)
                .map(|d| &d.name)
                .ok_or_else(|| format!("layer {}: donor layer {donor} is not named", l.index))?;
            fields.push(quote! { #name });
        }
        (State::Donor, _) => {
            return Err(format!("layer {}: a shared kind without a donor", l.index))
        }
        (State::Kv(_) | State::Arrays | State::Latent, _) => {}
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

/// A layer whose K/V later layers read, and the constant naming it.
struct Donor {
    layer: usize,
    /// `<WINDOW>_DONOR` (then `_2`, ... for a window's further donors).
    name: proc_macro2::Ident,
    /// The window the donor and its readers attend in.
    window: Window,
}

/// The model's donors, in order of first use.
fn donors(plan: &Plan) -> Result<Vec<Donor>, String> {
    let ir = &plan.ir;
    let mut out: Vec<Donor> = Vec::new();
    for a in ir.layers.iter().filter_map(Layer::attention) {
        let donor = match a.kv {
            KvSource::Shared { donor } => donor,
            KvSource::Own { .. } => continue,
        };
        if out.iter().any(|d| d.layer == donor) {
            continue;
        }
        let window = ir
            .layers
            .get(donor)
            .and_then(Layer::attention)
            .map(|d| d.window)
            .ok_or_else(|| format!("donor layer {donor}: not an attention layer"))?;
        let base = format!("{}_DONOR", window_name(ir, window).to_uppercase());
        let name = match out.iter().filter(|d| d.window == window).count() {
            0 => ident(&base),
            n => ident(&format!("{base}_{}", n + 1)),
        };
        out.push(Donor {
            layer: donor,
            name,
            window,
        });
    }
    Ok(out)
}

/// A constant per donor, with its doc.
fn donor_consts(donors: &[Donor]) -> TokenStream {
    let consts = donors.iter().map(|d| {
        let (name, layer) = (&d.name, Literal::usize_unsuffixed(d.layer));
        let window = match d.window {
            Window::Full => "full-attention".to_string(),
            Window::Sliding(n) => format!("sliding-window ({n})"),
        };
        let doc = format!(
            " Layer {}: the {window} layers that share K/V read the K/V it computes (`shared_kv`).",
            d.layer
        );
        quote! {
            #[doc = #doc]
            const #name: usize = #layer;
        }
    });
    quote! { #(#consts)* }
}

/// What the model-level loops ask of the model as a whole.
#[derive(Clone, Copy)]
struct ModelFacts {
    /// Some layer reads the K/V a donor computed this forward.
    any_donor: bool,
    /// Some layer is a Gated DeltaNet (it keeps conv and recurrent state).
    any_arrays: bool,
    /// Some layer is a short conv, whose struct is far smaller than an
    /// attention kind's: every kind is boxed in `Layer`.
    any_short_conv: bool,
    /// Some layer takes its per-layer input.
    any_ple: bool,
    /// Every layer takes its per-layer input: one slice per layer before its
    /// kind is matched (else each kind that takes one slices it).
    every_ple: bool,
}

impl ModelFacts {
    fn of(kinds: &[KindFacts]) -> Self {
        ModelFacts {
            any_donor: kinds.iter().any(|k| matches!(k.state, State::Donor)),
            any_arrays: kinds.iter().any(|k| matches!(k.state, State::Arrays)),
            any_short_conv: kinds
                .iter()
                .any(|k| matches!(k.layer.mixer, Mixer::ShortConv(_))),
            any_ple: kinds.iter().any(|k| k.per_layer_input),
            every_ple: kinds.iter().all(|k| k.per_layer_input),
        }
    }
}

/// A field of a kind's `Row` variant.
struct RowField {
    ty: TokenStream,
    /// What it is, for the variant's doc.
    what: &'static str,
    /// Its binding in `Row::load`.
    load_bind: TokenStream,
    /// Its binding in `Row::kv_cache` (and `Row::batch_cache`).
    cache_bind: TokenStream,
    /// The argument `load` passes on to the kind's own `load`.
    load_arg: Option<TokenStream>,
}

/// Who reads a row field: the kind's own `load`, or the cache makers.
enum ReadBy {
    Load,
    Caches,
}

impl RowField {
    /// The field `name`, bound where `read_by` reads it and `_` elsewhere.
    fn new(ty: TokenStream, what: &'static str, name: &str, read_by: ReadBy) -> Self {
        let name = ident(name);
        let (load_bind, cache_bind, load_arg) = match read_by {
            ReadBy::Load => (quote! { #name }, quote! { _ }, Some(quote! { , #name })),
            ReadBy::Caches => (quote! { _ }, quote! { #name }, None),
        };
        RowField {
            ty,
            what,
            load_bind,
            cache_bind,
            load_arg,
        }
    }
}

/// The fields a kind's row carries, in order.
fn row_fields(k: &KindFacts) -> Vec<RowField> {
    let donor = match k.state {
        State::Donor => true,
        State::Kv(_) | State::Arrays | State::Latent => false,
    };
    [
        (
            k.mlp_width,
            quote! { i32 },
            "MLP width",
            "mlp_width",
            ReadBy::Load,
        ),
        (
            k.cache_form,
            quote! { KvForm },
            "K/V cache",
            "cache",
            ReadBy::Caches,
        ),
        (
            donor,
            quote! { usize },
            "the layer whose K/V it reads",
            "donor",
            ReadBy::Load,
        ),
    ]
    .into_iter()
    .filter(|(carried, ..)| *carried)
    .map(|(_, ty, what, name, read_by)| RowField::new(ty, what, name, read_by))
    .collect()
}

/// One kind's arm in each generated match over rows or layers.
struct KindArms {
    /// Its variant of `Row`.
    row_variant: TokenStream,
    /// Its variant of `Layer`.
    layer_variant: TokenStream,
    /// Its arm of `Row::load`.
    load: TokenStream,
    /// Its arms of the cache makers and of the forward loops.
    state: StateArms,
}

/// A kind's arms that depend on what it keeps between steps.
struct StateArms {
    /// `Row::kv_cache`.
    kv_cache: TokenStream,
    /// `Row::state`.
    state: TokenStream,
    /// `Row::batch_cache`.
    batch_cache: TokenStream,
    /// `forward`'s match over the layer.
    step: TokenStream,
    /// `forward_batch`'s match over the layer.
    batch_step: TokenStream,
}

/// What a kind's state arms share: its names and the arguments every call
/// of its forward passes.
struct KindCall<'a> {
    /// The kind's variant of `Row` and `Layer`.
    variant: &'a proc_macro2::Ident,
    /// The kind's row whatever its fields.
    any_row: TokenStream,
    /// The kind's row binding what the cache makers read.
    cache_row: TokenStream,
    /// The rope context the kind attends with, when it attends.
    ctx: Option<proc_macro2::Ident>,
    /// The per-layer input argument, when the kind takes one.
    pli: Option<TokenStream>,
}

fn kind_arms(plan: &Plan, facts: ModelFacts, k: &KindFacts) -> Result<KindArms, String> {
    let (name, variant) = (&k.name, &k.variant);
    let fields = row_fields(k);
    let any_row = if fields.is_empty() {
        quote! { Row::#variant }
    } else {
        quote! { Row::#variant(..) }
    };
    let row_variant = if fields.is_empty() {
        let doc = format!(" A `{name}` layer.");
        quote! { #[doc = #doc] #variant, }
    } else {
        let types = fields.iter().map(|f| &f.ty);
        let what = fields.iter().map(|f| f.what).collect::<Vec<_>>().join(", ");
        let doc = format!(" A `{name}` layer ({what}).");
        quote! { #[doc = #doc] #variant(#(#types),*), }
    };
    let args = fields.iter().filter_map(|f| f.load_arg.as_ref());
    // A short conv's struct is hundreds of bytes smaller than an attention
    // kind's: a model with both holds every kind boxed in `Layer`, so its
    // variants have one size (clippy's large_enum_variant); every other
    // model's `Layer` holds its kinds as they are.
    let boxed = facts.any_short_conv;
    let (held, loaded) = match boxed {
        true => (
            quote! { Box<#name> },
            quote! { Box::new(#name::load(w, i #(#args)*)) },
        ),
        false => (quote! { #name }, quote! { #name::load(w, i #(#args)*) }),
    };
    let load = if fields.is_empty() {
        quote! { Row::#variant => Layer::#variant(#loaded), }
    } else {
        let load_binds = fields.iter().map(|f| &f.load_bind);
        quote! { Row::#variant(#(#load_binds),*) => Layer::#variant(#loaded), }
    };
    let cache_row = if k.cache_form {
        let binds = fields.iter().map(|f| &f.cache_bind);
        quote! { Row::#variant(#(#binds),*) }
    } else {
        any_row.clone()
    };
    let call = KindCall {
        variant,
        any_row,
        cache_row,
        ctx: k
            .layer
            .attention()
            .map(|a| ident(&rope_context(&plan.ir, a))),
        pli: match (k.per_layer_input, facts.every_ple) {
            (true, true) => Some(quote! { , &per_layer_input }),
            (true, false) => Some(quote! { , &b::per_layer_slice(&per_layer, i as i32)? }),
            (false, _) => None,
        },
    };
    let state = match k.state {
        State::Kv(window) => kv_state_arms(&call, k, window, facts.any_donor)?,
        State::Donor => donor_state_arms(&call),
        State::Arrays => arrays_state_arms(&call, facts.any_donor),
        State::Latent => latent_state_arms(&call, facts.any_donor),
    };
    Ok(KindArms {
        row_variant,
        layer_variant: quote! { #variant(#held), },
        load,
        state,
    })
}

/// The arms of a kind that keeps its own K/V in a cache of `window`.
fn kv_state_arms(
    call: &KindCall,
    k: &KindFacts,
    window: Window,
    any_donor: bool,
) -> Result<StateArms, String> {
    let KindCall {
        variant,
        any_row,
        cache_row,
        ctx,
        pli,
    } = call;
    let cache = match (window, k.cache_form) {
        (Window::Full, true) => quote! { cache.make() },
        (Window::Full, false) | (Window::Sliding(_), _) => own_kv_cache(window)?,
    };
    let batch_cache = match window {
        // A row with a cache form makes the batched cache of
        // its form (`KvForm::make_batch`).
        Window::Full if k.cache_form => {
            quote! { #cache_row => Some(cache.make_batch(no_padding)), }
        }
        Window::Full | Window::Sliding(_) => {
            let made = own_batch_kv_cache(window, &quote! { no_padding })?;
            quote! { #any_row => Some(#made), }
        }
    };
    let call = quote! { l.forward(&h, &#ctx, next_cache(&mut kv_caches, NAME)? #pli)? };
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
    Ok(StateArms {
        kv_cache: quote! { #cache_row => Some(#cache), },
        state: quote! { #any_row => None, },
        batch_cache,
        step: quote! { Layer::#variant(l) => #step, },
        batch_step: quote! { Layer::#variant(l) => #batch_step, },
    })
}

/// The plain K/V cache of one sequence for a layer attending in `window`.
fn own_kv_cache(window: Window) -> Result<TokenStream, String> {
    Ok(match window {
        Window::Sliding(w) => {
            let w = lit_i32(w)?;
            quote! { LayerCache::Sliding(RotatingKvCache::new(#w, 0)) }
        }
        Window::Full => quote! { LayerCache::Full(KvCache::default()) },
    })
}

/// The plain merged K/V cache of fresh sequences for a layer attending in
/// `window`; `no_padding` is the expression of their (zero) left paddings.
fn own_batch_kv_cache(window: Window, no_padding: &TokenStream) -> Result<TokenStream, String> {
    Ok(match window {
        Window::Sliding(w) => {
            let w = lit_i32(w)?;
            quote! { BatchLayerCache::Sliding(BatchRotatingKvCache::new(#w, #no_padding)) }
        }
        Window::Full => quote! { BatchLayerCache::Full(BatchKvCache::new(#no_padding)) },
    })
}

/// The arms of a kind that reads the K/V its donor computed.
fn donor_state_arms(call: &KindCall) -> StateArms {
    let KindCall {
        variant,
        any_row,
        ctx,
        pli,
        ..
    } = call;
    StateArms {
        kv_cache: quote! { #any_row => None, },
        state: quote! { #any_row => None, },
        batch_cache: quote! { #any_row => None, },
        // A layer reading a donor's K/V attends as in one sequence,
        // batched or not (the donor's K/V carry the rows' offsets).
        step: quote! {
            Layer::#variant(l) => (l.forward(&h, &#ctx, b::donor_kv(&computed, l.donor, NAME)? #pli)?, None),
        },
        batch_step: quote! {
            Layer::#variant(l) => (l.forward_batch(&h, &#ctx, b::donor_kv(&computed, l.donor, NAME)? #pli)?, None),
        },
    }
}

/// The arms of a latent attention kind: a plain full K/V cache of the latent
/// and the RoPE key, the model's one latent RoPE, the mask built from the
/// layer's own cache before its update (every layer's cache is at the same
/// offset, as the first layer's that mlx-lm reads it from).
fn latent_state_arms(call: &KindCall, any_donor: bool) -> StateArms {
    let KindCall {
        variant, any_row, ..
    } = call;
    let call = quote! { l.forward(&h, &self.latent_rope, next_cache(&mut kv_caches, NAME)?)? };
    let batch_call = quote! { l.forward_batch(&h, &self.latent_rope, cache.layer_mut(i)?)? };
    let (step, batch_step) = if any_donor {
        (quote! { (#call, None) }, quote! { (#batch_call, None) })
    } else {
        (call, batch_call)
    };
    StateArms {
        kv_cache: quote! { #any_row => Some(LayerCache::Full(KvCache::default())), },
        state: quote! { #any_row => None, },
        batch_cache: quote! {
            #any_row => Some(BatchLayerCache::Full(BatchKvCache::new(no_padding))),
        },
        step: quote! { Layer::#variant(l) => #step, },
        batch_step: quote! { Layer::#variant(l) => #batch_step, },
    }
}

/// The arms of a Gated DeltaNet kind (conv and recurrent state).
fn arrays_state_arms(call: &KindCall, any_donor: bool) -> StateArms {
    let KindCall {
        variant, any_row, ..
    } = call;
    // No window, no mask (`create_ssm_mask` is None for one
    // unpadded sequence).
    let call = quote! { l.forward(&h, next_cache(&mut states, NAME)?)? };
    let batch_call = quote! { l.forward_batch(&h, cache.arrays_mut(i)?, ssm_mask.as_ref())? };
    let (step, batch_step) = if any_donor {
        (quote! { (#call, None) }, quote! { (#batch_call, None) })
    } else {
        (call, batch_call)
    };
    StateArms {
        kv_cache: quote! { #any_row => None, },
        state: quote! { #any_row => Some(deltanet::ArraysCache::default()), },
        batch_cache: quote! {
            #any_row => Some(BatchLayerCache::Arrays(BatchArraysCache::merged_empty(no_padding.len()))),
        },
        step: quote! { Layer::#variant(l) => #step, },
        batch_step: quote! { Layer::#variant(l) => #batch_step, },
    }
}

/// `KvForm`: the cache forms the model's full layers use, and how each
/// makes its cache for one sequence and for a batch.
fn kv_form_tokens(plan: &Plan) -> TokenStream {
    let used = |pick: fn(&KvCache) -> bool| {
        plan.ir
            .layers
            .iter()
            .any(|l| match l.attention().map(|a| (a.window, a.kv)) {
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
        plain.then(
            || quote! { KvForm::Plain => BatchLayerCache::Full(BatchKvCache::new(no_padding)), },
        ),
        quantized.then(|| {
            quote! {
                KvForm::Quantized { group_size, bits } => BatchLayerCache::Quantized(
                    BatchQuantizedKvCache::new(KvQuantization { group_size, bits }, no_padding),
                ),
            }
        }),
        mixed.then(|| {
            quote! {
                KvForm::QuantizedAfterForward { group_size, bits, start } => {
                    BatchLayerCache::QuantizedAfterForward(BatchMixedKvCache::new(
                        KvQuantization { group_size, bits },
                        start,
                        no_padding,
                    ))
                }
            }
        }),
    ]
    .into_iter()
    .flatten();
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

            /// The batched cache of this form for fresh sequences.
            fn make_batch(self, no_padding: &[i32]) -> BatchLayerCache {
                match self {
                    #(#batch_arms)*
                }
            }
        }
    }
}

/// `impl Row`: load a layer, and make its caches for one sequence and for
/// a batch.
fn row_impl(facts: ModelFacts, arms: &[KindArms]) -> TokenStream {
    let loads = arms.iter().map(|a| &a.load);
    let kv_caches = arms.iter().map(|a| &a.state.kv_cache);
    let batch_caches = arms.iter().map(|a| &a.state.batch_cache);
    let states_fn = facts.any_arrays.then(|| {
        let states = arms.iter().map(|a| &a.state.state);
        quote! {
            /// The layer's conv and recurrent state, for a Gated DeltaNet layer.
            fn state(self) -> Option<deltanet::ArraysCache> {
                match self {
                    #(#states)*
                }
            }
        }
    });
    quote! {
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

            /// The layer's merged cache for a batch of fresh sequences
            /// (`BatchGenerator`), none for a layer reading a donor's K/V.
            fn batch_cache(self, no_padding: &[i32]) -> Option<BatchLayerCache> {
                match self {
                    #(#batch_caches)*
                }
            }
        }
    }
}

/// A constant per distinct MLP width.
fn width_consts(widths: &[MlpWidth]) -> Result<TokenStream, String> {
    let consts = widths
        .iter()
        .map(|w| {
            let (name, width) = (&w.name, lit_i32(w.width)?);
            Ok(quote! {
                /// The width of a dense MLP (`intermediate_size`).
                const #name: i32 = #width;
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(quote! { #(#consts)* })
}

/// The shortest run of rows the layers repeat at least twice (the last
/// repetition may stop early: 26 layers of a 6-row pattern), if any.
fn repeating_pattern(rows: &[TokenStream]) -> Option<usize> {
    let texts: Vec<String> = rows.iter().map(ToString::to_string).collect();
    (1..=texts.len() / 2).find(|&p| texts.iter().enumerate().all(|(i, t)| *t == texts[i % p]))
}

/// The table of rows: `PATTERN` (and `row`, which reads it) where the
/// layers repeat a run of rows, else `LAYOUT`, one row per layer; and the
/// expression of layer `i`'s row.
fn rows_table(rows: &[TokenStream]) -> Result<(TokenStream, TokenStream), String> {
    Ok(match repeating_pattern(rows) {
        Some(period) => {
            let pattern = &rows[..period];
            let p = Literal::usize_unsuffixed(period);
            let doc =
                format!(" The layers repeat these {period} rows: layer `i` is row `i % {period}`.");
            (
                quote! {
                    #[doc = #doc]
                    const PATTERN: [Row; #p] = [
                        #(#pattern),*
                    ];

                    /// Layer `i`'s row.
                    fn row(i: usize) -> Row {
                        PATTERN[i % PATTERN.len()]
                    }
                },
                quote! { row(i) },
            )
        }
        None => (
            quote! {
                /// Every layer in order: layer `i` is row `i`.
                const LAYOUT: [Row; LAYERS] = [
                    #(#rows),*
                ];
            },
            quote! { LAYOUT[i] },
        ),
    })
}

/// `Row`, `KvForm`, the MLP widths, `LAYOUT` (or `PATTERN`), `Layer`,
/// and `impl Row`: the items of the layout; and the
/// expression of layer `i`'s row.
fn layout_items(
    plan: &Plan,
    kinds: &[KindFacts],
    facts: ModelFacts,
    arms: &[KindArms],
) -> Result<(TokenStream, TokenStream), String> {
    let widths = mlp_widths(plan);
    let width_consts = width_consts(&widths)?;
    let donors = donors(plan)?;
    let donor_consts = donor_consts(&donors);
    let rows = plan
        .ir
        .layers
        .iter()
        .map(|l| row_tokens(&kinds[plan.layer_kind[l.index]], l, &widths, &donors))
        .collect::<Result<Vec<_>, _>>()?;
    let (table, row_of) = rows_table(&rows)?;
    let row_variants = arms.iter().map(|a| &a.row_variant);
    let layer_variants = arms.iter().map(|a| &a.layer_variant);
    let kv_form = per_layer_cache_forms(plan).then(|| kv_form_tokens(plan));
    let row_impl = row_impl(facts, arms);
    let doc_row = " A layer's kind and the facts its kind leaves open (each variant names them).";
    let items = quote! {
        #[doc = #doc_row]
        #[derive(Clone, Copy)]
        enum Row {
            #(#row_variants)*
        }

        #kv_form

        #width_consts

        #donor_consts

        #table

        /// One loaded layer, by kind.
        enum Layer {
            #(#layer_variants)*
        }

        #row_impl
    };
    Ok((items, row_of))
}

/// The `Cache` struct's fields and `make_cache`'s body.
fn cache_tokens(any_arrays: bool, row_of: &TokenStream) -> (TokenStream, TokenStream) {
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
        .then(|| quote! { states: (0..LAYERS).filter_map(|i| #row_of.state()).collect(), });
    let make_cache = quote! {
        Cache {
            kv: (0..LAYERS).filter_map(|i| #row_of.kv_cache()).collect(),
            #states_init
        }
    };
    (cache_fields, make_cache)
}

/// `forward`'s and `forward_batch`'s loops over the layers.
fn forward_loops(facts: ModelFacts, arms: &[KindArms]) -> (TokenStream, TokenStream) {
    let steps = arms.iter().map(|a| &a.state.step).collect::<Vec<_>>();
    let batch_steps = arms.iter().map(|a| &a.state.batch_step).collect::<Vec<_>>();
    let states_iter = facts
        .any_arrays
        .then(|| quote! { let mut states = cache.states.iter_mut(); });
    let each = if facts.any_ple {
        quote! { for (i, layer) in self.layers.iter().enumerate() }
    } else {
        quote! { for layer in &self.layers }
    };
    let slice = facts.every_ple.then(|| {
        quote! { let per_layer_input = b::per_layer_slice(&per_layer, i as i32)?; }
    });
    let layers_loop = layer_loop(facts.any_donor, &each, &slice, &steps);
    let forward = quote! {
        let mut kv_caches = cache.kv.iter_mut();
        #states_iter
        #layers_loop
    };
    let forward_batch = layer_loop(
        facts.any_donor,
        &quote! { for (i, layer) in self.layers.iter().enumerate() },
        &slice,
        &batch_steps,
    );
    (forward, forward_batch)
}

/// The layout of a model whose layers are all of one kind that keeps a
/// plain K/V cache, with one MLP width: the kind's struct itself, loaded,
/// cached and run in loops over `0..LAYERS`, with no table of rows and no
/// enum of kinds. None for any other model.
fn uniform_layout(plan: &Plan, kinds: &[KindFacts]) -> Result<Option<Layout>, String> {
    let [kind] = kinds else {
        return Ok(None);
    };
    let window = match kind.state {
        State::Kv(window) => window,
        State::Donor | State::Arrays | State::Latent => return Ok(None),
    };
    let widths = mlp_widths(plan);
    if kind.cache_form || kind.per_layer_input || widths.len() > 1 {
        return Ok(None);
    }
    let name = &kind.name;
    let width_arg = match (kind.mlp_width, widths.first()) {
        (true, Some(w)) => {
            let w = &w.name;
            Some(quote! { , #w })
        }
        (true, None) => return Err(format!("layer kind {name}: an MLP without a width")),
        (false, _) => None,
    };
    let ctx = kind
        .layer
        .attention()
        .map(|a| ident(&rope_context(&plan.ir, a)));
    let output = kind.returns_kv.then(|| quote! { .0 });
    let cache = own_kv_cache(window)?;
    let batch_cache = own_batch_kv_cache(window, &quote! { &no_padding })?;
    let width_consts = width_consts(&widths)?;
    let (cache_fields, _) = cache_tokens(false, &TokenStream::new());
    Ok(Some(Layout {
        items: quote! {
            #width_consts
        },
        load: quote! {
            layers: (0..LAYERS).map(|i| #name::load(&mut w, i #width_arg)).collect(),
        },
        make_cache: quote! {
            Cache {
                kv: (0..LAYERS).map(|_| #cache).collect(),
            }
        },
        cache_fields,
        forward: quote! {
            let mut kv_caches = cache.kv.iter_mut();
            for layer in &self.layers {
                h = layer.forward(&h, &#ctx, next_cache(&mut kv_caches, NAME)?)?#output;
            }
        },
        forward_batch: quote! {
            for (i, layer) in self.layers.iter().enumerate() {
                h = layer.forward_batch(&h, &#ctx, cache.layer_mut(i)?)?#output;
            }
        },
        batch_caches: quote! { (0..LAYERS).map(|_| Some(#batch_cache)).collect() },
        layer_type: quote! { #name },
    }))
}

pub(crate) fn layout_tokens(plan: &Plan) -> Result<Layout, String> {
    let kinds = kind_facts(plan, per_layer_cache_forms(plan))?;
    if let Some(layout) = uniform_layout(plan, &kinds)? {
        return Ok(layout);
    }
    let facts = ModelFacts::of(&kinds);
    let arms = kinds
        .iter()
        .map(|k| kind_arms(plan, facts, k))
        .collect::<Result<Vec<_>, _>>()?;
    let (items, row_of) = layout_items(plan, &kinds, facts, &arms)?;
    let (cache_fields, make_cache) = cache_tokens(facts.any_arrays, &row_of);
    let (forward, forward_batch) = forward_loops(facts, &arms);
    Ok(Layout {
        items,
        load: quote! {
            layers: (0..LAYERS).map(|i| #row_of.load(&mut w, i)).collect(),
        },
        make_cache,
        cache_fields,
        forward,
        forward_batch,
        batch_caches: quote! { (0..LAYERS).map(|i| #row_of.batch_cache(&no_padding)).collect() },
        layer_type: quote! { Layer },
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
    steps: &[&TokenStream],
) -> TokenStream {
    if any_donor {
        quote! {
            let mut computed: Vec<Option<b::SharedKv>> = Vec::with_capacity(LAYERS);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_words_split_before_each_capital() {
        assert_eq!(
            camel_words("FullOwnKvKeqV"),
            ["Full", "Own", "Kv", "Keq", "V"]
        );
        assert_eq!(camel_words("Plain"), ["Plain"]);
    }

    #[test]
    fn variants_drop_the_words_every_kind_shares() {
        assert_eq!(
            variant_names(&[
                "SlidingOwnKvPle",
                "FullOwnKvPle",
                "SlidingSharedKvPle",
                "FullSharedKvPle"
            ]),
            ["SlidingOwn", "FullOwn", "SlidingShared", "FullShared"]
        );
        assert_eq!(
            variant_names(&["SlidingOwnKv", "FullOwnKv"]),
            ["Sliding", "Full"]
        );
    }

    #[test]
    fn variants_keep_the_kind_names_where_one_would_be_empty() {
        let kinds = ["FullOwnKv", "FullOwnKvExperts"];
        assert_eq!(variant_names(&kinds), kinds);
        assert_eq!(variant_names(&["FullOwnKv"]), ["FullOwnKv"]);
    }

    #[test]
    fn a_pattern_repeats_at_least_twice() {
        let (s, f) = (quote! { Row::Sliding }, quote! { Row::Full });
        let gemma3: Vec<TokenStream> = (0..26)
            .map(|i| if i % 6 == 5 { f.clone() } else { s.clone() })
            .collect();
        assert_eq!(repeating_pattern(&gemma3), Some(6));
        let once = [s.clone(), s.clone(), f.clone()];
        assert_eq!(repeating_pattern(&once), None);
        let donors = [s.clone(), f.clone(), s.clone(), s];
        assert_eq!(repeating_pattern(&donors), None);
    }
}
