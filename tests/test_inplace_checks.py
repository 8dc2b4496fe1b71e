"""Functionalization's in-place meta checks, memoized (lazyxla/frontend/inplace_checks.py): same errors, same
numbers, and PyTorch's Python check runs once per signature."""

from __future__ import annotations

import pytest
import torch

import lazyxla
from lazyxla.frontend import inplace_checks


class _Counting:
    def __init__(self, fail=None):
        self.calls = 0
        self.fail = fail

    def __call__(self, self_, *args, **kwargs):
        self.calls += 1
        if self.fail is not None and self.fail(self_, *args, **kwargs):
            raise RuntimeError("check failed")
        return self_


def test_a_signature_is_checked_once_and_float_values_are_not_part_of_it_for_arithmetic():
    check = _Counting()
    kernel = inplace_checks.memoized(torch.ops.aten.add_.Tensor, check)
    a, b = torch.empty(2, 3, device="meta"), torch.empty(3, device="meta")
    for alpha in (0.5, -0.25, 1e-3):  # an optimizer's changing step size
        assert kernel(a, b, alpha=alpha) is a
    assert check.calls == 1
    kernel(a, b, alpha=2)  # an int is part of the signature (its value)
    kernel(a.to(torch.float64), b, alpha=0.5)  # another dtype
    kernel(a.t(), b[:2], alpha=0.5)  # other sizes and strides
    assert check.calls == 4


def test_float_values_are_part_of_the_signature_where_a_check_reads_them():
    check = _Counting(fail=lambda t, low, high, **_: low > high)
    kernel = inplace_checks.memoized(torch.ops.aten.uniform_.default, check)
    t = torch.empty(4, device="meta")
    kernel(t, 0.0, 1.0)
    with pytest.raises(RuntimeError):
        kernel(t, 2.0, 1.0)  # same types, other values: checked, and it fails
    kernel(t, 0.0, 1.0)
    assert check.calls == 2


def test_errors_are_never_remembered():
    check = _Counting(fail=lambda *a, **k: True)
    kernel = inplace_checks.memoized(torch.ops.aten.mul_.Tensor, check)
    a = torch.empty(3, device="meta")
    for _ in range(3):
        with pytest.raises(RuntimeError):
            kernel(a, a)
    assert check.calls == 3


def test_unhashable_or_symbolic_arguments_are_checked_every_time():
    check = _Counting()
    kernel = inplace_checks.memoized(torch.ops.aten.add_.Tensor, check)
    a = torch.empty(3, device="meta")
    kernel(a, a, alpha=torch.Generator())  # an argument of no known kind
    kernel(a, a, alpha=torch.Generator())
    assert check.calls == 2


@pytest.mark.parametrize(
    "make, op",
    [
        (lambda d: torch.zeros(3, device=d), lambda a, d: a.add_(torch.ones(2, 3, device=d))),  # broadcast into self
        (lambda d: torch.zeros(3, dtype=torch.long, device=d), lambda a, d: a.mul_(torch.rand(3, device=d))),  # cast
        (lambda d: torch.zeros(3, device=d), lambda a, d: a.addcmul_(torch.ones(4, device=d), torch.ones(4, device=d))),
        (lambda d: torch.zeros(3, device=d), lambda a, d: a.lerp_(torch.ones(2, 3, device=d), 0.5)),
        (lambda d: torch.zeros(3, dtype=torch.long, device=d), lambda a, d: a.div_(2)),  # true division
        (lambda d: torch.zeros(3, dtype=torch.half, device=d), lambda a, d: a.addcmul_(a, a.to(torch.complex64))),
    ],
)
def test_lazyxla_raises_the_in_place_errors_cpu_raises_every_time(make, op):
    dev = lazyxla.device()
    with pytest.raises(RuntimeError) as cpu:
        op(make("cpu"), "cpu")
    for _ in range(2):  # the second call's signature is not remembered: the check runs again
        with pytest.raises(RuntimeError) as lazy:
            op(make(dev), dev)
        assert type(lazy.value) is type(cpu.value)


def test_what_the_result_cast_check_lets_through_matches_cpu():
    dev = lazyxla.device()
    for dtype, other in [(torch.half, torch.float32), (torch.float32, 2), (torch.long, 3), (torch.int32, True)]:
        a = torch.ones(3, dtype=dtype)
        b = torch.full((3,), 2, dtype=other) if isinstance(other, torch.dtype) else other
        want = a.clone().mul_(b).add_(b).addcmul_(a, a)
        bb = b.to(dev) if isinstance(b, torch.Tensor) else b
        got = a.to(dev).mul_(bb).add_(bb).addcmul_(a.to(dev), a.to(dev))
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


def test_a_warm_optimizer_step_runs_no_python_meta_check(monkeypatch):
    dev = lazyxla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8).to(dev)

    def step():
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
        lazyxla.sync()

    step()
    step()
    ran = []
    real = torch.ops.aten.addcdiv_.default
    monkeypatch.setattr(inplace_checks, "_signature", lambda *a: ran.append(a) or None)
    step()  # every check misses the memo now: PyTorch's kernels run, and nothing fails
    assert any(a[0] == id(real) for a in ran), "Adam's addcdiv_ check did not reach the memo"
    monkeypatch.undo()
    before = len(inplace_checks._PASSED)
    step()
    assert len(inplace_checks._PASSED) == before  # every signature of a warm step was known


def test_adam_under_the_memo_trains_equal_to_cpu():
    def train(dev):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)  # a new step size every step
        x = torch.linspace(-1, 1, 30).reshape(5, 6).to(dev)
        for _ in range(4):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            sched.step()
        return [p.detach().cpu() for p in model.parameters()]

    for a, b in zip(train(lazyxla.device()), train("cpu")):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_symbolic_shapes_under_torch_compile_still_check():
    @torch.compile(backend="eager", dynamic=True)
    def f(a, b):
        return a.clone().add_(b, alpha=0.5)

    a, b = torch.ones(5), torch.ones(5)
    torch.testing.assert_close(f(a, b), a + 0.5 * b)
    with pytest.raises(RuntimeError):
        f(torch.ones(3), torch.ones(2, 3))
