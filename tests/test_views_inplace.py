"""Views and in-place ops give eager's results (functionalization under the hood)."""

from __future__ import annotations

import pytest
import torch


def _cases():
    def add_row(x):
        x[1].add_(1)
        return x

    def t_(x):
        x.t_()
        return x

    def view_mul(x):
        x.view(-1).mul_(2)
        return x

    def unsqueeze_set(x):
        x.unsqueeze(0)[0, 0] = 5
        return x

    def no_grad_copy(x):
        q = torch.arange(12.0).reshape(3, 4).to(x.device)
        with torch.no_grad():
            x.copy_(q)
        return x

    def zero_col(x):
        torch.zero_(x[:, 1])
        return x

    def slice_assign(x):
        x[::2] = x[1]
        return x

    def chained_views(x):
        v = x[:, 1:3]
        v.mul_(10)
        v[0].fill_(-1)
        return x, v

    return [add_row, t_, view_mul, unsqueeze_set, no_grad_copy, zero_col, slice_assign, chained_views]


@pytest.mark.parametrize("fn", _cases(), ids=lambda f: f.__name__)
def test_view_and_inplace_semantics(fn, dev):
    base = torch.arange(12.0).reshape(3, 4)
    expected = fn(base.clone())
    actual = fn(base.clone().to(dev))
    if isinstance(expected, tuple):
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.cpu(), e)
    else:
        torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("number", [0.1, 3, True], ids=["float", "int", "bool"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("op", ["mul", "add", "div"])
def test_out_calls_with_a_number_operand_match_cpu(op, dtype, number, dev):
    """``torch.mul(x, 0.25, out=y)`` (and PyTorch's C++ code, e.g. DDP averaging gradients with ``mul_out``)
    passes the number wrapped as a tensor; lazyxla's out= check kernel received it as a Python number and
    its boxed call raised "Expected a value of type 'Tensor' for argument 'other'"."""
    x = torch.arange(1, 5).to(dtype)
    expected = getattr(torch, op)(x, number)
    out_cpu = torch.empty(4, dtype=expected.dtype)
    getattr(torch, op)(x, number, out=out_cpu)
    out = torch.empty(4, dtype=expected.dtype, device=dev)
    getattr(torch, op)(x.to(dev), number, out=out)
    got = out.cpu()
    assert got.dtype == out_cpu.dtype
    tol = {"rtol": 1e-3, "atol": 1e-3} if dtype == torch.float16 else {"rtol": 1e-6, "atol": 0}
    torch.testing.assert_close(got, out_cpu, **tol)
