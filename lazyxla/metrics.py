"""``lazyxla.metrics``: counters, timers, sync triggers, recompile explanations and a readable report."""

from lazyxla.observe.metrics import counters, recompiles, report, reset, syncs, timers

__all__ = ["counters", "recompiles", "report", "reset", "syncs", "timers"]
