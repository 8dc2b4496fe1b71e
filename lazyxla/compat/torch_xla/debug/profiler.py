"""``torch_xla.debug.profiler`` (``xp``) on jax's profiler.

``Trace``/``StepTrace`` are named spans (``jax.profiler.TraceAnnotation``/``StepTraceAnnotation``);
``StepTrace`` also marks the step when it ends, as in torch_xla. ``start_trace``/``stop_trace`` write a
trace into a folder (with lazyxla's phases named, see ``lazyxla.profiler``). ``start_server`` starts jax's
profiler server in this process, and ``trace``/``trace_detached`` capture a profile from such servers by
address (another process, or this one) through xprof's profiler client, the one ``python -m
jax.collect_profile`` uses: it needs ``pip install xprof``. The captured profile lands where torch_xla puts
it, ``logdir/plugins/profile/<run>/<host>_<port>.xplane.pb``, for TensorBoard's or xprof's profile viewer.

Example::

    import torch_xla.debug.profiler as xp
    xp.start_trace("/tmp/trace")
    for step, (x, y) in enumerate(loader):
        with xp.StepTrace("train", step_num=step):
            with xp.Trace("forward"):
                loss = loss_fn(model(x), y)
            loss.backward(); xm.optimizer_step(opt)
    xp.stop_trace()

    # or: the training script calls xp.start_server(9012); another process captures 2 s of it
    xp.trace("localhost:9012", "/tmp/profile", duration_ms=2000)
"""

from __future__ import annotations

import os
import threading
import time

import jax

import lazyxla
from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.core import xla_model as xm

_state: dict = {"trace": None, "server": None}


def start_server(port: int, only_on_master: bool = True):
    """Start jax's profiler server on ``port`` and return its handle; with ``only_on_master`` (the default)
    only the local master replica starts one, the others return None. jax runs one server per process: asking
    again for the port it serves returns the same handle, another port raises. jax's server listens on every
    network interface of the host: profile on a trusted network only.

    Example::

        server = xp.start_server(9012)
    """
    if only_on_master and not xm.is_master_ordinal():
        return None
    running = _state["server"]
    if running is not None and running[0] == int(port):
        return running[1]
    server = jax.profiler.start_server(int(port))
    _state["server"] = (int(port), server)
    return server


def _profiler_client():
    """xprof's profiler client (an optional dependency: imported only when a capture is asked for)."""
    try:
        from xprof.convert import _pywrap_profiler_plugin  # optional dependency (pip install xprof)
    except ImportError as e:
        raise ImportError(
            "torch_xla.debug.profiler.trace captures through xprof's profiler client: pip install xprof "
            "(or profile this process with xp.start_trace(log_dir) / lazyxla.profiler.trace(log_dir))"
        ) from e
    return _pywrap_profiler_plugin


def trace(
    service_addr: str,
    logdir: str,
    duration_ms: int = 1000,
    num_tracing_attempts: int = 3,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    delay_ms: int = 0,
    timeout_s: int = 120,
    interval_s: int = 5,
) -> None:
    """Capture ``duration_ms`` of profile from the profiler servers at ``service_addr`` (``"host:port"``, or
    several joined by commas) into ``logdir``; blocks until done. A request that finds no server is tried
    again every ``interval_s`` seconds for up to ``timeout_s`` seconds; then the last error is raised.

    Example::

        xp.trace("localhost:9012", "/tmp/profile", duration_ms=2000)
    """
    client = _profiler_client()
    options = {"host_tracer_level": host_tracer_level, "device_tracer_level": device_tracer_level, "delay_ms": delay_ms}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.trace(service_addr, os.fspath(logdir), "", True, duration_ms, num_tracing_attempts, options)
            return
        except RuntimeError:
            if time.monotonic() + interval_s > deadline:
                raise
            time.sleep(interval_s)


def trace_detached(*args, **kwargs) -> threading.Thread:
    """:func:`trace` in a background thread (same arguments); returns the thread.

    Example::

        xp.trace_detached("localhost:9012", "/tmp/profile", duration_ms=5000)
        train()
    """
    thread = threading.Thread(target=trace, args=args, kwargs=kwargs, name="torch_xla.debug.profiler.trace")
    thread.start()
    return thread


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
        raise RuntimeError(
            "xp.start_trace: Profile has already been started. Only one profile may be run at a time: "
            "call xp.stop_trace() first"
        )
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
        raise RuntimeError("xp.stop_trace: No profile started (xp.start_trace(log_dir) starts one)")
    ctx.__exit__(None, None, None)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
