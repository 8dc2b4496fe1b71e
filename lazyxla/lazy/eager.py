"""Eager mode: each op is computed as soon as it is recorded (``config.eager``, ``lazyxla.eager_mode``).

A debugging mode, as torch_xla's ``torch_xla.experimental.eager_mode``: a failing op raises at its own line
instead of at the next sync, and every value can be inspected without a sync. Each op the user's code
(PyTorch's autograd and optimizers included) sends to the device is still recorded by ``lazy/record.py`` —
the same meta inference, decompositions and rule table — and then its results are computed at once
(``graph.compute_now``): one small program per op, compiled once per op signature and cached like any program,
timed as ``eager_compile`` and ``eager_execute`` (torch_xla's ``EagerOpCompileTime``, ``EagerOpExecuteTime``).
Ops an op runs inside itself (a decomposition's pieces, ``_foreach_*`` split per tensor) belong to that op's
program: only the outermost op of a call is computed. Numbers are those of lazy mode.

Code that must become one program still does: ``lazyxla.compile`` regions (and torch_xla's
``torch_xla.compile``) turn eager mode off inside and back on after, and a ``torch.compile``'d function records
one op per call, computed at once like any op.

Lazy mode pays nothing for this: the op handler ``LazyTensor.__torch_dispatch__`` calls is swapped when the
flag changes (``config.watch``), so only eager mode runs :func:`dispatch_eagerly`.

Example::

    lazyxla.eager_mode(True)
    y = torch.randn(4, 4, device=dev) @ w        # computed now: one program for randn, one for the matmul
    with lazyxla.compile():                       # lazy inside: the region is one program
        loss = model(x).sum(); loss.backward()
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from lazyxla.config import config
from lazyxla.lazy import record
from lazyxla.lazy.graph import compute_now
from lazyxla.lazy.meta import leaves
from lazyxla.lazy.tensor import LazyTensor, set_dispatch
from lazyxla.observe import metrics

_COMPILED_CALL = "eager mode: a torch.compile'd call"
_local = threading.local()  # per thread: inside an op being run eagerly (its inner ops are part of it)


def _tensors(x) -> list[LazyTensor]:
    if type(x) is LazyTensor:
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for t in leaves(x, {}) if type(t) is LazyTensor]
    return []


def dispatch_eagerly(func, args, kwargs):
    """The op handler in eager mode: record the op (``record.dispatch``), then compute, in one program, its
    outputs and the tensor arguments it rebound (in-place updates below functionalization; batch norm's running
    statistics). Arguments it only read stay as they were: ``.to(dev)`` copies into a pending ``empty``, which
    is never computed."""
    if getattr(_local, "inside", False) or not config.eager:  # (not: lazy inside in this thread, config.scoped)
        return record.dispatch(func, args, kwargs)
    before = [(t, t._value) for t in leaves(args, kwargs) if type(t) is LazyTensor]
    _local.inside = True
    try:
        out = record.dispatch(func, args, kwargs)
    finally:
        _local.inside = False
    try:
        with metrics.timer_prefix("eager_"):  # eager_compile, eager_execute: torch_xla's EagerOp*Time
            # (the trigger names the op: with config.explain_recompiles, a new shape of an op is explained
            # against that op's last program, not another op's)
            compute_now(_tensors(out) + [t for t, value in before if t._value is not value], f"eager mode: {func}")
    except BaseException:
        out = None  # noqa: F841  (the traceback keeps this frame: it must not keep the failed op's outputs alive)
        raise
    return out


def computed(out):
    """``out`` (a tensor or a list of them, LazyTensors) computed at once when eager mode is on; returns it.
    For ops recorded without the op handler: a ``torch.compile``'d graph's call (``frontend/dynamo.py``), timed
    as a step's program (``compile``, ``execute``), as torch_xla times a compiled graph.

    Example::

        return computed(outputs)
    """
    if config.eager:
        compute_now(_tensors(out), _COMPILED_CALL)
    return out


def apply(enabled: bool) -> None:
    """Install the op handler for the flag's value (``config.watch("eager", apply)``)."""
    set_dispatch(dispatch_eagerly if enabled else record.dispatch)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Lazy mode inside (eager mode, if it was on, comes back after): what must become one program.

    Example::

        with eager.disabled():
            out = step(x)
    """
    # For the whole process, not this thread only (``config.scoped``): autograd records a region's backward pass on
    # a thread of its own, and that must be lazy too (the region is one program)
    with config.override(eager=False):
        yield


config.watch("eager", apply)
