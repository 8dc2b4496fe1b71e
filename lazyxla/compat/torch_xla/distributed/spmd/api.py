"""``torch_xla.distributed.spmd.api``: PyTorch's DTensor API over lazyxla's SPMD.

``torch.distributed.tensor.distribute_tensor`` and ``distribute_module`` hand a ``DeviceMesh`` of device type
``'xla'`` to ``xla_distribute_tensor`` / ``xla_distribute_module`` here. A DeviceMesh becomes an ``xs.Mesh``
over the same device ids (``convert_to_xla_mesh``), DTensor placements a partition spec
(``convert_to_xla_partition_spec``), and the tensor is laid out by ``mark_sharding``; the result is an
``XLAShardedTensor`` that knows its placements.

Example::

    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor
    mesh = DeviceMesh("xla", torch.arange(xr.global_runtime_device_count()))
    t = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])     # split by rows over every device
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Placement, Replicate

from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla import runtime as xr
from lazyxla.compat.torch_xla.distributed.spmd import Mesh, ShardingType, XLAShardedTensor, mark_sharding
from lazyxla.compat.torch_xla.distributed.spmd.xla_sharded_tensor import placements_to_partition_spec

__all__ = [
    "auto_policy",
    "convert_to_xla_mesh",
    "convert_to_xla_partition_spec",
    "xla_distribute_module",
    "xla_distribute_tensor",
]


def auto_policy(mod_name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
    """The ``partition_fn`` that asks ``xla_distribute_module`` for XLA's automatic sharding, which lazyxla
    does not offer: passing it raises.

    Example::

        xla_distribute_module(model, mesh, partition_fn=my_partition_fn)    # not auto_policy
    """
    return None


def convert_to_xla_mesh(dt_mesh: DeviceMesh) -> Mesh:
    """The ``xs.Mesh`` of a DeviceMesh: the same device ids, shape and dimension names. The DeviceMesh must
    span every device of the run (AssertionError otherwise). Turns SPMD mode on.

    Example::

        mesh = convert_to_xla_mesh(DeviceMesh("xla", torch.arange(8).reshape(2, 4)))
        mesh.mesh_shape      # (2, 4)
    """
    xr.use_spmd()
    assert dt_mesh.size() == xr.global_runtime_device_count(), (
        f"the DeviceMesh spans {dt_mesh.size()} devices; the run has {xr.global_runtime_device_count()}"
    )
    return Mesh(dt_mesh.mesh.flatten().numpy(), tuple(dt_mesh.mesh.size()), dt_mesh.mesh_dim_names)


def convert_to_xla_partition_spec(tensor: torch.Tensor, placements: Sequence[Placement]) -> tuple:
    """DTensor placements (one per mesh dimension) as a partition spec (one mesh dimension index or None per
    tensor dimension); only ``Shard`` and ``Replicate`` placements have one.

    Example::

        convert_to_xla_partition_spec(torch.zeros(4, 8, 8), [Replicate(), Shard(0)])    # (1, None, None)
    """
    xr.use_spmd()
    return placements_to_partition_spec(tensor, placements)


def xla_distribute_tensor(
    tensor: torch.Tensor, device_mesh: DeviceMesh, placements: Sequence[Placement] | None = None
) -> XLAShardedTensor:
    """``tensor`` on the device, laid out over ``device_mesh`` as ``placements`` say (replicated when None),
    as an ``XLAShardedTensor``. A CPU tensor is copied to the device first.

    Example::

        t = xla_distribute_tensor(torch.randn(8, 4), DeviceMesh("xla", torch.arange(4)), [Shard(0)])
    """
    assert device_mesh.device_type == "xla", f"expected an 'xla' DeviceMesh, got {device_mesh.device_type!r}"
    mesh = convert_to_xla_mesh(device_mesh)
    placements = [Replicate() for _ in range(device_mesh.ndim)] if placements is None else list(placements)
    assert len(placements) == device_mesh.ndim, (
        f"`placements` must have the same length as `device_mesh.ndim`: {len(placements)} vs {device_mesh.ndim}"
    )
    if type(tensor).__name__ == "DTensor":
        raise ValueError("Cannot distribute a DTensor with a local tensor on xla devices: give the global tensor")
    if isinstance(tensor, XLAShardedTensor):
        assert tensor.sharding_type == ShardingType.REPLICATED, (
            "the XLAShardedTensor is already split; clear its annotation first (xs.clear_sharding)"
        )
        tensor = tensor.global_tensor
    spec = convert_to_xla_partition_spec(tensor, placements)
    if not tensor.is_meta:
        tensor = tensor.to("xla")
    mark_sharding(tensor, mesh, spec)
    return XLAShardedTensor(tensor, mesh_shape=mesh.mesh_shape, partition_spec=spec)


def xla_distribute_module(
    module: nn.Module,
    device_mesh: DeviceMesh | None = None,
    partition_fn: Callable[[str, nn.Module, DeviceMesh], None] | None = None,
    input_fn: Callable | None = None,
    output_fn: Callable | None = None,
) -> nn.Module:
    """Lay ``module`` out over ``device_mesh``: ``partition_fn(name, submodule, mesh)`` is called for every
    submodule (it marks the parameters it wants split; the rest stay replicated), and ``input_fn`` /
    ``output_fn`` (``(module, inputs_or_outputs, mesh)``) become forward pre- and post-hooks. Returns ``module``.

    Example::

        def shard_linears(name, m, mesh):
            if isinstance(m, nn.Linear):
                xs.mark_sharding(m.weight, convert_to_xla_mesh(mesh), (0, None))
        xla_distribute_module(model.to("xla"), mesh, shard_linears)
    """
    xr.use_spmd()
    if partition_fn is not None:
        if getattr(partition_fn, "__name__", "") == "auto_policy":
            raise NotImplementedError(
                "xla_distribute_module(partition_fn=auto_policy): lazyxla has no automatic sharding; pass a "
                "partition_fn that marks the parameters to split (see docs/migrating-from-torch_xla.md)"
            )
        for name, submodule in module.named_modules():
            partition_fn(name, submodule, device_mesh)
    if input_fn is not None:
        pre = _hook(input_fn, device_mesh, "input_fn")
        module.register_forward_pre_hook(lambda mod, inputs: pre(mod, inputs))
    if output_fn is not None:
        post = _hook(output_fn, device_mesh, "output_fn")
        module.register_forward_hook(lambda mod, inputs, outputs: post(mod, outputs))
    return module


def _hook(fn: Callable, device_mesh, what: str) -> Callable:
    """``fn`` called as ``(module, values)``: it takes ``(module, values, mesh)``, or the older ``(values,
    mesh)`` (deprecated in torch_xla too)."""
    count = len(inspect.signature(fn).parameters)
    if count == 3:
        return lambda mod, values: fn(mod, values, device_mesh)
    if count == 2:
        warnings.warn(
            f"an {what} taking (values, device_mesh) is deprecated; take (module, values, device_mesh)", stacklevel=3
        )
        return lambda mod, values: fn(values, device_mesh)
    raise ValueError(f"{what} should take in 3 arguments, but got {count} arguments!")


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
