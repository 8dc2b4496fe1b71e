"""``lazyxla.debug``: what lazyxla would compile for some tensors, as text (StableHLO, XLA's HLO, the lazy IR), and
a hash of that program's shape. Nothing here runs, compiles or changes a tensor.

Example::

    loss = model(x).sum()
    print(lazyxla.debug.stablehlo_text([loss]))
    print(lazyxla.debug.hlo_text([loss]))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lazyxla.ir import Leaf
from lazyxla.lazy import graph
from lazyxla.lazy.graph import plan
from lazyxla.lazy.tensor import unwrap
from lazyxla.lowering import cache


def _pending(tensors: Sequence[torch.Tensor], computed: bool = False):
    """The lazy tensors of ``tensors`` that a program would compute, and their device; with ``computed``, the ones
    already computed too (a program passes them through, as parameters)."""
    lts = [unwrap(t) for t in tensors]
    pending = lts if computed else [t for t in lts if t._value[0].op.__class__ is not Leaf]
    if not pending:
        raise ValueError(
            "these tensors have no pending computation (they are already on the device): record "
            "the step, then ask before lazyxla.sync()"
        )
    devices = {t._value[0].device for t in pending}
    if len(devices) > 1:
        raise ValueError(f"these tensors are pending on several lazyxla devices {sorted(devices)}; ask per device")
    return pending, devices.pop()


def stablehlo_text(tensors: Sequence[torch.Tensor]) -> str:
    """The StableHLO of the program that would compute ``tensors``' pending values (nothing runs).

    In SPMD mode the text carries the inputs' shardings and the recorded sharding constraints
    (``mhlo.sharding`` attributes).

    Example::

        loss.backward(); opt.step()
        print(lazyxla.debug.stablehlo_text([loss, *model.parameters()]))
    """
    pending, device = _pending(tensors)
    roots, order, leaves, _ = plan(pending)
    return cache.lower(order, leaves, roots, device).as_text()


def ir_text(tensors: Sequence[torch.Tensor], computed: bool = False) -> str:
    """The lazy IR of ``tensors``' pending values, one node per line (leaves first; with
    ``config.explain_recompiles`` each node also shows the source line that recorded it). ``computed=True``
    takes tensors already computed too (each a ``data`` leaf returned as it is) rather than raising when none
    is pending.

    Example::

        print(lazyxla.debug.ir_text([loss]))
    """
    pending, _ = _pending(tensors, computed)
    roots, order, leaves, _ = plan(pending)
    return graph.ir_text(order, leaves, roots)


def hlo_text(tensors: Sequence[torch.Tensor]) -> str:
    """XLA's HLO text (``HloModule ...``, before XLA's optimizations) of the program that would compute
    ``tensors``' pending values (nothing runs or compiles). A tensor already computed is a parameter the program
    returns as it is.

    In SPMD mode the parameters carry their layouts and the recorded sharding constraints are
    ``custom-call`` instructions with ``sharding=`` attributes.

    Example::

        print(lazyxla.debug.hlo_text([loss]))     # HloModule jit_fn, ... ENTRY main.1 { ... dot( ... }
    """
    pending, device = _pending(tensors, computed=True)
    roots, order, leaves, _ = plan(pending)
    return cache.lower(order, leaves, roots, device).as_text(dialect="hlo")


def graph_hash(tensors: Sequence[torch.Tensor]) -> int:
    """A number naming the program that would compute ``tensors``: equal for graphs of the same operations on
    inputs of the same shapes, dtypes and layouts under the same settings (whatever the values), different
    otherwise. It is the hash of lazyxla's compile-cache key (a sync may donate buffers, which that key adds),
    so it holds within one process. A tensor already computed counts as an input the program returns.

    Example::

        a = lazyxla.debug.graph_hash([x + 1])
        assert a == lazyxla.debug.graph_hash([y + 1])        # y: another tensor of x's shape and dtype
    """
    pending, _ = _pending(tensors, computed=True)
    return hash(graph.cache_key(pending))
