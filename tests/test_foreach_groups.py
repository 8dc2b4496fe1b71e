"""Foreach ops recorded as one node per call (lazyxla/lowering/rules/foreach.py): every grouped op equals PyTorch's
CPU kernel (mixed-dtype lists included), records one op, and takes changing numbers without a recompile."""

from __future__ import annotations

import pytest
import torch

import lazyxla
from lazyxla.lowering.rules.foreach import GROUPS

UNARY_POSITIVE = {"log", "log10", "log1p", "log2", "sqrt", "rsqrt", "lgamma", "reciprocal", "acos", "asin"}


def _lists(name: str, dtypes=(torch.float32, torch.bfloat16, torch.float32)):
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (5,), ()]
    a = [torch.rand(s, generator=g).to(d) * 0.8 + 0.1 for s, d in zip(shapes, dtypes)]
    b = [torch.rand(s, generator=g).to(d) * 0.8 + 0.1 for s, d in zip(shapes, dtypes)]
    c = [torch.rand(s, generator=g).to(d) * 0.8 + 0.1 for s, d in zip(shapes, dtypes)]
    if name == "mm":
        a = [torch.rand(2, 3, generator=g), torch.rand(4, 2, generator=g)]
        b = [torch.rand(3, 5, generator=g), torch.rand(2, 2, generator=g)]
    return a, b, c


def _call(func, a, b, c):
    """One call of foreach overload ``func`` built from its schema: lists for Tensor[], numbers for Scalar(s)."""
    args = []
    for arg in func._schema.arguments:
        t = str(arg.type)
        if arg.kwarg_only or arg.has_default_value():
            continue
        if t == "List[Tensor]":
            args.append([a, b, c][sum(1 for x in args if isinstance(x, list))])
        elif t in ("List[Scalar]", "List[number]"):
            args.append([0.5, 0.25, 0.75][: len(a)])
        elif t in ("Scalar", "number"):
            args.append(0.3 if "pow" not in func._schema.name else 2)
        elif t == "Tensor":
            args.append(torch.tensor(0.4))
        else:
            pytest.skip(f"{func} takes {t}")
    return args


@pytest.mark.parametrize("func", sorted(GROUPS, key=str), ids=str)
def test_every_grouped_foreach_op_equals_cpu_and_records_one_op(func, dev):
    name = func._schema.name.split("::")[1][len("_foreach_") :]
    dtypes = (
        (torch.float32,) * 3
        if name in ("mm", "max", "copy", "lgamma")
        else (torch.float32, torch.bfloat16, torch.float32)
    )
    a, b, c = _lists(name, dtypes)
    cpu = _call(func, a, b, c)
    lazy = [
        [t.to(dev) for t in x]
        if isinstance(x, list) and x and isinstance(x[0], torch.Tensor)
        else x.to(dev)
        if isinstance(x, torch.Tensor)
        else x
        for x in cpu
    ]
    try:
        want = func(*cpu)
    except RuntimeError as e:
        with pytest.raises(RuntimeError):
            func(*lazy)
        pytest.skip(f"PyTorch's CPU kernel refuses this sample too: {e}")
    lazyxla.metrics.reset()
    got = func(*lazy)
    assert lazyxla.metrics.counters()["ops_recorded"] == 1
    assert len(got) == len(want)
    for x, y in zip(got, want):
        assert x.dtype == y.dtype and x.shape == y.shape
        tol = {"rtol": 1.6e-2, "atol": 1e-2} if y.dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-6}
        torch.testing.assert_close(x.cpu(), y, **tol, equal_nan=True)


def test_changing_numbers_are_inputs_not_constants(dev):
    xs = [torch.rand(4).to(dev), torch.rand(2, 2).to(dev)]
    outs = []
    for k in range(4):
        outs.append(torch._foreach_mul(xs, [0.5 + k, 0.25 * k]))
        outs.append(torch._foreach_add(xs, 1.5 * k + 0.1))
        lazyxla.sync()
        if k == 1:
            lazyxla.metrics.reset()
    assert lazyxla.metrics.counters().get("compiles", 0) == 0
    cpu = [x.cpu() for x in xs]
    want = torch._foreach_mul(cpu, [3.5, 0.75])
    for x, y in zip(outs[-2], want):
        torch.testing.assert_close(x.cpu(), y)


def test_an_empty_list_and_in_place_forms(dev):
    with pytest.raises(RuntimeError, match="at least one tensor"):  # as PyTorch's CPU kernel says
        torch._foreach_mul([torch.ones(1).to(dev)][:0], 2.0)
    xs = [torch.ones(3).to(dev), torch.full((2,), 2.0).to(dev)]
    torch._foreach_mul_(xs, [2.0, 0.5])
    torch._foreach_addcmul_(xs, xs, xs, value=0.5)
    assert [x.cpu().tolist() for x in xs] == [[4.0] * 3, [1.5] * 2]


def test_a_group_inside_a_compiled_graph(dev):
    @torch.compile(backend="lazyxla")
    def f(xs, ys):
        return torch._foreach_addcdiv([x * 1 for x in xs], xs, ys, value=0.5)

    xs = [torch.rand(3) + 0.5, torch.rand(2, 2) + 0.5]
    ys = [torch.rand(3) + 0.5, torch.rand(2, 2) + 0.5]
    got = f([x.to(dev) for x in xs], [y.to(dev) for y in ys])
    for g, w in zip(got, torch._foreach_addcdiv(xs, xs, ys, value=0.5)):
        torch.testing.assert_close(g.cpu(), w)
