"""The view ops the lazy runtime looks through, in one table: what each one is, and what that allows.

A recorded graph holds views as ``*_copy`` ops (functionalization's view replay) and a few of lazyxla's own
(``lazyxla.dynamic_slice``/``dynamic_select``: ``lazy/positions.py``). Three mechanisms look at them:

- reads through pending views (``lazy/view_reads.py``): a slice or select is recorded on what it reads, through
  a pending concatenation, reshape or step-1 slice (``reads_through``);
- host reads and cuts (``lazy/cut.py``, ``lazy/graph.py``): a view of device data holds no work, so it stays
  pending (``holds_no_work``), and a pending concatenation stays pending while its pieces are computed
  (``is_concatenation``);
- a full sync (``lazy/rebase.py``): a base is derived again from an invertible view of it (``invertible``).

Each used to keep its own list, and the lists drifted apart (``squeeze_copy.default`` was a view to rebase but
work to a cut; ``_reshape_copy`` a reshape to reads and cuts but not to rebase; reads did not pass through
``unsqueeze``/``squeeze``). Now an op has one kind, and each mechanism asks for the kinds it can handle.

Example::

    kind(aten.view_copy.default)            # RESHAPE
    invertible(aten.t_copy.default)          # True: rebase derives the base as t() of the view's result
    holds_no_work(aten.t_copy.default)      # False: a transpose moves every element
"""

from __future__ import annotations

import math

import torch

from lazyxla.ir import Leaf
from lazyxla.ops import ops

aten = torch.ops.aten

# The kinds of view.
RESHAPE = "reshape"  # the same elements in the same (row-major) order, another shape
TRANSPOSE = "transpose"  # the same elements in another order
SLICE = "slice"  # a range along one dim
SELECT = "select"  # one index along one dim (the dim dropped)
CONCAT = "concat"  # pieces joined along one dim: not a view of one value, but each piece is read through it

# op -> kind. Ops not here (expand, diagonal, as_strided, unfold) are work to every mechanism: none of them can be
# inverted, read through or left pending for free. Nor are the non-copy forms (aten.view, aten.squeeze, ...) and
# _reshape_alias_copy, which have lowering rules but reach a graph only from lazyxla's own records (a margin loss's
# 0-d view, lazy/special.py) or traced graphs: no mechanism was ever asked to look through them.
TABLE = {
    aten.view_copy.default: RESHAPE,  # .view, .reshape and .flatten of a contiguous value, aten.alias
    aten._unsafe_view.default: RESHAPE,  # .reshape of a value that needed a copy first
    aten._reshape_copy.default: RESHAPE,  # torch._reshape_copy, and graphs traced with it
    aten.unsqueeze_copy.default: RESHAPE,  # .unsqueeze, x[None]
    aten.squeeze_copy.default: RESHAPE,  # .squeeze()
    aten.squeeze_copy.dim: RESHAPE,
    aten.squeeze_copy.dims: RESHAPE,
    aten.alias_copy.default: RESHAPE,  # never a node today (lazy/special.py makes it an alias), a reshape if it were
    aten.t_copy.default: TRANSPOSE,
    aten.transpose_copy.int: TRANSPOSE,  # also .mT
    aten.permute_copy.default: TRANSPOSE,
    aten.slice_copy.Tensor: SLICE,  # also .narrow
    ops.dynamic_slice.default: SLICE,
    aten.select_copy.int: SELECT,
    ops.dynamic_select.default: SELECT,
    aten.cat.default: CONCAT,
}

# ids, not the ops: hashing an OpOverload runs Python code, and these are asked per op (the ops live as long as
# the process).
_KIND = {id(op): k for op, k in TABLE.items()}


def _ids(*kinds: str) -> frozenset:
    return frozenset(i for i, k in _KIND.items() if k in kinds)


# A reshape, slice or select of device data holds no work: XLA takes it as a bitcast or an offset into the buffer,
# and computing it alone would be a program whose output shape is often the one that changes (beam search's
# growing prefix). A transpose is left out on purpose: it moves every element (XLA copies), so a pending one is
# computed as work is. (A full sync still leaves a transposed base of device data pending, lazy/rebase.py: there
# the copy is what it avoids.) A concatenation is work: its pieces are joined into a new buffer.
_NO_WORK = _ids(RESHAPE, SLICE, SELECT)
# What lazy/view_reads.py reads through: the piece of a concatenation, the value under a reshape that keeps the
# read dim, the input of a step-1 slice along the read dim. Not a select (it drops the dim a read would pass
# through), not a transpose (a read would have to move to another dim; nothing needed it yet).
_READ_THROUGH = _ids(RESHAPE, SLICE, CONCAT)
# What lazy/rebase.py inverts: views whose result holds each element of their input once (a reshape's input and
# output also have as many elements: rebase checks that on the node).
_INVERTIBLE = _ids(RESHAPE, TRANSPOSE)
_CONCAT = aten.cat.default


def kind(op) -> str | None:
    """The kind of view ``op`` is (``RESHAPE``, ``TRANSPOSE``, ``SLICE``, ``SELECT``, ``CONCAT``), or None.

    Example: ``kind(aten.squeeze_copy.dim)`` is ``RESHAPE``; ``kind(aten.expand_copy.default)`` is None.
    """
    return _KIND.get(id(op))


def is_reshape(op) -> bool:
    """Whether ``op`` gives its input's elements in the same order, in another shape.

    Example: ``is_reshape(aten.unsqueeze_copy.default)`` is True; ``is_reshape(aten.t_copy.default)`` is False.
    """
    return _KIND.get(id(op)) is RESHAPE


def invertible(op) -> bool:
    """Whether ``op`` holds every element of its input once, so the input is the inverse view of its result
    (a transpose, a permutation, a reshape of as many elements): what ``lazy/rebase.py`` derives a base from.

    Example: ``invertible(aten.permute_copy.default)`` is True; ``invertible(aten.slice_copy.Tensor)`` is False.
    """
    return id(op) in _INVERTIBLE


def invertible_node(n) -> bool:
    """Whether node ``n`` holds every element of its input once (:func:`invertible`, and a reshape to as many
    elements): its input is the inverse view of its result.

    Example: ``invertible_node(unwrap(w.t())._value[0])`` is True; for ``w[:2]`` it is False.
    """
    if len(n.inputs) != 1 or not invertible(n.op):
        return False
    if is_reshape(n.op):
        (m, i) = n.inputs[0]
        return math.prod(m.avals[i].shape) == math.prod(n.avals[0].shape)
    return True


def reorders_data(n) -> bool:
    """Whether node ``n`` is an invertible view of device data (a transpose or reshape of a computed tensor): a
    full sync leaves it pending (``lazy/rebase.py``), so it is no work the pending graph holds.

    Example: ``reorders_data(unwrap(computed.t())._value[0])`` is True.
    """
    return invertible_node(n) and n.inputs[0][0].op is Leaf.DATA


def holds_no_work(op) -> bool:
    """Whether a node of ``op`` over device data only views it (a reshape, slice or select): left pending by host
    reads and cuts (``cut.holds_no_work`` walks a chain of them).

    Example: ``holds_no_work(aten.select_copy.int)`` is True; ``holds_no_work(aten.transpose_copy.int)`` is False.
    """
    return id(op) in _NO_WORK


def reads_through(op) -> bool:
    """Whether a slice or select of a pending node of ``op`` may be recorded on what the node reads
    (``lazy/view_reads.py``: a concatenation's piece, a reshape's or a step-1 slice's input).

    Example: ``reads_through(aten.cat.default)`` is True; ``reads_through(aten.select_copy.int)`` is False.
    """
    return id(op) in _READ_THROUGH


def is_concatenation(op) -> bool:
    """Whether ``op`` is a concatenation: host reads and cuts look through it to its pieces (computed) and leave
    it pending (``lazy/view_reads.py`` reads its last piece without it).

    Example: ``is_concatenation(aten.cat.default)`` is True.
    """
    return op is _CONCAT
