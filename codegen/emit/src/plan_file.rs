//! The plan file reviewers read in a PR: the layer table, the kinds, and every
//! parameter's name, shape and dtype (the contract with the checkpoint).

use archgen_plan::{Plan, GENERATOR_VERSION};
use archgen_spec::RopeKind;
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

const TEMPLATE: &str = include_str!("../templates/plan.md.j2");

#[derive(Serialize)]
struct Row {
    index: usize,
    layer_type: &'static str,
    kind: String,
    kv: String,
    heads: String,
    head_dim: usize,
    rope: String,
    mlp: usize,
    kv_quant: String,
}

#[derive(Serialize)]
struct KindRow {
    name: String,
    layers: String,
}

#[derive(Serialize)]
struct ParamRow {
    name: String,
    shape: String,
    dtype: &'static str,
}

pub fn plan_file(plan: &Plan) -> Result<String, String> {
    let a = &plan.arch;
    let rows: Vec<Row> = a
        .layers
        .iter()
        .map(|f| Row {
            index: f.index,
            layer_type: f.layer_type.hf_name(),
            kind: plan.kinds[plan.layer_kind[f.index]].key.type_name(),
            kv: if f.has_kv {
                "own".into()
            } else {
                format!("from {}", f.kv_source)
            },
            heads: format!("{}/{}", f.n_heads, f.n_kv_heads),
            head_dim: f.head_dim,
            rope: match f.rope {
                RopeKind::Default { theta } => format!("default θ={theta}"),
                RopeKind::Proportional {
                    theta,
                    partial_rotary_factor,
                    factor,
                } => format!(
                    "proportional θ={theta} p={partial_rotary_factor} factor={factor} ({} dims)",
                    f.rotated_dims
                ),
                RopeKind::Llama3 {
                    theta,
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                } => format!(
                    "llama3 θ={theta} factor={factor} low={low_freq_factor} high={high_freq_factor} original={original_max_position_embeddings}"
                ),
            },
            mlp: f.mlp_width,
            kv_quant: f
                .kv_quant
                .map_or("-".into(), |q| format!("{}-bit g{}", q.bits, q.group_size)),
        })
        .collect();
    let kinds: Vec<KindRow> = plan
        .kinds
        .iter()
        .map(|k| KindRow {
            name: k.key.type_name(),
            layers: k
                .layers
                .iter()
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
        .collect();
    let params: Vec<ParamRow> = plan
        .params
        .iter()
        .map(|p| ParamRow {
            name: p.name.clone(),
            shape: format!("{:?}", p.shape),
            dtype: p.dtype,
        })
        .collect();
    let quant = a.quantization.as_ref().map(|q| {
        format!(
            "{}-bit, group {}, {}",
            q.default.bits,
            q.default.group_size,
            q.default.mode.as_str()
        )
    });
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(true);
    env.add_template("plan", TEMPLATE)
        .map_err(|e| e.to_string())?;
    let ctx = minijinja::context! {
        name => &plan.name,
        spec => &plan.spec_path,
        spec_hash => &plan.spec_hash,
        fingerprint => &plan.fingerprint,
        generator => GENERATOR_VERSION,
        command => crate::regenerate_command(&plan.name),
        model_type => a.model_type.as_str(),
        family => a.family.as_str(),
        qk_norm => a.qk_norm,
        hidden => a.hidden_size,
        vocab => a.vocab_size,
        num_layers => a.num_layers,
        window => a.sliding_window,
        eps => a.rms_norm_eps.to_string(),
        softcap => a.final_logit_softcapping.map_or("none".to_string(), |c| c.to_string()),
        tied => a.tie_word_embeddings,
        ple => a.per_layer_input.map_or("none".to_string(), |p| format!("width {}, vocab {}", p.width, p.vocab)),
        moe => a.moe.map_or("none".to_string(), |m| format!("{} experts, top-{}, width {}", m.num_experts, m.top_k, m.width)),
        quantization => quant.unwrap_or_else(|| "none".to_string()),
        rows => rows,
        kinds => kinds,
        params => params,
        param_count => a.param_count(),
    };
    env.get_template("plan")
        .and_then(|t| t.render(ctx))
        .map_err(|e| format!("plan template: {e}"))
}
