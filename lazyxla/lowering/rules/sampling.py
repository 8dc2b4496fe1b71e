"""Rules for sampling an input at given coordinates: ``grid_sampler_2d``/``3d`` and their backward ops."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import torch

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import vjp

aten = torch.ops.aten


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
