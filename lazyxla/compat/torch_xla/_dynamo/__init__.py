"""``torch_xla._dynamo`` on lazyxla: ``dynamo_bridge`` (what ``torch.compile(backend='openxla')`` calls) and
``config``.

Example::

    import torch_xla._dynamo.dynamo_bridge as bridge
"""

from lazyxla.compat.torch_xla._dynamo import config

__all__ = ["config"]
