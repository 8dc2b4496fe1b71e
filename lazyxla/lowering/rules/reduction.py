"""Lowering rules: reductions and scans.

Rules reduce without ``keepdims`` and reshape to the output shape PyTorch's meta kernel gave
(``keepdim``, 0-d inputs and ``dim=[]`` then need no case of their own). Half-precision floats
accumulate in float32, as PyTorch's kernels do.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import vector_norm

aten = torch.ops.aten


def _axes(dim, ndim: int) -> tuple[int, ...] | None:
    """Reduced axes; ``None`` (all) for ``dim`` None or ``[]``, as PyTorch reads them, and for 0-d inputs."""
    if dim is None or ndim == 0:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % ndim for d in dims) or None


def _acc(dt: np.dtype) -> np.dtype:
    """The dtype to accumulate ``dt`` in."""
    return np.dtype(np.float32) if dt in (np.float16, jnp.bfloat16) else dt


def _shape(ctx, i: int = 0) -> tuple[int, ...]:
    return ctx.avals[i].shape


def _size(x, axes) -> int:
    return x.size if axes is None else int(np.prod([x.shape[a] for a in axes]))


# ---- sum-like: cast to the output dtype (its accumulator), reduce ----


def _reduce(f, ctx, x, dim=None, keepdim=False, dtype=None):
    return f(x.astype(_acc(ctx.dtype)), axis=_axes(dim, x.ndim)).reshape(ctx.shape)


for op, f in [
    (aten.sum.default, jnp.sum),
    (aten.sum.dim_IntList, jnp.sum),
    (aten.nansum.default, jnp.nansum),
    (aten.mean.default, jnp.mean),
    (aten.mean.dim, jnp.mean),
    (aten.prod.default, jnp.prod),
    (aten.prod.dim_int, jnp.prod),
]:
    lowers(op)(partial(_reduce, f))


# ---- order reductions: in the input dtype ----


def _extreme(f, ctx, x, dim=None, keepdim=False):
    return f(x, axis=_axes(dim, x.ndim)).reshape(ctx.shape)


def _extreme_with_index(f, arg, ctx, x, dim, keepdim=False):
    axis = _axes(dim, x.ndim)
    if axis is None:  # a 0-d input: its one element, at index 0
        return x.reshape(ctx.shape), jnp.zeros(_shape(ctx, 1), np.int64)
    return f(x, axis=axis).reshape(ctx.shape), arg(x, axis=axis[0]).reshape(_shape(ctx, 1))


def _arg(f, ctx, x, dim=None, keepdim=False):
    if dim is None or x.ndim == 0:
        return f(x.reshape(-1), axis=0).reshape(ctx.shape)
    return f(x, axis=dim % x.ndim).reshape(ctx.shape)


for op, f in [
    (aten.amax.default, jnp.max),
    (aten.amin.default, jnp.min),
    (aten.max.default, jnp.max),
    (aten.min.default, jnp.min),
]:
    lowers(op)(partial(_extreme, f))

lowers(aten.max.dim)(partial(_extreme_with_index, jnp.max, jnp.argmax))
lowers(aten.min.dim)(partial(_extreme_with_index, jnp.min, jnp.argmin))
lowers(aten.argmax.default)(partial(_arg, jnp.argmax))
lowers(aten.argmin.default)(partial(_arg, jnp.argmin))


# ---- boolean reductions ----


def _bool_reduce(f, ctx, x, dim=None, keepdim=False):
    return f(x != 0, axis=_axes(dim, x.ndim)).reshape(ctx.shape)


for op, f in [
    (aten.any.default, jnp.any),
    (aten.any.dim, jnp.any),
    (aten.any.dims, jnp.any),
    (aten.all.default, jnp.all),
    (aten.all.dim, jnp.all),
    (aten.all.dims, jnp.all),
]:
    lowers(op)(partial(_bool_reduce, f))


@lowers(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def _count_nonzero(ctx, x, dim=None):
    return jnp.sum(x != 0, axis=_axes(dim, x.ndim), dtype=np.int64).reshape(ctx.shape)


# ---- moments ----


def _var_and_mean(ctx, x, dim, correction):
    axes = _axes(dim, x.ndim)
    if not jnp.iscomplexobj(x):  # a complex input keeps its imaginary part (its variance is real)
        x = x.astype(_acc(ctx.dtype))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    d = x - mean
    ss = jnp.sum((d * jnp.conj(d)).real if jnp.iscomplexobj(d) else d * d, axis=axes)
    n = _size(x, axes)
    c = 1 if correction is None else correction
    return ss / jnp.maximum(n - c, 0), mean


@lowers(aten.var.correction)
def _var(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _var_and_mean(ctx, x, dim, correction)[0].reshape(ctx.shape)


@lowers(aten.std.correction)
def _std(ctx, x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var_and_mean(ctx, x, dim, correction)[0]).reshape(ctx.shape)


@lowers(aten.var_mean.correction)
def _var_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    var, mean = _var_and_mean(ctx, x, dim, correction)
    return var.reshape(ctx.shape), mean.reshape(_shape(ctx, 1))


@lowers(aten.std_mean.correction)
def _std_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    var, mean = _var_and_mean(ctx, x, dim, correction)
    return jnp.sqrt(var).reshape(ctx.shape), mean.reshape(_shape(ctx, 1))


@lowers(aten.logsumexp.default)
def _logsumexp(ctx, x, dim, keepdim=False):
    x = x.astype(_acc(ctx.dtype))
    return jax.scipy.special.logsumexp(x, axis=_axes(dim, x.ndim)).reshape(ctx.shape)


# ---- norms ----


@lowers(aten.linalg_vector_norm.default)
def _vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    a = jnp.abs(x.astype(ctx.dtype) if dtype is not None else x).astype(_acc(ctx.dtype))
    return vector_norm(a, _axes(dim, x.ndim), ord).reshape(ctx.shape)


# ---- scans ----


def _scan(f, ctx, x, dim, *, dtype=None):
    x = jnp.atleast_1d(x.astype(_acc(ctx.dtype)))
    return f(x, axis=dim % x.ndim).reshape(ctx.shape)


for op, f in [
    (aten.cumsum.default, jnp.cumsum),
    (aten.cumprod.default, jnp.cumprod),
    (aten.logcumsumexp.default, lambda x, axis: lax.cumlogsumexp(x, axis=axis)),
]:
    lowers(op)(partial(_scan, f))


def _cum_extreme(beats, ctx, x, dim):
    x1 = jnp.atleast_1d(x)
    axis = dim % x1.ndim
    idx = lax.broadcasted_iota(np.int64, x1.shape, axis)

    def combine(a, b):  # b comes after a; PyTorch's kernel takes any NaN, and ties, from the later
        take_b = jnp.isnan(b[0]) | (~jnp.isnan(a[0]) & beats(b[0], a[0]))
        return jnp.where(take_b, b[0], a[0]), jnp.where(take_b, b[1], a[1])

    values, indices = lax.associative_scan(combine, (x1, idx), axis=axis)
    return values.reshape(ctx.shape), indices.reshape(_shape(ctx, 1))


lowers(aten.cummax.default)(partial(_cum_extreme, jnp.greater_equal))
lowers(aten.cummin.default)(partial(_cum_extreme, jnp.less_equal))
