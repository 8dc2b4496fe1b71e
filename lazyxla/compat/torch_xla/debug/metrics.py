"""``torch_xla.debug.metrics`` (``met``) on lazyxla's counters and timers.

torch_xla's best-known names are mapped onto lazyxla's (``lazyxla.metrics.counters()`` / ``timers()``):

=========================  ==================================================================
torch_xla name             lazyxla source
=========================  ==================================================================
``CachedCompile``          counter ``cache_hits``
``UncachedCompile``        counter ``compiles``
``MarkStep``               counter ``mark_steps`` (calls of ``xm.mark_step``/``torch_xla.sync``)
``ExecuteComputation``     counter ``executions``
``aten::<op>``             counter ``fallback.aten.<op>.<overload>`` (ops run on the CPU)
``CompileTime``            timer ``compile``
``ExecuteTime``            timer ``execute`` (the programs of steps, regions and reads)
``EagerOpCompileTime``     timer ``eager_compile`` (eager mode: each op's program, when built)
``EagerOpExecuteTime``     timer ``eager_execute`` (eager mode: each op's program)
``TransferToDeviceTime``   timer ``transfer`` (both directions: lazyxla has one transfer timer)
``TransferFromDeviceTime`` timer ``transfer``
``TraceTime``              timer ``trace``
=========================  ==================================================================

lazyxla's own names (``compiles``, ``host_to_device``, ``lower``, ...) are listed and readable too. As in
torch_xla, ``counter_names()`` lists only counters above zero and ``counter_value`` of a counter that
never counted is None; ``metric_data`` is ``(total_samples, accumulator, samples)`` with times in
nanoseconds (lazyxla keeps no sample timestamps: a sample's "time" is its index).

Example::

    import torch_xla.debug.metrics as met
    train_step(); xm.mark_step()
    assert met.counter_value("UncachedCompile") == 1
    print(met.short_metrics_report())
"""

from __future__ import annotations

import lazyxla
from lazyxla.compat._common import missing_attribute
from lazyxla.observe import metrics as _metrics

__all__ = [
    "clear_all",
    "clear_counters",
    "clear_metrics",
    "counter_names",
    "counter_value",
    "metric_data",
    "metric_names",
    "metrics_report",
    "short_metrics_report",
]

_COUNTERS = {
    "CachedCompile": "cache_hits",
    "UncachedCompile": "compiles",
    "ExecuteComputation": "executions",
    "MarkStep": "mark_steps",
}
_METRICS = {
    "CompileTime": "compile",
    "ExecuteTime": "execute",
    "EagerOpCompileTime": "eager_compile",
    "EagerOpExecuteTime": "eager_execute",
    "TransferToDeviceTime": "transfer",
    "TransferFromDeviceTime": "transfer",
    "TraceTime": "trace",
}


def _all_counters() -> dict[str, int]:
    raw = lazyxla.metrics.counters()
    out = {name: raw.get(source, 0) for name, source in _COUNTERS.items()}
    for name, value in raw.items():
        if name.startswith("fallback."):
            op = name[len("fallback.") :]
            parts = op.split(".")
            if len(parts) >= 2:
                key = f"{parts[0]}::{parts[1]}"
                out[key] = out.get(key, 0) + value
    out.update(raw)
    return out


def counter_names() -> list[str]:
    """The counters that have counted something (torch_xla names first, then lazyxla's).

    Example::

        if any(n.startswith("aten::") for n in met.counter_names()): print("some ops ran on the CPU")
    """
    return [name for name, value in _all_counters().items() if value > 0]


def counter_value(name: str) -> int | None:
    """The value of counter ``name``, or None when it has never counted.

    Example::

        fallbacks = met.counter_value("aten::nonzero")
    """
    value = _all_counters().get(name)
    return value if value else None


def clear_counters() -> None:
    """Zero every counter.

    Example::

        met.clear_counters()
    """
    _metrics._counters.clear()


def _samples(source: str) -> list[float]:
    return list(getattr(_metrics, "_timers", {}).get(source, ()))


def metric_names() -> list[str]:
    """The metrics (timers) that have samples: torch_xla's names, then lazyxla's.

    Example::

        print(met.metric_names())    # ['CompileTime', 'ExecuteTime', ..., 'compile', 'execute', ...]
    """
    timers = lazyxla.metrics.timers()
    mapped = [name for name, source in _METRICS.items() if source in timers]
    return mapped + sorted(timers)


def metric_data(name: str) -> tuple[int, float, list[tuple[int, float]]] | None:
    """``(total_samples, accumulator, samples)`` of metric ``name`` (nanoseconds), or None if it has none.

    Example::

        count, total_ns, _ = met.metric_data("CompileTime")
    """
    source = _METRICS.get(name, name)
    samples = _samples(source)
    if not samples:
        return None
    ns = [s * 1e9 for s in samples]
    return len(ns), sum(ns), list(enumerate(ns))


def clear_metrics() -> None:
    """Drop every timer's samples.

    Example::

        met.clear_metrics()
    """
    _metrics._timers.clear()


def clear_all() -> None:
    """Zero counters and metrics.

    Example::

        met.clear_all()
    """
    lazyxla.metrics.reset()


def metrics_report() -> str:
    """lazyxla's full report (``lazyxla.metrics.report()``: counters, timers, sync triggers).

    Example::

        print(met.metrics_report())
    """
    return lazyxla.metrics.report()


def short_metrics_report(counter_names: list | None = None, metric_names: list | None = None) -> str:
    """A report of a few counters and metrics in torch_xla's layout (defaults: ``CachedCompile``,
    ``MarkStep``; ``CompileTime``, ``ExecuteTime``, ``TransferToDeviceTime``, ``TransferFromDeviceTime``),
    plus every ``aten::`` counter (ops that ran on the CPU).

    Example::

        print(met.short_metrics_report())
    """
    counter_names = counter_names or ["CachedCompile", "MarkStep"]
    metric_names = metric_names or ["CompileTime", "ExecuteTime", "TransferToDeviceTime", "TransferFromDeviceTime"]
    lines = []
    for name in metric_names:
        data = metric_data(name)
        if data is None:
            continue
        count, total, samples = data
        values = sorted(v for _, v in samples)
        lines += [
            f"Metric: {name}",
            f"  TotalSamples: {count}",
            f"  Accumulator: {total / 1e6:.3f}ms",
            f"  Percentiles: 50%={values[len(values) // 2] / 1e6:.3f}ms; 100%={values[-1] / 1e6:.3f}ms",
        ]
    counters = _all_counters()
    names = list(counter_names) + [n for n in counters if n.startswith("aten::") and n not in counter_names]
    for name in names:
        if counters.get(name):
            lines += [f"Counter: {name}", f"  Value: {counters[name]}"]
    return "\n".join(lines) + ("\n" if lines else "")


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
