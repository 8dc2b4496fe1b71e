"""Optimizer state loaded onto a lazyxla device keeps its ``step`` counters on the host, as PyTorch intends.

Why: PyTorch's non-fused, non-capturable optimizers (Adam, AdamW, ... with ``foreach`` or not) read their
``step`` counter on the host every step (``_get_value(step)`` is ``step.item()``), and keep it a CPU tensor so that
the read costs nothing. ``Optimizer.load_state_dict`` leaves ``step`` where the loaded state dict has it (only
fused or capturable optimizers, which read it on the device, move it to the parameter's device:
``_process_value_according_to_param_policy``). A state dict whose tensors were all moved to the device
(``lazyxla.load(path, device=dev)``, ``torch.load(path, map_location=dev)``, a user's own ``.to(dev)``) therefore
put every counter on the device, and every ``opt.step()`` then read one per parameter: a sync and a program per
parameter per step (12 programs for 3 steps of a 4-parameter model, 3 compiles more), not the one program of a
fresh run. PyTorch on CUDA has the same cost for ``map_location="cuda"``; lazyxla keeps the counters where a fresh
run has them, because a device read costs far more here (each one runs the pending graph).

How: the per-value placement function of ``load_state_dict`` is wrapped once (one home for every route a state
dict takes to the device): a ``step`` that PyTorch would leave on a lazyxla device, for a group that is neither
fused nor capturable, comes back to the CPU at load time (one small read per parameter, once). Every other value,
and every value of a CPU-only program, is placed exactly as PyTorch places it.

Example::

    opt.load_state_dict(lazyxla.load("ckpt.pt", device=dev)["opt"])
    assert opt.state[p]["step"].device.type == "cpu"      # as in a fresh run: no host read per step
"""

from __future__ import annotations

from collections.abc import Callable

from lazyxla import torch_private
from lazyxla.device.devices import on_device

_original_policy: Callable | None = None


def _reads_step_on_device(param_id, param_groups) -> bool:
    """Whether the group of ``param_id`` is fused or capturable (its kernels read ``step`` on the device)."""
    for group in param_groups:
        if param_id in group["params"]:
            return bool(group.get("fused", False) or group.get("capturable", False))
    return False


def _place_value(param, value, param_id, param_groups, key=None):
    """PyTorch's placement of one loaded optimizer value, with ``step`` kept on the host where it is read there."""
    placed = _original_policy(param, value, param_id, param_groups, key)
    if key == "step" and on_device(placed) and not _reads_step_on_device(param_id, param_groups):
        return placed.cpu()  # where the optimizer's own first step puts it (torch.tensor(0.0), a CPU tensor)
    return placed


def install() -> None:
    """Wrap ``Optimizer.load_state_dict``'s value placement once (idempotent)."""
    global _original_policy
    if _original_policy is None:
        _original_policy = torch_private.optimizer_value_policy()
        torch_private.set_optimizer_value_policy(_place_value)


__all__ = ["install"]
