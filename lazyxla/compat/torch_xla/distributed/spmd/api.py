"""``torch_xla.distributed.spmd.api``: PyTorch's DTensor API over lazyxla's SPMD.

``torch.distributed.tensor.distribute_tensor`` and ``distribute_module`` hand a ``DeviceMesh`` of device type
``'xla'`` to ``xla_distribute_tensor`` / ``xla_distribute_module``. A DeviceMesh becomes an ``xs.Mesh`` over the
same device ids (``convert_to_xla_mesh``), DTensor placements a partition spec (``convert_to_xla_partition_spec``),
and the tensor is laid out by ``mark_sharding``; the result is an ``XLAShardedTensor`` that knows its placements.
(The functions are defined in ``torch_xla.distributed.spmd``, which exports them as torch_xla's does.)

Example::

    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor
    mesh = DeviceMesh("xla", torch.arange(xr.global_runtime_device_count()))
    t = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])     # split by rows over every device
"""

from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.distributed.spmd import (
    auto_policy,
    convert_to_xla_mesh,
    convert_to_xla_partition_spec,
    xla_distribute_module,
    xla_distribute_tensor,
)

__all__ = [
    "auto_policy",
    "convert_to_xla_mesh",
    "convert_to_xla_partition_spec",
    "xla_distribute_module",
    "xla_distribute_tensor",
]


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
