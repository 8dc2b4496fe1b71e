"""Two ops torch_xla code calls that lazyxla now runs on the device:

- ``lazyxla.optimization_barrier_`` (torch_xla's ``xm.optimization_barrier_``): one XLA optimization barrier over a
  group of tensors, in place, values unchanged, autograd untouched; one program in eager mode.
- ``torch.allclose``: PyTorch's composite (``isclose``, ``all``, one host read) instead of the whole op on the
  CPU; in eager mode its pieces are programs of their own, as on any backend without an allclose kernel.
"""

from __future__ import annotations

import math

import pytest
import torch

import lazyxla
import lazyxla.compat as compat


@pytest.fixture(autouse=True)
def _lazy_mode_after():
    yield
    lazyxla.eager_mode(False)


def test_barrier_keeps_values_and_appears_in_the_program(dev):
    a, b = torch.randn(3, 4), torch.arange(5.0)
    x, y = a.to(dev) * 2, b.to(dev)
    x_view = x[1]  # a view sees the barrier's output as it would an in-place op's
    lazyxla.optimization_barrier_([x, y])
    hlo = lazyxla.debug.stablehlo_text([x, y])
    barrier = [line for line in hlo.splitlines() if "stablehlo.optimization_barrier" in line]
    assert len(barrier) == 1 and "tensor<3x4xf32>, tensor<5xf32>" in barrier[0]  # one barrier over both
    lazyxla.sync()
    assert lazyxla.metrics.counters()["executions"] == 1  # x, y and the view: one program
    torch.testing.assert_close(x.cpu(), a * 2)
    torch.testing.assert_close(y.cpu(), b)
    torch.testing.assert_close(x_view.cpu(), (a * 2)[1])


def test_barrier_leaves_autograd_alone(dev):
    w = torch.randn(4, requires_grad=True)
    wd = w.detach().to(dev).requires_grad_()
    h = wd * 3
    version, grad_fn = h._version, h.grad_fn
    lazyxla.optimization_barrier_([h])  # h is saved for backward by the product below: no version bump
    assert h._version == version and h.grad_fn is grad_fn
    (h * h).sum().backward()
    ((w * 3) * (w * 3)).sum().backward()
    torch.testing.assert_close(wd.grad.cpu(), w.grad)


def test_barrier_in_eager_mode_is_one_program(dev):
    lazyxla.eager_mode(True)
    t = torch.randn(5, 5, device=dev)
    expected = t.cpu()
    executions = lazyxla.metrics.counters()["executions"]
    lazyxla.optimization_barrier_([t])
    assert lazyxla.metrics.counters()["executions"] == executions + 1
    torch.testing.assert_close(t.cpu(), expected)


def test_barrier_takes_device_tensors_only(dev):
    with pytest.raises(TypeError, match="lazyxla tensors"):
        lazyxla.optimization_barrier_([torch.ones(2)])
    lazyxla.optimization_barrier_([])  # nothing to do


def test_torch_xla_barrier_is_lazyxlas(dev):
    assert compat.install()
    try:
        import torch_xla.core.xla_model as xm

        t = torch.arange(6.0).to(dev) + 1
        xm.optimization_barrier_([t])
        assert "stablehlo.optimization_barrier" in lazyxla.debug.stablehlo_text([t])
        assert t.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    finally:
        compat.uninstall()


CASES = [
    ({}, False),  # NaN != NaN; 2.0 vs 2.0001 is outside the default tolerance
    ({"equal_nan": True}, False),
    ({"equal_nan": True, "atol": 1e-3}, True),
    ({"rtol": 1e-3}, False),
]


@pytest.mark.parametrize("kwargs, expected", CASES)
def test_allclose_runs_on_the_device(dev, kwargs, expected):
    a = torch.tensor([1.0, math.nan, math.inf, 2.0, -math.inf])
    b = torch.tensor([1.0 + 1e-9, math.nan, math.inf, 2.0001, -math.inf])
    assert torch.allclose(a, b, **kwargs) is expected
    assert torch.allclose(a.to(dev), b.to(dev), **kwargs) is expected
    counters = lazyxla.metrics.counters()
    assert not [k for k in counters if k.startswith("fallback.")]  # the whole op used to run on the CPU
    assert counters["scalar_reads"] == 1  # the answer: one host read


def test_allclose_raises_pytorchs_errors(dev):
    a = torch.ones(3)
    with pytest.raises(RuntimeError, match="Float did not match Double"):
        torch.allclose(a, a.double())
    with pytest.raises(RuntimeError, match="Float did not match Double"):
        torch.allclose(a.to(dev), a.double().to(dev))


def test_allclose_in_eager_mode_runs_its_pieces(dev):
    x = torch.randn(4, 4).to(dev)
    lazyxla.eager_mode(True)
    executions = lazyxla.metrics.counters()["executions"]
    assert torch.allclose(x, x + 0)
    assert lazyxla.metrics.counters()["executions"] - executions > 3  # isclose's ops, all: a program each
