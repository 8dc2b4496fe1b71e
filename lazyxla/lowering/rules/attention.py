"""Rules for fused scaled dot-product attention.

lazyxla's kernel for ``F.scaled_dot_product_attention`` (in ``frontend/kernels.py``) calls PyTorch's "overrideable"
fused attention op when there is no dropout and no grouped-query broadcast, so attention arrives here as
one op (and its backward as one op) instead of PyTorch's ~20-op math decomposition. Half-precision
inputs are computed in float32, as PyTorch's CPU kernel accumulates.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from lazyxla.device.devices import np_dtype
from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc

aten = torch.ops.aten


def _scores(q, k, bias, is_causal, scale):
    """``q k^T * scale``, -inf above the diagonal when ``is_causal``, plus ``bias``: the attention logits."""
    s = jnp.einsum("...qd,...kd->...qk", q, k) * jnp.asarray(scale, q.dtype)
    if is_causal:
        rows, cols = (lax.broadcasted_iota(jnp.int32, s.shape[-2:], d) for d in (0, 1))
        s = lax.select(jnp.broadcast_to(rows >= cols, s.shape), s, jnp.full(s.shape, -jnp.inf, s.dtype))
    if bias is not None:
        s = s + acc(bias).astype(s.dtype)
    return s


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _rows(x, shape):
    """Per-row values ``x`` (the logits' shape without its last dimension) broadcast along the rows."""
    return lax.broadcast_in_dim(x, shape, tuple(range(x.ndim)))


def _attention(q, k, v, bias, is_causal, scale):
    """Softmax(q k^T * scale + mask) v and the row log-sum-exp, in q's accumulate type, normalized after the
    product as flash attention does.

    A query that may attend to nothing (its row is all -inf: a padding position under a padding mask) gets
    zeros, log-sum-exp -inf and a zero gradient, as PyTorch's kernels and its math path (``_safe_softmax``) give,
    not NaN: its row maximum is taken as the lowest finite number, so that its exponentials are 0, and its sum
    of them as 1.
    """
    q, k, v = acc(q), acc(k), acc(v)
    s = _scores(q, k, bias, is_causal, _scale(q, scale))
    m = jnp.maximum(s.max(-1, initial=None if s.shape[-1] else -jnp.inf), jnp.finfo(s.dtype).min)  # (no keys: -inf)
    e = jnp.exp(s - _rows(m, s.shape))
    total = e.sum(-1)
    out = jnp.einsum("...qk,...kd->...qd", e, v)
    return out / _rows(jnp.maximum(total, 1), out.shape), m + jnp.log(total)


def _sum_to(x, shape):
    """``x`` summed over the dimensions a tensor of ``shape`` was broadcast along to ``x``'s shape."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    return x.sum(axes, keepdims=True).reshape(shape) if axes else x


def _attention_grads(g, q, k, v, bias, out, lse, is_causal, scale):
    """Gradients of ``_attention``'s output for its cotangent ``g`` (q, k, v, bias), from the forward's output and
    row log-sum-exp, as flash attention's backward computes them: ``p = exp(s - lse)`` again, then
    ``ds = p * (g v^T - rowsum(g * out))``. No second softmax (the vjp of the forward had its max, sums, selects
    and their transposes: 62 StableHLO lines per call in the GPT benchmark against 30 here)."""
    q, k, v, g, out = acc(q), acc(k), acc(v), acc(g), acc(out)
    scale = _scale(q, scale)
    s = _scores(q, k, bias, is_causal, scale)
    # a row that attends to nothing has lse -inf: +inf there makes every exp(s - lse) 0 (s is finite or -inf)
    lse = jnp.where(lse == -jnp.inf, jnp.inf, lse.astype(s.dtype))
    p = jnp.exp(s - _rows(lse, s.shape))
    dv = jnp.einsum("...qk,...qd->...kd", p, g)
    dp = jnp.einsum("...qd,...kd->...qk", g, v)
    ds = p * (dp - _rows(jnp.sum(g * out, axis=-1), dp.shape))
    dq = jnp.einsum("...qk,...kd->...qd", ds, k) * jnp.asarray(scale, q.dtype)
    dk = jnp.einsum("...qk,...qd->...kd", ds, q) * jnp.asarray(scale, q.dtype)
    return dq, dk, dv, None if bias is None else _sum_to(ds, bias.shape)


@lowers(aten._scaled_dot_product_fused_attention_overrideable.default)
def _sdpa(ctx, q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    if dropout_p:
        raise NotImplementedError("fused attention with dropout: lazyxla routes it to the math path")
    out, lse = _attention(q, k, v, attn_bias, is_causal, scale)
    # the rest (PyTorch's dropout seed and offset) are placeholders: dropout takes the math path
    return (out, lse, *(jnp.zeros(a.shape, np_dtype(a.dtype)) for a in ctx.avals[2:]))


@lowers(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def _sdpa_backward(
    ctx, g, q, k, v, attn_bias, grad_input_mask, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal,
    philox_seed, philox_offset, *, scale=None,
):  # fmt: skip
    bias = attn_bias if attn_bias is not None and attn_bias.size else None
    grads = _attention_grads(g, q, k, v, bias, out, lse, is_causal, scale)
    mask = (*grad_input_mask[:3], grad_input_mask[3] and bias is not None)
    return tuple(
        grad if grad is not None and wanted else jnp.zeros(aval.shape, np_dtype(aval.dtype))
        for grad, wanted, aval in zip(grads, mask, ctx.avals)
    )
