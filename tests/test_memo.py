"""Memo tables (``lazyxla.util.Memo``) and the fast path's input order.

Every memo table of the recorder and lowering is a ``Memo``: bounded (the oldest entries leave first), registered
so ``reset_all`` empties it, and read as a plain dict. The fast path (``meta._signature``) lists a call's inputs in
exactly ``meta._flatten``'s order, which the program the first call of a signature recorded relies on: inputs taken
in the caller's keyword order once swapped addmm's ``beta`` and ``alpha``.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import lazyxla
from lazyxla.ir import Leaf
from lazyxla.lazy import meta
from lazyxla.lazy.tensor import unwrap
from lazyxla.util import Memo, memos, reset_all

aten = torch.ops.aten


# ---- the helper ----


def test_a_memo_keeps_at_most_its_limit_and_the_newest_entries():
    memo = Memo("tests.test_memo.limit", limit=8)
    for i in range(100):
        assert memo.remember(i, i * i) == i * i
        assert len(memo) <= 8
    kept = list(memo.table)
    assert kept == sorted(kept) and kept[-1] == 99  # oldest by insertion left, the newest stayed
    assert all(memo.table[k] == k * k for k in kept)


def test_a_full_memo_drops_its_oldest_quarter_by_insertion_not_by_use():
    memo = Memo("tests.test_memo.order", limit=8)
    for i in range(8):
        memo.remember(i)
    assert memo.table.get(0)  # a lookup does not make an entry younger
    memo.remember("new")
    assert list(memo.table) == [2, 3, 4, 5, 6, 7, "new"]


def test_a_memo_of_one_entry_keeps_the_last():
    memo = Memo("tests.test_memo.one", limit=1)
    memo.remember("a", 1)
    memo.remember("b", 2)
    assert memo.table == {"b": 2}


@pytest.mark.parametrize("limit", [0, -3, 2.5, None])
def test_a_memo_without_a_positive_int_limit_is_refused(limit):
    with pytest.raises(ValueError, match="limit must be a positive int"):
        Memo("tests.test_memo.bad", limit=limit)


def test_reset_all_empties_every_registered_memo():
    mine = Memo("tests.test_memo.reset", limit=10)
    mine.remember("k")
    table = mine.table
    dropped = reset_all()
    assert dropped >= 1
    assert all(len(m) == 0 for m in memos().values())
    assert mine.table is table  # modules holding the table keep the same (now empty) dict


# Every module that keeps a memo table: each must register it (a table of its own would escape reset_all and its
# limit).
_CONVERTED = {
    "lazyxla.ir._bases",
    "lazyxla.device.meshes._layout_keys",
    "lazyxla.lowering.cache._equivalent_layouts",
    "lazyxla.lazy.meta._meta_cache",
    "lazyxla.lazy.meta._checked",
    "lazyxla.lazy.meta._fast",
    "lazyxla.lazy.meta._scalars",
    "lazyxla.lazy.known._FOLDABLE",
    "lazyxla.lazy.known._results",
    "lazyxla.lazy.record._routes",
    "lazyxla.lazy.check._out_checked",
    "lazyxla.lazy.tensor._view_copies",
    "lazyxla.lazy.special._host_copies",
    "lazyxla.frontend.kernels._dtype_errors",
    "lazyxla.frontend.kernels._scalar_overloads",
    "lazyxla.frontend.layout._layouts",
    "lazyxla.frontend.layout._verdicts",
    "lazyxla.frontend.layout._ops",
    "lazyxla.frontend.layout._reshapes",
    "lazyxla.frontend.layout._reshaped",
    "lazyxla.frontend.layout._resized",
    "lazyxla.frontend.layout._kept",
}


def test_every_memo_table_is_a_registered_bounded_memo():
    registered = memos()
    missing = _CONVERTED - set(registered)
    assert not missing, f"memo tables not registered: {sorted(missing)}"
    for name in _CONVERTED:
        module, _, attribute = name.rpartition(".")
        held = getattr(importlib.import_module(module), attribute)
        assert held is registered[name], name  # the module reads the registered memo, not a table of its own
        assert 1 <= held.limit <= 100_000, name


def test_after_reset_all_ops_record_again_and_match_the_cpu(dev):
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    want = torch.addmm(torch.ones(4, 3), a, b, beta=0.5, alpha=2.5).relu()

    def run():
        return torch.addmm(torch.ones(4, 3, device=dev), a.to(dev), b.to(dev), beta=0.5, alpha=2.5).relu().cpu()

    torch.testing.assert_close(run(), want)
    assert len(meta._fast) > 0 and len(meta._meta_cache) > 0  # the call filled the recorder's memos
    reset_all()
    assert len(meta._fast) == 0 and len(meta._meta_cache) == 0
    torch.testing.assert_close(run(), want)  # recorded the long way again
    torch.testing.assert_close(run(), want)  # and on the fast path


def test_the_meta_cache_stays_within_its_limit_while_shapes_keep_changing(dev, monkeypatch):
    monkeypatch.setattr(meta._meta_cache, "limit", 8)
    monkeypatch.setattr(meta._fast, "limit", 8)
    for n in range(1, 40):
        x = torch.arange(n, dtype=torch.float32)
        torch.testing.assert_close((x.to(dev) * 3 + 1).cpu(), x * 3 + 1)
        assert len(meta._meta_cache) <= 8 and len(meta._fast) <= 8


# ---- the fast path's inputs in _flatten's order ----


def _t(*shape):
    return torch.randn(*shape)


# (op, positional arguments, keyword arguments): CPU tensors, moved to the device for the check. Each has two or
# more graph inputs, Python numbers among them; keyword arguments come out of sorted order where there are several.
_CALLS = [
    (aten.addmm.default, (_t(3, 2), _t(3, 4), _t(4, 2)), {"beta": 0.5, "alpha": 2.5}),
    (aten.baddbmm.default, (_t(2, 3, 2), _t(2, 3, 4), _t(2, 4, 2)), {"beta": 0.25, "alpha": -3.5}),
    (aten.addmv.default, (_t(3), _t(3, 4), _t(4)), {"beta": 1.5, "alpha": 0.75}),
    (aten.add.Tensor, (_t(3), _t(3)), {"alpha": 3.5}),
    (aten.add.Tensor, (_t(3), 7), {"alpha": 2}),
    (aten.sub.Tensor, (_t(3), 2.5), {"alpha": -1.5}),
    (aten.addcmul.default, (_t(3), _t(3), _t(3)), {"value": 0.25}),
    (aten.addcdiv.default, (_t(3), _t(3), _t(3).abs() + 1), {"value": -2.5}),
    (aten.lerp.Scalar, (_t(3), _t(3), 0.3), {}),
    (aten.clamp.default, (_t(5), -0.5, 0.75), {}),
    (aten.hardtanh.default, (_t(5), -0.4, 0.6), {}),
    (aten.threshold.default, (_t(5), 0.3, 7.5), {}),
    (aten.where.ScalarSelf, (_t(4) > 0, 2.5, _t(4)), {}),
    (aten.masked_fill.Scalar, (_t(4), _t(4) > 0, 3.5), {}),
    (aten.rsub.Scalar, (_t(3), 4.5), {"alpha": 1.25}),
    (aten.div.Scalar_mode, (_t(3), 2.5), {"rounding_mode": "floor"}),
    (aten.leaky_relu.default, (_t(4), 0.125), {}),
    (aten.elu.default, (_t(4), 1.5, 2.5, 0.5), {}),
]


def _moved(x, dev):
    return x.to(dev) if isinstance(x, torch.Tensor) else x


def _described(value) -> tuple:
    """An input as the recorder holds it: a tensor's value (its node, by identity) or a Python number's value."""
    n, i = value
    if n.op is Leaf.SCALAR:
        return ("number", type(n.payload), n.payload)
    return ("tensor", id(n), i)


@pytest.mark.parametrize("func, args, kwargs", _CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(_CALLS)])
def test_the_fast_path_lists_inputs_in_flattens_order(func, args, kwargs, dev):
    dev_args = tuple(_moved(a, dev) for a in args)
    lazy_args = tuple(unwrap(a) if isinstance(a, torch.Tensor) else a for a in dev_args)
    found = meta._signature(func, lazy_args, kwargs, *meta.scalar_args(func))
    assert found is not None, "the call should take the fast path, else this compares nothing"
    _, flat = meta._flatten(func, lazy_args, kwargs, place=False)
    assert [_described(v) for v in found[1]] == [_described(v) for v in flat.inputs]
    assert sum(_described(v)[0] == "number" for v in flat.inputs) >= 1, "a Python number should be a graph input"
    # the reference: the CPU's result, from the call recorded the long way and from the fast path
    want = func(*args, **kwargs)
    for _ in range(2):
        torch.testing.assert_close(func(*dev_args, **kwargs).cpu(), want)
    lazyxla.sync()
