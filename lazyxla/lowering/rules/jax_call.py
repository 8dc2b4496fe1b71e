"""``lazyxla::call_jax``: one call of a user's JAX function, as one op of the lazy IR.

``lazyxla.call_jax`` (``frontend/jax_interop.py``) traces the user's function once per call signature (function,
static arguments, input avals) with ``jax.make_jaxpr``, names it by the digest of that jaxpr (``name_of``: the
same computation gets the same name, whichever Python object computes it, so a lambda made anew every step
still hits the compile cache), registers the flat function under that name (``register``) and records one node
per call: ``call_jax(inputs, name)``. The rule calls the registered function on the node's input arrays inside
the step's ``jax.jit``: the user's JAX code (a Pallas kernel, ``jax.numpy``, a ``custom_vjp``) is part of the
step's one program, traced by jax as any of its own functions would be.

Example::

    register(name, flat_fn)                                       # once per signature (frontend/jax_interop.py)
    n = node(OP, inputs, ((tuple(IN[:k]), name), ()), avals, device, base)          # each call
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

import numpy as np

from lazyxla.lowering.registry import lowers
from lazyxla.ops import ops

OP = ops.call_jax.default  # declared in lazyxla/ops.py

FUNCTIONS: dict[str, Callable] = {}  # name -> flat function (input arrays -> list of output arrays), for the rule
CALLS_PYTHON: set[str] = set()  # names of functions that call back into Python (name_of)
_INTERPRETER = re.compile(r"interpret=Interpret\w*Params\(")  # a pallas_call in jax's TPU/GPU interpreter


def name_of(label: str, closed_jaxpr, owner: object = None) -> str:
    """The name of a traced function: ``label`` (for people reading IR dumps) and a digest of its jaxpr's text and
    of its constants' values (a closure over an array prints as a named constant, whose value must be part of the
    name too).

    jax prints a Python callback (``pure_callback``, ``io_callback``, ``jax.debug``) by its function's name only, so
    two different callbacks of one name would print alike: a jaxpr that calls back into Python is also named by
    ``id(owner)`` (the calling function: a new function object then compiles anew). A ``pallas_call`` in Pallas's
    TPU (or GPU) interpreter prints as ``interpret=InterpretParams(...)`` and lowers to callbacks: it counts too.

    Example::

        name_of("gelu", jax.make_jaxpr(gelu)(x))       # 'gelu-3fa9...'
    """
    text = str(closed_jaxpr.jaxpr)
    h = hashlib.blake2b(text.encode(), digest_size=16)
    for c in closed_jaxpr.consts:
        host = np.asarray(c)
        h.update(repr((host.shape, host.dtype.str)).encode())
        h.update(host.tobytes())
    if "callback" in text or _INTERPRETER.search(text):
        h.update(repr(("owner", id(owner))).encode())
        name = f"{label}-{h.hexdigest()}"
        CALLS_PYTHON.add(name)
        return name
    return f"{label}-{h.hexdigest()}"


def calls_python(order: list) -> bool:
    """Whether a graph's nodes (post-order) hold a JAX function that calls back into Python: its executable holds
    this process's callbacks, so it cannot go to the disk cache (jax cannot serialize it, and an entry named after
    ``id(owner)`` must not be found by another process)."""
    return bool(CALLS_PYTHON) and any(n.op is OP and n.template[0][1] in CALLS_PYTHON for n in order)


def register(name: str, fn: Callable) -> None:
    """Make ``fn`` (flat: input arrays -> list of output arrays) lowerable as ``call_jax(..., name)``. Functions
    with one name compute the same thing (``name_of``), so the first one registered stays."""
    FUNCTIONS.setdefault(name, fn)


@lowers(OP)
def _call_jax(ctx, inputs, fn):
    """One call of a user's JAX function: the registered function on the call's arrays."""
    found = FUNCTIONS.get(fn)
    if found is None:
        raise RuntimeError(f"lazyxla: no JAX function {fn} in this process (a call_jax recorded by another run?)")
    return list(found(*inputs))
