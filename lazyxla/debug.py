"""``lazyxla.debug``: what lazyxla would compile for some tensors, as text.

Example::

    loss = model(x).sum()
    print(lazyxla.debug.stablehlo_text([loss]))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lazyxla.ir import Leaf
from lazyxla.lazy import graph
from lazyxla.lazy.graph import plan
from lazyxla.lazy.tensor import unwrap
from lazyxla.lowering import cache


def _pending(tensors: Sequence[torch.Tensor]):
    lts = [unwrap(t) for t in tensors]
    pending = [t for t in lts if t._value[0].op.__class__ is not Leaf]
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


def ir_text(tensors: Sequence[torch.Tensor]) -> str:
    """The lazy IR of ``tensors``' pending values, one node per line (leaves first; with
    ``config.explain_recompiles`` each node also shows the source line that recorded it).

    Example::

        print(lazyxla.debug.ir_text([loss]))
    """
    pending, _ = _pending(tensors)
    roots, order, leaves, _ = plan(pending)
    return graph.ir_text(order, leaves, roots)
