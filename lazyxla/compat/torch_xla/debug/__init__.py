"""``torch_xla.debug`` on lazyxla: ``metrics`` and ``profiler``.

Example::

    import torch_xla.debug.metrics as met
    print(met.short_metrics_report())
"""
