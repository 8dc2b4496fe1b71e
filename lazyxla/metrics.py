"""``lazyxla.metrics``: counters, timers, transfer sizes, sync triggers, recompile explanations and a readable
report."""

from lazyxla.observe.metrics import counters, recompiles, report, reset, samples, sizes, syncs, timers

__all__ = ["counters", "recompiles", "report", "reset", "samples", "sizes", "syncs", "timers"]
