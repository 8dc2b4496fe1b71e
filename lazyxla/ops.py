"""Every ``torch.ops.lazyxla.*`` operator, declared once (one ``torch.library`` DEF library).

- Replica collectives (``all_reduce``, ``all_gather``, ...): each is a PyTorch operator with a meta kernel
  (its output shape; registered by ``parallel/collectives.py``, which knows the run's replicas), so
  PyTorch's dispatcher, functionalization and lazyxla's recorder treat it like any aten op: it becomes a
  node of the graph and is lowered (``lowering/rules/collective.py``) to XLA's collective inside the same
  compiled program as the rest of the step. Nothing crosses the host. Replica groups travel as a flat list
  of replica indices plus the group size (every group has the same size, as XLA requires); an empty list
  means one group of every replica.
- ``shard(x, mesh, spec)``: an SPMD sharding constraint (``lazyxla.spmd.mark_sharding`` on a pending value).
- ``compiled_graph(inputs, graph)``: one call of a ``torch.compile`` graph (``frontend/dynamo.py``);
  ``compiled_graph_collective`` for a graph that holds replica collectives.
- ``dynamic_select``, ``dynamic_slice``, ``dynamic_select_scatter``, ``dynamic_slice_scatter``: ``select``,
  ``slice`` (step 1, ``size`` elements) and their scatters at a position that is a program input (a ``Scalar``)
  rather than a constant: what ``lazy/positions.py`` records for a position that changes from sync to sync.
  The recorder checks the position; it is non-negative and in range.
- ``scan(inputs, body, length)``: a loop of ``length`` iterations over one traced body (``frontend/scan.py``).
- ``optimization_barrier(xs)``: the same values, through XLA's optimization barrier (``lazy/barrier.py``).
- ``call_jax(inputs, fn)``: one call of a user's JAX function (``lazyxla.call_jax``, ``frontend/jax_interop.py``);
  ``fn`` names the function by the digest of its jaxpr (``lowering/rules/jax_call.py``).

Example::

    from lazyxla.ops import ops
    y = ops.all_reduce(x, int(ReduceOp.SUM), 1.0, [], 0)      # what lazyxla.all_reduce records
"""

from __future__ import annotations

import enum

import torch

library = torch.library.Library("lazyxla", "DEF")  # the one definition of the namespace


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
    library.define(_name + _schema)

# An SPMD sharding annotation on a pending value (mesh: the mesh's key; spec: the partition spec as JSON).
library.define("shard(Tensor x, str mesh, str spec) -> Tensor")
library.impl("shard", lambda x, mesh, spec: torch.empty_like(x), "Meta")

# ``x`` laid out as ``like`` is, whatever that layout is (jax.experimental.shard_alike): in SPMD mode the gradients a
# loop's backward gives (frontend/scan.py) take the layouts of the loop's inputs, as torch_xla's scan makes them.
library.define("shard_like(Tensor x, Tensor like) -> Tensor")
library.impl("shard_like", lambda x, like: torch.empty_like(x), "Meta")

# One call of a torch.compile graph: ``graph`` is the digest of its traced IR (see frontend/dynamo.py). A graph
# that holds replica collectives (xm.all_reduce inside a compiled function) is ``compiled_graph_collective``: the
# program that runs it spans the run's replicas, as one with a collective of its own.
library.define("compiled_graph(Tensor[] inputs, str graph) -> Tensor[]")
library.define("compiled_graph_collective(Tensor[] inputs, str graph) -> Tensor[]")

# Positions that are program inputs (``Scalar``): lazy/positions.py records them, normalized and in range. The
# CPU kernels (PyTorch's own ops) give the recorder's check of each new call signature its errors; the meta
# kernels are the same code on meta tensors.
_POSITION_OPS = {
    "dynamic_select(Tensor self, int dim, Scalar index) -> Tensor": (
        lambda x, dim, index: x.select(dim, int(index)).clone()
    ),
    "dynamic_slice(Tensor self, int dim, Scalar start, int size) -> Tensor": (
        lambda x, dim, start, size: x.narrow(dim, int(start), size).clone()
    ),
    "dynamic_select_scatter(Tensor self, Tensor src, int dim, Scalar index) -> Tensor": (
        lambda x, src, dim, index: torch.select_scatter(x, src, dim, int(index))
    ),
    "dynamic_slice_scatter(Tensor self, Tensor src, int dim, Scalar start) -> Tensor": (
        lambda x, src, dim, start: torch.slice_scatter(x, src, dim, int(start), int(start) + src.shape[dim])
    ),
}
for _schema, _kernel in _POSITION_OPS.items():
    library.define(_schema)
    for _key in ("CPU", "Meta"):
        library.impl(_schema.split("(", 1)[0], _kernel, _key)
# A loop over one traced body (lazyxla.scan, scan_layers): ``body`` is the digest of the body's IR, ``length``
# the number of iterations (see frontend/scan.py and lowering/rules/scan.py).
library.define("scan(Tensor[] inputs, str body, int length) -> Tensor[]")
# XLA's optimization barrier over a list of tensors (lazyxla.optimization_barrier_): its outputs are its inputs'
# values; XLA may not move computation across it. On the CPU (the recorder's check) and on meta, a copy.
library.define("optimization_barrier(Tensor[] xs) -> Tensor[]")
for _key in ("CPU", "Meta"):
    library.impl("optimization_barrier", lambda xs: [x.clone() for x in xs], _key)

# One call of a user's JAX function (lazyxla.call_jax): ``fn`` names it by the digest of its jaxpr for the call's
# avals (lowering/rules/jax_call.py); recorded directly as a node (no meta kernel: jax.eval_shape gives the avals).
library.define("call_jax(Tensor[] inputs, str fn) -> Tensor[]")

ops = torch.ops.lazyxla
COLLECTIVE_OPS = frozenset(getattr(ops, name).default for name in _SCHEMAS)
# The ops that make a program span the run's replicas (lowering/replica.py): the collectives, and compiled
# graphs holding some.
REPLICA_OPS = COLLECTIVE_OPS | {ops.compiled_graph_collective.default}
