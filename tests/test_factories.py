"""Every tensor factory with ``device=`` gives an ordinary lazyxla tensor: host reads, in-place ops mixing it
with other lazyxla tensors (both ways), in-place ops through a view, all as on the CPU.

``torch.tensor`` / ``as_tensor`` / ``asarray`` / ``new_tensor`` build their tensor with functionalization off
and lift it at the end; before the fix the lift handed the user a bare ``LazyTensor``, so ``.tolist()``
raised and ``t += x`` hit PyTorch's INTERNAL ASSERT "mutating a non-functional tensor with a functional
tensor" (Hugging Face's Trainer does ``tr_loss = torch.tensor(0.0, device=dev); tr_loss += loss``).
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch

import lazyxla
from lazyxla.lazy import decompose, record
from lazyxla.lazy.special import lazy_to_cpu
from lazyxla.lazy.tensor import unwrap

BOOL, I64, F32, BF16, C64 = torch.bool, torch.int64, torch.float32, torch.bfloat16, torch.complex64
ALL = (BOOL, I64, F32, BF16, C64)
FLOATS = (F32, BF16, C64)  # what rand/randn draw
SHAPES = ((), (0,), (2, 3))  # 0-d, empty, ordinary
_FILL = {BOOL: True, I64: 3, F32: 2.5, BF16: -1.5, C64: 1 + 2j}


def _data(shape, dtype) -> list | float | bool | complex:
    """Python data of ``shape`` that every dtype holds exactly."""
    n = int(np.prod(shape, dtype=np.int64))
    base = torch.arange(n, dtype=torch.float64).reshape(shape) - 2
    if dtype == BOOL:
        base = base > 0
    elif dtype == C64:
        base = base.to(torch.complex128) * (1 - 0.5j)
    return base.tolist()


def _np(shape, dtype) -> np.ndarray:
    return np.asarray(_data(shape, dtype), dtype={BOOL: bool, I64: np.int64, F32: np.float32, C64: np.complex64}[dtype])


def _tensor_of_tensor(src: torch.Tensor, device) -> torch.Tensor:
    with warnings.catch_warnings():  # PyTorch's "To copy construct from a tensor, it is recommended ...", on any device
        warnings.simplefilter("ignore", UserWarning)
        return torch.tensor(src, device=device)


def _contiguous_strides(shape) -> tuple[int, ...]:
    return torch.empty(shape).stride()


# name -> (make(device, dtype, shape), dtypes, deterministic). make builds on `device`; factories that
# start from another tensor build that tensor on the CPU and move it (or not) as the case says.
_SHAPED = {
    "zeros": (lambda d, dt, s: torch.zeros(s, dtype=dt, device=d), ALL, True),
    "ones": (lambda d, dt, s: torch.ones(s, dtype=dt, device=d), ALL, True),
    "full": (lambda d, dt, s: torch.full(s, _FILL[dt], dtype=dt, device=d), ALL, True),
    "empty": (lambda d, dt, s: torch.empty(s, dtype=dt, device=d), ALL, False),
    "empty_strided": (lambda d, dt, s: torch.empty_strided(s, _contiguous_strides(s), dtype=dt, device=d), ALL, False),
    "rand": (lambda d, dt, s: torch.rand(s, dtype=dt, device=d), FLOATS, False),
    "randn": (lambda d, dt, s: torch.randn(s, dtype=dt, device=d), FLOATS, False),
    "randint": (lambda d, dt, s: torch.randint(0, 2, s, dtype=dt, device=d), (BOOL, I64, F32, BF16), False),
    "normal": (lambda d, dt, s: torch.normal(1.0, 2.0, s, dtype=dt, device=d), (F32, BF16), False),
    "tensor": (lambda d, dt, s: torch.tensor(_data(s, dt), dtype=dt, device=d), ALL, True),
    "tensor_inferred_dtype": (lambda d, dt, s: torch.tensor(_data(s, dt), device=d), (BOOL, I64, C64), True),
    "tensor_of_cpu_tensor": (lambda d, dt, s: _tensor_of_tensor(torch.tensor(_data(s, dt), dtype=dt), d), ALL, True),
    "as_tensor": (lambda d, dt, s: torch.as_tensor(_data(s, dt), dtype=dt, device=d), ALL, True),
    "as_tensor_numpy": (lambda d, dt, s: torch.as_tensor(_np(s, dt), device=d), (BOOL, I64, F32, C64), True),
    "asarray": (lambda d, dt, s: torch.asarray(_data(s, dt), dtype=dt, device=d), ALL, True),
    "asarray_numpy": (lambda d, dt, s: torch.asarray(_np(s, dt), device=d), (BOOL, I64, F32, C64), True),
    "from_numpy_to": (lambda d, dt, s: torch.from_numpy(_np(s, dt)).to(d), (BOOL, I64, F32, C64), True),
    "scalar_tensor": (lambda d, dt, s: torch.scalar_tensor(_FILL[dt], dtype=dt, device=d), ALL, True),
}


def _like(fn, deterministic, dtypes=ALL):
    """``torch.<x>_like`` from a tensor on the device, and from a CPU tensor with ``device=``."""
    return {
        "": (lambda d, dt, s: fn(torch.ones(s, dtype=dt).to(d)), dtypes, deterministic),
        "_cpu_base": (lambda d, dt, s: fn(torch.ones(s, dtype=dt), device=d), dtypes, deterministic),
    }


def _new(fn, deterministic):
    """``Tensor.new_<x>`` on a tensor on the device, and on a CPU tensor with ``device=``."""
    return {
        "": (lambda d, dt, s: fn(torch.ones(1, dtype=dt).to(d), s, dt), ALL, deterministic),
        "_cpu_base": (lambda d, dt, s: fn(torch.ones(1, dtype=dt), s, dt, device=d), ALL, deterministic),
    }


for _name, _fn, _det, _dts in (
    ("zeros_like", torch.zeros_like, True, ALL),
    ("ones_like", torch.ones_like, True, ALL),
    ("full_like", lambda x, **kw: torch.full_like(x, _FILL[x.dtype], **kw), True, ALL),
    ("empty_like", torch.empty_like, False, ALL),
    ("rand_like", torch.rand_like, False, FLOATS),
    ("randn_like", torch.randn_like, False, FLOATS),
    ("randint_like", lambda x, **kw: torch.randint_like(x, 0, 2, **kw), False, (BOOL, I64, F32, BF16)),
):
    for _suffix, _spec in _like(_fn, _det, _dts).items():
        _SHAPED[_name + _suffix] = _spec

for _name, _fn, _det in (
    ("new_tensor", lambda b, s, dt, **kw: b.new_tensor(_data(s, dt), **kw), True),
    ("new_zeros", lambda b, s, dt, **kw: b.new_zeros(s, **kw), True),
    ("new_ones", lambda b, s, dt, **kw: b.new_ones(s, **kw), True),
    ("new_full", lambda b, s, dt, **kw: b.new_full(s, _FILL[dt], **kw), True),
    ("new_empty", lambda b, s, dt, **kw: b.new_empty(s, **kw), False),
    ("new_empty_strided", lambda b, s, dt, **kw: b.new_empty_strided(s, _contiguous_strides(s), **kw), False),
):
    for _suffix, _spec in _new(_fn, _det).items():
        _SHAPED[_name + _suffix] = _spec

# Factories whose shape comes from their arguments: name -> (make(device), deterministic).
_UNSHAPED = {
    "arange": (lambda d: torch.arange(5, device=d), True),
    "arange_float_step": (lambda d: torch.arange(1.0, 3.0, 0.5, device=d), True),
    "arange_bf16": (lambda d: torch.arange(0, 6, 2, dtype=BF16, device=d), True),
    "arange_empty": (lambda d: torch.arange(0, device=d), True),
    "linspace": (lambda d: torch.linspace(-1, 1, 5, device=d), True),
    "linspace_int64": (lambda d: torch.linspace(0, 8, 5, dtype=I64, device=d), True),
    "linspace_one": (lambda d: torch.linspace(2, 3, 1, device=d), True),
    "linspace_empty": (lambda d: torch.linspace(0, 1, 0, device=d), True),
    "logspace": (lambda d: torch.logspace(0, 2, 3, device=d), True),
    "eye": (lambda d: torch.eye(3, device=d), True),
    "eye_rect_bool": (lambda d: torch.eye(2, 4, dtype=BOOL, device=d), True),
    "eye_complex": (lambda d: torch.eye(2, dtype=C64, device=d), True),
    "eye_empty": (lambda d: torch.eye(0, device=d), True),
    "tril_indices": (lambda d: torch.tril_indices(3, 3, device=d), True),
    "triu_indices": (lambda d: torch.triu_indices(3, 4, 1, device=d), True),
    "randperm": (lambda d: torch.randperm(6, device=d), False),
    "randperm_empty": (lambda d: torch.randperm(0, device=d), False),
    "tensor_list_of_tensors": (lambda d: torch.tensor([torch.tensor(1.5), torch.tensor(-2.0)], device=d), True),
    "hann_window": (lambda d: torch.hann_window(5, device=d), True),
    "hamming_window": (lambda d: torch.hamming_window(4, periodic=False, device=d), True),
    "bartlett_window": (lambda d: torch.bartlett_window(5, device=d), True),
    "blackman_window_bf16": (lambda d: torch.blackman_window(6, dtype=BF16, device=d), True),
    "kaiser_window": (lambda d: torch.kaiser_window(6, device=d), True),
    "kaiser_window_symmetric_beta": (lambda d: torch.kaiser_window(7, False, 3.5, device=d), True),
    "kaiser_window_float64": (lambda d: torch.kaiser_window(8, True, 20.0, dtype=torch.float64, device=d), True),
    "kaiser_window_one": (lambda d: torch.kaiser_window(1, device=d), True),
    "kaiser_window_empty": (lambda d: torch.kaiser_window(0, device=d), True),
}


# Every dtype x every shape class for the factories that build from Python data (the lift path) and two that
# are recorded; the others take each dtype once, with shape classes rotating over dtypes and factories, so that
# each factory sees every dtype and every shape class and the suite sees every pair many times. The *_cpu_base
# variants (a CPU tensor's *_like / new_* with device=) take each shape class once.
_FULL_PRODUCT = {"tensor", "as_tensor", "asarray", "new_tensor", "new_tensor_cpu_base", "zeros", "full"}


def _shaped_cases():
    for k, (name, (_, dtypes, _)) in enumerate(_SHAPED.items()):
        if name == "scalar_tensor":
            pairs = [(dtype, ()) for dtype in dtypes]
        elif name in _FULL_PRODUCT:
            pairs = [(dtype, shape) for dtype in dtypes for shape in SHAPES]
        elif name.endswith("_cpu_base"):  # the same factory as without the suffix, given device= instead
            pairs = list(zip(dtypes[k % len(dtypes) :] + dtypes, SHAPES))
        else:
            pairs = [(dtype, SHAPES[(i + k) % len(SHAPES)]) for i, dtype in enumerate(dtypes)]
            pairs += [(dtype, shape) for dtype, shape in zip(dtypes, SHAPES) if (dtype, shape) not in pairs]
        for dtype, shape in pairs:
            sid = "x".join(map(str, shape)) or "0d"
            yield pytest.param(name, dtype, shape, id=f"{name}-{str(dtype).removeprefix('torch.')}-{sid}")


def _ordinary(ref: torch.Tensor, dev) -> torch.Tensor:
    """A lazyxla tensor made the long-trusted way (a CPU tensor moved with ``.to``), with ``ref``'s shape and
    dtype and values that make in-place results visible."""
    return (torch.arange(ref.numel(), dtype=torch.float64).reshape(ref.shape) % 3 + 1).to(ref.dtype).to(dev)


def _exercise(t: torch.Tensor, expected: torch.Tensor | None, dev) -> None:
    """Host reads and in-place ops on ``t`` (fresh from a factory on the device), each compared with the same
    on the CPU. ``expected``: the CPU factory's result, or None where the values are random (then only
    shape and dtype are compared with the CPU's, and the in-place results with the values ``t`` held)."""
    assert t.device == dev, t.device
    values = t.tolist()
    held = t.cpu()
    assert values == held.tolist()
    if expected is not None:
        assert (held.shape, held.dtype) == (expected.shape, expected.dtype)
        torch.testing.assert_close(held, expected, rtol=1e-6, atol=1e-6)
    if t.numel() == 1:
        assert t.item() == held.item()

    cpu, other = held.clone(), _ordinary(held, dev)
    other_cpu = other.cpu()
    t += other  # the fresh tensor mutated by an ordinary one...
    cpu += other_cpu
    other.add_(t)  # ...and an ordinary one mutated by the fresh one
    other_cpu.add_(cpu)
    view, view_cpu = t.view(-1)[:1], cpu.view(-1)[:1]  # in place through a view of the fresh tensor
    view.add_(torch.ones(view.shape, dtype=t.dtype).to(dev))
    view_cpu.add_(torch.ones(view_cpu.shape, dtype=t.dtype))
    torch.testing.assert_close(t.cpu(), cpu, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(other.cpu(), other_cpu, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(view.cpu(), view_cpu, rtol=1e-6, atol=1e-6)
    assert t.tolist() == cpu.tolist() or t.dtype == BF16  # bf16: the same numbers, read through float32


@pytest.mark.parametrize(("name", "dtype", "shape"), list(_shaped_cases()))
def test_shaped_factory_on_the_device_behaves_like_cpu(name, dtype, shape, dev):
    make, _, det = _SHAPED[name]
    expected = make("cpu", dtype, shape) if det else None
    t = make(dev, dtype, shape)
    if not det:  # random: the CPU says which shape and dtype
        probe = make("cpu", dtype, shape)
        assert (t.shape, t.dtype) == (probe.shape, probe.dtype)
    _exercise(t, expected, dev)


@pytest.mark.parametrize("name", list(_UNSHAPED))
def test_factory_on_the_device_behaves_like_cpu(name, dev):
    make, det = _UNSHAPED[name]
    expected = make("cpu")
    t = make(dev)
    assert (t.shape, t.dtype) == (expected.shape, expected.dtype)
    _exercise(t, expected if det else None, dev)


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices], ids=lambda f: f.__name__)
@pytest.mark.parametrize("args", [(3, 3, 0), (3, 4, 1), (4, 3, -1), (0, 3, 0), (3, 0, 0), (5, 5, -7), (2, 2, 9)])
def test_tril_triu_indices_are_recorded_on_the_device(fn, args, dev):
    for dtype in (torch.int64, torch.int32):
        expected = fn(*args, dtype=dtype)
        got = fn(*args, dtype=dtype, device=dev)
        assert got.dtype == dtype and torch.equal(got.cpu(), expected)
    assert not any(k.startswith("fallback.") for k in lazyxla.metrics.counters())


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.randint(0, 5, (4,), dtype=torch.bool, device=d),
        lambda d: torch.randint(0, 300, (4,), dtype=torch.uint8, device=d),
        lambda d: torch.randint(-5, 5, (4,), dtype=torch.uint8, device=d),
        lambda d: torch.randint(5, 3, (2,), device=d),
        lambda d: torch.randint_like(torch.zeros(2, device=d), 5, dtype=torch.bool),
        lambda d: torch.zeros(3, dtype=torch.bool, device=d).random_(3),
        lambda d: torch.zeros(3, dtype=torch.uint8, device=d).random_(-1, 4),
    ],
    ids=[
        "randint-bool",
        "randint-uint8-high",
        "randint-uint8-low",
        "randint-empty-range",
        "randint_like-bool",
        "random_-bool",
        "random_-uint8",
    ],
)
def test_random_integers_out_of_the_dtype_raise_at_the_call_like_cpu(make, dev):
    """PyTorch checks these bounds in its CPU kernels (not its meta kernels): lazyxla used to draw numbers."""
    with pytest.raises(RuntimeError) as cpu:
        make("cpu")
    with pytest.raises(RuntimeError) as got:
        make(dev)
    assert str(got.value) == str(cpu.value)


def test_random_integer_bounds_check_leaves_the_cpu_stream_alone(dev):
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    torch.randint(0, 2, (4,), dtype=torch.bool, device=dev)
    torch.zeros(2, device=dev).random_(1, 9)
    assert torch.equal(torch.rand(4), expected)


def test_legacy_tensor_new_from_data(dev):
    t = torch.ones(2, dtype=torch.int64).to(dev).new([[1, 2], [3, 4]])  # the same lift as torch.tensor
    t += torch.ones(2, 2, dtype=torch.int64).to(dev)
    t[0].mul_(10)
    assert t.tolist() == [[20, 30], [4, 5]] and t.dtype == torch.int64


def test_randperm_is_a_permutation(dev):
    assert sorted(torch.randperm(7, device=dev).tolist()) == list(range(7))


def test_tensor_with_requires_grad_takes_part_in_autograd(dev):
    w = torch.tensor([1.0, -2.0], device=dev, requires_grad=True)
    (w * torch.tensor([3.0, 4.0], device=dev)).sum().backward()
    assert w.grad.tolist() == [3.0, 4.0]
    with torch.no_grad():
        w -= 0.5 * w.grad  # an optimizer's update of a leaf made by torch.tensor
    assert w.tolist() == [-0.5, -4.0]


def test_as_tensor_of_a_device_tensor_is_that_tensor(dev):
    x = torch.zeros(3).to(dev)
    y = torch.as_tensor(x)
    y.add_(1)  # as_tensor does not copy a tensor that is already right: x sees the change, as on the CPU
    assert x.tolist() == [1.0, 1.0, 1.0]
    z = torch.as_tensor(x, dtype=torch.float64)
    z.add_(1)
    assert x.tolist() == [1.0, 1.0, 1.0] and z.tolist() == [2.0, 2.0, 2.0]


def test_a_decomposition_that_calls_torch_tensor_below_functionalization(dev, monkeypatch):
    """PyTorch's decompositions run inside lazyxla's dispatch and may build tensors there
    (``_linspace_from_neg_one`` in ``affine_grid``'s does ``torch.tensor(0, device=x.device)``): those stay
    bare LazyTensors that the decomposition computes with, while the result the user gets is wrapped."""
    theta = torch.tensor([[[1.0, 0.5, 0.0], [0.0, 1.0, 0.25]]])
    expected = torch.nn.functional.affine_grid(theta, [1, 1, 1, 3], align_corners=False)
    got = torch.nn.functional.affine_grid(theta.to(dev), [1, 1, 1, 3], align_corners=False)
    torch.testing.assert_close(got.cpu(), expected)

    # A decomposition that adds a non-0-d tensor built on the device (a wrapped one would be refused there).
    op = torch.ops.aten.affine_grid_generator.default
    original = record.decomposition

    def decomposition(func):
        if func is not op:
            return original(func)
        return lambda theta, size, align_corners: theta + torch.tensor([[[1.0], [2.0]]], device=theta.device)

    monkeypatch.setattr(record, "decomposition", decomposition)
    out = torch.nn.functional.affine_grid(theta.to(dev), [1, 1, 1, 3], align_corners=False)
    torch.testing.assert_close(out.cpu(), theta + torch.tensor([[[1.0], [2.0]]]))
    out += 1  # the user's result is an ordinary lazyxla tensor
    assert out.tolist() == (theta + torch.tensor([[[2.0], [3.0]]])).tolist()


def _mlp_steps(device, steps):
    """Hugging Face Trainer's running loss: a tensor made with ``torch.tensor(0.0, device=)`` accumulating
    each step's detached loss, and a per-step Python float made into a tensor on the device."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.randn(steps, 16, 4)
    tr_loss = torch.tensor(0.0, device=device)
    logged, compiles = [], []
    for step in range(steps):
        loss = model(data[step].to(device)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        tr_loss += loss.detach()
        weight = torch.tensor(0.1 + 0.37 * step, device=device)  # a new Python float every step
        tr_loss.mul_(weight)
        if device != "cpu":
            lazyxla.sync()
            compiles.append(lazyxla.metrics.counters()["compiles"])
        logged.append(tr_loss.item())
    return logged, compiles


def test_trainer_running_loss_matches_cpu_and_compiles_nothing_after_step_2(dev):
    expected, _ = _mlp_steps("cpu", 6)
    logged, compiles = _mlp_steps(dev, 6)
    np.testing.assert_allclose(logged, expected, rtol=1e-5)
    assert compiles[2:] == [compiles[1]] * 4, compiles


def test_trainer_running_loss_reset_idiom(dev):
    """``tr_loss -= tr_loss`` after logging (the Trainer's reset) keeps the tensor usable."""
    tr_loss = torch.tensor(0.0, device=dev)
    for value in (1.5, 2.5):
        tr_loss += torch.tensor(value, device=dev)
    assert tr_loss.item() == 4.0
    tr_loss -= tr_loss
    tr_loss += torch.ones(()).to(dev)
    assert tr_loss.item() == 1.0


# ---- out= of the range factories, and what PyTorch's device-generic suite (test_tensor_creation_ops) checks ----


def _range_out_cases():
    """(name, fill(out)): arange, range, linspace and logspace into a given out= tensor."""
    return {
        "arange": lambda out: torch.arange(0, 6, out=out),
        "arange_end": lambda out: torch.arange(6, out=out),
        "range": lambda out: torch.range(0, 5, out=out),
        "linspace": lambda out: torch.linspace(0, 5, 6, out=out),
        "logspace": lambda out: torch.logspace(0, 5, 6, base=2, out=out),
        "linspace_tensors": lambda out: torch.linspace(
            torch.tensor(0.0, device=out.device), torch.tensor(5.0, device=out.device), 6, out=out
        ),
    }


# how the out= tensor is made from a base x of shape (2, 4): the same number of elements (6) in another shape
_OUTS = {
    "plain_2x3": lambda x: torch.empty(2, 3, device=x.device),
    "transposed_view": lambda x: x[:, :3].t(),
    "narrow_view": lambda x: x.narrow(1, 1, 3),
    "empty_resized": lambda x: torch.empty(0, device=x.device),
}


@pytest.mark.parametrize("out_case", list(_OUTS))
@pytest.mark.parametrize("name", list(_range_out_cases()))
def test_range_factory_out_keeps_its_shape_when_the_count_matches_like_cpu(name, out_case, dev):
    """ATen resizes these out= tensors only when their element count differs: a (2, 3) out keeps its shape and is
    filled in row-major order, through a view into its base too (lazyxla resized it to (6,), or refused the view)."""
    fill = _range_out_cases()[name]
    results = {}
    for device in ("cpu", dev):
        x = torch.zeros(2, 4, device=device)
        out = _OUTS[out_case](x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch.range is deprecated
            returned = fill(out)
        assert returned is out
        results[device] = (out.shape, out.cpu(), x.cpu())
    assert results[dev][0] == results["cpu"][0]
    torch.testing.assert_close(results[dev][1], results["cpu"][1], rtol=1e-6, atol=0)
    torch.testing.assert_close(results[dev][2], results["cpu"][2], rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("args", "dtype"),
    [
        (args, dtype)
        for args in [(0, 10), (1, 2, 0.3), (5, 1, -2), (0, 0)]
        for dtype in [torch.float32, torch.float64, torch.int64, torch.bfloat16]
        if not (dtype == torch.int64 and args == (1, 2, 0.3))  # integer ranges take integer steps
    ],
)
def test_torch_range_on_the_device_matches_cpu_with_its_one_warning(args, dtype, dev):
    """torch.range (end included) is recorded on the device; it ran on the CPU into an out= copy that could not
    be resized ("Trying to resize storage that is not resizable")."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.range(*args, dtype=dtype, device=dev).cpu()
    assert len(caught) == 1 and "torch.range is deprecated" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = torch.range(*args, dtype=dtype)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(2, 3, 4), (0, 2, 0), (3,)])
@pytest.mark.parametrize("strides", [(12, 4, 1), (2, 4, 6), (0, 0, 0), (1, 2, 6), (7, 1, 30)])
def test_empty_strided_storage_is_as_large_as_on_cpu(shape, strides, dev):
    """empty_strided with gaps between its elements has the CPU's storage size, and as_strided of a tensor of that
    many elements accepts the layout (lazyxla's storage held only the elements: "setStorage: ... out of bounds")."""
    strides = strides[: len(shape)]
    cpu = torch.empty_strided(shape, strides)
    t = torch.empty_strided(shape, strides, device=dev)
    assert t.shape == cpu.shape
    assert t.untyped_storage().nbytes() >= cpu.untyped_storage().nbytes()
    if math.prod(shape) and t.untyped_storage().nbytes() != t.numel() * t.element_size():
        assert t.untyped_storage().nbytes() == cpu.untyped_storage().nbytes()
    viewed = torch.empty(t.untyped_storage().nbytes() // t.element_size(), device=dev).as_strided(shape, strides)
    assert viewed.shape == t.shape
    filled = t.fill_(3.0).cpu()  # usable as a tensor: written and read back
    torch.testing.assert_close(filled, torch.full(shape, 3.0))


def test_block_diag_of_cpu_and_device_inputs_raises_pytorchs_message(dev):
    with pytest.raises(RuntimeError) as cpu_first:
        torch.block_diag(torch.ones(2, 2), torch.ones(2, 2, device=dev))
    assert str(cpu_first.value) == (
        "torch.block_diag: input tensors must all be on the same device. Input 0 is on device cpu and input 1 is on "
        f"device {torch.device(dev)}"
    )
    with pytest.raises(RuntimeError, match=r"Input 0 has 3 dimensions"):
        torch.block_diag(torch.ones(1, 1, 1, device=dev), torch.ones(2))
    x, y = torch.arange(4.0).reshape(2, 2), torch.arange(3.0)[None]
    torch.testing.assert_close(torch.block_diag(x.to(dev), y.to(dev)).cpu(), torch.block_diag(x, y))


def test_random_default_of_int64_spans_the_dtype_like_cpu(dev):
    """random_() of int64 draws from [0, 2**63 - 1] (jax refused the bound 2**63 with an OverflowError)."""
    t = torch.empty(2000, dtype=torch.int64, device=dev)
    t.random_()
    values = t.cpu().double()
    top = float(torch.iinfo(torch.int64).max)
    assert 0 <= values.min() < 0.1 * top and 0.9 * top < values.max() <= top


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal_into_an_out_tensor_draws_like_cpu(dtype, dev):
    """normal(mean, std, size, out=) ran normal_ on the CPU below functionalization and dropped the result: zeros."""
    stats = {}
    for device in ("cpu", dev):
        torch.manual_seed(0)
        r = torch.full((100, 100), 42.0, dtype=dtype, device=device)
        torch.normal(2, 3, (100, 100), dtype=dtype, device=device, out=r)
        stats[device] = (r.mean().item(), r.std().item())
    np.testing.assert_allclose(stats[dev], stats["cpu"], atol=0.3)
    np.testing.assert_allclose(stats[dev], (2, 3), atol=0.3)


def test_cpu_fallback_of_an_in_place_op_writes_its_result_into_self(dev):
    """An in-place op that runs on the CPU (no rule, no functional form) changes its lazyxla ``self``."""
    a, b = torch.arange(4.0), torch.full((4,), 2.0)
    la, lb = unwrap(a.to(dev)), unwrap(b.to(dev))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the fallback's own warning
        decompose.fallback(torch.ops.aten.mul_.Tensor, (la, lb), {})  # as the recorder calls it
    torch.testing.assert_close(lazy_to_cpu(la), a.mul_(b))


def test_data_ptr_tells_copies_from_aliases_and_offsets_views_like_cpu(dev):
    """A lazyxla tensor's data_ptr was 0 for every tensor: a copy looked like an alias (torch.asarray(copy=True))."""
    for device in ("cpu", dev):
        a = torch.ones(5, 5, device=device)
        assert torch.asarray(a, copy=True).data_ptr() != a.data_ptr()
        assert a.clone().data_ptr() != a.data_ptr()
        assert torch.asarray(a).data_ptr() == a.detach().data_ptr() == a.data_ptr() != 0
        assert (a[1:].data_ptr() - a.data_ptr(), a[:, 2].data_ptr() - a.data_ptr()) == (20, 8)
        assert torch.empty(0, device=device).data_ptr() == 0


@pytest.mark.parametrize("shape", [(5, 0, 1), (3,)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
def test_rand_of_an_integer_dtype_raises_like_cpu(dtype, shape, dev):
    """torch.rand of an integer dtype gave random integers on lazyxla; the CPU raises, for an empty size too."""
    with pytest.raises(RuntimeError) as cpu:
        torch.rand(shape, dtype=dtype)
    with pytest.raises(type(cpu.value), match=re.escape(str(cpu.value))):
        torch.rand(shape, dtype=dtype, device=dev)
