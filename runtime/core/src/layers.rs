//! Linear layers, embeddings and expert (switch) linears, dense or mlx-quantized.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use crate::ops::Result;

/// mlx quantization of one weight: packed uint32 `weight` with per-group
/// `scales`, and per-group biases in the affine mode.
#[derive(Debug, Clone)]
pub struct Quantized {
    pub scales: Array,
    pub form: QuantForm,
    pub group_size: i32,
    pub bits: i32,
}

/// mlx's quantization `mode` of a weight, with what only that mode stores.
#[derive(Debug, Clone)]
pub enum QuantForm {
    /// `affine`: scales and `biases` in the weight's float dtype.
    Affine { biases: Array },
    /// `mxfp4`: 4-bit floats, a uint8 power-of-two scale per group of 32, no
    /// biases (mlx-community's gpt-oss experts).
    Mxfp4,
}

impl QuantForm {
    /// The mode's spelling as mlx takes it (`mode=`).
    fn mode(&self) -> &'static std::ffi::CStr {
        match self {
            QuantForm::Affine { .. } => c"affine",
            QuantForm::Mxfp4 => c"mxfp4",
        }
    }
}

/// `nn.Linear` or `nn.QuantizedLinear`, with or without a bias.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Array,
    pub quant: Option<Quantized>,
    /// `weight.T` already evaluated (a strided view of `weight`, no copy),
    /// set by [`Linear::pretranspose`]: the matmul then reads the same
    /// strides without a Transpose node per call. Generated models only.
    pub weight_t: Option<Array>,
    /// The `[out]` bias (never quantized), applied as mlx nn applies it:
    /// see [`Linear::forward`].
    pub bias: Option<Array>,
}

/// `x @ W.T`, or the transposed `quantized_matmul` of a packed weight.
fn matmul_t(x: &Array, weight: &Array, quant: Option<&Quantized>) -> Result<Array> {
    match quant {
        None => x.matmul(weight.t()),
        Some(q) => quantized_product(x, weight, q, true),
    }
}

/// `quantized_matmul` of a packed weight in its form (`mode=`): with the
/// affine biases, or without them (mxfp4).
fn quantized_product(x: &Array, weight: &Array, q: &Quantized, transpose: bool) -> Result<Array> {
    match &q.form {
        QuantForm::Affine { biases } => mlx_rs::ops::quantized_matmul(
            x,
            weight,
            &q.scales,
            biases,
            transpose,
            q.group_size,
            q.bits,
        ),
        QuantForm::Mxfp4 => crate::mlx_c::quantized_matmul_unbiased(
            x,
            weight,
            &q.scales,
            transpose,
            (q.group_size, q.bits),
            q.form.mode(),
        ),
    }
}

/// The biases of an affine-quantized linear (None for any other).
fn affine_biases(l: &Linear) -> Option<&Array> {
    match l.quant.as_ref().map(|q| &q.form) {
        Some(QuantForm::Affine { biases }) => Some(biases),
        None | Some(QuantForm::Mxfp4) => None,
    }
}

/// [`Linear::pretranspose`] on each of a block's projections.
pub fn pretranspose_all<'a>(linears: impl IntoIterator<Item = &'a mut Linear>) {
    linears.into_iter().for_each(Linear::pretranspose);
}

/// `weight.T`, evaluated: a view with swapped strides over the same data.
fn evaluated_t(weight: &Array, quant: Option<&Quantized>) -> Option<Array> {
    if quant.is_some() {
        return None;
    }
    let t = weight.t();
    t.eval().ok().map(|()| t)
}

/// Bias-free projections of one input stacked on the output axis: the
/// stacked layer (one matmul for all of them) and each part again as a row
/// view of the stacked buffers, so the weights are held once and a part
/// reads the same numbers it was loaded with. Both pretransposed. `None`
/// when a part has a bias or their quantizations or dtypes differ (the
/// stacked buffer has one of each), or MLX refuses an op.
pub fn stack_rows(parts: &[&Linear]) -> Option<(Linear, Vec<Linear>)> {
    let first = parts.first()?;
    let form = |l: &Linear| {
        (
            l.weight.dtype(),
            l.quant
                .as_ref()
                .map(|q| (q.group_size, q.bits, q.scales.dtype())),
        )
    };
    // Only unquantized and affine parts stack (a microscaled part keeps its
    // own matmul).
    let affine = |l: &Linear| match l.quant.as_ref().map(|q| &q.form) {
        None | Some(QuantForm::Affine { .. }) => true,
        Some(QuantForm::Mxfp4) => false,
    };
    if parts
        .iter()
        .any(|l| l.bias.is_some() || !affine(l) || form(l) != form(first))
    {
        return None;
    }

    let evaluated = |a: Array| a.eval().ok().map(|()| a);
    let stack = |f: &dyn Fn(&Linear) -> &Array| -> Option<Array> {
        let arrays: Vec<&Array> = parts.iter().map(|l| f(l)).collect();
        evaluated(mlx_rs::ops::concatenate(&arrays, 0).ok()?)
    };
    let mut stacked = Linear {
        weight: stack(&|l| &l.weight)?,
        quant: match &first.quant {
            None => None,
            Some(q) => Some(Quantized {
                scales: stack(&|l| &l.quant.as_ref().expect("same quantization").scales)?,
                form: QuantForm::Affine {
                    biases: {
                        let parts: Option<Vec<&Array>> =
                            parts.iter().map(|l| affine_biases(l)).collect();
                        evaluated(mlx_rs::ops::concatenate(&parts?, 0).ok()?)?
                    },
                },
                group_size: q.group_size,
                bits: q.bits,
            }),
        },
        weight_t: None,
        bias: None,
    };
    let mut views = Vec::with_capacity(parts.len());
    let mut from = 0;
    for part in parts {
        let to = from + part.weight.shape()[0];
        let rows = |a: &Array| evaluated(a.try_index(from..to).ok()?);
        let mut view = Linear {
            weight: rows(&stacked.weight)?,
            quant: match &stacked.quant {
                None => None,
                Some(q) => Some(Quantized {
                    scales: rows(&q.scales)?,
                    form: match &q.form {
                        QuantForm::Affine { biases } => QuantForm::Affine {
                            biases: rows(biases)?,
                        },
                        QuantForm::Mxfp4 => QuantForm::Mxfp4,
                    },
                    group_size: q.group_size,
                    bits: q.bits,
                }),
            },
            weight_t: None,
            bias: None,
        };
        view.pretranspose();
        views.push(view);
        from = to;
    }
    stacked.pretranspose();
    Some((stacked, views))
}

impl Linear {
    /// `x @ W.T` (or the quantized matmul); with a bias, see [`Linear::forward_biased`].
    pub fn forward(&self, x: &Array) -> Result<Array> {
        if let Some(bias) = &self.bias {
            return self.forward_biased(x, bias);
        }
        match &self.weight_t {
            Some(t) => x.matmul(t),
            None => matmul_t(x, &self.weight, self.quant.as_ref()),
        }
    }

    /// mlx nn's biased forms, op for op: `nn.Linear` runs one
    /// `addmm(bias, x, W.T)` (in bf16 not bit-equal to `x @ W.T + bias`:
    /// the product is not rounded before the add), `nn.QuantizedLinear` runs
    /// `quantized_matmul(...)` and then `+ bias`.
    fn forward_biased(&self, x: &Array, bias: &Array) -> Result<Array> {
        match (&self.quant, &self.weight_t) {
            (None, Some(t)) => mlx_rs::ops::addmm(bias, x, t, None, None),
            (None, None) => mlx_rs::ops::addmm(bias, x, self.weight.t(), None, None),
            (Some(q), _) => matmul_t(x, &self.weight, Some(q))?.add(bias),
        }
    }

    /// Keeps `weight.T` evaluated for [`Linear::forward`] (unquantized only).
    pub fn pretranspose(&mut self) {
        self.weight_t = evaluated_t(&self.weight, self.quant.as_ref());
    }
}

/// `nn.Embedding` / `nn.QuantizedEmbedding`, also used as the tied head.
/// Its table [rows, dims] is held as the bias-free [`Linear`] that
/// `as_linear` is (`x @ table.T`, or the transposed `quantized_matmul`),
/// so the tied head is that projection, pretransposed the same way.
#[derive(Debug, Clone)]
pub struct Embedding {
    pub table: Linear,
}

impl Embedding {
    /// `weight[ids]`, or `dequantize(weight[ids], scales[ids], biases[ids])`.
    pub fn lookup(&self, ids: &Array) -> Result<Array> {
        let Linear { weight, quant, .. } = &self.table;
        match quant {
            None => weight.try_index(ids),
            Some(q) => match &q.form {
                QuantForm::Affine { biases } => mlx_rs::ops::dequantize(
                    weight.try_index(ids)?,
                    q.scales.try_index(ids)?,
                    &biases.try_index(ids)?,
                    q.group_size,
                    q.bits,
                ),
                QuantForm::Mxfp4 => crate::mlx_c::dequantize_unbiased(
                    &weight.try_index(ids)?,
                    &q.scales.try_index(ids)?,
                    (q.group_size, q.bits),
                    q.form.mode(),
                ),
            },
        }
    }

    /// `as_linear`: `x @ W.T`, or a transposed `quantized_matmul`.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        self.table.forward(x)
    }

    /// Keeps `weight.T` evaluated for [`Embedding::as_linear`].
    pub fn pretranspose(&mut self) {
        self.table.pretranspose();
    }
}

/// mlx-lm's `SwitchLinear` / `QuantizedSwitchLinear`: one weight per expert,
/// [experts, out, in], applied by `gather_mm` / `gather_qmm`, and a bias per
/// expert `[experts, out]` where the module has one (gpt_oss's experts).
#[derive(Debug, Clone)]
pub struct SwitchLinear {
    pub weight: Array,
    pub quant: Option<Quantized>,
    pub bias: Option<Array>,
}

impl SwitchLinear {
    /// The gathered matmul, then `x + expand_dims(bias[indices], -2)` when
    /// the module has a bias.
    pub fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        let y = self.gathered_matmul(x, indices, sorted)?;
        match &self.bias {
            None => Ok(y),
            Some(b) => y.add(b.try_index(indices)?.expand_dims(-2)?),
        }
    }

    fn gathered_matmul(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        match &self.quant {
            None => {
                mlx_rs::ops::gather_mm(x, self.weight.swap_axes(-1, -2)?, None, indices, sorted)
            }
            Some(q) => match &q.form {
                QuantForm::Affine { biases } => mlx_rs::ops::gather_qmm(
                    x,
                    &self.weight,
                    &q.scales,
                    biases,
                    None,
                    indices,
                    true,
                    q.group_size,
                    q.bits,
                    sorted,
                ),
                QuantForm::Mxfp4 => crate::mlx_c::gather_qmm_unbiased(
                    x,
                    &self.weight,
                    &q.scales,
                    indices,
                    (q.group_size, q.bits),
                    q.form.mode(),
                    sorted,
                ),
            },
        }
    }
}

/// mlx-lm's `MultiLinear` / `QuantizedMultiLinear` (`mla.py`): one weight
/// per head, [heads, out, in], applied to per-head inputs by a batched
/// matmul against the weight transposed (`x @ W.swapaxes(-1, -2)`) or as it
/// is stored (`x @ W`).
#[derive(Debug, Clone)]
pub struct MultiLinear {
    pub weight: Array,
    pub quant: Option<Quantized>,
}

/// Which side of a [`MultiLinear`]'s weight meets the input (its
/// `transpose=` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orientation {
    /// `transpose=True`: `x @ W.swapaxes(-1, -2)`, the input of width `in`.
    Transposed,
    /// `transpose=False`: `x @ W`, the input of width `out`.
    AsStored,
}

impl MultiLinear {
    pub fn forward(&self, x: &Array, orientation: Orientation) -> Result<Array> {
        let transpose = match orientation {
            Orientation::Transposed => true,
            Orientation::AsStored => false,
        };
        match (&self.quant, orientation) {
            (None, Orientation::Transposed) => x.matmul(self.weight.swap_axes(-1, -2)?),
            (None, Orientation::AsStored) => x.matmul(&self.weight),
            (Some(q), _) => quantized_product(x, &self.weight, q, transpose),
        }
    }
}

/// Final norm, head (tied embedding or lm_head) and optional tanh softcap
/// (every family: Qwen3 and Llama pass `None`).
pub fn logits(
    h: &Array,
    norm: &Array,
    head: Head<'_>,
    softcap: Option<f32>,
    eps: f32,
) -> Result<Array> {
    project_head(&final_norm(h, norm, eps)?, head, softcap)
}

/// The final norm of the last layer's output (every family's `self.norm(h)`
/// at the end of its trunk): the head's input, and an embedding's hidden state.
pub fn final_norm(h: &Array, norm: &Array, eps: f32) -> Result<Array> {
    crate::ops::rms_norm(h, Some(norm), eps)
}

/// The head over the normed final hidden state `h`, then the optional
/// compiled tanh softcap: what [`logits`] and `blocks::logits_scaled` run
/// after their norm.
pub fn project_head(h: &Array, head: Head<'_>, softcap: Option<f32>) -> Result<Array> {
    let out = match head {
        Head::Tied(e) => e.as_linear(h)?,
        // A head split over the vocabulary (qwen3_5's `shard()`) has its
        // logits gathered (`gather_last_axis`); a whole head's are as they are.
        Head::Untied(l) => crate::distributed::gather_vocab(l.forward(h)?)?,
    };
    match softcap {
        Some(c) => crate::ops::logit_softcap(c, &out),
        None => Ok(out),
    }
}

/// The output head: the tied embedding (`as_linear`) or an `lm_head`.
pub enum Head<'a> {
    Tied(&'a Embedding),
    Untied(&'a Linear),
}
