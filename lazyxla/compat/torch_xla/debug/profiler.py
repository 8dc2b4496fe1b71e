"""``torch_xla.debug.profiler`` (``xp``) on jax's profiler.

``Trace``/``StepTrace`` are named spans (``jax.profiler.TraceAnnotation``/``StepTraceAnnotation``);
``StepTrace`` also marks the step when it ends, as in torch_xla. ``start_trace``/``stop_trace`` write a
trace into a folder (with lazyxla's phases named, see ``lazyxla.profiler``); ``start_server`` starts
jax's profiler server. ``trace`` (capturing from a server by address) is not supported.

Example::

    import torch_xla.debug.profiler as xp
    xp.start_trace("/tmp/trace")
    for step, (x, y) in enumerate(loader):
        with xp.StepTrace("train", step_num=step):
            with xp.Trace("forward"):
                loss = loss_fn(model(x), y)
            loss.backward(); xm.optimizer_step(opt)
    xp.stop_trace()
"""

from __future__ import annotations

import jax

import lazyxla
from lazyxla.compat._common import missing_attribute, stub
from lazyxla.compat.torch_xla.core import xla_model as xm

_state: dict = {"trace": None}


def start_server(port: int, only_on_master: bool = True):
    """Start jax's profiler server on ``port`` (returns its handle).

    Example::

        server = xp.start_server(9012)
    """
    return jax.profiler.start_server(int(port))


class Trace:
    """A named span in the profile (``jax.profiler.TraceAnnotation``).

    Example::

        with xp.Trace("build_graph"): ...
    """

    def __init__(self, name: str, **kwargs) -> None:
        self._span = jax.profiler.TraceAnnotation(name, **kwargs)

    def __enter__(self):
        self._span.__enter__()
        return self

    def __exit__(self, *exc):
        return self._span.__exit__(*exc)


class StepTrace:
    """A training step's span (``jax.profiler.StepTraceAnnotation``); marks the step (``xm.mark_step()``)
    when it ends, as in torch_xla.

    Example::

        with xp.StepTrace("train_loop", step_num=step): ...
    """

    def __init__(self, name: str, **kwargs) -> None:
        self._span = jax.profiler.StepTraceAnnotation(name, **kwargs)

    def __enter__(self):
        self._span.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            if exc[0] is None:
                xm.mark_step()
        finally:
            self._span.__exit__(*exc)


def start_trace(log_dir: str) -> None:
    """Start writing a profile into ``log_dir`` (``lazyxla.profiler.trace``).

    Example::

        xp.start_trace("/tmp/trace")
    """
    if _state["trace"] is not None:
        raise RuntimeError("xp.start_trace: a trace is already running; call xp.stop_trace() first")
    ctx = lazyxla.profiler.trace(log_dir)
    ctx.__enter__()
    _state["trace"] = ctx


def stop_trace() -> None:
    """Stop the trace :func:`start_trace` started and write it.

    Example::

        xp.stop_trace()
    """
    ctx, _state["trace"] = _state["trace"], None
    if ctx is None:
        raise RuntimeError("xp.stop_trace: no trace is running")
    ctx.__exit__(None, None, None)


trace = stub("torch_xla.debug.profiler.trace", "xp.start_trace(log_dir) / lazyxla.profiler.trace(log_dir)")


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
