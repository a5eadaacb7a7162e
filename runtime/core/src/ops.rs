//! Small op helpers that reproduce how mlx's Python front end builds graphs.

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

pub type Result<T> = std::result::Result<T, Exception>;

/// A Python float scalar as mlx-python sees it next to `like`: weakly typed,
/// so it takes `like`'s floating dtype (rounded float64 -> float32 -> dtype,
/// the way mlx's `to_array` does). E.g. sqrt(2560) next to bf16 is 50.5.
pub fn scalar_like(value: f64, like: &Array) -> Array {
    let v = value as f32;
    match like.dtype() {
        Dtype::Bfloat16 => Array::from_slice(&[half::bf16::from_f32(v)], &[]),
        Dtype::Float16 => Array::from_slice(&[half::f16::from_f32(v)], &[]),
        _ => Array::from_f32(v),
    }
}

/// `mlx.nn.gelu_approx` as Python mlx composes it, op for op:
/// `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))`, each Python
/// float a weak scalar and `x**3` a `power` op (not `x*x*x`: different bits).
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let s = |v: f64| scalar_like(v, x);
    let half_x = s(0.5).multiply(x)?;
    let cube = x.power(s(3.0))?;
    let inner = x.add(s(0.044715).multiply(&cube)?)?;
    let t = mlx_rs::ops::tanh(s((2.0 / std::f64::consts::PI).sqrt()).multiply(&inner)?)?;
    half_x.multiply(s(1.0).add(&t)?)
}

/// `mx.fast.rms_norm`; `weight: None` is mlx-lm's `RMSNormNoScale`.
///
/// Inside a [`NormInputs`] scope (the compiled decode blocks, see `decode`)
/// a norm whose eps and width the scope provides runs as
/// [`rms_norm_fallback`] with those arrays, the same ops with eps and the
/// mean's normalizer as inputs instead of constants.
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    let width = x.shape().last().copied().unwrap_or(0);
    let scoped = NORM_INPUTS.with(|cell| {
        let scope = cell.borrow();
        let scope = scope.as_ref()?;
        let found = scope.find(eps, width, x.dtype(), weight.map(Array::dtype));
        if found.is_none() {
            scope.missed.set(true);
        }
        found
    });
    match scoped {
        Some((eps, inv_n)) => rms_norm_fallback(x, weight, &eps, &inv_n),
        None => mlx_rs::fast::rms_norm(x, weight, eps),
    }
}

/// The result dtype of a floating binary op, as MLX promotes (bfloat16 with
/// float16 gives float32); `None` outside float16 / bfloat16 / float32.
fn promote_float(a: Dtype, b: Dtype) -> Option<Dtype> {
    use Dtype::{Bfloat16, Float16, Float32};
    match (a, b) {
        (Float32 | Float16 | Bfloat16, _) if a == b => Some(a),
        (Float32, Float16 | Bfloat16) | (Float16 | Bfloat16, Float32) => Some(Float32),
        (Float16, Bfloat16) | (Bfloat16, Float16) => Some(Float32),
        _ => None,
    }
}

/// What `mx.fast.rms_norm` runs on the CPU (MLX's RMSNorm fallback in
/// `fast.cpp`), op for op: `astype(x, f32)`, `mean(square(x), -1, keepdims)`
/// (= `sum(...) * (1/n)`, float32), `+ eps`, `rsqrt`, `x * that`, `astype`
/// to `result_type(x, weight)`, `* astype(weight, that type)`. `eps` and
/// `inv_n` (= float32(1/n), n the last dim) are float32 scalar arrays.
pub fn rms_norm_fallback(
    x: &Array,
    weight: Option<&Array>,
    eps: &Array,
    inv_n: &Array,
) -> Result<Array> {
    let out_type = match weight {
        Some(w) => promote_float(x.dtype(), w.dtype())
            .ok_or_else(|| Exception::custom("rms_norm_fallback: unsupported dtypes"))?,
        None => x.dtype(),
    };
    let x32 = x.as_dtype(Dtype::Float32)?;
    let mean = x32.square()?.sum_axis(-1, true)?.multiply(inv_n)?;
    let y = x32.multiply(mean.add(eps)?.rsqrt()?)?.as_dtype(out_type)?;
    match weight {
        Some(w) => y.multiply(w.as_dtype(out_type)?),
        None => Ok(y),
    }
}

/// eps and mean normalizers for the norms inside one compiled block.
pub struct NormInputs {
    eps: Vec<(u32, Array)>,
    inv_n: Vec<(i32, Array)>,
    /// Set when a norm inside the scope found no inputs and ran as
    /// `fast::rms_norm`, whose constants a compiled trace would inline.
    missed: std::cell::Cell<bool>,
}

impl NormInputs {
    /// The float32 scalars for each distinct `eps` and for each distinct
    /// width in `widths`.
    pub fn new(eps: &[f32], widths: &[i32]) -> Self {
        let mut distinct_eps: Vec<(u32, Array)> = Vec::with_capacity(eps.len());
        for &e in eps {
            if !distinct_eps.iter().any(|(k, _)| *k == e.to_bits()) {
                distinct_eps.push((e.to_bits(), f32_constant(e)));
            }
        }
        let mut inv_n: Vec<(i32, Array)> = Vec::with_capacity(widths.len());
        for &n in widths {
            if !inv_n.iter().any(|(k, _)| *k == n) {
                inv_n.push((n, f32_constant(1.0 / n as f32)));
            }
        }
        NormInputs {
            eps: distinct_eps,
            inv_n,
            missed: std::cell::Cell::new(false),
        }
    }

    /// The arrays, in order: every eps, then every normalizer.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.eps
            .iter()
            .map(|(_, a)| a)
            .chain(self.inv_n.iter().map(|(_, a)| a))
    }

    /// The same keys with the arrays taken from `it` (the traced inputs).
    pub fn with_arrays(&self, it: &mut std::slice::Iter<'_, Array>) -> Option<Self> {
        let mut take = || it.next().cloned();
        let eps = self
            .eps
            .iter()
            .map(|(k, _)| Some((*k, take()?)))
            .collect::<Option<Vec<_>>>()?;
        let inv_n = self
            .inv_n
            .iter()
            .map(|(k, _)| Some((*k, take()?)))
            .collect::<Option<Vec<_>>>()?;
        Some(NormInputs {
            eps,
            inv_n,
            missed: std::cell::Cell::new(false),
        })
    }

    fn find(
        &self,
        eps: f32,
        width: i32,
        x: Dtype,
        weight: Option<Dtype>,
    ) -> Option<(Array, Array)> {
        if let Some(w) = weight {
            promote_float(x, w)?;
        }
        let e = self.eps.iter().find(|(k, _)| *k == eps.to_bits())?;
        let n = self.inv_n.iter().find(|(k, _)| *k == width)?;
        Some((e.1.clone(), n.1.clone()))
    }

    /// Runs `f` with `rms_norm` taking its eps and normalizers from `self`;
    /// returns `f`'s result and whether every norm found them.
    pub fn scope<T>(self, f: impl FnOnce() -> T) -> (T, bool) {
        NORM_INPUTS.with(|cell| *cell.borrow_mut() = Some(self));
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                NORM_INPUTS.with(|cell| *cell.borrow_mut() = None);
            }
        }
        let reset = Reset;
        let out = f();
        let missed =
            NORM_INPUTS.with(|cell| cell.borrow().as_ref().is_some_and(|s| s.missed.get()));
        drop(reset);
        (out, !missed)
    }
}

/// A float32 scalar holding `v`, made once per thread: the norms' eps and
/// normalizers (and other float constants, e.g. the Gated DeltaNet q/k scales)
/// are traced inputs of compiled decode blocks, for every
/// layer on every step, and making them afresh each time was host work.
/// The held reference keeps MLX from donating the buffer.
pub fn f32_constant(v: f32) -> Array {
    thread_local! {
        static CONSTANTS: std::cell::RefCell<Vec<(u32, Array)>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    CONSTANTS.with(|cell| {
        let mut made = cell.borrow_mut();
        if let Some((_, a)) = made.iter().find(|(k, _)| *k == v.to_bits()) {
            return a.clone();
        }
        let a = Array::from_f32(v);
        made.push((v.to_bits(), a.clone()));
        a
    })
}

thread_local! {
    static NORM_INPUTS: std::cell::RefCell<Option<NormInputs>> = const { std::cell::RefCell::new(None) };
}

type Compiled2 = Box<dyn for<'a> FnMut((&'a Array, &'a Array)) -> Result<Array>>;
type Compiled1 = Box<dyn for<'a> FnMut(&'a Array) -> Result<Array>>;

fn geglu_graph((gate, x): (&Array, &Array)) -> Result<Array> {
    gelu_approx(gate)?.multiply(x)
}

thread_local! {
    // mlx-lm compiles these with `shapeless=True`; keep one compiled
    // function per thread so MLX's compile cache is hit on every call.
    static GEGLU: std::cell::RefCell<Compiled2> =
        std::cell::RefCell::new(Box::new(mlx_rs::transforms::compile::compile(geglu_graph, true)));
    static SOFTCAP: std::cell::RefCell<Vec<(u32, Compiled1)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// mlx-lm's compiled `geglu(gate, x) = gelu_approx(gate) * x`.
pub fn geglu(gate: &Array, x: &Array) -> Result<Array> {
    GEGLU.with(|f| (f.borrow_mut())((gate, x)))
}

/// mlx-lm's compiled `logit_softcap(softcap, x) = tanh(x / softcap) * softcap`;
/// `softcap` is a Python float constant baked into the compiled graph.
pub fn logit_softcap(softcap: f32, x: &Array) -> Result<Array> {
    SOFTCAP.with(|cell| {
        let mut table = cell.borrow_mut();
        let key = softcap.to_bits();
        let at = match table.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                let graph = move |x: &Array| -> Result<Array> {
                    let c = scalar_like(softcap as f64, x);
                    mlx_rs::ops::tanh(x.divide(&c)?)?.multiply(&c)
                };
                table.push((
                    key,
                    Box::new(mlx_rs::transforms::compile::compile(graph, true)),
                ));
                table.len() - 1
            }
        };
        (table[at].1)(x)
    })
}

fn swiglu_graph((gate, x): (&Array, &Array)) -> Result<Array> {
    // nn.silu(gate) = gate * sigmoid(gate), itself compiled and inlined here.
    gate.multiply(mlx_rs::ops::sigmoid(gate)?)?.multiply(x)
}

thread_local! {
    static SWIGLU: std::cell::RefCell<Compiled2> =
        std::cell::RefCell::new(Box::new(mlx_rs::transforms::compile::compile(swiglu_graph, true)));
}

/// mlx-lm's compiled `swiglu(gate, x) = nn.silu(gate) * x` (`activations.py`).
pub fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    SWIGLU.with(|f| (f.borrow_mut())((gate, x)))
}

/// `swiglu_oai`'s default `alpha` and `limit` (gpt_oss's `SwigluOAI()`).
const SWIGLU_OAI_ALPHA: f64 = 1.702;
const SWIGLU_OAI_LIMIT: f64 = 7.0;

fn swiglu_oai_graph((gate, x): (&Array, &Array)) -> Result<Array> {
    // Each Python float meets an array as a weak scalar of its dtype.
    let limit = scalar_like(SWIGLU_OAI_LIMIT, gate);
    let gate = mlx_rs::ops::minimum(gate, &limit)?;
    // mx.clip(x, -limit, limit): maximum with the lower bound, then minimum
    // with the upper one.
    let x = mlx_rs::ops::maximum(x, scalar_like(-SWIGLU_OAI_LIMIT, x))?;
    let x = mlx_rs::ops::minimum(&x, scalar_like(SWIGLU_OAI_LIMIT, &x))?;
    let glu = gate.multiply(mlx_rs::ops::sigmoid(
        scalar_like(SWIGLU_OAI_ALPHA, &gate).multiply(&gate)?,
    )?)?;
    x.add(scalar_like(1.0, &x))?.multiply(&glu)
}

thread_local! {
    static SWIGLU_OAI: std::cell::RefCell<Compiled2> =
        std::cell::RefCell::new(Box::new(mlx_rs::transforms::compile::compile(swiglu_oai_graph, true)));
}

/// mlx-lm's compiled `swiglu_oai(gate, x)` (`activations.py`, shapeless)
/// with its default alpha 1.702 and limit 7.0: `gate` clipped from above,
/// `x` both ways, `(x + 1) * (gate * sigmoid(alpha * gate))`.
pub fn swiglu_oai(gate: &Array, x: &Array) -> Result<Array> {
    SWIGLU_OAI.with(|f| (f.borrow_mut())((gate, x)))
}

thread_local! {
    static GELU: std::cell::RefCell<Compiled1> =
        std::cell::RefCell::new(Box::new(mlx_rs::transforms::compile::compile(gelu_approx, true)));
}

/// `nn.gelu_approx`, which mlx compiles (`shapeless=True`).
pub fn gelu_approx_compiled(x: &Array) -> Result<Array> {
    GELU.with(|f| (f.borrow_mut())(x))
}

/// `x * c` for a Python float `c`: a weak scalar, rounded to `x`'s dtype
/// ([`scalar_like`]). gemma2's `h * (hidden_size**0.5)`, minicpm's
/// `embed * scale_emb` and `r * (scale_depth / num_hidden_layers**0.5)`;
/// the caller computes `c` in f64 as Python does.
pub fn multiply_weak(x: &Array, c: f64) -> Result<Array> {
    x.multiply(scalar_like(c, x))
}

/// `x / c` for a Python float `c` (a divide, not a multiply by `1 / c`:
/// different bits). minicpm's `out / (hidden_size / dim_model_base)`.
pub fn divide_weak(x: &Array, c: f64) -> Result<Array> {
    x.divide(scalar_like(c, x))
}

/// `tanh(x / cap) * cap`, run eagerly (gemma2's final logit softcap and its
/// score softcap), with `cap` a Python float: not [`logit_softcap`], which
/// mlx-lm compiles for Gemma-4.
pub fn softcap_eager(x: &Array, cap: f64) -> Result<Array> {
    let c = scalar_like(cap, x);
    mlx_rs::ops::tanh(x.divide(&c)?)?.multiply(&c)
}

/// `1.0 + weight` with the `1.0` a weak scalar (the sum in the weight's
/// dtype): gemma2's norm weight.
pub fn one_plus(weight: &Array) -> Result<Array> {
    scalar_like(1.0, weight).add(weight)
}

/// `down(nn.gelu_approx(gate(x)) * up(x))` as gemma2's MLP computes it on
/// the projections' outputs: `gelu_approx` compiled (shapeless) by mlx nn,
/// the multiply eager (unlike Gemma-4's compiled `geglu`).
pub fn gelu_approx_times(gate: &Array, up: &Array) -> Result<Array> {
    gelu_approx_compiled(gate)?.multiply(up)
}
