"""Tied parameters and buffers stay tied when a module moves to or from a lazyxla device.

Why: ``nn.Module.to`` (and ``.cuda``, ``.half``, ``.float``, ... — all go through ``nn.Module._apply``)
keeps a parameter's identity only when PyTorch can swap the converted data into the same object
(``param.data = new``), which needs the old and new tensors to have compatible implementations. A CPU
tensor and lazyxla's functionalization wrapper are not compatible, so PyTorch makes a new ``Parameter`` for
every module attribute, and a parameter shared by two modules (GPT-2's ``lm_head.weight is
transformer.wte.weight``) becomes two parameters with two device copies: each gets only its own part of the
gradient and training drifts from eager from step 2 on. Buffers are converted once per attribute the same
way. Eager PyTorch keeps these ties on CPU and for CPU -> CUDA; this module does the same for lazyxla.

How: at the outermost ``_apply`` call, record which (module, attribute) slots hold one tensor object
(parameters, their gradients, and buffers, over every path to every submodule); convert each shared tensor
once (``fn`` memoized by the source tensor); afterwards put the first slot's converted object into every
other slot of its group. Only conversions from or to a lazyxla device are memoized and re-tied: when no
lazyxla tensor is involved, PyTorch's own ``_apply`` runs unchanged (importing lazyxla never changes a CPU
program, including ``torch.__future__.set_overwrite_module_params_on_conversion`` semantics).

``load_state_dict`` copies into the existing parameters in place, so ties survive it. With
``load_state_dict(..., assign=True)`` PyTorch assigns one new ``Parameter`` per state-dict key, which unties a
shared weight on every device (eager too); re-tie by hand (HF: ``model.tie_weights()``) after it.

Example::

    a, b = nn.Embedding(64, 32), nn.Linear(32, 64, bias=False)
    b.weight = a.weight
    m = nn.Sequential(a, b).to(lazyxla.device())
    assert m[0].weight is m[1].weight          # one Parameter, one device copy
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import torch
from torch import nn

from lazyxla import torch_private
from lazyxla.device.devices import on_device

_original_apply: Callable | None = None
_walk = threading.local()  # .active: inside an outermost _apply of this thread

Slot = tuple[nn.Module, str, str]  # (module, "parameter" | "buffer", attribute name)


def _slots(root: nn.Module) -> Iterator[tuple[Slot, torch.Tensor]]:
    """Every parameter and buffer attribute under ``root``, once per (module, name), with its tensor."""
    for module in {id(m): m for _, m in root.named_modules(remove_duplicate=False)}.values():
        for name, p in module.named_parameters(recurse=False, remove_duplicate=False):
            yield (module, "parameter", name), p
        for name, b in module.named_buffers(recurse=False, remove_duplicate=False):
            yield (module, "buffer", name), b


def _shared_groups(root: nn.Module) -> list[list[Slot]]:
    """Groups of slots holding one tensor object, for groups of two or more.

    Example: ``b.weight = a.weight; _shared_groups(nn.Sequential(a, b))`` is
    ``[[(a, "parameter", "weight"), (b, "parameter", "weight")]]``.
    """
    by_tensor: dict[tuple[str, int], list[Slot]] = {}
    for slot, t in _slots(root):
        # by kind too: a tensor both a parameter and a buffer somewhere is not a tie PyTorch keeps on any device
        by_tensor.setdefault((slot[1], id(t)), []).append(slot)
    return [group for group in by_tensor.values() if len(group) > 1]


def _on_lazyxla(t: torch.Tensor) -> bool:
    return on_device(t)


class _ConvertOnce:
    """``fn`` of ``_apply``, converting each shared tensor (or its gradient) once when lazyxla is involved.

    Nested ``_apply`` calls (the submodules') receive this object as their ``fn``. A result is reused only
    for a tensor of ``shared`` whose source or result lives on lazyxla: CPU-only conversions run ``fn`` every
    time, exactly as PyTorch does.
    """

    def __init__(self, fn: Callable, shared: dict[int, torch.Tensor]):
        self.fn = fn
        self.shared = shared  # id -> tensor (held, so no id is reused during the walk)
        self.done: dict[int, torch.Tensor] = {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        key = id(t)
        if key in self.done:
            return self.done[key]
        out = self.fn(t)
        if key in self.shared and (_on_lazyxla(t) or _on_lazyxla(out)):
            self.done[key] = out
        return out

    def involved(self, t: torch.Tensor) -> bool:
        """Whether the shared tensor ``t`` was converted from or to lazyxla (its group must be re-tied)."""
        return id(t) in self.done


def _get(slot: Slot) -> torch.Tensor:
    return getattr(slot[0], slot[2])


def _retie(groups: list[list[Slot]], sources: list[torch.Tensor], convert: _ConvertOnce) -> None:
    """Put each group's first converted object into its other slots (for lazyxla conversions only)."""
    for group, source in zip(groups, sources):
        if not convert.involved(source):
            continue
        first = _get(group[0])
        for module, _, name in group[1:]:
            if getattr(module, name) is not first:
                setattr(module, name, first)  # nn.Module.__setattr__ keeps a Parameter a parameter, a buffer a buffer


def _apply_keeping_ties(self: nn.Module, fn: Callable, *args, **kwargs):
    """``nn.Module._apply`` that keeps shared parameters and buffers one object across lazyxla moves."""
    if getattr(_walk, "active", False):  # a submodule's call inside an outer one: the outer call re-ties
        return _original_apply(self, fn, *args, **kwargs)
    _walk.active = True  # set before the walk too: one walk per .to(), not one per submodule
    try:
        groups = _shared_groups(self)
        if not groups:
            return _original_apply(self, fn, *args, **kwargs)
        sources = [_get(group[0]) for group in groups]
        shared = {id(t): t for t in sources}
        shared.update({id(t.grad): t.grad for t in sources if t.grad is not None})
        convert = _ConvertOnce(fn, shared)
        result = _original_apply(self, convert, *args, **kwargs)
        _retie(groups, sources, convert)
        return result
    finally:
        _walk.active = False


def install() -> None:
    """Wrap ``nn.Module._apply`` once (idempotent)."""
    global _original_apply
    if _original_apply is None:
        _original_apply = torch_private.module_apply()
        torch_private.set_module_apply(_apply_keeping_ties)


__all__ = ["install"]
