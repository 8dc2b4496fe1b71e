"""Cutting pending graphs where a partial sync computed part of them.

A host read (``.item()``, ``.cpu()``) computes only what it needs and the live tensors computed on the way.
Other pending tensors often build on that work without being computed by it: in a generation loop the KV
cache's write position, the position ids and the generated ids each get their next value (``t + 1``,
``torch.cat([ids, token])``) after the forward pass that read the old one. Left as they are, those graphs keep
the computed work as unevaluated nodes, so the next read's program contains this step again, and every step
before it: the program grows with every read and compiles anew each time.

A ``Cut`` finds, in the graphs of the pending tensors a sync does not compute, the values that sync does
compute (the *frontier*); the sync returns them as extra outputs, and ``rebind`` gives each pending tensor the
same graph over those results, as device data. After a host read no pending tensor holds work already done.
"""

from __future__ import annotations

import weakref

from lazyxla.ir import Leaf, rewired
from lazyxla.lazy import views
from lazyxla.lazy.tensor import Holder, set_value

_VIEW_DEPTH = 8  # longer chains of views are computed as work is


class Cut:
    """The frontier of ``values`` (IR values of pending tensors that a sync leaves pending) at the nodes it
    computes (``computed``: their ids).

    Example::

        cut = Cut([t._value for t in others], computed)
        run(needed + cut.holders)          # the sync, with the frontier as extra outputs
        cut.rebind(others)                 # their graphs now start from those outputs
    """

    def __init__(self, values: list[tuple], computed: set[int]) -> None:
        self.order: list = []  # the pending nodes of these graphs, inputs before their users
        self.leaves: set[int] = set()  # ids of the leaves these graphs read
        seen: set[int] = set()
        frontier: dict[tuple, tuple] = {}
        stack = [(root, False) for root, _ in values]
        while stack:
            n, expanded = stack.pop()
            if expanded:
                self.order.append(n)
                continue
            if id(n) in seen:
                continue
            seen.add(id(n))
            stack.append((n, True))
            for m, i in n.inputs:
                if id(m) in computed:
                    frontier.setdefault((id(m), i), (m, i))
                elif m.op.__class__ is Leaf:
                    self.leaves.add(id(m))
                elif id(m) not in seen:
                    stack.append((m, False))
        self.holders = [Holder(v) for v in frontier.values()]
        self._frontier = list(frontier)  # (id(node), output) of each holder, in the same order

    def rebind(self, tensors: list) -> None:
        """Give each of ``tensors`` (whose values were passed in) its graph over the frontier's results: device
        data where the sync computed them (if it failed, the graph stays as it was)."""
        new: dict[tuple, tuple] = {
            k: h._value for k, h in zip(self._frontier, self.holders) if h._value[0].op is Leaf.DATA
        }
        if not new:
            return
        rebuilt: dict[int, object] = {}
        for n in self.order:
            inputs = tuple([new.get((id(m), i)) or (rebuilt.get(id(m), m), i) for m, i in n.inputs])
            changed = any(a[0] is not b[0] for a, b in zip(inputs, n.inputs))
            rebuilt[id(n)] = rewired(n, inputs) if changed else n
        for t in tensors:
            n, i = t._value
            if rebuilt.get(id(n), n) is not n:
                set_value(t, (rebuilt[id(n)], i))


def remember(values: list[tuple]) -> dict:
    """The computation nodes of the graphs of ``values``, by id, as weak references (for ``left_over``)."""
    seen: dict = {}
    stack = [n for n, _ in values]
    while stack:
        n = stack.pop()
        if id(n) in seen or n.op.__class__ is Leaf:
            continue
        seen[id(n)] = weakref.ref(n)
        stack.extend(m for m, _ in n.inputs)
    return seen


def holds_no_work(n) -> bool:
    """Whether the pending node ``n`` only views device data: a few slices, selects and reshapes over leaves
    (``views.holds_no_work``).

    Such a value costs nothing to leave pending, and computing it alone would be a program of its own whose
    output shape is often the one that changes (beam search's ``running[:, :, :cur_len]``, read through by
    ``lazy/view_reads.py``), so host reads leave it pending.

    Example: ``holds_no_work(unwrap(data[:, :n].reshape(-1))._value[0])`` is True for computed ``data``.
    """
    stack = [(n, 0)]
    while stack:
        m, depth = stack.pop()
        if m.op.__class__ is Leaf:
            continue
        if not views.holds_no_work(m.op) or depth >= _VIEW_DEPTH:
            return False
        stack.extend((k, depth + 1) for k, _ in m.inputs)
    return True


def left_over(values: list[tuple], earlier: dict) -> list[tuple]:
    """The values in the graphs of ``values`` whose nodes were pending already in ``earlier`` (``remember``):
    the outermost such values, looking through concatenations (they stay pending; their pieces do not), except
    views of device data (``holds_no_work``: they stay pending)."""
    found, seen = {}, set()
    stack = list(values)
    while stack:
        n, i = stack.pop()
        if n.op.__class__ is Leaf or holds_no_work(n):
            continue
        ref = earlier.get(id(n))
        if ref is not None and ref() is n and not views.is_concatenation(n.op):
            found[(id(n), i)] = (n, i)
        elif id(n) not in seen:
            seen.add(id(n))
            stack.extend(n.inputs)
    return list(found.values())
