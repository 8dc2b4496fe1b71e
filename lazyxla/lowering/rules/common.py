"""Helpers shared by the rule families: accumulate types, dims, vjp-based backward rules, norms, GELU, loss reductions.

A rule family module imports helpers from here, never from another family module.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

LOW = (jnp.float16, jnp.bfloat16)
_INF = float("inf")


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


def norm_dim(dim: int, ndim: int) -> int:
    """``dim`` in ``[0, ndim)``; a 0-d tensor takes dims 0 and -1."""
    return dim % max(ndim, 1)


def _pnorm(a, axes, p):
    return jnp.sum(a**p, axis=axes) ** (1 / p)


_NORMS = {
    _INF: lambda a, axes, p: jnp.max(a, axis=axes),
    -_INF: lambda a, axes, p: jnp.min(a, axis=axes),
    0: lambda a, axes, p: jnp.sum(a != 0, axis=axes, dtype=a.dtype),
    1: lambda a, axes, p: jnp.sum(a, axis=axes),
    2: lambda a, axes, p: jnp.sqrt(jnp.sum(a * a, axis=axes)),
}


def flat_draw(draw, key, shape, *args):
    """``draw(key, shape, *args)`` (a ``jax.random`` sampler of independent elements) drawn over the shape's
    element count, then reshaped.

    The values are the same (JAX's threefry, in its default partitionable form, counts elements by their flat
    index), but XLA compiles the 1-d draw several times faster: a (2, 3, 6, 7, 2) ``randn`` took 4.8 s to compile,
    its 504-element draw 0.8 s, and PyTorch's tests (``torch.randn(2, 3, 6, r, m)`` per case) compiled one per shape.

    Example::

        flat_draw(jax.random.normal, key, (2, 3, 4), jnp.float32)    # == jax.random.normal(key, (2, 3, 4), jnp.float32)
    """
    return draw(key, (math.prod(shape),), *args).reshape(shape)


def vector_norm(a, axes, p):
    """The ``p``-norm of the absolute values ``a`` over ``axes``: ``p`` a Python number (0, inf and -inf
    included) or a traced 0-d array (a float ord that is a graph input), then every norm it may name is
    computed and the one it names selected."""
    if not isinstance(p, jax.Array):
        return _NORMS.get(p, _pnorm)(a, axes, p)
    out = _pnorm(a, axes, p)
    for q in (2, 0, -_INF, _INF):
        out = jnp.where(p == q, _NORMS[q](a, axes, q), out)
    return out


def jax_gelu(x, approximate: str):
    """GELU, exact (``approximate="none"``) or with the tanh approximation, as PyTorch computes it."""
    if approximate == "tanh":
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return 0.5 * x * (1 + lax.erf(x * 0.7071067811865476))


def reduce_loss(loss, reduction: int):
    """A loss op's reduction argument applied: 0 none, 1 mean, 2 sum."""
    return (loss, loss.mean(), loss.sum())[reduction]


def reduce_grad(g, n: int, reduction: int):
    """The incoming gradient of a reduced loss of ``n`` elements, per element."""
    return g / n if reduction == 1 else g
