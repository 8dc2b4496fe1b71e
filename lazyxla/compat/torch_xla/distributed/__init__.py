"""``torch_xla.distributed`` on lazyxla: ``parallel_loader``, ``xla_multiprocessing``, ``spmd``,
``xla_backend``, ``fsdp`` (FSDP v1) and ``zero_redundancy_optimizer`` (ZeRO-1).

Example::

    from torch_xla.distributed import parallel_loader as pl, xla_multiprocessing as xmp
"""
