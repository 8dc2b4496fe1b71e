"""Lowering rules: indexing ops (advanced indexing, gather/scatter families).

Indexing with a boolean mask has a data-dependent shape: PyTorch's meta kernel for ``index.Tensor``
refuses it, so such reads run on the CPU. Writes through a mask (``index_put``, ``masked_scatter``)
keep their input's shape and lower here, with the mask's ``nonzero`` padded to a static size and the
padding scattered out of range, where it is dropped.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import norm_dim

aten = torch.ops.aten


def _is_mask(i) -> bool:
    return i is not None and i.dtype in (np.bool_, np.uint8)


def _index_tuple(x, indices, pad_masks: bool = False):
    """PyTorch's ``indices`` (``None`` = the whole dim) as a jax indexing tuple; masks become ``nonzero``.

    With ``pad_masks``, each mask's ``nonzero`` has one entry per mask element, the missing ones
    pointing one past the end of their dim (``mode='drop'`` scatters then skip them).
    """
    out, d = [], 0
    for i in indices:
        if _is_mask(i):
            dims = x.shape[d : d + i.ndim]
            fill = tuple(dims) if pad_masks else None
            out.extend(jnp.nonzero(i, size=i.size if pad_masks else None, fill_value=fill))
            d += i.ndim
        else:
            out.append(slice(None) if i is None else i)
            d += 1
    return tuple(out)


def _advanced_axis(idx: tuple) -> int:
    """Where numpy/PyTorch put the advanced-index dims of ``x[idx]``: in place if adjacent, else first."""
    pos = [k for k, i in enumerate(idx) if not isinstance(i, slice)]
    return pos[0] if pos == list(range(pos[0], pos[-1] + 1)) else 0


def _pad_mask_values(x, idx, values, nnz_axis_size: int):
    """Pad ``values`` along the masked dim from the true count to the padded ``nonzero`` length."""
    target = x[idx].shape  # only its shape is used; the gather is dead code
    ax = _advanced_axis(idx) - (len(target) - values.ndim)
    if ax < 0 or values.shape[ax] == 1:
        return values
    widths = [(0, 0)] * values.ndim
    widths[ax] = (0, nnz_axis_size - values.shape[ax])
    return jnp.pad(values, widths)


@lowers(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(ctx, x, indices):
    # out-of-range indices read NaN (integers: the dtype's minimum), as jnp.take does, never a
    # clamped neighbour: see docs/ops.md
    return x.at[_index_tuple(x, indices)].get(mode="fill")


@lowers(aten.index_put.default, aten._unsafe_index_put.default, aten._index_put_impl.default)
def _index_put(ctx, x, indices, values, accumulate=False, unsafe=False):
    values = values.astype(x.dtype)
    masks = [i for i in indices if _is_mask(i)]
    idx = _index_tuple(x, indices, pad_masks=bool(masks))
    if masks:
        if sum(i is not None for i in indices) > 1:
            raise NotImplementedError("index_put with a boolean mask and other index tensors")
        values = _pad_mask_values(x, idx, values, masks[0].size)
    ref = x.at[idx]
    return _accumulate(ref, values, mode="drop") if accumulate else ref.set(values, mode="drop")


def _accumulate(ref, values, **kw):
    # bool accumulation is a logical or in PyTorch
    return ref.max(values, **kw) if values.dtype == np.bool_ else ref.add(values, **kw)


@lowers(aten.put.default)
def _put(ctx, x, index, source, accumulate=False):
    ref = x.reshape(-1).at[index.reshape(-1)]
    source = source.reshape(-1).astype(x.dtype)
    return (_accumulate(ref, source) if accumulate else ref.set(source)).reshape(x.shape)


@lowers(aten.masked_scatter.default)
def _masked_scatter(ctx, x, mask, source):
    # The k-th True element of the mask takes source's k-th element: a static-shape gather.
    mask = jnp.broadcast_to(mask, ctx.shape)
    pos = jnp.cumsum(mask.reshape(-1)) - 1
    flat = source.reshape(-1).astype(ctx.dtype)
    vals = flat[jnp.clip(pos, 0, max(flat.size - 1, 0))] if flat.size else jnp.zeros(pos.shape, ctx.dtype)
    return jnp.where(mask, vals.reshape(ctx.shape), jnp.broadcast_to(x, ctx.shape))


# ---- index along one dim ----


def _dim_index(ndim: int, dim: int, index) -> tuple:
    return (slice(None),) * dim + (index,) + (slice(None),) * (ndim - dim - 1)


def _at_least_1d(fn):
    """Run ``fn`` on 1-d views of 0-d inputs (PyTorch treats a scalar as one element), reshape back."""

    def rule(ctx, x, dim, index, *args, **kwargs):
        x1, i1 = x.reshape(-1) if x.ndim == 0 else x, index.reshape(-1) if index.ndim == 0 else index
        return fn(ctx, x1, norm_dim(dim, x1.ndim), i1, *args, **kwargs).reshape(ctx.shape)

    return rule


@lowers(aten.index_select.default)
@_at_least_1d
def _index_select(ctx, x, dim, index):
    return jnp.take(x, index, axis=dim)


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
@_at_least_1d
def _index_fill(ctx, x, dim, index, value):
    return x.at[_dim_index(x.ndim, dim, index)].set(jnp.asarray(value).astype(x.dtype))


def _extreme(dtype, sign: int):
    if dtype == np.bool_:
        return sign > 0
    if jnp.issubdtype(dtype, jnp.inexact):
        return sign * np.inf
    info = np.iinfo(dtype)
    return info.max if sign > 0 else info.min


# what ``include_self=False`` first writes into the scattered positions
_IDENTITY = {
    "sum": lambda dt: 0,
    "prod": lambda dt: 1,
    "amax": partial(_extreme, sign=-1),
    "amin": partial(_extreme, sign=1),
}
# reduce name -> the ``x.at[idx]`` method; PyTorch's scatter(reduce=) spells two of them differently
_AT_METHOD = {"sum": "add", "add": "add", "prod": "multiply", "multiply": "multiply", "amax": "max", "amin": "min"}


def _reduce_into(x, idx, src, reduce: str | None, include_self: bool = True):
    """``x`` with ``src`` scattered into positions ``idx`` with ``reduce`` (``None``: overwrite)."""
    src = jnp.asarray(src).astype(x.dtype)
    if reduce is None:
        return x.at[idx].set(src)
    if x.dtype == np.bool_:  # PyTorch's bool sum is a logical or, its product a logical and
        reduce = {"sum": "amax", "add": "amax", "prod": "amin", "multiply": "amin"}.get(reduce, reduce)
    if reduce == "mean":
        sums = (x if include_self else x.at[idx].set(0)).at[idx].add(src)
        counts = jnp.full(x.shape, int(include_self), x.dtype).at[idx].add(1)
        counts = jnp.maximum(counts, 1)
        return sums / counts if jnp.issubdtype(x.dtype, jnp.inexact) else sums // counts
    if not include_self:
        x = x.at[idx].set(jnp.asarray(_IDENTITY[reduce](x.dtype)).astype(x.dtype))
    return getattr(x.at[idx], _AT_METHOD[reduce])(src)


@lowers(aten.index_add.default)
@_at_least_1d
def _index_add(ctx, x, dim, index, source, alpha=1):
    source = source.reshape(x.shape[:dim] + (-1,) + x.shape[dim + 1 :])
    return _reduce_into(x, _dim_index(x.ndim, dim, index), source * alpha, "sum")


@lowers(aten.index_copy.default)
@_at_least_1d
def _index_copy(ctx, x, dim, index, source):
    source = source.reshape(x.shape[:dim] + (-1,) + x.shape[dim + 1 :])
    return _reduce_into(x, _dim_index(x.ndim, dim, index), source, None)


@lowers(aten.index_reduce.default)
@_at_least_1d
def _index_reduce(ctx, x, dim, index, source, reduce, include_self=True):
    return _reduce_into(x, _dim_index(x.ndim, dim, index), source, reduce, include_self)


# ---- gather / scatter: index has x's rank; elsewhere than dim it addresses its own position ----


def _along(index, dim: int) -> tuple:
    return tuple(index if d == dim else lax.broadcasted_iota(index.dtype, index.shape, d) for d in range(index.ndim))


@lowers(aten.gather.default)
@_at_least_1d
def _gather(ctx, x, dim, index, sparse_grad=False):
    if index.size == 0:
        return jnp.zeros(ctx.shape, ctx.dtype)
    if x.ndim == 0:  # every index is 0: each output element is x
        return jnp.broadcast_to(x, ctx.shape)
    # index may be smaller than x in the other dims: crop x to it, then take along dim
    x = lax.slice(x, [0] * x.ndim, [n if d == dim else m for d, (n, m) in enumerate(zip(x.shape, index.shape))])
    return jnp.take_along_axis(x, index, axis=dim)


def _scatter(ctx, x, dim, index, src, reduce=None, include_self=True):
    if index.size == 0:
        return x
    if jnp.ndim(src):  # src may be larger than index: only its leading block is scattered
        src = lax.slice(src, [0] * src.ndim, index.shape)
    return _reduce_into(x, _along(index, dim), src, reduce, include_self)


_scatter_1d = _at_least_1d(_scatter)
lowers(aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce)(_scatter_1d)
lowers(aten.scatter_reduce.two)(_scatter_1d)
lowers(aten.scatter_add.default)(partial(_scatter_1d, reduce="sum"))
