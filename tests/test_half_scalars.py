"""bfloat16/float16 math with Python floats gives eager PyTorch's bits.

PyTorch's CPU kernels treat a Python float meeting a half-precision tensor in one of three ways, per op
(measured on torch 2.13): ``x * 0.3`` takes 0.3 in float32 and rounds the float32 product once; ``x + 0.3`` and
``torch.add(x, y, alpha=0.3)`` round 0.3 to the tensor's dtype first, then compute in float32; ``x ** 0.3`` and
comparisons compute in the tensor's dtype. lazyxla used to round every such float to bfloat16 first (``x * 0.3``
differed from the CPU in half the elements), and XLA kept fused half-precision intermediates in float32
(``1.1 / x``, PyTorch's ``reciprocal(x) * 1.1``, differed in a third). Both are exact now
(``lowering/registry.opmath_scalars``, ``config.round_half_intermediates``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lazyxla

OPS = {
    "add": lambda t, s: t + s,
    "radd": lambda t, s: s + t,
    "sub": lambda t, s: t - s,
    "rsub": lambda t, s: s - t,
    "mul": lambda t, s: t * s,
    "rdiv": lambda t, s: s / t,
    "pow": lambda t, s: t.abs() ** s,
    "rpow": lambda t, s: s**t,
    "add_alpha": lambda t, s: torch.add(t, t, alpha=s),
    "sub_alpha": lambda t, s: torch.sub(t, t * 2, alpha=s),
    "lerp": lambda t, s: torch.lerp(t, t * 2, s),
    "clamp": lambda t, s: t.clamp(min=-s, max=s),
    "lt": lambda t, s: t < s,
    "eq": lambda t, s: t == s,
    "where": lambda t, s: torch.where(t > 0, t, s),
    "fill": lambda t, s: t.clone().fill_(s),
    "masked_fill": lambda t, s: t.masked_fill(t > 0, s),
    "addcmul": lambda t, s: torch.addcmul(t, t, t, value=s),
    "addcdiv": lambda t, s: torch.addcdiv(t, t, t.abs() + 1, value=s),
    "fmod": lambda t, s: torch.fmod(t, s),
    "remainder": lambda t, s: torch.remainder(t, s),
    "floor_divide": lambda t, s: torch.div(t, s, rounding_mode="floor"),
    "hardtanh": lambda t, s: F.hardtanh(t, -s, s),
    "leaky_relu": lambda t, s: F.leaky_relu(t, s),
    "elu": lambda t, s: F.elu(t, s),
    "threshold": lambda t, s: F.threshold(t, s, 0.3),
    "mul_": lambda t, s: t.clone().mul_(s),
    "chain": lambda t, s: ((t * s).exp() - s) * t.reciprocal(),  # every intermediate rounded, as op by op
}
SCALARS = (1.1, 0.3, 3.7, 1e-3)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_a_python_float_with_half_tensors_gives_eager_bits(name, dtype, dev):
    t = torch.randn(2048, generator=torch.Generator().manual_seed(0)).to(dtype)
    td = t.to(dev)
    for s in SCALARS:
        want, got = OPS[name](t, s), OPS[name](td, s).cpu()
        assert _same(want, got), (s, (want != got).sum().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_division_by_a_python_float_is_within_one_unit_of_eager(dtype, dev):
    """XLA turns ``x / s`` into ``x * (1 / s)`` (its algebraic simplifier), which can round differently from
    PyTorch's float32 division: at most one unit in the last place, in few elements."""
    t = torch.randn(2048, generator=torch.Generator().manual_seed(0)).to(dtype)
    td = t.to(dev)
    for s in SCALARS:
        want, got = t / s, (td / s).cpu()
        ulp = (want.float().abs() * torch.finfo(dtype).eps).clamp(min=torch.finfo(dtype).tiny)
        assert ((want.float() - got.float()).abs() <= ulp).all(), s
        assert (want != got).float().mean() < 0.05, s


def test_xla_keeping_intermediates_in_float32_differs_from_eager(dev):
    """What ``round_half_intermediates`` protects: with it off, the fused ``reciprocal(x) * 1.1`` keeps the
    reciprocal in float32 and a third of the elements differ from eager PyTorch."""
    t = torch.randn(2048, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    want = 1.1 / t
    with lazyxla.config.override(round_half_intermediates=False):
        loose = (1.1 / t.to(dev)).cpu()
    assert not _same(want, loose)
    assert _same(want, (1.1 / t.to(dev)).cpu())
