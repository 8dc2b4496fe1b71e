"""Rules for pairwise distances (``cdist``, ``pdist``) and their gradients, as PyTorch's kernels define them."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc, vector_norm

aten = torch.ops.aten


# ---- distances ----


def _pairwise_diff(x1, x2):
    """``(..., P, R, M)``: every row of ``x1`` minus every row of ``x2`` (batch dims broadcast)."""
    return x1[..., :, None, :] - x2[..., None, :, :]


def _dist_grad(diff, dist, p: float):
    """d dist / d diff as PyTorch's kernels define it: 0 where the distance is 0, every maximal
    coordinate for p = inf, and 0 for p < 1 where a coordinate difference is 0."""
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        t = jnp.sign(diff)
    elif p == math.inf:
        t = jnp.sign(diff) * (jnp.abs(diff) == dist)
    elif p == 2:
        t = diff / dist
    elif p < 2:
        t = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / dist ** (p - 1)
        t = jnp.where(diff == 0, 0, t) if p < 1 else t
    else:
        t = diff * jnp.abs(diff) ** (p - 2) / dist ** (p - 1)
    return jnp.where(dist == 0, 0, t)


@lowers(aten._cdist_forward.default)
def _cdist_forward(ctx, x1, x2, p, compute_mode=None):
    # computed from the differences whatever compute_mode says: the matmul form only loses precision
    return vector_norm(jnp.abs(_pairwise_diff(acc(x1), acc(x2))), -1, p)


@lowers(aten._cdist_backward.default)
def _cdist_backward(ctx, g, x1, x2, p, dist):
    # the gradient for x1 only (autograd calls it again with the arguments swapped for x2), at the
    # batch-broadcast shape: autograd sums it back over broadcast dims. PyTorch returns zeros shaped
    # like x1 for p = 0 and empty inputs.
    if p == 0 or 0 in (*g.shape, *x1.shape, *x2.shape):
        return jnp.zeros(ctx.shape, acc(x1).dtype)
    term = _dist_grad(_pairwise_diff(acc(x1), acc(x2)), acc(dist)[..., None], p)
    return jnp.broadcast_to((acc(g)[..., None] * term).sum(-2), ctx.shape)


@lowers(aten._pdist_forward.default)
def _pdist_forward(ctx, x, p=2.0):
    i, j = np.triu_indices(x.shape[0], 1)  # the pairs i < j, row-major, as PyTorch lists them
    x = acc(x)
    return vector_norm(jnp.abs(x[i] - x[j]), -1, p)


@lowers(aten._pdist_backward.default)
def _pdist_backward(ctx, g, x, p, dist):
    i, j = np.triu_indices(x.shape[0], 1)
    x = acc(x)
    t = acc(g)[:, None] * _dist_grad(x[i] - x[j], acc(dist)[:, None], p)
    return jnp.zeros(x.shape, t.dtype).at[i].add(t).at[j].add(-t)
