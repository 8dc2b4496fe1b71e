"""What PyTorch's device-generic tests expect of a device, against CPU eager (issue 26, point 8): CPU index tensors
and masks in advanced indexing (as CUDA takes them), byte masks, writes into internally overlapping tensors, ``out=``
tensors that need resizing."""

from __future__ import annotations

import warnings

import pytest
import torch

import lazyxla
from lazyxla.observe import metrics
from tests.util import assert_same


def _x(*shape, dtype=torch.float32):
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape).to(dtype)


def _clone_set(key, value):
    def fn(x):
        y = x.clone()
        y[key] = value
        return y

    return fn


_MASK = torch.tensor([[True, False, True, True], [False, False, True, False], [True, True, False, False]])

# name -> (fn(x) with CPU index tensors in it, x): on lazyxla, x is moved to the device and the indices stay on the CPU
CPU_INDEX_CASES = {
    "read_list": (lambda x: x[torch.tensor([0, 3])], _x(10)),
    "read_negative": (lambda x: x[torch.tensor([-1, 0, -1])], _x(10)),
    "read_2d": (lambda x: x[:, torch.tensor([[0, 1], [3, 3]])], _x(3, 4)),
    "read_pair": (lambda x: x[torch.tensor([0, 2]), torch.tensor([1, 3])], _x(3, 4)),
    "read_0d": (lambda x: x[torch.tensor(2), torch.tensor([1, 3])], _x(3, 4)),
    "read_mask": (lambda x: x[torch.arange(10) > 5], _x(10)),
    "read_mask_2d": (lambda x: x[_MASK], _x(3, 4, 2)),
    "read_mask_after": (lambda x: x[:, torch.tensor([True, False, True, True])], _x(3, 4)),
    "read_mask_then_index": (lambda x: x[torch.tensor([True, False, True]), torch.tensor([0, 3])], _x(3, 4)),
    "read_empty_mask": (lambda x: x[torch.zeros(10, dtype=torch.bool)], _x(10)),
    "read_large_mask": (lambda x: x[torch.arange(5000) % 3 == 0], _x(5000)),
    "read_large_index": (lambda x: x[torch.arange(4999, -1, -2)], _x(5000)),
    "index_put_": (lambda x: x.clone().index_put_((torch.tensor([1]),), torch.tensor(5.0)), _x(10)),
    "index_put_accumulate": (
        lambda x: x.clone().index_put_((torch.tensor([1, 1, 4]),), torch.tensor(5.0), accumulate=True),
        _x(10),
    ),
    "setitem": (_clone_set(torch.tensor([1, 2]), 7.0), _x(10)),
    "setitem_mask": (_clone_set(torch.arange(10) > 5, 0.0), _x(10)),
    "setitem_mask_2d": (_clone_set(_MASK, -1.0), _x(3, 4)),
    "setitem_int_dtype": (_clone_set(torch.tensor([0, 2], dtype=torch.int32), 9), _x(4, dtype=torch.int64)),
}


@pytest.mark.parametrize("name", sorted(CPU_INDEX_CASES))
def test_cpu_index_tensors_as_on_cuda(name):
    fn, x = CPU_INDEX_CASES[name]
    assert_same(fn(x.to(lazyxla.device())), fn(x))


def test_cpu_index_values_are_known_no_sync():
    """A CPU index or mask is host data: indexing with it compiles nothing until the result is read, and the
    positions a CPU mask selects are found on the host (no CPU fallback of the read, no sync)."""
    x = torch.randn(10, device=lazyxla.device())
    before = metrics.counters()
    y = x[torch.arange(10) > 5] * 2 + x[torch.tensor([0, 3])].sum()
    after = metrics.counters()
    assert after.get("syncs", 0) == before.get("syncs", 0)
    assert after.get("fallback.aten.index.Tensor", 0) == before.get("fallback.aten.index.Tensor", 0)
    cpu = x.cpu()
    assert_same(y, cpu[torch.arange(10) > 5] * 2 + cpu[torch.tensor([0, 3])].sum())


def _error(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # the exception PyTorch raises, to compare type and message
        return type(e), str(e).split("\n")[0]
    return None


# ---- in-place ops that would broadcast self, and inputs overlapping the written tensor: PyTorch's errors ----


def _y(dev):
    return torch.arange(18.0, device=dev)


def _index(dev):
    return torch.tensor([2, 1, 0], device=dev)


ARGUMENT_CASES = {
    # self smaller than the broadcast shape (meta kernels of atan2_/ge_/remainder_ resized self; masked_scatter_'s
    # functional form gave a larger result)
    "atan2_": lambda dev: torch.ones(1, 3, device=dev).atan2_(torch.ones(4, 3, device=dev)),
    "ge_": lambda dev: torch.ones(1, 3, device=dev).ge_(torch.ones(4, 3, device=dev)),
    "remainder_": lambda dev: torch.ones(1, 3, device=dev).remainder_(torch.ones(4, 3, device=dev)),
    "masked_scatter_": lambda dev: torch.ones(1, 3, device=dev).masked_scatter_(
        torch.ones(4, 3, device=dev) > 0, torch.ones(12, device=dev)
    ),
    "lerp_": lambda dev: torch.ones(1, 3, device=dev).lerp_(torch.ones(4, 3, device=dev), 0.5),
    "broadcast_other": lambda dev: torch.ones(4, 3, device=dev).atan2_(torch.ones(3, device=dev)),
    # inputs sharing the written tensor's memory
    "copy_partial": lambda dev: _y(dev)[0:9].copy_(_y(dev)[1:10]),
    "copy_partial_same_base": lambda dev: (lambda y: y[0:9].copy_(y[1:10]))(_y(dev)),
    "copy_same": lambda dev: (lambda y: y[0:9].copy_(y[0:9]))(_y(dev)),
    "copy_disjoint": lambda dev: (lambda y: y[0:9].copy_(y[9:18]))(_y(dev)),
    "add_partial": lambda dev: (lambda y: y[0:9].add_(y[1:10]))(_y(dev)),
    "add_itself": lambda dev: (lambda y: y.add_(y))(_y(dev)),
    "out_partial": lambda dev: (lambda y: torch.add(y[1:10], 1, out=y[0:9]))(_y(dev)),
    "index_add_view": lambda dev: (lambda y: y.index_add_(0, _index(dev), y[:3]))(_y(dev)),
    "index_add_index": lambda dev: (lambda i: i.index_add_(0, i, i.clone()))(_index(dev)),
    "index_fill_index": lambda dev: (lambda i: i.index_fill_(0, i, 0))(_index(dev)),
    "index_copy_view": lambda dev: (lambda y: y.index_copy_(0, _index(dev), y[:3]))(_y(dev)),
}


@pytest.mark.parametrize("name", sorted(ARGUMENT_CASES))
def test_inplace_arguments_checked_as_on_cpu(name):
    fn = ARGUMENT_CASES[name]
    expected = _error(fn, torch.device("cpu"))
    assert _error(fn, lazyxla.device()) == expected
    if expected is None:
        assert_same(fn(lazyxla.device()), fn(torch.device("cpu")))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[torch.tensor([0, 10])],
        lambda x: x[torch.tensor([True, False])],
        lambda x: x[torch.ones(2, 5, dtype=torch.bool)],
        lambda x: x.clone().index_put_((torch.tensor([11]),), torch.tensor(1.0)),
        lambda x: x.clone().index_put_((torch.arange(10) > 5,), torch.ones(3, device=x.device)),
        lambda x: x[torch.tensor([0.0])],
    ],
    ids=[
        "out_of_range",
        "mask_too_short",
        "mask_too_many_dims",
        "put_out_of_range",
        "put_values_mismatch",
        "float_index",
    ],
)
def test_cpu_index_errors_as_on_cpu(fn):
    expected = _error(fn, _x(10))
    assert expected is not None
    assert _error(fn, _x(10).to(lazyxla.device())) == expected


@pytest.mark.parametrize(
    "fn",
    [lambda x, i: x.index_select(0, i), lambda x, i: x.gather(0, i)],
    ids=["index_select", "gather"],
)
def test_cpu_index_refused_where_cuda_refuses(fn):
    """CUDA's ``index_select`` and ``gather`` take no CPU index tensor; neither does lazyxla."""
    with pytest.raises(RuntimeError, match="same device"):
        fn(_x(10).to(lazyxla.device()), torch.tensor([1, 2]))


# ---- uint8 masks: deprecated in PyTorch, still taken (with a warning) ----

UINT8_CASES = {
    "read_device_mask": lambda x, dev: x[(x > 5).to(torch.uint8)],
    "read_cpu_mask": lambda x, dev: x[(torch.arange(10) > 5).to(torch.uint8)],
    "read_known_mask": lambda x, dev: x[(torch.arange(10, device=dev) % 3 == 0).to(torch.uint8)],
    "read_nonbinary": lambda x, dev: x[torch.tensor([0, 2, 0, 7, 0, 0, 1, 0, 0, 0], dtype=torch.uint8, device=dev)],
    "setitem_device_mask": lambda x, dev: x.clone().index_put_(
        ((x > 5).to(torch.uint8),), torch.tensor([-1.0, -2.0, -3.0, -4.0], device=dev)
    ),
    "setitem_known_mask": lambda x, dev: _clone_set(
        (torch.arange(10, device=dev) < 3).to(torch.uint8), torch.tensor([7.0, 8.0, 9.0], device=dev)
    )(x),
}


# a read through a device mask the host does not know runs on the CPU (its shape depends on the data)
@pytest.mark.allow_fallback("aten.index.Tensor")
@pytest.mark.parametrize("name", sorted(UINT8_CASES))
def test_uint8_masks(name):
    fn = UINT8_CASES[name]
    dev = lazyxla.device()
    with warnings.catch_warnings(record=True) as cpu_warnings:
        warnings.simplefilter("always")
        expected = fn(_x(10), torch.device("cpu"))
    with warnings.catch_warnings(record=True) as dev_warnings:
        warnings.simplefilter("always")
        actual = fn(_x(10).to(dev), dev)
    assert_same(actual, expected)

    def deprecations(ws):
        return [str(w.message).split(" (Triggered")[0] for w in ws if "torch.uint8 is now deprecated" in str(w.message)]

    assert deprecations(dev_warnings) == deprecations(cpu_warnings)
    assert all(w.filename == __file__ for w in dev_warnings if "uint8" in str(w.message))


# ---- writes into internally overlapping tensors (an expanded view): PyTorch's error at the call ----


def _expanded(dev):
    return torch.ones(3, device=dev).expand(3, 3)


OVERLAP_CASES = {
    "add_": lambda dev: _expanded(dev).add_(1),
    "mul_tensor": lambda dev: _expanded(dev).mul_(torch.ones(3, 3, device=dev)),
    "copy_": lambda dev: _expanded(dev).copy_(torch.zeros(3, 3, device=dev)),
    "exp_": lambda dev: _expanded(dev).exp_(),
    "normal_": lambda dev: _expanded(dev).normal_(),
    "clamp_": lambda dev: _expanded(dev).clamp_(0, 0.5),
    "transposed": lambda dev: _expanded(dev).t().add_(1),
    "column": lambda dev: _expanded(dev)[:, 0].add_(1),
    "new_dims": lambda dev: torch.ones(3, device=dev).expand(2, 3, 3)[1].sub_(1),
    "as_strided": lambda dev: torch.ones(4, 4, device=dev).as_strided((2, 2), (0, 1)).mul_(2),
    "out_add": lambda dev: torch.add(torch.ones(3, 3, device=dev), 1, out=_expanded(dev)),
    "out_mm": lambda dev: torch.mm(torch.ones(3, 3, device=dev), torch.ones(3, 3, device=dev), out=_expanded(dev)),
    # CPU accepts these
    "row": lambda dev: _expanded(dev)[0].add_(1),
    "size_1_dims": lambda dev: torch.ones(3, 1, device=dev).expand(3, 1).add_(1),
    "slice": lambda dev: torch.ones(4, 4, device=dev)[1:].add_(1),
    "sum_out": lambda dev: torch.sum(torch.ones(3, 3, 3, device=dev), 0, out=torch.ones(3, 3, device=dev)),
}


@pytest.mark.parametrize("name", sorted(OVERLAP_CASES))
def test_internal_overlap_as_on_cpu(name):
    fn = OVERLAP_CASES[name]
    expected = _error(fn, torch.device("cpu"))
    assert _error(fn, lazyxla.device()) == expected
    if expected is None:
        torch.manual_seed(0)
        cpu = fn(torch.device("cpu"))
        torch.manual_seed(0)
        assert_same(fn(lazyxla.device()), cpu)


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: t.add_(300),
        lambda t: t.mul_(2**40),
        lambda t: t.add_(True),
        lambda t: t.float().sub_(True),
        lambda t: t.remainder_(7),
        lambda t: t.bitwise_xor_(5),
        lambda t: t.masked_fill_(t > 2, 200),
    ],
    ids=["uint8_wraps", "int_overflow_wraps", "bool_number", "sub_bool", "remainder", "bitwise", "masked_fill"],
)
def test_inplace_numbers_as_on_cpu(fn):
    """In-place ops with a Python number where the op takes a tensor (a number C++ wraps): PyTorch's values and
    errors (the in-place kernels of frontend/kernels.py pass the number on as the wrapped number computes)."""

    def run(dev):
        return fn(torch.arange(6, dtype=torch.uint8, device=dev))

    expected = _error(run, torch.device("cpu"))
    assert _error(run, lazyxla.device()) == expected
    if expected is None:
        assert_same(run(lazyxla.device()), run(torch.device("cpu")))


# ---- out= tensors that need resizing: PyTorch's result, shape and resize warning ----


def _e(dev, *shape, dtype=torch.float32):
    return torch.empty(*shape, device=dev, dtype=dtype)


def _ab(dev):
    return torch.arange(6.0, device=dev).reshape(2, 3), torch.ones(2, 3, device=dev)


OUT_CASES = {
    "add_empty": lambda dev, a, b: torch.add(a, b, out=_e(dev, 0)),
    "add_wrong": lambda dev, a, b: torch.add(a, b, out=_e(dev, 5)),
    "cat_empty": lambda dev, a, b: torch.cat([a, b], out=_e(dev, 0)),
    "cat_wrong": lambda dev, a, b: torch.cat([a, b], 1, out=_e(dev, 3)),
    "sum_dim": lambda dev, a, b: torch.sum(a, 1, out=_e(dev, 5)),
    "sum_keepdim": lambda dev, a, b: torch.sum(a, 1, keepdim=True, out=_e(dev, 0)),
    "mm_empty": lambda dev, a, b: torch.mm(a, b.t(), out=_e(dev, 0)),
    "index_select": lambda dev, a, b: torch.index_select(a, 1, torch.tensor([0, 2], device=dev), out=_e(dev, 7)),
    "sort": lambda dev, a, b: torch.sort(a, descending=True, out=(_e(dev, 2), _e(dev, 9, dtype=torch.long))),
    "max_dim": lambda dev, a, b: torch.max(a, 1, out=(_e(dev, 0), _e(dev, 0, dtype=torch.long))),
    "stack": lambda dev, a, b: torch.stack([a, b], out=_e(dev, 0)),
    "where": lambda dev, a, b: torch.where(a > 2, a, b, out=_e(dev, 1)),
    "nonzero": lambda dev, a, b: torch.nonzero(a > 2, out=_e(dev, 0, dtype=torch.long)),
    "out_int_dtype": lambda dev, a, b: torch.add(a, b, out=_e(dev, 0, dtype=torch.long)),
}


@pytest.mark.allow_fallback()  # nonzero's out= overload runs on the CPU
@pytest.mark.parametrize("name", sorted(OUT_CASES))
def test_out_resized_as_on_cpu(name):
    fn = OUT_CASES[name]

    def run(dev):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            try:
                out = fn(dev, *_ab(dev))
            except RuntimeError as e:
                return str(e), None
        resized = [str(w.message).split(" (Triggered")[0] for w in ws if "resized" in str(w.message)]
        return out, resized

    (expected, cpu_warnings), (actual, dev_warnings) = run(torch.device("cpu")), run(lazyxla.device())
    if isinstance(expected, str):
        assert actual == expected
    else:
        assert_same(actual, expected)
        assert dev_warnings == cpu_warnings


def test_out_view_that_needs_resizing_says_so():
    """On the CPU an out= view is resized over its base's storage; a lazyxla view cannot change shape in place of its
    base: a clear error names that (it failed in an internal scatter)."""
    a, b = _ab(lazyxla.device())
    base = torch.zeros(12, device=lazyxla.device())
    with pytest.raises(RuntimeError, match=r"resizes its out= tensor from \[4\] to \[2, 3\], but that tensor is a vie"):
        torch.add(a, b, out=base[:4])
    torch.add(a, b, out=base[:6].view(2, 3))  # the right shape: written through to the base, as on the CPU
    assert_same(base, torch.cat([torch.arange(1.0, 7.0), torch.zeros(6)]))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[:, [0, 1]],
        lambda x: x[:, torch.tensor([0])],
        lambda x: x.clone().index_put_((torch.tensor([1]), torch.tensor([0])), torch.tensor(1.0)),
    ],
    ids=["list", "cpu_tensor", "index_put"],
)
def test_index_into_an_empty_dim_as_on_cpu(fn):
    expected = _error(fn, torch.empty(10, 0))
    assert expected == (IndexError, "index is out of bounds for dimension with size 0")
    assert _error(fn, torch.empty(10, 0, device=lazyxla.device())) == expected


@pytest.mark.parametrize(
    "index",
    [lambda dev: torch.tensor([1, 2], device=dev), lambda dev: torch.arange(5, device=dev) > 2],
    ids=["integer", "mask"],
)
def test_a_cpu_tensor_indexed_by_device_indices_raises_as_on_cuda(index):
    """CUDA refuses ``cpu_tensor[cuda_index]``: "indices should be either on cpu or on the same device as the
    indexed tensor (cpu)"; the same for lazyxla indices."""
    with pytest.raises(RuntimeError, match=r"^indices should be either on cpu or on the same device as the indexed"):
        torch.arange(5.0)[index(lazyxla.device())]


# each fn(device) makes its inputs itself: factories, true division and promotion with Python floats follow the
# default dtype, which decides their output dtype but not their inputs' avals
DEFAULT_DTYPE_CASES = {
    "arange_bool_step": lambda d: torch.arange(False, True, 0.5, device=d),
    "randn": lambda d: torch.randn(3, device=d).abs().clamp(max=0) + 1,
    "linspace": lambda d: torch.linspace(0, 1, 3, device=d),
    "full": lambda d: torch.full((2,), 1.5, device=d),
    "int_true_divide": lambda d: torch.arange(1, 6, device=d) / torch.arange(1, 6, device=d),
    "int_div_number": lambda d: torch.true_divide(torch.arange(1, 6, device=d), 2),
    "uint8_plus_float": lambda d: torch.tensor([0, 0, 1], dtype=torch.uint8, device=d) + 5.5,
    "int_sqrt": lambda d: torch.arange(3, device=d).sqrt(),
    "int_compare_float": lambda d: torch.tensor([16777217], dtype=torch.int32, device=d) < 16777217.5,
}


@pytest.mark.parametrize("name", DEFAULT_DTYPE_CASES)
def test_default_dtype_as_on_cpu(name):
    """The same call recorded under float32, then float64, then float32 again as the default dtype (as PyTorch's
    ``float_double_default_dtype`` tests do): each result's dtype and value as on the CPU under that default, not
    the first call's remembered (the op caches key on the default dtype)."""
    fn = DEFAULT_DTYPE_CASES[name]
    before = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            assert_same(fn(lazyxla.device()), fn("cpu"))
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.clamp_(),
        lambda x: x.to(torch.int64).addcdiv_(x.to(torch.int64), x.to(torch.int64)),
    ],
    ids=["clamp_no_bounds", "addcdiv_integer"],
)
def test_inplace_errors_as_on_cpu(fn):
    """In-place ops reach PyTorch's Python decompositions, which word errors otherwise (clamp_: a ValueError;
    addcdiv_: a message printed as a tuple); lazyxla raises the CPU kernel's error, as CUDA does."""
    expected = _error(fn, _x(3))
    assert expected is not None
    assert _error(fn, _x(3).to(lazyxla.device())) == expected


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: torch.quantize_per_tensor(torch.ones(2, device=d), 0.1, 5, torch.quint8), "dequantize"),
        (lambda d: torch.nested.nested_tensor([torch.rand(0, 4, device=d)], device=d), "to_padded_tensor"),
    ],
    ids=["quantized", "nested"],
)
def test_tensors_no_device_holds_are_refused_by_name(make, match):
    """An op run on the CPU whose result is quantized or nested (which XLA buffers cannot hold) raises an error
    naming the remedy, not an internal error from PyTorch's numpy or sizes code."""
    assert make("cpu") is not None  # the CPU makes it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU-fallback and deprecation warnings
        with pytest.raises(RuntimeError, match=match):
            make(lazyxla.device())


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w: x @ w,
        lambda x, w: torch.nn.functional.linear(x, w.t()),
        lambda x, w: x + w.t(),
        lambda x, w: x + w.sum(),
    ],
    ids=["matmul", "linear", "add", "add_0d"],
)
def test_meta_arguments_as_on_cpu(fn):
    """An op given a meta tensor (a module before ``to_empty``) runs its meta kernel, as PyTorch's dispatcher
    does for every device: mm's makes an uninitialized tensor of the input's device (shape and dtype as on the
    CPU), add's refuses the mix with the CPU's wording."""
    w = torch.randn(10, 1, device="meta")
    x = torch.randn(5, 10)
    expected = _error(fn, x, w)
    if expected is not None:
        assert _error(fn, x.to(lazyxla.device()), w) == (expected[0], expected[1].replace("cpu", "lazyxla:0"))
        return
    out = fn(x.to(lazyxla.device()), w)
    assert (out.device, out.shape, out.dtype) == (lazyxla.device(), fn(x, w).shape, fn(x, w).dtype)


def test_module_to_empty_from_meta():
    """A module built on meta, run once, materialized with ``to_empty`` on lazyxla and initialized, computes as
    on the CPU."""
    x, weight = torch.randn(5, 10), torch.randn(2, 10)
    results = []
    for device in ("cpu", lazyxla.device()):
        m = torch.nn.Linear(10, 2, bias=False, device="meta")  # addmm (a bias) refuses meta on the CPU too
        assert m(x.to(device)).shape == (5, 2)
        m.to_empty(device=device)
        assert m.weight.device == torch.device(device)
        with torch.no_grad():
            m.weight.copy_(weight)
        results.append(m(x.to(device)))
    assert_same(results[1], results[0])


@pytest.mark.parametrize("size", [0, 1])
def test_unfold_of_a_0d_tensor_as_on_cpu(size):
    # a 0-d tensor unfolds to shape [size] (the rule reshaped its one value to (0,) and failed)
    fn = lambda dev: torch.tensor(0.5, device=dev).unfold(0, size, 1)  # noqa: E731
    assert_same(fn(lazyxla.device()), fn(torch.device("cpu")))


@pytest.mark.parametrize("accumulate", [False, True])
def test_put_alerts_under_deterministic_algorithms_as_on_cpu(dev, accumulate):
    # put_ without accumulate: duplicate indices write in no defined order (an XLA scatter, as PyTorch's
    # kernels), so PyTorch alerts on every device; with accumulate the CPU does not
    def run(d):
        a, i, v = torch.zeros(4, device=d), torch.tensor([0, 0], device=d), torch.tensor([1.0, 2.0], device=d)
        with pytest.raises(RuntimeError) as info:
            a.put_(i, v, accumulate=accumulate)
        return str(info.value)

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        if accumulate:
            got = torch.zeros(4, device=dev).put_(torch.tensor([0, 0], device=dev), torch.ones(2, device=dev), True)
            want = torch.zeros(4).put_(torch.tensor([0, 0]), torch.ones(2), True)
            assert_same(got, want)
        else:
            assert run(dev) == run("cpu")
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.use_deterministic_algorithms(True, warn_only=True)
                torch.zeros(4, device=dev).put_(torch.tensor([0, 0], device=dev), torch.ones(2, device=dev))
            assert any("put_ does not have a deterministic implementation" in str(w.message) for w in seen)
    finally:
        torch.use_deterministic_algorithms(was)
