"""Indexing ops against CPU eager: advanced indexing, gather/scatter (rules/indexing.py), embedding
(rules/embedding.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from tests.util import check


def _x(*shape, dtype=torch.float32):
    torch.manual_seed(sum(shape))
    return torch.randn(shape).to(dtype).requires_grad_(dtype.is_floating_point)


def _i(*values):
    return torch.tensor(values)


_MASK = torch.tensor([[True, False, True, True], [False, False, True, False], [True, True, False, False]])


def _setitem(*key, value=None):
    """``x[key] = v``; tensors in ``key`` are the case's inputs after ``x`` (``...``), ``v`` the last."""

    def fn(x, *rest):
        tensors = iter(rest)
        k = tuple(next(tensors) if e is ... else e for e in key)
        x = x.clone()
        x[k] = next(tensors, value)
        return x

    return fn


def _index_put_acc(x, i, v):
    return x.clone().index_put_((i,), v, accumulate=True)


# name -> (fn, inputs); every case also checks the gradient where its inputs require one
CASES = {
    "index_list": (lambda x: x[:, [0, 2]], [_x(3, 4, 5)]),
    "index_tensor": (lambda x, i: x[i], [_x(3, 4, 5), _i(2, 0, 2)]),
    "index_negative": (lambda x: x[[-1, 0]], [_x(3, 4)]),
    "index_2d": (lambda x, i: x[:, i], [_x(3, 4, 5), _i([0, 1], [3, 3])]),
    "index_pair": (lambda x: x[[0, 2], :, [1, 4]], [_x(3, 4, 5)]),
    "index_broadcast": (lambda x, i, j: x[i, j], [_x(3, 4), _i([0], [2]), _i(1, 3, 0)]),
    "index_none_ellipsis": (lambda x, i: x[None, ..., i], [_x(3, 4, 5), _i(4, 0)]),
    "index_slice_mix": (lambda x, i: x[i, 1:3], [_x(3, 4, 5), _i(1, 1)]),
    "mask_read": (lambda x, m: x[m], [_x(3, 4, 5), _MASK]),
    "mask_read_where": (lambda x: x[x > 0.5], [_x(3, 4)]),
    "setitem_tensor": (_setitem(...), [_x(3, 4), _i(0, 2), _x(2, 4)]),
    "setitem_scalar": (_setitem(..., value=2.5), [_x(3, 4), _i(2, 0)]),
    "setitem_pair": (_setitem(..., ...), [_x(3, 4), _i(0, 2), _i(3, 1), _x(2)]),
    "setitem_cols": (_setitem(slice(None), [1, 3]), [_x(3, 4, 5), _x(3, 2, 5)]),
    "setitem_mask_scalar": (_setitem(..., value=0.0), [_x(3, 4), _MASK]),
    "setitem_mask_values": (_setitem(...), [_x(3, 4), _MASK, _x(6)]),
    "setitem_mask_rows": (_setitem(...), [_x(3, 4, 2), _MASK, _x(6, 2)]),
    "setitem_mask_bcast": (_setitem(...), [_x(3, 4, 2), _MASK, _x(2)]),
    "setitem_mask_inner": (_setitem(slice(None), ...), [_x(2, 4), _MASK[0], _x(2, 3)]),
    "index_put_accumulate": (_index_put_acc, [_x(3, 4), _i(0, 2, 0, 1), _x(4, 4)]),
    "index_select": (lambda x, i: x.index_select(1, i), [_x(3, 4, 5), _i(3, 0, 3)]),
    "index_select_neg_dim": (lambda x, i: x.index_select(-1, i), [_x(3, 4, 5), _i(4, 0)]),
    "index_select_0d": (lambda x, i: x.index_select(0, i), [_x(3, 4), torch.tensor(1)]),
    "take": (lambda x, i: x.take(i), [_x(3, 4), _i([0, 11], [5, -1])]),
    "take_along_dim": (lambda x, i: torch.take_along_dim(x, i, 1), [_x(3, 4), _i([0, 3], [1, 1], [2, 0])]),
    "gather": (lambda x, i: x.gather(1, i), [_x(3, 4), _i([0, 3], [1, 1], [2, 0])]),
    "gather_smaller": (lambda x, i: x.gather(0, i), [_x(3, 4, 5), _i([[0, 2]], [[1, 1]])]),
    "gather_0d": (lambda x, i: x.gather(0, i), [_x(), torch.tensor(0)]),
    "scatter_src": (lambda x, i, s: x.scatter(1, i, s), [_x(3, 4), _i([0, 3], [1, 2], [2, 0]), _x(3, 2)]),
    "scatter_src_larger": (lambda x, i, s: x.scatter(0, i, s), [_x(3, 4), _i([2, 0, 1]), _x(4, 5).detach()]),
    "scatter_neg_dim": (lambda x, i, s: x.scatter(-1, i, s), [_x(3, 4), _i([0, 3], [1, 2], [2, 0]), _x(3, 2)]),
    "unsafe_index": (lambda x, i: torch.ops.aten._unsafe_index(x, [None, i]), [_x(3, 4), _i(3, 3, 0)]),
    "unsafe_index_put": (
        lambda x, i, v: torch.ops.aten._unsafe_index_put(x, [i], v, True),
        [_x(3, 4), _i(2, 2), _x(2, 4)],
    ),
    "scatter_value": (lambda x, i: x.scatter(1, i, -2.0), [_x(3, 4), _i([0, 3], [1, 2], [2, 0])]),
    "scatter_add": (lambda x, i, s: x.scatter_add(1, i, s), [_x(3, 4), _i([0, 0, 3], [1, 1, 1], [2, 0, 2]), _x(3, 3)]),
    "scatter_add_": (lambda x, i, s: x.clone().scatter_add_(0, i, s), [_x(3, 4), _i([0, 2, 2, 0]), _x(1, 4)]),
    "scatter_reduce_add": (
        lambda x, i, s: x.scatter(1, i, s, reduce="add"),
        [_x(3, 4).detach(), _i([0, 0], [1, 1], [3, 0]), _x(3, 2).detach()],
    ),
    "scatter_reduce_mul": (
        lambda x, i: x.scatter(1, i, 3.0, reduce="multiply"),
        [_x(3, 4).detach(), _i([0, 0], [1, 1], [3, 0])],
    ),
    "index_add": (lambda x, i, s: x.index_add(0, i, s, alpha=2), [_x(3, 4), _i(0, 2, 0), _x(3, 4)]),
    "index_add_dim1": (lambda x, i, s: x.index_add(1, i, s), [_x(3, 4, 2), _i(3, 3), _x(3, 2, 2)]),
    "index_copy": (lambda x, i, s: x.index_copy(1, i, s), [_x(3, 4), _i(3, 0), _x(3, 2)]),
    "index_fill": (lambda x, i: x.index_fill(1, i, -1.5), [_x(3, 4), _i(3, 0)]),
    "index_fill_tensor": (lambda x, i: x.index_fill(0, i, torch.tensor(7.0)), [_x(3, 4), _i(1)]),
    "masked_scatter": (lambda x, m, s: x.masked_scatter(m, s), [_x(3, 4), _MASK, _x(12)]),
    "masked_scatter_bcast": (lambda x, m, s: x.masked_scatter(m[0], s), [_x(3, 4), _MASK, _x(3, 5)]),
    "put": (lambda x, i, s: x.clone().put_(i, s), [_x(3, 4), _i(0, 11, 5), _x(3)]),
    "put_accumulate": (lambda x, i, s: x.clone().put_(i, s, accumulate=True), [_x(3, 4), _i(1, 1, -1), _x(3)]),
    "embedding": (lambda i, w: F.embedding(i, w), [_i([1, 2, 1], [0, 9, 1]), _x(10, 3)]),
    "embedding_padding": (lambda i, w: F.embedding(i, w, padding_idx=1), [_i([1, 2, 1], [0, 9, 1]), _x(10, 3)]),
    "embedding_freq": (lambda i, w: F.embedding(i, w, scale_grad_by_freq=True), [_i(1, 2, 1, 1, 5), _x(10, 3)]),
}


# A read through a boolean mask (also in the gradient of a masked write) has a data-dependent shape:
# PyTorch's meta kernel refuses it, so index.Tensor runs on the CPU there.
_MASK_READ = pytest.mark.allow_fallback("aten.index.Tensor")


@pytest.mark.parametrize("name", [pytest.param(n, marks=_MASK_READ) if "mask" in n else n for n in CASES])
def test_indexing(name):
    fn, args = CASES[name]
    check(fn, *args, grad=any(a.requires_grad for a in args))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(reduce, include_self, dtype):
    torch.manual_seed(0)
    x = (torch.randn(3, 5) * 10).to(dtype)
    src = (torch.randn(3, 4) * 10).to(dtype)
    index = _i([0, 0, 4, 1], [2, 2, 2, 2], [3, 0, 3, 0])  # duplicates, and columns nobody writes
    check(lambda x, s: x.scatter_reduce(1, index.to(x.device), s, reduce, include_self=include_self), x, src)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    torch.manual_seed(0)
    x, src = torch.randn(5, 3), torch.randn(4, 3)
    check(lambda x, i, s: x.index_reduce(0, i, s, reduce, include_self=include_self), x, _i(0, 4, 0, 2), src)


def test_out_of_range_indices_read_nan_not_neighbours():
    """PyTorch raises on an out-of-range index; with lazyxla.config.check_indices off, lazyxla does not read a
    device index to check it (tests/test_bounds.py), so it reads NaN."""
    dev = lazyxla.device()
    x = torch.arange(5.0).to(dev)
    with lazyxla.config.override(known_values_limit=0):  # values only on the device (not checked for free)
        bad = torch.tensor([1, 9]).to(dev)
    assert torch.index_select(x, 0, bad).cpu()[1].isnan()
    assert torch.gather(x, 0, bad).cpu()[1].isnan()
    assert x[bad].cpu()[1].isnan()
    assert torch.nn.functional.embedding(bad, x.reshape(5, 1)).cpu()[1].isnan().all()
    assert x[torch.tensor([-1]).to(dev)].tolist() == [4.0]  # negative indices still wrap


def _addresses(a: torch.Tensor) -> dict:
    """Where each indexing result of ``a`` starts relative to ``a`` (``data_ptr``), None for an empty result's 0."""
    true, false = (torch.tensor(v, dtype=torch.uint8, device=a.device) for v in (1, 0))
    results = {"True": a[True], "true": a[true], "None": a[None], "...": a[...], "False": a[False], "false": a[false]}
    if a.dim():
        results.update({"1": a[1], "t()[2]": a.t()[2], "[:, 1]": a[:, 1], "view[4:]": a.reshape(-1)[4:]})
    start = a.data_ptr()
    return {k: (r.data_ptr() - start if r.data_ptr() else None) for k, r in results.items()}


@pytest.mark.parametrize("shape", [(2, 3), ()])
def test_indexing_results_are_views_or_copies_as_on_the_cpu(shape):
    """A view's ``data_ptr`` is its base's plus its CPU offset (``a[None]``, ``a[...]``, ``a[1]``); a bool index
    copies into a storage of its own (``a[True]``): PyTorch's test_index_getitem_copy_bools_slices."""
    cpu = torch.randn(shape)
    dev = cpu.to(lazyxla.device())
    assert dev.data_ptr() != 0
    expected, actual = _addresses(cpu), _addresses(dev)
    copies = {"True", "true"}
    views = {k: v for k, v in expected.items() if k not in copies}
    assert {k: v for k, v in actual.items() if k not in copies} == views
    assert all(actual[k] != 0 and expected[k] != 0 for k in copies)  # new storages: other addresses
