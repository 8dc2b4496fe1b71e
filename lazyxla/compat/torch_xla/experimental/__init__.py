"""``torch_xla.experimental`` on lazyxla: eager mode (``eager_mode``, ``is_eager_mode``, ``eager_mode_context``),
``scan`` and ``scan_layers`` (loops XLA compiles once, over ``lazyxla.scan``), ``spmd_fully_sharded_data_parallel``
(FSDPv2) and ``xla_sharding`` (the old name of ``torch_xla.distributed.spmd``).

Example::

    import torch_xla
    torch_xla.experimental.eager_mode(True)
    from torch_xla.experimental.scan_layers import scan_layers
    import torch_xla.experimental.xla_sharding as xs
"""

from lazyxla.compat.torch_xla.experimental.eager import eager_mode, eager_mode_context, is_eager_mode

__all__ = ["eager_mode", "eager_mode_context", "is_eager_mode"]
