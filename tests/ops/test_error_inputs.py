"""PyTorch's OpInfo error inputs on lazyxla: each raises at the call, as PyTorch raises it.

For every OpInfo with ``error_inputs``, the inputs are made for the lazyxla device (as PyTorch's own
``test_errors`` makes them for an accelerator: value-dependent checks that only the CPU makes, such as an
index out of bounds, are left out by the OpInfo itself). Each must raise *at the call* (no sync comes
between: a lazy op that records fine and fails in the lowering later does not count) an exception of the
type the ErrorInput names, with a message matching its regex. Where the same error input made for the
CPU raises there, lazyxla's exception must also be an instance of the CPU's type.

``error_inputs_sparse`` (4 ops) is not run: lazyxla has no sparse layouts (``to_sparse`` is listed in
expected.py), so a sparse error input fails at its creation, not in the op.

``make test`` runs the ops in ``FAST_ERRORS``; ``--opinfo=full`` runs every op. Listed exceptions, each
with its reason, are ``ERROR_INPUT_FAILURES`` in expected.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import lazyxla
from lazyxla.lazy import check
from tests.ops.expected import ERROR_INPUT_FAILURES
from tests.ops.test_opinfo import _case_id

pytestmark = pytest.mark.allow_fallback()

# The ops `make test` runs: every op the issue names, and one of each kind of check (dims, dtypes,
# shapes, arguments, mixed dtypes, decomposed ops, random ops, the meta kernel's type replaced by the CPU's).
FAST_ERRORS = {
    "mm",
    "bmm",
    "addmm",
    "matmul",
    "bitwise_and",
    "softmax",
    "nn.functional.conv2d",
    "nn.functional.embedding",
    "amax",
    "aminmax",
    "cat",
    "gather",
    "scatter_add",
    "index_add",
    "multinomial",
    "uniform",
    "narrow_copy",
    "linalg.cross",
    "masked_fill",
    "reshape",
    "view",
}

_OPS = [op for op in op_db if op.error_inputs_func is not None]


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ != "test_error_inputs":
        return
    full = metafunc.config.getoption("--opinfo") == "full"
    ops = [op for op in _OPS if full or op.name in FAST_ERRORS]
    metafunc.parametrize("op", [pytest.param(op, id=_case_id(op)) for op in ops])


def _cpu_exceptions(op, lazy_inputs) -> list:
    """Per lazyxla error input: what the same error input made for the CPU raises there (None: it does not
    raise; ``...``: no CPU counterpart, when the two lists of error inputs differ, as for device checks)."""
    cpu_inputs = list(op.error_inputs("cpu"))
    if [e.error_regex for e in cpu_inputs] != [e.error_regex for e in lazy_inputs]:
        return [...] * len(lazy_inputs)
    out = []
    for ei in cpu_inputs:
        s = ei.sample_input
        try:
            op(s.input, *s.args, **s.kwargs)
            out.append(None)
        except Exception as e:
            out.append(e)
    return out


def _listed(op, ei) -> str | None:
    return ERROR_INPUT_FAILURES.get((_case_id(op), ei.error_regex))


def _outcome(op, ei, cpu_error) -> str:
    """'passed', 'cpu does not raise', or what went wrong."""
    s = ei.sample_input
    try:
        op(s.input, *s.args, **s.kwargs)
    except Exception as e:
        if cpu_error is not ... and cpu_error is not None and not isinstance(e, type(cpu_error)):
            return f"raised {type(e).__name__}: {e}; the CPU raises {type(cpu_error).__name__}: {cpu_error}"
        if not isinstance(e, ei.error_type):
            return f"raised {type(e).__name__}: {e}; PyTorch expects {ei.error_type.__name__}"
        if not re.search(ei.error_regex, str(e)):
            return f"raised {type(e).__name__}: {e}; the message does not match {ei.error_regex!r}"
        return "passed"
    if cpu_error is None:
        return "cpu does not raise"  # PyTorch's own expected failure of test_errors (clamp_max(t, 2), ...)
    return f"did not raise at the call (PyTorch raises {ei.error_type.__name__} matching {ei.error_regex!r})"


def test_error_inputs(op, record_property):
    record_property("opinfo", {"op": _case_id(op), "dtype": "*", "kind": "errors"})
    dev = str(lazyxla.device())  # a string, as PyTorch's test_errors passes it
    lazy_inputs = list(op.error_inputs(dev))
    cpu_errors = _cpu_exceptions(op, lazy_inputs)
    outcomes = [_outcome(op, ei, cpu) for ei, cpu in zip(lazy_inputs, cpu_errors)]
    record_property("error_samples", outcomes)
    failed = [
        f"error input {i} ({ei.error_regex!r}): {what}"
        for i, (ei, what) in enumerate(zip(lazy_inputs, outcomes))
        if what not in ("passed", "cpu does not raise") and _listed(op, ei) is None
    ]
    assert not failed, "\n".join(failed)
    if not lazy_inputs:
        pytest.skip("the OpInfo has error inputs for the CPU (value checks) or CUDA only, none for other devices")
    if all(what != "passed" for what in outcomes):
        reasons = {_listed(op, ei) for ei, what in zip(lazy_inputs, outcomes) if what != "cpu does not raise"}
        pytest.skip(
            "; ".join(sorted(r for r in reasons if r))
            or "PyTorch's CPU does not raise for them either (PyTorch's own test_errors expects them to fail)"
        )


# ---- the cases: each raises at the user's line, the CPU's exception type ----

_CASES = {
    "softmax dim=-3 on 2-d": (
        lambda d: torch.nn.functional.softmax(torch.randn(2, 3, device=d), dim=-3),
        IndexError,
        r"Dimension out of range",
    ),
    "bitwise_and on floats": (
        lambda d: torch.bitwise_and(torch.randn(2, 3, device=d), torch.randn(2, 3, device=d)),
        NotImplementedError,
        r"not implemented for 'Float'",
    ),
    "mm float32 @ int64": (
        lambda d: torch.mm(torch.randn(2, 3, device=d), torch.ones(3, 2, dtype=torch.int64, device=d)),
        RuntimeError,
        r"same dtype",
    ),
    "mm float32 @ float64": (
        lambda d: torch.mm(torch.randn(2, 3, device=d), torch.ones(3, 2, dtype=torch.float64, device=d)),
        RuntimeError,
        r"same dtype",
    ),
    "matmul float32 @ int64": (
        lambda d: torch.randn(2, 3, device=d) @ torch.ones(3, 2, dtype=torch.int64, device=d),
        RuntimeError,
        r"same dtype",
    ),
    "matmul float32 @ float64 (batched)": (
        lambda d: torch.randn(4, 2, 3, device=d) @ torch.ones(3, 2, dtype=torch.float64, device=d),
        RuntimeError,
        r"dtype",
    ),
    "bmm float32 @ int64": (
        lambda d: torch.bmm(torch.randn(2, 2, 3, device=d), torch.ones(2, 3, 2, dtype=torch.int64, device=d)),
        RuntimeError,
        r"expected scalar type Float but found Long",
    ),
    "bmm float32 @ float64": (
        lambda d: torch.bmm(torch.randn(2, 2, 3, device=d), torch.ones(2, 3, 2, dtype=torch.float64, device=d)),
        RuntimeError,
        r"expected scalar type Float but found Double",
    ),
    "addmm float32 @ int64": (
        lambda d: torch.addmm(
            torch.randn(2, 2, device=d), torch.randn(2, 3, device=d), torch.ones(3, 2, dtype=torch.int64, device=d)
        ),
        RuntimeError,
        r"same dtype",
    ),
    "addmm float32 @ float64": (
        lambda d: torch.addmm(
            torch.randn(2, 2, device=d), torch.randn(2, 3, device=d), torch.ones(3, 2, dtype=torch.float64, device=d)
        ),
        RuntimeError,
        r"same dtype",
    ),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_error_raises_at_the_users_line(case, dev):
    fn, error_type, match = _CASES[case]
    with pytest.raises(error_type, match=match):  # the CPU's behaviour, checked so the yardstick is real
        fn("cpu")
    lazyxla.sync()
    compiles = lazyxla.metrics.counters().get("compiles", 0)
    with pytest.raises(error_type, match=match) as info:
        fn(dev)
    # Raised from the call itself: the last frame of this file in the traceback is the call (the lambda),
    # no frame is a sync's or a lowering's, and nothing was compiled for it.
    frames = [tb for tb in info.traceback if tb.path == info.traceback[0].path]
    assert frames[-1].name == "<lambda>"
    inside = [str(tb.path) for tb in info.traceback]
    assert not any("lazyxla/lowering" in p or p.endswith("lazyxla/lazy/graph.py") for p in inside), inside
    assert lazyxla.metrics.counters().get("compiles", 0) == compiles
    # ...and the program goes on: the next sync has nothing of the failed call to choke on.
    lazyxla.sync()
    assert (torch.ones(2, device=dev) * 2).cpu().tolist() == [2.0, 2.0]


@pytest.mark.parametrize("case", ["mm float32 @ int64", "bitwise_and on floats", "softmax dim=-3 on 2-d"])
def test_error_raises_again_after_a_valid_call_of_the_same_op(case, dev):
    """The check is memoized per signature: a valid call first must not let a later invalid one through,
    and an invalid call must raise every time."""
    fn, error_type, match = _CASES[case]
    x = torch.randn(2, 3, device=dev)
    torch.mm(x, x.t()), torch.bitwise_and(x.int(), x.int()), torch.softmax(x, dim=-1)
    for _ in range(2):
        with pytest.raises(error_type, match=match):
            fn(dev)


def test_check_runs_once_per_signature(dev, monkeypatch):
    """A second call of a signature does not run the CPU kernel again (it is memoized with the meta
    inference); a new signature does."""
    calls = []
    orig = check._cpu_error
    monkeypatch.setattr(check, "_cpu_error", lambda func, *rest: calls.append(func) or orig(func, *rest))
    a = torch.randn(4, 4, device=dev)
    torch.mm(a, a)
    torch.mm(a + 1, a)
    assert calls.count(torch.ops.aten.mm.default) == 1
    c = torch.randn(5, 4, device=dev)
    torch.mm(c, c.t())
    assert calls.count(torch.ops.aten.mm.default) == 2


def test_check_refuses_only_what_fails_for_every_value(dev):
    """The CPU kernel sees stand-in values (ones, then zeros): an error that depends on the values is not
    raised. An embedding row 0 of a 1-row table is valid, although index 1 (the ones) is out of range."""
    weight = torch.randn(1, 3)
    ids = torch.zeros(2, dtype=torch.int64)
    expected = torch.nn.functional.embedding(ids, weight)
    got = torch.nn.functional.embedding(ids.to(dev), weight.to(dev))
    torch.testing.assert_close(got.cpu(), expected)
    n, d = torch.tensor([7, 8, 9]), torch.tensor([2, 3, 4])
    assert torch.div(n.to(dev), d.to(dev), rounding_mode="floor").cpu().tolist() == [3, 2, 2]


def test_check_can_be_turned_off(dev):
    with lazyxla.config.override(check_max_elements=0):
        y = torch.mm(torch.randn(2, 7, device=dev), torch.ones(7, 2, dtype=torch.int64, device=dev))
    assert y.dtype == torch.float32  # the meta kernel's answer: the error goes unnoticed


def test_check_does_not_refuse_what_only_the_cpu_lacks(dev):
    """The CPU's gaps are not errors where lazyxla's rule computes the call: abs on bool (the CPU has no
    kernel: "abs_cpu" not implemented for 'Bool'), and a bfloat16 layer norm's backward, where the meta
    kernels keep the statistics in float32 as accelerators do and the CPU's backward kernel refuses the mix."""
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.abs(torch.tensor([True, False]))
    assert torch.abs(torch.tensor([True, False], device=dev)).cpu().tolist() == [True, False]

    x = torch.randn(4, 8).bfloat16()
    w = torch.randn(8).bfloat16()
    xd, wd = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
    x.requires_grad_(), w.requires_grad_()
    torch.nn.functional.layer_norm(x, (8,), w).float().square().sum().backward()
    torch.nn.functional.layer_norm(xd, (8,), wd).float().square().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(wd.grad.cpu(), w.grad, rtol=2e-2, atol=2e-2)


def test_out_dtype_raises_at_the_call(dev):
    """out= calls: functionalization computes the functional op and casts into ``out``; PyTorch's out=
    kernels refuse an ``out`` of another dtype for these ops. lazyxla raises as the CPU does, and still
    casts where PyTorch allows it (add into a float64 out)."""
    x = torch.randn(3, 4, device=dev)
    with pytest.raises(RuntimeError, match="Expected the dtype for input and out to match"):
        torch.amax(x, 0, out=torch.empty(4, dtype=torch.int32, device=dev))
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        torch.add(x, x, out=torch.empty(3, 4, dtype=torch.int64, device=dev))
    out = torch.empty(3, 4, dtype=torch.float64, device=dev)
    torch.add(x, x, out=out)
    torch.testing.assert_close(out.cpu(), (x.cpu() * 2).double())
