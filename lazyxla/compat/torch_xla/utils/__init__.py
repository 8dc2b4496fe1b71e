"""``torch_xla.utils`` on lazyxla: the helpers of ``torch_xla.utils.utils`` training scripts use, and
``torch_xla.utils.checkpoint`` (activation checkpointing).

Example::

    import torch_xla.utils.utils as xu
"""
