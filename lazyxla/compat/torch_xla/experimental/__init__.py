"""``torch_xla.experimental`` on lazyxla: only ``xla_sharding``, the old name of ``torch_xla.distributed.spmd``.

Example::

    import torch_xla.experimental.xla_sharding as xs
"""
