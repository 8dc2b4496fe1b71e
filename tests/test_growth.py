"""A loop that never syncs warns, once, when its pending graph reaches config.warn_graph_nodes nodes; a loop that
syncs (lazyxla.sync(), a DeviceLoader, host reads) never does, nor does work that is recorded and dropped."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.lazy import growth
from tests.models import GPT

# a GPT step of tests.models records ~230 ops (its AdamW one node per foreach call): a threshold of 2 steps' worth,
# and 8 steps of training
LIMIT = 500
STEPS = 8


def _growth_warnings(fn) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [w for w in caught if "pending graph" in str(w.message)]


def _train(dev, sync_each_step: bool, loader: bool = False, read_loss: bool = False) -> list[float]:
    torch.manual_seed(0)
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 64, (2, 16), generator=g) for _ in range(STEPS)]
    losses = []
    source = lazyxla.DeviceLoader(batches, dev) if loader else (b.to(dev) for b in batches)
    for x in source:
        loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sync_each_step:
            lazyxla.sync()
        losses.append(loss.item() if read_loss else loss)
    return [float(v) for v in losses]


@pytest.mark.parametrize(
    "how",
    [dict(sync_each_step=True), dict(sync_each_step=False, loader=True), dict(sync_each_step=False, read_loss=True)],
    ids=["sync", "device_loader", "item"],
)
def test_a_training_loop_that_syncs_never_warns(dev, how):
    with lazyxla.config.override(warn_graph_nodes=LIMIT):
        assert _growth_warnings(lambda: _train(dev, **how)) == []
    assert lazyxla.metrics.counters()["ops_recorded"] > 3 * LIMIT  # the loop recorded well past the threshold


def test_a_training_loop_that_never_syncs_warns_once_at_the_users_line(dev):
    losses = []
    with lazyxla.config.override(warn_graph_nodes=LIMIT):
        caught = _growth_warnings(lambda: losses.extend(_train(dev, sync_each_step=False)))
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    for advice in ("lazyxla.sync()", "xm.mark_step()", "DeviceLoader", "warn_graph_nodes"):
        assert advice in message, message
    assert caught[0].filename == __file__  # the user's line (here, _train's), not lazyxla's
    size = int(message.split("has reached ")[1].split(" ")[0])
    assert LIMIT <= size <= LIMIT * 9 // 8 + 1
    # the results are those of the loop that syncs (the warning changes nothing)
    assert losses == pytest.approx(_train(dev, sync_each_step=True), rel=1e-5)


def test_pending_nodes_counts_the_pending_graph(dev):
    x = torch.ones(4, device=dev)
    lazyxla.sync()
    assert growth.pending_nodes() == 0
    y = x
    for _ in range(50):
        y = y * 2 + 1
    shared = y.sin()
    z = (shared + shared.cos(), shared * 3)  # a node two tensors need counts once
    assert growth.pending_nodes() == 100 + 1 + 2 + 1
    del z
    assert growth.pending_nodes() == 101  # y and shared: dropped tensors' work is not pending
    lazyxla.sync()
    assert growth.pending_nodes() == 0


def test_a_transpose_of_computed_data_is_not_pending_work(dev):
    # a sync leaves such a view pending (lazy/rebase.py): it is no work the graph holds, so it must not count
    w = torch.randn(4, 3, device=dev)
    lazyxla.sync()
    views = (w.t(), w.reshape(12), w.unsqueeze(0))
    lazyxla.sync()
    assert growth.pending_nodes() == 0
    y = views[0] * 2
    assert growth.pending_nodes() == 2  # y's multiply and the transpose it reads
    del y, views


def test_work_recorded_and_dropped_does_not_warn(dev):
    # as many ops as a loop that never syncs, but no graph keeps growing: nothing to warn about
    w = torch.ones(16, device=dev)

    def loop():
        for _ in range(2 * LIMIT):
            (w * 2).sum()

    with lazyxla.config.override(warn_graph_nodes=LIMIT):
        assert _growth_warnings(loop) == []


def _chain(dev, n: int) -> None:
    y = torch.ones(4, device=dev)
    for _ in range(n):
        y = y + 1
    lazyxla.sync()


def test_zero_turns_the_warning_off_and_a_counter_reset_keeps_counting(dev):
    with lazyxla.config.override(warn_graph_nodes=0):
        assert _growth_warnings(lambda: _chain(dev, 2 * LIMIT)) == []
    # ops_recorded restarts at 0 on a reset: the check follows it, so a long count before does not delay it
    with lazyxla.config.override(warn_graph_nodes=LIMIT):
        for _ in range(6):
            _chain(dev, LIMIT // 2)  # synced: no warning, and ops_recorded well past the next check's count
        lazyxla.metrics.reset()
        assert len(_growth_warnings(lambda: _chain(dev, 2 * LIMIT))) == 1


def test_the_check_costs_one_comparison_per_op(dev, monkeypatch):
    # the pending graph is walked about once per threshold's worth of ops (less what is pending), not per op
    walks = []
    real = growth.pending_nodes
    monkeypatch.setattr(growth, "pending_nodes", lambda: walks.append(1) or real())
    with lazyxla.config.override(warn_graph_nodes=LIMIT):
        _train(dev, sync_each_step=True)
    recorded = lazyxla.metrics.counters()["ops_recorded"]
    assert 1 <= len(walks) <= recorded // (LIMIT // 2) + 1, (len(walks), recorded)
