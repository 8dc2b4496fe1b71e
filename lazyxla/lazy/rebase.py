"""A full sync outputs a view, not also its base: the base is derived from the view's result again.

PyTorch hands a parameter's gradient over as a view: nn.Linear's weight gradient is ``t()`` of the matrix
product autograd computed (``[in, out]``), and functionalization keeps that product alive as the storage of
the view. Where the gradients are alive at the sync (``opt.zero_grad()`` at the top of the loop, the idiom
most PyTorch code uses), the program then returned both the product and its transpose: twice the gradient
memory, and on XLA's CPU backend a transposing copy per weight (the MLP benchmark's step took 1.6x as long
as with ``zero_grad()`` after ``opt.step()``).

So when a pending tensor's value is an invertible view (a transpose, a permutation, a reshape) of another
pending tensor's value, the sync computes only the view; the base becomes that view's inverse, recorded on
the view's result. Nothing reads the base in the usual case (the gradient's storage dies at the next
``zero_grad``); when something does, it costs one transpose or reshape in a later program, and the values
are the same either way.

Example::

    pending, derived, keep = split(pending)  # in lazy.graph.sync: the bases leave the program's outputs
    ...run the program...
    rederive(derived)                   # each base: the inverse view of its view's result
"""

from __future__ import annotations

import torch

from lazyxla.ir import Leaf
from lazyxla.lazy import views
from lazyxla.lazy.meta import record
from lazyxla.lazy.tensor import LazyTensor, retarget

aten = torch.ops.aten


def split(pending: list[LazyTensor]) -> tuple[list[LazyTensor], list[tuple], set[int]]:
    """What a full sync computes of ``pending``: the tensors to compute, ``(bases, view, view node)`` triples
    and the ids of the device data that tensors left pending read.

    A base (the tensors holding one value) is left out when another pending tensor's value is an invertible
    view of it: :func:`rederive` gives it back its value from the view's after the run. A view that is itself
    some pair's base is not used (no chains: a base is one view away from computed data). A tensor whose value
    is such a view of device data already (a base this made at the previous sync, still alive) stays pending:
    computing it would only copy data in another order, and whatever needs it computes it in its own program.
    """
    holders: dict[tuple, list[LazyTensor]] = {}
    for t in pending:
        holders.setdefault((id(t._value[0]), t._value[1]), []).append(t)
    candidates, stay, reads = {}, set(), set()
    for t in pending:
        n, _ = t._value
        if not views.invertible_node(n):
            continue
        m, i = n.inputs[0]
        if m.op is Leaf.DATA:  # views.reorders_data(n)
            stay.add(id(t))
            reads.add(id(m))
        elif (id(m), i) in holders:
            candidates.setdefault((id(m), i), (t, n))
    derived = [(holders[k], t, n) for k, (t, n) in candidates.items() if (id(n), t._value[1]) not in candidates]
    if not derived and not stay:
        return pending, [], reads
    dropped = {(id(b[0]._value[0]), b[0]._value[1]) for b, _, _ in derived}
    kept = [t for t in pending if id(t) not in stay and (id(t._value[0]), t._value[1]) not in dropped]
    return kept, derived, reads


def _inverse(view_node, view: LazyTensor, base_shape: tuple) -> LazyTensor:
    op = view_node.op
    if op is aten.t_copy.default:
        return record(aten.t_copy.default, (view,), {})
    if op is aten.transpose_copy.int:
        args = view_node.template[0]
        return record(aten.transpose_copy.int, (view, args[1], args[2]), {})
    if op is aten.permute_copy.default:
        dims = [d % len(base_shape) for d in view_node.template[0][1]]
        return record(aten.permute_copy.default, (view, [dims.index(k) for k in range(len(dims))]), {})
    return record(aten.view_copy.default, (view, list(base_shape)), {})


def rederive(derived: list[tuple]) -> None:
    """After the run: each left-out base becomes the inverse view of its view's (now computed) value."""
    for bases, view, node in derived:
        value = _inverse(node, LazyTensor(view._value, view._aval), tuple(bases[0].shape))._value
        retarget(bases, [value] * len(bases))
