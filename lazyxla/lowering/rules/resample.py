"""Rules for resizing: the ``upsample_*`` ops (nearest, nearest-exact, linear/bilinear/trilinear, bicubic, and the
antialiased bilinear/bicubic/lanczos ops ``F.interpolate(antialias=True)`` runs), 1-, 2- and 3-d, and their
backward ops.

Every mode is separable: an output index along one axis reads a few input indices along it, with weights. Those
indices and weights depend only on the sizes, ``align_corners`` and the ``scales`` PyTorch passes, so they are
computed here with NumPy, in the float type and operation order of PyTorch's CPU kernels (ATen/native/UpSample.h,
UpSampleKernel.cpp): ``F.interpolate(x, scale_factor=1.7)`` reads the input rows PyTorch's kernel reads, which
``size/in`` alone would not give. The program then gathers and weighs, one axis at a time. A backward op is the
transpose of its forward (a scatter-add of the gradient), taken with ``jax.linear_transpose``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from lazyxla.lowering.registry import lowers

aten = torch.ops.aten


# ---- where each output index reads (static NumPy; ``ft`` is the kernel's float type: float32 or float64) ----


def _scales_value(ft, scale, n_in: int, n_out: int):
    """``compute_scales_value``: the step in input units per output index."""
    if scale is not None and scale > 0:
        return ft(1.0 / scale)  # (computed in double, then rounded)
    return ft(n_in) / ft(n_out)


def _area_scale(ft, n_in: int, n_out: int, align_corners: bool, scale):
    """``area_pixel_compute_scale``."""
    if align_corners:
        return ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0)
    return _scales_value(ft, scale, n_in, n_out)


def _source_index(ft, step, n_out: int, align_corners: bool, cubic: bool):
    """``area_pixel_compute_source_index`` for every output index."""
    dst = np.arange(n_out).astype(ft)
    if align_corners:
        return step * dst
    src = step * (dst + ft(0.5)) - ft(0.5)
    return src if cubic else np.where(src < 0, ft(0), src)


def _nearest_taps(n_in: int, n_out: int, scale, exact: bool):
    """``nearest_idx`` / ``nearest_exact_idx``: one input index per output index."""
    dst = np.arange(n_out)
    if not exact and n_out == n_in:
        return dst[:, None], None
    if not exact and n_out == 2 * n_in:
        return (dst >> 1)[:, None], None
    step = _scales_value(np.float32, scale, n_in, n_out)
    # exact: (dst + 0.5) * scale in double, rounded to float by floorf; else dst * scale in float
    pos = ((dst + 0.5) * np.float64(step)).astype(np.float32) if exact else dst.astype(np.float32) * step
    return np.minimum(np.floor(pos).astype(np.int64), n_in - 1)[:, None], None


def _linear_taps(ft, wt, n_in: int, n_out: int, align_corners: bool, scale):
    """``compute_source_index_and_lambda``: two input indices and their weights (kept in ``wt``) per output index."""
    dst = np.arange(n_out)
    if n_out == n_in:
        return np.stack([dst, dst], 1), np.stack([np.ones(n_out, ft), np.zeros(n_out, ft)], 1)
    src = _source_index(ft, _area_scale(ft, n_in, n_out, align_corners, scale), n_out, align_corners, cubic=False)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    # the kernel keeps the weights in the tensor's type: a half-precision lambda1 is rounded, and 1 - lambda1 too
    lam1 = np.clip(src - i0.astype(ft), ft(0), ft(1)).astype(wt).astype(ft)
    lam0 = (ft(1) - lam1).astype(wt).astype(ft)
    i1 = i0 + (i0 < n_in - 1)
    return np.stack([i0, i1], 1), np.stack([lam0, lam1], 1)


def _cubic_near(ft, t, a):
    return ((a + ft(2)) * t - (a + ft(3))) * t * t + ft(1)


def _cubic_far(ft, t, a):
    return ((a * t - ft(5) * a) * t + ft(8) * a) * t - ft(4) * a


def _cubic_taps(ft, wt, n_in: int, n_out: int, align_corners: bool, scale):
    """Bicubic (A = -0.75): four input indices (clamped to the edge) and weights (rounded to ``wt``) per output
    index."""
    src = _source_index(ft, _area_scale(ft, n_in, n_out, align_corners, scale), n_out, align_corners, cubic=True)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    t = np.clip(src - i0.astype(ft), ft(0), ft(1)).astype(ft)
    a = ft(-0.75)
    w = [_cubic_far(ft, t + ft(1), a), _cubic_near(ft, t, a), _cubic_near(ft, ft(1) - t, a)]
    w.append(_cubic_far(ft, (ft(1) - t) + ft(1), a))
    idx = np.stack([np.clip(i0 - 1 + k, 0, n_in - 1) for k in range(4)], 1)
    return idx, np.stack(w, 1).astype(wt).astype(ft)


# ---- antialiased filters (``_compute_weights_aa``): a filter of ``support`` taps, widened by the downscale ----


def _filter_linear(ft, x):
    x = np.abs(x)
    return np.where(x < 1, ft(1) - x, ft(0)).astype(ft)


def _filter_cubic(ft, x):  # a = -0.5, as Pillow
    x, a = np.abs(x), ft(-0.5)
    return np.where(x < 1, _cubic_near(ft, x, a), np.where(x < 2, _cubic_far(ft, x, a), ft(0))).astype(ft)


def _filter_lanczos(ft, x):  # a = 3
    x = x.astype(np.float64)
    out = np.where(np.abs(x) < 3, np.sinc(x) * np.sinc(x / 3), 0.0)
    return out.astype(ft)


_AA_FILTERS = {"bilinear": (2, _filter_linear), "bicubic": (4, _filter_cubic), "lanczos": (6, _filter_lanczos)}


def _aa_taps(ft, wt, kind: str, n_in: int, n_out: int, align_corners: bool, scale):
    """The antialiased ops' input indices and normalized weights per output index (in ``ft``: ``wt`` unused)."""
    interp_size, filt = _AA_FILTERS[kind]
    step = _area_scale(ft, n_in, n_out, align_corners, scale)
    support = ft(interp_size * 0.5 * step) if step >= 1 else ft(interp_size * 0.5)
    width = int(math.ceil(support)) * 2 + 1
    invscale = ft(1.0 / step) if step >= 1 else ft(1)
    idx = np.zeros((n_out, width), np.int64)
    wts = np.zeros((n_out, width), ft)
    for i in range(n_out):
        center = ft(np.float64(step) * (i + 0.5))
        lo = max(int(np.float64(center - support) + 0.5), 0)
        size = min(max(min(int(np.float64(center + support) + 0.5), n_in) - lo, 0), width)
        j = np.arange(size)
        w = filt(ft, ((j + lo).astype(ft) - center + 0.5) * np.float64(invscale))
        total = w.sum(dtype=ft)
        idx[i, :size] = j + lo
        wts[i, :size] = w / total if total != 0 else w
    return idx, wts


# ---- applying them ----


def _apply_axis(x, axis: int, idx, wts):
    """``y[..., o, ...] = sum_k x[..., idx[o, k], ...] * wts[o, k]`` along ``axis`` (a gather, or for a wide
    filter one matrix product)."""
    if wts is None:
        n_in, n_out = x.shape[axis], idx.shape[0]
        if n_out % n_in == 0 and np.array_equal(idx[:, 0], np.arange(n_out) // (n_out // n_in)):
            # an integer upscale (a UNet's 2x): a broadcast, whose transpose is a sum, not a scatter-add
            return jnp.repeat(x, n_out // n_in, axis=axis)
        return jnp.take(x, jnp.asarray(idx[:, 0], jnp.int32), axis=axis)
    if idx.shape[1] > 4:  # an antialiased downscale: a dense (out, in) matrix
        mat = np.zeros((idx.shape[0], x.shape[axis]), wts.dtype)
        np.add.at(mat, (np.repeat(np.arange(idx.shape[0]), idx.shape[1]), idx.ravel()), wts.ravel())
        out = jnp.tensordot(x, jnp.asarray(mat.T), axes=([axis], [0]), precision=jax.lax.Precision.HIGHEST)
        return jnp.moveaxis(out, -1, axis)
    shape = [1] * x.ndim
    shape[axis] = idx.shape[0]
    terms = [
        jnp.take(x, jnp.asarray(idx[:, k], jnp.int32), axis=axis) * jnp.asarray(wts[:, k]).reshape(shape)
        for k in range(idx.shape[1])
    ]
    return functools.reduce(jnp.add, terms)


def _compute_type(dtype):
    """The array type the kernel computes in (``opmath_t``), its NumPy float type, and the type its interpolation
    weights are kept in (the tensor's own half-precision type, else the compute type)."""
    if dtype == jnp.float64:
        return jnp.float64, np.float64, np.float64
    half = dtype in (jnp.bfloat16, jnp.float16)
    return jnp.float32, np.float32, (np.dtype(dtype) if half else np.float32)


def _fixed_point(wts):
    """The uint8 kernel's int16 weights: scaled by the largest power of two that keeps them below 2**15."""
    wmax, bits = float(wts.max()), 0
    while bits < 22 and int(0.5 + wmax * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    scaled = wts.astype(np.float64) * (1 << bits)
    return np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32), bits


def _apply_axis_integer(x, axis: int, idx, wts):
    """One axis of the uint8 kernel (Pillow's): fixed-point weights, rounded and clipped to uint8 per axis."""
    ints, bits = _fixed_point(wts)
    shape = [1] * x.ndim
    shape[axis] = idx.shape[0]
    acc = functools.reduce(
        jnp.add,
        [
            jnp.take(x, jnp.asarray(idx[:, k], jnp.int32), axis=axis).astype(jnp.int32)
            * jnp.asarray(ints[:, k]).reshape(shape)
            for k in range(idx.shape[1])
        ],
    )
    info = jnp.iinfo(x.dtype)
    return jnp.clip((acc + (1 << (bits - 1))) >> bits, info.min, info.max).astype(x.dtype)


def _resample(x, out_sizes, scales, taps, like=None):
    """``x`` (N, C, *spatial) resized to ``out_sizes``; ``taps(ft, wt, n_in, n_out, scale)`` gives each axis's
    indices and weights. Interpolating modes compute in float32 (float64 for float64) and round once, as the CPU
    kernels do; uint8 inputs take the fixed-point arithmetic of PyTorch's uint8 kernel. ``like``: the dtype whose
    weights to use (a backward op transposes this in float32 for a half-precision gradient)."""
    nd = len(out_sizes)
    scales = list(scales) + [None] * (nd - len(scales))
    dtype = x.dtype
    jt, ft, wt = _compute_type(like or dtype)
    integer = jnp.issubdtype(dtype, jnp.integer)
    y = x
    for axis in reversed(range(nd)):  # the fastest axis first
        idx, wts = taps(ft, wt, x.shape[2 + axis], out_sizes[axis], scales[axis])
        if wts is not None and integer:
            y = _apply_axis_integer(y, 2 + axis, idx, wts)
            continue
        if wts is not None and y.dtype != jt:
            y = y.astype(jt)
        y = _apply_axis(y, 2 + axis, idx, wts)
    return y.astype(dtype)


def _transpose(forward, g, in_shape):
    """The backward of a linear resize: its transpose applied to ``g`` (in the compute type, as the CPU kernels
    accumulate half-precision gradients in float32)."""
    jt = _compute_type(g.dtype)[0]
    spec = jax.ShapeDtypeStruct(tuple(in_shape), jt)
    (out,) = jax.linear_transpose(forward, spec)(g.astype(jt))
    return out.astype(g.dtype)


_MODES = {
    "nearest": lambda ft, wt, i, o, s: _nearest_taps(i, o, s, exact=False),
    "nearest_exact": lambda ft, wt, i, o, s: _nearest_taps(i, o, s, exact=True),
}


def _interp_taps(kind: str, align_corners: bool):
    if kind == "linear":
        return lambda ft, wt, i, o, s: _linear_taps(ft, wt, i, o, align_corners, s)
    if kind == "linear2d":  # the 2-d kernel keeps half-precision weights in float32
        return lambda ft, wt, i, o, s: _linear_taps(ft, ft, i, o, align_corners, s)
    if kind == "cubic":
        return lambda ft, wt, i, o, s: _cubic_taps(ft, wt, i, o, align_corners, s)
    return lambda ft, wt, i, o, s: _aa_taps(ft, wt, kind, i, o, align_corners, s)


# ---- the ops ----


def _nearest(mode, ctx, x, output_size, *scales):
    return _resample(x, list(output_size), scales, _MODES[mode])


def _nearest_backward(mode, ctx, g, output_size, input_size, *scales):
    forward = functools.partial(_resample, out_sizes=list(output_size), scales=scales, taps=_MODES[mode], like=g.dtype)
    return _transpose(forward, g, input_size)


def _interp(kind, ctx, x, output_size, align_corners, *scales):
    return _resample(x, list(output_size), scales, _interp_taps(kind, align_corners))


def _interp_backward(kind, ctx, g, output_size, input_size, align_corners, *scales):
    taps = _interp_taps(kind, align_corners)
    forward = functools.partial(_resample, out_sizes=list(output_size), scales=scales, taps=taps, like=g.dtype)
    return _transpose(forward, g, input_size)


def _register(ops: list[str], rule) -> None:
    for name in ops:
        lowers(getattr(aten, name).default)(rule)


for _mode, _prefix in (("nearest", "upsample_nearest"), ("nearest_exact", "_upsample_nearest_exact")):
    _register([f"{_prefix}{d}d" for d in (1, 2, 3)], functools.partial(_nearest, _mode))
    _register([f"{_prefix}{d}d_backward" for d in (1, 2, 3)], functools.partial(_nearest_backward, _mode))

for _kind, _ops in (
    ("linear", ["upsample_linear1d", "upsample_trilinear3d"]),
    ("linear2d", ["upsample_bilinear2d"]),
    ("cubic", ["upsample_bicubic2d"]),
    ("bilinear", ["_upsample_bilinear2d_aa"]),
    ("bicubic", ["_upsample_bicubic2d_aa"]),
    ("lanczos", ["_upsample_lanczos2d_aa"]),
):
    _register(_ops, functools.partial(_interp, _kind))
    _register([f"{op}_backward" for op in _ops], functools.partial(_interp_backward, _kind))
