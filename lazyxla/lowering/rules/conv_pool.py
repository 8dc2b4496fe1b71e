"""Rules for convolution (any dimensionality, transposed, grouped) and pooling (max, average, adaptive average and
adaptive max).

Backward ops are the ``jax.vjp`` of the forward written here (XLA drops the unused primal), so a forward
and its gradient cannot disagree; max pooling's backward scatters into the saved indices.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc, channel, vjp

aten = torch.ops.aten


# ---- convolution ----


def _conv(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    nd = x.ndim - 2
    spec = tuple(range(nd + 2))
    dn = lax.ConvDimensionNumbers(spec, spec, spec)
    if transposed:
        # the gradient of a strided conv: dilate the input by the stride, flip the kernel, swap its in/out
        cin, cout_g, *k = w.shape
        w = w.reshape(groups, cin // groups, cout_g, *k).swapaxes(1, 2).reshape(groups * cout_g, cin // groups, *k)
        w = jnp.flip(w, tuple(range(2, nd + 2)))
        pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, p, d, op in zip(k, padding, dilation, output_padding)]
        out = lax.conv_general_dilated(
            x, w, (1,) * nd, pads, lhs_dilation=stride, rhs_dilation=dilation, dimension_numbers=dn,
            feature_group_count=groups,
        )  # fmt: skip
    else:
        out = lax.conv_general_dilated(
            x, w, stride, [(p, p) for p in padding], rhs_dilation=dilation, dimension_numbers=dn,
            feature_group_count=groups,
        )  # fmt: skip
    return out if bias is None else out + channel(bias, out.ndim)


def _expand(v, nd: int) -> tuple[int, ...]:
    return tuple(v) * nd if len(v) == 1 else tuple(v)


def _conv_args(x, stride, padding, dilation, output_padding):
    nd = x.ndim - 2
    return tuple(_expand(v, nd) for v in (stride, padding, dilation, output_padding))


@lowers(aten.convolution.default)
def _convolution(ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    stride, padding, dilation, output_padding = _conv_args(x, stride, padding, dilation, output_padding)
    return _conv(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


@lowers(aten.convolution_backward.default)
def _convolution_backward(
    ctx, g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    stride, padding, dilation, output_padding = _conv_args(x, stride, padding, dilation, output_padding)
    f = functools.partial(
        _conv, stride=stride, padding=padding, dilation=dilation, transposed=transposed,
        output_padding=output_padding, groups=groups,
    )  # fmt: skip
    gx, gw = vjp(lambda x, w: f(x, w, None), (x, w), g, output_mask[:2])
    gb = g.sum((0, *range(2, g.ndim))) if output_mask[2] else None
    return gx, gw, gb


# ---- pooling ----


def _pool_pads(in_sp, out_sp, kernel, stride, padding, dilation):
    """(low, high) padding so that every output window (ceil_mode included) lies inside the array."""
    return [
        (p, max(0, (o - 1) * s + d * (k - 1) + 1 - n - p))
        for n, o, k, s, p, d in zip(in_sp, out_sp, kernel, stride, padding, dilation)
    ]


def _taps(x, out_sp, kernel, stride, padding, dilation, fill):
    """Every kernel tap's strided view of ``x``: shape ``(*lead, K, *out_sp)``, taps in row-major order."""
    nd = len(kernel)
    lead = x.ndim - nd
    pads = _pool_pads(x.shape[lead:], out_sp, kernel, stride, padding, dilation)
    xp = jnp.pad(x, [(0, 0)] * lead + pads, constant_values=fill)
    taps = []
    for offs in itertools.product(*(range(k) for k in kernel)):
        start = [0] * lead + [o * d for o, d in zip(offs, dilation)]
        limit = list(x.shape[:lead]) + [b + (o - 1) * s + 1 for b, o, s in zip(start[lead:], out_sp, stride)]
        taps.append(lax.slice(xp, start, limit, [1] * lead + list(stride)))
    return jnp.stack(taps, lead)


def _pool_params(nd, kernel, stride, padding, dilation=(1,)):
    kernel = _expand(kernel, nd)
    stride = _expand(stride, nd) if len(stride) else kernel
    return kernel, stride, _expand(padding, nd), _expand(dilation, nd)


def _max_pool(nd, ctx, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    kernel, stride, padding, dilation = _pool_params(nd, kernel, stride, padding, dilation)
    out_sp = ctx.shape[-nd:]
    fill = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    taps = _taps(x, out_sp, kernel, stride, padding, dilation, fill)
    lead = x.ndim - nd
    which = jnp.argmax(taps, lead)
    offsets = jnp.asarray(list(itertools.product(*(range(k) for k in kernel))), jnp.int64)[which]
    index = jnp.zeros(which.shape, jnp.int64)
    for i in range(nd):
        iota = lax.broadcasted_iota(jnp.int64, which.shape, lead + i)
        pos = iota * stride[i] - padding[i] + offsets[..., i] * dilation[i]
        index = index * x.shape[lead + i] + pos
    return jnp.max(taps, lead), index


def _max_pool_backward(nd, ctx, g, x, kernel, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_indices(nd, g, x, indices)


def _scatter_to_indices(nd, g, x, indices):
    """Each output's gradient added at the input position its flat (per-plane) index names."""
    lead = x.ndim - nd
    rows = math.prod(x.shape[:lead])
    g2, i2 = g.reshape(rows, -1), indices.reshape(rows, -1)
    out = jnp.zeros((rows, math.prod(x.shape[lead:])), g.dtype)
    return out.at[jnp.arange(rows)[:, None], i2].add(g2).reshape(x.shape)


lowers(aten.max_pool2d_with_indices.default)(functools.partial(_max_pool, 2))
lowers(aten.max_pool3d_with_indices.default)(functools.partial(_max_pool, 3))
lowers(aten.max_pool2d_with_indices_backward.default)(functools.partial(_max_pool_backward, 2))
lowers(aten.max_pool3d_with_indices_backward.default)(functools.partial(_max_pool_backward, 3))


def _window_sum(x, nd, kernel, stride, pads):
    lead = x.ndim - nd
    return lax.reduce_window(
        x, np.zeros((), x.dtype), lax.add, (1,) * lead + kernel, (1,) * lead + stride, [(0, 0)] * lead + pads
    )


def _avg_pool(x, out_sp, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    nd = len(out_sp)
    lead = x.ndim - nd
    in_sp = x.shape[lead:]
    pads = _pool_pads(in_sp, out_sp, kernel, stride, padding, (1,) * nd)
    crop = tuple(slice(0, o) for o in out_sp)
    total = _window_sum(acc(x), nd, kernel, stride, pads)[(Ellipsis, *crop)]
    if divisor_override:
        return total / divisor_override
    # how many elements each window averages: the padded extent counts only with count_include_pad
    ones = np.ones([n + 2 * p for n, p in zip(in_sp, padding)] if count_include_pad else in_sp, np.float32)
    count_pads = [(0, hi - p) if count_include_pad else (p, hi) for (p, hi) in pads]
    count_pads = [(lo, max(0, hi)) for lo, hi in count_pads]
    count = _window_sum(jnp.asarray(ones), nd, kernel, stride, count_pads)[crop]
    return total / count.astype(total.dtype)


def _avg_pool_rule(
    nd, ctx, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None
):
    kernel, stride, padding, _ = _pool_params(nd, kernel, stride, padding)
    out_sp = ctx.shape[-nd:]
    return _avg_pool(x, out_sp, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _avg_pool_backward(nd, ctx, g, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, padding, _ = _pool_params(nd, kernel, stride, padding)
    out_sp = g.shape[-nd:]
    f = functools.partial(
        _avg_pool, out_sp=out_sp, kernel=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
        count_include_pad=count_include_pad, divisor_override=divisor_override,
    )  # fmt: skip
    return vjp(f, (x,), g, (True,))[0]


lowers(aten.avg_pool2d.default)(functools.partial(_avg_pool_rule, 2))
lowers(aten.avg_pool3d.default)(functools.partial(_avg_pool_rule, 3))
lowers(aten.avg_pool2d_backward.default)(functools.partial(_avg_pool_backward, 2))
lowers(aten.avg_pool3d_backward.default)(functools.partial(_avg_pool_backward, 3))


@functools.cache
def _adaptive_matrix(n: int, out: int) -> np.ndarray:
    m = np.zeros((out, n), np.float32)
    for i in range(out):
        lo, hi = (i * n) // out, -(-((i + 1) * n) // out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


def _adaptive_avg(x, out_sp):
    x = acc(x)
    lead = x.ndim - len(out_sp)
    for axis, out in enumerate(out_sp, lead):
        n = x.shape[axis]
        if n % out == 0:  # equal windows: a plain mean
            x = x.reshape(x.shape[:axis] + (out, n // out) + x.shape[axis + 1 :]).mean(axis + 1)
        else:  # overlapping windows of unequal size: an averaging matrix
            m = jnp.asarray(_adaptive_matrix(n, out), x.dtype)
            x = jnp.moveaxis(jnp.tensordot(x, m, ((axis,), (1,))), -1, axis)
    return x


def _adaptive_avg_rule(ctx, x, output_size):
    return _adaptive_avg(x, ctx.shape[-len(output_size) :])


def _adaptive_avg_backward(nd, ctx, g, x):
    return vjp(lambda x: _adaptive_avg(x, g.shape[-nd:]), (x,), g, (True,))[0]


lowers(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)(_adaptive_avg_rule)
lowers(aten._adaptive_avg_pool2d_backward.default)(functools.partial(_adaptive_avg_backward, 2))
lowers(aten._adaptive_avg_pool3d_backward.default)(functools.partial(_adaptive_avg_backward, 3))


@functools.cache
def _adaptive_windows(n: int, out: int) -> np.ndarray:
    """Window ``i`` of adaptive pooling covers ``[floor(i*n/out), ceil((i+1)*n/out))``; as an ``(out, K)`` table of
    positions, K the widest window, shorter windows padded with their own last position (a repeat changes
    neither a max nor, as the first maximum is kept, its index)."""
    lo = [(i * n) // out for i in range(out)]
    hi = [-(-((i + 1) * n) // out) for i in range(out)]
    width = max(h - low for low, h in zip(lo, hi))
    return np.asarray([[min(low + k, h - 1) for k in range(width)] for low, h in zip(lo, hi)], np.int64)


def _adaptive_max(ctx, x, output_size):
    nd = len(output_size)
    lead = x.ndim - nd
    tables = [_adaptive_windows(x.shape[lead + i], o) for i, o in enumerate(output_size)]
    y = x
    for i, table in enumerate(tables):  # axis lead+i becomes (out_i, K_i): the windows gathered
        y = jnp.take(y, jnp.asarray(table), axis=lead + 2 * i)
    order = [*range(lead), *(lead + 2 * i for i in range(nd)), *(lead + 2 * i + 1 for i in range(nd))]
    y = jnp.transpose(y, order)
    widths = [t.shape[1] for t in tables]
    y = y.reshape(y.shape[: lead + nd] + (math.prod(widths),))
    which = jnp.argmax(y, -1)  # the first maximum, as PyTorch's kernel (it keeps a later one only if greater)
    index = jnp.zeros(which.shape, jnp.int64)
    rest = which
    for i in reversed(range(nd)):  # tap number -> per-axis tap -> input position, row-major flat index
        k, rest = rest % widths[i], rest // widths[i]
        out_i = lax.broadcasted_iota(jnp.int64, which.shape, lead + i)
        pos = jnp.asarray(tables[i])[out_i, k]
        index = index + pos * math.prod(x.shape[lead + i + 1 :])
    return jnp.max(y, -1), index


def _adaptive_max_backward(nd, ctx, g, x, indices):
    return _scatter_to_indices(nd, g, x, indices)


lowers(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)(_adaptive_max)
lowers(aten.adaptive_max_pool2d_backward.default)(functools.partial(_adaptive_max_backward, 2))
lowers(aten.adaptive_max_pool3d_backward.default)(functools.partial(_adaptive_max_backward, 3))
