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


def _copies_or_views():
    """Calls that return a view of a contiguous tensor and a copy of a transposed one, on the CPU."""
    return {
        "reshape": lambda v: v.reshape(-1),
        "reshape_as": lambda v: v.reshape_as(torch.empty(v.numel())),
        "flatten": lambda v: v.flatten(),
        "flatten_dims": lambda v: v.flatten(0, -1),
        "ravel": lambda v: v.ravel(),
        "contiguous": lambda v: v.contiguous(),
        "reshape_keeps_a_view_dim": lambda v: v.reshape(2, 2, 4),
    }


@pytest.mark.parametrize("make", ["transposed", "column", "rows", "whole"])
@pytest.mark.parametrize("name", list(_copies_or_views()))
def test_a_write_through_reshape_reaches_the_base_only_where_the_cpu_makes_a_view(name, make, dev):
    """``x.t().reshape(-1)`` and ``x.t().contiguous()`` are copies on the CPU: writing to them leaves ``x`` alone.
    lazyxla's wrappers report contiguous strides for every view, and PyTorch's reshape/contiguous returned a view
    whose write reached ``x``."""
    fn = _copies_or_views()[name]
    views = {
        "transposed": lambda x: x.view(4, 4).t(),
        "column": lambda x: x.view(4, 4, 1)[:, 0],
        "rows": lambda x: x.view(4, 4)[1:3].reshape(2, 4),
        "whole": lambda x: x.view(4, 4),
    }

    def run(device):
        x = torch.arange(16.0, device=device)
        v = views[make](x)
        if name == "reshape_keeps_a_view_dim" and v.numel() != 16:
            return None
        out = fn(v)
        out[(1,) + (0,) * (out.dim() - 1)] = -1
        return x.cpu(), out.cpu(), out._base is x or out._base is v._base

    want = run("cpu")
    got = run(dev)
    if want is None:
        return
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert got[2] == want[2]


def test_a_copy_made_by_reshape_has_its_own_storage(dev):
    """PyTorch's test_view_ops (test_reshape_view_semantics): a view shares its base's storage, a copy does not."""
    x = torch.ones(15, 4, device=dev)
    assert x.untyped_storage().data_ptr() == x.reshape(20, 3).untyped_storage().data_ptr()
    assert x.untyped_storage().data_ptr() != x.transpose(0, 1).reshape(20, 3).untyped_storage().data_ptr()


def test_a_write_to_an_overlapping_as_strided_view_lands_as_on_cpu(dev):
    """A view with a stride 0 (several elements, one memory location) written one element at a time: the CPU
    writes in place; functionalization writes the view back with ``as_strided_scatter``, which the CPU check
    refused (overlap error), and whose scatter kept an unchanged alias's old value."""

    def run(device):
        t = torch.ones(720, device=device).as_strided((2, 3, 2, 3, 5, 4), (6, 2, 15, 5, 1, 0))
        v = t.flatten(0, 1)
        v[0, 0, 0, 0, 0] = 0
        v[5, 1, 2, 3, 1] = 7
        return t.cpu(), v.cpu()

    for got, want in zip(run(dev), run("cpu")):
        torch.testing.assert_close(got, want)


def test_as_strided_scatter_into_an_overlapping_layout_raises_as_on_cpu(dev):
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor") as cpu:
        torch.as_strided_scatter(torch.ones(12), torch.ones(3, 4), (3, 4), (4, 0))
    with pytest.raises(RuntimeError) as got:
        torch.as_strided_scatter(torch.ones(12, device=dev), torch.ones(3, 4, device=dev), (3, 4), (4, 0))
    assert str(got.value).splitlines()[0] == str(cpu.value).splitlines()[0]
    ok = torch.as_strided_scatter(torch.ones(12, device=dev), torch.zeros(3, 2, device=dev), (3, 2), (4, 1))
    torch.testing.assert_close(ok.cpu(), torch.as_strided_scatter(torch.ones(12), torch.zeros(3, 2), (3, 2), (4, 1)))
