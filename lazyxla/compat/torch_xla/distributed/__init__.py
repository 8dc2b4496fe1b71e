"""``torch_xla.distributed`` on lazyxla: ``parallel_loader``, ``xla_multiprocessing``, ``spmd``,
``xla_backend``.

Example::

    from torch_xla.distributed import parallel_loader as pl, xla_multiprocessing as xmp
"""
