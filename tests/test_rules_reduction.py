"""Reductions and scans (rules/reduction.py) against CPU eager: dims, keepdim, dtypes, NaN, gradients."""

from __future__ import annotations

import pytest
import torch

from tests.util import check, to_dev
from tests.util import integers as _i
from tests.util import uniform as _f


def check_nan(fn, *args):
    """``check`` for outputs holding NaN: a NaN must meet a NaN."""
    expected, actual = fn(*args), fn(*to_dev(args))
    for e, a in zip(*((expected, actual) if isinstance(expected, tuple) else ((expected,), (actual,)))):
        assert a.device.type == "lazyxla"
        torch.testing.assert_close(a.cpu(), e, equal_nan=True)


# name -> fn of one tensor; each case runs on a float32 (3, 4, 5) input with gradients, where differentiable
FLOAT = {
    "sum": lambda x: x.sum(),
    "sum_dim": lambda x: x.sum(1),
    "sum_dims_keepdim": lambda x: x.sum((0, -1), keepdim=True),
    "sum_empty_dims": lambda x: x.sum(dim=[]),
    "sum_dtype": lambda x: x.sum(1, dtype=torch.float64),
    "nansum": lambda x: torch.nansum(x, 2),
    "mean": lambda x: x.mean(),
    "mean_dim": lambda x: x.mean(-1),
    "mean_dims_keepdim": lambda x: x.mean((0, 2), keepdim=True),
    "mean_dtype": lambda x: x.mean(0, dtype=torch.float64),
    "prod": lambda x: x.prod(),
    "prod_dim": lambda x: x.prod(1),
    "prod_keepdim": lambda x: x.prod(-1, keepdim=True),
    "amax": lambda x: x.amax(),
    "amax_dims": lambda x: x.amax((0, 2)),
    "amin_keepdim": lambda x: x.amin(1, keepdim=True),
    "max": lambda x: x.max(),
    "min": lambda x: x.min(),
    "max_dim": lambda x: x.max(1),
    "max_dim_keepdim": lambda x: x.max(-1, keepdim=True),
    "min_dim": lambda x: x.min(0),
    "argmax": lambda x: x.argmax(),
    "argmax_dim": lambda x: x.argmax(1),
    "argmax_keepdim": lambda x: x.argmax(-1, keepdim=True),
    "argmin_dim": lambda x: x.argmin(2),
    "argmin": lambda x: x.argmin(),
    "var": lambda x: x.var(),
    "var_dim": lambda x: x.var(1),
    "var_unbiased_false": lambda x: x.var(1, unbiased=False),
    "var_correction": lambda x: torch.var(x, (0, 2), correction=2, keepdim=True),
    "std": lambda x: x.std(),
    "std_dim": lambda x: x.std(-1, keepdim=True),
    "std_correction0": lambda x: torch.std(x, 0, correction=0),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "var_mean_all": lambda x: torch.var_mean(x, correction=0),
    "std_mean": lambda x: torch.std_mean(x, (0, 1), keepdim=True),
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "logsumexp_dims": lambda x: torch.logsumexp(x, (0, 2), keepdim=True),
    "cumsum": lambda x: x.cumsum(1),
    "cumsum_neg": lambda x: x.cumsum(-1),
    "cumsum_dtype": lambda x: x.cumsum(0, dtype=torch.float64),
    "cumprod": lambda x: x.cumprod(2),
    "logcumsumexp": lambda x: torch.logcumsumexp(x, 1),
    "cummax": lambda x: torch.cummax(x, 1),
    "cummin": lambda x: torch.cummin(x, -1),
    "norm": lambda x: x.norm(),
    "norm_p1_dim": lambda x: x.norm(1, dim=1),
    "vector_norm": lambda x: torch.linalg.vector_norm(x),
    "vector_norm_2f": lambda x: torch.linalg.vector_norm(x, 2.0, dim=(0, 2)),
    "vector_norm_3": lambda x: torch.linalg.vector_norm(x, 3, dim=1, keepdim=True),
    "vector_norm_3f": lambda x: torch.linalg.vector_norm(x, 3.5, dim=-1),
    "vector_norm_half": lambda x: torch.linalg.vector_norm(x, 0.5),
    "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1),
    "vector_norm_neginf": lambda x: torch.linalg.vector_norm(x, float("-inf"), dim=1),
    "vector_norm_0": lambda x: torch.linalg.vector_norm(x, 0, dim=1),
    "vector_norm_1": lambda x: torch.linalg.vector_norm(x, 1),
    "vector_norm_dtype": lambda x: torch.linalg.vector_norm(x, dtype=torch.float64),
    "count_nonzero": lambda x: torch.count_nonzero(torch.relu(x)),
    "count_nonzero_dims": lambda x: torch.count_nonzero(torch.relu(x), (0, 2)),
    "any": lambda x: (x > 2.5).any(),
    "any_dim": lambda x: (x > 2).any(1),
    "all_dims": lambda x: (x > -2.5).all((0, 2)),
    "all_keepdim": lambda x: (x > -2).all(-1, keepdim=True),
}
NO_GRAD = {"vector_norm_0", "count_nonzero", "count_nonzero_dims", "any", "any_dim", "all_dims", "all_keepdim"}
NO_GRAD |= {n for n in FLOAT if n.startswith("arg")}


@pytest.mark.parametrize("name", list(FLOAT))
def test_float(name):
    check(FLOAT[name], _f(3, 4, 5, grad=name not in NO_GRAD), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.sum(),
        lambda x: x.sum(0, keepdim=True),
        lambda x: x.max(),
        lambda x: x.max(-1),
        lambda x: x.cumsum(0),
        lambda x: torch.logsumexp(x, 0),
        lambda x: torch.var_mean(x, 0, correction=0),
        lambda x: torch.cummin(x, 0),
    ],
)
def test_zero_dim_input(fn):
    check(fn, _f(grad=True))
    check(lambda x: x.argmax(0), _f())


# integer and bool inputs: sums widen to int64, means and logsumexp need floats
INT = {
    "sum": lambda x: x.sum(),
    "sum_dim": lambda x: x.sum(1, keepdim=True),
    "sum_float": lambda x: x.sum(0, dtype=torch.float32),
    "prod": lambda x: x.prod(),
    "prod_dim": lambda x: x.prod(2),
    "amax": lambda x: x.amax(1),
    "amin": lambda x: x.amin(),
    "max_dim": lambda x: x.max(1),
    "min_dim": lambda x: x.min(-1),
    "argmax": lambda x: x.argmax(1),
    "argmin": lambda x: x.argmin(),
    "mean_dtype": lambda x: x.mean(1, dtype=torch.float32),
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "cumsum": lambda x: x.cumsum(1),
    "cumprod": lambda x: x.cumprod(-1),
    "cummax": lambda x: torch.cummax(x, 1),
    "cummin": lambda x: torch.cummin(x, 0),
    "count_nonzero": lambda x: torch.count_nonzero(x, 1),
    "any": lambda x: x.any(),
    "all_dim": lambda x: x.all(1),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
@pytest.mark.parametrize("name", list(INT))
def test_int_bool(name, dtype):
    if dtype == torch.bool and name in ("argmax", "argmin"):
        pytest.skip(f"PyTorch: {name} does not support bool input")
    x = _i(3, 4, 5, lo=0 if dtype in (torch.bool, torch.uint8) else -3, hi=2 if dtype == torch.bool else 4)
    check(INT[name], x.to(dtype))


def test_ties_pick_what_pytorch_picks():
    x = torch.tensor([[1, 3, 3, 0, 3], [2, 2, 1, 1, 0]])
    for fn in [INT["max_dim"], INT["min_dim"], lambda x: x.argmax(1), lambda x: x.argmin(1)]:
        check(fn, x)
    check(lambda x: torch.cummax(x, 1), x)
    check(lambda x: torch.cummin(x, 1), x)
    check(lambda x: torch.cummax(x, 1), x.float())


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.sum(1),
        lambda x: x.amax(1),
        lambda x: x.max(1),
        lambda x: x.min(1),
        lambda x: x.argmax(1),
        lambda x: x.argmin(1),
        lambda x: torch.cummax(x, 1),
        lambda x: torch.cummin(x, 1),
        lambda x: torch.logsumexp(x, 1),
        lambda x: torch.nansum(x, 1),
        lambda x: torch.linalg.vector_norm(x, dim=1),
    ],
)
def test_nan_and_inf(fn):
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, nan, 3.0, nan], [-inf, -inf, -inf, -inf], [inf, 1.0, inf, 2.0], [0.0, 5.0, -1.0, 5.0]])
    check_nan(fn, x)


def test_low_precision_accumulates_in_float32():
    x = torch.full((4096,), 1.0, dtype=torch.bfloat16) / 3
    check(lambda x: x.sum(), x, rtol=1e-2, atol=1e-2)
    check(lambda x: x.mean(), x.half(), rtol=1e-3, atol=1e-3)
    check(lambda x: x.var(), _f(64, 8, dtype=torch.float16), rtol=1e-3, atol=1e-3)


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_var_more_correction_than_elements():
    check_nan(lambda x: torch.var(x, 1, correction=7), _f(3, 5))
    check_nan(lambda x: torch.std(x, 1), _f(3, 1))


def test_clip_grad_norm():
    def step(w, x):
        loss = (w * x).sum()
        loss.backward()
        total = torch.nn.utils.clip_grad_norm_([w], max_norm=0.5)
        return total, w.grad * 1

    w, x = _f(4, 3, grad=True), _f(4, 3, seed=1)
    expected = step(w, x)
    w_dev = to_dev(w)
    actual = step(w_dev, to_dev(x))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e.detach(), rtol=1e-5, atol=1e-6)


def test_bool_reduction_overloads():
    x = _f(3, 4, 5) > -2.5
    check(lambda x: x.all(), x)
    check(lambda x: torch.ops.aten.any.dims(x, [0, 2], True), x)
    check(lambda x: torch.ops.aten.all.dims(x), x)
