"""``lazyxla.optimization_barrier_``: XLA's optimization barrier over a group of tensors, applied in place.

XLA may move, fuse or rematerialize computation freely within a program. A barrier pins an order: every
value that enters it is computed before anything that uses one of its outputs, and nothing is moved across
it. Its outputs are its inputs' values, unchanged. torch_xla's ``xm.optimization_barrier_`` is the same
tool (FSDP uses it to keep a layer's parameter gathers from being hoisted or its gradients' reductions from
being merged): one ``torch.ops.lazyxla.optimization_barrier`` node over all the tensors, lowered to
``jax.lax.optimization_barrier``, whose outputs the tensors then hold, as an in-place op would leave them
but without touching autograd (no version bump, the same ``grad_fn``: a barrier changes no value).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lazyxla.device import devices
from lazyxla.lazy.tensor import LazyTensor, rebind, unwrap
from lazyxla.ops import ops


def optimization_barrier_(tensors: Sequence[torch.Tensor]) -> None:
    """Put ``tensors`` (lazyxla tensors) through one XLA optimization barrier, in place: their values are
    unchanged, and in the program that computes them XLA moves no computation across the barrier. In eager
    mode the barrier is one program, run at once.

    Example::

        lazyxla.optimization_barrier_([w_full, b_full])   # gathered parameters: not hoisted, not merged
        y = x @ w_full.T + b_full
    """
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, torch.Tensor) or not devices.on_device(t):
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"optimization_barrier_ takes lazyxla tensors, got one on {where}")
    if not tensors:
        return
    inner = [unwrap(t) for t in tensors]
    outs = ops.optimization_barrier([LazyTensor(lt._value, lt._aval) for lt in inner])
    for t, lt, out in zip(tensors, inner, outs):
        rebind(t, lt, out._value)
