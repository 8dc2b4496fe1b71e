"""``torch_xla.core`` on lazyxla: ``xla_model`` is the module scripts import from here.

Example::

    import torch_xla.core.xla_model as xm
"""
