"""Lowering rules: sorting and selection (sort, topk).

One stable sort serves every rule: ties keep their input order (PyTorch's order for a stable sort, and
its CPU kernel's for the default one) and NaN sorts above every number, as in PyTorch. Descending
order sorts the reversed array ascending and reverses back, so ties still come in input order.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from lazyxla.lowering.registry import lowers

aten = torch.ops.aten


def stable_sort(x, axis: int, descending: bool = False):
    """Values and int64 indices of ``x`` sorted along ``axis`` (which must exist: pass an array of ndim >= 1)."""
    idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    if not descending:
        return lax.sort((x, idx), dimension=axis, is_stable=True, num_keys=1)
    rev = lambda a: lax.rev(a, (axis,))  # noqa: E731
    values, indices = lax.sort((rev(x), rev(idx)), dimension=axis, is_stable=True, num_keys=1)
    return rev(values), rev(indices)


def _sort(ctx, x, dim=-1, descending=False):
    x1 = jnp.atleast_1d(x)  # PyTorch sorts a 0-d tensor along dim 0 or -1
    values, indices = stable_sort(x1, dim % x1.ndim, descending)
    return values.reshape(ctx.shape), indices.reshape(ctx.avals[1].shape)


lowers(aten.sort.default)(_sort)


@lowers(aten.sort.stable)
def _sort_stable(ctx, x, *, stable=None, dim=-1, descending=False):
    return _sort(ctx, x, dim, descending)


@lowers(aten.topk.default)
def _topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    # The first k of the stable sort: the order PyTorch's kernel gives when ``sorted`` (unsorted
    # results may come in any order, so this one does too). Ties take the lower index first.
    x1 = jnp.atleast_1d(x)
    axis = dim % x1.ndim
    values, indices = stable_sort(x1, axis, largest)
    take = lambda a: lax.slice_in_dim(a, 0, k, axis=axis)  # noqa: E731
    return take(values).reshape(ctx.shape), take(indices).reshape(ctx.avals[1].shape)


@lowers(aten.nonzero_static.default)
def _nonzero_static(ctx, x, *, size, fill_value=-1):
    if x.ndim == 0:  # a 0-d tensor's indices have no coordinates
        return jnp.zeros(ctx.shape, jnp.int64)
    return jnp.stack(jnp.nonzero(x, size=size, fill_value=fill_value), axis=1)
