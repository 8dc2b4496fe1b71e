"""Python ints used as tensor operands (``t + step``) are program inputs: no recompile when they change.

Only ``Scalar`` arguments (by the op's schema) take them as inputs; ``int`` arguments (shapes, sizes, dims,
positions), bools, pow's int exponent and the 0/±1 of a coefficient (``alpha=1``) stay in the program, and a
change of one of those is explained with how to avoid it. (A select's or fixed-size slice's position that changes
from one sync to a later one becomes an input too: ``lazy/positions.py``, tests/test_dynamic_positions.py.)
"""

from __future__ import annotations

import os

import pytest
import torch

import lazyxla
from lazyxla.lowering import cache

_DTYPES = [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float32, torch.bfloat16]

# (name, op): each takes the tensor, a boolean mask and the Python int
_OPS = [
    ("t + k", lambda t, m, k: t + k),
    ("t * k", lambda t, m, k: t * k),
    ("torch.add(t, k)", lambda t, m, k: torch.add(t, k)),
    ("k - t", lambda t, m, k: k - t),
    ("t < k", lambda t, m, k: t < k),
    ("t == k", lambda t, m, k: t == k),
    ("masked_fill", lambda t, m, k: t.masked_fill(m, k)),
    ("clamp(min=k)", lambda t, m, k: t.clamp(min=k)),
    ("where(m, t, k)", lambda t, m, k: torch.where(m, t, k)),
    ("t // (k + 1)", lambda t, m, k: t // (k + 1)),
    ("t & k", lambda t, m, k: t & k),
]


@pytest.fixture(autouse=True)
def _no_compiled_programs():
    """Compile counts are this test's own: programs other tests left in memory would be hits."""
    cache.clear()


@pytest.fixture(autouse=True)
def _on_the_device():
    """These small integer tensors come from the CPU, so the host would know their values and compute the ops
    itself (lazy/known.py; tests/test_known_values.py): switched off, the ops run on the device, as they do on
    integer tensors the device computed or that are larger than ``known_values_limit``."""
    with lazyxla.config.override(known_values_limit=0):
        yield


def _sample(dtype):
    t = torch.tensor([-7, -1, 0, 1, 3, 100, 127, 5])
    if dtype == torch.uint8:
        t = t.abs()
    return t.to(dtype), torch.tensor([True, False, True, False, False, True, False, True])


def _run(fn, *args):
    """The op's result on the CPU, or the type of the error it raises."""
    try:
        out = fn(*args)
    except RuntimeError as e:
        return type(e)
    return out.cpu() if isinstance(out, torch.Tensor) else out


def _compiles() -> int:
    return lazyxla.metrics.counters()["compiles"]


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_changing_python_ints_compile_one_program_per_op_and_match_cpu(dev, dtype):
    t, m = _sample(dtype)
    td, md = t.to(dev), m.to(dev)
    for name, op in _OPS:
        before = _compiles()
        for k in range(10):
            want, got = _run(op, t, m, k), _run(op, td, md, k)
            if isinstance(want, type):  # PyTorch refuses the dtype (bool - bool, clamp of bool...): so do we
                assert got is want, (name, k)
                continue
            assert got.dtype == want.dtype and torch.equal(got, want), (name, dtype, k, got, want)
        assert _compiles() - before <= 1, f"{name} on {dtype} compiled {_compiles() - before} programs"


# values that overflow the tensor's dtype: PyTorch wraps them around (two's complement) without an error
_WRAPS = [
    (torch.int32, lambda t, k: t + k, [1, 2**31, 2**31 - 1, -(2**31) - 1, 2**40, 2**63 - 1, -(2**63)]),
    (torch.int32, lambda t, k: t * k, [3, 2**33 + 5, 2**62]),
    (torch.uint8, lambda t, k: t + k, [1, 300, -1, -300, 2**40 + 7]),
    (torch.uint8, lambda t, k: t < k, [100, 300, 556, -1]),
    (torch.int8, lambda t, k: t - k, [1, 128, -129, 1000]),
    (torch.int64, lambda t, k: t + k, [1, 2**62, 2**63 - 1, -(2**63)]),
    (torch.int64, lambda t, k: t * k, [2, 2**53 + 1, 3**39]),  # past 2**53: a float64 would round them
    (torch.float32, lambda t, k: t + k, [1, 2**24 + 1, 2**53 + 1, 2**63 - 1]),
    # (ints a bfloat16 holds: PyTorch's CPU multiplies by 257 in float32, lazyxla by 257 rounded to bfloat16, as
    # for Python floats -- a gap of half-precision arithmetic with any Python scalar, not of ints)
    (torch.bfloat16, lambda t, k: t * k, [2, 256, -(2**20), 3 * 2**40]),
]


@pytest.mark.parametrize("dtype,op,values", _WRAPS, ids=[f"{d}-{i}" for i, (d, _, _) in enumerate(_WRAPS)])
def test_ints_that_overflow_the_dtype_wrap_as_on_the_cpu_in_one_program(dev, dtype, op, values):
    t = torch.tensor([0, 1, -2, 100, 77]).to(dtype)
    td = t.to(dev)
    before = _compiles()
    for k in values:
        want, got = op(t, k), op(td, k).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want), (k, got, want)
    assert _compiles() - before == 1


def test_a_value_pytorch_refuses_raises_at_the_call_after_accepted_ones(dev):
    i32, m = torch.tensor([1, 100, -5], dtype=torch.int32).to(dev), torch.tensor([True, False, True]).to(dev)
    assert i32.masked_fill(m, 7).tolist() == [7, 100, 7]
    assert i32.masked_fill(m, 2**31 - 1).tolist() == [2**31 - 1, 100, 2**31 - 1]
    with pytest.raises(RuntimeError, match="value cannot be converted to type int without overflow"):
        i32.masked_fill(m, 2**31)
    with pytest.raises(RuntimeError, match="value cannot be converted to type int without overflow"):
        i32.masked_fill(m, -(2**31) - 1)
    u8 = torch.tensor([1, 200, 5], dtype=torch.uint8).to(dev)
    assert u8.masked_fill(m, -255).tolist() == [1, 200, 1]  # PyTorch takes -255..255 for uint8
    with pytest.raises(RuntimeError, match="value cannot be converted to type uint8_t without overflow"):
        u8.masked_fill(m, -256)
    assert (i32 // 3).tolist() == [0, 33, -2]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        i32 // 0
    before = _compiles()
    assert i32.masked_fill(m, -3).tolist() == [-3, 100, -3] and (i32 // -4).tolist() == [-1, -25, 1]
    assert _compiles() - before == 0  # the refused calls recorded nothing; other values reuse the programs


def test_structural_ints_bools_and_int_exponents_stay_in_the_program(dev):
    x = torch.arange(12, dtype=torch.int64).to(dev)
    before = _compiles()
    for k in (2, 3, 4):
        assert (x**k).tolist() == [i**k for i in range(12)]  # exact integer powers: one program per exponent
    assert _compiles() - before == 3
    before = _compiles()
    for k in (1, 2, 3):
        assert x[k].item() == k and x.view(k, -1).sum(0).tolist() == torch.arange(12).view(k, -1).sum(0).tolist()
    # a program per view shape; x[k]: one with k = 1, then one taking k as an input (it changed after a read)
    assert _compiles() - before == 5
    before = _compiles()
    for k in (2, 3, -4, 5):  # alpha is an input except at 0 and ±1, which drop a multiply
        assert torch.add(x, x, alpha=k).tolist() == [i + k * i for i in range(12)]
    assert _compiles() - before == 1


def test_ints_and_floats_keep_pytorch_promotion(dev):
    i = torch.arange(4, dtype=torch.int32).to(dev)
    assert (i + 3).dtype == torch.int32 and (i + 3).tolist() == [3, 4, 5, 6]
    assert (i + 2.5).dtype == torch.float32 and (i + 2.5).tolist() == [2.5, 3.5, 4.5, 5.5]
    b = torch.tensor([True, False]).to(dev)
    assert (b + 5).dtype == torch.int64 and (b + 5).tolist() == [6, 5]
    assert (b * True).dtype == torch.bool  # a bool stays a bool (and a constant)
    assert torch.full((2,), 2**62 + 1, device=dev).tolist() == [2**62 + 1] * 2


def test_torch_compile_bakes_python_ints_as_pytorch_wraps_them(dev):
    fn = torch.compile(lambda t: t * (2**33 + 5) + 7, backend="lazyxla")
    t = torch.tensor([1, -3, 1000], dtype=torch.int32)
    assert torch.equal(fn(t.to(dev)).cpu(), t * (2**33 + 5) + 7)


def _select_loop(here: str, dev) -> tuple[dict, list]:
    """Three synced steps that compute with ``step`` and select at it; the tagged lines and the explanations."""
    lazyxla.metrics.reset()
    x = torch.arange(8.0).to(dev)
    with lazyxla.config.override(explain_recompiles=True):
        for step in range(3):
            y = x * step + step  # tag:operand
            z = x[step]  # tag:select
            lazyxla.sync()  # tag:sync
    assert y.tolist() == [2.0 * i + 2 for i in range(8)] and z.item() == 2.0
    with open(here) as f:
        lines = {
            tag: n
            for n, text in enumerate(f.read().splitlines(), 1)
            for tag in ("operand", "select", "sync")
            if f"# tag:{tag}" in text and "tag}" not in text
        }
    recompiles = lazyxla.metrics.recompiles()
    assert all(r["site"] == f"lazyxla.sync() at {here}:{lines['sync']}" for r in recompiles)
    return lines, [r["reason"] for r in recompiles]


def test_a_changing_baked_int_is_explained_with_how_to_avoid_it(dev):
    here = os.path.abspath(__file__)
    with lazyxla.config.override(dynamic_positions=False):
        lines, reasons = _select_loop(here, dev)
    assert reasons == [
        f"aten.select_copy.int (recorded at {here}:{lines['select']}): a Python value in its arguments changed: "
        f"index: {k} -> {k + 1}. `index` is an int argument of the op (a shape, size, dim or position): part of the "
        "program, so each value compiles a program of its own (Python numbers used as tensor operands, as in "
        "`t + step`, are program inputs instead). To avoid it, keep such values to a few (pad lengths to a few "
        "sizes), or index with a tensor on the device (x.index_select(0, torch.arange(n, device=dev) + start)); "
        "lazyxla.config.dynamic_positions (off) makes a select's or fixed-size slice's position an input"
        for k in (0, 1)
    ]


def test_a_position_that_changes_after_a_sync_becomes_an_input_and_is_explained(dev):
    here = os.path.abspath(__file__)
    lines, reasons = _select_loop(here, dev)
    assert reasons == [  # once: the select at step 2 reuses step 1's program
        f"aten.select_copy.int (recorded at {here}:{lines['select']}): its `index` (0 in the last program compiled "
        "here) changed after a sync, so it is a program input from now on (lazyxla.dynamic_select.default): a "
        "position that changes from one sync to a later one compiles once more, not once per value "
        "(lazyxla.config.dynamic_positions)"
    ]


def test_a_baked_scalar_is_explained_with_a_0d_tensor_as_the_way_out(dev):
    x = torch.arange(1.0, 5.0).to(dev)
    with lazyxla.config.override(explain_recompiles=True):
        for k in (2, 3):
            y = x**k
            lazyxla.sync()
    assert y.tolist() == [1.0, 8.0, 27.0, 64.0]
    (why,) = lazyxla.metrics.recompiles()
    assert why["reason"].endswith(
        "a Python value in its arguments changed: exponent: 2 -> 3. `exponent` decides the output's shape or how "
        "the op computes, so it is part of the program; pass a 0-d tensor instead (torch.tensor(value, "
        "device=...)) to make it a program input"
    )


def test_coefficients_as_inputs_keep_pytorch_semantics(dev):
    # in a multi-process run 0 and +-1 are program inputs too (lazy/meta.py): beta=0 still ignores NaNs
    from lazyxla.device import processes

    processes.programs_span_processes[0] = True
    try:
        a = torch.randn(3, 3)
        nan = torch.full((3, 3), float("nan"))
        for beta, alpha in ((0, 1), (0.0, -1.0), (1, 0), (-1, 1.0)):
            want = torch.addmm(nan if beta == 0 else a, a, a, beta=beta, alpha=alpha)
            got = torch.addmm((nan if beta == 0 else a).to(dev), a.to(dev), a.to(dev), beta=beta, alpha=alpha)
            torch.testing.assert_close(got.cpu(), want, equal_nan=True)
        x = torch.tensor([1.0, float("nan"), -2.0])
        for s in (0.0, 1.0, -1.0, 0.5):
            torch.testing.assert_close((x.to(dev) * s + s).cpu(), x * s + s, equal_nan=True)
    finally:
        processes.programs_span_processes[0] = False
    # the values are inputs: a program per signature (int or float beta and alpha), not per value (8 if baked)
    assert lazyxla.metrics.counters()["compiles"] <= 5
