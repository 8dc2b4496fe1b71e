"""Ops that used to run on the CPU against CPU eager: sort/topk, fft, distances, grid sampling,
embedding bags, random factories, nonzero, and batch norm below functionalization."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.lazy import record
from lazyxla.lazy.tensor import unwrap, wrap
from tests.util import assert_same, check, integers, to_dev, uniform
from tests.util import normal as _r

aten = torch.ops.aten
TOL = dict(rtol=1e-4, atol=1e-5)

# ---- sort, topk ----


def _ties(*shape, seed=0):
    """Floats with many ties, a NaN, an inf and both zeros."""
    x = integers(*shape, lo=-3, hi=4, seed=seed).float()
    flat = x.view(-1)
    flat[::7] = 0.0
    flat[3::11] = -0.0
    flat[5] = math.nan
    flat[8] = math.inf
    return x


def _check_nan(fn, x):
    """``check`` for outputs holding NaN (compared equal where both are NaN)."""
    expected, actual = fn(x), fn(to_dev(x))
    for a, e in zip(actual, expected):
        assert a.device.type == "lazyxla"
        torch.testing.assert_close(a.cpu(), e, equal_nan=True, rtol=0, atol=0)


SORTS = [
    dict(),
    dict(dim=0),
    dict(dim=1, descending=True),
    dict(dim=-1, descending=True),
    dict(stable=True),
    dict(stable=True, dim=0, descending=True),
]


@pytest.mark.parametrize("kw", SORTS, ids=str)
def test_sort_ties_nan_and_zeros_in_pytorch_order(kw):
    _check_nan(lambda x: torch.sort(x, **kw), _ties(6, 9))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float16, torch.float64])
def test_sort_dtypes(dtype):
    x = integers(5, 8, lo=0, hi=3).to(dtype)
    check(lambda x: torch.sort(x, descending=True), x)
    check(lambda x: torch.sort(x, dim=0, stable=True), x)


def test_sort_0d_empty_and_argsort():
    check(lambda x: torch.sort(x), torch.tensor(3.0))
    check(lambda x: torch.sort(x, dim=0), torch.ones(0, 3))
    check(lambda x: torch.argsort(x, dim=0, descending=True, stable=True), _ties(7, 4))


def test_sort_grad():
    check(lambda x: torch.sort(x, dim=1, descending=True)[0] * 1, _r(4, 6), grad=True)
    check(lambda x: torch.msort(x), _r(5, 3), grad=True)


TOPKS = [
    (3, dict()),
    (2, dict(largest=False)),
    (4, dict(dim=0)),
    (1, dict(dim=0, largest=False)),
    (6, dict(dim=1)),
    (0, dict()),
]


@pytest.mark.parametrize("k,kw", TOPKS, ids=str)
def test_topk(k, kw):
    check(lambda x: torch.topk(x, k, **kw), _r(5, 6, grad=False))
    check(lambda x: torch.topk(x, k, **kw)[0] * 1, _r(5, 6), grad=True)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_ties_and_nan(largest):
    # PyTorch leaves the order of tied elements unspecified: values must match and indices name them
    x = _ties(6, 9)
    expected = torch.topk(x, 4, largest=largest)
    values, indices = torch.topk(to_dev(x), 4, largest=largest)
    torch.testing.assert_close(values.cpu(), expected.values, equal_nan=True)
    torch.testing.assert_close(x.gather(1, indices.cpu()), expected.values, equal_nan=True)


def test_topk_unsorted_and_ints():
    x = torch.randperm(40).reshape(5, 8)
    check(lambda x: torch.topk(x, 3, sorted=True), x)
    vals, _ = torch.topk(to_dev(x), 3, sorted=False)
    assert torch.equal(vals.cpu().sort(1, descending=True).values, torch.topk(x, 3).values)


# ---- fft ----

FFTS = [
    ("rfft", (8,), dict()),
    ("rfft", (3, 7), dict(norm="ortho")),
    ("rfft", (4, 6), dict(dim=0, norm="forward", n=5)),
    ("rfft2", (3, 4, 6), dict()),
    ("rfftn", (2, 5, 4), dict(dim=(0, 2), norm="ortho")),
    ("fft", (8,), dict(norm="forward")),
    ("ihfft", (7,), dict()),
    ("ihfft2", (4, 6), dict(norm="ortho")),
]


@pytest.mark.parametrize("name,shape,kw", FFTS, ids=str)
def test_real_to_complex_fft(name, shape, kw):
    fn = getattr(torch.fft, name)
    check(lambda x: fn(x, **kw), _r(*shape, grad=False), **TOL)
    # not view_as_real: a gradient that is a view of the incoming one meets a PyTorch bug in
    # _fft_r2c's backward under functionalization (it reads the gradient's sizes after regenerating it)
    check(lambda x: (fn(x, **kw) * (1 - 2j)).real, _r(*shape), grad=True, **TOL)


CFFTS = [
    ("fft", (8,), dict()),
    ("ifft", (3, 5), dict(norm="ortho")),
    ("fft2", (2, 4, 6), dict(norm="forward")),
    ("ifftn", (3, 4, 5), dict(dim=(0, 2), s=(4, 3))),
    ("irfft", (5,), dict()),
    ("irfft", (3, 5), dict(n=9, norm="ortho")),
    ("irfft2", (4, 4), dict(norm="forward")),
    ("irfftn", (2, 3, 4), dict(s=(3, 6), dim=(1, 2))),
    ("hfft", (6,), dict(norm="ortho")),
    ("hfft2", (3, 4), dict()),
]


def _complex(*shape, seed=0):
    return torch.complex(_r(*shape, grad=False, seed=seed), _r(*shape, grad=False, seed=seed + 1))


@pytest.mark.parametrize("name,shape,kw", CFFTS, ids=str)
def test_complex_input_fft(name, shape, kw):
    fn = getattr(torch.fft, name)
    x = _complex(*shape)
    check(lambda x: fn(x, **kw), x, **TOL)
    real = lambda x: fn(x, **kw).real if fn(x, **kw).is_complex() else fn(x, **kw)  # noqa: E731
    check(real, x.requires_grad_(), grad=True, **TOL)


def test_fft_float64_and_roundtrip():
    x = _r(4, 10, grad=False, dtype=torch.float64)
    check(lambda x: torch.fft.irfft(torch.fft.rfft(x), n=10), x, rtol=1e-10, atol=1e-10)
    check(lambda x: torch.fft.fftn(x.to(torch.complex128)), x, rtol=1e-10, atol=1e-10)


# ---- distances ----

PS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf]


def _with_repeats(*shape, seed=0):
    """Rows that repeat (zero distances) and coordinates that tie (p = inf)."""
    x = _r(*shape, grad=False, seed=seed)
    x[..., 1, :] = x[..., 0, :]
    x[..., 2, 0] = x[..., 2, 1] + 1.0
    x[..., 2, 2] = x[..., 2, 1] - 1.0
    return x.requires_grad_()


@pytest.mark.parametrize("p", PS)
def test_cdist(p):
    x1 = _with_repeats(5, 3)
    x2 = torch.cat([x1.detach()[:2] + 0.0, _r(3, 3, grad=False, seed=4)]).requires_grad_()
    check(lambda a, b: torch.cdist(a, b, p=p), x1, x2, grad=True, **TOL)


@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"])
def test_cdist_batched_broadcast(mode):
    a, b = _r(2, 1, 4, 3), _r(3, 30, 3, seed=2)
    check(lambda a, b: torch.cdist(a, b, compute_mode=mode), a, b, grad=True, rtol=1e-4, atol=1e-4)
    check(lambda a, b: torch.cdist(a, b, p=1.0), _r(2, 4, 3), _r(2, 5, 3, seed=3), grad=True, **TOL)


@pytest.mark.parametrize("p", PS)
def test_pdist(p):
    check(lambda x: F.pdist(x, p=p), _with_repeats(6, 3), grad=True, **TOL)


def test_pdist_edge_sizes():
    check(lambda x: F.pdist(x), _r(1, 4), grad=True)
    check(lambda x: F.pdist(x), _r(2, 1), grad=True)


# ---- grid sampling ----

GRIDS = [(mode, pad, ac) for mode in ("bilinear", "nearest", "bicubic") for pad in ("zeros", "border", "reflection")
         for ac in (False, True)]  # fmt: skip


@pytest.mark.parametrize("mode,pad,align_corners", GRIDS, ids=str)
def test_grid_sample_2d(mode, pad, align_corners):
    x = _r(2, 3, 5, 7)
    grid = uniform(2, 4, 6, 2, lo=-1.4, hi=1.4, grad=True)
    tol = dict(rtol=1e-4, atol=1e-4)
    check(lambda x, g: F.grid_sample(x, g, mode, pad, align_corners), x, grid, grad=True, **tol)


@pytest.mark.parametrize("mode,pad,align_corners", [m for m in GRIDS if m[0] != "bicubic"], ids=str)
def test_grid_sample_3d(mode, pad, align_corners):
    x = _r(1, 2, 3, 4, 5)
    grid = uniform(1, 2, 3, 4, 3, lo=-1.3, hi=1.3, grad=True)
    check(lambda x, g: F.grid_sample(x, g, mode, pad, align_corners), x, grid, grad=True, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_exact_pixels_and_affine_grid(align_corners):
    # an identity affine grid reads every pixel back exactly
    x = _r(2, 3, 4, 5)
    theta = torch.tensor([[[1.0, 0, 0], [0, 1, 0]]]).repeat(2, 1, 1)

    def fn(x, t):
        return F.grid_sample(x, F.affine_grid(t, x.shape, align_corners=align_corners), align_corners=align_corners)

    check(fn, x, theta)


# ---- embedding bags ----

WEIGHT = (10, 3)
INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 4])
OFFSETS = torch.tensor([0, 3, 3, 6])  # bag 1 is empty

BAGS = [
    dict(mode="sum"),
    dict(mode="mean"),
    dict(mode="max"),
    dict(mode="sum", padding_idx=4),
    dict(mode="mean", padding_idx=4),
    dict(mode="max", padding_idx=4),
]


@pytest.mark.parametrize("kw", BAGS, ids=str)
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag(kw, include_last_offset):
    offsets = torch.cat([OFFSETS, torch.tensor([len(INDICES)])]) if include_last_offset else OFFSETS
    fn = lambda w, i, o: F.embedding_bag(i, w, o, include_last_offset=include_last_offset, **kw)  # noqa: E731
    check(fn, _r(*WEIGHT), INDICES, offsets, grad=True)
    with torch.no_grad():  # the forward-only op
        check(fn, _r(*WEIGHT, grad=False), INDICES, offsets)


@pytest.mark.parametrize("kw", [dict(mode="sum"), dict(mode="mean", padding_idx=2)], ids=str)
def test_embedding_bag_scale_grad_by_freq(kw):
    # PyTorch's CPU kernel divides by the wrong count (it looks counts up by the unique-group number);
    # its CUDA kernel and F.embedding divide each row's gradient by the row's frequency, as lazyxla does
    w, g = _r(*WEIGHT), _r(len(OFFSETS), WEIGHT[1], grad=False)
    F.embedding_bag(INDICES, w, OFFSETS, **kw).backward(g)
    expected = w.grad / torch.bincount(INDICES, minlength=WEIGHT[0]).clamp(min=1)[:, None]
    wd = to_dev(w.detach().requires_grad_())
    out = F.embedding_bag(to_dev(INDICES), wd, to_dev(OFFSETS), scale_grad_by_freq=True, **kw)
    assert_same(out, F.embedding_bag(INDICES, w, OFFSETS, **kw).detach())
    out.backward(to_dev(g))
    assert_same(wd.grad, expected)


@pytest.mark.parametrize("padding_idx", [None, 4])
def test_embedding_bag_per_sample_weights_and_2d_input(padding_idx):
    psw = uniform(len(INDICES), lo=0.1, hi=2.0, grad=True)

    def fn(w, s, i, o):
        return F.embedding_bag(i, w, o, mode="sum", per_sample_weights=s, padding_idx=padding_idx)

    check(fn, _r(*WEIGHT), psw, INDICES, OFFSETS, grad=True)
    check(lambda w, i: F.embedding_bag(i, w, mode="max"), _r(*WEIGHT), INDICES.view(2, 5), grad=True)
    bag = lambda w, i: torch.nn.EmbeddingBag.from_pretrained(w, mode="mean", freeze=False)(i)  # noqa: E731
    check(bag, _r(*WEIGHT), INDICES.view(5, 2), grad=True)


def test_embedding_bag_max_ties_take_the_first_row():
    w = torch.tensor([[1.0, 5.0], [1.0, 5.0], [0.0, 7.0]], requires_grad=True)
    fn = lambda w, i, o: F.embedding_bag(i, w, o, mode="max")  # noqa: E731
    check(fn, w, torch.tensor([0, 1, 2, 1]), torch.tensor([0, 2]), grad=True)


def test_embedding_max_norm_renorms_rows():
    w = _r(*WEIGHT, grad=False) * 3

    def fn(w, i, o):
        w = w.clone()
        out = F.embedding_bag(i, w, o, max_norm=1.5, norm_type=1.0)
        return out, w

    check(fn, w, INDICES, OFFSETS)


# ---- random factories ----


@pytest.mark.parametrize("factory", [torch.rand, torch.randn])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_random_factories_record_one_op(dev, factory, dtype):
    torch.manual_seed(0)
    a = factory(3, 4, device=dev, dtype=dtype)
    assert lazyxla.metrics.counters()["ops_recorded"] == 1  # rand/randn itself, not empty + an in-place draw
    torch.manual_seed(0)
    b = factory(3, 4, device=dev, dtype=dtype)
    assert a.dtype == dtype and a.shape == (3, 4) and a.device.type == "lazyxla"
    assert torch.equal(a.cpu(), b.cpu()) and a.cpu().std() > 0
    if factory is torch.rand:
        assert a.cpu().min() >= 0 and a.cpu().max() < 1


# ---- nonzero ----

NONZEROS = [
    lambda x: torch.nonzero(x),
    lambda x: torch.nonzero(x > 0.5),
    lambda x: torch.argwhere(x),
    lambda x: torch.nonzero(x, as_tuple=True),
    lambda x: torch.where(x < 0),
]


@pytest.mark.parametrize("i", range(len(NONZEROS)))
def test_nonzero_stays_on_device(i):
    x = integers(4, 5, lo=-1, hi=2).float()
    check(NONZEROS[i], x)
    assert lazyxla.metrics.counters()["data_dependent_syncs"] == 1


@pytest.mark.parametrize(
    "x",
    [torch.zeros(3, 4), torch.ones(2, 3, 2, dtype=torch.bool), torch.tensor(2), torch.tensor(0.0), torch.ones(0, 3)],
)
def test_nonzero_edge_cases(x):
    check(torch.nonzero, x)


def test_nonzero_syncs_its_input_with_the_count():
    mask = to_dev(uniform(50)) * 2 - 1 > 0
    idx = torch.nonzero(mask)
    assert not unwrap(mask).pending  # computed with the count: the nonzero program does not redo it
    assert unwrap(idx).pending  # the indices are recorded, not computed on the host
    assert torch.equal(idx.cpu(), torch.nonzero(mask.cpu()))


# ---- batch norm below functionalization ----


@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_legit_updates_running_stats(dev, training):
    x, w, b = _r(4, 3, 5, grad=False), _r(3, grad=False), _r(3, grad=False)
    rm, rv = _r(3, grad=False), uniform(3, lo=0.5, hi=2.0)
    lazy = [unwrap(t) for t in to_dev([x, w, b, rm, rv])]
    out = record.dispatch(aten._native_batch_norm_legit.default, (*lazy, training, 0.1, 1e-5), {})
    expected = aten._native_batch_norm_legit.default(x, w, b, rm, rv, training, 0.1, 1e-5)
    assert_same([wrap(o) for o in out[:1]], expected[:1], **TOL)
    if training:
        assert_same([wrap(o) for o in out[1:]], expected[1:], **TOL)
    assert_same([wrap(lazy[3]), wrap(lazy[4])], [rm, rv], **TOL)
