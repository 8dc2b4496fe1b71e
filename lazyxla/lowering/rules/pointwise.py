"""Lowering rules: pointwise ops (arithmetic, math functions, comparisons, activations) and fills.

PyTorch computes a pointwise op in the operands' common dtype. Where that is the output dtype
(arithmetic), rules cast their operands to ``ctx.dtype``; where it is not (comparisons), they
compute it with ``common_dtype``. jax's own promotion differs from PyTorch's (int64 + float32 is
float64 in jax), so no rule leaves promotion to jax.
"""

from __future__ import annotations

import functools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from lazyxla import torch_private
from lazyxla.device.devices import np_dtype, torch_dtype
from lazyxla.lowering.registry import lowers, opmath_scalars

aten = torch.ops.aten


def _as(x, dt):
    """An operand (array or Python number) as an array of dtype ``dt``.

    A Python int outside an integer dtype's range wraps around, as PyTorch's casts do (uint8: -3 -> 253).
    """
    if type(x) is int and jnp.issubdtype(dt, jnp.integer):
        return jnp.asarray(np.array(x, dtype=np.int64).astype(dt))
    return jnp.asarray(x, dt)


@functools.cache
def _common_of(spec: tuple) -> np.dtype:
    operands = [
        s if isinstance(s, (bool, int, float, complex)) else torch.empty((1,) * s[0], dtype=s[1], device="meta")
        for s in spec
    ]
    return np_dtype(torch_private.elementwise_result_dtype(*operands))


def common_dtype(*xs) -> np.dtype:
    """PyTorch's common dtype of ``xs``: arrays count as tensors (0-d ones as 0-d tensors), numbers as numbers."""
    spec = tuple(
        (min(x.ndim, 1), torch_dtype(x.dtype)) if hasattr(x, "dtype") else type(x)(0) for x in xs if x is not None
    )
    return _common_of(spec)


def _scaled(b, alpha, dt):
    b = _as(b, dt)
    return b if isinstance(alpha, (int, float)) and alpha == 1 else b * _as(alpha, dt)


# ---- generic rules: partial over a jax function ----


def _unary(f, ctx, x):
    # a complex input keeps its dtype when the output is real (abs, angle): the driver casts the result
    return f(x if jnp.iscomplexobj(x) else x.astype(ctx.dtype))


def _predicate(f, ctx, x):
    return f(x)


def _binary(f, ctx, a, b):
    dt = ctx.dtype
    return f(_as(a, dt), _as(b, dt))


def _compare(f, ctx, a, b):
    dt = common_dtype(a, b)
    return f(_as(a, dt), _as(b, dt))


def _truth(x):
    return x if x.dtype == np.bool_ else x != 0


def _logical(f, ctx, a, b):
    return f(_truth(a), _truth(b))


# ---- arithmetic ----


def _add(ctx, a, b, alpha=1):
    return _as(a, ctx.dtype) + _scaled(b, alpha, ctx.dtype)


def _sub(ctx, a, b, alpha=1):
    return _as(a, ctx.dtype) - _scaled(b, alpha, ctx.dtype)


def _rsub(ctx, a, b, alpha=1):
    return _as(b, ctx.dtype) - _scaled(a, alpha, ctx.dtype)


def _div_trunc(a, b):
    if jnp.issubdtype(a.dtype, jnp.integer):
        return lax.div(*jnp.broadcast_arrays(a, b))
    return jnp.trunc(a / b)


def _div_floor(a, b):
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        return jnp.floor_divide(a, b)
    # PyTorch's div_floor_floating, step by step (Python's float floor division)
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = jnp.floor(div)
    floor = jnp.where(div - floor > 0.5, floor + 1, floor)
    floor = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floor)
    return jnp.where(b == 0, a / b, floor)


_DIV_MODES = {None: jnp.true_divide, "trunc": _div_trunc, "floor": _div_floor}


def _div(ctx, a, b, rounding_mode=None):
    return _binary(_DIV_MODES[rounding_mode], ctx, a, b)


def _int_pow(a, b):
    # PyTorch's integer powers with negative exponents: 1 and -1 keep their magnitude, the rest give 0
    p = jnp.power(a, jnp.maximum(b, 0))
    odd = (b & 1).astype(np.bool_)
    tiny = jnp.where(a == 1, 1, jnp.where(a == -1, jnp.where(odd, -1, 1), 0)).astype(a.dtype)
    return jnp.where(b < 0, tiny, p)


def _pow(ctx, a, b):
    # a Python int exponent stays static: lax.integer_pow is exact, as PyTorch's integer powers are
    if type(b) is int:
        return jnp.power(_as(a, ctx.dtype), b)
    a, b = _as(a, ctx.dtype), _as(b, ctx.dtype)
    return _int_pow(a, b) if jnp.issubdtype(ctx.dtype, jnp.integer) else jnp.power(a, b)


def _round_decimals(ctx, x, decimals=0):
    x = x.astype(ctx.dtype)
    if decimals >= 0:
        scale = _as(10.0**decimals, ctx.dtype)
        return jnp.round(x * scale) / scale
    scale = _as(10.0**-decimals, ctx.dtype)
    return jnp.round(x / scale) * scale


def _sign(x):
    # PyTorch's (0 < x) - (x < 0): NaN has sign 0
    return x if x.dtype == np.bool_ else (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _sgn(x):
    # complex: z / |z|, 0 at 0 (PyTorch's complex division: an infinite z gives nan)
    return jnp.where(x == 0, 0, x / jnp.abs(x).astype(x.dtype)) if jnp.iscomplexobj(x) else _sign(x)


def _frac(x):
    return x - jnp.trunc(x)


for op, f in [
    (aten.add.Tensor, _add),
    (aten.add.Scalar, _add),
    (aten.sub.Tensor, _sub),
    (aten.sub.Scalar, _sub),
    (aten.rsub.Tensor, _rsub),
    (aten.rsub.Scalar, _rsub),
    (aten.div.Tensor, _div),
    (aten.div.Scalar, _div),
    (aten.div.Tensor_mode, _div),
    (aten.div.Scalar_mode, _div),
    (aten.pow.Tensor_Tensor, _pow),
    (aten.pow.Tensor_Scalar, _pow),
    (aten.pow.Scalar, _pow),
    (aten.round.decimals, _round_decimals),
]:
    lowers(op)(f)

for op, f in [
    (aten.mul.Tensor, jnp.multiply),
    (aten.mul.Scalar, jnp.multiply),
    (aten.floor_divide.default, _div_floor),
    (aten.floor_divide.Scalar, _div_floor),
    (aten.true_divide.Tensor, jnp.true_divide),
    (aten.remainder.Tensor, jnp.remainder),
    (aten.remainder.Scalar, jnp.remainder),
    (aten.remainder.Scalar_Tensor, jnp.remainder),
    (aten.fmod.Tensor, jnp.fmod),
    (aten.fmod.Scalar, jnp.fmod),
    (aten.atan2.default, jnp.arctan2),
    (aten.minimum.default, jnp.minimum),
    (aten.maximum.default, jnp.maximum),
    (aten.fmin.default, jnp.fmin),
    (aten.fmax.default, jnp.fmax),
    (aten.hypot.default, jnp.hypot),
    (aten.copysign.Tensor, jnp.copysign),
    (aten.copysign.Scalar, jnp.copysign),
    (aten.nextafter.default, jnp.nextafter),
    (aten.logaddexp.default, jnp.logaddexp),
    (aten.logaddexp2.default, jnp.logaddexp2),
    (aten.bitwise_and.Tensor, jnp.bitwise_and),
    (aten.bitwise_and.Scalar, jnp.bitwise_and),
    (aten.bitwise_and.Scalar_Tensor, jnp.bitwise_and),
    (aten.bitwise_or.Tensor, jnp.bitwise_or),
    (aten.bitwise_or.Scalar, jnp.bitwise_or),
    (aten.bitwise_or.Scalar_Tensor, jnp.bitwise_or),
    (aten.bitwise_xor.Tensor, jnp.bitwise_xor),
    (aten.bitwise_xor.Scalar, jnp.bitwise_xor),
    (aten.bitwise_xor.Scalar_Tensor, jnp.bitwise_xor),
    (aten.bitwise_left_shift.Tensor, jnp.left_shift),
    (aten.bitwise_left_shift.Tensor_Scalar, jnp.left_shift),
    (aten.bitwise_left_shift.Scalar_Tensor, jnp.left_shift),
    (aten.bitwise_right_shift.Tensor, jnp.right_shift),
    (aten.bitwise_right_shift.Tensor_Scalar, jnp.right_shift),
    (aten.bitwise_right_shift.Scalar_Tensor, jnp.right_shift),
    (aten.__lshift__.Tensor, jnp.left_shift),
    (aten.__lshift__.Scalar, jnp.left_shift),
    (aten.__rshift__.Tensor, jnp.right_shift),
    (aten.__rshift__.Scalar, jnp.right_shift),
]:
    lowers(op)(partial(_binary, f))

# ---- unary math: computed in the output dtype (an int input of sin is computed as float) ----
# (CompositeImplicitAutograd ops such as square, positive and isfinite never get here: PyTorch
# decomposes them above the lazy layer.)

for op, f in [
    (aten.neg.default, jnp.negative),
    (aten.abs.default, jnp.abs),
    (aten.sign.default, _sign),
    (aten.sgn.default, _sgn),
    (aten._conj_copy.default, jnp.conj),
    (aten.conj_physical.default, jnp.conj),
    (aten._conj_physical.default, jnp.conj),
    (aten.exp.default, jnp.exp),
    (aten.exp2.default, jnp.exp2),
    (aten.expm1.default, jnp.expm1),
    (aten.log.default, jnp.log),
    (aten.log2.default, jnp.log2),
    (aten.log10.default, jnp.log10),
    (aten.log1p.default, jnp.log1p),
    (aten.sqrt.default, jnp.sqrt),
    (aten.rsqrt.default, lax.rsqrt),
    (aten.reciprocal.default, jnp.reciprocal),
    (aten.sin.default, jnp.sin),
    (aten.cos.default, jnp.cos),
    (aten.tan.default, jnp.tan),
    (aten.asin.default, jnp.arcsin),
    (aten.acos.default, jnp.arccos),
    (aten.atan.default, jnp.arctan),
    (aten.sinh.default, jnp.sinh),
    (aten.cosh.default, jnp.cosh),
    (aten.tanh.default, jnp.tanh),
    (aten.asinh.default, jnp.arcsinh),
    (aten.acosh.default, jnp.arccosh),
    (aten.atanh.default, jnp.arctanh),
    (aten.sigmoid.default, jax.nn.sigmoid),
    (aten.erf.default, jax.scipy.special.erf),
    (aten.erfc.default, jax.scipy.special.erfc),
    (aten.erfinv.default, jax.scipy.special.erfinv),
    (aten.lgamma.default, jax.scipy.special.gammaln),
    (aten.i0.default, jax.scipy.special.i0),
    (aten.sinc.default, jnp.sinc),
    (aten.deg2rad.default, jnp.deg2rad),
    (aten.rad2deg.default, jnp.rad2deg),
    (aten.floor.default, jnp.floor),
    (aten.ceil.default, jnp.ceil),
    (aten.round.default, jnp.round),
    (aten.trunc.default, jnp.trunc),
    (aten.frac.default, _frac),
    (aten.bitwise_not.default, jnp.bitwise_not),
]:
    lowers(op)(partial(_unary, f))

# ---- predicates: on the input as it is ----

for op, f in [
    (aten.isnan.default, jnp.isnan),
    (aten.isinf.default, jnp.isinf),
    (aten.isposinf.default, jnp.isposinf),
    (aten.isneginf.default, jnp.isneginf),
    (aten.signbit.default, jnp.signbit),
    (aten.logical_not.default, jnp.logical_not),
]:
    lowers(op)(partial(_predicate, f))

for op, f in [
    (aten.eq.Tensor, jnp.equal),
    (aten.eq.Scalar, jnp.equal),
    (aten.ne.Tensor, jnp.not_equal),
    (aten.ne.Scalar, jnp.not_equal),
    (aten.lt.Tensor, jnp.less),
    (aten.lt.Scalar, jnp.less),
    (aten.le.Tensor, jnp.less_equal),
    (aten.le.Scalar, jnp.less_equal),
    (aten.gt.Tensor, jnp.greater),
    (aten.gt.Scalar, jnp.greater),
    (aten.ge.Tensor, jnp.greater_equal),
    (aten.ge.Scalar, jnp.greater_equal),
]:
    lowers(op)(partial(_compare, f))

for op, f in [
    (aten.logical_and.default, jnp.logical_and),
    (aten.logical_or.default, jnp.logical_or),
    (aten.logical_xor.default, jnp.logical_xor),
]:
    lowers(op)(partial(_logical, f))


# ---- selection, clamping, special cases ----


@lowers(aten.where.self)
def _where(ctx, cond, a, b):
    return jnp.where(cond.astype(np.bool_), _as(a, ctx.dtype), _as(b, ctx.dtype))


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx, x, mask, value):
    return jnp.where(mask, _as(value, ctx.dtype), x.astype(ctx.dtype))


@lowers(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx, x, min=None, max=None):
    x = x.astype(ctx.dtype)
    if min is not None:
        x = jnp.maximum(x, _as(min, ctx.dtype))
    if max is not None:
        x = jnp.minimum(x, _as(max, ctx.dtype))
    return x


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(ctx, x, min):
    return _clamp(ctx, x, min=min)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(ctx, x, max):
    return _clamp(ctx, x, max=max)


@lowers(aten.nan_to_num.default)
def _nan_to_num(ctx, x, nan=None, posinf=None, neginf=None):
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx, a, b, weight):
    dt = ctx.dtype
    a, b, w = _as(a, dt), _as(b, dt), _as(weight, dt)
    # PyTorch's formula, exact at both ends: a + w * (b - a) where |w| < 0.5, else b - (b - a) * (1 - w), written as
    # one product of selected operands (b + (w - 1) * (b - a) is the same number, bit for bit): for a Python-number
    # weight (AdamW's moments) the weight's select is a scalar one, and each element takes one select and one product
    small = jnp.abs(w) < 0.5
    full = partial(jnp.broadcast_to, shape=ctx.shape)
    base = lax.select(full(small), full(a), full(b))
    return base + lax.select(small, w, w - 1) * (b - a)


@lowers(aten.addcmul.default)
def _addcmul(ctx, x, t1, t2, value=1):
    dt = ctx.dtype
    return _as(x, dt) + _scaled(t1, value, dt) * _as(t2, dt)


@lowers(aten.addcdiv.default)
def _addcdiv(ctx, x, t1, t2, value=1):
    dt = ctx.dtype
    return _as(x, dt) + _scaled(t1, value, dt) / _as(t2, dt)


@lowers(aten.heaviside.default)
def _heaviside(ctx, x, values):
    dt = ctx.dtype
    x = _as(x, dt)
    return jnp.where(x == 0, _as(values, dt), (x > 0).astype(dt))


@lowers(aten.complex.default)
def _complex(ctx, re, im):
    return lax.complex(*(jnp.broadcast_to(x, ctx.shape) for x in (re, im))).astype(ctx.dtype)


@lowers(aten.polar.default)
def _polar(ctx, r, theta):
    r, theta = (jnp.broadcast_to(x, ctx.shape) for x in (r, theta))
    return lax.complex(r * jnp.cos(theta), r * jnp.sin(theta)).astype(ctx.dtype)


@lowers(aten.logit.default)
def _logit(ctx, x, eps=None):
    x = x.astype(ctx.dtype)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


# ---- digamma, polygamma: PyTorch's CPU algorithms (Cephes), whose values differ from jax's off the
# positive axis (jax's zeta is wrong for a negative q; its digamma gives nan at 0) ----


def _digamma(x):
    # PyTorch: digamma(+-0) = -+inf (C++'s and SciPy's convention); jax gives nan
    return jnp.where(x == 0, jnp.copysign(jnp.asarray(jnp.inf, x.dtype), -x), jax.scipy.special.digamma(x))


def _trigamma(x):
    # float32 (and lower) compute in float32, as PyTorch's ``trigamma(float)``
    sign = jnp.where(x < 0.5, -1.0, 1.0).astype(x.dtype)
    result = jnp.where(x < 0.5, -((np.pi * np.pi) / jnp.square(jnp.sin(np.pi * x))).astype(x.dtype), 0)
    x = jnp.where(x < 0.5, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return sign * result


# Euler-Maclaurin coefficients of Cephes' zeta
_ZETA_A = (
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
)
_MACHEP = 1.11022302462515654042e-16


def _zeta(x: float, q):
    """Hurwitz zeta(x, q) for a constant integer ``x`` > 1, as PyTorch's CPU kernel (Cephes) computes it
    in double from the first term ``q**-x`` in ``q``'s dtype: sum terms
    until ``q + k > 9`` and at least 9 of them (stopping early once they are negligible), then an
    Euler-Maclaurin tail. A negative ``q`` takes as many terms as it needs to pass 9 (a while loop)."""
    s = jnp.power(q, -x).astype(np.float64)  # PyTorch: std::pow(scalar_t, scalar_t), then double
    q = q.astype(np.float64)

    def step(c):
        i, a, b, s, live, early = c
        a1 = a + 1
        b1 = jnp.power(a1, -x)
        s1 = s + b1
        small = (-_MACHEP * s1 < b1) & (b1 < _MACHEP * s1)
        i = i + 1
        upd = lambda new, old: jnp.where(live, new, old)  # noqa: E731
        early = early | (live & small)
        a, b, s = upd(a1, a), upd(b1, b), upd(s1, s)
        live = live & ~small & ((i < 9) | (a <= 9))
        return i, a, b, s, live, early

    pole = (q <= 0) & (q == jnp.floor(q))  # infinite (-inf too: the loop would never pass 9)
    init = (0, q, jnp.zeros_like(q), s, ~pole, pole)
    _, a, b, s, _, done = lax.while_loop(lambda c: jnp.any(c[4]), step, init)
    w = a
    s = s + b * w / (x - 1) - 0.5 * b
    a, k = 1.0, 0.0
    for coef in _ZETA_A:
        a = a * (x + k)
        b = b / w
        t = a * b / coef
        s = jnp.where(done, s, s + t)
        done = done | (jnp.abs(t / s) < _MACHEP)
        k += 1
        a = a * (x + k)
        b = b / w
        k += 1
    return jnp.where(pole, jnp.inf, s)


def _float32_at_least(x, dt):
    # PyTorch computes these in float for float16/bfloat16
    return x.astype(dt if dt == np.float64 else np.dtype(np.float32))


@lowers(aten.digamma.default)
def _digamma_rule(ctx, x):
    return _digamma(_float32_at_least(x, ctx.dtype))


@lowers(aten.polygamma.default)
def _polygamma(ctx, n, x):
    x = _float32_at_least(x, ctx.dtype)
    ct = x.dtype
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    # (-1)^(n+1) n! zeta(n+1, x), zeta accumulated in float64 (PyTorch's acc_type on the CPU)
    z = _zeta(float(n + 1), x).astype(ct)
    return (1 if n % 2 else -1) * jnp.exp(jax.scipy.special.gammaln(jnp.asarray(n + 1.0, ct))) * z


# ---- activations ----


def _relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


def _silu(x):
    return x * jax.nn.sigmoid(x)


def _mish(x):
    return x * jnp.tanh(jnp.logaddexp(x, 0))


def _hardsigmoid(x):
    return jnp.clip(x + 3, 0, 6) / 6


def _hardswish(x):
    return x * jnp.clip(x + 3, 0, 6) / 6


for op, f in [
    (aten.relu.default, _relu),
    (aten.silu.default, _silu),
    (aten.mish.default, _mish),
    (aten.hardsigmoid.default, _hardsigmoid),
    (aten.hardswish.default, _hardswish),
]:
    lowers(op)(partial(_unary, f))


@lowers(aten.leaky_relu.default)
def _leaky_relu(ctx, x, negative_slope=0.01):
    x = x.astype(ctx.dtype)
    return jnp.where(x > 0, x, x * _as(negative_slope, ctx.dtype))


@lowers(aten.hardtanh.default)
def _hardtanh(ctx, x, min_val=-1, max_val=1):
    return _clamp(ctx, x, min_val, max_val)


@lowers(aten.softplus.default)
def _softplus(ctx, x, beta=1, threshold=20):
    dt = ctx.dtype
    x = x.astype(dt)
    bx = x * _as(beta, dt)
    return jnp.where(bx > _as(threshold, dt), x, jnp.log1p(jnp.exp(bx)) / _as(beta, dt))


@lowers(aten.elu.default)
def _elu(ctx, x, alpha=1, scale=1, input_scale=1):
    dt = ctx.dtype
    x = x.astype(dt)
    neg = jnp.expm1(x * _as(input_scale, dt)) * (_as(alpha, dt) * _as(scale, dt))
    return jnp.where(x > 0, x * _as(scale, dt), neg)


@lowers(aten.threshold.default)
def _threshold(ctx, x, threshold, value):
    dt = ctx.dtype
    x = x.astype(dt)
    return jnp.where(x <= _as(threshold, dt), _as(value, dt), x)


# ---- fills and factories ----


@lowers(aten.fill.Scalar, aten.fill.Tensor, aten.full_like.default)
def _fill(ctx, x, value, **_):
    return jnp.broadcast_to(_as(value, ctx.dtype), ctx.shape)


@lowers(aten.full.default)
def _full(ctx, size, value, **_):
    return jnp.broadcast_to(_as(value, ctx.dtype), ctx.shape)


@lowers(aten.scalar_tensor.default)
def _scalar_tensor(ctx, value, **_):
    return _as(value, ctx.dtype)


def _const(value, ctx, *_, **__):
    return jnp.full(ctx.shape, value, ctx.dtype)


for op, value in [
    (aten.zero.default, 0),
    (aten.zeros_like.default, 0),
    (aten.empty_like.default, 0),
    (aten.new_empty_strided.default, 0),
    (aten.ones_like.default, 1),
]:
    lowers(op)(partial(_const, value))


def _wide(dt: np.dtype) -> np.dtype:
    """The dtype PyTorch's CPU kernels compute ranges in: double for floats, int64 for integers."""
    return np.dtype(np.float64) if jnp.issubdtype(dt, jnp.inexact) else np.dtype(np.int64)


@lowers(aten.arange.start_step, aten.arange.start)
def _arange(ctx, start, end, step=1, **_):
    wide = _wide(ctx.dtype)
    return _as(start, wide) + jnp.arange(ctx.shape[0], dtype=wide) * _as(step, wide)


@lowers(aten.range.step, aten.range.default)
def _range(ctx, start, end, step=1, **_):
    # torch.range includes ``end``: its meta kernel gives the length, the values are arange's
    return _arange(ctx, start, end, step)


@lowers(aten.arange.default)
def _arange_end(ctx, end, **_):
    return _arange(ctx, 0, end)


@lowers(aten.linspace.default)
def _linspace(ctx, start, end, steps, **_):
    # PyTorch's CPU kernel: from the start for the first half, from the end for the second
    ct = ctx.dtype if jnp.issubdtype(ctx.dtype, jnp.inexact) else np.dtype(np.float64)
    if steps == 1:
        return jnp.full((1,), start, ct)
    start, end = _as(start, ct), _as(end, ct)
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps)
    return jnp.where(i < steps // 2, start + step * i.astype(ct), end - step * (steps - 1 - i).astype(ct))


@lowers(aten.logspace.default)
def _logspace(ctx, start, end, steps, base=10.0, **_):
    # PyTorch's CPU kernel: start and end in the output dtype, exponents and powers in double (complex:
    # all in the output dtype); from the start for the first half, from the end for the second
    dt = ctx.dtype
    if steps <= 1:
        exponent = complex(start) if jnp.issubdtype(dt, jnp.complexfloating) else float(start)
        with np.errstate(all="ignore"):
            return jnp.full((steps,), np.power(np.float64(base), exponent), dt)
    ct = dt if jnp.issubdtype(dt, jnp.complexfloating) else np.dtype(np.float64)
    s, e = np.asarray(start).astype(dt), np.asarray(end).astype(dt)
    step = np.asarray(e - s).astype(ct) / ct.type(steps - 1)
    i = jnp.arange(steps)
    exponent = jnp.where(
        i < steps // 2, s.astype(ct) + step * i.astype(ct), e.astype(ct) - step * (steps - 1 - i).astype(ct)
    )
    out = jnp.power(jnp.asarray(base, ct), exponent)
    # an integer result converts through int64, so out-of-range values wrap as on the CPU (uint8: 256 -> 0)
    return out.astype(np.int64).astype(dt) if jnp.issubdtype(dt, jnp.integer) else out


@lowers(aten.eye.default, aten.eye.m)
def _eye(ctx, n, m=None, **_):
    return jnp.eye(n, m, dtype=ctx.dtype)


@lowers(aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta)
def _kaiser_window(ctx, window_length, periodic=True, beta=12.0, **_):
    # PyTorch's CPU kernel: i0(beta * sqrt(|1 - ((a - alpha) / alpha)^2|)) / i0(beta) over a = arange(n) in the
    # output dtype, alpha = (n - 1) / 2, in float32 (float64 for float64); periodic: n + 1 points, the last dropped
    if window_length <= 1:
        return jnp.ones((window_length,), ctx.dtype)
    n = window_length + 1 if periodic else window_length
    ct = np.dtype(np.float64) if ctx.dtype == np.float64 else np.dtype(np.float32)
    a = jnp.arange(n).astype(ctx.dtype).astype(ct)
    alpha, b = ct.type((n - 1) / 2.0), ct.type(beta)
    i0 = jax.scipy.special.i0
    window = i0(b * jnp.sqrt(jnp.abs(1 - ((a - alpha) / alpha) ** 2))) / i0(b)
    return window[:window_length].astype(ctx.dtype)


# Row-major like PyTorch's; the indices depend only on the arguments, so they are constants of the program.
@lowers(aten.tril_indices.default)
def _tril_indices(ctx, row, col, offset=0, **_):
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)).reshape(2, -1), ctx.dtype)


@lowers(aten.triu_indices.default)
def _triu_indices(ctx, row, col, offset=0, **_):
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)).reshape(2, -1), ctx.dtype)


# PyTorch's CPU kernels compute these in float32 when a Python float meets a half-precision tensor (measured
# against torch 2.13, tests/test_autocast.py): with the float in float32, or (add, sub with their alpha) rounded
# to the tensor's dtype first; pow, fmod, remainder and comparisons round it and compute in the tensor's
# dtype, which the default scalar dtype already does.
opmath_scalars(
    aten.add.Tensor,
    aten.add.Scalar,
    aten.sub.Tensor,
    aten.sub.Scalar,
    aten.rsub.Tensor,
    aten.rsub.Scalar,
    scalar="rounded",
)
opmath_scalars(
    aten.addcdiv.default,
    aten.mul.Tensor,
    aten.mul.Scalar,
    aten.div.Tensor,
    aten.div.Scalar,
    aten.div.Tensor_mode,
    aten.div.Scalar_mode,
    aten.lerp.Scalar,
    aten.addcmul.default,
    aten.leaky_relu.default,
    aten.elu.default,
    aten.softplus.default,
    aten.threshold.default,
)
