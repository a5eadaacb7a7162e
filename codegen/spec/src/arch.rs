//! The resolved view a code generator bakes in: per-layer facts and model-level facts,
//! all as plain pub fields, computed with mlx-lm 0.32.2's rules (`gemma4_text.py`).

use crate::model::*;
pub use archgen_ir::{KvQuant, ModuleKind, QuantizableModule, RopeKind, WeightQuant};
use std::collections::BTreeMap;

/// Everything about one decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerFacts {
    /// Layer index.
    pub index: usize,
    /// Sliding or full attention.
    pub layer_type: LayerType,
    /// `global_head_dim` on full layers when set, else `head_dim`.
    pub head_dim: usize,
    /// Query heads.
    pub n_heads: usize,
    /// KV heads: `num_global_key_value_heads` only when k_eq_v applies to this layer and
    /// it is not null; else `num_key_value_heads`.
    pub n_kv_heads: usize,
    /// `attention_k_eq_v` and this is a full layer: no v_proj, V = raw k_proj output.
    pub k_eq_v: bool,
    /// Owns k_proj/k_norm (and v_proj) and a cache: `index < first_kv_shared_layer`.
    pub has_kv: bool,
    /// The layer whose K/V this layer attends over: itself for donors, the last
    /// non-shared layer of the same type for sharers.
    pub kv_source: usize,
    /// Dense MLP width (doubled on shared layers when `use_double_wide_mlp`).
    pub mlp_width: usize,
    /// RoPE of this layer's type.
    pub rope: RopeKind,
    /// `rope_traditional`.
    pub rope_traditional: bool,
    /// Dimensions that rotate: head_dim for default RoPE, `int(head_dim * p)` for
    /// proportional.
    pub rotated_dims: usize,
    /// KV-cache quantization of this layer, if declared.
    pub kv_quant: Option<KvQuant>,
    /// `Some(sliding_window)` on sliding layers (rotating cache of that size).
    pub window: Option<usize>,
}

/// Per-layer inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PleFacts {
    /// `hidden_size_per_layer_input`.
    pub width: usize,
    /// `vocab_size_per_layer_input`.
    pub vocab: usize,
}

/// Mixture of experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeFacts {
    pub num_experts: usize,
    pub top_k: usize,
    /// `moe_intermediate_size`.
    pub width: usize,
}

/// The validated, fully resolved architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct Architecture {
    pub name: String,
    /// Which family's blocks run this architecture.
    pub family: Family,
    /// Per-head RMSNorm on queries and keys (`q_norm`, `k_norm`): Gemma-4 and Qwen3.
    pub qk_norm: bool,
    /// Top-level config `model_type`.
    pub model_type: ConfigModelType,
    /// Prefix of the text model's modules: `language_model.model.` or `model.`.
    pub module_prefix: &'static str,
    /// Path of the untied head: `language_model.lm_head` or `lm_head`.
    pub lm_head_path: &'static str,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub num_layers: usize,
    /// `num_hidden_layers - num_kv_shared_layers`: first layer without its own K/V.
    pub first_kv_shared_layer: usize,
    pub num_attention_heads: usize,
    /// Window of sliding layers; 0 when the family has none.
    pub sliding_window: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    pub final_logit_softcapping: Option<f32>,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub per_layer_input: Option<PleFacts>,
    pub moe: Option<MoeFacts>,
    pub quantization: Option<WeightQuant>,
    pub layers: Vec<LayerFacts>,
}

impl Architecture {
    /// Resolves a spec. The spec must have passed validation (as every `Gemma4Spec` returned
    /// by `load`/`parse_str` has).
    pub(crate) fn build(spec: &Gemma4Spec) -> Architecture {
        let types = spec.layer_types();
        let n = types.len();
        let m = n - spec.layers.num_kv_shared_layers as usize;
        let a = &spec.attention;
        let mut last_of_type: BTreeMap<LayerType, usize> = BTreeMap::new();
        for (i, t) in types.iter().enumerate().take(m) {
            last_of_type.insert(*t, i);
        }
        let kv: BTreeMap<u32, &KvQuantEntry> = spec
            .kv_quantization
            .iter()
            .flatten()
            .map(|e| (e.layer_idx, e))
            .collect();
        let layers = types
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let full = t == LayerType::Full;
                let head_dim = match (full, a.global_head_dim) {
                    (true, Some(g)) if g > 0 => g,
                    _ => a.head_dim,
                } as usize;
                let k_eq_v = a.attention_k_eq_v && full;
                let n_kv_heads = match (k_eq_v, a.num_global_key_value_heads) {
                    (true, Some(g)) => g,
                    _ => a.num_key_value_heads,
                } as usize;
                let has_kv = i < m;
                let kv_source = if has_kv {
                    i
                } else {
                    last_of_type.get(&t).copied().unwrap_or(i)
                };
                let double = spec.mlp.use_double_wide_mlp && i >= m && m > 0;
                let mlp_width = spec.mlp.intermediate_size as usize * if double { 2 } else { 1 };
                let params = if full {
                    &spec.rope.full
                } else {
                    &spec.rope.sliding
                };
                let (rope, rotated_dims) = match *params {
                    RopeParams::Default { rope_theta } => (
                        RopeKind::Default {
                            theta: rope_theta as f32,
                        },
                        head_dim,
                    ),
                    RopeParams::Proportional {
                        rope_theta,
                        partial_rotary_factor,
                        factor,
                    } => (
                        RopeKind::Proportional {
                            theta: rope_theta as f32,
                            partial_rotary_factor: partial_rotary_factor as f32,
                            factor: factor as f32,
                        },
                        // Python: int(dims * partial_rotary_factor), in f64.
                        (head_dim as f64 * partial_rotary_factor).floor() as usize,
                    ),
                };
                LayerFacts {
                    index: i,
                    layer_type: t,
                    head_dim,
                    n_heads: a.num_attention_heads as usize,
                    n_kv_heads,
                    k_eq_v,
                    has_kv,
                    kv_source,
                    mlp_width,
                    rope,
                    rope_traditional: spec.rope.traditional,
                    rotated_dims,
                    kv_quant: kv.get(&(i as u32)).map(|e| KvQuant {
                        bits: e.bits,
                        group_size: e.group_size,
                    }),
                    window: (!full).then_some(a.sliding_window as usize),
                }
            })
            .collect();
        let wrapped = spec.identity.source.model_type != ConfigModelType::Gemma4Text;
        Architecture {
            name: spec.identity.name.clone(),
            family: Family::Gemma4,
            qk_norm: true,
            model_type: spec.identity.source.model_type,
            module_prefix: if wrapped {
                "language_model.model."
            } else {
                "model."
            },
            lm_head_path: if wrapped {
                "language_model.lm_head"
            } else {
                "lm_head"
            },
            hidden_size: spec.model.hidden_size as usize,
            vocab_size: spec.model.vocab_size as usize,
            num_layers: n,
            first_kv_shared_layer: m,
            num_attention_heads: a.num_attention_heads as usize,
            sliding_window: a.sliding_window as usize,
            intermediate_size: spec.mlp.intermediate_size as usize,
            rms_norm_eps: spec.model.rms_norm_eps as f32,
            final_logit_softcapping: spec.model.final_logit_softcapping.map(|s| s as f32),
            tie_word_embeddings: spec.model.tie_word_embeddings,
            max_position_embeddings: spec.model.max_position_embeddings as usize,
            per_layer_input: spec.per_layer_input.as_ref().map(|p| PleFacts {
                width: p.hidden_size_per_layer_input as usize,
                vocab: p.vocab_size_per_layer_input as usize,
            }),
            moe: spec.moe.as_ref().map(|m| MoeFacts {
                num_experts: m.num_experts as usize,
                top_k: m.top_k_experts as usize,
                width: m.moe_intermediate_size as usize,
            }),
            quantization: spec.quantization.as_ref().map(WeightQuant::of),
            layers,
        }
    }

    /// Every module `nn.quantize` would visit, in module-tree order, with weight shapes.
    pub fn quantizable_modules(&self) -> Vec<QuantizableModule> {
        let pre = self.module_prefix;
        let h = self.hidden_size as u64;
        let mut out = Vec::new();
        let mut push = |path: String, kind, in_dim: u64, out_dim: u64, count: u64| {
            out.push(QuantizableModule {
                path,
                kind,
                in_dim,
                out_dim,
                count,
            })
        };
        push(
            format!("{pre}embed_tokens"),
            ModuleKind::Embedding,
            h,
            self.vocab_size as u64,
            1,
        );
        if let Some(ple) = self.per_layer_input {
            let w = (self.num_layers * ple.width) as u64;
            push(
                format!("{pre}embed_tokens_per_layer"),
                ModuleKind::Embedding,
                w,
                ple.vocab as u64,
                1,
            );
            push(
                format!("{pre}per_layer_model_projection"),
                ModuleKind::Linear,
                h,
                w,
                1,
            );
        }
        for l in &self.layers {
            let lp = format!("{pre}layers.{}.", l.index);
            let q = (l.n_heads * l.head_dim) as u64;
            let kv = (l.n_kv_heads * l.head_dim) as u64;
            push(format!("{lp}self_attn.q_proj"), ModuleKind::Linear, h, q, 1);
            if l.has_kv {
                push(
                    format!("{lp}self_attn.k_proj"),
                    ModuleKind::Linear,
                    h,
                    kv,
                    1,
                );
                if !l.k_eq_v {
                    push(
                        format!("{lp}self_attn.v_proj"),
                        ModuleKind::Linear,
                        h,
                        kv,
                        1,
                    );
                }
            }
            push(format!("{lp}self_attn.o_proj"), ModuleKind::Linear, q, h, 1);
            let w = l.mlp_width as u64;
            push(format!("{lp}mlp.gate_proj"), ModuleKind::Linear, h, w, 1);
            push(format!("{lp}mlp.down_proj"), ModuleKind::Linear, w, h, 1);
            push(format!("{lp}mlp.up_proj"), ModuleKind::Linear, h, w, 1);
            if let Some(moe) = self.moe {
                let e = moe.num_experts as u64;
                let mw = moe.width as u64;
                push(format!("{lp}router.proj"), ModuleKind::Linear, h, e, 1);
                push(
                    format!("{lp}experts.switch_glu.gate_proj"),
                    ModuleKind::SwitchLinear,
                    h,
                    mw,
                    e,
                );
                push(
                    format!("{lp}experts.switch_glu.up_proj"),
                    ModuleKind::SwitchLinear,
                    h,
                    mw,
                    e,
                );
                push(
                    format!("{lp}experts.switch_glu.down_proj"),
                    ModuleKind::SwitchLinear,
                    mw,
                    h,
                    e,
                );
            }
            if let Some(ple) = self.per_layer_input {
                let pw = ple.width as u64;
                push(
                    format!("{lp}per_layer_input_gate"),
                    ModuleKind::Linear,
                    h,
                    pw,
                    1,
                );
                push(
                    format!("{lp}per_layer_projection"),
                    ModuleKind::Linear,
                    pw,
                    h,
                    1,
                );
            }
        }
        if !self.tie_word_embeddings {
            push(
                self.lm_head_path.to_string(),
                ModuleKind::Linear,
                h,
                self.vocab_size as u64,
                1,
            );
        }
        out
    }

    /// How the module at `module_path` is quantized, by mlx-lm's rules: an explicit
    /// per-path entry wins (params, or `false` → None); otherwise the default applies,
    /// except that convert skips modules whose input dimension is not divisible by the
    /// group size. None for unquantized models and for paths that are not quantizable
    /// modules of this architecture.
    pub fn quant_for(&self, module_path: &str) -> Option<QuantParams> {
        let q = self.quantization.as_ref()?;
        if let Some(entry) = q.overrides.get(module_path) {
            return *entry;
        }
        let module = self
            .quantizable_modules()
            .into_iter()
            .find(|m| m.path == module_path)?;
        (module.in_dim % q.default.group_size as u64 == 0).then_some(q.default)
    }

    /// Modules the default quantization would skip because their input dimension is not
    /// a multiple of the group size (and that have no explicit entry).
    pub fn quant_skipped_modules(&self) -> Vec<QuantizableModule> {
        let Some(q) = &self.quantization else {
            return Vec::new();
        };
        self.quantizable_modules()
            .into_iter()
            .filter(|m| {
                !q.overrides.contains_key(&m.path) && m.in_dim % q.default.group_size as u64 != 0
            })
            .collect()
    }

    /// Parameter count of the unquantized model (weights, norms, scalars).
    pub fn param_count(&self) -> u64 {
        let h = self.hidden_size as u64;
        // MiniCPM's tensors are Llama's (its scales are constants, not weights).
        if self.family.is_dense() || self.family == Family::MiniCpm {
            return crate::dense::param_count(self);
        }
        if self.family == Family::Gemma2 {
            return crate::gemma2::param_count(self);
        }
        let mut total: u64 = self
            .quantizable_modules()
            .iter()
            .map(|m| m.in_dim * m.out_dim * m.count)
            .sum();
        total += h; // final norm
        if let Some(ple) = self.per_layer_input {
            total += ple.width as u64; // per_layer_projection_norm
        }
        for l in &self.layers {
            total += 4 * h + 1; // four layer norms + layer_scalar
            total += l.head_dim as u64; // q_norm
            if l.has_kv {
                total += l.head_dim as u64; // k_norm
            }
            if self.per_layer_input.is_some() {
                total += h; // post_per_layer_input_norm
            }
            if let Some(moe) = self.moe {
                total += 3 * h + h + moe.num_experts as u64; // 3 norms, router.scale, per_expert_scale
            }
        }
        total
    }
}
