"""``torch_xla.experimental.xla_sharding``: the older name of ``torch_xla.distributed.spmd``.

Example::

    import torch_xla.experimental.xla_sharding as xs
    xs.mark_sharding(x, mesh, (0, None))
"""

from lazyxla.compat.torch_xla.distributed.spmd import *  # noqa: F403
from lazyxla.compat.torch_xla.distributed.spmd import (
    __all__,  # noqa: F401
    __getattr__,  # noqa: F401
)
