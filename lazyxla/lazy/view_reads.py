"""Slices and selects recorded on what they read, through pending concatenations, reshapes and slices.

A sequence grown one step at a time (``ids = torch.cat([ids, token[:, None]], -1)``; generation does it to the
token ids and the position ids) is read back at its end (``ids[:, -1:]``). Beam search instead keeps its sequences at
their full length and takes the current ones as ``running[:, :, :cur_len].reshape(batch * beams, cur_len)``, of
which the model reads the last column and the stopping criteria the last token. Recorded as they are, those reads
take the whole sequence, whose length changes every step: every program that needs the last token takes it and
compiles anew. So a slice or select is recorded on what it reads: on the piece of a pending ``cat`` that holds it,
under a pending reshape that keeps its dim (then reshaped), and within a pending step-1 slice along its dim, at the
position it reads there (which ops are which: ``lazy/views.py``). A read from the end (a negative index) through a
slice that stops short of its input's end moves with that slice's end, the length that grows: its position is a
program input from the start (``_MOVING``; ``lazy/positions.py``). Reads from the start (a qkv split's ``q[:, :8]``)
keep their positions constants until those change.

``lazy/special.py`` routes ``aten.slice_copy`` and ``aten.select_copy`` here.

Example::

    seq = torch.cat([ids, tok], -1)
    seq[:, -1:]          # recorded as tok itself: a program that needs it does not take the sequence
"""

from __future__ import annotations

import math

import torch

from lazyxla.lazy import positions, views
from lazyxla.lazy.meta import record
from lazyxla.lazy.tensor import LazyTensor
from lazyxla.lowering.rules.view import slice_bounds
from lazyxla.ops import ops

aten = torch.ops.aten


def _piece(x: LazyTensor, dim: int, start: int, stop: int):
    """If ``x`` is a pending ``cat`` along ``dim`` (0 <= dim < rank) whose piece holds all of [start, stop):
    that piece (a LazyTensor) and its offset; else None."""
    n, _ = x._value
    if not views.is_concatenation(n.op) or n.template[1]:
        return None
    args = n.template[0]
    if (args[1] if len(args) > 1 else 0) % x.dim() != dim:
        return None
    offset = 0
    for slot in args[0]:
        value = n.inputs[slot.i]
        aval = value[0].avals[value[1]]
        if len(aval.shape) != x.dim() or aval.dtype != x.dtype:  # a skipped empty piece, or a promoted dtype
            return None
        size = aval.shape[dim]
        if offset <= start and stop <= offset + size:
            return LazyTensor(value, aval), offset
        offset += size
    return None


def slice_copy(x, dim=0, start=None, end=None, step=1):
    """``aten.slice_copy``: read from the pending value it views (``_slice_within``), if it views one; at a start
    that may be a program input (``lazy/positions.py``).

    Example::

        slice_copy(torch.cat([ids, tok], -1), 1, -1)   # tok itself: the sequence is not read
    """
    at = positions.where_slice(x, dim, start, end, step)
    if at is None:
        return record(aten.slice_copy.Tensor, (x, dim, start, end, step), {})  # PyTorch's error, or a strided slice
    d, lo, hi = at
    out = _slice_within(x, d, lo, hi, _END if start is not None and start < 0 else _START) if lo < hi else None
    return out if out is not None else positions.slice_at(x, d, lo, hi)


def select_copy(x, dim, index):
    """``aten.select_copy``: as ``slice_copy``.

    Example::

        select_copy(torch.cat([ids, tok], -1), 1, -1)  # tok.select(1, 0)
    """
    at = positions.where_select(x, dim, index)
    if at is None:
        return record(aten.select_copy.int, (x, dim, index), {})  # PyTorch's IndexError
    out = _select_within(x, *at, _END if index < 0 else _START)
    return out if out is not None else positions.select_at(x, *at)


def _ints(*bounds) -> bool:
    return all(b is None or type(b) is int for b in bounds)


_START, _END, _MOVING = 0, 1, 2  # a read's position counts from the start, from the end, or moves with a length


def _through(how: int, short: bool) -> int:
    """How a read counts after passing through a slice (``short``: one that stops before its input's end)."""
    return _MOVING if how == _MOVING or (how == _END and short) else how


def _slice_within(x, d: int, lo: int, hi: int, how: int):
    """``x``'s ``[lo, hi)`` along dim ``d`` (``lo < hi``) read from the pending value ``x`` views, or None if
    ``x`` views none (a pending ``cat``, reshape or slice: see above). ``how``: ``_START``, ``_END``, ``_MOVING``."""
    if not views.reads_through(x._value[0].op):  # the common case, decided at once
        return None
    found = _piece(x, d, lo, hi)
    if found is not None:
        piece, offset = found
        if lo == offset and hi == offset + piece.shape[d]:
            return piece
        return _slice_at(piece, d, lo - offset, hi - offset, how if how == _MOVING else _START)
    under = _under(x, d)
    if under is None:
        return None
    y, k, offset, short = under
    out = _slice_at(y, k, offset + lo, offset + hi, _through(how, short))
    return reshaped(out, x.shape[:d] + (hi - lo,) + x.shape[d + 1 :])


def _slice_at(x, d: int, lo: int, hi: int, how: int):
    out = _slice_within(x, d, lo, hi, how)
    return out if out is not None else positions.slice_at(x, d, lo, hi, how == _MOVING)


def _select_within(x, d: int, i: int, how: int):
    """``x.select(d, i)`` (``i`` in range) read as ``_slice_within`` reads, or None."""
    if not views.reads_through(x._value[0].op):
        return None
    found = _piece(x, d, i, i + 1)
    if found is not None:
        return _select_at(found[0], d, i - found[1], how if how == _MOVING else _START)
    under = _under(x, d)
    if under is None:
        return None
    y, k, offset, short = under
    return reshaped(_select_at(y, k, offset + i, _through(how, short)), x.shape[:d] + x.shape[d + 1 :])


def _select_at(x, d: int, i: int, how: int):
    out = _select_within(x, d, i, how)
    return out if out is not None else positions.select_at(x, d, i, how == _MOVING)


def _under(x: LazyTensor, d: int):
    """What ``x``'s dim ``d`` is read from, if ``x`` is a pending reshape that keeps dim ``d`` (the same size
    and as many elements before it) or a pending step-1 slice along ``d``: the value under it (a LazyTensor),
    the dim there, where ``x``'s dim ``d`` starts there, and whether ``x`` is a slice that stops before the end
    of that dim; else None."""
    n = x._value[0]
    if views.is_reshape(n.op) and not n.template[1]:
        value = n.inputs[n.template[0][0].i]
        y = LazyTensor(value, value[0].avals[value[1]])
        k = _kept(y.shape, x.shape, d)
        return None if k is None else (y, k, 0, False)
    inner = _sliced(n)
    if inner is None or inner[1] != d:
        return None
    y, k, start = inner
    return y, k, start, start + x.shape[d] < y.shape[k]


def _kept(a, b, d: int) -> int | None:
    """The dim of shape ``a`` that a reshape to ``b`` keeps as ``b``'s dim ``d`` (the same size, as many elements
    before it), or None."""
    before = math.prod(b[:d])
    if 0 in a or 0 in b:
        return None
    elements = 1
    for k, size in enumerate(a):
        if elements == before and size == b[d]:
            return k
        elements *= size
        if elements > before:
            return None
    return None


def _sliced(n):
    """If node ``n`` is a step-1 slice (``slice_copy`` or ``lazyxla.dynamic_slice``): its input (a LazyTensor),
    the sliced dim (non-negative) and the start; else None."""
    args = n.template[0] if type(n.template) is tuple and len(n.template) == 2 else ()
    if n.op is aten.slice_copy.Tensor and not n.template[1]:
        given = args[1:]
        dim, start, end, step = given + (0, None, None, 1)[len(given) :]
        if step != 1 or not _ints(start, end):
            return None
        value = n.inputs[args[0].i]
        shape = value[0].avals[value[1]].shape
        dim %= len(shape)
        return LazyTensor(value, value[0].avals[value[1]]), dim, slice_bounds(shape[dim], start, end)[0]
    if n.op is ops.dynamic_slice.default:
        value = n.inputs[args[0].i]
        return LazyTensor(value, value[0].avals[value[1]]), args[1], n.inputs[args[2].i][0].payload
    return None


def reshaped(x: LazyTensor, shape) -> LazyTensor:
    """``x`` viewed as ``shape`` (``x`` itself if it has that shape).

    Example: ``reshaped(row, (1, n))`` records ``view_copy`` for a row of ``n``.
    """
    return x if tuple(x.shape) == tuple(shape) else record(aten.view_copy.default, (x, list(shape)), {})
