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

from lazyxla.config import config
from lazyxla.ir import In, Leaf

log = logging.getLogger("lazyxla")

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP = (_TORCH_DIR, _OWN_DIR, os.path.dirname(os.__file__))


def user_frame(skip: int = 1) -> str:
    """``file:line`` of the innermost frame outside PyTorch, lazyxla and the standard library (on a thread
    with no such frame, such as ``DeviceLoader``'s, the thread's name)."""
    f = sys._getframe(skip)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_SKIP) and not name.startswith("<frozen"):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    thread = threading.current_thread()
    return "<unknown>" if thread is threading.main_thread() else f"<thread {thread.name}>"


def user_stacklevel() -> int | None:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller point at the frame :func:`user_frame`
    names, so that the warning shows the user's line; None on a thread with no such frame (autograd's).

    Example::

        warnings.warn("lazyxla: ...", stacklevel=user_stacklevel() or 1)
    """
    f, level = sys._getframe(1), 1
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_SKIP) and not name.startswith("<frozen"):
            return level
        f, level = f.f_back, level + 1
    return None


def library_frame(skip: int = 1) -> str | None:
    """The innermost two PyTorch frames (``torch/...py:line in function``) when PyTorch's own code made the call,
    else None: the user's line alone does not say why a plain ``opt.step()`` read the device; the optimizer's line
    does (``torch/optim/optimizer.py:95 in _get_value, from torch/optim/adam.py:528 in _single_tensor_adam``)."""
    f = sys._getframe(skip)
    while f is not None and f.f_code.co_filename.startswith(_OWN_DIR):
        f = f.f_back
    lines = []
    while f is not None and f.f_code.co_filename.startswith(_TORCH_DIR) and len(lines) < 2:
        name = os.path.relpath(f.f_code.co_filename, os.path.dirname(_TORCH_DIR))
        lines.append(f"{name}:{f.f_lineno} in {f.f_code.co_name}")
        f = f.f_back
    return ", from ".join(lines) or None


# --- sync attribution -------------------------------------------------------------------------------

_syncs: collections.Counter = collections.Counter()
_via: dict = {}  # (reason, user line) -> the PyTorch line that made the read, for syncs PyTorch's code made
# Recording order (``config.explain_recompiles``): the count of ops recorded so far, and at the last two syncs
# (with their triggers), which tell the work a sync left pending from the work recorded since.
_clock = [0]
_marks: collections.deque = collections.deque(maxlen=2)


def note_recorded(n, skip: int = 2) -> None:
    """``config.explain_recompiles``: keep the user's line that recorded node ``n`` and its recording order."""
    n.source = user_frame(skip + 1)
    _clock[0] += 1
    n.seq = _clock[0]


def note_sync(reason: str) -> str:
    """Count a sync by (reason, user line); returns the line, with the PyTorch line that made the read when
    PyTorch's code made it (``train.py:40 (via torch/optim/adam.py:528 in _single_tensor_adam)``)."""
    where = user_frame(2)
    _syncs[(reason, where)] += 1
    via = library_frame(2)
    if via is not None:
        _via[(reason, where)] = via
        where = f"{where} (via {via})"
    _marks.append((_clock[0], f"{reason} at {where}"))
    _regions_check(reason, where)
    return where


def syncs() -> list[dict[str, Any]]:
    """Every sync trigger seen since the last reset: reason, user ``file:line``, count (most first), and ``via``:
    the PyTorch line that made the read, when PyTorch's code made it (an optimizer's ``step.item()``).

    Example::

        [{"reason": ".item()", "where": "train.py:40", "count": 12, "via": "torch/optim/adam.py:528 in ..."}]
    """
    return [
        {"reason": r, "where": w, "count": n, **({"via": _via[(r, w)]} if (r, w) in _via else {})}
        for (r, w), n in _syncs.most_common()
    ]


def reset() -> None:
    _syncs.clear()
    _via.clear()
    _recompiles.clear()
    _last_graph.clear()
    _marks.clear()


# --- recompile explanations -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OpSig:
    """What decides the compiled program, for one node or graph input: op (``<data>``, ``<scalar>``, ``<rng>``
    for inputs), constants, inputs (positions and avals), output avals; and, not compared, the source line that
    recorded it (for an input: what made it), the constants themselves, the op, and whether it was recorded
    before the previous sync (work that sync left pending)."""

    op: str
    constants: str  # repr of ``values``: equal when the program is (1, 1.0 and True differ)
    args: tuple
    inputs: tuple
    outputs: tuple
    source: str | None = dataclasses.field(default=None, compare=False)
    values: tuple = dataclasses.field(default=(), compare=False)
    overload: Any = dataclasses.field(default=None, compare=False)
    pending: bool = dataclasses.field(default=False, compare=False)
    donated: bool = dataclasses.field(default=False, compare=False)  # an input whose buffer the program takes

    @property
    def is_input(self) -> bool:
        return self.op.startswith("<")

    @property
    def key(self) -> str:
        """What two graphs share for this entry when only its shapes or constants changed (not its line: a
        region's body may run from two call sites)."""
        return self.op


def signature(order, leaves, pending_before: int = 0, donated=()) -> list[OpSig]:
    """A comparable description of a graph, for ``diff``: its ops in the order they were recorded, each graph
    input just before its first use, wired by position in that sequence.

    The recording order (``config.explain_recompiles`` keeps it) is the user's program order, the same from
    step to step whatever changed; the order of a program's arguments is not (it follows the roots' hashes,
    which change with any shape), so inputs are matched by what first uses them, not by argument position.
    Nodes recorded without it keep the walk's post-order. Ops recorded up to ``pending_before`` (a recording
    count) are marked ``pending``, and the leaves at the indices ``donated`` are marked ``donated``.
    """
    given = {id(leaves[i]) for i in donated}
    nodes = sorted(order, key=lambda n: n.seq)
    if not _inputs_first(nodes):  # (explanations turned off and on again while recording: the walk's order)
        nodes = list(order)
    sig: list[OpSig] = []
    pos: dict[int, int] = {}
    for n in nodes:
        for m, _ in n.inputs:
            if id(m) not in pos:
                pos[id(m)] = len(sig)
                sig.append(_input_sig(m, id(m) in given))
        args = tuple((pos[id(m)], i) for m, i in n.inputs)
        ins = tuple((tuple(m.avals[i].shape), str(m.avals[i].dtype)) for m, i in n.inputs)
        outs = tuple((tuple(a.shape), str(a.dtype)) for a in n.avals)
        values = _constants(n.template)
        pending = 0 < n.seq <= pending_before
        pos[id(n)] = len(sig)
        sig.append(OpSig(str(n.op), repr(values), args, ins, outs, n.source, values, n.op, pending))
    return sig


def _inputs_first(nodes) -> bool:
    """Whether every node comes after the nodes it uses (recording order does, unless part of it is unknown)."""
    seen = set()
    for n in nodes:
        if any(id(m) not in seen and m.op.__class__ is not Leaf for m, _ in n.inputs):
            return False
        seen.add(id(n))
    return True


def _input_sig(n, donated: bool) -> OpSig:
    a = n.avals[0]
    return OpSig(f"<{n.op.value}>", "", (), (), ((tuple(a.shape), str(a.dtype)),), n.source, donated=donated)


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


def _argument_changes(s: OpSig, a: tuple, b: tuple) -> str:
    """'size: [-1, 16] -> [-1, 24]. `size` is ...' for two ``_constants`` values of op ``s``: each changed
    argument by name, then why the first one is part of the program and how to keep it out."""
    (xa, xk), (ya, yk) = a, b
    schema = _schema_args(s.overload)
    positional = [x for x in schema.values() if not x.kwarg_only]
    changed = [(positional[i] if i < len(positional) else None, i, p, q) for i, (p, q) in enumerate(zip(xa, ya))]
    changed += [(schema.get(k), k, p, q) for (k, p), (_, q) in zip(xk, yk)]
    changed = [(arg, i, p, q) for arg, i, p, q in changed if repr(p) != repr(q)]
    out = [f"{arg.name if arg is not None else _name(i)}: {_py(p)} -> {_py(q)}" for arg, i, p, q in changed]
    if len(xa) != len(ya) or len(xk) != len(yk):
        out.append(f"{len(xa)} -> {len(ya)} arguments")
    text = ", ".join(out) or f"{a} -> {b}"
    if changed:
        arg, i, _, q = changed[0]
        text += f". {_why_baked(arg, i, q)}"
    return text


def _name(i) -> str:
    return f"argument {i}" if type(i) is int else i


def _schema_args(op) -> dict:
    """The op's schema arguments by name (in order), or {} for a node that is not an aten op."""
    schema = getattr(op, "_schema", None)
    return {a.name: a for a in schema.arguments} if schema is not None else {}


def _why_baked(arg, i, value) -> str:
    """Why a changed Python value is part of the program, and how to make it an input instead."""
    tensor = "pass a 0-d tensor instead (torch.tensor(value, device=...)) to make it a program input"
    name = f"`{arg.name}`" if arg is not None else _name(i)
    if arg is None or not _is_scalar_arg(arg.type):
        fix = "keep such values to a few (pad lengths to a few sizes)"
        if arg is not None and arg.name in _POSITIONS:
            fix += ", or index with a tensor on the device (x.index_select(0, torch.arange(n, device=dev) + start))"
            if not config.dynamic_positions:
                fix += "; lazyxla.config.dynamic_positions (off) makes a select's or fixed-size slice's position "
                fix += "an input"
        return (
            f"{name} is an int argument of the op (a shape, size, dim or position): part of the program, so each "
            "value compiles a program of its own (Python numbers used as tensor operands, as in `t + step`, are "
            f"program inputs instead). To avoid it, {fix}"
        )
    if type(value) is bool:
        return f"{name} is a bool, which is part of the program; {tensor}"
    if value in (0, 1, -1):
        return f"0 and ±1 stay constants where they simplify the program ({name}); {tensor}"
    return f"{name} decides the output's shape or how the op computes, so it is part of the program; {tensor}"


# int arguments that are positions in a tensor (select, slice, narrow, index_fill...): a tensor index does instead
_POSITIONS = frozenset({"index", "start", "end", "offset"})


def _is_scalar_arg(t) -> bool:
    if isinstance(t, torch.OptionalType):
        return _is_scalar_arg(t.getElementType())
    return isinstance(t, (torch.NumberType, torch.TensorType, torch.FloatType))


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
    """'device data [8, 16] float32 (copied from the CPU at train.py:7)', 'a Python int', 'a random key [2] uint32'."""
    (shape, dtype), kind = s.outputs[0], s.op[1:-1]
    if kind == "scalar":
        return "a Python int" if dtype == "torch.int64" else "a Python float"
    what = {"data": "device data", "rng": "a random key"}.get(kind, kind)
    made = f" ({s.source})" if s.source else ""
    return f"{what} {list(shape)} {dtype.replace('torch.', '')}{made}"


def _what(s: OpSig) -> str:
    return _kind(s) if s.is_input else f"{s.op}{_at(s)}"


def _input(sig: list[OpSig], k: int) -> str:
    """'graph input 2' for the input at position ``k`` (inputs numbered by first use)."""
    return f"graph input {sum(1 for s in sig[:k] if s.is_input)}"


def _op(sig: list[OpSig], k: int) -> str:
    """'op 12' for position ``k`` (ops numbered in recording order)."""
    return f"op {sum(1 for s in sig[:k] if not s.is_input)}"


def _first_user(sig: list[OpSig], k: int) -> str:
    user = next((s for s in sig[k + 1 :] if any(j == k for j, _ in s.args)), None)
    return f", first used by {user.op}{_at(user)}" if user else ""


def diff(old: list[OpSig], new: list[OpSig]) -> str:
    """One line on where two graph signatures first differ, naming the user's line when known.

    Both are in recording order (``signature``): the first difference is the first changed input shape or
    dtype, Python value, or op in the user's program order; ops one graph has and the other lacks (pending
    work carried over, a branch taken) are named as such.
    """
    k = next((k for k, (a, b) in enumerate(zip(old, new)) if a != b), None)
    if k is None:
        if len(old) == len(new):
            return _donation(old, new)
        k = min(len(old), len(new))
        return _extra(new, k, len(new) - k) if len(new) > k else _missing(old, new, k, len(old) - k)
    if old[k].key == new[k].key and _user(old, k) == _user(new, k):
        return _substitution(old, new, k)
    return _shifted(old, new, k) or _diverged(old, new, k)


def _donation(old: list[OpSig], new: list[OpSig]) -> str:
    """Two graphs alike in ops, shapes and constants: the first input one donates and the other does not."""
    k = next((k for k, (a, b) in enumerate(zip(old, new)) if a.donated != b.donated), None)
    if k is None:
        return "the same ops, shapes and constants: inputs laid out differently, or another setting"
    now, then = ("gives", "kept") if new[k].donated else ("keeps", "gave")
    return (
        f"the same ops, shapes and constants, but this program {now} the buffer of {_input(new, k)} "
        f"({_kind(new[k])}){_first_user(new, k)} to its outputs, where the last one compiled here {then} it: a "
        "program may reuse the buffers no live tensor holds after the sync, so a tensor kept alive in one step "
        "and not in another (or a caller's reference) makes two programs"
    )


def _user(sig: list[OpSig], k: int) -> str | None:
    """The key of the first op that uses input ``k`` (None for an op): inputs correspond when their users do."""
    if not sig[k].is_input:
        return None
    return next((s.key for s in sig[k + 1 :] if any(j == k for j, _ in s.args)), None)


_WINDOW = 8  # entries that must agree after an insertion for ``_shifted`` to call it one
_SEARCH = 4096  # how far ``_shifted`` looks for the graphs to agree again


def _shifted(old: list[OpSig], new: list[OpSig], k: int) -> str | None:
    """When one graph has extra entries at ``k`` and then agrees with the other again: name them."""
    keys_old = [s.key for s in old[k : k + _SEARCH + _WINDOW]]
    keys_new = [s.key for s in new[k : k + _SEARCH + _WINDOW]]
    for d in range(1, _SEARCH):
        w = min(_WINDOW, len(keys_old), len(keys_new) - d)
        if w > 0 and keys_new[d : d + w] == keys_old[:w]:
            return _extra(new, k, d)
        w = min(_WINDOW, len(keys_new), len(keys_old) - d)
        if w > 0 and keys_old[d : d + w] == keys_new[:w]:
            return _missing(old, new, k, d)
        if d >= max(len(keys_old), len(keys_new)):
            break
    return None


def _unmatched(sig: list[OpSig], k: int, d: int, op: str, ours: bool) -> str:
    """``sig[k:k+d]``, entries one graph has and the other lacks (``ours``: this graph has them), at ``op``."""
    part = sig[k : k + d]
    counts = f"{_count(sum(not s.is_input for s in part), 'op')} and {_count(sum(s.is_input for s in part), 'input')}"
    lines = list(dict.fromkeys(s.source for s in part if not s.is_input and s.source))
    recorded = f"; they were recorded at {', '.join(lines[:3])}{', ...' if len(lines) > 3 else ''}" if lines else ""
    first = next((s for s in part if not s.is_input), part[0])
    if ours:
        pending = " (recorded before the previous sync, which left them pending)" if first.pending else ""
        what = f"this graph has {counts} that the last one compiled here did not have{pending}"
    else:
        pending = " (work left pending before its sync)" if first.pending else ""
        what = f"the last graph compiled here had {counts} that this one does not{pending}"
    return f"at {op} {what}: the first {'is' if ours else 'was'} {_what(first)}{recorded}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _extra(new: list[OpSig], k: int, d: int) -> str:
    return _unmatched(new, k, d, _op(new, k), ours=True)


def _missing(old: list[OpSig], new: list[OpSig], k: int, d: int) -> str:
    return _unmatched(old, k, d, _op(new, k), ours=False)


def _diverged(old: list[OpSig], new: list[OpSig], k: int) -> str:
    a, b = old[k], new[k]
    if a.is_input and b.is_input:
        return (
            f"from {_op(new, k)} on the graph differs from the last one compiled here: {_input(new, k)} is "
            f"{_kind(b)}{_first_user(new, k)}, where that one had {_kind(a)}{_first_user(old, k)}"
        )
    became = _now_an_input(old, new, k) if b.is_input else None
    if became:
        return became
    if b.is_input:
        return (
            f"from {_op(new, k)} on the graph differs from the last one compiled here: it reads {_input(new, k)} "
            f"({_kind(b)}){_first_user(new, k)}, where that one computed {a.op}{_at(a)}"
        )
    if a.is_input:
        return (
            f"from {_op(new, k)} on the graph differs from the last one compiled here: it computes {b.op}{_at(b)}, "
            f"where that one read {_kind(a)}"
        )
    return f"{_op(new, k)} is {b.op}{_at(b)} instead of {a.op}{_at(a)}"


# lazy/positions.py's ops, each with the aten op it replaces once a position changes, and the position's argument
_POSITION_OPS = {
    "lazyxla.dynamic_select.default": ("aten.select_copy.int", 2),
    "lazyxla.dynamic_slice.default": ("aten.slice_copy.Tensor", 2),
    "lazyxla.dynamic_select_scatter.default": ("aten.select_scatter.default", 3),
    "lazyxla.dynamic_slice_scatter.default": ("aten.slice_scatter.default", 3),
}


def _now_an_input(old: list[OpSig], new: list[OpSig], k: int) -> str | None:
    """When ``new[k]`` is the Python int that a select's or slice's position became (``lazy/positions.py``) where
    the old graph had the aten op with the position baked in: say so; else None."""
    user = next((s for s in new[k + 1 :] if any(j == k for j, _ in s.args)), None)
    a = old[k]
    if user is None or _POSITION_OPS.get(user.op, ("",))[0] != a.op:
        return None
    position = _POSITION_OPS[user.op][1]
    args = _schema_args(a.overload)
    name = list(args)[position] if len(args) > position else "position"
    given = a.values[0][position] if a.values and len(a.values[0]) > position else "?"
    return (
        f"{a.op}{_at(a)}: its `{name}` ({given} in the last program compiled here) changed after a sync, so it is "
        f"a program input from now on ({user.op}): a position that changes from one sync to a later one "
        "compiles once more, not once per value (lazyxla.config.dynamic_positions)"
    )


def _substitution(old: list[OpSig], new: list[OpSig], k: int) -> str:
    """The same op or input at ``k`` in both graphs, changed: its kind, shape, dtype, constants or wiring."""
    a, b = old[k], new[k]
    if a.is_input:
        if a.op != b.op:
            return f"{_input(new, k)} is {_kind(b)} instead of {_kind(a)}{_first_user(new, k)}"
        made = f" ({b.op[1:-1]}{': ' + b.source if b.source else ''})"
        return f"{_input(new, k)}{made}: {_change(a.outputs[0], b.outputs[0])}{_first_user(new, k)}"
    if a.constants != b.constants:
        return f"{b.op}{_at(b)}: a Python value in its arguments changed: {_argument_changes(b, a.values, b.values)}"
    if a.inputs != b.inputs:
        changes = [f"input {i}: {_change(x, y)}" for i, (x, y) in enumerate(zip(a.inputs, b.inputs)) if x != y]
        return f"{b.op}{_at(b)}: " + "; ".join(changes or ["its inputs are wired differently"])
    if a.outputs != b.outputs:
        changes = [_change(x, y) for x, y in zip(a.outputs, b.outputs) if x != y]
        return f"{b.op}{_at(b)}: output " + "; ".join(changes)
    return f"{b.op}{_at(b)}: its inputs come from other ops"


def _growth(order, old: list[OpSig], pending_before: int) -> str | None:
    """'the graph grows ...' when this graph is larger than the last one compiled here because it holds work
    recorded before the previous sync (up to the recording count ``pending_before``); None otherwise."""
    carried = sorted((n for n in order if 0 < n.seq <= pending_before), key=lambda n: n.seq)
    ops_old = sum(not s.is_input for s in old)
    if not carried or len(order) <= ops_old:
        return None
    # the pending values this step's work consumed: the carried ops no other carried op uses
    inner = {id(m) for n in carried for m, _ in n.inputs}
    left = collections.Counter(f"{n.op} at {n.source}" for n in carried if id(n) not in inner)
    named = ", ".join(f"{what}{f' ({c} values)' if c > 1 else ''}" for what, c in list(left.items())[:3])
    named += ", ..." if len(left) > 3 else ""
    behind = len(carried) - sum(left.values())
    return (
        f"the graph grows from sync to sync ({ops_old} -> {len(order)} ops): it holds {len(carried)} ops recorded "
        f"before the previous sync ({_marks[0][1]}), which left them pending: {named}"
        + (f", with {behind} ops they depend on" if behind else "")
        + ". A host read computes what it reads (and, in one process, the work the previous read at its line left "
        "pending); work recorded before it that it did not need stays pending into a later program: call "
        "lazyxla.sync() after the read (it computes every pending tensor), or read once the step's updates are recorded"
    )


_recompiles: list[dict[str, Any]] = []
_last_graph: dict[str, list[OpSig]] = {}  # sync site -> signature of the last graph compiled there


def explain_miss(site: str, order, leaves, donated=()) -> str | None:
    """On a compile-cache miss: compare with the last graph compiled at ``site``; log and record the
    difference. Returns the explanation (None for the first graph at a site). ``donated``: the indices of the
    leaves whose buffers the program may take."""
    pending_before = _marks[0][0] if len(_marks) == 2 else 0
    sig = signature(order, leaves, pending_before, donated)
    old = _last_graph.get(site)
    _last_graph[site] = sig
    if old is None:
        return None
    why = _growth(order, old, pending_before) or diff(old, sig)
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
                f"{region.preamble}{region.what}: {reason} at {where} forces an execution inside {region.inside}; "
                "move it after "
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
        # torch_xla's words for the same error (its tests and users match them), before ours
        self.preamble = "Unexpected execution happens inside the compiled function, exiting: "

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
