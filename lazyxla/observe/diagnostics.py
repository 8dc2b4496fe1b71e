"""Why did this sync happen, why did this recompile, and compile regions.

- Every sync is attributed: its trigger (explicit sync, a host read such as ``.item()``/``.cpu()``/
  ``print``, a CPU fallback, a data-dependent shape) and the user's source line that caused it
  (``lazyxla.metrics.syncs()``).
- With ``config.explain_recompiles`` (``LAZYXLA_EXPLAIN_RECOMPILES=1``) every recorded op keeps the user's
  source line, and a graph that misses the compile cache is compared with the last graph compiled at
  the same sync site: the first op that differs, the changed shapes, dtypes or constants, and the line
  that recorded it are logged (``lazyxla`` logger, warning level) and kept in
  ``lazyxla.metrics.recompiles()``.
- ``lazyxla.compile`` regions (``full_graph``, ``max_different_graphs``) use both.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import sys
import threading
from typing import Any

import torch

from lazyxla.ir import In, wiring

log = logging.getLogger("lazyxla")

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP = (_TORCH_DIR, _OWN_DIR, os.path.dirname(os.__file__))


def user_frame(skip: int = 1) -> str:
    """``file:line`` of the innermost frame outside PyTorch, lazyxla and the standard library."""
    f = sys._getframe(skip)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_SKIP) and not name.startswith("<frozen"):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


# --- sync attribution -------------------------------------------------------------------------------

_syncs: collections.Counter = collections.Counter()


def note_sync(reason: str) -> str:
    """Count a sync by (reason, user line); returns the line."""
    where = user_frame(2)
    _syncs[(reason, where)] += 1
    _regions_check(reason, where)
    return where


def syncs() -> list[dict[str, Any]]:
    """Every sync trigger seen since the last reset: reason, user ``file:line``, count (most first)."""
    return [{"reason": r, "where": w, "count": n} for (r, w), n in _syncs.most_common()]


def reset() -> None:
    _syncs.clear()
    _recompiles.clear()
    _last_graph.clear()


# --- recompile explanations -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OpSig:
    """What decides the compiled program, for one node: op, constants, inputs (positions and avals),
    output avals; and the source line that recorded it (not part of the comparison)."""

    op: str
    constants: str  # repr of ``values``: equal when the program is (1, 1.0 and True differ)
    args: tuple
    inputs: tuple
    outputs: tuple
    source: str | None = dataclasses.field(default=None, compare=False)
    values: tuple = dataclasses.field(default=(), compare=False)


def signature(order, leaves) -> list[OpSig]:
    """A comparable description of a graph: its leaves, then its nodes in post-order, wired by position as
    ``ir.digest`` describes it (``ir.wiring``), laid out for ``diff`` to say what changed."""
    sig = []
    for n in leaves:
        a = n.avals[0]
        sig.append(OpSig(f"<{n.op.value}>", "", (), (), ((tuple(a.shape), str(a.dtype)),)))
    for n, args in zip(order, wiring(order, leaves)[0]):
        ins = tuple((tuple(m.avals[i].shape), str(m.avals[i].dtype)) for m, i in n.inputs)
        outs = tuple((tuple(a.shape), str(a.dtype)) for a in n.avals)
        values = _constants(n.template)
        sig.append(OpSig(str(n.op), repr(values), args, ins, outs, n.source, values))
    return sig


def _constants(template) -> tuple:
    """The op's arguments with tensors as ``T``: ``(args, kwargs)``."""

    def walk(x):
        if type(x) is tuple:
            return tuple(walk(e) for e in x)
        return _TENSOR if type(x) is In else x

    return walk(template)


class _Tensor:
    def __repr__(self) -> str:
        return "T"


_TENSOR = _Tensor()


def _argument_changes(a: tuple, b: tuple) -> str:
    """'argument 1: [-1, 16] -> [-1, 24]' for two ``_constants`` values."""
    (xa, xk), (ya, yk) = a, b
    out = [f"argument {i}: {_py(p)} -> {_py(q)}" for i, (p, q) in enumerate(zip(xa, ya)) if repr(p) != repr(q)]
    out += [f"{k}: {_py(p)} -> {_py(q)}" for (k, p), (_, q) in zip(xk, yk) if repr(p) != repr(q)]
    if len(xa) != len(ya) or len(xk) != len(yk):
        out.append(f"{len(xa)} -> {len(ya)} arguments")
    return ", ".join(out) or f"{a} -> {b}"


def _py(x) -> str:
    return repr(list(x)) if isinstance(x, tuple) else repr(x)


def _at(s: OpSig) -> str:
    return f" (recorded at {s.source})" if s.source else ""


def _change(x, y) -> str:
    (xs, xd), (ys, yd) = x, y
    if xd != yd:
        return f"dtype {xd.replace('torch.', '')} -> {yd.replace('torch.', '')}"
    if len(xs) != len(ys):
        return f"shape {list(xs)} -> {list(ys)}"
    dims = [f"dimension {d}: {p} -> {q}" for d, (p, q) in enumerate(zip(xs, ys)) if p != q]
    return f"shape {list(xs)} -> {list(ys)} (" + ", ".join(dims) + ")"


def _kind(s: OpSig) -> str:
    (shape, dtype), kind = s.outputs[0], s.op[1:-1]
    what = {"data": "device data", "scalar": "a Python number", "rng": "a random key"}.get(kind, kind)
    return f"{what} {list(shape)} {dtype.replace('torch.', '')}"


def diff(old: list[OpSig], new: list[OpSig]) -> str:
    """One line on where two graph signatures first differ, naming the user's line when known."""
    for k, (a, b) in enumerate(zip(old, new)):
        if a == b:
            continue
        if b.op.startswith("<") and a.op.startswith("<"):  # graph inputs: device data, scalars, RNG keys
            user = next((s for s in new if any(j == k for j, _ in s.args)), None)
            used = f", first used by {user.op}{_at(user)}" if user else ""
            if a.op != b.op:
                return f"graph input {k} is {_kind(b)} instead of {_kind(a)}{used}"
            return f"graph input {k} ({b.op[1:-1]}): {_change(a.outputs[0], b.outputs[0])}{used}"
        if a.op != b.op:
            return f"op {k} is {b.op} instead of {a.op}{_at(b)}"
        if a.constants != b.constants:
            return (
                f"{b.op}{_at(b)}: a Python value in its arguments changed: {_argument_changes(a.values, b.values)} "
                "(Python numbers passed as shapes, sizes or dims are baked into the program)"
            )
        if a.inputs != b.inputs:
            changes = [f"input {i}: {_change(x, y)}" for i, (x, y) in enumerate(zip(a.inputs, b.inputs)) if x != y]
            return f"{b.op}{_at(b)}: " + "; ".join(changes or ["its inputs are wired differently"])
        if a.outputs != b.outputs:
            changes = [_change(x, y) for x, y in zip(a.outputs, b.outputs) if x != y]
            return f"{b.op}{_at(b)}: output " + "; ".join(changes)
        return f"{b.op}{_at(b)}: its inputs come from other ops"
    if len(old) != len(new):
        tail = ""
        if len(new) > len(old):
            tail = f"; the first extra one is {new[len(old)].op}{_at(new[len(old)])}"
        return f"the graph has {len(new)} nodes instead of {len(old)}{tail}"
    return "the same ops, shapes and constants: inputs laid out or donated differently, or another setting"


_recompiles: list[dict[str, Any]] = []
_last_graph: dict[str, list[OpSig]] = {}  # sync site -> signature of the last graph compiled there


def explain_miss(site: str, order, leaves) -> str | None:
    """On a compile-cache miss: compare with the last graph compiled at ``site``; log and record the
    difference. Returns the explanation (None for the first graph at a site)."""
    sig = signature(order, leaves)
    old = _last_graph.get(site)
    _last_graph[site] = sig
    if old is None:
        return None
    why = diff(old, sig)
    _recompiles.append({"site": site, "reason": why})
    log.warning("lazyxla recompiles at %s: %s", site, why)
    return why


def recompiles() -> list[dict[str, Any]]:
    """The recompile explanations recorded since the last reset (``config.explain_recompiles``)."""
    return list(_recompiles)


# --- compile regions --------------------------------------------------------------------------------

_local = threading.local()


class CompileRegionError(RuntimeError):
    """Something inside a ``lazyxla.compile`` region broke its promise (an execution, too many graphs)."""


def _regions() -> list:
    stack = getattr(_local, "regions", None)
    if stack is None:
        stack = _local.regions = []
    return stack


def _regions_check(reason: str, where: str) -> None:
    for region in _regions():
        if region.full_graph and not region.closing:
            raise CompileRegionError(
                f"{region.what}: {reason} at {where} forces an execution inside {region.inside}; move it after "
                "the region (or read the value once the region has run)"
            )


class Region:
    """One active ``lazyxla.compile`` region."""

    _graphs: dict[str, dict] = {}  # region name -> {graph key: signature}, across uses of the region

    def __init__(self, name: str, full_graph: bool, max_graphs: int | None) -> None:
        self.name = name
        self.full_graph = full_graph
        self.max_graphs = max_graphs
        self.closing = False
        self.label = f", name={name!r}"
        self.what = f"lazyxla.compile(full_graph=True{self.label})"  # how errors name the region
        self.inside = "the region, splitting it into several programs"

    def saw(self, key, order, leaves) -> None:
        """A program this region produced: raise if it is one distinct graph too many."""
        if self.max_graphs is None:
            return
        seen = Region._graphs.setdefault(self.name, {})
        if key in seen:
            return
        sig = signature(order, leaves)
        if len(seen) >= self.max_graphs:
            last = next(reversed(seen.values()))
            raise CompileRegionError(
                f"lazyxla.compile(max_different_graphs={self.max_graphs}{self.label}): this run of the region "
                f"produced graph number {len(seen) + 1}; it differs from the previous one at {diff(last, sig)}"
            )
        seen[key] = sig


def active_regions() -> list[Region]:
    return _regions()


def enter(region: Region) -> None:
    _regions().append(region)


def leave(region: Region) -> None:
    stack = _regions()
    if stack and stack[-1] is region:
        stack.pop()
    elif region in stack:
        stack.remove(region)
