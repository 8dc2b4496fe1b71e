"""The lazy IR: immutable nodes whose structural hash is fixed at creation.

A *value* is ``(node, output_index)``. A node is either a computation (an ``aten`` op applied to
input values and constant arguments) or a leaf: device data (a ``jax.Array``), a Python scalar that
entered tensor math, or an RNG key. Leaves hash by kind and aval only, never by contents, so the
structural hash of a step is the same every step and the compile cache can be keyed by it.

Hashes are also the same in every process (``stable_hash``; Python's own ``hash()`` of strings,
dtypes and ``None`` changes from process to process): a sync orders a program's arguments and results
by them, so every process, and every host of a multi-host run, builds the same program text, which
is what JAX's persistent compilation cache is keyed on.

A recorded graph as a whole is named by ``digest``, the one description of a program that every
caller hashes: the disk cache's entry names, the ``torch.compile`` backend's traced graphs and the
multi-process SPMD check (each adding its own fields). The in-memory compile cache keys on the roots'
hashes instead, which costs O(roots).
"""

from __future__ import annotations

import enum
import hashlib
import math
from typing import Any, NamedTuple

import torch

from lazyxla.util import Memo


class Aval(NamedTuple):
    """Abstract value: what a tensor is, without its contents."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class Leaf(enum.Enum):
    DATA = "data"  # payload: jax.Array on the device
    SCALAR = "scalar"  # payload: Python float (aval float64) or int (int64) in tensor math: a graph input
    RNG = "rng"  # payload: numpy uint32[2] key data for one random op
    ERROR = "error"  # payload: the exception that kept this value from being computed


class ComputeError(RuntimeError):
    """A tensor whose graph failed to lower, compile or run is read (or used) later."""


def raise_if_error(n: Node) -> None:
    if n.op is Leaf.ERROR:
        e = n.payload
        raise ComputeError(
            f"this lazyxla tensor has no value: computing it failed earlier with {type(e).__name__}: {e}"
        ) from e


class In:
    """Placeholder for the i-th input value inside a node's argument template."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __eq__(self, other: object) -> bool:
        return type(other) is In and other.i == self.i

    def __hash__(self) -> int:
        return hash((In, self.i))

    def __repr__(self) -> str:
        return f"%{self.i}"


IN = tuple(In(i) for i in range(4096))


def slot(i: int) -> In:
    return IN[i] if i < len(IN) else In(i)


class Node:
    __slots__ = (
        "op", "inputs", "template", "avals", "hash", "_payload", "device", "source", "seq", "host", "__weakref__"
    )  # fmt: skip

    def __init__(self, op, inputs, template, avals, hash_, payload, device):
        self.op = op  # an OpOverload, or a Leaf kind
        self.inputs = inputs  # tuple of values (node, index)
        self.template = template  # (args, kwargs) with In placeholders for inputs; hashable
        self.avals = avals  # tuple of Aval, one per output
        self.hash = hash_
        self.payload = payload
        self.device = device  # lazyxla device index
        # the user's file:line that recorded it (config.explain_recompiles only); for device data, what made
        # the buffer (a copy from the CPU at file:line, an output of graph <id>, ...), named in errors
        self.source = None
        self.seq = 0  # recording order (config.explain_recompiles only): what recompile explanations align by
        # device data only: a CPU copy of a small integer value the host knows (lazy/known.py); such a node's
        # device array is made when something first asks for its payload (most are never needed on the device)
        self.host = None

    # (node) -> its jax.Array, for device data whose value only the host has so far: installed by lazy/known.py
    # (this module is below the device layer, so it cannot put arrays on devices itself)
    upload = None

    @property
    def payload(self):
        p = self._payload
        if p is None and self.host is not None:
            p = self._payload = Node.upload(self)
        return p

    @payload.setter
    def payload(self, value) -> None:
        self._payload = value

    @property
    def resident(self):
        """The payload if it exists already, without putting a known value on the device (waits, checks)."""
        return self._payload

    @property
    def is_leaf(self) -> bool:
        return type(self.op) is Leaf

    def __repr__(self) -> str:
        if self.is_leaf:
            return f"<{self.op.value} {list(self.avals[0].shape)} {self.avals[0].dtype}>"
        return f"<{self.op} {self.template} -> {[(list(a.shape), a.dtype) for a in self.avals]}>"


Value = tuple  # (Node, int)


def canonical(x: Any) -> Any:
    """A template in a form where equal means the same program, for keys and hashes.

    Python treats ``1``, ``1.0`` and ``True`` as equal (with equal hashes), and gives ``-1`` and ``-2``
    the same hash; as op arguments they mean different things (dtypes, dims), so each number is
    tagged with its type and whether it is -1 (a float zero: whether it is -0.0).
    """
    t = type(x)
    if t is tuple:
        return tuple(canonical(e) for e in x)
    if t is float and x == 0.0:  # 0.0 == -0.0 (equal hashes too), but 1 / x tells them apart
        return (t, x, math.copysign(1.0, x) < 0)
    if t is int or t is float or t is bool:
        return (t, x, x == -1)
    return x


def _blake2b(parts: Any, size: int) -> bytes:
    """``size`` bytes of blake2b over ``repr(parts)``: the one encoding every hash and digest here uses.

    ``repr`` is the same in every process for what IR nodes hold (ops, numbers, strings, dtypes, devices,
    ``Aval``, ``In``, ``Leaf``, tuples of them) and tells apart ``1``, ``1.0`` and ``True``.
    """
    return hashlib.blake2b(repr(parts).encode(), digest_size=size).digest()


def stable_hash(*parts: Any) -> int:
    """A 64-bit hash of ``parts`` (through their ``repr``) that is the same in every process.

    Example:
        >>> stable_hash(torch.ops.aten.sin.default, 0) == stable_hash(torch.ops.aten.sin.default, 0)
        True
    """
    return int.from_bytes(_blake2b(parts, 8), "little", signed=True)


# (op, canonical template, device) -> its stable hash: one per distinct recorded call (the meta cache's keys, less the
# avals), bounded like that cache (lazy/meta.py): templates with changing constants would grow it forever
_bases = Memo("lazyxla.ir._bases", limit=100_000)


def op_hash(op, key: Any, device: int) -> int:
    """The stable hash of an op with its canonical template on a device (memoized)."""
    try:
        return _bases.table[(op, key, device)]
    except KeyError:
        return _bases.remember((op, key, device), stable_hash(op, key, device))


def node(op, inputs: tuple, template: Any, avals: tuple, device: int, base: int) -> Node:
    """A new node for ``op`` over ``inputs``; ``base`` is ``op_hash(op, canonical(template), device)``,
    which the structural hash combines with the inputs' hashes.

    Identical nodes are not merged here: XLA eliminates common subexpressions in the compiled program.
    """
    # a tuple of ints hashes the same in every process
    h = hash((base, tuple([(n.hash, i) for n, i in inputs])))
    return Node(op, inputs, template, avals, h, None, device)


def rewired(n: Node, inputs: tuple) -> Node:
    """A new node computing what ``n`` computes (same op, arguments and outputs) from other ``inputs``,
    with the structural hash those inputs give it.

    Example:
        >>> x = leaf(Leaf.DATA, None, Aval((2,), torch.float32), 0)
        >>> base = op_hash(torch.ops.aten.sin.default, canonical(((IN[0],), ())), 0)
        >>> y = node(torch.ops.aten.sin.default, ((x, 0),), ((IN[0],), ()), x.avals, 0, base)
        >>> rewired(y, ((leaf(Leaf.DATA, None, x.avals[0], 0), 0),)).hash == y.hash
        True
    """
    new = node(n.op, inputs, n.template, n.avals, n.device, op_hash(n.op, canonical(n.template), n.device))
    new.source = n.source
    return new


def leaf(kind: Leaf, payload: Any, aval: Aval, device: int) -> Node:
    return Node(kind, (), None, (aval,), op_hash(kind, aval, device), payload, device)


# ---- the digest of a recorded graph ------------------------------------------------------------------


def wiring(order: list, leaves: list, roots: list = ()) -> tuple[list[tuple], tuple]:
    """A walked graph's edges by position: each node's inputs, and the roots, as ``(position, output)``
    pairs, where the leaves are numbered first, then the nodes of ``order`` (post-order).

    Positions, not identities, are what two recordings of one program have in common; they also say
    which values are shared. Every description of a graph (its digest, ``diagnostics.signature``, the
    IR dump) numbers it this way.

    Example:
        >>> x = leaf(Leaf.DATA, None, Aval((2,), torch.float32), 0)
        >>> y = node(torch.ops.aten.mul.Tensor, ((x, 0), (x, 0)), ((IN[0], IN[1]), ()), x.avals, 0, 0)
        >>> wiring([y], [x], [(y, 0)])
        ([((0, 0), (0, 0))], ((1, 0),))
    """
    index = {id(n): k for k, n in enumerate(leaves)}
    edges = []
    for n in order:
        edges.append(tuple([(index[id(m)], i) for m, i in n.inputs]))
        index[id(n)] = len(index)
    return edges, tuple([(index[id(m)], i) for m, i in roots])


def digest(
    order: list | None,
    leaves: list,
    roots: list,
    *,
    extra: tuple = (),
    baked_scalars: bool = False,
    inputs: dict[int, int] | None = None,
    size: int = 32,
) -> str:
    """The name of a recorded graph, the same in every process: ``size`` bytes of blake2b, in hex.

    It covers, in this order:

    - ``extra``: the caller's own fields (device, flags, donations, input layouts, lazyxla's code...);
    - each leaf: its kind and aval, never its contents. A scalar leaf is an input of the program
      (DESIGN.md decision 4) unless ``baked_scalars``: then its value is a constant of the program and
      part of the name (a ``torch.compile`` trace). ``inputs`` maps leaves (by ``id``) that stand for the
      caller's numbered inputs (a trace's placeholders) to their numbers, which name them instead;
    - each node of ``order``: its op, non-tensor arguments (the template), output avals, and inputs as
      positions (``wiring``), which fixes the sharing;
    - the roots, as positions.

    ``order=None`` names the nodes by the roots' structural hashes instead of walking them: O(roots),
    as the hashes are fixed at creation (DESIGN.md decision 5), for checks run at every sync. Those
    hashes are 64 bits and can collide, so names of executables walk the nodes.

    Example:
        >>> x = leaf(Leaf.DATA, None, Aval((2,), torch.float32), 0)
        >>> base = op_hash(torch.ops.aten.sin.default, ((IN[0],), ()), 0)
        >>> y = node(torch.ops.aten.sin.default, ((x, 0),), ((IN[0],), ()), x.avals, 0, base)
        >>> digest([y], [x], [(y, 0)], extra=("device 0",)) == digest([y], [x], [(y, 0)], extra=("device 0",))
        True
        >>> len(digest(None, [x], [(y, 0)], size=8))
        16
    """
    parts: list = [extra]
    for n in leaves:
        k = inputs.get(id(n)) if inputs else None
        if k is not None:
            parts.append(("input", k, n.avals[0]))
        elif baked_scalars and n.op is Leaf.SCALAR:
            parts.append((n.op.value, n.avals[0], n.payload))
        else:
            parts.append((n.op.value, n.avals[0]))
    if order is None:
        parts.append(tuple([(m.hash, i) for m, i in roots]))
        return _blake2b(parts, size).hex()
    edges, outs = wiring(order, leaves, roots)
    for n, ins in zip(order, edges):
        parts.append((n.op, n.template, n.avals, ins))
    parts.append(outs)
    return _blake2b(parts, size).hex()
