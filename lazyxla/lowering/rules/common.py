"""Helpers shared by the rule families: accumulate types, vjp-based backward rules, loss reductions."""

from __future__ import annotations

import jax
import jax.numpy as jnp

LOW = (jnp.float16, jnp.bfloat16)


def acc(x):
    """Half-precision floats are computed in float32 (PyTorch's accumulate type); the driver casts back."""
    return x.astype(jnp.float32) if x.dtype in LOW else x


def vjp(f, primals, g, mask):
    """Gradients of ``f`` w.r.t. the primals that ``mask`` asks for (None where absent or not asked)."""
    want = [i for i, p in enumerate(primals) if p is not None and mask[i]]

    def partial_f(*xs):
        full = list(primals)
        for i, v in zip(want, xs):
            full[i] = v
        return f(*full)

    if not want:
        return [None] * len(primals)
    out, pullback = jax.vjp(partial_f, *(primals[i] for i in want))
    grads = dict(zip(want, pullback(g.astype(out.dtype))))
    return [grads.get(i) for i in range(len(primals))]


def channel_shape(ndim: int) -> tuple[int, ...]:
    """The shape that broadcasts a per-channel vector against ``(N, C, *spatial)``."""
    return (1, -1) + (1,) * (ndim - 2)


def channel(v, ndim: int):
    """A per-channel vector shaped to broadcast against an ``(N, C, *spatial)`` array."""
    return v.reshape(channel_shape(ndim))


def reduce_loss(loss, reduction: int):
    """A loss op's reduction argument applied: 0 none, 1 mean, 2 sum."""
    return (loss, loss.mean(), loss.sum())[reduction]


def reduce_grad(g, n: int, reduction: int):
    """The incoming gradient of a reduced loss of ``n`` elements, per element."""
    return g / n if reduction == 1 else g
