//! Each layer kind's forward reads as the layer: its lines carry comments
//! saying what they are in mlx-lm's terms, in the order mlx-lm runs them
//! (norm, mixer, residual, feed-forward, residual, scalar).

use std::path::Path;

fn model_file(name: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let origin = format!("specs/{name}.yaml");
    let spec = archgen_families::load(root.join(&origin)).unwrap_or_else(|d| panic!("{d}"));
    archgen_emit::model_file(&archgen_plan::plan(&spec, &origin)).unwrap()
}

/// The comment lines of the first kind's `forward`, without `// `.
fn first_forward_comments(file: &str) -> Vec<String> {
    let start = file.find("    fn forward(").expect("a kind's forward");
    let end = start + file[start..].find("\n    }\n").expect("its end");
    file[start..end]
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("// "))
        .map(str::to_string)
        .collect()
}

/// `expected` are prefixes of the forward's comments, one each, in order.
fn assert_composition(name: &str, expected: &[&str]) {
    let comments = first_forward_comments(&model_file(name));
    assert_eq!(
        comments.len(),
        expected.len(),
        "{name}: comments {comments:#?}"
    );
    for (c, e) in comments.iter().zip(expected) {
        assert!(c.starts_with(e), "{name}: `{c}` does not start with `{e}`");
    }
}

#[test]
fn gemma4_sandwich_layer_with_a_scalar() {
    assert_composition(
        "gemma4-12b-tiny",
        &[
            "One token: the whole layer as one compiled decode block",
            "x = self.input_layernorm(h)",
            "a = self.self_attn(x, mask, cache): q/k/v projections, q/k RMSNorm per head, RoPE",
            "finish",
            "  h = h + self.post_attention_layernorm(a)",
            "  h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))",
            "  h = h * self.layer_scalar",
        ],
    );
}

#[test]
fn olmo2_post_norm_layer_has_no_norm_before_its_mixer() {
    assert_composition(
        "olmo-2-1124-7b-tiny",
        &[
            "a = self.self_attn(h, mask, cache): q/k/v projections, q/k RMSNorm over the projections",
            "finish",
            "  h = h + self.post_attention_layernorm(a)",
            "  h = h + self.post_feedforward_layernorm(self.mlp(h))",
        ],
    );
}

#[test]
fn granite_scales_both_residual_branches() {
    assert_composition(
        "granite-3.3-2b-tiny",
        &[
            "One token",
            "x = self.input_layernorm(h)",
            "a = self.self_attn(x, mask, cache)",
            "finish",
            "  h = h + a * residual_multiplier",
            "  h = h + self.mlp(self.post_attention_layernorm(h)) * residual_multiplier",
        ],
    );
}

#[test]
fn qwen3_5_linear_layer_is_a_gated_delta_net() {
    assert_composition(
        "qwen3.5-4b-tiny",
        &[
            "One token",
            "x = self.input_layernorm(h)",
            "a = self.linear_attn(x, mask, cache): Gated DeltaNet",
            "finish",
            "  h = h + a",
            "  h = h + self.mlp(self.post_attention_layernorm(h))",
        ],
    );
}
