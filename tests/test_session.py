"""The lazy runtime's state (lazy/session.py): one session object, one rebinding path, and the thread policy.

A DeviceLoader uploads batches on a thread of its own while the main thread records and replays captured steps;
the counters both threads change must never lose a count, and settings scoped to a block must not leak into the
other thread. The thread tests force thread switches (``sys.setswitchinterval`` at a microsecond) so that what a
loaded machine does rarely happens here at every few bytecodes; their assertions hold however the threads
interleave.
"""

from __future__ import annotations

import math
import sys
import threading

import pytest
import torch
from torch import nn

import lazyxla
from lazyxla.config import config
from lazyxla.ir import Leaf, leaf
from lazyxla.lazy import capture, meta
from lazyxla.lazy.session import WATCH_OPS, session
from lazyxla.lazy.special import upload
from lazyxla.lazy.tensor import LazyTensor, retarget, set_value, unwrap
from lazyxla.observe import metrics


@pytest.fixture
def switching():
    """Thread switches at (nearly) every point the interpreter allows one."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _uploading(dev, stop: threading.Event) -> threading.Thread:
    """A thread uploading batches until ``stop`` is set, as a DeviceLoader's does (``special.upload``)."""

    def run():
        batch = torch.randn(4, 8)
        while not stop.is_set():
            upload(batch, dev)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _paused_upload(dev, paused: threading.Event, resume: threading.Event) -> threading.Thread:
    """A thread doing one upload that stops where it makes its LazyTensor (the entry of ``LazyTensor.__new__``)
    until ``resume`` is set: the thread switch a loaded machine makes there now and then, forced."""

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "__new__" and frame.f_code.co_filename.endswith("tensor.py"):
            paused.set()
            resume.wait(timeout=60)
        return None

    def run():
        sys.settrace(tracer)
        try:
            upload(torch.randn(4, 8), dev)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_upload_on_another_thread_never_hides_a_recorded_tensor(dev):
    """A LazyTensor the main thread makes from an existing value changes the count a replay compares
    (``capture._made``), even while a loader thread is halfway through an upload. (Counted as made minus fresh, two
    counters bumped apart, an upload stopped between the two hid a recorded tensor: the next replay took its quiet
    path and skipped the scan for new holders of the buffers it takes over.)"""
    base = torch.ones(3, device=dev)
    lazyxla.sync()
    lt = unwrap(base)
    for _ in range(3):
        paused, resume = threading.Event(), threading.Event()
        before = capture._made()
        thread = _paused_upload(dev, paused, resume)
        try:
            assert paused.wait(timeout=60)
            LazyTensor(lt._value, lt._aval)  # a new holder of base's buffer, made on this thread
            after = capture._made()
        finally:
            resume.set()
            thread.join(timeout=60)
        assert not thread.is_alive()
        assert after != before
        assert capture._made() == after  # and the upload, once done, did not count


def _train(dev, steps: int, captured: bool, loader: bool):
    """A small model trained ``steps`` steps (loss accumulated between steps, an EMA of the weights every 7th
    step), with or without capture, with or without an uploading thread; the losses, the EMA, the weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    xs, ys = torch.randn(steps, 4, 8), torch.randn(steps, 4, 1)

    def step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    step = lazyxla.compile(step, capture=True) if captured else step
    stop = threading.Event()
    thread = _uploading(dev, stop) if loader else None
    total = torch.zeros((), device=dev)
    ema = [p.detach().clone() for p in model.parameters()]
    try:
        for i in range(steps):
            loss = step(xs[i].to(dev), ys[i].to(dev))
            total = total + loss.detach()  # recorded between steps: the next replay runs it first
            if i % 7 == 0:  # reads the weights the next replay takes over: a new holder of their buffers
                with torch.no_grad():
                    for e, p in zip(ema, model.parameters()):
                        e.mul_(0.9).add_(p, alpha=0.1)
            if not captured:
                lazyxla.sync()
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=60)
    return total.item(), [e.cpu() for e in ema], [p.detach().cpu() for p in model.parameters()]


def test_a_captured_step_replayed_beside_an_uploading_thread_equals_lazy_mode(dev, switching):
    replays = metrics.count("capture_replays")
    want = _train(dev, 2000, captured=False, loader=False)
    got = _train(dev, 2000, captured=True, loader=True)
    assert metrics.count("capture_replays") - replays >= 1990
    assert math.isfinite(want[0]) and got[0] == pytest.approx(want[0], rel=1e-5)
    for a, b in zip(got[1] + got[2], want[1] + want[2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _in_thread(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(timeout=60)
    return out[0]


def test_eager_modes_timer_prefix_stays_in_its_thread():
    """Eager mode times its programs as ``eager_*``; a loader thread's transfers meanwhile are not eager work."""

    def time_it():
        with metrics.timer("session_probe"):
            pass

    with metrics.timer_prefix("eager_"):
        _in_thread(time_it)
    timers = metrics.timers()
    assert "session_probe" in timers and "eager_session_probe" not in timers


def test_scoped_flags_hold_in_their_thread_only():
    assert not config.strict
    with config.scoped(strict=True, known_values_limit=0):
        assert config.strict and config.known_values_limit == 0
        assert _in_thread(lambda: (config.strict, config.known_values_limit)) == (
            False,
            config._values["known_values_limit"],
        )
    assert not config.strict
    with pytest.raises(ValueError, match="override"), config.scoped(donate=False):
        pass
    with pytest.raises(ValueError, match="whole process"), config.scoped(eager=True):
        pass


def test_shared_scalars_stay_in_their_thread():
    """``meta.shared_scalars`` makes a number one graph input for the ops of its block, in its thread only."""
    eps = 1e-8
    with meta.shared_scalars([eps]):
        mine = meta._scalar_leaf(eps, meta._F64)
        assert meta._scalar_leaf(eps, meta._F64) is mine
        assert _in_thread(lambda: meta._scalar_leaf(eps, meta._F64)) is not mine


def test_set_value_checks_the_aval(dev):
    t = unwrap(torch.ones(2, 3, device=dev))
    wrong = (leaf(Leaf.DATA, None, meta.Aval((3, 2), torch.float32), 0), 0)
    with pytest.raises(AssertionError, match=r"internal error: a .*\(2, 3\).* tensor rebound to a value of .*\(3, 2\)"):
        set_value(t, wrong)
    right = (leaf(Leaf.DATA, None, meta.Aval((2, 3), torch.float32), 0), 0)
    retarget([t], [right])
    assert t._value is right


def test_rebinding_a_watched_tensor_counts_as_a_touch(dev):
    """Whole-step capture's quiet replay assumes nothing rebound the tensors it watches: a rebinding (not an op)
    counts as a touch, as an op on one does."""
    t = unwrap(torch.ones(2, device=dev))
    other = unwrap(torch.zeros(2, device=dev))
    session.arm_watch({id(t)})
    try:
        touched = session.touched
        set_value(other, other._value)  # not watched: no touch
        assert session.touched == touched and session.watched
        set_value(t, other._value)
        assert session.touched == touched + 1 and not session.watched
    finally:
        session.watched.clear()
    assert WATCH_OPS > 0


def test_the_session_holds_the_runtimes_history(dev):
    """Syncs, host reads and random ops change the session's state, nothing else's."""
    epoch, draws = session.epoch, session.draws
    x = torch.randn(3, device=dev)
    assert session.draws == draws + 1
    lazyxla.sync()
    assert session.epoch == epoch + 1
    x.sum().item()
    assert session.epoch == epoch + 2
    assert set(session.summary()) >= {"live", "made", "recorded", "epoch", "left_pending", "positions", "rng"}
