"""Placeholder tensors: stand-ins a trace runs user code on, so that the IR it records can be kept as a
sub-graph (a ``torch.compile`` graph, a scanned function's body) instead of being computed.

A placeholder is a LazyTensor whose value is an ``ERROR`` leaf holding :class:`Placeholder`: recording ops
on it works like on any pending tensor, and anything that would need its value (a host read, a CPU
fallback, a sync) raises instead. After the trace, :func:`disarm` turns every tensor that is still alive and
still reads a placeholder (held by a reference cycle, an exception's traceback, autograd's saved tensors)
into an error leaf, which syncs skip.

Example::

    x = placeholder(Aval((4,), torch.float32), device=0)
    y = wrap(x).sin()                      # records sin over the placeholder's leaf
    disarm({id(x._value[0])})              # afterwards: y can never reach a sync
"""

from __future__ import annotations

from collections.abc import Callable

from lazyxla.ir import Aval, Leaf, leaf
from lazyxla.lazy.tensor import LazyTensor, live_tensors, set_value


class Placeholder(RuntimeError):
    """The payload of a trace's input leaves: reading one means the trace needed a value."""

    def __init__(self) -> None:
        super().__init__("a traced function tried to read a tensor's value while it was being traced")


def placeholder(aval: Aval, device: int) -> LazyTensor:
    """A LazyTensor of ``aval`` on ``device`` whose value is a fresh placeholder leaf."""
    return LazyTensor((leaf(Leaf.ERROR, Placeholder(), aval, device), 0), aval)


def is_placeholder(n) -> bool:
    """Whether IR node ``n`` is a placeholder leaf."""
    return n.op is Leaf.ERROR and type(n.payload) is Placeholder


def disarm(placeholders: set[int] | dict[int, int]) -> None:
    """Make every live pending tensor whose graph reaches one of ``placeholders`` (leaf ids) an error leaf:
    its value reads a stand-in, so it must never reach a sync."""
    memo: dict[int, bool] = {}
    target = placeholders.__contains__
    for t in live_tensors():
        n, i = t._value
        if type(n.op) is not Leaf and reaches(n, lambda m: target(id(m)), memo):
            set_value(t, (leaf(Leaf.ERROR, Placeholder(), n.avals[i], n.device), 0))


def reaches(root, is_target: Callable, memo: dict[int, bool]) -> bool:
    """Whether ``root``'s graph has a leaf for which ``is_target(leaf)`` holds; ``memo`` (by node id) is
    shared between calls over one graph."""
    stack = [(root, False)]
    while stack:
        n, expanded = stack.pop()
        k = id(n)
        if expanded:
            memo[k] = any(memo[id(m)] for m, _ in n.inputs)
        elif k not in memo:
            if type(n.op) is Leaf:
                memo[k] = bool(is_target(n))
            else:
                stack.append((n, True))
                stack.extend((m, False) for m, _ in n.inputs if id(m) not in memo)
    return memo[id(root)]
