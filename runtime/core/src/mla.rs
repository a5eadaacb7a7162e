//! Multi-head latent attention (mlx-lm 0.32.2's `DeepseekV3Attention`), op
//! for op as mlx-lm runs it:
//!
//! ```text
//! q = q_proj(x)  or  q_b_proj(q_a_layernorm(q_a_proj(x)))
//! q_nope, q_pe = split(q [B, H, L, nope + rope], [nope])
//! kv_latent, k_pe = split(kv_a_proj_with_mqa(x), [rank])
//! kv_latent = kv_a_layernorm(kv_latent)[:, None]       [B, 1, L, rank]
//! q_pe, k_pe = rope(q_pe, offset), rope(k_pe, offset)
//! kv_latent, k_pe = cache.update_and_fetch(kv_latent, k_pe)
//! pe_scores = (q_pe * scale) @ k_pe^T, finfo.min where the mask is false
//! L == 1:  out = unembed_out(sdpa(embed_q(q_nope), kv_latent, kv_latent, mask=pe_scores))
//! L > 1:   out = sdpa(q_nope, kv_latent @ embed_q.W, unembed_out(kv_latent), mask=pe_scores)
//! o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))
//! ```
//!
//! The cache is mlx-lm's plain `KVCache` holding the normed latent (as keys,
//! one head) and the rotated `k_pe` (as values): a decode step attends over
//! the latent itself with the queries absorbed into it (`embed_q`), a prefill
//! expands the latent into per-head keys and values. Both q/kv norms use
//! eps 1e-6 whatever `rms_norm_eps` is (the module hard-codes it).

use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::ops::indexing::{Ellipsis, TryIndexOp};
use mlx_rs::Array;

use crate::attention::{causal_mask, finfo_min};
use crate::cache::LayerCache;
use crate::layers::{pretranspose_all, Linear, MultiLinear, Orientation};
use crate::ops::{multiply_weak, rms_norm, Result};
use crate::rope::Rope;
use crate::weights::Weights;

/// The eps of `q_a_layernorm` and `kv_a_layernorm` (`nn.RMSNorm(..., eps=1e-6)`).
const LATENT_NORM_EPS: f32 = 1e-6;

/// The sizes of one latent attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatentShape {
    /// `num_attention_heads`.
    pub heads: i32,
    /// `qk_nope_head_dim`: the query/key dims without RoPE.
    pub nope_dim: i32,
    /// `qk_rope_head_dim`: the rotated dims, one key head shared by all.
    pub rope_dim: i32,
    /// `v_head_dim`.
    pub v_dim: i32,
    /// `kv_lora_rank`: the latent's width.
    pub kv_lora_rank: i32,
    /// The module's `scale` as the Python float it is
    /// (`q_head_dim ** -0.5`, times the YaRN `mscale_all_dim` correction
    /// squared where that applies).
    pub scale: f64,
}

/// How the queries are projected.
#[derive(Debug)]
pub enum QueryProjection {
    /// `q_lora_rank: null`: one `q_proj`.
    Direct { q_proj: Linear },
    /// `q_b_proj(q_a_layernorm(q_a_proj(x)))`.
    LowRank {
        q_a_proj: Linear,
        q_a_layernorm: Array,
        q_b_proj: Linear,
    },
}

/// One latent attention layer's weights (`layers.{i}.self_attn`).
#[derive(Debug)]
pub struct LatentAttention {
    pub query: QueryProjection,
    /// `[rank + rope, hidden]`: the latent and the shared RoPE key.
    pub kv_a_proj_with_mqa: Linear,
    pub kv_a_layernorm: Array,
    /// `[H, rank, nope]`: `kv_b_proj`'s key half, transposed.
    pub embed_q: MultiLinear,
    /// `[H, v, rank]`: `kv_b_proj`'s value half.
    pub unembed_out: MultiLinear,
    pub o_proj: Linear,
}

impl LatentAttention {
    /// Pretransposes the unquantized `nn.Linear` projections (same bits).
    pub fn pretranspose(&mut self) {
        match &mut self.query {
            QueryProjection::Direct { q_proj } => q_proj.pretranspose(),
            QueryProjection::LowRank {
                q_a_proj, q_b_proj, ..
            } => pretranspose_all([q_a_proj, q_b_proj]),
        }
        pretranspose_all([&mut self.kv_a_proj_with_mqa, &mut self.o_proj]);
    }
}

/// `{prefix}` (e.g. `model.layers.3.self_attn`), with `q_lora_rank` (None:
/// one `q_proj`).
pub fn load_latent_attention(
    w: &mut Weights,
    prefix: &str,
    hidden: i32,
    q_lora_rank: Option<i32>,
    s: &LatentShape,
) -> LatentAttention {
    let q_width = s.heads * (s.nope_dim + s.rope_dim);
    let query = match q_lora_rank {
        None => QueryProjection::Direct {
            q_proj: w.linear(&format!("{prefix}.q_proj"), q_width, hidden),
        },
        Some(rank) => QueryProjection::LowRank {
            q_a_proj: w.linear(&format!("{prefix}.q_a_proj"), rank, hidden),
            q_a_layernorm: w.param(&format!("{prefix}.q_a_layernorm.weight"), &[rank]),
            q_b_proj: w.linear(&format!("{prefix}.q_b_proj"), q_width, rank),
        },
    };
    LatentAttention {
        query,
        kv_a_proj_with_mqa: w.linear(
            &format!("{prefix}.kv_a_proj_with_mqa"),
            s.kv_lora_rank + s.rope_dim,
            hidden,
        ),
        kv_a_layernorm: w.param(
            &format!("{prefix}.kv_a_layernorm.weight"),
            &[s.kv_lora_rank],
        ),
        embed_q: w.multi_linear(
            &format!("{prefix}.embed_q"),
            s.heads,
            s.kv_lora_rank,
            s.nope_dim,
        ),
        unembed_out: w.multi_linear(
            &format!("{prefix}.unembed_out"),
            s.heads,
            s.v_dim,
            s.kv_lora_rank,
        ),
        o_proj: w.linear(&format!("{prefix}.o_proj"), hidden, s.heads * s.v_dim),
    }
}

/// `DeepseekV3Attention.__call__(x, mask, cache)` for `x` [B, L, hidden] of
/// one sequence: the mask `create_attention_mask(h, cache,
/// return_array=True)` gives, from the cache before its update (a bool
/// array for more than one token, none for one).
pub fn latent_attention(
    x: &Array,
    w: &LatentAttention,
    s: &LatentShape,
    rope: &Rope,
    cache: &mut LayerCache,
) -> Result<Array> {
    let n = x.shape()[1];
    let offset = cache.offset();
    let mask = (n > 1).then(|| causal_mask(n, offset, None)).transpose()?;
    latent_attention_with(
        x,
        w,
        s,
        rope,
        &Array::from_int(offset),
        |k, v| cache.update_and_fetch(k, v),
        mask.as_ref(),
    )
}

/// The layer's math with the cache given as its RoPE offset (an int32
/// scalar, or one per row of a batch) and its `update_and_fetch`, and the
/// mask the model made for it (always an array in a batch).
pub fn latent_attention_with(
    x: &Array,
    w: &LatentAttention,
    s: &LatentShape,
    rope: &Rope,
    offset: &Array,
    update_and_fetch: impl FnOnce(&Array, &Array) -> Result<(Array, Array)>,
    mask: Option<&Array>,
) -> Result<Array> {
    let (b, l) = (x.shape()[0], x.shape()[1]);
    let q = match &w.query {
        QueryProjection::Direct { q_proj } => q_proj.forward(x)?,
        QueryProjection::LowRank {
            q_a_proj,
            q_a_layernorm,
            q_b_proj,
        } => q_b_proj.forward(&rms_norm(
            &q_a_proj.forward(x)?,
            Some(q_a_layernorm),
            LATENT_NORM_EPS,
        )?)?,
    };
    let q = q
        .reshape(&[b, l, s.heads, s.nope_dim + s.rope_dim])?
        .transpose_axes(&[0, 2, 1, 3])?;
    let q_nope = q.try_index((Ellipsis, ..s.nope_dim))?;
    let q_pe = q.try_index((Ellipsis, s.nope_dim..))?;
    let compressed_kv = w.kv_a_proj_with_mqa.forward(x)?;
    let latent = compressed_kv.try_index((Ellipsis, ..s.kv_lora_rank))?;
    let k_pe = compressed_kv
        .try_index((Ellipsis, s.kv_lora_rank..))?
        .reshape(&[b, l, 1, s.rope_dim])?
        .transpose_axes(&[0, 2, 1, 3])?;
    let kv_latent = rms_norm(&latent, Some(&w.kv_a_layernorm), LATENT_NORM_EPS)?;

    let q_pe = rope.apply(&q_pe, offset)?;
    let k_pe = rope.apply(&k_pe, offset)?;
    let kv_latent = kv_latent.expand_dims(1)?;
    let (kv_latent, k_pe) = update_and_fetch(&kv_latent, &k_pe)?;

    let pe_scores = pe_scores(&q_pe, &k_pe, s.scale, mask)?;
    let out = attend_latent(&q_nope, &kv_latent, &pe_scores, w, s.scale, l)?;
    w.o_proj
        .forward(&out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
}

/// `(q_pe * scale) @ k_pe.swapaxes(-1, -2)`, then
/// `mx.where(mask, pe_scores, mx.array(mx.finfo(dtype).min, dtype))` where
/// there is a mask: the additive float mask the SDPA receives.
fn pe_scores(q_pe: &Array, k_pe: &Array, scale: f64, mask: Option<&Array>) -> Result<Array> {
    let scores = multiply_weak(q_pe, scale)?.matmul(k_pe.swap_axes(-1, -2)?)?;
    match mask {
        None => Ok(scores),
        Some(m) => {
            let dtype = scores.dtype();
            let min = Array::from_f32(finfo_min(dtype) as f32).as_dtype(dtype)?;
            mlx_rs::ops::select(m, &scores, &min)
        }
    }
}

/// The attention itself: one token attends over the latent with its query
/// absorbed (`embed_q`) and unembeds the result; more tokens attend over
/// the latent expanded into per-head keys (`kv_latent @ embed_q.W`) and
/// values (`unembed_out(kv_latent)`). [B, H, L, v_dim].
fn attend_latent(
    q_nope: &Array,
    kv_latent: &Array,
    pe_scores: &Array,
    w: &LatentAttention,
    scale: f64,
    l: i32,
) -> Result<Array> {
    let sdpa = |q: &Array, k: &Array, v: &Array| {
        mlx_rs::fast::scaled_dot_product_attention(
            q,
            k,
            v,
            scale as f32,
            ScaledDotProductAttentionMask::Array(pe_scores),
            None,
        )
    };
    if l == 1 {
        let q = w.embed_q.forward(q_nope, Orientation::Transposed)?;
        let out = sdpa(&q, kv_latent, kv_latent)?;
        w.unembed_out.forward(&out, Orientation::Transposed)
    } else {
        let k = w.embed_q.forward(kv_latent, Orientation::AsStored)?;
        let v = w.unembed_out.forward(kv_latent, Orientation::Transposed)?;
        sdpa(q_nope, &k, &v)
    }
}
