"""Lowering rules: view and shape ops.

Functionalization hands us views as ``*_copy`` ops and writes through views as ``*_scatter`` ops;
decompositions running below it may still emit the plain view ops, which lower the same way (the
lazy layer never aliases storage, so a view is just its values).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import norm_dim
from lazyxla.ops import ops

aten = torch.ops.aten


def slice_bounds(size: int, start, end) -> tuple[int, int]:
    """PyTorch's clamping of slice bounds: negatives wrap once, then clamp to ``[0, size]``, end >= start."""
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else end)
    start = min(max(start, 0), size)
    return start, min(max(end, start), size)


# ---- reshapes: the output shape is all a rule needs ----


@lowers(
    aten.view_copy.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten._reshape_alias_copy.default,
    aten._reshape_alias.default,
    aten._reshape_copy.default,
    aten.unsqueeze_copy.default,
    aten.unsqueeze.default,
    aten.squeeze_copy.default,
    aten.squeeze_copy.dim,
    aten.squeeze_copy.dims,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
)
def _reshape(ctx, x, *_, **__):
    return jnp.reshape(x, ctx.shape)


@lowers(aten.view_copy.dtype, aten.view.dtype)
def _view_dtype(ctx, x, dtype):
    """A bitcast; between sizes the last dimension is split or merged, as PyTorch does. A complex number is its
    real and imaginary parts side by side (PyTorch's layout), a bool one byte; XLA's bitcast takes neither, so
    they are bitcast as floats of half the width and as ``uint8``."""
    want = np.dtype(ctx.dtype)
    if x.dtype == np.bool_:
        x = x.astype(np.uint8)
    elif jnp.iscomplexobj(x):  # [..., n] complex -> [..., 2n] of its parts
        x = (
            jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1).reshape(*x.shape[:-1], 2 * x.shape[-1])
            if x.ndim
            else _parts(x)
        )
    if want.kind == "c":
        parts = _bitcast(x, np.dtype(f"f{want.itemsize // 2}"))
        pairs = parts.reshape(*parts.shape[:-1], parts.shape[-1] // 2, 2)
        return lax.complex(pairs[..., 0], pairs[..., 1]).reshape(ctx.shape)
    out = _bitcast(x, np.dtype(np.uint8) if want == np.bool_ else want)
    return out.reshape(ctx.shape).astype(ctx.dtype)


def _parts(z):
    """A 0-d complex number as the vector of its real and imaginary parts."""
    return jnp.stack([jnp.real(z), jnp.imag(z)])


def _bitcast(x, want: np.dtype):
    """``x`` (neither complex nor bool) bitcast to ``want``, its last dimension grown or shrunk by the ratio of the
    sizes (a 0-d ``x`` of the same size stays 0-d)."""
    src, dst = np.dtype(x.dtype).itemsize, want.itemsize
    if src < dst:  # merge groups of the last dimension
        x = x.reshape(*x.shape[:-1], x.shape[-1] * src // dst, dst // src)
    out = lax.bitcast_convert_type(x, want)
    # sizes spelled out, not -1: jnp cannot infer a size from an empty array (a (0, 5, 64) view)
    return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1]) if src > dst and out.ndim > 1 else out


@lowers(aten.expand_copy.default, aten.expand.default)
def _expand(ctx, x, size, implicit=False):
    return jnp.broadcast_to(x, ctx.shape)


@lowers(aten.permute_copy.default, aten.permute.default)
def _permute(ctx, x, dims):
    return jnp.transpose(x, [norm_dim(d, x.ndim) for d in dims])


@lowers(aten.t_copy.default, aten.t.default)
def _t(ctx, x):
    return jnp.transpose(x)


@lowers(aten.transpose_copy.int, aten.transpose.int)
def _transpose(ctx, x, dim0, dim1):
    return jnp.swapaxes(x, norm_dim(dim0, x.ndim), norm_dim(dim1, x.ndim)) if x.ndim else x


@lowers(aten.view_as_real_copy.default, aten.view_as_real.default)
def _view_as_real(ctx, x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lowers(aten.view_as_complex_copy.default, aten.view_as_complex.default)
def _view_as_complex(ctx, x):
    return lax.complex(x[..., 0], x[..., 1])


# ---- slicing views ----


def _index_at(x, dim: int, index):
    """``x[(:,) * dim + (index,)]`` as an indexing tuple."""
    return (slice(None),) * dim + (index,)


@lowers(aten.select_copy.int, aten.select.int)
def _select(ctx, x, dim, index):
    dim = norm_dim(dim, x.ndim)
    return lax.index_in_dim(x, index % x.shape[dim], axis=dim, keepdims=False)


@lowers(aten.slice_copy.Tensor, aten.slice.Tensor)
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, x.ndim)
    lo, hi = slice_bounds(x.shape[dim], start, end)
    return lax.slice_in_dim(x, lo, hi, step, axis=dim)


@lowers(aten.narrow_copy.default)
def _narrow(ctx, x, dim, start, length):
    dim = norm_dim(dim, x.ndim)
    start = start % x.shape[dim] if start < 0 else start
    return lax.slice_in_dim(x, start, start + length, 1, axis=dim)


@lowers(
    aten.split_copy.Tensor,
    aten.split.Tensor,
    aten.split_with_sizes_copy.default,
    aten.split_with_sizes.default,
)
def _split(ctx, x, sizes, dim=0):
    dim = norm_dim(dim, x.ndim)
    offsets = np.cumsum([0] + [a.shape[dim] for a in ctx.avals])
    return [lax.slice_in_dim(x, int(lo), int(hi), 1, axis=dim) for lo, hi in zip(offsets[:-1], offsets[1:])]


@lowers(aten.unbind_copy.int, aten.unbind.int)
def _unbind(ctx, x, dim=0):
    dim = norm_dim(dim, x.ndim)
    return [lax.index_in_dim(x, i, axis=dim, keepdims=False) for i in range(x.shape[dim])]


@lowers(aten.diagonal_copy.default, aten.diagonal.default)
def _diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim))


@lowers(aten.unfold_copy.default, aten.unfold.default)
def _unfold(ctx, x, dimension, size, step):
    if x.ndim == 0:  # a 0-d tensor gives shape [size]: [] for size 0, [x] for size 1
        return jnp.broadcast_to(x, ctx.shape)
    dim = norm_dim(dimension, x.ndim)
    n = ctx.shape[dim]
    windows = jnp.arange(n)[:, None] * step + jnp.arange(size)[None, :]
    return jnp.moveaxis(jnp.take(x, windows, axis=dim), dim + 1, -1)


def _strided_flat_index(size, stride, storage_offset):
    """Flat positions of an ``as_strided`` view over a contiguous buffer."""
    idx = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        idx += (np.arange(n) * s).reshape((n,) + (1,) * (len(size) - d - 1))
    return idx


@lowers(aten.as_strided_copy.default, aten.as_strided.default)
def _as_strided(ctx, x, size, stride, storage_offset=None):
    # Functional tensors are contiguous here, so strides address x's row-major buffer.
    return x.reshape(-1)[_strided_flat_index(size, stride, storage_offset)]


@lowers(aten.as_strided_scatter.default)
def _as_strided_scatter(ctx, x, src, size, stride, storage_offset=None):
    idx = _strided_flat_index(size, stride, storage_offset)
    flat, src = x.reshape(-1), src.astype(x.dtype)
    out = flat.at[idx].set(src)
    if 0 in stride and np.unique(idx).size < idx.size:
        # Several elements of the view are one element of x (a stride 0). The CPU writes such a view in place
        # (fill_ or index_put_ of one element), and functionalization's view holds the write in one of those
        # elements and the old value in the others; a scatter keeps any one of them. The changed one wins.
        old = flat[idx]
        changed = (
            (src != old) & ~(jnp.isnan(src) & jnp.isnan(old)) if jnp.issubdtype(src.dtype, jnp.inexact) else src != old
        )
        out = out.at[jnp.where(changed, idx, flat.size)].set(src, mode="drop")
    return out.reshape(x.shape)


# ---- writing through views ----


@lowers(aten.select_scatter.default)
def _select_scatter(ctx, x, src, dim, index):
    dim = norm_dim(dim, x.ndim)
    return lax.dynamic_update_index_in_dim(x, src.astype(x.dtype), index % x.shape[dim], dim)


@lowers(aten.slice_scatter.default)
def _slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, x.ndim)
    lo, hi = slice_bounds(x.shape[dim], start, end)
    src = src.astype(x.dtype)
    if step == 1:
        return lax.dynamic_update_slice_in_dim(x, src, lo, dim)
    return x.at[_index_at(x, dim, slice(lo, hi, step))].set(src)


# ---- positions that are program inputs (lazy/positions.py records them non-negative and in range) ----

_POSITION = np.dtype(np.int64)  # a dim may hold more than 2**31 elements (a flat parameter buffer)


@lowers(ops.dynamic_select.default, scalars=_POSITION)
def _dynamic_select(ctx, x, dim, index):
    return lax.dynamic_index_in_dim(x, index, axis=dim, keepdims=False)


@lowers(ops.dynamic_slice.default, scalars=_POSITION)
def _dynamic_slice(ctx, x, dim, start, size):
    return lax.dynamic_slice_in_dim(x, start, size, axis=dim)


@lowers(ops.dynamic_select_scatter.default, scalars=_POSITION)
def _dynamic_select_scatter(ctx, x, src, dim, index):
    return lax.dynamic_update_index_in_dim(x, src.astype(x.dtype), index, dim)


@lowers(ops.dynamic_slice_scatter.default, scalars=_POSITION)
def _dynamic_slice_scatter(ctx, x, src, dim, start):
    return lax.dynamic_update_slice_in_dim(x, src.astype(x.dtype), start, dim)


def _diagonal_index(x, offset, dim1, dim2):
    """The ``x.diagonal(offset, dim1, dim2)`` positions, for ``x`` with ``dim1, dim2`` moved last."""
    rows, cols = x.shape[dim1], x.shape[dim2]
    n = max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
    i = np.arange(n)
    return (Ellipsis, i - min(offset, 0), i + max(offset, 0))


@lowers(aten.diagonal_scatter.default)
def _diagonal_scatter(ctx, x, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim)
    moved = jnp.moveaxis(x, (dim1, dim2), (-2, -1))
    moved = moved.at[_diagonal_index(x, offset, dim1, dim2)].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


# ---- joining, repeating, reordering ----


@lowers(aten.cat.default)
def _cat(ctx, tensors, dim=0):
    # PyTorch skips 1-d empty tensors, whatever the other tensors' rank (legacy behaviour).
    parts = [t.astype(ctx.dtype) for t in tensors if t.shape != (0,)]
    if not parts:
        return jnp.zeros(ctx.shape, ctx.dtype)
    return jnp.concatenate(parts, axis=norm_dim(dim, len(ctx.shape)))


@lowers(aten.stack.default)
def _stack(ctx, tensors, dim=0):
    return jnp.stack([t.astype(ctx.dtype) for t in tensors], axis=norm_dim(dim, len(ctx.shape)))


@lowers(aten.flip.default)
def _flip(ctx, x, dims):
    return jnp.flip(x, [norm_dim(d, x.ndim) for d in dims]) if x.ndim else x


@lowers(aten.roll.default)
def _roll(ctx, x, shifts, dims=()):
    return jnp.roll(x, shifts, [norm_dim(d, x.ndim) for d in dims] if dims else None)


@lowers(aten.repeat.default)
def _repeat(ctx, x, repeats):
    return jnp.tile(x, repeats)


@lowers(aten.constant_pad_nd.default)
def _constant_pad_nd(ctx, x, pad, value=0):
    # pad lists (before, after) pairs from the last dimension backwards; negative entries crop.
    pairs = [(0, 0, 0)] * (x.ndim - len(pad) // 2) + [(pad[i], pad[i + 1], 0) for i in range(len(pad) - 2, -1, -2)]
    return lax.pad(x, jnp.asarray(value).astype(x.dtype), pairs)


@lowers(aten.tril.default)
def _tril(ctx, x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowers(aten.triu.default)
def _triu(ctx, x, diagonal=0):
    return jnp.triu(x, diagonal)


# ``movedim``, ``narrow``, ``expand_as``, ``reshape``, ``flatten`` and ``pad`` are composite: PyTorch
# turns them into the ops above before they reach us.
