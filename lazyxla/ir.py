"""The lazy IR: immutable nodes whose structural hash is fixed at creation.

A *value* is ``(node, output_index)``. A node is either a computation (an ``aten`` op applied to
input values and constant arguments) or a leaf: device data (a ``jax.Array``), a Python scalar that
entered tensor math, or an RNG key. Leaves hash by kind and aval only, never by contents, so the
structural hash of a step is the same every step and the compile cache can be keyed by it.

Hashes are also the same in every process (``stable_hash``; Python's own ``hash()`` of strings,
dtypes and ``None`` changes from process to process): a sync orders a program's arguments and results
by them, so every process, and every host of a multi-host run, builds the same program text, which
is what JAX's persistent compilation cache is keyed on.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any, NamedTuple

import torch


class Aval(NamedTuple):
    """Abstract value: what a tensor is, without its contents."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class Leaf(enum.Enum):
    DATA = "data"  # payload: jax.Array on the device
    SCALAR = "scalar"  # payload: Python float that entered tensor math (a graph input, not a constant)
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
    __slots__ = ("op", "inputs", "template", "avals", "hash", "payload", "device", "source", "__weakref__")

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
    tagged with its type and whether it is -1.
    """
    t = type(x)
    if t is tuple:
        return tuple(canonical(e) for e in x)
    if t is int or t is float or t is bool:
        return (t, x, x == -1)
    return x


def stable_hash(*parts: Any) -> int:
    """A 64-bit hash of ``parts`` (through their ``repr``) that is the same in every process.

    Example:
        >>> stable_hash(torch.ops.aten.sin.default, 0) == stable_hash(torch.ops.aten.sin.default, 0)
        True
    """
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little", signed=True)


_bases: dict = {}


def op_hash(op, key: Any, device: int) -> int:
    """The stable hash of an op with its canonical template on a device (memoized)."""
    try:
        return _bases[(op, key, device)]
    except KeyError:
        h = _bases[(op, key, device)] = stable_hash(op, key, device)
        return h


def node(op, inputs: tuple, template: Any, avals: tuple, device: int, base: int) -> Node:
    """A new node for ``op`` over ``inputs``; ``base`` is ``op_hash(op, canonical(template), device)``,
    which the structural hash combines with the inputs' hashes.

    Identical nodes are not merged here: XLA eliminates common subexpressions in the compiled program.
    """
    # a tuple of ints hashes the same in every process
    h = hash((base, tuple([(n.hash, i) for n, i in inputs])))
    return Node(op, inputs, template, avals, h, None, device)


def leaf(kind: Leaf, payload: Any, aval: Aval, device: int) -> Node:
    return Node(kind, (), None, (aval,), op_hash(kind, aval, device), payload, device)
