"""Rules for factories and conversions that the device itself needs."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazyxla.lowering.registry import lowers

aten = torch.ops.aten


@lowers(aten.empty.memory_format)
def _empty(ctx, size, **_):
    return jnp.zeros(ctx.shape, ctx.dtype)


@lowers(aten._to_copy.default)
def _to_copy(ctx, x, **_):
    return x.astype(ctx.dtype)


@lowers(aten.copy.default)
def _copy(ctx, dst, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(ctx.dtype), ctx.shape)
