"""Positions that change from step to step become program inputs.

A select, a slice or a write through either at a Python int position (``x[i]``, ``x[:, s:s + n]``,
``x[:, i] = v``) reaches the recorder as an aten op whose position is an ``int`` argument: a constant of the
program, like a shape. That suits the positions of a training step (a qkv split, rotary halves, an unrolled
RNN's time steps: the same positions in every step), but a decoding loop indexes at its current length, a new
position at every token (Hugging Face's beam search: ``running_beam_indices[..., cur_len - prompt_len]``,
``sequences[:, :, cur_len] = ids``), and every new position compiled a new program.

So each such call is keyed by what stays when only the position changes (the op, its tensors' avals, the dim;
the output's size is in the avals), and the key remembers the positions it took in its first epoch (the
recording between two syncs or host reads, ``session.epoch``; in a multi-process run only syncs, so that a read on
one rank only cannot make its programs differ from the others'). Those stay constants; any other position records
the ``lazyxla.dynamic_*`` op of the same meaning (``lazyxla/ops.py``), which takes the position as a program
input (``lax.dynamic_slice`` and its kin). A loop whose position moves after each read compiles its first
position's program and one with the position an input, then nothing; a second identical loop runs those two
again. A step that takes the same positions every time keeps them constants, and its programs do not change.
What the rule costs: a later step that takes a first-epoch position beside new ones (``x[i - 1]`` and ``x[i]``
at ``i = 1``) is a program of its own, once. A read that moves with a length (from the end of a slice that
grows: ``lazy/view_reads.py``) is an input from the start.

The position is a Python int the host knows, so it is normalized (negative indices wrap) and checked at the
call (``where_select``, ``where_slice``); a position out of range, a step other than 1, a symbolic bound records
the aten op, whose checks raise PyTorch's own error (``IndexError``) as before, and an empty or whole-dim slice
has no position to move. Autograd is unaffected: it runs above, and the backward of ``x[i]`` reaches here as a
``select_scatter`` at the same position.

Example::

    for t in range(n):           # t changes after every host read
        row = x[t]               # t = 0: select_copy at 0; from t = 1 on: dynamic_select, t an input
        done = bool((row == eos).any())
"""

from __future__ import annotations

import torch

from lazyxla.config import config
from lazyxla.lazy.meta import record
from lazyxla.lazy.session import session
from lazyxla.lowering.rules.view import slice_bounds
from lazyxla.ops import ops

aten = torch.ops.aten

_flags = config._values  # read per op: a dict lookup, not lazyxla.config's attribute hook
# Each key's first element: which call it is (ints, not the ops: hashing an OpOverload runs Python code)
_SELECT, _SLICE, _SELECT_SCATTER, _SLICE_SCATTER = range(4)
_LIMIT = 100_000


def _varies(key: tuple, position: int, moving: bool) -> bool:
    """Whether the call ``key`` records ``position`` as a program input: a position it did not take in its first
    epoch. Those it took then stay constants, so every program the key is in, a second identical run's
    included, is one of two: the first epoch's, or the one with the position an input. ``moving``: a position
    that moves with a length (a read through a slice, ``lazy/view_reads.py``) is an input from the start."""
    if not _flags["dynamic_positions"]:
        return False
    seen = session.positions  # key -> (the epoch it was first used in, the positions it took then)
    state = seen.get(key)
    now = session.epoch
    if state is None:
        if len(seen) >= _LIMIT:  # keys that keep changing (shapes): start over rather than grow forever
            seen.clear()
        seen[key] = (-1, set()) if moving else (now, {position})
        return moving
    if moving:
        return True
    first, positions = state
    if position in positions:
        return False
    if now == first:
        positions.add(position)
        return False
    return True


def forget() -> None:
    """Forget every position seen: from now on each call starts as new (a test's clean slate)."""
    session.positions.clear()


def _dim(x, dim) -> int | None:
    """``dim`` made non-negative, or None if out of range (the aten op raises PyTorch's error)."""
    n = x.dim()
    return dim % n if type(dim) is int and -n <= dim < n else None


def _index(x, d: int, index) -> int | None:
    """``index`` along dim ``d`` made non-negative, or None if it is not an int in range."""
    size = x.shape[d]
    if type(index) is not int or not -size <= index < size:
        return None
    return index + size if index < 0 else index


def where_select(x, dim, index) -> tuple[int, int] | None:
    """``(dim, index)`` of ``x.select(dim, index)``, both non-negative; None where PyTorch raises."""
    d = _dim(x, dim)
    i = None if d is None else _index(x, d, index)
    return None if i is None else (d, i)


def where_slice(x, dim, start, end, step) -> tuple[int, int, int] | None:
    """``(dim, lo, hi)`` of a step-1 slice, clamped as PyTorch clamps it (``lo <= hi``); None for another step,
    a symbolic bound or a dim PyTorch refuses."""
    d = _dim(x, dim)
    if d is None or step != 1 or any(b is not None and type(b) is not int for b in (start, end)):
        return None
    return (d, *slice_bounds(x.shape[d], start, end))


def select_at(x, d: int, i: int, moving: bool = False):
    """``x.select(d, i)`` (``where_select``'s ``d``, ``i``) at an index that is a program input once it varies
    (``moving``: from the start)."""
    if _varies((_SELECT, x._aval, d), i, moving):
        return record(ops.dynamic_select.default, (x, d, i), {})
    return record(aten.select_copy.int, (x, d, i), {})


def slice_at(x, d: int, lo: int, hi: int, moving: bool = False):
    """``x``'s ``[lo, hi)`` along dim ``d`` (``where_slice``'s) at a start that is a program input once it varies
    (the size stays a constant; ``moving``: from the start). An empty or whole-dim slice has no position."""
    if 0 < hi - lo < x.shape[d] and _varies((_SLICE, x._aval, d, hi - lo), lo, moving):
        return record(ops.dynamic_slice.default, (x, d, lo, hi - lo), {})
    return record(aten.slice_copy.Tensor, (x, d, lo, hi, 1), {})


def select_scatter(x, src, dim, index):
    """``aten.select_scatter`` (``x[:, i] = v``, ``select``'s backward): at an index that is a program input once
    it varies."""
    at = where_select(x, dim, index)
    fits = at is not None and src.dtype == x.dtype and src.shape == x.shape[: at[0]] + x.shape[at[0] + 1 :]
    if fits and _varies((_SELECT_SCATTER, x._aval, src._aval, at[0]), at[1], False):
        return record(ops.dynamic_select_scatter.default, (x, src, *at), {})
    return record(aten.select_scatter.default, (x, src, dim, index), {})


def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """``aten.slice_scatter`` (``x[:, s:s + n] = v``, ``slice``'s backward): at a start that is a program input
    once it varies."""
    at = where_slice(x, dim, start, end, step)
    fits = at is not None and 0 < at[2] - at[1] < x.shape[at[0]] and src.dtype == x.dtype
    d = at[0] if fits else 0
    fits = fits and src.shape == x.shape[:d] + (at[2] - at[1],) + x.shape[d + 1 :]
    if fits and _varies((_SLICE_SCATTER, x._aval, src._aval, d), at[1], False):
        return record(ops.dynamic_slice_scatter.default, (x, src, d, at[1]), {})
    return record(aten.slice_scatter.default, (x, src, dim, start, end, step), {})
