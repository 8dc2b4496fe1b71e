"""Rules for random ops: each draws from ``ctx.key`` (a fresh key per op per step, fed as a graph input).

Floats are drawn in float32 (float64 only when the output is float64) whatever x64 says: TPUs have no
float64, and half-precision outputs are rounded from float32 draws as PyTorch does.
A ``generator=`` argument is accepted and ignored: lazyxla has one RNG stream per process
(``torch.manual_seed`` / ``lazyxla.manual_seed``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import flat_draw

aten = torch.ops.aten


def _float(ctx):
    """The dtype to draw floats in for this op's output."""
    return jnp.float64 if ctx.dtype == jnp.float64 else jnp.float32


def _uniform01(ctx):
    return flat_draw(jax.random.uniform, ctx.key, ctx.shape, _float(ctx))


def _randint(key, shape, low: int, high: int):
    """Integers in [low, high), drawn in int32 when the range fits."""
    fits = low >= -(2**31) and high <= 2**31
    if high == 2**63:  # int64's random_(): [low, max]; as a Python int, jax refuses 2**63 (OverflowError)
        high = np.uint64(high)  # a wider bound jax clips to int64's max, which it then includes
    return flat_draw(jax.random.randint, key, shape, low, high, jnp.int32 if fits else jnp.int64)


def _max_random(dtype) -> int:
    """``random_()`` without bounds: [0, 2**mantissa] for floats, [0, max] for integers (PyTorch's range)."""
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1) + 1
    if dtype == jnp.bool_:
        return 2
    return int(jnp.iinfo(dtype).max) + 1


# ---- float distributions (the input tensor only gives shape and dtype) ----


@lowers(aten.uniform.default, random=True)
def _uniform(ctx, x, from_=0.0, to=1.0, **_):
    return flat_draw(jax.random.uniform, ctx.key, ctx.shape, _float(ctx), from_, to)


@lowers(aten.normal_functional.default, random=True)
def _normal_functional(ctx, x, mean=0.0, std=1.0, **_):
    return flat_draw(jax.random.normal, ctx.key, ctx.shape, _float(ctx)) * std + mean


@lowers(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def _normal(ctx, mean=0.0, std=1.0, **_):
    return flat_draw(jax.random.normal, ctx.key, ctx.shape, _float(ctx)) * std + mean


@lowers(aten.normal.float_float, random=True)
def _normal_float(ctx, mean, std, size, **_):
    return flat_draw(jax.random.normal, ctx.key, ctx.shape, _float(ctx)) * std + mean


# rand/randn and their _like forms: only the output aval matters (size or the like-tensor give it)
@lowers(aten.rand.default, aten.rand.generator, aten.rand_like.default, aten.rand_like.generator, random=True)
def _rand(ctx, size_or_like, **_):
    return _uniform01(ctx)


@lowers(aten.randn.default, aten.randn.generator, aten.randn_like.default, aten.randn_like.generator, random=True)
def _randn(ctx, size_or_like, **_):
    return flat_draw(jax.random.normal, ctx.key, ctx.shape, _float(ctx))


@lowers(aten.exponential.default, random=True)
def _exponential(ctx, x, lambd=1.0, **_):
    return flat_draw(jax.random.exponential, ctx.key, ctx.shape, _float(ctx)) / lambd


@lowers(aten.geometric.default, random=True)
def _geometric(ctx, x, p, **_):
    # number of Bernoulli(p) trials up to the first success: ceil(log(U) / log(1 - p)), U in (0, 1]
    u = 1 - _uniform01(ctx)
    return jnp.maximum(jnp.ceil(jnp.log(u) / math.log1p(-p)), 1)


@lowers(aten.log_normal.default, random=True)
def _log_normal(ctx, x, mean=1.0, std=2.0, **_):
    return jnp.exp(flat_draw(jax.random.normal, ctx.key, ctx.shape, _float(ctx)) * std + mean)


@lowers(aten.cauchy.default, random=True)
def _cauchy(ctx, x, median=0.0, sigma=1.0, **_):
    return median + sigma * flat_draw(jax.random.cauchy, ctx.key, ctx.shape, _float(ctx))


@lowers(aten.bernoulli.p, random=True)
def _bernoulli_p(ctx, x, p=0.5, **_):
    return _uniform01(ctx) < p


@lowers(aten.bernoulli.default, random=True)
def _bernoulli(ctx, probs, **_):
    return _uniform01(ctx) < probs


@lowers(aten.bernoulli.Tensor, random=True)
def _bernoulli_tensor(ctx, x, p, **_):
    return _uniform01(ctx) < p


@lowers(aten.poisson.default, random=True)
def _poisson(ctx, rate, generator=None):
    return jax.random.poisson(ctx.key, rate.astype(jnp.float32), ctx.shape)


# ---- integers ----


@lowers(getattr(aten.random, "from"), random=True)
def _random_from(ctx, x, from_, to=None, **_):
    high = _max_random(ctx.dtype) if to is None else to
    return _randint(ctx.key, ctx.shape, from_, high)


@lowers(aten.random.to, random=True)
def _random_to(ctx, x, to, **_):
    return _randint(ctx.key, ctx.shape, 0, to)


@lowers(aten.random.default, random=True)
def _random(ctx, x, **_):
    return _randint(ctx.key, ctx.shape, 0, _max_random(ctx.dtype))


@lowers(aten.randint_like.default, aten.randint_like.generator, random=True)
def _randint_like(ctx, x, high, **_):
    return _randint(ctx.key, ctx.shape, 0, high)


@lowers(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, random=True)
def _randint_like_low(ctx, x, low, high, **_):
    return _randint(ctx.key, ctx.shape, low, high)


@lowers(aten.randint_like.Tensor, aten.randint_like.Tensor_generator, random=True)
def _randint_like_tensor(ctx, x, high, **_):
    # a bound known only on the device: scale a uniform draw
    u = flat_draw(jax.random.uniform, ctx.key, ctx.shape, jnp.float64 if high.dtype == jnp.int64 else jnp.float32)
    return jnp.minimum(jnp.floor(u * high), high - 1)


@lowers(aten.randperm.default, aten.randperm.generator, random=True)
def _randperm(ctx, n, **_):
    return jax.random.permutation(ctx.key, n)


@lowers(aten.multinomial.default, random=True)
def _multinomial(ctx, probs, num_samples, replacement=False, **_):
    logits = jnp.log(probs.astype(_float(ctx) if probs.dtype != jnp.float64 else jnp.float64))
    if replacement:
        draws = jax.random.categorical(ctx.key, logits, -1, (num_samples, *probs.shape[:-1]))
        return jnp.moveaxis(draws, 0, -1)
    # without replacement: the top k of Gumbel-perturbed logits (the Gumbel-top-k trick)
    gumbel = jax.random.gumbel(ctx.key, probs.shape, logits.dtype)
    return jax.lax.top_k(logits + gumbel, num_samples)[1]


@lowers(aten.rrelu_with_noise_functional.default, random=True)
def _rrelu_with_noise(ctx, x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    if not training:
        return jnp.where(x >= 0, x, x * ((lower + upper) / 2)), noise
    slope = flat_draw(jax.random.uniform, ctx.key, x.shape, _float(ctx)) * (upper - lower) + lower
    noise = jnp.where(x >= 0, 1, slope).astype(x.dtype)
    return x * noise, noise
