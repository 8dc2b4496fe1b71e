"""State-dict helpers of the SPMD checkpoint planners: host copies of sharded tensors (``_CpuShards``),
flattening nested state dicts to dotted keys and back, and which values are split over devices.

Example::

    cpu_state = _sharded_cpu_state_dict(model.state_dict())   # split tensors become _CpuShards, others CPU
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from lazyxla import torch_private
from lazyxla.compat.torch_xla.distributed.spmd import ShardingType, XLAShard, XLAShardedTensor, wrap_if_sharded
from lazyxla.device.devices import on_device

PATH = tuple  # the keys (str) and list positions (int) that lead to a value in a nested state dict


@dataclasses.dataclass
class _CpuShards:
    """Host copies of the parts this process's devices hold of a split tensor, and its global shape."""

    shards: list[XLAShard]
    global_shape: torch.Size


def _is_sharded_tensor(x: Any) -> bool:
    """Whether ``x`` is an ``XLAShardedTensor`` whose data is split over the devices (not replicated)."""
    return isinstance(x, XLAShardedTensor) and x.sharding_type != ShardingType.REPLICATED


def _unwrap_xla_sharded_tensor(x: Any) -> Any:
    return x.global_tensor if isinstance(x, XLAShardedTensor) else x


def _to_cpu(x: Any) -> Any:
    x = wrap_if_sharded(x)
    if _is_sharded_tensor(x):
        return _CpuShards(shards=x.local_shards, global_shape=x.shape)
    x = _unwrap_xla_sharded_tensor(x)
    if isinstance(x, torch.Tensor) and on_device(x):
        return x.detach().cpu()
    return x


def _sharded_cpu_state_dict(state_dict: dict) -> dict:
    """``state_dict`` on the host: split device tensors become ``_CpuShards`` (this process's parts), other
    device tensors CPU copies; everything else stays as it is. An asynchronous save writes it while training
    goes on.

    Example::

        cpu_state = _sharded_cpu_state_dict({"model": model.state_dict()})
    """
    leaves, spec = torch_private.tree_flatten(state_dict)
    return torch_private.tree_unflatten([_to_cpu(x) for x in leaves], spec)


def _holds_values(value: Any) -> bool:
    """Whether ``value`` is a container with a tensor or ``_CpuShards`` somewhere inside (such containers are
    walked into when flattening; others are kept whole, as torch.distributed.checkpoint does)."""
    if isinstance(value, Mapping):
        entries = value.values()
    elif isinstance(value, list):
        entries = value
    else:
        return False
    return any(isinstance(e, (torch.Tensor, _CpuShards)) or _holds_values(e) for e in entries)


def flatten_state_dict(state_dict: dict) -> tuple[dict, dict[str, PATH]]:
    """A one-level dict of ``state_dict``'s values under dotted keys (``{"a": {"b": t}}`` -> ``{"a.b": t}``),
    and the path of each key, for :func:`set_element`.

    Example::

        flat, paths = flatten_state_dict({"model": model.state_dict(), "step": 3})
    """
    flat: dict = {}
    paths: dict[str, PATH] = {}

    def visit(path: PATH, value: Any) -> None:
        if _holds_values(value):
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            for key, entry in items:
                visit(path + ((str(key) if isinstance(value, Mapping) else key),), entry)
            return
        name = ".".join(map(str, path))
        if name in flat:
            raise ValueError(f"two values of the state dict flatten to the same key {name!r}")
        flat[name], paths[name] = value, path

    for key, value in state_dict.items():
        visit((str(key),), value)
    return flat, paths


def set_element(root: dict, path: PATH, value: Any) -> None:
    """Put ``value`` at ``path`` in the nested ``root`` (making the dicts and lists on the way).

    Example::

        set_element(state, ("optim", "state", 0, "step"), torch.tensor(3.0))
    """
    container: Any = root
    for key, following in zip(path[:-1], path[1:]):
        empty: Any = {} if isinstance(following, str) else []
        if isinstance(container, Mapping):
            container = container.setdefault(key, empty)
        else:
            container.extend([None] * (key + 1 - len(container)))
            if container[key] is None:
                container[key] = empty
            container = container[key]
    last = path[-1]
    if isinstance(last, int):
        container.extend([None] * (last + 1 - len(container)))
    container[last] = value


def narrow_tensor_by_index(tensor: torch.Tensor, offsets, sizes) -> torch.Tensor:
    """The part of ``tensor`` of ``sizes`` starting at ``offsets`` (a view).

    Example::

        narrow_tensor_by_index(torch.zeros(4, 4), (2, 0), (2, 4)).shape    # (2, 4)
    """
    for dim, (offset, size) in enumerate(zip(offsets, sizes)):
        if size < tensor.size(dim):
            tensor = tensor.narrow(dim, offset, size)
    return tensor
