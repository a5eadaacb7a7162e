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
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    mlx_rs::fast::rms_norm(x, weight, eps)
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

thread_local! {
    static GELU: std::cell::RefCell<Compiled1> =
        std::cell::RefCell::new(Box::new(mlx_rs::transforms::compile::compile(gelu_approx, true)));
}

/// `nn.gelu_approx`, which mlx compiles (`shapeless=True`).
pub fn gelu_approx_compiled(x: &Array) -> Result<Array> {
    GELU.with(|f| (f.borrow_mut())(x))
}
