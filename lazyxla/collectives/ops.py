"""Replica collectives as ops in the step's graph: defined once as ``torch.ops.lazyxla.*`` ops.

Each collective is a PyTorch operator of the ``lazyxla`` namespace with a meta kernel (its output
shape), so PyTorch's dispatcher, functionalization and lazyxla's recorder treat it like any aten op:
it becomes a node of the graph and is lowered (``lowering/rules/collective.py``) to XLA's collective
inside the same compiled program as the rest of the step. Nothing crosses the host.

Replica groups travel as a flat list of replica indices plus the group size (every group has the same
size, as XLA requires); an empty list means one group of every replica.
"""

from __future__ import annotations

import enum

import torch

_lib = torch.library.Library("lazyxla", "DEF")


class ReduceOp(enum.IntEnum):
    """How ``all_reduce`` and ``reduce_scatter`` combine the replicas' values."""

    SUM = 0
    MUL = 1
    MIN = 2
    MAX = 3
    AND = 4  # logical for bool tensors, bitwise for integer tensors
    OR = 5


_SCHEMAS = {
    "all_reduce": "(Tensor x, int op, float scale, int[] groups, int group_size) -> Tensor",
    "all_reduce_coalesced": "(Tensor[] xs, int op, float scale, int[] groups, int group_size) -> Tensor[]",
    "all_gather": "(Tensor x, int dim, int[] groups, int group_size) -> Tensor",
    "all_gather_coalesced": "(Tensor[] xs, int dim, int[] groups, int group_size) -> Tensor[]",
    "reduce_scatter": (
        "(Tensor x, int op, float scale, int dim, int shard_count, int[] groups, int group_size) -> Tensor"
    ),
    "reduce_scatter_coalesced": (
        "(Tensor[] xs, int op, float scale, int dim, int shard_count, int[] groups, int group_size) -> Tensor[]"
    ),
    "all_to_all": (
        "(Tensor x, int split_dim, int concat_dim, int split_count, int[] groups, int group_size) -> Tensor"
    ),
    "collective_permute": "(Tensor x, int[] pairs) -> Tensor",
    "broadcast": "(Tensor x, int root) -> Tensor",
    "broadcast_coalesced": "(Tensor[] xs, int root) -> Tensor[]",
}

for _name, _schema in _SCHEMAS.items():
    _lib.define(_name + _schema)


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


def _group_count(groups, group_size: int, world: int) -> int:
    return group_size if groups else world


def _world() -> int:
    from lazyxla.device import distributed

    return distributed.world_size()


# Meta kernels: shapes only. (The eager CPU versions are not defined: a collective needs the run's
# replicas, so calling one on CPU tensors raises PyTorch's "no kernel for CPU" error.)
_META = {
    "all_reduce": lambda x, op, scale, groups, gs: torch.empty_like(x),
    "all_reduce_coalesced": lambda xs, op, scale, groups, gs: [torch.empty_like(x) for x in xs],
    "all_gather": lambda x, dim, groups, gs: x.new_empty(_gathered_shape(x, dim, _group_count(groups, gs, _world()))),
    "all_gather_coalesced": lambda xs, dim, groups, gs: [
        x.new_empty(_gathered_shape(x, dim, _group_count(groups, gs, _world()))) for x in xs
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
    _lib.impl(_name, _fn, "Meta")

ops = torch.ops.lazyxla
COLLECTIVE_OPS = frozenset(getattr(ops, name).default for name in _SCHEMAS)
