"""Profile training steps with JAX's profiler, with lazyxla's phases named.

Inside :func:`trace`, every step shows as a ``lazyxla.step`` span (one per full sync: TensorBoard's
step view counts them), and inside it the phases of lazyxla's work:

- ``lazyxla.record``: your Python code recording ops, from the end of one sync to the start of the next;
- ``lazyxla.trace``: the sync walking and hashing the recorded graph;
- ``lazyxla.lower`` / ``lazyxla.compile`` / ``lazyxla.disk_cache``: building a program (first steps only);
- ``lazyxla.transfer``: host-to-device and device-to-host copies (``.to(dev)``, ``.item()``, ``.cpu()``);
- ``lazyxla.execute``: handing the program to the device (it runs asynchronously: XLA's own ops show on
  the device's threads, under the program's name ``jit_fn``).

The trace is written by ``jax.profiler`` into ``logdir/plugins/profile/<run>/``: open it with TensorBoard
(``tensorboard --logdir logdir``, Profile tab; needs the ``tensorboard-plugin-profile`` package) or drop
the ``*.trace.json.gz`` file written next to it onto https://ui.perfetto.dev.

Example::

    with lazyxla.profiler.trace("/tmp/lazyxla-trace"):
        for x, y in loader:
            train_step(x, y)
            lazyxla.sync()
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator

import jax

from lazyxla.observe import metrics

_state = {"active": False, "record": None, "step": 0}


def active() -> bool:
    """Whether a :func:`trace` is running.

    Example::

        assert not lazyxla.profiler.active()
    """
    return _state["active"]


@contextlib.contextmanager
def trace(logdir: str | os.PathLike, *, perfetto: bool = True) -> Iterator[str]:
    """Profile the enclosed code into ``logdir`` (see the module docstring for what shows).

    Yields ``logdir``. ``perfetto=True`` also writes the trace in Perfetto's JSON format
    (``*.trace.json.gz``; see :func:`trace_files`). One trace at a time per process.

    Example::

        with lazyxla.profiler.trace("/tmp/prof") as logdir:
            train_step(); lazyxla.sync()
        print(lazyxla.profiler.trace_files(logdir))
    """
    if _state["active"]:
        raise RuntimeError("lazyxla.profiler.trace is already running: nest the code in the outer trace instead")
    logdir = os.fspath(logdir)
    os.makedirs(logdir, exist_ok=True)
    jax.profiler.start_trace(logdir, create_perfetto_trace=perfetto)
    _state.update(active=True, step=0)
    metrics.set_annotations(True)
    _begin_record()
    try:
        yield logdir
    finally:
        _end_record()
        metrics.set_annotations(False)
        _state["active"] = False
        jax.profiler.stop_trace()


def trace_files(logdir: str | os.PathLike) -> list[str]:
    """The trace files written under ``logdir`` (XPlane ``*.xplane.pb`` and Perfetto ``*.trace.json.gz``).

    Example::

        files = lazyxla.profiler.trace_files("/tmp/prof")
    """
    root = os.path.join(os.fspath(logdir), "plugins", "profile", "*")
    return sorted(glob.glob(os.path.join(root, "*.xplane.pb")) + glob.glob(os.path.join(root, "*.trace.json.gz")))


def _begin_record() -> None:
    if _state["active"] and _state["record"] is None:
        span = jax.profiler.TraceAnnotation("lazyxla.record")
        span.__enter__()
        _state["record"] = span


def _end_record() -> None:
    span = _state["record"]
    if span is not None:
        _state["record"] = None
        span.__exit__(None, None, None)


@contextlib.contextmanager
def step() -> Iterator[None]:
    """One full sync's span (used by ``lazyxla.sync``): closes the recording span, opens a step span.

    Example::

        with lazyxla.profiler.step():   # lazyxla.sync() does this itself
            ...
    """
    if not _state["active"]:
        yield
        return
    _end_record()
    _state["step"] += 1
    try:
        with jax.profiler.StepTraceAnnotation("lazyxla.step", step_num=_state["step"]):
            yield
    finally:
        _begin_record()


__all__ = ["active", "step", "trace", "trace_files"]
