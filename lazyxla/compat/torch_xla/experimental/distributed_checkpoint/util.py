"""``prime_optimizer``: create an optimizer's state before a checkpoint is loaded into it.

Example::

    prime_optimizer(optimizer)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    manager.restore(step, state)
"""

from __future__ import annotations

import torch

import lazyxla
from lazyxla.compat.torch_xla.distributed.spmd import wrap_if_sharded


def _zero_grad_like(p: torch.Tensor) -> None:
    """Give ``p`` a zero gradient laid out as ``p`` is."""
    p.grad = torch.zeros_like(p)
    if lazyxla.spmd.is_enabled() and wrap_if_sharded(p) is not p:
        mesh, spec = lazyxla.spmd.get_sharding(p)
        if mesh is not None:
            lazyxla.spmd.mark_sharding(p.grad, mesh, spec)


def prime_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Run one ``optimizer.step()`` with zero gradients so that its state (moments, step counts) exists:
    torch.distributed.checkpoint loads in place, into state that must be there. The step changes the state
    (and, for some optimizers, the parameters): call it just before restoring a checkpoint. Returns
    ``optimizer``.

    Example::

        prime_optimizer(optimizer)
        manager.restore(step, {"model": model.state_dict(), "optim": optimizer.state_dict()})
    """
    lazyxla.sync(wait=True)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if isinstance(p, torch.Tensor) and p.requires_grad:
                _zero_grad_like(p)
    optimizer.step()
    lazyxla.sync(wait=True)
    return optimizer
