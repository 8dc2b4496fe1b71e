"""What ``XlaFullyShardedDataParallel`` is built from besides the class itself: the differentiable all-gather,
the end-of-backward marker, the constructor's options that auto-wrapping passes on, and small helpers."""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Iterator

import torch
from torch import nn

from lazyxla.util import map_tensors

# the constructor's arguments that auto-wrapping passes on to the units it creates
_UNIT_OPTIONS = (
    "reshard_after_forward",
    "flatten_parameters",
    "execute_sharding_on_init",
    "optimization_barrier_in_forward",
    "optimization_barrier_in_backward",
    "sync_on_finalization",
    "disable_reshard_on_root",
    "compute_dtype",
    "buffer_dtype",
    "fp32_reduce_scatter",
    "sharding_groups",
    "sharding_rank",
    "sharding_world_size",
    "shard_param_on_dim_0",
    "pin_layout_in_collective_ops",
    "reduce_scatter_bucket_size_mb",
    "coalesce_all_gather_ops",
    "param_init_fn",
    "_shard_size_multiple",
    "_use_xla_patched_linear",
    "_debug_dummy_forward_pass",
    "_debug_msg",
    "_debug_print",
    "_debug_dummy_all_gather_op",
    "_debug_dummy_all_reduce_op",
    "_debug_dummy_reduce_scatter_op",
    "_debug_dummy_optimization_barrier_op",
)
# debugging options of torch_xla that replace the real work by stand-ins: not offered
_DEBUG_DUMMIES = (
    "_debug_dummy_forward_pass",
    "_debug_dummy_all_gather_op",
    "_debug_dummy_all_reduce_op",
    "_debug_dummy_reduce_scatter_op",
)


class _GatherFull(torch.autograd.Function):
    """Forward: a unit's shards all-gathered into padded full tensors. Backward: the gradients reduce-scattered
    back onto the shards (torch_xla does the same in its post-backward hooks)."""

    @staticmethod
    def forward(ctx, unit, *shards):
        # a weak reference: the unit's modules hold the outputs, whose graph holds ctx (through C++, which the
        # garbage collector cannot see), so a strong one would keep a model alive forever
        ctx.unit = weakref.ref(unit)
        ctx.set_materialize_grads(False)
        return tuple(unit._all_gather(shards))

    @staticmethod
    def backward(ctx, *grads):
        unit = ctx.unit()
        return (None, *(unit._reduce_scatter(grads) if unit is not None else [None] * len(grads)))


class _EndOfBackward(torch.autograd.Function):
    """The identity on every shard of the root's tree, applied at the start of the root's forward: every unit
    gathers from its outputs, so autograd runs its backward after the last reduce-scatter, where torch_xla's
    root runs its end-of-backward callback (free what is still gathered, reset the units)."""

    @staticmethod
    def forward(ctx, root, *shards):
        ctx.root = weakref.ref(root)  # weak, as _GatherFull's unit
        ctx.set_materialize_grads(False)
        return tuple(s.view_as(s) for s in shards)

    @staticmethod
    def backward(ctx, *grads):
        root = ctx.root()
        if root is not None:
            root._finish_backward()
        return (None, *grads)


def _tensors_in(obj) -> Iterator[torch.Tensor]:
    """The tensors in nested dicts, lists and tuples (a model's outputs), without rebuilding them."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from _tensors_in(v)


def _defines_forward(module: nn.Module) -> bool:
    forward = getattr(module, "forward", None)
    return getattr(forward, "__func__", None) not in (None, nn.Module.forward)


def _materialize_module(module: nn.Module, param_init_fn: Callable | None) -> None:
    """Give a module built on the meta device real (CPU) parameters: ``param_init_fn(module)`` or, without one,
    ``to_empty`` then ``reset_parameters()``, as torch_xla does."""
    if not any(p.is_meta for p in module.parameters()):
        return
    if param_init_fn is not None:
        if not callable(param_init_fn):
            raise ValueError(f"Expected {param_init_fn} to be callable but got {type(param_init_fn)}")
        param_init_fn(module)
        return
    module.to_empty(device="cpu")
    try:
        with torch.no_grad():
            module.reset_parameters()
    except BaseException as e:
        warnings.warn(
            f"Unable to call `reset_parameters()` for module on meta device with error {e}. Please ensure your "
            "module implements a `reset_parameters()` method.",
            stacklevel=3,
        )
        raise


def _cast_floating(dtype: torch.dtype, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    cast = functools.partial(_cast_if_floating, dtype)
    return map_tensors(args, cast), map_tensors(kwargs, cast)


def _cast_if_floating(dtype: torch.dtype, t: torch.Tensor) -> torch.Tensor:
    return t.to(dtype) if torch.is_floating_point(t) and t.dtype != dtype else t
