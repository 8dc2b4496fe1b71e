"""``torch_xla.experimental.spmd_fully_sharded_data_parallel`` on lazyxla: FSDPv2, fully sharded data parallelism
written as SPMD sharding annotations.

``SpmdFullyShardedDataParallel(module, mesh=...)`` (FSDPv2) splits every parameter of ``module`` over the mesh
axis named ``'fsdp'`` (along its largest dimension) and, after each forward, the output's batch dimension over
the same axis; XLA's partitioner then inserts the all-gathers of the parameters and the reduce-scatters of their
gradients (there are no hand-written collectives), and the optimizer's state, made from the parameters, is laid
out like them. Each device holds ``1/N`` of the parameters and of the optimizer state. Inputs are sharded on their
batch dimension by the user (``xs.mark_sharding(x, mesh, ('fsdp', None))`` or ``pl.MpDeviceLoader(...,
input_sharding=xs.ShardingSpec(mesh, ('fsdp', None)))``).

Differences from torch_xla: a parameter is split along its largest dimension that the ``'fsdp'`` axis divides
(torch_xla pads the largest one) and one with no such dimension stays replicated (lazyxla keeps an uneven layout
only on the tensor it was put on: the optimizer's updates would come back replicated along it); torch_xla's
optimization barrier on each wrapped module's gradients (a hint against large fusions) has no lazyxla counterpart
and is left out: it changes no value.

Example::

    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n, 1), ("fsdp", "model"))
    model = FSDPv2(model, mesh=mesh)
    xs.mark_sharding(x, mesh, ("fsdp", None))
    loss = model(x).sum(); loss.backward(); opt.step()
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import lazyxla
from lazyxla.compat.torch_xla.distributed import spmd as xs

__all__ = ["SpmdFullyShardedDataParallel"]


def _sharded_dim(shape: tuple[int, ...], parts: int) -> int | None:
    """The dimension FSDPv2 splits a parameter along: its largest one that ``parts`` divides (the first of
    equal ones), or None."""
    fits = [d for d, size in enumerate(shape) if size % parts == 0]
    return max(fits, key=lambda d: (shape[d], -d)) if fits else None


def _param_spec(param: torch.Tensor, mesh: xs.Mesh) -> tuple | None:
    """The partition spec of a parameter: ``'fsdp'`` on its sharded dimension; None to leave it replicated."""
    dim = _sharded_dim(tuple(param.shape), mesh.shape()["fsdp"])
    if dim is None:
        return None
    spec = [None] * param.dim()
    spec[dim] = "fsdp"
    return tuple(spec)


def _output_spec(output: torch.Tensor, extra_data_axis: str | None) -> tuple:
    """The partition spec of an output: its first (batch) dimension over ``'fsdp'`` (and ``extra_data_axis``)."""
    spec: list[Any] = [None] * output.dim()
    if spec:
        spec[0] = (extra_data_axis, "fsdp") if extra_data_axis else "fsdp"
    return tuple(spec)


def _default_shard_output(extra_data_axis: str | None) -> Callable:
    """torch_xla's default ``shard_output``: the output, or the first element of a tuple output, split on its
    batch dimension."""

    def shard_output(output, mesh: xs.Mesh) -> None:
        real = None
        if isinstance(output, torch.Tensor):
            real = output
        elif isinstance(output, tuple):
            real = output[0] if output and isinstance(output[0], torch.Tensor) else None
            warnings.warn(
                "The output is a tuple, but only the first element is sharded. If this is not intended, please "
                "provide your own shard_output callable.",
                stacklevel=3,
            )
        if real is None:
            raise RuntimeError(
                f"The output type is not supported: {type(output)}. Please provide your own shard_output callable."
            )
        xs.mark_sharding(real, mesh, _output_spec(real, extra_data_axis))

    return shard_output


def _wrap_children(module: nn.Module, policy: Callable, wrapper: Callable, root: bool) -> tuple[nn.Module, int]:
    """torch_xla's auto-wrap: ``policy(module=, recurse=True, unwrapped_params=)`` says whether to look inside
    ``module``, ``policy(..., recurse=False, ...)`` whether to wrap it (never the root); returns the module (or its
    wrapper) and how many parameters are wrapped below it."""
    total = sum(p.numel() for p in module.parameters())
    if not policy(module=module, recurse=True, unwrapped_params=total):
        return module, 0
    wrapped = 0
    for name, child in module.named_children():
        new, count = _wrap_children(child, policy, wrapper, root=False)
        setattr(module, name, new)
        wrapped += count
    if not root and policy(module=module, recurse=False, unwrapped_params=total - wrapped):
        return wrapper(module), total
    return module, wrapped


class SpmdFullyShardedDataParallel(nn.Module):
    """FSDPv2: ``module``'s parameters split over the mesh axis ``'fsdp'``, its output's batch dimension too.

    ``mesh`` (default: ``xs.get_global_mesh()``) must have an axis named ``'fsdp'``. ``shard_output(output, mesh)``
    annotates the forward's output (default: the output, or the first element of a tuple, on its batch
    dimension). ``auto_wrap_policy`` (torch_xla's ``transformer_auto_wrap_policy`` & co., called as
    ``policy(module=, recurse=, unwrapped_params=)``) wraps matching submodules first, each with
    ``auto_wrapper_callable`` (default: this class), so that their outputs are annotated too.
    ``extra_data_axis``: a second mesh axis the output's batch dimension is split over (multi-slice data
    parallelism). Parameters already annotated (an inner wrapper, or the user's ``xs.mark_sharding``) are kept.

    Example::

        model = FSDPv2(model, mesh=mesh, auto_wrap_policy=functools.partial(
            transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer}))
        model = FSDPv2(model, mesh=mesh, shard_output=lambda out, mesh: xs.mark_sharding(
            out.logits, mesh, ("fsdp", None, None)))
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        mesh: xs.Mesh | None = None,
        shard_output: Callable | None = None,
        auto_wrap_policy: Callable | None = None,
        auto_wrapper_callable: Callable | None = None,
        extra_data_axis: str | None = None,
    ) -> None:
        if isinstance(module, SpmdFullyShardedDataParallel):
            raise RuntimeError(
                "Cannot wrap a module that is already wrapped with FSDP. For nested FSDP, first wrap the inner "
                "child modules before wrapping the outer parent module."
            )
        if getattr(type(module), "forward", nn.Module.forward) is nn.Module.forward:
            raise RuntimeError(
                "The module wrapped by FSDP *must define a `forward` method and call it during the module's forward "
                "pass for FSDP to work correctly.* Hence, do not wrap `nn.ModuleList` or `nn.ModuleDict` with FSDP "
                "(since they don't have `forward` defined), and call the FSDP-wrapped module itself."
            )
        mesh = mesh if mesh is not None else xs.get_global_mesh()
        if mesh is None:
            raise ValueError("No mesh is provided and no global mesh is set. Please provide a mesh.")
        if mesh.axis_names is None or "fsdp" not in mesh.axis_names:
            raise ValueError("The mesh must have an axis named 'fsdp'.")
        if extra_data_axis and extra_data_axis not in mesh.axis_names:
            raise ValueError(f"The provided {extra_data_axis} axis is not in the mesh.")
        super().__init__()
        if auto_wrap_policy is not None:
            self._auto_wrap(module, auto_wrap_policy, auto_wrapper_callable, mesh, shard_output)
        self._orig_module = module.to(lazyxla.device())
        self._mesh = mesh
        with torch.no_grad():
            for param in module.parameters():
                spec = None if lazyxla.spmd.get_sharding(param) is not None else _param_spec(param, mesh)
                if spec is not None:
                    xs.mark_sharding(param, mesh, spec)
        self._shard_output = shard_output if shard_output is not None else _default_shard_output(extra_data_axis)

    @staticmethod
    def _auto_wrap(module, policy, wrapper_callable, mesh, shard_output) -> None:
        for name, sub in module.named_modules():
            if isinstance(sub, SpmdFullyShardedDataParallel):
                raise ValueError(
                    f"Expected {name} to NOT be SpmdFullyShardedDataParallel if using an `auto_wrap_policy`"
                )
        cls = wrapper_callable or SpmdFullyShardedDataParallel
        _wrap_children(module, policy, lambda m: cls(m, mesh=mesh, shard_output=shard_output), root=True)

    @property
    def module(self) -> nn.Module:
        """The wrapped module (as ``DistributedDataParallel.module``)."""
        return self._orig_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = self.module(*args, **kwargs)
        self._shard_output(output, self._mesh)
        return output

    def __getattr__(self, name: str) -> Any:
        """Attributes the wrapper does not have come from the wrapped module."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def __getitem__(self, key: int) -> nn.Module:
        """Indexing reaches the wrapped module (an ``nn.Sequential``)."""
        return self.module.__getitem__(key)
