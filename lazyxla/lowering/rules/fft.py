"""Lowering rules: the discrete Fourier transforms ``torch.fft`` is built on.

PyTorch's ``_fft_*`` ops transform without scaling and then scale by ``normalization``: 0 leaves the
result as is, 1 multiplies by ``1/sqrt(n)``, 2 by ``1/n``, where ``n`` is the number of signal
elements (the product of the transformed sizes; for c2r, of the output's). jnp's ``norm="backward"``
forward transforms and ``norm="forward"`` inverse transforms are the unscaled ones.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from lazyxla.lowering.registry import lowers

aten = torch.ops.aten

_SCALE = (lambda n: 1.0, lambda n: 1 / math.sqrt(n), lambda n: 1 / n)


def _scaled(y, shape, dim, normalization: int):
    n = math.prod(shape[d] for d in dim)
    scale = _SCALE[normalization](n)
    return y if scale == 1.0 else y * jnp.asarray(scale, y.real.dtype)


@lowers(aten._fft_c2c.default)
def _fft_c2c(ctx, x, dim, normalization, forward):
    transform = jnp.fft.fftn if forward else lambda x, axes: jnp.fft.ifftn(x, axes=axes, norm="forward")
    return _scaled(transform(x, axes=dim), x.shape, dim, normalization)


@lowers(aten._fft_r2c.default)
def _fft_r2c(ctx, x, dim, normalization, onesided):
    y = jnp.fft.rfftn(x, axes=dim) if onesided else jnp.fft.fftn(x.astype(ctx.dtype), axes=dim)
    return _scaled(y, x.shape, dim, normalization)


@lowers(aten._fft_c2r.default)
def _fft_c2r(ctx, x, dim, normalization, last_dim_size):
    sizes = [ctx.shape[d] for d in dim]
    y = jnp.fft.irfftn(x, s=sizes, axes=dim, norm="forward")
    return _scaled(y, ctx.shape, dim, normalization)
