"""``torch_xla.debug.metrics`` (``met``) on lazyxla's counters and timers.

torch_xla's best-known names are mapped onto lazyxla's (``lazyxla.metrics.counters()`` / ``timers()``):

=============================  ================================================================
torch_xla name                 lazyxla source
=============================  ================================================================
``CachedCompile``              counter ``cache_hits``
``UncachedCompile``            counter ``compiles``
``MarkStep``                   counter ``mark_steps`` (``xm.mark_step``, ``torch_xla.sync``, each
                               ``torch_xla.step()``/``compile()`` region twice: entry and exit)
``ExecuteComputation``         counter ``executions``
``CreateCompileHandles``       ``compiles - persistent_cache_hits`` (programs XLA compiled; a program loaded
                               from the persistent cache is not compiled, as in torch_xla)
``CompileWithAutoSharding``    the same, counted from ``xr.use_spmd(auto=True)`` on (see
                               ``torch_xla.runtime.use_spmd``: lazyxla's policy stands for the pass)
``CreateDataHandles``          counter ``device_buffers`` (each buffer a copy from the host puts on a device,
                               and each result buffer of a program)
``aten::_local_scalar_dense``  counter ``scalar_reads`` (``.item()``, ``if t:``: a host read)
``aten::<op>``                 counter ``fallback.aten.<op>.<overload>`` (ops run on the CPU)
``CompileTime``                timer ``compile``
``ExecuteTime``                timer ``execute`` (dispatch: lazyxla runs programs asynchronously)
``EagerOpCompileTime``         timer ``eager_compile`` (eager mode: each op's program, when built)
``EagerOpExecuteTime``         timer ``eager_execute`` (eager mode: each op's program)
``TransferToDeviceTime``       timer ``transfer_to_device``
``TransferFromDeviceTime``     timer ``transfer_from_device``
``TraceTime``                  timer ``trace``
``OutboundData``               size series ``bytes_to_device`` (bytes of each copy to the devices)
``InboundData``                size series ``bytes_from_device`` (bytes of each copy to the host)
=============================  ================================================================

lazyxla's own names (``compiles``, ``host_to_device``, ``lower``, ...) are listed and readable too; the
counters and metrics of torch_xla's C++ runtime that have no lazyxla counterpart (``CreateXlaTensor``,
``TensorToData``, ...) are absent rather than made up. As in torch_xla, ``counter_names()`` lists only
counters above zero and ``counter_value`` of a counter that never counted is None; ``metric_data`` is
``(total_samples, accumulator, samples)`` with times in nanoseconds and sizes in bytes (lazyxla keeps no sample
timestamps: a sample's "time" is its index). ``metrics_report()`` and ``short_metrics_report()`` are in torch_xla's
layout, which ``torch_xla.debug.metrics_compare_utils`` parses.

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
    "executed_fallback_ops",
    "metric_data",
    "metric_names",
    "metrics_report",
    "short_metrics_report",
]

_COUNTERS = {
    "CachedCompile": "cache_hits",
    "UncachedCompile": "compiles",
    "ExecuteComputation": "executions",
    "CreateDataHandles": "device_buffers",
    "MarkStep": "mark_steps",
    "aten::_local_scalar_dense": "scalar_reads",
}
_METRICS = {
    "CompileTime": "compile",
    "ExecuteTime": "execute",
    "EagerOpCompileTime": "eager_compile",
    "EagerOpExecuteTime": "eager_execute",
    "TransferToDeviceTime": "transfer_to_device",
    "TransferFromDeviceTime": "transfer_from_device",
    "TraceTime": "trace",
    "OutboundData": "bytes_to_device",
    "InboundData": "bytes_from_device",
}
_SIZES = frozenset({"OutboundData", "InboundData", "bytes_to_device", "bytes_from_device"})  # bytes, not time


# XLA compiles counted before torch_xla's auto-sharding mode began (``xr.use_spmd(auto=True)``); None: not on
_auto_sharding_from: list[int | None] = [None]


def auto_sharding_began() -> None:
    """Count ``CompileWithAutoSharding`` from now on: the programs compiled while auto-sharding mode is on (it
    stays on for the rest of the process, as in torch_xla). Called by ``torch_xla.runtime.use_spmd(auto=True)``.

    Example::

        auto_sharding_began(); torch_xla.sync(); met.counter_value("CompileWithAutoSharding")     # 1
    """
    if _auto_sharding_from[0] is None:
        raw = lazyxla.metrics.counters()
        _auto_sharding_from[0] = raw["compiles"] - raw["persistent_cache_hits"]


def auto_sharding() -> bool:
    """Whether torch_xla's auto-sharding mode is on (``torch_xla._XLAC._xla_get_auto_sharding``).

    Example::

        if auto_sharding(): print(counter_value("CompileWithAutoSharding"))
    """
    return _auto_sharding_from[0] is not None


def _all_counters() -> dict[str, int]:
    raw = lazyxla.metrics.counters()
    out = {name: raw.get(source, 0) for name, source in _COUNTERS.items()}
    # torch_xla counts the programs its runtime compiled; lazyxla's ``compiles`` also counts the programs it
    # loaded from the persistent cache, which torch_xla does not compile either
    out["CreateCompileHandles"] = raw["compiles"] - raw["persistent_cache_hits"]
    if auto_sharding():  # (max: counters zeroed by lazyxla.metrics.reset() rather than by clear_counters)
        out["CompileWithAutoSharding"] = max(0, out["CreateCompileHandles"] - _auto_sharding_from[0])
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
    _metrics.reset_counters()
    if auto_sharding():
        _auto_sharding_from[0] = 0


def metric_names() -> list[str]:
    """The metrics (timers and transfer sizes) that have samples: torch_xla's names, then lazyxla's.

    Example::

        print(met.metric_names())    # ['CompileTime', 'ExecuteTime', ..., 'compile', 'execute', ...]
    """
    own = sorted(lazyxla.metrics.timers()) + sorted(lazyxla.metrics.sizes())
    mapped = [name for name, source in _METRICS.items() if source in own]
    return mapped + own


def metric_data(name: str) -> tuple[int, float, list[tuple[int, float]]] | None:
    """``(total_samples, accumulator, samples)`` of metric ``name`` (times in nanoseconds, ``InboundData`` and
    ``OutboundData`` in bytes), or None if it has none.

    Example::

        count, total_ns, _ = met.metric_data("CompileTime")
        copies, total_bytes, _ = met.metric_data("OutboundData")
    """
    samples = lazyxla.metrics.samples(_METRICS.get(name, name))
    if not samples:
        return None
    values = samples if name in _SIZES else [s * 1e9 for s in samples]
    return len(values), sum(values), list(enumerate(values))


def clear_metrics() -> None:
    """Drop every metric's samples (timers and transfer sizes).

    Example::

        met.clear_metrics()
    """
    _metrics.reset_samples()


def clear_all() -> None:
    """Zero counters and metrics.

    Example::

        met.clear_all()
    """
    lazyxla.metrics.reset()
    if auto_sharding():
        _auto_sharding_from[0] = 0


_PERCENTILES = (1, 5, 10, 20, 50, 80, 90, 95, 99)


def _duration(ns: float) -> str:
    """A duration in torch_xla's notation: ``01m29s615ms``, ``041ms146.000us`` (leading zero units left out)."""
    us = ns / 1e3
    whole_ms, us = divmod(us, 1e3)
    whole_s, ms = divmod(int(whole_ms), 1000)
    minutes, s = divmod(whole_s, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [(days, "%02dd"), (hours, "%02dh"), (minutes, "%02dm"), (s, "%02ds"), (ms, "%03dms")]
    while parts and parts[0][0] == 0:
        parts.pop(0)
    return "".join(fmt % value for value, fmt in parts) + f"{us:.3f}us"


def _bytes(n: float) -> str:
    """A size in torch_xla's notation: binary units, two decimals (``393.00KB``, ``1.54MB``)."""
    units = ("B", "KB", "MB", "GB", "TB", "PB")
    k = 0
    while k + 1 < len(units) and n >= 1024.0:
        n /= 1024.0
        k += 1
    return f"{n:.2f}{units[k]}"


def _metric_block(name: str) -> list[str]:
    data = metric_data(name)
    if data is None:
        return []
    count, total, samples = data
    show = _bytes if name in _SIZES else _duration
    values = sorted(v for _, v in samples)
    ranks = [values[min(len(values) - 1, len(values) * p // 100)] for p in _PERCENTILES]
    percentiles = "; ".join(f"{p}%={show(v)}" for p, v in zip(_PERCENTILES, ranks))
    return [
        f"Metric: {name}",
        f"  TotalSamples: {count}",
        f"  Accumulator: {show(total)}",
        f"  Percentiles: {percentiles}",
    ]


def _counter_block(name: str, counters: dict[str, int]) -> list[str]:
    return [f"Counter: {name}", f"  Value: {counters[name]}"] if counters.get(name) else []


def _report(metric_list: list[str], counter_list: list[str]) -> str:
    counters = _all_counters()
    lines = [line for name in metric_list for line in _metric_block(name)]
    lines += [line for name in counter_list for line in _counter_block(name, counters)]
    return "\n".join(lines) + ("\n" if lines else "")


def metrics_report() -> str:
    """Every metric with samples and every counter above zero, in torch_xla's layout (``Metric:`` blocks with
    ``TotalSamples``, ``Accumulator`` and ``Percentiles``, then ``Counter:`` blocks with ``Value``): torch_xla's
    names first, then lazyxla's own.

    Example::

        print(met.metrics_report())
    """
    return _report(metric_names(), counter_names())


def executed_fallback_ops() -> list[str]:
    """The ops that ran outside the device program since the counters were cleared, as torch_xla names them
    (``aten::nonzero``): ops that fell back to the CPU, and ``aten::_local_scalar_dense`` for host reads of a
    value (``.item()``).

    Example::

        assert met.executed_fallback_ops() == []      # everything ran on the device
    """
    return sorted(name for name, value in _all_counters().items() if name.startswith("aten::") and value > 0)


def short_metrics_report(counter_names: list | None = None, metric_names: list | None = None) -> str:
    """A report of a few metrics and counters in torch_xla's layout (defaults: ``CompileTime``, ``ExecuteTime``,
    ``ExecuteReplicatedTime``, ``TransferToDeviceTime``, ``TransferFromDeviceTime``; ``CachedCompile``,
    ``MarkStep``, ``DynamoSyncInputExecuteTime``), plus every ``aten::`` counter (ops that ran outside the
    device program). Names without samples are left out.

    Example::

        print(met.short_metrics_report())
    """
    counter_names = list(counter_names or ["CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime"])
    metric_names = list(
        metric_names
        or ["CompileTime", "ExecuteTime", "ExecuteReplicatedTime", "TransferToDeviceTime", "TransferFromDeviceTime"]
    )
    counter_names += [n for n in executed_fallback_ops() if n not in counter_names]
    return _report(metric_names, counter_names)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
