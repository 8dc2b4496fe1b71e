"""``lazyxla.profiler``: profile training steps with JAX's profiler, with lazyxla's phases named
(``lazyxla.step``, ``lazyxla.record``, ``lazyxla.trace``, ``lazyxla.lower``, ``lazyxla.compile``,
``lazyxla.transfer``, ``lazyxla.execute``; see ``lazyxla.observe.profiler`` for what each covers).

Example::

    with lazyxla.profiler.trace("/tmp/lazyxla-trace") as logdir:
        for x, y in loader:
            train_step(x, y)
            lazyxla.sync()
    print(lazyxla.profiler.trace_files(logdir))
"""

from lazyxla.observe.profiler import active, step, trace, trace_files

__all__ = ["active", "step", "trace", "trace_files"]
