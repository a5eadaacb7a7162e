//! The words for an attention layer's optional facts, shared by every text a
//! reviewer reads about a layer (the forward's comments, the kind's doc
//! comment, the plan file), so that one fact reads the same everywhere.

use archgen_ir::{
    Attention, Layer, LayerInput, LayerScalar, OutputGate, ProjectionBias, QkNorm, QkvProjection,
    Residual, RopeKind,
};

/// `no RoPE` where the layer rotates nothing (NoPE); none where it rotates.
pub(crate) fn no_rope(kind: RopeKind) -> Option<&'static str> {
    match kind {
        RopeKind::NoPe => Some("no RoPE"),
        RopeKind::Default { .. }
        | RopeKind::Linear { .. }
        | RopeKind::Proportional { .. }
        | RopeKind::Llama3 { .. }
        | RopeKind::Yarn { .. } => None,
    }
}

/// The q/k norm, where the layer has one.
pub(crate) fn qk_norm(norm: QkNorm) -> Option<&'static str> {
    match norm {
        QkNorm::None => None,
        QkNorm::RmsPerHead => Some("q/k RMSNorm per head"),
        QkNorm::RmsPerHeadOnePlus => Some("q/k RMSNorm (1 + w) per head"),
        QkNorm::RmsWholeProjection => Some("q/k RMSNorm over the projections"),
    }
}

/// How the layer's projections differ from plain separate q/k/v/o
/// projections without bias and ungated, in this order: bias, a fused
/// `qkv_proj`, an output gate.
pub(crate) fn projection_extras(a: &Attention) -> Vec<&'static str> {
    let bias = match a.bias {
        ProjectionBias::None => None,
        ProjectionBias::QueryKeyValue => Some("q/k/v bias"),
        ProjectionBias::QueryKeyValueOutput => Some("q/k/v/o bias"),
    };
    let fused = match a.projection {
        QkvProjection::Separate => None,
        QkvProjection::Fused => Some("one fused qkv_proj, split"),
    };
    let gate = match a.output_gate {
        OutputGate::None => None,
        OutputGate::SigmoidPerHead => Some("output gated by sigmoid(gate)"),
    };
    [bias, fused, gate].into_iter().flatten().collect()
}

/// What the layer adds around its mixer and feed-forward, in this order: a
/// per-layer input gate, a layer scalar, scaled residual branches.
pub(crate) fn layer_extras(l: &Layer) -> Vec<String> {
    let input = match l.input {
        LayerInput::None => None,
        LayerInput::Gated { width } => Some(format!("per-layer input gate of width {width}")),
    };
    let scalar = match l.scalar {
        LayerScalar::None => None,
        LayerScalar::Learned => Some("layer scalar".to_string()),
    };
    let residual = match l.residual {
        Residual::Plain => None,
        Residual::DepthScaled {
            scale_depth,
            num_hidden_layers,
        } => Some(format!(
            "residual branches × {scale_depth} / sqrt({num_hidden_layers}) = {}",
            l.residual.factor().unwrap_or(f64::NAN)
        )),
        Residual::Scaled { multiplier } => Some(format!("residual branches × {multiplier}")),
        Residual::ClippedInFloat16 => {
            Some("residuals added clipped to float16's range (clip_residual)".to_string())
        }
    };
    [input, scalar, residual].into_iter().flatten().collect()
}
