"""Rules for softmax and log-softmax (and their backward ops), activation gradients and dropout."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc, flat_draw, jax_gelu

aten = torch.ops.aten


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
    """PyTorch's formulas for GELU's derivative (its CPU kernel's), not the vjp of the forward: 16 StableHLO lines
    instead of 20 for the exact form."""
    g, x = acc(g), acc(x)
    if approximate == "tanh":
        beta, kappa = math.sqrt(2) * (2 / math.sqrt(math.pi)) * 0.5, 0.044715
        x_sq = x * x
        t = jnp.tanh(beta * (x + kappa * x_sq * x))
        left, right = 0.5 * x, 1 + t
        right_derivative = left * (1 - t * t) * (beta * (1 + 3 * kappa * x_sq))
        return g * (0.5 * right + right_derivative)
    cdf = 0.5 * (1 + lax.erf(x * (1 / math.sqrt(2))))
    pdf = jnp.exp(-0.5 * x * x) * ((2 / math.sqrt(math.pi)) * (1 / math.sqrt(2)) * 0.5)
    return g * (cdf + x * pdf)


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
    keep = flat_draw(jax.random.uniform, ctx.key, x.shape, jnp.float32) >= p
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), 0), keep


@lowers(aten.native_dropout_backward.default)
def _native_dropout_backward(ctx, g, mask, scale):
    # grad * mask * scale: a bool or integer grad times the float scale is float (ctx.dtype)
    return jnp.where(mask, g.astype(ctx.dtype) * jnp.asarray(scale, ctx.dtype), 0)
