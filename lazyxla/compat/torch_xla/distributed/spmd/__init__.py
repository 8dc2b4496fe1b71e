"""``torch_xla.distributed.spmd`` (``xs``) on lazyxla: meshes and sharding annotations.

``xs.Mesh``/``xs.HybridMesh`` describe the logical device mesh as in torch_xla (``device_ids`` raveled in
C order into ``mesh_shape``; axes named or addressed by index); ``xs.mark_sharding(t, mesh, spec)``
annotates ``t`` through ``lazyxla.spmd.mark_sharding`` and XLA's partitioner does the rest. Partition
specs take axis names, axis indices, ``None`` and tuples of those, as in torch_xla. ``mark_sharding``
annotates the tensor in place and, as torch_xla's does, returns it wrapped in an ``XLAShardedTensor`` that
records the mesh shape and spec (DTensor placements, ``redistribute``, local shards; ops on the wrapper run on
the tensor it wraps); ``wrap_if_sharded`` and ``wrap_as_sharded_tensor`` give that view of any tensor, and
``xla_distribute_tensor`` (what ``torch.distributed.tensor.distribute_tensor`` calls for an ``'xla'`` mesh)
returns one.

Example::

    import numpy as np
    import torch_xla.runtime as xr
    import torch_xla.distributed.spmd as xs
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n, 1), ("data", "model"))
    xs.mark_sharding(x, mesh, ("data", None))
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Placement, Replicate

import lazyxla
from lazyxla.compat._common import missing_attribute, stub
from lazyxla.compat.torch_xla import runtime as xr
from lazyxla.compat.torch_xla.distributed.spmd.linear import (
    EinsumLinear,
    XLAPatchedLinear,
    apply_xla_patch_to_nn_linear,
    xla_patched_nn_linear_forward,
)
from lazyxla.compat.torch_xla.distributed.spmd.xla_sharded_tensor import (
    ShardingType,
    XLAShard,
    XLAShardedTensor,
    placements_to_partition_spec,
)
from lazyxla.device.devices import on_device
from lazyxla.lazy.special import upload

__all__ = [
    "EinsumLinear",
    "HybridMesh",
    "MarkShardingFunction",
    "Mesh",
    "ShardingSpec",
    "ShardingType",
    "XLAPatchedLinear",
    "XLAShard",
    "XLAShardedTensor",
    "apply_backward_optimization_barrier",
    "apply_xla_patch_to_nn_linear",
    "auto_policy",
    "clear_sharding",
    "get_1d_mesh",
    "get_global_mesh",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "set_global_mesh",
    "unwrap_sharded_tensor",
    "wrap_as_sharded_tensor",
    "wrap_if_sharded",
    "xla_distribute_module",
    "xla_distribute_tensor",
    "xla_patched_nn_linear_forward",
]

_state: dict[str, Any] = {"global_mesh": None}


def _check_mesh(ids: np.ndarray, shape: tuple[int, ...], names: tuple | None) -> None:
    """torch_xla's checks of a mesh, in its order and with its words; like torch_xla's (``assert`` statements),
    they raise ``AssertionError``. (The ids are checked against the run's devices when the mesh is first used.)"""
    if names is not None and len(names) != len(shape):
        raise AssertionError(f"Number of axis names ({len(names)}) must match mesh dimensions ({len(shape)})")
    if names is not None and len(set(names)) != len(names):
        raise AssertionError(f"Axis names must be unique, got: {names}")
    if len(ids) != int(np.prod(shape)):
        raise AssertionError(f"Number of device IDs ({len(ids)}) must match mesh size ({int(np.prod(shape))})")
    if len(np.unique(ids)) != len(ids):
        raise AssertionError(f"Device IDs must be unique, got: {ids}")
    if not all(0 <= int(d) < len(ids) for d in ids):
        raise AssertionError(f"Device IDs must be less than mesh size ({len(ids)}), got: {ids}")


class Mesh:
    """A logical device mesh: ``device_ids`` (a permutation of the run's device indices) laid out in C order
    as ``mesh_shape``, with optional ``axis_names``.

    Example::

        mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
        mesh.shape()              # OrderedDict([('data', 4), ('model', 2)])
        mesh.get_logical_mesh()   # array([[0, 1], [2, 3], [4, 5], [6, 7]])
    """

    def __init__(self, device_ids, mesh_shape: Sequence[int], axis_names: Sequence[str] | None = None) -> None:
        ids = np.asarray(device_ids).reshape(-1)
        shape = tuple(int(s) for s in mesh_shape)
        names = None if axis_names is None else tuple(axis_names)
        _check_mesh(ids, shape, names)
        self.device_ids = ids
        self.mesh_shape = shape
        self.axis_names = names
        self._lazy: lazyxla.spmd.Mesh | None = None

    def size(self) -> int:
        """Devices in the mesh."""
        return int(np.prod(self.mesh_shape))

    def shape(self) -> OrderedDict:
        """Axis name (or index) -> size."""
        keys = self.axis_names if self.axis_names is not None else range(len(self.mesh_shape))
        return OrderedDict(zip(keys, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        """The device ids in the mesh's shape."""
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> int | None:
        """The index of axis ``name``, or None."""
        if self.axis_names is None or name not in self.axis_names:
            return None
        return self.axis_names.index(name)

    @property
    def lazyxla_mesh(self) -> lazyxla.spmd.Mesh:
        """The ``lazyxla.spmd.Mesh`` behind this mesh (built at first use: it needs the run's devices)."""
        if self._lazy is None:
            names = self.axis_names or tuple(f"axis{i}" for i in range(len(self.mesh_shape)))
            self._lazy = lazyxla.spmd.Mesh(self.device_ids.tolist(), self.mesh_shape, names)
        return self._lazy

    def get_jax_mesh(self) -> jax.sharding.Mesh:
        """This mesh as a ``jax.sharding.Mesh`` over the run's jax devices (for ``shard_map`` in a JAX function).

        Example::

            jax_mesh = mesh.get_jax_mesh()        # devices laid out as mesh_shape, same axis names
        """
        return self.lazyxla_mesh.jax_mesh

    def _spec(self, partition_spec: Sequence) -> tuple:
        """``partition_spec`` with axis indices replaced by the lazyxla mesh's axis names."""
        names = self.lazyxla_mesh.axis_names

        def one(entry):
            if entry is None:
                return None
            if isinstance(entry, tuple):
                if any(isinstance(e, tuple) for e in entry):
                    raise ValueError("Partition spec cannot contain nested tuples")
                return tuple(one(e) for e in entry)
            if isinstance(entry, (int, np.integer)) and not isinstance(entry, bool):
                if not 0 <= int(entry) < len(names):
                    raise ValueError(f"partition spec entry {entry} is not an axis of the mesh {self.mesh_shape}")
                return names[int(entry)]
            if isinstance(entry, str):
                if entry not in names:
                    raise ValueError(f"Axis name {entry} is not defined in the given mesh")
                return entry
            raise ValueError(f"Spec type {type(entry)} is not supported in partition spec")

        return tuple(one(e) for e in partition_spec)

    def __repr__(self) -> str:
        ids = self.device_ids.tolist()
        return f"Mesh(device_ids={ids}, mesh_shape={self.mesh_shape}, axis_names={self.axis_names})"


class HybridMesh(Mesh):
    """A mesh over slices (DCN) of devices (ICI): axis ``i`` spans ``dcn_mesh_shape[i]`` processes times
    ``ici_mesh_shape[i]`` devices of each (``lazyxla.spmd.hybrid_mesh``); with one slice it is a plain mesh.

    Example::

        mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("data", "model"))
    """

    def __init__(
        self,
        *,
        ici_mesh_shape: Sequence[int],
        dcn_mesh_shape: Sequence[int] | None = None,
        axis_names: Sequence[str] | None = None,
    ) -> None:
        ici = tuple(int(s) for s in ici_mesh_shape)
        dcn = tuple(int(s) for s in dcn_mesh_shape) if dcn_mesh_shape is not None else (1,) * len(ici)
        if len(ici) != len(dcn):
            raise ValueError("HybridMesh: ici_mesh_shape and dcn_mesh_shape need the same length")
        self.ici_mesh_shape, self.dcn_mesh_shape = ici, dcn
        shape = tuple(i * d for i, d in zip(ici, dcn))
        if int(np.prod(dcn)) > 1:
            names = tuple(axis_names) if axis_names is not None else tuple(f"axis{i}" for i in range(len(ici)))
            ids = lazyxla.spmd.hybrid_mesh(ici, dcn, names).device_ids
        else:
            ids = list(range(int(np.prod(shape))))
        super().__init__(ids, shape, axis_names)


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """A 1-D mesh over every device of the run.

    Example::

        mesh = xs.get_1d_mesh("data")
    """
    n = lazyxla.spmd.device_count()
    return Mesh(np.arange(n), (n,), None if axis_name is None else (axis_name,))


def set_global_mesh(mesh: Mesh | None) -> None:
    """Remember ``mesh`` as the process's mesh (what :func:`get_global_mesh` returns; None forgets it).

    Example::

        xs.set_global_mesh(mesh)
    """
    _state["global_mesh"] = mesh
    lazyxla.spmd.set_global_mesh(None if mesh is None else mesh.lazyxla_mesh)


def get_global_mesh() -> Mesh | None:
    """The mesh given to :func:`set_global_mesh`, or None.

    Example::

        mesh = xs.get_global_mesh()
    """
    return _state["global_mesh"]


def unwrap_sharded_tensor(t: torch.Tensor) -> torch.Tensor:
    """The device tensor behind an ``XLAShardedTensor`` (any other tensor as it is).

    Example::

        w = xs.unwrap_sharded_tensor(xs.wrap_if_sharded(w))
    """
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t


def mark_sharding(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence) -> XLAShardedTensor:
    """Annotate ``t`` in place with ``partition_spec`` over ``mesh`` (one entry per dimension: an axis name or
    index, ``None``, or a tuple of those) and return it as an ``XLAShardedTensor`` recording ``mesh.mesh_shape``
    and ``partition_spec``, as torch_xla does (``t`` itself when it already is one). Needs SPMD mode
    (``xr.use_spmd()``).

    Example::

        xs.mark_sharding(x, mesh, ("data", None))            # batch split over 'data'
        st = xs.mark_sharding(linear.weight, mesh, (None, 1)) # by axis index
        st.global_tensor is linear.weight                     # True
        st.redistribute(mesh, [Replicate(), Shard(0)])        # laid out again, DTensor style
    """
    inner = unwrap_sharded_tensor(t)
    if len(partition_spec) != len(inner.shape):
        raise ValueError(
            f"Partition spec length ({len(partition_spec)}) should be equal to the input rank ({len(inner.shape)})."
        )
    lazyxla.spmd.mark_sharding(inner, mesh.lazyxla_mesh, mesh._spec(partition_spec))
    return wrap_as_sharded_tensor(t, mesh.mesh_shape, tuple(partition_spec))


def mark_sharding_with_gradients(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence) -> torch.Tensor:
    """A new tensor equal to ``t`` laid out by ``partition_spec``, whose gradient is laid out the same way
    (``t`` itself is left as it is): it guides the layouts of intermediate values and of the backward pass.

    Example::

        h = xs.mark_sharding_with_gradients(h, mesh, ("data", None, "model"))
    """
    if len(partition_spec) != len(t.shape):
        raise ValueError(
            f"Partition spec length ({len(partition_spec)}) should be equal to the input rank ({len(t.shape)})."
        )
    return MarkShardingFunction.apply(t, mesh, partition_spec)


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
        return _marked_copy(t, mesh, partition_spec)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return _marked_copy(grad_output, ctx.mesh, ctx.partition_spec), None, None


def _marked_copy(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence) -> torch.Tensor:
    """A copy of ``t`` annotated with ``partition_spec``: a plain tensor, as torch_xla's custom op gives (not the
    ``XLAShardedTensor`` ``mark_sharding`` returns)."""
    out = t.clone()
    mark_sharding(out, mesh, partition_spec)
    return out


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Drop ``t``'s annotation (it becomes replicated); returns ``t`` (for an ``XLAShardedTensor``, the
    device tensor it wraps).

    Example::

        xs.clear_sharding(x)
    """
    return lazyxla.spmd.clear_sharding(unwrap_sharded_tensor(t))


def wrap_if_sharded(x: Any) -> Any:
    """``x`` as an ``XLAShardedTensor`` when it is a device tensor laid out over several devices (SPMD
    mode), else ``x`` itself.

    Example::

        w = xs.wrap_if_sharded(model.fc1.weight)
        if isinstance(w, xs.XLAShardedTensor):
            print([s.indices for s in w.local_shards])
    """
    device_tensor = isinstance(x, torch.Tensor) and not isinstance(x, XLAShardedTensor) and on_device(x)
    if device_tensor and lazyxla.spmd.is_enabled() and lazyxla.spmd.get_sharding(x) is not None:
        return XLAShardedTensor(x)
    return x


def wrap_as_sharded_tensor(t: torch.Tensor, mesh_shape=None, partition_spec=None) -> XLAShardedTensor:
    """``t`` as an ``XLAShardedTensor`` that records ``mesh_shape`` and ``partition_spec`` (mesh-axis indices,
    one per dimension) for its DTensor ``_spec``/``placements``; given an ``XLAShardedTensor``, updates it (and
    forgets its cached spec). It records the description only: ``mark_sharding`` lays the data out.

    Example::

        st = xs.wrap_as_sharded_tensor(x, mesh_shape=(4,), partition_spec=(0, None))
        st.placements        # (Shard(dim=0),)
    """
    if not isinstance(t, XLAShardedTensor):
        return XLAShardedTensor(t, mesh_shape=mesh_shape, partition_spec=partition_spec)
    if mesh_shape is not None:
        t.mesh_shape = mesh_shape
    if partition_spec is not None:
        t.partition_spec = partition_spec
    if mesh_shape is not None or partition_spec is not None:
        t.invalidate_spec_cache()
    return t


@dataclasses.dataclass
class ShardingSpec:
    """How a data loader lays batches out: ``mesh`` and ``partition_spec`` for every tensor of that rank
    (others stay replicated). ``minibatch=True``: each process loads only its part of the global batch.

    Example::

        loader = pl.MpDeviceLoader(loader, dev, input_sharding=xs.ShardingSpec(mesh, ("data", None)))
    """

    mesh: Mesh
    partition_spec: tuple
    minibatch: bool = False

    def can_apply(self, t: torch.Tensor) -> bool:
        """Whether the spec fits ``t`` (same rank)."""
        return len(t.shape) == len(self.partition_spec)

    def apply(self, t: torch.Tensor) -> None:
        """Annotate the device tensor ``t``."""
        mark_sharding(t, self.mesh, self.partition_spec)

    def _annotate(self, t: torch.Tensor) -> torch.Tensor:
        if on_device(t) and self.can_apply(t):
            mark_sharding(t, self.mesh, self.partition_spec)
        return t

    def _move(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A CPU batch tensor on the device, laid out by the spec."""
        if not self.can_apply(t):
            return upload(t, device)
        if self.minibatch:
            return lazyxla.spmd.from_local(t, self.mesh.lazyxla_mesh, self.mesh._spec(self.partition_spec))
        out = upload(t, device)  # not t.to: a loader's thread must record nothing (lazyxla.lazy.special.upload)
        mark_sharding(out, self.mesh, self.partition_spec)
        return out


_ALTERNATIVE = "xs.mark_sharding(t, mesh, spec) / lazyxla.spmd.mark_sharding, lazyxla.spmd.fsdp(module, mesh)"
enable_manual_sharding = stub("torch_xla.distributed.spmd.enable_manual_sharding", "lazyxla.spmd.from_local")
disable_manual_sharding = stub("torch_xla.distributed.spmd.disable_manual_sharding", _ALTERNATIVE)


# --- torch.distributed.tensor's entry points (torch_xla.distributed.spmd.api) -----------------------------


def apply_backward_optimization_barrier(m: nn.Module) -> None:
    """Put ``m``'s parameter gradients and input gradients through one XLA optimization barrier when its backward
    runs (a full backward hook, as torch_xla's), so the compiler does not fuse ``m``'s backward with the rest.

    Example::

        xs.apply_backward_optimization_barrier(model.layers[3])
    """

    def optimization_barrier(module: nn.Module, grad_input, grad_output) -> None:
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        lazyxla.optimization_barrier_([t for t in grads + list(grad_input) if isinstance(t, torch.Tensor)])

    m.register_full_backward_hook(optimization_barrier)


def auto_policy(mod_name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
    """The ``partition_fn`` that asks ``xla_distribute_module`` for auto-sharding (it does nothing itself, as in
    torch_xla): the module goes to the device in auto-sharding mode (``xr.use_spmd(auto=True)``), where lazyxla
    splits each parameter over every device on its first dimension they divide (see ``xla_distribute_module``).

    Example::

        model = xla_distribute_module(Net(), DeviceMesh("xla", list(range(n))), auto_policy)   # a CPU module
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
    ``partition_fn=auto_policy`` takes a module on the CPU, moves it to the device in auto-sharding mode and splits
    each parameter over every device on its first dimension they divide (lazyxla's stand-in for XLA's auto-sharding
    pass: see ``torch_xla.runtime.use_spmd``).

    Example::

        def shard_linears(name, m, mesh):
            if isinstance(m, nn.Linear):
                xs.mark_sharding(m.weight, convert_to_xla_mesh(mesh), (0, None))
        xla_distribute_module(model.to("xla"), mesh, shard_linears)
    """
    if getattr(partition_fn, "__name__", "") == "auto_policy":
        return _distribute_auto(module, input_fn, output_fn, device_mesh)
    xr.use_spmd()
    if partition_fn is not None:
        for name, submodule in module.named_modules():
            partition_fn(name, submodule, device_mesh)
    return _with_hooks(module, input_fn, output_fn, device_mesh)


AUTO_AXIS = "auto"  # the mesh axis auto-sharding splits parameters over: every device of the run


def _distribute_auto(module: nn.Module, input_fn, output_fn, device_mesh) -> nn.Module:
    """``partition_fn=auto_policy``: as torch_xla, a module still on the CPU goes to the device in auto-sharding
    mode (the given mesh is not used: torch_xla's pass picks its own). Where torch_xla runs XLA's auto-sharding
    pass, which jax offers no public way to run (and the CPU compiler of jaxlib 0.10 leaves every value replicated
    when asked through the compile options), lazyxla applies a fixed policy: each parameter split over all devices
    on its first dimension they divide, the rest replicated (``lazyxla.spmd.fsdp`` over a 1-D mesh); XLA's
    partitioner propagates these layouts through the program. The numbers are the unsharded model's."""
    first = next(module.parameters(), None)
    assert first is None or not on_device(first), (
        "xla_distribute_module(partition_fn=auto_policy) needs the module on the CPU: it moves it to the device"
    )
    xr.use_spmd(auto=True)
    module = module.to(lazyxla.device())
    lazyxla.spmd.fsdp(module, lazyxla.spmd.mesh((-1,), (AUTO_AXIS,)), AUTO_AXIS)
    return _with_hooks(module, input_fn, output_fn, device_mesh)


def _with_hooks(module: nn.Module, input_fn, output_fn, device_mesh) -> nn.Module:
    """``module`` with ``input_fn`` / ``output_fn`` as forward pre- and post-hooks."""
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
