"""Rules for normalization: layer norm, group norm and batch norm (training, eval, functional forms), and
weight norm's backward (its forward is PyTorch's decomposition).

Layer and group norm's backward ops use the saved statistics (they get no eps); batch norm's backward
is the ``jax.vjp`` of the forward written here.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc, channel, channel_shape, vjp

aten = torch.ops.aten


# ---- normalization ----


# The statistics are reduced without kept dimensions and broadcast back in one step (``_spread``): jnp's
# ``keepdims`` and its rank-promoting broadcasts cost a second StableHLO op per statistic and parameter, and a
# layer norm's forward and backward are 9 of the GPT benchmark's largest rules.


def _spread(v, shape, dims):
    """``v`` broadcast to ``shape``, its dimensions becoming ``dims`` of it (size-1 ones broadcast too)."""
    return lax.broadcast_in_dim(v, shape, tuple(dims))


def _others(ndim, axes):
    return tuple(a for a in range(ndim) if a not in axes)


def _normalize(x, axes, eps):
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` and the statistics, kept as size-1 dimensions."""
    xf = acc(x)
    n = math.prod(x.shape[a] for a in axes)
    kept = _others(x.ndim, axes)
    mean = xf.sum(axes) / n
    xc = xf - _spread(mean, x.shape, kept)
    var = (xc * xc).sum(axes) / n
    rstd = lax.rsqrt(var + eps)
    stat = tuple(1 if a in axes else d for a, d in enumerate(x.shape))
    return xc * _spread(rstd, x.shape, kept), mean.reshape(stat), rstd.reshape(stat), var.reshape(stat)


def _layer_norm(x, normalized_shape, w, b, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y, mean, rstd, _ = _normalize(x, axes, eps)
    y = y if w is None else y * _spread(w, x.shape, axes)
    y = y if b is None else y + _spread(b, x.shape, axes)
    return y.astype(x.dtype), mean, rstd


@lowers(aten.native_layer_norm.default)
def _native_layer_norm(ctx, x, normalized_shape, w, b, eps):
    return _layer_norm(x, normalized_shape, w, b, eps)


def _norm_backward(g, xhat, rstd, w_shaped, stat_axes, param_axes, output_mask):
    """Gradients of ``xhat * w + b`` with ``xhat`` normalized over ``stat_axes`` by the saved ``rstd``."""
    dxhat = g if w_shaped is None else g * w_shaped
    dx = None
    if output_mask[0]:
        n = math.prod(xhat.shape[a] for a in stat_axes)
        kept = _others(xhat.ndim, stat_axes)
        mean_d = _spread(dxhat.sum(stat_axes) / n, xhat.shape, kept)
        mean_dx = _spread((dxhat * xhat).sum(stat_axes) / n, xhat.shape, kept)
        rstd = rstd if rstd.shape == xhat.shape else _spread(rstd, xhat.shape, range(xhat.ndim))
        dx = rstd * (dxhat - mean_d - xhat * mean_dx)
    dw = (g * xhat).sum(param_axes) if output_mask[1] else None
    db = g.sum(param_axes) if output_mask[2] else None
    return dx, dw, db


@lowers(aten.native_layer_norm_backward.default)
def _native_layer_norm_backward(ctx, g, x, normalized_shape, mean, rstd, w, b, output_mask):
    k = x.ndim - len(normalized_shape)
    every = range(x.ndim)
    rstd = _spread(rstd, x.shape, every)
    xhat = (acc(x) - _spread(mean, x.shape, every)) * rstd
    stat_axes, lead = tuple(range(k, x.ndim)), tuple(range(k))
    mask = (output_mask[0], output_mask[1] and w is not None, output_mask[2] and b is not None)
    w = None if w is None else _spread(w, x.shape, stat_axes)
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


@lowers(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(ctx, grad_w, v, g, norms, dim):
    """``w = v * g / ||v||`` (the norm over every dim but ``dim``, kept as size 1): PyTorch's kernel's formula,
    ``grad_g = sum(grad_w * v) / norm`` and ``grad_v = (g / norm) * (grad_w - v * grad_g / norm)``."""
    axes = tuple(i for i in range(v.ndim) if i != dim % v.ndim)
    grad_w, vf, norms = acc(grad_w), acc(v), acc(norms)
    scale = acc(g) / norms
    grad_g = jnp.sum(grad_w * vf, axis=axes, keepdims=True) / norms
    grad_v = scale * grad_w - (scale * grad_g / norms) * vf
    return grad_v.astype(v.dtype), grad_g.astype(g.dtype)


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
