"""``torch_xla.core.dynamo_bridge``: the older name of ``torch_xla._dynamo.dynamo_bridge`` (what PyTorch's
``openxla`` backends import).

Example::

    import torch_xla.core.dynamo_bridge as bridge
    compiled = bridge.extract_compiled_graph(graph_module, args)
"""

from lazyxla.compat.torch_xla._dynamo.dynamo_bridge import *  # noqa: F403
from lazyxla.compat.torch_xla._dynamo.dynamo_bridge import __all__  # noqa: F401
