"""Rules for loss ops and their backward ops."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc, reduce_grad, reduce_loss, vjp

aten = torch.ops.aten


# ---- losses ----


def _nll_terms(x, target, weight, ignore_index):
    """Per-element class dim, safe target and weight (0 where ignored)."""
    cdim = 0 if x.ndim == 1 else 1
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    w = jnp.ones(t.shape, x.dtype) if weight is None else weight[t].astype(x.dtype)
    return cdim, t, jnp.where(valid, w, 0)


def _nll_forward(ctx, x, target, weight, reduction, ignore_index):
    cdim, t, w = _nll_terms(x, target, weight, ignore_index)
    picked = jnp.take_along_axis(x, jnp.expand_dims(t, cdim), cdim).squeeze(cdim)
    loss = -picked * w
    total = w.sum()
    out = (loss, loss.sum() / total, loss.sum())[reduction]
    return out, total


def _nll_backward(ctx, g, x, target, weight, reduction, ignore_index, total_weight):
    cdim, t, w = _nll_terms(x, target, weight, ignore_index)
    scale = -w * (g / total_weight if reduction == 1 else g)
    onehot = lax.broadcasted_iota(t.dtype, x.shape, cdim) == jnp.expand_dims(t, cdim)
    return jnp.where(onehot, jnp.expand_dims(scale, cdim), 0)


lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)(_nll_forward)
lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)(_nll_backward)


def _loss_rows(forward, grad):
    """Register ``forward(x, t, *extra) -> elementwise loss`` and its backward as a loss op pair."""

    def fwd(ctx, x, t, reduction=1, *extra):
        return reduce_loss(forward(x, t, *extra), reduction)

    def bwd(ctx, g, x, t, reduction, *extra):
        return reduce_grad(g, x.size, reduction) * grad(x, t, *extra)

    return fwd, bwd


_mse = _loss_rows(lambda x, t: jnp.square(x - t), lambda x, t: 2 * (x - t))


def _smooth_l1(x, t, beta=1.0):
    d = jnp.abs(x - t)
    return jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta) if beta > 0 else d


def _smooth_l1_grad(x, t, beta):
    d = x - t
    return jnp.where(jnp.abs(d) < beta, d / beta, jnp.sign(d)) if beta > 0 else jnp.sign(d)


def _huber(x, t, delta=1.0):
    d = jnp.abs(x - t)
    return jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))


_smooth = _loss_rows(_smooth_l1, _smooth_l1_grad)
_hub = _loss_rows(_huber, lambda x, t, delta: jnp.clip(x - t, -delta, delta))

lowers(aten.mse_loss.default)(_mse[0])
lowers(aten.mse_loss_backward.default)(_mse[1])
lowers(aten.smooth_l1_loss.default)(_smooth[0])
lowers(aten.smooth_l1_loss_backward.default)(_smooth[1])
lowers(aten.huber_loss.default)(_hub[0])
lowers(aten.huber_loss_backward.default)(_hub[1])


@lowers(aten.binary_cross_entropy.default)
def _bce(ctx, x, t, weight=None, reduction=1):
    loss = -(t * jnp.maximum(jnp.log(x), -100) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100))
    return reduce_loss(loss if weight is None else loss * weight, reduction)


@lowers(aten.binary_cross_entropy_backward.default)
def _bce_backward(ctx, g, x, t, weight=None, reduction=1):
    grad = (x - t) / jnp.maximum((1 - x) * x, 1e-12)
    grad = grad if weight is None else grad * weight
    return reduce_grad(g, x.size, reduction) * grad


@lowers(aten.binary_cross_entropy_with_logits.default)
def _bce_logits(ctx, x, t, weight=None, pos_weight=None, reduction=1):
    softplus_neg = jnp.logaddexp(0, -x)  # log(1 + exp(-x)), stable
    log_weight = 1 if pos_weight is None else (pos_weight - 1) * t + 1
    loss = (1 - t) * x + log_weight * softplus_neg
    return reduce_loss(loss if weight is None else loss * weight, reduction)


# ---- margin losses (targets are class indices; the loss of a sample sums over the other classes) ----


def _rows(x):
    """``x`` as ``(N, C)``: a vector (or 0-d scalar) input is one sample."""
    return x.reshape(-1, x.shape[-1] if x.ndim else 1)


def _reduced_loss_grad(per_sample, g, x, reduction):
    """The input gradient of ``reduce_loss(per_sample(x), reduction)`` for the incoming gradient ``g``."""

    def f(x):
        return reduce_loss(per_sample(x), reduction)

    return vjp(f, (acc(x),), acc(g).reshape(() if reduction else (-1,)), (True,))[0].reshape(x.shape)


def _multi_margin(x, target, p, margin, weight):
    """Per-sample multi-class hinge loss: sum over i != y of max(0, margin - x[y] + x[i])^p * w[y] / C."""
    x = _rows(acc(x))
    t = target.reshape(-1)
    classes = x.shape[1]
    picked = jnp.take_along_axis(x, t[:, None], axis=1)
    z = jnp.maximum(margin - picked + x, 0)
    z = z * z if p == 2 else z
    if weight is not None:
        z = z * acc(weight)[t][:, None]
    z = jnp.where(jnp.arange(classes) == t[:, None], 0, z)
    return z.sum(1) / classes


@lowers(aten.multi_margin_loss.default)
def _multi_margin_loss(ctx, x, target, p=1, margin=1, weight=None, reduction=1):
    return reduce_loss(_multi_margin(x, target, p, margin, weight), reduction).reshape(ctx.shape)


@lowers(aten.multi_margin_loss_backward.default)
def _multi_margin_loss_backward(ctx, g, x, target, p, margin, weight=None, reduction=1):
    return _reduced_loss_grad(lambda x: _multi_margin(x, target, p, margin, weight), g, x, reduction)


def _multilabel(x, target):
    """Per-sample multi-label hinge loss and the is-target mask.

    Each row of ``target`` lists class indices up to its first -1; the loss sums
    max(0, 1 - (x[j] - x[i])) / C over listed classes j and unlisted classes i.
    """
    x = _rows(acc(x))
    target = _rows(target)
    classes = x.shape[1]
    idx = jnp.arange(classes)
    end = jnp.min(jnp.where(target == -1, idx, classes), axis=1, keepdims=True)
    listed = idx < end  # (N, C): which target slots hold a class
    t = jnp.where(listed, target, 0)
    is_target = jnp.any((t[:, :, None] == idx) & listed[:, :, None], axis=1)
    picked = jnp.take_along_axis(x, t, axis=1)
    z = jnp.maximum(1 - picked[:, :, None] + x[:, None, :], 0)  # (N, slot j, class i)
    z = jnp.where(listed[:, :, None] & ~is_target[:, None, :], z, 0)
    return z.sum((1, 2)) / classes, is_target


@lowers(aten.multilabel_margin_loss_forward.default)
def _multilabel_margin_loss(ctx, x, target, reduction):
    loss, is_target = _multilabel(x, target)
    return reduce_loss(loss, reduction).reshape(ctx.avals[0].shape), is_target.astype(x.dtype).reshape(x.shape)


@lowers(aten.multilabel_margin_loss_backward.default)
def _multilabel_margin_loss_backward(ctx, g, x, target, reduction, is_target):
    return _reduced_loss_grad(lambda x: _multilabel(x, target)[0], g, x, reduction)
