"""``torch_xla.experimental`` on lazyxla: ``scan`` and ``scan_layers`` (loops XLA compiles once, over
``lazyxla.scan``), and ``xla_sharding``, the old name of ``torch_xla.distributed.spmd``.

Example::

    from torch_xla.experimental.scan_layers import scan_layers
    import torch_xla.experimental.xla_sharding as xs
"""
