"""Rules for factories and conversions that the device itself needs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from lazyxla.lowering.registry import lowers
from lazyxla.ops import ops

aten = torch.ops.aten


@lowers(aten.empty.memory_format)
def _empty(ctx, size, **_):
    return jnp.zeros(ctx.shape, ctx.dtype)


def convert(x, dtype):
    """``x`` cast to ``dtype`` as PyTorch's CPU kernels cast it.

    Float to integer is where XLA and PyTorch differ: XLA saturates (``-1.0`` to uint8 is 0, NaN is 0),
    while PyTorch converts through a 32-bit (or 64-bit) integer and keeps the low bits, so ``-1.0``
    to uint8 is 255 and ``300.0`` is 44. NaN, infinities and values outside the wide integer's range
    become its minimum, as x86's conversion instruction gives them (C++ leaves them undefined).

    Example:
        >>> convert(jnp.array([-1.0, 300.0]), jnp.uint8)  # Array([255, 44], dtype=uint8)
    """
    dtype = np.dtype(dtype)
    if not (jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(dtype, jnp.integer)):
        return x.astype(dtype)
    wide = np.dtype(np.int64 if dtype.itemsize == 8 else np.int32)
    info = np.iinfo(wide)
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    # float(info.max) rounds up to 2**31 (or 2**63): values at or above it are out of range.
    inside = (x >= float(info.min)) & (x < -float(info.min))
    wide_value = jnp.where(inside, jnp.where(inside, x, 0).astype(wide), info.min)
    return wide_value.astype(dtype)


@lowers(aten._to_copy.default, torch.ops.prims.convert_element_type.default)  # prims: in torch.compile graphs
def _to_copy(ctx, x, *_, **__):
    return convert(x, ctx.dtype)


@lowers(ops.optimization_barrier.default)
def _optimization_barrier(ctx, xs):
    return list(jax.lax.optimization_barrier(tuple(xs)))


@lowers(aten.copy.default)
def _copy(ctx, dst, src, non_blocking=False):
    return jnp.broadcast_to(convert(src, ctx.dtype), ctx.shape)
