"""``lazyxla::compiled_graph``: one call of a ``torch.compile`` graph, as one op of the lazy IR.

The ``torch.compile`` backend (``lazyxla.dynamo``) traces each FX graph through lazy mode once per input
signature, registers the traced IR here under its digest (``register``), and records one node of this op
per call: ``compiled_graph(inputs, digest)`` (``compiled_graph_collective`` when the graph holds replica
collectives: the program around it then spans the replicas), whose inputs are the call's tensors, the trace's
constant arrays and one RNG key per random op. The rule interprets the registered IR with the rule table
(``to_jax.apply``) inside one ``jax.jit``, so the call becomes part of the step's program like any op.

Example::

    register(name, order, leaves, results)               # once per trace (lazyxla.dynamo)
    n = node(OP, inputs, ((tuple(IN[:k]), name), ()), avals, device, base)   # each call
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from lazyxla.ir import Leaf
from lazyxla.lowering import to_jax
from lazyxla.lowering.registry import lowers
from lazyxla.ops import ops

OP = ops.compiled_graph.default  # declared in lazyxla/ops.py
OP_COLLECTIVE = ops.compiled_graph_collective.default  # a graph holding replica collectives: spans the replicas


class TracedGraph:
    """A traced graph as its calls lower: IR from its argument leaves to its results.

    The leaves are the op's inputs in order (the used graph inputs, the constants, the RNG keys), then
    its Python scalars, which are constants of the trace (their values are baked in).
    """

    def __init__(self, order: list, leaves: list, results: list) -> None:
        self.order = order  # computation nodes, post-order
        self.leaves = leaves
        self.results = results  # the values the op computes, (node, index)
        self._fns: dict = {}

    def jax_fn(self, axis=None, world: int = 1) -> Callable:
        """The jitted jax function: the op's input arrays -> the results' arrays."""
        fn = self._fns.get((axis, world))
        if fn is None:
            fn = self._fns[(axis, world)] = jax.jit(functools.partial(self._interpret, axis, world))
        return fn

    def _interpret(self, axis, world, *arrays):
        env: dict[int, Any] = {}
        k = 0
        for n in self.leaves:
            if n.op is Leaf.SCALAR:
                continue
            env[id(n)] = (arrays[k],)
            k += 1
        to_jax.evaluate(self.order, env, to_jax.scalar_constant, axis, world)
        return tuple(env[id(m)][i] for m, i in self.results)


GRAPHS: dict[str, TracedGraph] = {}  # digest -> traced graph, for the rule


def register(name: str, order: list, leaves: list, results: list) -> None:
    """Make the traced graph named ``name`` (its ``ir.digest``) lowerable as ``compiled_graph(..., name)``."""
    GRAPHS[name] = TracedGraph(order, leaves, results)


@lowers(OP, OP_COLLECTIVE)
def _compiled_graph(ctx, inputs, graph):
    """One call of a compiled FX graph: the trace's jitted jax function on the call's arrays (its collectives
    over ``ctx.axis``, the replica axis of the program around it)."""
    traced = GRAPHS.get(graph)
    if traced is None:
        raise RuntimeError(f"lazyxla: no traced graph {graph} in this process (a torch.compile graph of another run?)")
    return list(traced.jax_fn(ctx.axis, ctx.world)(*inputs))
