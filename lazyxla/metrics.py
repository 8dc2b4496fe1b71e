"""``lazyxla.metrics``: counters, timers and a readable report."""

from lazyxla.lazy.metrics import counters, report, reset, timers

__all__ = ["counters", "report", "reset", "timers"]
