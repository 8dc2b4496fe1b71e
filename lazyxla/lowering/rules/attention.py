"""Rules for fused scaled dot-product attention.

lazyxla's kernel for ``F.scaled_dot_product_attention`` (in ``frontend/kernels.py``) calls PyTorch's "overrideable"
fused attention op when there is no dropout and no grouped-query broadcast, so attention arrives here as
one op (and its backward as one op) instead of PyTorch's ~20-op math decomposition. Half-precision
inputs are computed in float32, as PyTorch's CPU kernel accumulates.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from lazyxla.device.devices import np_dtype
from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc, vjp

aten = torch.ops.aten


def _attention(q, k, v, bias, is_causal, scale):
    """Softmax(q k^T * scale + mask) v and the row log-sum-exp, in q's accumulate type.

    A query that may attend to nothing (its row is all -inf: a padding position under a padding mask) gets
    zeros and a zero gradient, as PyTorch's kernels and its math path (``_safe_softmax``) give, not NaN.
    """
    q, k, v = acc(q), acc(k), acc(v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = jnp.einsum("...qd,...kd->...qk", q, k) * jnp.asarray(scale, q.dtype)
    if is_causal:
        keep = jnp.tril(jnp.ones(s.shape[-2:], bool))
        s = jnp.where(keep, s, -jnp.inf)
    if bias is not None:
        s = s + acc(bias).astype(s.dtype)
    dead = jnp.all(s == -jnp.inf, axis=-1, keepdims=True)
    s = jnp.where(dead, 0, s)  # finite in dead rows, so that neither the value nor the gradient is NaN there
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.where(dead, 0, jnp.exp(s - lse[..., None]))
    return jnp.einsum("...qk,...kd->...qd", p, v), jnp.where(dead[..., 0], -jnp.inf, lse)


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
    mask = (*grad_input_mask[:3], grad_input_mask[3] and bias is not None)
    grads = vjp(
        lambda q, k, v, b: _attention(q, k, v, b, is_causal, scale)[0],
        (acc(q), acc(k), acc(v), None if bias is None else acc(bias)),
        acc(g),
        mask,
    )
    return tuple(
        grad if grad is not None else jnp.zeros(aval.shape, np_dtype(aval.dtype))
        for grad, aval in zip(grads, ctx.avals)
    )
