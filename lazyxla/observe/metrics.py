"""Counters, timers and sizes: what lazyxla did (compiles, cache hits, transfers, fallbacks), how long it took and
how many bytes it moved."""

from __future__ import annotations

import collections
import contextlib
import contextvars
import time
from collections.abc import Iterator

import jax

from lazyxla.observe import diagnostics

_BASE = (
    "compiles",
    "cache_hits",
    "persistent_cache_hits",
    "persistent_cache_misses",
    "executions",
    "nodes_executed",
    "host_to_device",
    "device_to_host",
    "syncs",
    "ops_recorded",
    "data_dependent_syncs",
    "index_checks",
    "scalar_reads",
    "device_buffers",
)
_counters: collections.Counter = collections.Counter()
_timers: dict[str, list[float]] = collections.defaultdict(list)
_sizes: dict[str, list[int]] = collections.defaultdict(list)  # byte counts, one sample per transfer


def inc(name: str, n: int = 1) -> None:
    _counters[name] += n


def count(name: str) -> int:
    """One counter's value (``counters()`` copies them all)."""
    return _counters[name]


_annotate = [False]  # lazyxla.profiler.trace is running: timers also mark the profile


def set_annotations(on: bool) -> None:
    """Make every timer also a named span (``lazyxla.<name>``) in the JAX profile (``lazyxla.profiler``)."""
    _annotate[0] = on


# prepended to every timer's name (eager mode's per-op programs: "eager_"); a ContextVar, so that eager mode's prefix
# holds in the thread that runs the op only (a DeviceLoader's uploads on its own thread time as ``transfer``)
_prefix: contextvars.ContextVar[str] = contextvars.ContextVar("lazyxla_timer_prefix", default="")


@contextlib.contextmanager
def timer_prefix(prefix: str) -> Iterator[None]:
    """Inside: every timer's samples go to ``prefix + name`` (eager mode's programs time as ``eager_compile``,
    ``eager_execute``, ..., apart from the steps' ``compile`` and ``execute``)."""
    token = _prefix.set(prefix)
    try:
        yield
    finally:
        _prefix.reset(token)


@contextlib.contextmanager
def timer(name: str, also: str | None = None) -> Iterator[None]:
    """Time the block under ``name`` (and, if given, under ``also`` too: a finer name for the same span, e.g.
    a transfer's direction, without a second profile span)."""
    prefix = _prefix.get()
    name = prefix + name
    also = None if also is None else prefix + also
    span = _span(name) if _annotate[0] else contextlib.nullcontext()
    with span:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            _timers[name].append(elapsed)
            if also is not None:
                _timers[also].append(elapsed)


@contextlib.contextmanager
def transfer(direction: str, nbytes: int) -> Iterator[None]:
    """Time a copy of ``nbytes`` between the host and the devices (``direction``: ``to_device`` or
    ``from_device``) under ``transfer`` and ``transfer_<direction>``, and record its size as one sample of
    ``bytes_<direction>`` (:func:`sizes`). Never under eager mode's prefix: a copy is the same copy there."""
    token = _prefix.set("")
    try:
        with timer("transfer", also="transfer_" + direction):
            yield
    finally:
        _prefix.reset(token)
    transferred(direction, nbytes)


def transferred(direction: str, nbytes: int) -> None:
    """Record ``nbytes`` copied between the host and the devices (``direction`` as in :func:`transfer`) by a copy
    that is not timed apart: the host arrays jax copies as part of a program call."""
    _sizes["bytes_" + direction].append(nbytes)


def _span(name: str):
    return jax.profiler.TraceAnnotation("lazyxla." + name)


def counters() -> dict[str, int]:
    """A snapshot of every counter.

    Always has ``compiles``, ``cache_hits``, ``persistent_cache_hits``, ``persistent_cache_misses``,
    ``executions``, ``nodes_executed`` (IR nodes in the programs run, summed: the size of the work each
    sync sends), ``host_to_device``, ``device_to_host``, ``syncs``, ``ops_recorded`` and
    ``data_dependent_syncs`` (host reads an op's output shape needed, e.g. ``nonzero``'s count),
    ``index_checks`` (host reads of an op's index bounds: ``config.check_indices``, eager mode),
    ``scalar_reads`` (host reads of a one-element tensor's value: ``.item()``, ``bool(t)``, ``if t:``),
    ``device_buffers`` (buffers put on a device: one per device a copy from the host fills, and one per result
    of a program on each device that holds it), plus one ``fallback.<op>`` entry per op that ran on the CPU.

    ``compiles`` counts the programs this process had to build because its in-memory cache did not
    hold them, and ``cache_hits`` the syncs that found their program in memory. A built program is
    either compiled by XLA or loaded from the persistent compilation cache on disk
    (``lazyxla.config.persistent_cache``): ``persistent_cache_hits`` counts the loads,
    ``persistent_cache_misses`` the programs looked up there, not found, compiled and written. So
    ``compiles - persistent_cache_hits`` is the number of XLA compiles, and "no compiles after step 2"
    holds whether or not the disk cache was warm.

    Example::

        before = lazyxla.metrics.counters()["compiles"]
        train_step()
        assert lazyxla.metrics.counters()["compiles"] == before   # served from the cache
    """
    out = {name: 0 for name in _BASE}
    out.update(_counters)
    return out


def timers() -> dict[str, dict[str, float]]:
    """Per timer (``trace``, ``lower``, ``compile``, ``execute``, ...): count, total, median and max seconds.

    ``compile`` times XLA compiles and loads from the persistent compilation cache alike; ``transfer`` times
    host-to-device and device-to-host copies, also counted apart as ``transfer_to_device`` and
    ``transfer_from_device``.

    Example::

        lazyxla.metrics.timers()["compile"]["total_s"]
    """
    return _summaries(_timers, "s")


def sizes() -> dict[str, dict[str, int]]:
    """Per size series (``bytes_to_device``, ``bytes_from_device``: one sample per copy between the host and
    the devices, the bytes it moved over every device it filled): count, total, median and max bytes.

    Example::

        lazyxla.metrics.sizes()["bytes_to_device"]["total_bytes"]
    """
    return _summaries(_sizes, "bytes")


def _summaries(series: dict[str, list], unit: str) -> dict[str, dict]:
    """Count, total, median and max (``total_<unit>``, ...) of each series, by name."""
    out = {}
    for name, xs in sorted(series.items()):
        s = sorted(xs)
        out[name] = {"count": len(s), f"total_{unit}": sum(s), f"median_{unit}": s[len(s) // 2], f"max_{unit}": s[-1]}
    return out


def samples(name: str) -> list[float]:
    """Every sample of timer ``name`` (seconds) or size series ``name`` (bytes), oldest first ([] if none).

    Example::

        lazyxla.metrics.samples("compile")      # [0.031, 0.012]
    """
    return list(_timers.get(name) or _sizes.get(name) or ())


_on_reset: list = []  # called after reset_counters: lazy/growth.py counts ops from ops_recorded


def on_reset_counters(fn) -> None:
    """Call ``fn()`` after every :func:`reset_counters` (for code that keeps a position in a counter).

    Example::

        on_reset_counters(lambda: next_check.__setitem__(0, limit))
    """
    _on_reset.append(fn)


def reset_counters() -> None:
    """Zero every counter (timers, sizes and diagnostics stay).

    Example::

        lazyxla.metrics.reset_counters()
    """
    _counters.clear()
    for fn in _on_reset:
        fn()


def reset_samples() -> None:
    """Drop every timer's and size series' samples (counters and diagnostics stay).

    Example::

        lazyxla.metrics.reset_samples()
    """
    _timers.clear()
    _sizes.clear()


def reset() -> None:
    """Zero every counter, timer and size series, and forget the sync triggers and recompile explanations.

    Example::

        lazyxla.metrics.reset(); step(); print(lazyxla.metrics.report())
    """
    reset_counters()
    reset_samples()
    diagnostics.reset()


def syncs() -> list[dict]:
    """Every sync trigger since the last reset, most frequent first: ``reason`` (``lazyxla.sync()``,
    ``.item()``, ``.cpu() / .to(cpu)``, ``print``, ``fallback <op>``, ``data-dependent shape ...``),
    ``where`` (the user's ``file:line``) and ``count``.

    Example::

        for s in lazyxla.metrics.syncs(): print(s["count"], s["reason"], s["where"])
    """
    return diagnostics.syncs()


def recompiles() -> list[dict]:
    """The recompile explanations since the last reset (with ``config.explain_recompiles``): ``site``
    (the sync that compiled) and ``reason`` (the first difference from the last graph compiled there).

    Example::

        lazyxla.config.explain_recompiles = True
        train(); print(lazyxla.metrics.recompiles())
    """
    return diagnostics.recompiles()


def report() -> str:
    """A readable summary of counters, timers and sizes.

    Example::

        print(lazyxla.metrics.report())
    """
    lines = ["lazyxla metrics", "  counters:"]
    for name, value in sorted(counters().items()):
        lines.append(f"    {name:<32} {value}")
    lines.append("  timers:")
    for name, t in timers().items():
        lines.append(
            f"    {name:<32} n={t['count']:<6} total={t['total_s'] * 1e3:9.1f} ms  "
            f"median={t['median_s'] * 1e3:8.3f} ms  max={t['max_s'] * 1e3:8.3f} ms"
        )
    lines.append("  sizes:")
    for name, b in sizes().items():
        lines.append(
            f"    {name:<32} n={b['count']:<6} total={b['total_bytes']:>12} B  "
            f"median={b['median_bytes']:>10} B  max={b['max_bytes']:>10} B"
        )
    return "\n".join(lines)
