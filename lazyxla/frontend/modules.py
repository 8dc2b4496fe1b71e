"""Parameters keep their identity, and tied parameters and buffers stay tied, when a module moves to or from
a lazyxla device.

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

Parameter identity, as on CUDA: for CPU <-> CUDA (and dtype changes on one device) PyTorch keeps every
``Parameter`` object and its ``.grad`` object and swaps the converted data into them (``param.data = new``,
``param.grad.data = new_grad``: ``_has_compatible_shallow_copy_type`` is true for two dense CPU/CUDA tensors),
so an optimizer built before ``model.cuda()`` keeps training. For CPU <-> lazyxla that test is false (as for
CPU <-> XLA under torch_xla, whose optimizer-before-``.to`` loop updates nothing), and PyTorch makes a new
``Parameter`` per attribute. lazyxla keeps CUDA's behaviour: after the walk each such new parameter is swapped
into the old object with ``torch.utils.swap_tensors`` (PyTorch's own mechanism under
``torch.__future__.set_swap_module_params_on_conversion(True)``), its gradient into the old gradient object, its
Python attributes kept, and the old object is put back in every slot. A lazyxla -> lazyxla conversion
(``.half()``) already keeps identity through ``param.data = new``. When the swap is impossible (a weak
reference to the parameter, e.g. from ``torch.compile``'s guards; autograd still holding it) the new object
stays and a warning names the optimizer-before-move pattern. Under
``torch.__future__.set_overwrite_module_params_on_conversion(True)`` PyTorch makes new parameters on every
device, and lazyxla leaves them new. Buffers become new objects on every device, as in PyTorch.

``load_state_dict`` copies into the existing parameters in place, so ties survive it. With
``load_state_dict(..., assign=True)`` PyTorch assigns one new ``Parameter`` per state-dict key, which unties a
shared weight on every device (eager too); re-tie by hand (HF: ``model.tie_weights()``) after it.

Example::

    a, b = nn.Embedding(64, 32), nn.Linear(32, 64, bias=False)
    b.weight = a.weight
    opt = torch.optim.SGD(nn.Sequential(a, b).parameters(), lr=0.1)
    m = nn.Sequential(a, b).to(lazyxla.device())
    assert m[0].weight is m[1].weight          # one Parameter, one device copy
    assert opt.param_groups[0]["params"][0] is a.weight     # the optimizer still holds the moved parameter
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import torch
from torch import nn

from lazyxla import torch_private
from lazyxla.device.devices import on_device
from lazyxla.util import warn_once

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


def _parameter_slots(root: nn.Module) -> list[tuple[nn.Module, str, nn.Parameter]]:
    """Every parameter attribute under ``root`` with the object it holds before the walk."""
    return [(slot[0], slot[2], t) for slot, t in _slots(root) if slot[1] == "parameter"]


def _swap_grads(old: torch.Tensor, new_grad: torch.Tensor | None, old_grad: torch.Tensor | None) -> None:
    """Give ``old`` (already holding the converted data) its converted gradient, in the old gradient object
    when it had one (CUDA's ``param.grad.data = new``)."""
    if new_grad is None:
        return
    if old_grad is not None:
        try:
            torch.utils.swap_tensors(old_grad, new_grad)
            new_grad = old_grad
        except RuntimeError:  # someone holds the old gradient: the converted one is still correct
            pass
    old.grad = new_grad


def _swap_into(old: nn.Parameter, new: nn.Parameter) -> str | None:
    """Make the ``Parameter`` object ``old`` hold ``new``'s data and gradient, as PyTorch's ``param.data = new``
    does for CUDA; returns why it could not (then both are left as they were), or None.

    Example::

        _swap_into(cpu_param, lazyxla_param)      # cpu_param now lives on lazyxla, same object
    """
    old_grad, new_grad = old.grad, new.grad
    attributes = old.__dict__  # set_data keeps the object's Python attributes (HF's flags, sharding specs)
    # a gradient's autograd-meta reference would count as a second use of the tensor (as in Module._apply)
    old.grad = new.grad = None
    try:
        torch.utils.swap_tensors(old, new)
    except RuntimeError as e:
        old.grad, new.grad = old_grad, new_grad
        return str(e)
    old.__dict__ = attributes
    new.__dict__ = {}
    _swap_grads(old, new_grad, old_grad)
    return None


def _keep_parameter_objects(held: list[tuple[nn.Module, str, nn.Parameter]]) -> None:
    """Put each parameter that ``_apply`` replaced in a move from or to lazyxla back as the same object."""
    if torch.__future__.get_overwrite_module_params_on_conversion():
        return  # the user asked for new parameters; PyTorch makes them on CUDA too
    kept: dict[int, bool] = {}
    for module, name, old in held:
        new = torch_private.module_parameters(module).get(name)
        if new is old or new is None or not (_on_lazyxla(old) or _on_lazyxla(new)):
            continue
        if id(old) not in kept:
            why = _swap_into(old, new)
            kept[id(old)] = why is None
            if why is not None:
                _warn_new_parameter(module, name, why)
        if kept[id(old)]:
            torch_private.module_parameters(module)[name] = old


def _warn_new_parameter(module: nn.Module, name: str, why: str) -> None:
    warn_once(
        "modules:new-parameter",
        f"lazyxla: moving {type(module).__name__}.{name} made a new Parameter object ({why}); an optimizer built "
        "before model.to(...) still holds the old one and would update nothing: build the optimizer after the "
        "move (or rebuild it), or drop the weak references/pending autograd graph that hold the parameter",
        stacklevel=4,
    )


def _apply_keeping_ties(self: nn.Module, fn: Callable, *args, **kwargs):
    """``nn.Module._apply`` that keeps parameter objects, and shared parameters and buffers one object, across
    lazyxla moves."""
    if getattr(_walk, "active", False):  # a submodule's call inside an outer one: the outer call re-ties
        return _original_apply(self, fn, *args, **kwargs)
    _walk.active = True  # set before the walk too: one walk per .to(), not one per submodule
    try:
        held = _parameter_slots(self)
        groups = _shared_groups(self)
        if not groups:
            result = _original_apply(self, fn, *args, **kwargs)
        else:
            sources = [_get(group[0]) for group in groups]
            shared = {id(t): t for t in sources}
            shared.update({id(t.grad): t.grad for t in sources if t.grad is not None})
            convert = _ConvertOnce(fn, shared)
            result = _original_apply(self, convert, *args, **kwargs)
            _retie(groups, sources, convert)
        # A recurrent module nested in the moved one remade weak references to its new parameters already
        # (its own _apply ran inside this walk), which would block the swap back into the old objects.
        rnns = [m for m in self.modules() if isinstance(m, nn.RNNBase)]
        for m in rnns:
            torch_private.drop_rnn_weight_refs(m)
        _keep_parameter_objects(held)
        for m in rnns:
            torch_private.refresh_rnn_weights(m)
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
