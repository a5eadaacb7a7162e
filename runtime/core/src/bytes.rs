//! Raw bytes of arrays: what "bit-exact" compares.

use mlx_rs::{Array, Dtype};

/// The little-endian bytes of `array` in its own dtype, row-major. Evaluates
/// the array and makes it contiguous first; never casts.
pub fn array_bytes(array: &Array) -> Result<Vec<u8>, mlx_rs::error::Exception> {
    let a = array.contiguous()?;
    a.eval()?;
    fn le<T: mlx_rs::ArrayElement + Copy, const N: usize>(
        a: &Array,
        to: impl Fn(T) -> [u8; N],
    ) -> Result<Vec<u8>, mlx_rs::error::Exception> {
        let s = a
            .try_as_slice::<T>()
            .map_err(|e| mlx_rs::error::Exception::custom(e.to_string()))?;
        Ok(s.iter().flat_map(|&v| to(v)).collect())
    }
    if array.size() == 0 {
        return Ok(Vec::new());
    }
    match a.dtype() {
        Dtype::Bool => le::<bool, 1>(&a, |v| [v as u8]),
        Dtype::Uint8 => le::<u8, 1>(&a, |v| [v]),
        Dtype::Uint16 => le::<u16, 2>(&a, u16::to_le_bytes),
        Dtype::Uint32 => le::<u32, 4>(&a, u32::to_le_bytes),
        Dtype::Uint64 => le::<u64, 8>(&a, u64::to_le_bytes),
        Dtype::Int8 => le::<i8, 1>(&a, i8::to_le_bytes),
        Dtype::Int16 => le::<i16, 2>(&a, i16::to_le_bytes),
        Dtype::Int32 => le::<i32, 4>(&a, i32::to_le_bytes),
        Dtype::Int64 => le::<i64, 8>(&a, i64::to_le_bytes),
        Dtype::Float16 => le::<half::f16, 2>(&a, |v| v.to_bits().to_le_bytes()),
        Dtype::Bfloat16 => le::<half::bf16, 2>(&a, |v| v.to_bits().to_le_bytes()),
        Dtype::Float32 => le::<f32, 4>(&a, |v| v.to_bits().to_le_bytes()),
        Dtype::Float64 => le::<f64, 8>(&a, |v| v.to_bits().to_le_bytes()),
        other => Err(mlx_rs::error::Exception::custom(format!(
            "array_bytes: unsupported dtype {other:?}"
        ))),
    }
}
