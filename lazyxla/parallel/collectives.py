"""Replica collectives, recorded in the step's graph and run by XLA inside the step's program.

A replica is one process of the run (see ``lazyxla.runtime``). Every function takes lazyxla tensors,
checks its arguments at the call, and records one op; the collective runs when the step syncs, in the
same compiled program as the rest of the step. In a single-process run each is the identity (scaled).
List arguments are coalesced: one op for the whole list, and the list's tensors are updated in place
(as torch_xla does); a single tensor gives a new tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lazyxla.device import processes
from lazyxla.device.devices import on_device
from lazyxla.ops import ReduceOp, library, ops

__all__ = [
    "ReduceOp",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "collective_permute",
    "reduce_scatter",
]


def _check_op(op, fn: str) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if type(op) is int and torch.compiler.is_compiling() and op in ReduceOp.__members__.values():
        return ReduceOp(op)  # (Dynamo hands the functions it puts in its graph an enum's value as a plain int)
    raise TypeError(
        f"{fn}: the reduce op must be a lazyxla.ReduceOp (SUM, MUL, MIN, MAX, AND, OR), got {op!r}; "
        "e.g. lazyxla.all_reduce(lazyxla.ReduceOp.SUM, t)"
    )


def _check_tensors(x, fn: str) -> tuple[list[torch.Tensor], bool]:
    many = isinstance(x, (list, tuple))
    tensors = list(x) if many else [x]
    if many and not tensors:
        raise ValueError(f"{fn}: got an empty list of tensors")
    for t in tensors:
        if not isinstance(t, torch.Tensor) or not on_device(t):
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{fn} takes lazyxla tensors, got {where}; move it with .to(lazyxla.device()) first")
    return tensors, many


def _check_groups(groups, fn: str) -> tuple[list[int], int]:
    """Flat member list and group size; [] and 0 for 'every replica in one group'."""
    if groups is None:
        return [], 0
    world = processes.world_size()
    groups = [list(g) for g in groups]
    sizes = {len(g) for g in groups}
    flat = [r for g in groups for r in g]
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"{fn}: every replica group must have the same, non-zero size; got {groups}")
    if sorted(flat) != list(range(world)):
        raise ValueError(
            f"{fn}: the replica groups must split the {world} replicas 0..{world - 1}, each in exactly one "
            f"group; got {groups}"
        )
    size = sizes.pop()
    return ([], 0) if size == world else (flat, size)


def _count(groups: list[int], size: int) -> int:
    return size if groups else processes.world_size()


def _check_dim(t: torch.Tensor, dim: int, fn: str, what: str = "dim") -> int:
    if not -t.dim() <= dim < max(t.dim(), 1):
        raise IndexError(f"{fn}: {what}={dim} is out of range for a {t.dim()}-d tensor")
    return dim % t.dim()


def _in_place(tensors: list[torch.Tensor], results) -> None:
    with torch.no_grad():
        for t, r in zip(tensors, results):
            t.copy_(r)


def all_reduce(op: ReduceOp, x, scale: float = 1.0, groups: Sequence[Sequence[int]] | None = None):
    """Combine ``x`` over the replicas with ``op`` and multiply by ``scale``.

    A tensor gives a new tensor; a list is reduced in place (one coalesced all-reduce) and returned.

    Example::

        grad_mean = lazyxla.all_reduce(lazyxla.ReduceOp.SUM, grad, scale=1 / lazyxla.runtime.world_size())
    """
    op = _check_op(op, "all_reduce")
    tensors, many = _check_tensors(x, "all_reduce")
    flat, size = _check_groups(groups, "all_reduce")
    if not many:
        return ops.all_reduce(x, int(op), float(scale), flat, size)
    _in_place(tensors, ops.all_reduce_coalesced(tensors, int(op), float(scale), flat, size))
    return x


def all_gather(x, dim: int = 0, groups: Sequence[Sequence[int]] | None = None):
    """Concatenate every replica's ``x`` (of its group) along ``dim``, in replica order.

    Example::

        everyone = lazyxla.all_gather(local_preds)     # (world * n, ...)
    """
    tensors, many = _check_tensors(x, "all_gather")
    flat, size = _check_groups(groups, "all_gather")
    dims = {_check_dim(t, dim, "all_gather") for t in tensors}
    if not many:
        return ops.all_gather(x, dims.pop(), flat, size)
    if len(dims) != 1:
        raise ValueError("all_gather of a list: use a non-negative dim valid for every tensor")
    return list(ops.all_gather_coalesced(tensors, dims.pop(), flat, size))


def reduce_scatter(
    op: ReduceOp,
    x,
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: Sequence[Sequence[int]] | None = None,
):
    """Reduce ``x`` over the replicas, then give replica ``i`` (of its group) the ``i``-th of
    ``shard_count`` equal slices along ``scatter_dim``, multiplied by ``scale``.

    Example::

        shard = lazyxla.reduce_scatter(lazyxla.ReduceOp.SUM, grad, 1.0, 0, lazyxla.runtime.world_size())
    """
    op = _check_op(op, "reduce_scatter")
    tensors, many = _check_tensors(x, "reduce_scatter")
    flat, size = _check_groups(groups, "reduce_scatter")
    count = _count(flat, size)
    if shard_count != count:
        raise ValueError(f"reduce_scatter: shard_count={shard_count} must equal the replicas per group ({count})")
    for t in tensors:
        d = _check_dim(t, scatter_dim, "reduce_scatter", "scatter_dim")
        if t.shape[d] % count:
            raise ValueError(
                f"reduce_scatter: dimension {d} of size {t.shape[d]} cannot be split into {count} equal shards"
            )
    if not many:
        return ops.reduce_scatter(x, int(op), float(scale), scatter_dim % x.dim(), count, flat, size)
    if len({scatter_dim % t.dim() for t in tensors}) != 1:
        raise ValueError("reduce_scatter of a list: use a non-negative scatter_dim valid for every tensor")
    dim = scatter_dim % tensors[0].dim()
    return list(ops.reduce_scatter_coalesced(tensors, int(op), float(scale), dim, count, flat, size))


def all_to_all(
    x: torch.Tensor,
    split_dimension: int,
    concat_dimension: int,
    split_count: int,
    groups: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """Split ``x`` into ``split_count`` slices along ``split_dimension``, send slice ``j`` to replica ``j``
    (of the group), and concatenate the slices received along ``concat_dimension``, in replica order.

    Example::

        y = lazyxla.all_to_all(x, 0, 1, lazyxla.runtime.world_size())
    """
    _check_tensors(x, "all_to_all")
    flat, size = _check_groups(groups, "all_to_all")
    count = _count(flat, size)
    if split_count != count:
        raise ValueError(f"all_to_all: split_count={split_count} must equal the replicas per group ({count})")
    sd = _check_dim(x, split_dimension, "all_to_all", "split_dimension")
    cd = _check_dim(x, concat_dimension, "all_to_all", "concat_dimension")
    if x.shape[sd] % count:
        raise ValueError(f"all_to_all: dimension {sd} of size {x.shape[sd]} cannot be split into {count} slices")
    return ops.all_to_all(x, sd, cd, count, flat, size)


def collective_permute(x: torch.Tensor, pairs: Sequence[Sequence[int]]) -> torch.Tensor:
    """Send ``x`` from replica ``src`` to replica ``dst`` for each ``(src, dst)`` in ``pairs``; a replica
    that receives nothing gets zeros.

    Example::

        n = lazyxla.runtime.world_size()
        y = lazyxla.collective_permute(x, [(i, (i + 1) % n) for i in range(n)])   # a ring shift
    """
    _check_tensors(x, "collective_permute")
    world = processes.world_size()
    pairs = [tuple(p) for p in pairs]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"collective_permute: pairs must be (source, target) replica pairs; got {pairs}")
    srcs, dsts = [p[0] for p in pairs], [p[1] for p in pairs]
    if any(not 0 <= r < world for r in srcs + dsts):
        raise ValueError(f"collective_permute: replica indices must be in 0..{world - 1}; got {pairs}")
    if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
        raise ValueError(f"collective_permute: each replica may send once and receive once; got {pairs}")
    return ops.collective_permute(x, [r for p in pairs for r in p])


def broadcast(x, root: int = 0):
    """Every replica gets replica ``root``'s value: a tensor gives a new tensor, a list is updated in place.

    Example::

        lazyxla.broadcast(list(model.parameters()), root=0)   # start every replica from rank 0's weights
    """
    tensors, many = _check_tensors(x, "broadcast")
    world = processes.world_size()
    if not 0 <= root < world:
        raise ValueError(f"broadcast: root={root} is not a replica (0..{world - 1})")
    if not many:
        return ops.broadcast(x, root)
    _in_place(tensors, ops.broadcast_coalesced(tensors, root))
    return x


# --- meta kernels of the collective ops (declared in lazyxla/ops.py) ---------------------------------


def _gathered_shape(x: torch.Tensor, dim: int, count: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] *= count
    return shape


def _scattered_shape(x: torch.Tensor, dim: int, count: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] //= count
    return shape


def _all_to_all_shape(x: torch.Tensor, split_dim: int, concat_dim: int, count: int) -> list[int]:
    shape = list(x.shape)
    shape[split_dim] //= count
    shape[concat_dim] *= count
    return shape


# Meta kernels: shapes only. (The eager CPU versions are not defined: a collective needs the run's
# replicas, so calling one on CPU tensors raises PyTorch's "no kernel for CPU" error.) Registered here,
# not in ops.py, because a gather's output size needs the run's replica count (device/processes.py).
_META = {
    "all_reduce": lambda x, op, scale, groups, gs: torch.empty_like(x),
    "all_reduce_coalesced": lambda xs, op, scale, groups, gs: [torch.empty_like(x) for x in xs],
    "all_gather": lambda x, dim, groups, gs: x.new_empty(_gathered_shape(x, dim, _count(groups, gs))),
    "all_gather_coalesced": lambda xs, dim, groups, gs: [
        x.new_empty(_gathered_shape(x, dim, _count(groups, gs))) for x in xs
    ],
    "reduce_scatter": lambda x, op, scale, dim, count, groups, gs: x.new_empty(_scattered_shape(x, dim, count)),
    "reduce_scatter_coalesced": lambda xs, op, scale, dim, count, groups, gs: [
        x.new_empty(_scattered_shape(x, dim, count)) for x in xs
    ],
    "all_to_all": lambda x, split_dim, concat_dim, count, groups, gs: x.new_empty(
        _all_to_all_shape(x, split_dim, concat_dim, count)
    ),
    "collective_permute": lambda x, pairs: torch.empty_like(x),
    "broadcast": lambda x, root: torch.empty_like(x),
    "broadcast_coalesced": lambda xs, root: [torch.empty_like(x) for x in xs],
}

for _name, _fn in _META.items():
    library.impl(_name, _fn, "Meta")
