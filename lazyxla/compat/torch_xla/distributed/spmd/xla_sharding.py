"""``torch_xla.distributed.spmd.xla_sharding``: the module torch_xla defines its sharding API in.

Scripts import it directly (``import torch_xla.distributed.spmd.xla_sharding as xs``); it holds the same
names as ``torch_xla.distributed.spmd`` (``Mesh``, ``HybridMesh``, ``mark_sharding``, ``ShardingSpec``,
``MarkShardingFunction``, ``wrap_as_sharded_tensor``, ``apply_xla_patch_to_nn_linear``, ...).

Example::

    import torch_xla.distributed.spmd.xla_sharding as xs
    xs.mark_sharding(x, mesh, ("data", None))
"""

from lazyxla.compat.torch_xla.distributed.spmd import *  # noqa: F403
from lazyxla.compat.torch_xla.distributed.spmd import (
    __all__,  # noqa: F401
    __getattr__,  # noqa: F401
)
