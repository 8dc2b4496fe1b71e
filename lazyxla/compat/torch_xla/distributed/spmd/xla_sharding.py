"""``torch_xla.distributed.spmd.xla_sharding``: the module torch_xla defines its sharding API in.

Scripts import it directly (``import torch_xla.distributed.spmd.xla_sharding as xs``); it holds the same
names as ``torch_xla.distributed.spmd`` (``Mesh``, ``HybridMesh``, ``mark_sharding``, ``ShardingSpec``, ...),
and ``MarkShardingFunction``, which torch_xla defines only here.

Example::

    import torch_xla.distributed.spmd.xla_sharding as xs
    xs.mark_sharding(x, mesh, ("data", None))
"""

import torch

from lazyxla.compat.torch_xla.distributed.spmd import *  # noqa: F403
from lazyxla.compat.torch_xla.distributed.spmd import (
    __all__,  # noqa: F401
    __getattr__,  # noqa: F401
)


class MarkShardingFunction(torch.autograd.Function):
    """``mark_sharding`` as an autograd step: the result is a new tensor laid out by ``partition_spec`` (the
    input is left as it is), and the gradient flowing back through it is laid out the same way, which guides
    XLA's sharding propagation in the backward pass.

    Example::

        h = xs.MarkShardingFunction.apply(h, mesh, ("data", None))
    """

    @staticmethod
    def forward(ctx, t: torch.Tensor, mesh, partition_spec) -> torch.Tensor:
        ctx.mesh, ctx.partition_spec = mesh, partition_spec
        return mark_sharding(t.clone(), mesh, partition_spec)  # noqa: F405 (the spmd package's)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return mark_sharding(grad_output.clone(), ctx.mesh, ctx.partition_spec), None, None  # noqa: F405
