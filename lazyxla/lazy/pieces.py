"""The pieces of a wide ``unbind``: what iterating a tensor makes (``for row in t``, ``all(t)``, ``list(t)``).

``Tensor.__iter__`` is ``iter(t.unbind(0))``: every piece exists at once, as a view of ``t``. Recorded as one
``unbind_copy`` node with an output per piece, the first host read of a piece (``bool(piece)`` in ``all(t)``)
computed every live piece as an output of one program, and XLA's compile time grows about quadratically with
the output count (1,000 outputs: 11 s; 5,000: 120 s; PyTorch's ``test_linspace`` iterates 999,999 pieces).
And a program using one piece (``model(row)``) named it by its output index: had the pieces stayed pending, each
row would have been another program.

So an unbind of at least ``WIDE`` pieces records each piece as ``lazyxla.dynamic_select(t, dim, i)`` with ``i``
a program input (``lazy/positions.py``'s op): a program using a row is the same program for every row. The
pieces are marked (``LazyTensor._piece``), and:

- a sync never makes them outputs (``split``): a piece of device data stays pending (it holds no work:
  ``cut.holds_no_work``), and a piece of a pending value has that value computed instead and is re-pointed at
  its result (``repoint``);
- a host read of one (``lazy/special.py``) computes its base, copies the base to the host once and serves every
  piece's read from that copy: O(1) programs and device-to-host transfers for ``all(t)``, not one per piece.

Narrow unbinds (``q, k, v = qkv.unbind(0)``) stay one node with constant slices, as XLA likes them best.

Example::

    pieces = unbind(x, 0)        # in lazy/special.py, for aten.unbind_copy.int
"""

from __future__ import annotations

import torch

from lazyxla.ir import Leaf, Node, rewired
from lazyxla.lazy.meta import record
from lazyxla.lazy.tensor import Holder, LazyTensor, set_value
from lazyxla.ops import ops

aten = torch.ops.aten
SELECT = ops.dynamic_select.default
# From this many pieces on, an unbind is recorded piece by piece. Below it, one node with constant slices is the
# better program and its outputs compile fast (a qkv split, an LSTM's gates); above it, a program with one output
# per piece starts to take seconds to compile.
WIDE = 32


def unbind(x: LazyTensor, dim: int = 0):
    """``aten.unbind_copy.int``: a narrow unbind as recorded; a wide one as marked ``dynamic_select`` pieces
    (see the module's docstring)."""
    n = x.shape[dim] if type(dim) is int and -x.dim() <= dim < x.dim() else 0
    if n < WIDE:
        return record(aten.unbind_copy.int, (x, dim), {})  # PyTorch's error for a bad dim, too
    d = dim % x.dim()
    first = record(SELECT, (x, d, 0), {})
    node = first._value[0]
    if node.op is not SELECT or len(node.inputs) != 2 or node.inputs[1][0].op is not Leaf.SCALAR:
        return record(aten.unbind_copy.int, (x, dim), {})  # (a recording mode that changed the op: as before)
    first._piece = True
    pieces = [first]
    scalar = node.inputs[1][0]
    # The other pieces differ from the first only in the position's value: the same template and hash (a scalar
    # leaf's hash is its aval's), so each is a node and a tensor, without the recorder's per-call work.
    for i in range(1, n):
        position = Node(Leaf.SCALAR, (), None, scalar.avals, scalar.hash, i, scalar.device)
        made = Node(SELECT, (node.inputs[0], (position, 0)), node.template, node.avals, node.hash, None, node.device)
        made.source = node.source
        piece = LazyTensor((made, 0), first._aval)
        piece._piece = True
        pieces.append(piece)
    return tuple(pieces)


def split(pending: list) -> tuple[list, list, dict, set]:
    """What a full sync computes of ``pending`` (live LazyTensors): the tensors without the marked pieces, plus a
    ``Holder`` for each pending value a piece views; the pieces (for ``repoint``); those holders (by the value's
    ``(id(node), output)``); and the ids of
    the device data pieces read (the sync must not donate them).

    Example::

        pending, pieces, holders, reads = split(pending)
        ...run pending...
        repoint(pieces, holders)
    """
    kept, later, reads = [], [], set()
    bases: dict = {}
    for t in pending:
        n = t._value[0]
        if not (t._piece and n.op is SELECT):
            kept.append(t)
            continue
        later.append(t)
        b, i = n.inputs[0]
        if b.op is Leaf.DATA:
            reads.add(id(b))
        elif b.op.__class__ is not Leaf:
            bases.setdefault((id(b), i), Holder((b, i)))
    return kept + list(bases.values()), later, bases, reads


def repoint(pieces: list, holders: dict) -> None:
    """After the sync: each piece of a value a holder computed views that value's device data (if the sync
    failed, the pieces keep their graphs)."""
    done = {k: h._value for k, h in holders.items() if h._value[0].op is Leaf.DATA}
    if not done:
        return
    for t in pieces:
        n, k = t._value
        b, i = n.inputs[0]
        value = done.get((id(b), i))
        if value is not None:
            set_value(t, (rewired(n, (value, *n.inputs[1:])), k))
