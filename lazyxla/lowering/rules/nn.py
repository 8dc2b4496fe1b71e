"""Rules for neural-network ops: convolution, pooling, normalization, softmax, losses, activation gradients.

Most backward ops are the ``jax.vjp`` of the forward written here (XLA drops the unused primal), so a
forward and its gradient cannot disagree; layer/group norm use the saved statistics (their backward
ops get no eps), max pooling scatters into the saved indices.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc, channel, channel_shape, vjp
from lazyxla.lowering.rules.linalg import jax_gelu
from lazyxla.lowering.rules.reduction import vector_norm

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


# ---- normalization ----


def _normalize(x, axes, eps):
    xf = acc(x)
    mean = xf.mean(axes, keepdims=True)
    var = jnp.square(xf - mean).mean(axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    return (xf - mean) * rstd, mean, rstd, var


def _layer_norm(x, normalized_shape, w, b, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y, mean, rstd, _ = _normalize(x, axes, eps)
    y = y if w is None else y * w
    y = y if b is None else y + b
    return y.astype(x.dtype), mean, rstd


@lowers(aten.native_layer_norm.default)
def _native_layer_norm(ctx, x, normalized_shape, w, b, eps):
    return _layer_norm(x, normalized_shape, w, b, eps)


def _norm_backward(g, xhat, rstd, w_shaped, stat_axes, param_axes, output_mask):
    """Gradients of ``xhat * w + b`` with ``xhat`` normalized over ``stat_axes`` by the saved ``rstd``."""
    dxhat = g if w_shaped is None else g * w_shaped
    dx = None
    if output_mask[0]:
        mean_d = dxhat.mean(stat_axes, keepdims=True)
        mean_dx = (dxhat * xhat).mean(stat_axes, keepdims=True)
        dx = rstd * (dxhat - mean_d - xhat * mean_dx)
    dw = (g * xhat).sum(param_axes) if output_mask[1] else None
    db = g.sum(param_axes) if output_mask[2] else None
    return dx, dw, db


@lowers(aten.native_layer_norm_backward.default)
def _native_layer_norm_backward(ctx, g, x, normalized_shape, mean, rstd, w, b, output_mask):
    k = x.ndim - len(normalized_shape)
    xhat = (acc(x) - mean) * rstd
    stat_axes, lead = tuple(range(k, x.ndim)), tuple(range(k))
    mask = (output_mask[0], output_mask[1] and w is not None, output_mask[2] and b is not None)
    return _norm_backward(acc(g), xhat, rstd, w, stat_axes, lead, mask)


def _affine(y, w, b, shape):
    w = w if w is None or shape is None else w.reshape(shape)
    b = b if b is None or shape is None else b.reshape(shape)
    y = y if w is None else y * w
    return y if b is None else y + b


def _group_norm(x, w, b, n, c, group, eps):
    # The group size is spelled out: reshape's -1 cannot infer it when the batch is empty.
    y, mean, rstd, _ = _normalize(x.reshape(n, group, (c // group) * math.prod(x.shape[2:])), (2,), eps)
    y = _affine(y.reshape(x.shape), w, b, channel_shape(x.ndim))
    return y.astype(x.dtype), mean.reshape(n, group), rstd.reshape(n, group)


@lowers(aten.native_group_norm.default)
def _native_group_norm(ctx, x, w, b, n, c, hxw, group, eps):
    return _group_norm(x, w, b, n, c, group, eps)


@lowers(aten.native_group_norm_backward.default)
def _native_group_norm_backward(ctx, g, x, mean, rstd, w, n, c, hxw, group, output_mask):
    grouped = (n, group, (c // group) * hxw)
    xhat = ((acc(x).reshape(grouped) - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    g = acc(g)
    dxhat = g if w is None else g * channel(w, x.ndim)
    dx, dw, db = _norm_backward(
        dxhat.reshape(grouped), xhat.reshape(grouped), rstd[..., None], None, (2,), (), (output_mask[0], 0, 0)
    )
    param_axes = (0, *range(2, x.ndim))
    dw = (g * xhat).sum(param_axes) if output_mask[1] and w is not None else None
    db = g.sum(param_axes) if output_mask[2] else None
    return (None if dx is None else dx.reshape(x.shape)), dw, db


def _bn_axes(x):
    return (0, *range(2, x.ndim))


def _bn_train(x, w, b, eps):
    """Batch statistics: the normalized output, mean, 1/std and the (biased) variance per channel."""
    y, mean, rstd, var = _normalize(x, _bn_axes(x), eps)
    y = _affine(y, w, b, channel_shape(x.ndim))
    return y.astype(x.dtype), mean.reshape(-1), rstd.reshape(-1), var.reshape(-1)


def _bn_eval(x, w, b, running_mean, running_var, eps):
    rstd = lax.rsqrt(acc(running_var) + eps)
    y = (acc(x) - channel(running_mean, x.ndim)) * channel(rstd, x.ndim)
    return _affine(y, w, b, channel_shape(x.ndim)).astype(x.dtype), rstd


def _fit(aval, value):
    """PyTorch returns empty tensors for statistics it did not compute; match the meta shape."""
    return value if tuple(value.shape) == aval.shape else jnp.zeros(aval.shape, value.dtype)


def _batch_norm(ctx, x, w, b, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var) of one batch-norm call."""
    if training or running_mean is None:
        y, mean, rstd, var = _bn_train(x, w, b, eps)
        if running_mean is None:
            return y, mean, rstd, None, None
        n = x.size // x.shape[1]
        new_mean = (1 - momentum) * running_mean + momentum * mean
        new_var = (1 - momentum) * running_var + momentum * var * (n / max(n - 1, 1))
        return y, mean, rstd, new_mean, new_var
    y, rstd = _bn_eval(x, w, b, running_mean, running_var, eps)
    return y, running_mean, rstd, running_mean, running_var


@lowers(aten.native_batch_norm.default)
def _native_batch_norm(ctx, x, w, b, running_mean, running_var, training, momentum, eps):
    y, mean, rstd, _, _ = _batch_norm(ctx, x, w, b, running_mean, running_var, training, momentum, eps)
    return y, _fit(ctx.avals[1], mean), _fit(ctx.avals[2], rstd)


@lowers(aten._native_batch_norm_legit_functional.default)
def _native_batch_norm_functional(ctx, x, w, b, running_mean, running_var, training, momentum, eps):
    y, mean, rstd, new_mean, new_var = _batch_norm(ctx, x, w, b, running_mean, running_var, training, momentum, eps)
    return y, _fit(ctx.avals[1], mean), _fit(ctx.avals[2], rstd), new_mean, new_var


@lowers(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_no_stats(ctx, x, w, b, training, momentum, eps):
    y, mean, rstd, _ = _bn_train(x, w, b, eps)
    return y, mean, rstd


@lowers(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_no_training(ctx, x, w, b, running_mean, running_var, momentum, eps):
    y, rstd = _bn_eval(x, w, b, running_mean, running_var, eps)
    return y, _fit(ctx.avals[1], running_mean), _fit(ctx.avals[2], rstd)


@lowers(aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update_functional(ctx, x, w, b, running_mean, running_var, momentum, eps):
    y, mean, rstd, new_mean, new_var = _batch_norm(ctx, x, w, b, running_mean, running_var, True, momentum, eps)
    return y, mean, rstd, jnp.zeros(ctx.avals[3].shape, jnp.uint8), new_mean, new_var


@lowers(aten._batch_norm_no_update.default)
def _batch_norm_no_update(ctx, x, w, b, running_mean, running_var, momentum, eps):
    y, mean, rstd, _, _ = _batch_norm(ctx, x, w, b, running_mean, running_var, False, momentum, eps)
    reserve = jnp.zeros(ctx.avals[3].shape, jnp.uint8)
    return y, _fit(ctx.avals[1], mean), _fit(ctx.avals[2], rstd), reserve


def _bn_backward(g, x, w, running_mean, running_var, train, eps, output_mask):
    c = x.shape[1]
    b = jnp.zeros((c,), g.dtype) if output_mask[2] else None
    if train or running_mean is None:
        f = lambda x, w, b: _bn_train(x, w, b, eps)[0]  # noqa: E731
    else:
        f = lambda x, w, b: _bn_eval(x, w, b, running_mean, running_var, eps)[0]  # noqa: E731
    return vjp(f, (x, w, b), g, output_mask)


@lowers(aten.native_batch_norm_backward.default)
def _native_batch_norm_backward(ctx, g, x, w, running_mean, running_var, save_mean, save_invstd, train, eps, mask):
    return _bn_backward(g, x, w, running_mean, running_var, train, eps, mask)


@lowers(aten.batch_norm_backward.default)
def _batch_norm_backward(ctx, g, x, w, running_mean, running_var, save_mean, save_var, update, eps, mask, reserve):
    return _bn_backward(g, x, w, running_mean, running_var, update, eps, mask)


# ---- softmax ----


def _on_dim(fn, x, dim):
    """Apply ``fn(x, axis)``; PyTorch allows dim 0/-1 on 0-d tensors."""
    if x.ndim == 0:
        return fn(x.reshape(1), 0).reshape(())
    return fn(x, dim)


@lowers(aten._softmax.default)
def _softmax(ctx, x, dim, half_to_float):
    return _on_dim(jax.nn.softmax, acc(x), dim)


@lowers(aten._log_softmax.default)
def _log_softmax(ctx, x, dim, half_to_float):
    return _on_dim(jax.nn.log_softmax, acc(x), dim)


@lowers(aten._safe_softmax.default)
def _safe_softmax(ctx, x, dim, dtype=None):
    # rows that are all -inf (fully masked attention) give 0 instead of NaN
    x = acc(x if dtype is None else x.astype(ctx.dtype))

    def safe(x, axis):
        masked = jnp.all(x == -jnp.inf, axis, keepdims=True)
        return jnp.where(masked, 0, jax.nn.softmax(x, axis))

    return _on_dim(safe, x, dim)


@lowers(aten._softmax_backward_data.default)
def _softmax_backward_data(ctx, g, y, dim, input_dtype):
    gy = acc(g) * acc(y)
    return _on_dim(lambda gy, axis: gy - acc(y).reshape(gy.shape) * gy.sum(axis, keepdims=True), gy, dim)


@lowers(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(ctx, g, y, dim, input_dtype):
    g, y = acc(g), acc(y)
    return _on_dim(lambda g, axis: g - jnp.exp(y).reshape(g.shape) * g.sum(axis, keepdims=True), g, dim)


# ---- activation gradients, dropout ----


def _gelu(ctx, x, *, approximate="none"):
    return jax_gelu(acc(x), approximate)


def _gelu_backward(ctx, g, x, *, approximate="none"):
    return vjp(lambda x: jax_gelu(x, approximate), (acc(x),), acc(g), (True,))[0]


lowers(aten.gelu.default)(_gelu)
lowers(aten.gelu_backward.default)(_gelu_backward)


@lowers(aten.threshold_backward.default)
def _threshold_backward(ctx, g, x, threshold):
    return jnp.where(x <= threshold, 0, g)


@lowers(aten.sigmoid_backward.default)
def _sigmoid_backward(ctx, g, y):
    return g * (1 - y) * y


@lowers(aten.tanh_backward.default)
def _tanh_backward(ctx, g, y):
    return g * (1 - y * y)


@lowers(aten.silu_backward.default)
def _silu_backward(ctx, g, x):
    s = jax.nn.sigmoid(acc(x))
    return acc(g) * s * (1 + acc(x) * (1 - s))


@lowers(aten.native_dropout.default, random=True)
def _native_dropout(ctx, x, p, train):
    if train is False:
        return x, jnp.ones(x.shape, bool)
    keep = jax.random.uniform(ctx.key, x.shape, jnp.float32) >= p
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), 0), keep


@lowers(aten.native_dropout_backward.default)
def _native_dropout_backward(ctx, g, mask, scale):
    # grad * mask * scale: a bool or integer grad times the float scale is float (ctx.dtype)
    return jnp.where(mask, g.astype(ctx.dtype) * jnp.asarray(scale, ctx.dtype), 0)


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


# ---- grid sampling (2-d and 3-d; modes: 0 bilinear, 1 nearest, 2 bicubic; padding: 0 zeros,
# 1 border, 2 reflection), written as PyTorch's kernels compute, so jax's gradient is theirs ----


def _unnormalize(coord, size: int, align_corners: bool):
    """Grid coordinates in [-1, 1] to pixel coordinates."""
    return (coord + 1) / 2 * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2


def _reflect(c, twice_low: int, twice_high: int):
    if twice_low == twice_high:
        return jnp.zeros_like(c)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    c = jnp.abs(c - low)
    extra = jnp.fmod(c, span)
    even = jnp.fmod(jnp.floor(c / span), 2) == 0
    return jnp.where(even, extra + low, span - extra + low)


def _pad_reflection(c, size: int, align_corners: bool):
    c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
    return jnp.clip(c, 0, size - 1)


_GRID_PADDING = (
    lambda c, size, align_corners: c,
    lambda c, size, align_corners: jnp.clip(c, 0, size - 1),
    _pad_reflection,
)


def _gather_points(x, coords):
    """``x[n, :, *coords[n]]`` for integer-valued float coordinates ``(N, *out)`` per spatial axis; 0 outside."""
    n, c, *sizes = x.shape
    valid = functools.reduce(jnp.logical_and, [(k >= 0) & (k <= s - 1) for k, s in zip(coords, sizes)])
    flat = jnp.zeros(coords[0].shape, jnp.int32)
    for k, s in zip(coords, sizes):
        flat = flat * s + jnp.clip(k, 0, s - 1).astype(jnp.int32)
    vals = jax.vmap(lambda xb, ib: xb[:, ib])(x.reshape(n, c, -1), flat.reshape(n, -1))
    return vals.reshape(n, c, *coords[0].shape[1:]) * valid[:, None].astype(x.dtype)


def _sample_bilinear(x, coords):
    lows = [jnp.floor(k) for k in coords]
    out = 0
    for corner in itertools.product((0, 1), repeat=len(coords)):
        weight = functools.reduce(
            jnp.multiply, [k - lo if bit else 1 - (k - lo) for k, lo, bit in zip(coords, lows, corner)]
        )
        out = out + _gather_points(x, [lo + bit for lo, bit in zip(lows, corner)]) * weight[:, None]
    return out


def _sample_nearest(x, coords):
    return _gather_points(x, [jnp.round(k) for k in coords])  # half to even, as nearbyint


def _cubic_weights(t, a=-0.75):
    near = lambda s: ((a + 2) * s - (a + 3)) * s * s + 1  # noqa: E731
    far = lambda s: ((a * s - 5 * a) * s + 8 * a) * s - 4 * a  # noqa: E731
    return far(t + 1), near(t), near(1 - t), far(2 - t)


def _sample_bicubic(x, coords, pad, align_corners):
    # unpadded coordinates; each of the 4**nd taps is padded (border/reflection) and bounds-checked,
    # then interpolated along the fastest axis first, as PyTorch's kernels sum
    sizes = x.shape[2:]
    lows = [jnp.floor(k) for k in coords]
    weights = [_cubic_weights(k - lo) for k, lo in zip(coords, lows)]

    def interpolate(taps):
        axis = len(taps)
        if axis == len(coords):
            return _gather_points(x, [pad(lo - 1 + t, s, align_corners) for lo, t, s in zip(lows, taps, sizes)])
        return functools.reduce(jnp.add, [interpolate((*taps, t)) * weights[axis][t][:, None] for t in range(4)])

    return interpolate(())


def _grid_sample(x, grid, mode: int, padding_mode: int, align_corners: bool):
    # in the input's dtype: PyTorch's kernels round half-precision coordinates too
    sizes = x.shape[2:]
    nd = len(sizes)
    # the grid's last axis gives the fastest spatial axis first: (x, y[, z]) for (..., [D,] H, W)
    coords = [_unnormalize(grid[..., nd - 1 - a], sizes[a], align_corners) for a in range(nd)]
    pad = _GRID_PADDING[padding_mode]
    if mode == 2:
        return _sample_bicubic(x, coords, pad, align_corners)
    coords = [pad(k, s, align_corners) for k, s in zip(coords, sizes)]
    return (_sample_bilinear, _sample_nearest)[mode](x, coords)


@lowers(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def _grid_sampler(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@lowers(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def _grid_sampler_backward(ctx, g, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    f = functools.partial(_grid_sample, mode=interpolation_mode, padding_mode=padding_mode, align_corners=align_corners)
    return vjp(f, (x, grid), g, output_mask)


# ---- embedding bags (modes: 0 sum, 1 mean, 2 max) ----


def _bag_terms(indices, offsets, n_bags: int, padding_idx: int):
    """Each index's bag (offset2bag) and whether it counts (not padding_idx)."""
    # with include_last_offset the final offset only closes the last bag: entries past it join that bag
    bag = jnp.searchsorted(offsets[:n_bags], jnp.arange(indices.shape[0], dtype=offsets.dtype), side="right") - 1
    keep = (indices != padding_idx) & (bag >= 0)
    return bag, keep


def _bag_max(rows, keep, bag, indices, n_bags, bag_size):
    """Per bag and column: the maximum and the weight row it came from (the first on ties); 0 for empty bags."""
    rows = jnp.where(keep[:, None], rows, -jnp.inf)
    best = jax.ops.segment_max(rows, bag, n_bags)
    n = indices.shape[0]
    is_best = keep[:, None] & (rows == best[jnp.clip(bag, 0)])
    first = jax.ops.segment_min(jnp.where(is_best, jnp.arange(n)[:, None], n), bag, n_bags)
    empty = (bag_size == 0)[:, None]
    arg = indices[jnp.clip(first, 0, n - 1)] if n else jnp.zeros(first.shape, indices.dtype)
    return jnp.where(empty, 0, best), jnp.where(empty, 0, arg)


@lowers(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(
    ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
    include_last_offset=False, padding_idx=-1,
):  # fmt: skip
    n_bags = ctx.shape[0]
    bag, keep = _bag_terms(indices, offsets, n_bags, padding_idx)
    rows = acc(weight)[indices]
    if per_sample_weights is not None:
        rows = rows * acc(per_sample_weights)[:, None]
    bag_size = jax.ops.segment_sum(keep.astype(jnp.int64), bag, n_bags)
    max_indices = jnp.zeros(ctx.avals[3].shape, jnp.int64)
    if mode == 2:
        out, max_indices = _bag_max(rows, keep, bag, indices, n_bags, bag_size)
    else:
        out = jax.ops.segment_sum(jnp.where(keep[:, None], rows, 0), bag, n_bags)
        out = out / jnp.maximum(bag_size, 1)[:, None].astype(out.dtype) if mode == 1 else out
    # the meta kernel sizes bag_size by the offsets (one more with include_last_offset): pad to it
    bag_size = jnp.zeros(ctx.avals[2].shape, bag_size.dtype).at[:n_bags].set(bag_size)
    return out, bag, bag_size, max_indices


def _embedding_bag_grad(g, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq, mode, psw, pad):
    g = acc(g)
    if mode == 2:
        cols = jnp.broadcast_to(jnp.arange(g.shape[1]), g.shape)
        live = (bag_size[: g.shape[0]] > 0)[:, None]
        return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[max_indices, cols].add(jnp.where(live, g, 0))
    keep = (indices != pad) & (offset2bag >= 0)
    scale = keep.astype(g.dtype)
    if mode == 1:
        scale = scale / jnp.maximum(bag_size[offset2bag], 1)
    if psw is not None:
        scale = scale * acc(psw)
    if scale_grad_by_freq:
        scale = scale / jnp.zeros(num_weights, g.dtype).at[indices].add(1)[indices]
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[indices].add(g[offset2bag] * scale[:, None])


@lowers(aten._embedding_bag_backward.default)
def _embedding_bag_backward(
    ctx, g, indices, offsets, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq, mode, sparse,
    per_sample_weights, padding_idx=-1,
):  # fmt: skip
    # sparse=True gets the dense gradient: lazyxla has no sparse tensors
    args = (num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx)
    return _embedding_bag_grad(g, indices, offset2bag, bag_size, max_indices, *args)


@lowers(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(
    ctx, g, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq, mode, per_sample_weights,
    padding_idx=-1,
):  # fmt: skip
    args = (num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx)
    return _embedding_bag_grad(g, indices, offset2bag, bag_size, max_indices, *args)


@lowers(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(ctx, g, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    keep = (indices != padding_idx) & (offset2bag >= 0)
    grads = (acc(g)[offset2bag] * acc(weight)[indices]).sum(1)
    return jnp.where(keep, grads, 0)


@lowers(aten.embedding_renorm.default)
def _embedding_renorm(ctx, weight, indices, max_norm, norm_type):
    # the rows that ``indices`` names and whose norm exceeds max_norm are scaled down to it
    # rounded as PyTorch's kernel rounds half-precision weights: the norm and the scale to the weight's dtype
    norms = vector_norm(jnp.abs(acc(weight)), -1, norm_type).astype(weight.dtype).astype(acc(weight).dtype)
    named = jnp.zeros(weight.shape[0], bool).at[indices].set(True)
    scale = jnp.where(named & (norms > max_norm), max_norm / (norms + 1e-7), 1)
    return weight * scale[:, None].astype(weight.dtype)
