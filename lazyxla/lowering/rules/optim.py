"""Lowering rules: fused optimizer steps (``torch.optim``'s ``fused=True``) and AMP loss scaling.

A fused op updates a whole list of parameters in one node. PyTorch's in-place forms (``_fused_adamw_``, ...)
reach lazyxla as these functional forms (see the fused kernels in ``lazyxla/frontend/kernels.py``): one output list per
list the in-place op writes, in schema order. The math is that of PyTorch's fused CPU and CUDA kernels:
half-precision tensors are computed in float32, hyperparameters arrive as float64 (``scalars=``) and the
per-step scalars (bias corrections, step size) are computed in it; gradients are divided by ``grad_scale``
and written back unscaled; and where ``found_inf`` is 1 nothing changes at all (the kernels return early, so
the step is skipped).
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
import torch

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc

aten = torch.ops.aten

_F64 = np.float64


def _given(x) -> bool:
    """A hyperparameter that takes part: 0.0 stays a Python constant (lazy/meta.py), any other value is an input."""
    return not (isinstance(x, float) and x == 0.0)


def _sc(x, dt):
    """A hyperparameter (Python float or 0-d array) in the compute dtype ``dt``."""
    return jnp.asarray(x, dt)


def _grad(g, grad_scale, maximize: bool):
    """(the gradient written back: unscaled, the direction the step follows: negated if maximizing)."""
    g = acc(g)
    if grad_scale is not None:
        g = g / grad_scale.astype(g.dtype)
    return g, (-g if maximize else g)


def _skip_if_inf(found_inf, new: list, old: list) -> list:
    """The kernels' early return: every output keeps its input where ``found_inf`` is 1."""
    if found_inf is None:
        return new
    skip = found_inf == 1
    return [jnp.where(skip, o, n.astype(o.dtype)) for n, o in zip(new, old)]


def _adam_one(p, g, m, v, vmax, step, *, lr, beta1, beta2, weight_decay, eps, maximize, grad_scale, adamw):
    g_out, d = _grad(g, grad_scale, maximize)
    dt = d.dtype
    pa, m, v = acc(p), acc(m), acc(v)
    if _given(weight_decay):
        if adamw:
            pa = pa - pa * _sc(lr * weight_decay, dt)
        else:
            d = d + pa * _sc(weight_decay, dt)
    m = m + (d - m) * _sc(1 - beta1, dt)
    v = v * _sc(beta2, dt) + d * d * _sc(1 - beta2, dt)
    step = step.astype(_F64)
    step_size = _sc(lr, _F64) / (1 - _sc(beta1, _F64) ** step)
    bc2_sqrt = jnp.sqrt(1 - _sc(beta2, _F64) ** step)
    if vmax is not None:
        vmax = jnp.maximum(acc(vmax), v)
    denom = jnp.sqrt(v if vmax is None else vmax) / bc2_sqrt.astype(dt) + _sc(eps, dt)
    pa = pa - step_size.astype(dt) * m / denom
    return pa, g_out, m, v, vmax


def _adam(ctx, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, adamw, amsgrad, grad_scale=None,
          found_inf=None, **kw):  # fmt: skip
    outs = ([], [], [], [], [])
    for i, (p, g, m, v, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, steps)):
        vmax = max_exp_avg_sqs[i] if amsgrad else None
        new = _adam_one(p, g, m, v, vmax, step, adamw=adamw, grad_scale=grad_scale, **kw)
        olds = (p, g, m, v, vmax)
        for out, n, o in zip(outs, new, olds):
            if o is not None:
                out.extend(_skip_if_inf(found_inf, [n], [o]))
    if not amsgrad:  # PyTorch passes the list anyway (empty, or ignored): it comes back unchanged
        outs[4].extend(max_exp_avg_sqs)
    return [a for out in outs for a in out]


lowers(aten._fused_adam.default, aten._fused_adam.tensor_lr, scalars=_F64)(partial(_adam, adamw=False))
lowers(aten._fused_adamw.default, aten._fused_adamw.tensor_lr, scalars=_F64)(partial(_adam, adamw=True))


@lowers(aten._fused_sgd.default, aten._fused_sgd.tensor_lr, scalars=_F64)
def _sgd(
    ctx, params, grads, bufs, *, weight_decay, momentum, lr, dampening, nesterov, maximize, is_first_step,
    grad_scale=None, found_inf=None,
):  # fmt: skip
    """Without momentum PyTorch passes no buffers (an empty list); on the first step they are uninitialized."""
    new_p, new_g, new_b = [], [], []
    for i, (p, g) in enumerate(zip(params, grads)):
        g_out, d = _grad(g, grad_scale, maximize)
        dt = d.dtype
        pa = acc(p)
        if _given(weight_decay):
            d = d + pa * _sc(weight_decay, dt)
        if bufs:
            b = d if is_first_step else acc(bufs[i]) * _sc(momentum, dt) + d * _sc(1 - dampening, dt)
            d = d + b * _sc(momentum, dt) if nesterov else b
            new_b.extend(_skip_if_inf(found_inf, [b], [bufs[i]]))
        new_p.extend(_skip_if_inf(found_inf, [pa - d * _sc(lr, dt)], [p]))
        new_g.extend(_skip_if_inf(found_inf, [g_out], [g]))
    return new_p + new_g + new_b


def _adagrad(ctx, params, grads, sums, steps, *, lr, lr_decay, weight_decay, eps, maximize, grad_scale=None,
             found_inf=None, steps_out):  # fmt: skip
    """``steps_out``: the float-lr overload also returns the steps (unchanged: the optimizer counts them)."""
    new_p, new_g, new_s = [], [], []
    for p, g, s, step in zip(params, grads, sums, steps):
        g_out, d = _grad(g, grad_scale, maximize)
        dt = d.dtype
        pa = acc(p)
        if _given(weight_decay):
            d = d + pa * _sc(weight_decay, dt)
        clr = _sc(lr, _F64) / (1 + (step.astype(_F64) - 1) * _sc(lr_decay, _F64))
        s_new = acc(s) + d * d
        pa = pa - clr.astype(dt) * d / (jnp.sqrt(s_new) + _sc(eps, dt))
        new_p.extend(_skip_if_inf(found_inf, [pa], [p]))
        new_g.extend(_skip_if_inf(found_inf, [g_out], [g]))
        new_s.extend(_skip_if_inf(found_inf, [s_new], [s]))
    return new_p + new_g + new_s + (list(steps) if steps_out else [])


lowers(aten._fused_adagrad.default, scalars=_F64)(partial(_adagrad, steps_out=True))
lowers(aten._fused_adagrad.tensor_lr, scalars=_F64)(partial(_adagrad, steps_out=False))


# ---- AMP loss scaling (torch.amp.GradScaler) ----


@lowers(aten._amp_foreach_non_finite_check_and_unscale.default)
def _non_finite_check_and_unscale(ctx, grads, found_inf, inv_scale):
    """Each gradient times ``inv_scale`` (in float32 for half types); ``found_inf`` becomes 1 if any value of
    any gradient is inf or NaN, and is kept otherwise."""
    out, bad = [], jnp.zeros((), jnp.bool_)
    for g in grads:
        bad = bad | ~jnp.all(jnp.isfinite(g))
        out.append(acc(g) * inv_scale.astype(acc(g).dtype))
    return out + [jnp.where(bad, jnp.ones_like(found_inf), found_inf)]


@lowers(aten._amp_update_scale.default)
def _update_scale(ctx, scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """After an inf: scale times ``backoff_factor``, tracker 0. After ``growth_interval`` good steps in a row:
    scale times ``growth_factor`` (unless that overflows), tracker 0. Otherwise the tracker counts the step."""
    found = found_inf != 0
    good = growth_tracker + 1
    grow = good == growth_interval
    grown = scale * jnp.asarray(growth_factor, scale.dtype)
    grown = jnp.where(jnp.isfinite(grown), grown, scale)
    new_scale = jnp.where(found, scale * jnp.asarray(backoff_factor, scale.dtype), jnp.where(grow, grown, scale))
    tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), good.astype(growth_tracker.dtype))
    return new_scale, tracker
