"""PyTorch's OpInfo database on lazyxla: every sample of every op, compared with CPU eager.

Forward: values (PyTorch-like tolerances per dtype), exact dtypes, shapes, and that outputs live on
the lazyxla device. Gradients (float32): ``torch.autograd.grad`` of a weighted sum of the outputs.
All samples of one (op, dtype) are recorded first and synced once, so each case compiles one program.

``make test`` runs the representative subset ``FAST``; ``make test-ops`` runs everything
(``pytest tests/ops --opinfo=full``) and writes per-op results to ``build/opinfo-results.json``,
which ``python -m lazyxla.tools.coverage`` summarizes.
"""

from __future__ import annotations

import copy
import inspect
import itertools

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import lazyxla
from tests.ops.expected import (
    EXPECTED_FAILURES,
    INPUT_ONLY_ON_DEVICE,
    NONDETERMINISTIC,
    RANDOM_SAMPLES,
    SKIP_OPS,
    TOLERANCE_OVERRIDES,
)
from tests.util import to_cpu

# Fallbacks are not failures here: each case records the ops that ran on the CPU in the results file,
# and `python -m lazyxla.tools.coverage` reports them.
pytestmark = pytest.mark.allow_fallback()

DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
    torch.complex64,
)
# (rtol, atol): close to torch.testing's defaults, with float32 allowing for XLA's reassociation
TOL = {
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.complex64: (1e-4, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
MAX_SAMPLES = 12

# The subset `make test` runs: common ops of every family.
FAST = {
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "exp",
    "log",
    "sin",
    "tanh",
    "sigmoid",
    "abs",
    "neg",
    "clamp",
    "where",
    "eq",
    "lt",
    "maximum",
    "sum",
    "mean",
    "amax",
    "argmax",
    "var",
    "softmax",
    "log_softmax",
    "cumsum",
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "view",
    "reshape",
    "permute",
    "transpose",
    "cat",
    "stack",
    "index_select",
    "gather",
    "scatter_add",
    "nn.functional.embedding",
    "nn.functional.conv2d",
    "nn.functional.layer_norm",
    "nn.functional.batch_norm",
    "nn.functional.max_pool2d",
    "nn.functional.gelu",
    "nn.functional.relu",
    "nn.functional.cross_entropy",
    "nn.functional.scaled_dot_product_attention",
    "masked_fill",
    "index_put",
    "tril",
    "flip",
    "roll",
    "topk",
    "sort",
    "logsumexp",
}


def _case_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _cases(kind: str, full: bool, only: set[str] | None = None):
    for op in op_db:
        cid = _case_id(op)
        if not full and op.name not in FAST:
            continue
        dtypes = (torch.float32,) if kind == "grad" else DTYPES
        if only is not None:
            dtypes = tuple(d for d in dtypes if str(d).removeprefix("torch.") in only)
        supported = op.supported_dtypes("cpu") if kind == "forward" else op.supported_backward_dtypes("cpu")
        for dtype in dtypes:
            if dtype not in supported or (kind == "grad" and not op.supports_autograd):
                continue
            dname = str(dtype).removeprefix("torch.")
            marks = []
            reason = SKIP_OPS.get(op.name)
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
            for key in ((cid, dname, kind), (cid, "*", kind), (cid, dname, "*"), (cid, "*", "*")):
                if key in EXPECTED_FAILURES:
                    marks.append(pytest.mark.xfail(reason=EXPECTED_FAILURES[key], strict=False))
                    break
            yield pytest.param(op, dtype, id=f"{cid}-{dname}", marks=marks)


def pytest_generate_tests(metafunc):
    full = metafunc.config.getoption("--opinfo") == "full"
    names = metafunc.config.getoption("--opinfo-dtypes")
    only = None if names == "all" else set(names.split(","))
    kind = {"test_forward": "forward", "test_grad": "grad"}.get(metafunc.function.__name__)
    if kind:
        metafunc.parametrize("op,dtype", list(_cases(kind, full, only)))


def _moved(x, dev):
    if isinstance(x, torch.Tensor):
        return x.detach().to(dev).requires_grad_(x.requires_grad)
    if (isinstance(x, torch.device) and x.type == "cpu") or x == "cpu":  # factories: device="cpu" -> lazyxla
        return dev
    if isinstance(x, (list, tuple)):
        return type(x)(_moved(e, dev) for e in x)
    if isinstance(x, dict):
        return {k: _moved(v, dev) for k, v in x.items()}
    return x


def _to_dev(sample, op=None):
    """A copy of the sample with every tensor moved to lazyxla (leaves keep requires_grad)."""
    dev = lazyxla.device()
    out = copy.copy(sample)
    out.input = _moved(sample.input, dev)
    if op is None or op.name not in INPUT_ONLY_ON_DEVICE:
        out.args, out.kwargs = _moved(sample.args, dev), _moved(sample.kwargs, dev)
    if op is not None and "device" not in out.kwargs and not _has_tensor(sample) and _takes_device(op):
        out.kwargs = {**out.kwargs, "device": dev}  # a factory sample that relies on the default device
    return out


def _has_tensor(sample) -> bool:
    stack = [sample.input, sample.args, sample.kwargs]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            return True
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return False


def _takes_device(op) -> bool:
    try:
        return "device" in inspect.signature(op.op).parameters
    except (TypeError, ValueError):
        return False


def _override(op, kind, dtype):
    """Looser (rtol, atol) for this op, kind and dtype, if listed (a dtype-specific entry wins)."""
    name = str(dtype).removeprefix("torch.")
    found = TOLERANCE_OVERRIDES.get((_case_id(op), kind, name)) or TOLERANCE_OVERRIDES.get((_case_id(op), kind))
    return found[:2] if found else None


def _call(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


def _compare(actual, expected, dtype, what, tol=None):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {type(actual).__name__}"
        assert actual.device.type == "lazyxla", f"{what}: output lives on {actual.device}"
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, eager gives {expected.dtype}"
        assert actual.shape == expected.shape, (
            f"{what}: shape {tuple(actual.shape)}, eager gives {tuple(expected.shape)}"
        )
        rtol, atol = TOL.get(expected.dtype, (0, 0))
        if tol:  # an override only loosens the dtype's tolerance
            rtol, atol = max(rtol, tol[0]), max(atol, tol[1])
        torch.testing.assert_close(
            to_cpu(actual), expected, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}"
        )
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), f"{what}: structure differs"
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, dtype, f"{what}[{i}]", tol)
    else:
        assert actual == expected or (expected != expected and actual != actual), f"{what}: {actual!r} != {expected!r}"


def _metadata_only(actual, expected, what):
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
        assert actual.device.type == "lazyxla", what
    elif isinstance(expected, (list, tuple)):
        for a, e in zip(actual, expected):
            _metadata_only(a, e, what)


def _eager_samples(op, dtype, requires_grad, reference=False):
    """(lazyxla copy of the sample, eager output) for the samples eager PyTorch accepts.

    The copy is taken before eager runs: some ops update their inputs in place (batch_norm's
    running statistics).
    """
    out = []
    if reference:  # float32: PyTorch's reference inputs too (they start with the sample inputs)
        samples = itertools.islice(op.reference_inputs("cpu", dtype, requires_grad=requires_grad), 2 * MAX_SAMPLES)
    else:
        samples = itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=requires_grad), MAX_SAMPLES)
    for sample in samples:
        moved = _to_dev(sample, op)
        try:
            expected = _call(op, sample)
        except Exception:  # eager refuses this sample: nothing to compare
            continue
        out.append((moved, expected))
    return out


def _fallbacks() -> list[str]:
    return sorted(k.removeprefix("fallback.") for k in lazyxla.metrics.counters() if k.startswith("fallback."))


def test_forward(op, dtype, record_property, request):
    record_property("opinfo", {"op": _case_id(op), "dtype": str(dtype).removeprefix("torch."), "kind": "forward"})
    full = request.config.getoption("--opinfo") == "full"
    pairs = _eager_samples(op, dtype, requires_grad=False, reference=full and dtype == torch.float32)
    if not pairs:
        pytest.skip("eager PyTorch accepts no sample")
    actual = [_call(op, s) for s, _ in pairs]
    lazyxla.sync()
    record_property("fallbacks", _fallbacks())
    for i, ((sample, expected), got) in enumerate(zip(pairs, actual)):
        what = f"sample {i} ({sample.summary() if hasattr(sample, 'summary') else ''})"
        if _random(op, sample):
            _metadata_only(got, expected, what)
        else:
            _compare(got, expected, dtype, what, _override(op, "forward", dtype))


def _random(op, sample=None) -> bool:
    """Whether the op (or this sample of it) draws random numbers: eager's stream cannot be matched."""
    if op.name in NONDETERMINISTIC or _case_id(op) in NONDETERMINISTIC:
        return True
    return sample is not None and op.name in RANDOM_SAMPLES and RANDOM_SAMPLES[op.name](sample)


def _grad_inputs(sample):
    leaves = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            if x.requires_grad:
                leaves.append(x)
        elif isinstance(x, (list, tuple)):
            for e in x:
                walk(e)
        elif isinstance(x, dict):
            for e in x.values():
                walk(e)

    walk([sample.input, sample.args, sample.kwargs])
    return leaves


def _weighted_sum(out, gen):
    outs = [o for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, torch.Tensor)]
    total = 0
    for o in outs:
        if o.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex):
            w = torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype)
            total = total + (o * w.to(o.device)).sum().real
    return total


def test_grad(op, dtype, record_property):
    record_property("opinfo", {"op": _case_id(op), "dtype": "float32", "kind": "grad"})
    if _random(op):
        pytest.skip("random op: its gradient is checked in tests/test_rules_random.py")
    done = 0
    for i, sample in enumerate(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=True), MAX_SAMPLES)):
        if _random(op, sample):
            continue
        inputs = _grad_inputs(sample)
        dev_sample = _to_dev(sample, op)
        try:
            out = _call(op, sample)
            if sample.output_process_fn_grad is not None:
                out = sample.output_process_fn_grad(out)
            loss = _weighted_sum(out, torch.Generator().manual_seed(i))
            if not isinstance(loss, torch.Tensor) or not inputs:
                continue
            expected = torch.autograd.grad(loss, inputs, allow_unused=True)
        except Exception:
            continue
        dev_inputs = _grad_inputs(dev_sample)
        out = _call(op, dev_sample)
        if sample.output_process_fn_grad is not None:
            out = sample.output_process_fn_grad(out)
        loss = _weighted_sum(out, torch.Generator().manual_seed(i))
        got = torch.autograd.grad(loss, dev_inputs, allow_unused=True)
        for j, (g, e) in enumerate(zip(got, expected)):
            if e is None:
                continue
            _compare(g, e, dtype, f"sample {i} grad {j}", _override(op, "grad", dtype))
        done += 1
    record_property("fallbacks", _fallbacks())
    if not done:
        pytest.skip("no sample with a differentiable output")
