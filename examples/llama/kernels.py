"""The Pallas kernels the NNX Llama port calls with `kernel="pallas"`, where the torch side calls
its reference op (SDPA, an RMSNorm of torch ops), as a team moving to TPU writes them:

- `flash_attention`: jax's shipped flash attention, forward and backward Pallas kernels (its
  `custom_vjp`): on a TPU `pallas.ops.tpu.flash_attention`, on a GPU `pallas.ops.gpu.attention.mha`
  (Triton), on the CPU that same GPU kernel in Pallas's interpret mode. The TPU kernel runs on the
  CPU only with TPU interpret mode set for the whole process (its backward is traced outside any
  `force_tpu_interpret_mode` block), which then refuses the GPU kernels' interpret mode, and takes
  ~1.4 s a forward and backward where the interpreted GPU kernel takes ~3 ms: the gallery does not
  run it there. Neither accepts float64 (their index arithmetic mixes int32 and int64 under
  `jax_enable_x64`).
- `rms_norm`: an own fused RMSNorm, one Pallas kernel forward and one backward (rows in blocks,
  float32 inside whatever the input's dtype), which accepts float64.

The mis-ports a kernel port makes, each inside the kernel or its call, for the gallery's failing
twins: `flash_attention_unscaled` (the kernel's own default softmax scale, 1.0, where SDPA's is
1/sqrt(head_dim)), `flash_attention_block_ahead` (an own flash kernel whose causal mask lets each
query see one key block ahead) and `rms_norm_eps_outside` (epsilon added to the root, not under it:
a difference of about epsilon/2 that only float64 resolves).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.gpu import attention as gpu_attention

ROWS = 16  # rms_norm's rows a block (fewer when the rows do not divide)


def _interpret() -> bool:
    return jax.default_backend() == "cpu"


def flash_attention(q, k, v, scale: float):
    """Causal attention of q, k, v (B, T, H, hd) -> (B, T, H, hd) by jax's flash kernels."""
    if jax.default_backend() == "tpu":
        from jax.experimental.pallas.ops.tpu import flash_attention as tpu_attention

        heads_first = [x.transpose(0, 2, 1, 3) for x in (q, k, v)]
        out = tpu_attention.flash_attention(*heads_first, causal=True, sm_scale=scale)
        return out.transpose(0, 2, 1, 3)
    return gpu_attention.mha(q, k, v, None, sm_scale=scale, causal=True, interpret=_interpret())


def flash_attention_unscaled(q, k, v, scale: float):
    """The mis-port: the kernel called without its scale (jax's mha defaults to 1.0)."""
    del scale
    return gpu_attention.mha(q, k, v, None, causal=True, interpret=_interpret())


def _block_ahead_kernel(q_ref, k_ref, v_ref, o_ref, *, scale, block):
    """One query block of an own flash forward: online softmax over the key blocks, with the
    mis-port's causal mask (a query sees keys up to one block past its own position)."""
    i = pl.program_id(2)
    q = q_ref[...].astype(jnp.float32) * scale  # (block, hd)
    n_keys = k_ref.shape[0]
    rows = i * block + jnp.arange(block)[:, None]

    def step(j, carry):
        m, total, acc = carry
        k = k_ref[pl.ds(j * block, block), :].astype(jnp.float32)
        v = v_ref[pl.ds(j * block, block), :].astype(jnp.float32)
        s = q @ k.T
        cols = j * block + jnp.arange(block)[None, :]
        s = jnp.where(cols <= rows + block, s, -jnp.inf)  # the bug: "+ block"
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[:, None])
        correction = jnp.exp(m - m_new)
        return m_new, total * correction + p.sum(-1), acc * correction[:, None] + p @ v

    start = (
        jnp.full((block,), -jnp.inf, jnp.float32),
        jnp.zeros((block,), jnp.float32),
        jnp.zeros(q.shape, jnp.float32),
    )
    _, total, acc = jax.lax.fori_loop(0, n_keys // block, step, start)
    o_ref[...] = (acc / total[:, None]).astype(o_ref.dtype)


def _block_ahead_reference(q, k, v, scale, block):
    t = q.shape[1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    allowed = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None] + block
    p = jax.nn.softmax(jnp.where(allowed, s, -jnp.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32)).astype(q.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def flash_attention_block_ahead(q, k, v, scale: float):
    """The mis-port: an own flash forward whose causal mask is one key block ahead (its backward
    the reference's gradient of the same mask)."""
    b, t, h, hd = q.shape
    block = min(32, t)
    spec = pl.BlockSpec((None, block, None, hd), lambda bi, hi, i: (bi, i, hi, 0))
    whole = pl.BlockSpec((None, t, None, hd), lambda bi, hi, i: (bi, 0, hi, 0))
    return pl.pallas_call(
        functools.partial(_block_ahead_kernel, scale=scale, block=block),
        grid=(b, h, t // block),
        in_specs=[spec, whole, whole],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=_interpret(),
    )(q, k, v)


def _block_ahead_fwd(q, k, v, scale):
    return flash_attention_block_ahead(q, k, v, scale), (q, k, v)


def _block_ahead_bwd(scale, saved, grad):
    q, k, v = saved
    block = min(32, q.shape[1])
    _, vjp = jax.vjp(lambda *a: _block_ahead_reference(*a, scale, block), q, k, v)
    return vjp(grad)


flash_attention_block_ahead.defvjp(_block_ahead_fwd, _block_ahead_bwd)


def _rows_spec(block: int, width: int) -> pl.BlockSpec:
    return pl.BlockSpec((block, width), lambda i: (i, 0))


def _wide(x):
    """float32 inside for bfloat16 and float32, float64 for float64."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _rms_forward_kernel(x_ref, w_ref, o_ref, r_ref, *, eps, eps_outside):
    x = _wide(x_ref[...])
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    inv = 1.0 / (jnp.sqrt(ms) + eps) if eps_outside else jax.lax.rsqrt(ms + eps)
    o_ref[...] = ((x * inv).astype(o_ref.dtype) * w_ref[...]).astype(o_ref.dtype)
    r_ref[...] = inv


def _rms_backward_kernel(x_ref, w_ref, r_ref, g_ref, dx_ref, dw_ref):
    x, inv = _wide(x_ref[...]), r_ref[...]
    gw = _wide(g_ref[...]) * _wide(w_ref[...])
    # d(x * inv) with inv = (mean(x^2) + eps)^-1/2: inv * (g - x * inv^2 * mean(g * x))
    mean_gx = jnp.mean(gw * x, axis=-1, keepdims=True)
    dx_ref[...] = (inv * (gw - x * inv * inv * mean_gx)).astype(dx_ref.dtype)
    dw_ref[...] = (_wide(g_ref[...]) * x * inv).astype(dw_ref.dtype)


def _rms_call(x2, w, eps, eps_outside):
    n, d = x2.shape
    block = ROWS if n % ROWS == 0 else math.gcd(n, ROWS)
    return pl.pallas_call(
        functools.partial(_rms_forward_kernel, eps=eps, eps_outside=eps_outside),
        grid=(n // block,),
        in_specs=[_rows_spec(block, d), pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=[_rows_spec(block, d), _rows_spec(block, 1)],
        out_shape=[
            jax.ShapeDtypeStruct((n, d), x2.dtype),
            jax.ShapeDtypeStruct((n, 1), jnp.promote_types(x2.dtype, jnp.float32)),
        ],
        interpret=_interpret(),
    )(x2, w.reshape(1, d).astype(x2.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rms_norm(x, w, eps: float, eps_outside: bool):
    out, _ = _rms_call(x.reshape(-1, x.shape[-1]), w, eps, eps_outside)
    return out.reshape(x.shape)


def _rms_fwd(x, w, eps, eps_outside):
    out, inv = _rms_call(x.reshape(-1, x.shape[-1]), w, eps, eps_outside)
    return out.reshape(x.shape), (x, w, inv)


def _rms_bwd(eps, eps_outside, saved, grad):
    x, w, inv = saved
    d = x.shape[-1]
    x2, g2 = x.reshape(-1, d), grad.reshape(-1, d)
    n = x2.shape[0]
    block = ROWS if n % ROWS == 0 else math.gcd(n, ROWS)
    dx, dw_rows = pl.pallas_call(
        _rms_backward_kernel,
        grid=(n // block,),
        in_specs=[
            _rows_spec(block, d),
            pl.BlockSpec((1, d), lambda i: (0, 0)),
            _rows_spec(block, 1),
            _rows_spec(block, d),
        ],
        out_specs=[_rows_spec(block, d), _rows_spec(block, d)],
        out_shape=[
            jax.ShapeDtypeStruct((n, d), x.dtype),
            jax.ShapeDtypeStruct((n, d), jnp.promote_types(x.dtype, jnp.float32)),
        ],
        interpret=_interpret(),
    )(x2, w.reshape(1, d), inv, g2)
    # eps_outside's backward is the correct one's: the forward alone is mis-ported
    return dx.reshape(x.shape), dw_rows.sum(0).astype(w.dtype)


_rms_norm.defvjp(_rms_fwd, _rms_bwd)


def rms_norm(x, weight, eps: float):
    """RMSNorm over the last axis by the fused kernel: x * rsqrt(mean(x^2) + eps) * weight."""
    return _rms_norm(x, weight, eps, False)


def rms_norm_eps_outside(x, weight, eps: float):
    """The mis-port: x / (sqrt(mean(x^2)) + eps) * weight."""
    return _rms_norm(x, weight, eps, True)


ATTENTION = {
    "pallas": flash_attention,
    "pallas-unscaled": flash_attention_unscaled,
    "pallas-block-ahead": flash_attention_block_ahead,
}
NORM = {"pallas": rms_norm, "pallas-eps-outside": rms_norm_eps_outside}
