"""Quiet replays of a captured step (lazy/capture.py ``_Entry._reused``): when nothing but fresh uploads happened
since the last replay, a parameter's or optimizer state's node takes the new buffer in place, without the
functionalization calls. Everything a user may do between two steps must still see what lazy mode shows:
views read between steps or after several steps, ``.data`` assignments, host reads of small integer buffers,
state entries swapped or replaced, aliases held across steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazyxla
from lazyxla.ir import ComputeError
from tests.util import captured_step


class _Net(nn.Module):
    """Embedding, batch norm (its int64 step counter is a buffer changed in place), a linear head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(13, 8)
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 13)

    def forward(self, ids):
        return self.head(self.bn(self.emb(ids)))


def _batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randint(0, 13, (16,), generator=g), torch.randint(0, 13, (16,), generator=g)


def _run(dev, captured: bool, between, steps: int = 10, opt_kind: str = "adamw"):
    """``steps`` steps, a new batch each (moved to the device before the call, as a loader does);
    ``between(i, model, opt, seen)`` runs after step i and may append observations to ``seen``."""
    torch.manual_seed(0)
    model = _Net().to(dev)
    if opt_kind == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, capturable=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    step = captured_step(lambda ids, target: F.cross_entropy(model(ids), target), opt, captured)
    seen: list = []
    lazyxla.metrics.reset()
    for i in range(steps):
        ids, target = (t.to(dev) for t in _batch(i))
        seen.append(step(ids, target).item())
        between(i, model, opt, seen)
    seen.append({k: v.cpu() for k, v in model.state_dict().items()})
    return seen, lazyxla.metrics.counters().get("capture_replays", 0)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, dict):
            for k in x:
                torch.testing.assert_close(x[k], y[k], rtol=0, atol=0, msg=k)
        elif isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        else:
            assert x == y


def _check(dev, between, min_replays: int, **kw):
    lazy, _ = _run(dev, False, between, **kw)
    replayed, replays = _run(dev, True, between, **kw)
    assert replays >= min_replays, replays
    _same(lazy, replayed)


def test_quiet_replays_with_a_new_batch_each_step_equal_lazy_mode(dev):
    """The loader idiom: a new batch moved to the device before each call keeps the replays quiet (7 of 10)."""
    _check(dev, lambda *a: None, min_replays=7)


@pytest.mark.parametrize("opt_kind", ["adamw", "sgd"])
def test_a_view_read_now_and_then_sees_every_update(dev, opt_kind):
    """A view of a parameter made once, read after some steps: quiet replays in between (nothing read it)
    must not leave it stale."""
    views = {}

    def between(i, model, opt, seen):
        if i == 3:
            views["w"] = model.head.weight.t()
            seen.append(views["w"].cpu())  # read: this view is regenerated, the next replay is not quiet
        if i in (4, 7, 9):  # after one, several, and the last quiet replays
            seen.append(views["w"].cpu())
            seen.append(views["w"].sum().item())

    _check(dev, between, min_replays=5, opt_kind=opt_kind)


def test_a_parameter_data_swap_between_steps(dev):
    """``p.data = other`` with a tensor made before the last step: no tensor is made in between, yet the
    next step must read ``other`` and update the parameter, not its old value."""
    spare = {}

    def between(i, model, opt, seen):
        if i == 2:
            spare["t"] = torch.full_like(model.head.bias, 0.5)
        if i == 5:
            model.head.bias.data = spare["t"]
        if i >= 5:
            seen.append(model.head.bias.cpu())
            seen.append(spare["t"].cpu())  # the tensor whose storage the parameter now shares

    _check(dev, between, min_replays=3)


def test_host_reads_of_an_integer_buffer_changed_in_place(dev):
    """BatchNorm's ``num_batches_tracked`` (int64, 0-d) is incremented in place each step; reading it on the
    host between steps must give each step's count, never a CPU copy of an earlier one."""

    def between(i, model, opt, seen):
        seen.append(int(model.bn.num_batches_tracked.item()))
        seen.append(model.bn.num_batches_tracked.tolist())
        assert seen[-1] == i + 1

    _check(dev, between, min_replays=5)


def test_optimizer_state_entries_swapped_between_steps(dev):
    """Two parameters' state tensors swapped (no tensor made): each is read from its new place."""

    def between(i, model, opt, seen):
        if i == 6:
            a, b = opt.state[model.bn.weight], opt.state[model.bn.bias]  # (same shapes)
            a["exp_avg"], b["exp_avg"] = b["exp_avg"], a["exp_avg"]

    _check(dev, between, min_replays=4)


def test_an_alias_held_across_steps(dev):
    """``detach()`` shares the parameter's storage: held across quiet replays, it shows each update (as in
    eager PyTorch), and reading it does not break the next replays' numbers."""
    held = {}

    def between(i, model, opt, seen):
        if i == 1:
            held["a"] = model.head.weight.detach()
        if i >= 1:
            seen.append(held["a"].cpu())
        if i == 8:
            eager = model.head.weight.cpu()
            torch.testing.assert_close(held["a"].cpu(), eager, rtol=0, atol=0)

    _check(dev, between, min_replays=3)


def test_a_result_kept_from_an_earlier_step_keeps_its_value(dev):
    """The loss of step 2, held by the user, is not overwritten by later replays."""
    held = {}

    def between(i, model, opt, seen):
        if i == 2:
            held["s"] = model.head.weight.sum()  # pending: a value of this step's parameters
            held["c"] = model.head.weight.clone()
        if i > 2:
            seen.append(held["s"].item())
            seen.append(held["c"].cpu())

    _check(dev, between, min_replays=3)


def test_quiet_replays_skip_functionalization_updates(dev, monkeypatch):
    """The point of a quiet replay: no per-tensor functionalization call (each costs ~5 us of host time)."""
    from lazyxla.lazy import capture

    calls = []
    real = capture._replace
    monkeypatch.setattr(capture, "_replace", lambda t, lt: (calls.append(1), real(t, lt)))
    per_step = []
    _, replays = _run(dev, True, lambda i, *a: per_step.append(len(calls)), steps=9)
    assert replays >= 5
    new_calls = [b - a for a, b in zip(per_step, per_step[1:])]
    # the first replay after recording puts each of the 23 results through functionalization (5 parameters,
    # 3 batch norm buffers, 15 AdamW state tensors); the quiet ones after it none
    assert 23 in new_calls, new_calls
    assert new_calls[-4:] == [0, 0, 0, 0], new_calls


def _functional_calls(monkeypatch):
    """Count ``_put``'s functionalization updates (a quiet replay makes none)."""
    from lazyxla.lazy import capture

    calls = []
    real = capture._replace
    monkeypatch.setattr(capture, "_replace", lambda t, lt: (calls.append(1), real(t, lt)))
    return calls


def test_unrelated_work_between_steps_keeps_replays_quiet(dev, monkeypatch):
    """A loss accumulator (HF Trainer's ``tr_loss += loss``) and other lazy work between steps touch none of
    the tensors a replay changes in place: the replays stay quiet (no functionalization update), and the numbers
    are lazy mode's."""
    acc = {}

    def between(i, model, opt, seen):
        if i == 0:  # (each run its own sum)
            acc["sum"] = torch.zeros((), device=dev)
        acc["sum"] += torch.tensor(seen[-1], device=dev)  # recorded, pending until the next step's sync
        z = torch.ones(3, device=dev) * (i + 1)
        if i % 3 == 2:
            seen.append(z.sum().item())
            seen.append(acc["sum"].item())

    _check(dev, between, min_replays=7)
    calls = _functional_calls(monkeypatch)
    per_step = []
    _run(dev, True, lambda i, *a: (between(i, *a), per_step.append(len(calls))))
    new_calls = [b - a for a, b in zip(per_step, per_step[1:])]
    assert new_calls[-4:] == [0, 0, 0, 0], new_calls


def test_a_compiled_forward_between_steps_reads_the_parameters_it_was_called_with(dev):
    """``torch.compile(model, backend="lazyxla")`` called between two steps reads the parameters' buffers
    without an op on them; its pending result, read after the next step, is the one before that step's update."""
    held = {}

    def between(i, model, opt, seen):
        if i == 0:  # (each run its own model)
            held.clear()
            held["f"] = torch.compile(model, backend="lazyxla")
        if "out" in held:
            seen.append(held.pop("out").cpu())
        if i in (2, 5, 6):
            with torch.no_grad():
                held["out"] = held["f"](_batch(50 + i)[0].to(dev))

    # pending work that reads the buffers the next replay takes over runs first: the replay still happens
    _check(dev, between, min_replays=7)


def test_long_work_between_steps_disarms_the_watch(dev):
    """An evaluation loop between two steps (more than ``WATCH_OPS`` ops) does not pay the watch's argument scan
    for long: the watch gives up, and the next replay takes the full path, with lazy mode's numbers."""
    from lazyxla.lazy import session as session_module
    from lazyxla.lazy.session import session

    states = []

    def between(i, model, opt, seen):
        if i == 6:
            armed = bool(session.watched)
            x = torch.ones(4, device=dev)
            for _ in range(session_module.WATCH_OPS + 10):
                x = x * 1.0001
            states.append((armed, bool(session.watched)))
            seen.append(x.sum().item())

    _check(dev, between, min_replays=6)
    assert states == [(False, False), (True, False)]  # lazy mode: never armed; captured: armed, then gave up


@pytest.mark.parametrize("took_buffers", [False, True])
def test_a_replay_whose_program_fails(dev, monkeypatch, took_buffers):
    """The program fails while a quiet replay runs it. Before it took its donated buffers: the error reaches the
    caller and every parameter keeps its value (the next call records and trains on). After: the parameters it
    took raise ``ProgramFailedError`` when read, saying what happened, and nothing else is touched."""
    from lazyxla.lazy import graph

    torch.manual_seed(0)
    model = _Net().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, capturable=True)
    step = captured_step(lambda ids, target: F.cross_entropy(model(ids), target), opt, True)
    for i in range(6):
        step(*(t.to(dev) for t in _batch(i))).item()
    assert step.capture_status == "replaying"
    before = {k: v.cpu() for k, v in model.state_dict().items()}

    def failing(compiled, args, roots):
        if took_buffers:  # as XLA does with the buffers it was given to donate
            donated = set(compiled.donated)  # (leaf positions; argument k is leaf layout.data[k])
            for k, i in enumerate(compiled.layout.data):
                if i in donated:
                    args[k].delete()
        raise RuntimeError("deliberately failing program")

    real = graph.launch
    monkeypatch.setattr(graph, "launch", failing)
    with pytest.raises(RuntimeError, match="deliberately failing program"):
        step(*(t.to(dev) for t in _batch(6)))
    monkeypatch.setattr(graph, "launch", real)
    if not took_buffers:
        for k, v in model.state_dict().items():
            torch.testing.assert_close(v.cpu(), before[k], rtol=0, atol=0, msg=k)
        assert step(*(t.to(dev) for t in _batch(7))).item() > 0
    else:
        with pytest.raises(ComputeError, match="captured step's program failed while running .*deliberately"):
            model.head.weight.cpu()
        lazyxla.sync(wait=True)  # waiting for the device skips the buffers the failed program took


def test_a_location_emptied_between_steps_records_and_raises_the_users_error(dev):
    """A tensor attribute the step updates in place, set to None between two quiet replays: the replay finds no
    tensor there and records the call, so the step's own code raises its own error (as in lazy mode)."""
    torch.manual_seed(0)
    model = _Net().to(dev)
    model.seen = torch.zeros((), device=dev)  # a plain tensor attribute, not a buffer
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def loss_of(ids, target):
        model.seen += 1
        return F.cross_entropy(model(ids), target)

    step = captured_step(loss_of, opt, True)
    for i in range(6):
        step(*(t.to(dev) for t in _batch(i))).item()
    assert step.capture_status == "replaying"  # (no read of model.seen here: the next replay stays quiet)
    model.seen = None
    with pytest.raises(TypeError, match="NoneType"):  # the user's ``None += 1``, not an error of lazyxla's
        step(*(t.to(dev) for t in _batch(6)))


def test_the_loss_read_after_a_replay_walks_no_live_tensors(dev, monkeypatch):
    """A replay leaves only device data: the loss's ``.item()`` after it has no left-over work to look for, so it
    skips its walk over every live tensor (``graph.made_only_data``); work pending before a step still computes
    (the accumulator's sums are lazy mode's)."""
    from lazyxla.lazy import graph

    walks = []
    real = graph.live_tensors
    monkeypatch.setattr(graph, "live_tensors", lambda: (walks.append(1), real())[1])
    per_step = []
    _, replays = _run(dev, True, lambda i, *a: per_step.append(len(walks)), steps=8)
    assert replays >= 4
    new_walks = [b - a for a, b in zip(per_step, per_step[1:])]
    assert new_walks[-3:] == [0, 0, 0], new_walks
    acc = {}

    def between(i, model, opt, seen):
        if i == 0:
            acc["sum"] = torch.zeros((), device=dev)
        acc["sum"] += torch.tensor(seen[-1], device=dev)
        seen.append(acc["sum"].item())

    _check(dev, between, min_replays=6)
