"""Index bounds checks (``lazy/bounds.py``): an out-of-range index raises PyTorch's CPU exception, type and
message, at the call, in lazy mode with ``config.check_indices``, in eager mode, and always for an index the host
knows; with the flag off, a device index costs no sync and reads out of range as XLA's fill value."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lazyxla

W = torch.arange(30.0).reshape(10, 3) / 7  # self / weight: 10 rows of 3
ROWS = torch.tensor([1, 11])  # 11: past the 10 rows
COLS = torch.tensor([[0, 3]] * 10)  # 3: past the 3 columns
SRC = torch.ones(10, 2)
TARGETS_2D = torch.tensor([[0] * 5, [1, 1, 1, 1, 3]])  # 3: past the 3 classes


def _zeros(w):
    return torch.zeros_like(w)


# name -> (op(w, index, src), the index tensor): each one raises on the CPU
CASES = {
    "index": (lambda w, i, s: w[i], ROWS),
    "index_negative": (lambda w, i, s: w[i], torch.tensor([1, -11])),
    "index_second_dim": (lambda w, i, s: w[:, i], torch.tensor([0, 3])),
    "index_two_tensors": (lambda w, i, s: w[i, i], torch.tensor([0, 5])),
    "index_put_": (lambda w, i, s: w.clone().index_put_((i,), torch.ones_like(w[:2])), ROWS),
    "index_put_accumulate": (lambda w, i, s: w.clone().index_put_((i,), torch.ones_like(w[:2]), True), ROWS),
    "setitem": (lambda w, i, s: w.clone().__setitem__(i, 1.0), ROWS),
    "index_select": (lambda w, i, s: w.index_select(0, i), ROWS),
    "index_select_negative": (lambda w, i, s: w.index_select(0, i), torch.tensor([-1])),
    "gather": (lambda w, i, s: torch.gather(w, 1, i), COLS),
    "gather_negative": (lambda w, i, s: torch.gather(w, -1, i), -COLS),
    "scatter": (lambda w, i, s: _zeros(w).scatter(1, i, s), COLS),
    "scatter_value": (lambda w, i, s: _zeros(w).scatter(1, i, 2.0), COLS),
    "scatter_": (lambda w, i, s: _zeros(w).scatter_(1, i, 2.0, reduce="add"), COLS),
    "scatter_add": (lambda w, i, s: _zeros(w).scatter_add(1, i, s), COLS),
    "scatter_reduce": (lambda w, i, s: _zeros(w).scatter_reduce(1, i, s, "amax"), COLS),
    "embedding": (lambda w, i, s: F.embedding(i, w), ROWS),
    "embedding_negative": (lambda w, i, s: F.embedding(i, w), torch.tensor([-1])),
    "nll_loss": (lambda w, i, s: F.nll_loss(w[:2].log_softmax(1), i), torch.tensor([1, 12])),
    "nll_loss_negative": (lambda w, i, s: F.nll_loss(w[:2].log_softmax(1), i), torch.tensor([1, -5])),
    "cross_entropy": (lambda w, i, s: F.cross_entropy(w[:2], i), torch.tensor([1, 12])),
    "cross_entropy_ignore_other": (lambda w, i, s: F.cross_entropy(w[:2], i, ignore_index=1), torch.tensor([1, 3])),
    "cross_entropy_none": (lambda w, i, s: F.cross_entropy(w[:2], i, reduction="none"), torch.tensor([0, 3])),
    "cross_entropy_2d": (lambda w, i, s: F.cross_entropy(w.reshape(2, 3, 5), i), TARGETS_2D),
    "take": (lambda w, i, s: torch.take(w, i), torch.tensor([3, 30])),
    "take_negative": (lambda w, i, s: torch.take(w, i), torch.tensor([-31])),
    "index_add": (lambda w, i, s: _zeros(w).index_add(0, i, torch.ones_like(w[:2])), ROWS),
    "index_reduce": (lambda w, i, s: _zeros(w).index_reduce(0, i, torch.ones_like(w[:2]), "amax"), ROWS),
    "index_copy": (lambda w, i, s: _zeros(w).index_copy(0, i, torch.ones_like(w[:2])), ROWS),
    "index_fill": (lambda w, i, s: _zeros(w).index_fill(0, i, 1.0), ROWS),
    "index_fill_negative": (lambda w, i, s: _zeros(w).index_fill(0, i, 1.0), torch.tensor([-11])),
    "put_": (lambda w, i, s: w.clone().put_(i, s[0]), torch.tensor([3, 30])),
    "put_accumulate": (lambda w, i, s: w.clone().put_(i, s[0], accumulate=True), torch.tensor([3, 30])),
    # the mask as the index: 4 True elements, source has 3; a (3,) mask broadcast over 10 rows: 20 of 19
    "masked_scatter": (lambda w, i, s: w.masked_scatter(i, s.reshape(-1)[:3]), (W > 3.5) & (W < 4.2)),
    "masked_scatter_broadcast": (lambda w, i, s: w.masked_scatter(i, s.reshape(-1)[:19]), torch.tensor([1, 0, 1]) > 0),
}

# name -> (op, an index in range, with the negative values and ignored targets PyTorch takes)
IN_RANGE = {
    "index": (CASES["index"][0], torch.tensor([1, -10, 9])),
    "take": (CASES["take"][0], torch.tensor([-30, 29])),
    "index_fill": (CASES["index_fill"][0], torch.tensor([-10, 9])),
    "nll_loss": (CASES["nll_loss"][0], torch.tensor([2, -100])),
    "cross_entropy_ignore": (lambda w, i, s: F.cross_entropy(w[:2], i, ignore_index=7), torch.tensor([7, 0])),
    "gather": (CASES["gather"][0], COLS.clamp(max=2)),
    "scatter_add": (CASES["scatter_add"][0], COLS.clamp(max=2)),
    "embedding": (CASES["embedding"][0], torch.tensor([0, 9])),
    "put_": (CASES["put_"][0], torch.tensor([-30, 29])),
    "masked_scatter_broadcast": (lambda w, i, s: w.masked_scatter(i, s.reshape(-1)), torch.tensor([1, 0, 1]) > 0),
}


def _cpu_error(op, index) -> BaseException:
    with pytest.raises(Exception) as info:
        op(W, index, SRC)
    return info.value


def _on_device(index: torch.Tensor, dev) -> torch.Tensor:
    """``index`` on the device with no copy of its values on the host (computed on the device)."""
    with lazyxla.config.override(known_values_limit=0):
        return index.to(dev)


@pytest.fixture(autouse=True)
def _modes_after():
    yield
    lazyxla.eager_mode(False)


@pytest.mark.parametrize("mode", ["check_indices", "eager"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_device_index_out_of_range_raises_the_cpu_error_at_the_call(dev, name, mode):
    op, index = CASES[name]
    want = _cpu_error(op, index)
    w, i, s = W.to(dev), _on_device(index, dev), SRC.to(dev)
    lazyxla.sync()
    checks = lazyxla.metrics.counters().get("index_checks", 0)
    flags = lazyxla.config.override(check_indices=mode == "check_indices", eager=mode == "eager")
    with flags, pytest.raises(type(want)) as info:
        op(w, i, s)  # (no host read here: raised at the call)
    assert str(info.value) == str(want)
    assert type(info.value) is type(want)
    assert lazyxla.metrics.counters()["index_checks"] == checks + 1  # one read, counted


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_index_the_host_knows_is_checked_without_the_flag_or_a_sync(dev, name):
    # a small integer tensor copied from the CPU: its values are on the host, the check is free
    op, index = CASES[name]
    want = _cpu_error(op, index)
    w, i, s = W.to(dev), index.to(dev), SRC.to(dev)
    lazyxla.sync()
    before = lazyxla.metrics.counters()
    with pytest.raises(type(want)) as info:
        op(w, i, s)
    assert str(info.value) == str(want)
    after = lazyxla.metrics.counters()
    for counter in ("syncs", "compiles", "executions", "index_checks"):
        assert after.get(counter, 0) == before.get(counter, 0), counter


@pytest.mark.parametrize("mode", ["off", "check_indices", "eager"])
@pytest.mark.parametrize("name", sorted(IN_RANGE))
def test_indices_in_range_give_the_cpu_results(dev, name, mode):
    op, index = IN_RANGE[name]
    want = op(W, index, SRC)
    with lazyxla.config.override(check_indices=mode == "check_indices", eager=mode == "eager"):
        got = op(W.to(dev), _on_device(index, dev), SRC.to(dev))
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("name", ["index", "gather", "embedding", "cross_entropy", "scatter_add"])
def test_with_the_flag_off_a_device_index_is_not_read(dev, name):
    # no sync, no program at the call: the op is recorded as any other
    op, index = CASES[name]
    w, i, s = W.to(dev), _on_device(index, dev), SRC.to(dev)
    lazyxla.sync()
    before = lazyxla.metrics.counters()
    out = op(w, i, s)
    after = lazyxla.metrics.counters()
    for counter in ("syncs", "compiles", "executions", "index_checks"):
        assert after.get(counter, 0) == before.get(counter, 0), counter
    out.cpu()  # runs: no error at the sync either


def test_with_the_flag_off_out_of_range_reads_give_the_fill_value_and_writes_are_dropped(dev):
    # docs/ops.md: XLA's gather fills (NaN for floats, the lowest value for signed integers); its scatter drops
    rows = _on_device(ROWS, dev)
    read = W.to(dev)[rows].cpu().numpy()
    np.testing.assert_array_equal(read[0], W[1].numpy())
    assert np.isnan(read[1]).all()
    ints = (W * 7).long()
    got = ints.to(dev)[rows].cpu()
    assert got[0].tolist() == ints[1].tolist()
    assert got[1].tolist() == [torch.iinfo(torch.int64).min] * 3
    added = torch.zeros(10, 3, device=dev).index_add(0, rows, torch.ones(2, 3, device=dev)).cpu()
    want = torch.zeros(10, 3)
    want[1] = 1
    torch.testing.assert_close(added, want)


def test_a_check_in_a_lazy_step_computes_the_index_and_the_step_stays_one_program(dev):
    # the check reads the index's min and max: the work the index depends on is computed with that read,
    # and the rest of the step still syncs as one program, with the same numbers as without the check
    def step(x, w, check: bool):
        with lazyxla.config.override(check_indices=check):
            ids = (x.sum(1) % 10).long()
            out = F.embedding(ids, w).sum() * 2
            return out.item()

    x, w = torch.randn(4, 5), torch.randn(10, 3)
    want = F.embedding((x.sum(1) % 10).long(), w).sum().item() * 2
    for check in (False, True):
        before = lazyxla.metrics.counters()
        got = step(x.to(dev), w.to(dev), check)
        after = lazyxla.metrics.counters()
        assert got == pytest.approx(want, rel=1e-6)
        assert after["index_checks"] - before.get("index_checks", 0) == int(check)
        assert after["syncs"] - before["syncs"] == 1 + int(check)


def test_inside_a_compile_region_only_host_known_indices_are_checked(dev):
    # the region promises one program: a device index is not read there (no CompileRegionError), a known one is
    w, i = W.to(dev), _on_device(ROWS, dev)
    with lazyxla.config.override(check_indices=True):
        with lazyxla.compile(full_graph=True):
            out = w[i]
        assert np.isnan(out.cpu().numpy()[1]).all()
        known = ROWS.to(dev)
        bad = "index 11 is out of bounds for dimension 0 with size 10"
        with pytest.raises(IndexError, match=bad), lazyxla.compile(full_graph=True):
            w[known]


def test_the_flag_parses_from_the_environment(monkeypatch):
    from lazyxla.config import _Config

    monkeypatch.setenv("LAZYXLA_CHECK_INDICES", "1")
    assert _Config().check_indices is True
    monkeypatch.setenv("LAZYXLA_CHECK_INDICES", "0")
    assert _Config().check_indices is False
    monkeypatch.delenv("LAZYXLA_CHECK_INDICES")
    assert _Config().check_indices is False


def test_the_error_is_raised_at_the_users_line(dev):
    import inspect

    ids = _on_device(torch.tensor([3, 10]), dev)
    weight = torch.randn(10, 4).to(dev)
    lazyxla.config.check_indices = True
    try:
        line = inspect.currentframe().f_lineno + 2
        with pytest.raises(IndexError, match="index out of range in self") as info:
            F.embedding(ids, weight)
    finally:
        lazyxla.config.check_indices = False
    assert any(str(e.path) == __file__ and e.lineno + 1 == line for e in info.traceback)
