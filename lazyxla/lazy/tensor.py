"""``LazyTensor``: a ``torch.Tensor`` wrapper subclass holding one IR value.

Users never see it directly: every lazyxla tensor they hold is a functionalization wrapper around a
``LazyTensor``, so views and in-place ops reach us as functional ops.
"""

from __future__ import annotations

import weakref

import torch

from lazyxla import torch_private
from lazyxla.device.devices import torch_device
from lazyxla.ir import Aval, Leaf
from lazyxla.util import Memo

# per op: bound once (a global lookup instead of an attribute chain)
_make_wrapper_subclass = torch_private.make_wrapper_subclass
_to_functional = torch_private.to_functional
_from_functional = torch_private.from_functional
_is_functional = torch_private.is_functional
_functional_sync = torch_private.functional_sync
_inference_enabled = torch.is_inference_mode_enabled
_inference_mode = torch_private.InferenceMode

# Every LazyTensor made since the last scan, as weak references in creation order: sync() finds
# pending work among the live ones, and donation asks which device buffers a tensor still holds.
# (A list of weakrefs costs a tenth of a WeakValueDictionary insert; dead ones are dropped by scans.)
_live: list = []
# How many LazyTensors were ever made (one item, read by a replayed step: when none but ``fresh`` ones was made
# since its last replay, nothing was recorded that could read or hold the buffers it takes over; lazy/capture.py)
made = [0]
# How many of those were fresh device data or factory results (an upload's, ``torch.empty``'s), made from no
# existing value: they cannot hold or read a replay's buffers (``capture._made`` subtracts them, so that moving
# the next batch to the device between two replays asks for no sync and no scan of the live tensors)
fresh = [0]
# ids of the LazyTensors a captured step's next quiet replay changes in place (lazy/capture.py arms it after each
# replay); the first op that reads or writes one of them counts in ``touched`` and disarms it. Empty otherwise, so
# an op costs one truth test of an empty set. Armed, each op scans its arguments: after ``WATCH_OPS`` ops (other
# lazy work between two steps, an evaluation loop) the watch gives up, counting a touch, so that work does not
# pay the scan for long (the next replay then takes its full path).
watched: set = set()
touched = [0]
WATCH_OPS = 256
watch_left = [0]


class LazyTensor(torch.Tensor):
    _value: tuple  # (Node, output index)
    _aval: Aval  # its shape and dtype, as the recorder keys ops by them
    _piece = False  # a piece of a wide unbind (iterating a tensor): syncs and host reads differ (lazy/pieces.py)

    @staticmethod
    def __new__(cls, value: tuple, aval: Aval, requires_grad: bool = False):
        device = torch_device(value[0].device)
        if making_views[0] and _inference_enabled():
            t = _normal_tensor(cls, aval, device, requires_grad)
        else:
            t = _make_wrapper_subclass(cls, aval.shape, dtype=aval.dtype, device=device, requires_grad=requires_grad)
        t._value = value
        t._aval = aval
        _live.append(weakref.ref(t))
        made[0] += 1
        return t

    __torch_function__ = torch_private.disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if watched:
            _watch(args, kwargs)
        if _inference_enabled() and _is_view_copy(func):
            return _dispatch_view(func, args, kwargs or {})
        return _dispatch(func, args, kwargs or {})

    @property
    def pending(self) -> bool:
        return self._value[0].op is not Leaf.DATA

    def __repr__(self) -> str:  # only seen when debugging lazyxla itself
        return f"LazyTensor({self._value[0]!r}[{self._value[1]}])"


# Views under ``torch.inference_mode``. PyTorch makes every tensor made under inference mode an inference tensor
# (no version counter), except a view of a normal tensor, which stays normal and shares its base's version counter.
# A CPU view copies its base's dispatch keys, so that holds by itself; a lazyxla view is a new functionalization
# wrapper whose keys (and so whether it is an inference tensor) come from the LazyTensor it wraps, the result of a
# ``*_copy`` view op (``slice_copy`` for ``t[2:5]``). Made under inference mode, that wrapper was an inference
# tensor, and autograd's view tracking then failed giving it its base's version counter (``Cannot set
# version_counter for inference tensor``: ``t[2:5]``, BERT's ``position_ids[:, :seq]``). So a view op's results
# are made as normal tensors, always: which kind its base is cannot be told here (the op sees the base's inner
# LazyTensor, and an in-place op under inference mode gives a normal tensor an inference-made inner). The one
# difference from CPU: a view of an inference tensor is a normal tensor (``torch.is_inference`` False) that in-place
# ops outside inference mode accept. Every other op's results are inference tensors under inference mode, as on CPU.
making_views = [False]  # inside a view op's dispatch under inference mode: LazyTensor.__new__ makes normal tensors
# op -> whether it is a ``*_copy`` view op (tagged view_copy), filled as ops are seen: one entry per view op used
_view_copies = Memo("lazyxla.lazy.tensor._view_copies", limit=20_000)


def _is_view_copy(func) -> bool:
    known = _view_copies.table.get(func)
    if known is None:
        known = _view_copies.remember(func, torch.Tag.view_copy in func.tags)
    return known


def _dispatch_view(func, args, kwargs):
    """Run the view op ``func`` under inference mode, its results made as normal tensors."""
    outer, making_views[0] = making_views[0], True
    try:
        return _dispatch(func, args, kwargs)
    finally:
        making_views[0] = outer


def _normal_tensor(cls, aval: Aval, device: torch.device, requires_grad: bool) -> LazyTensor:
    """A LazyTensor made as a normal (not inference) tensor while inference mode is on."""
    with _inference_mode(False):
        return _make_wrapper_subclass(cls, aval.shape, dtype=aval.dtype, device=device, requires_grad=requires_grad)


def _watch(args, kwargs) -> None:
    """Count an op on a watched LazyTensor (an argument, or one in a list argument) and disarm the watch."""
    watch_left[0] -= 1
    if watch_left[0] <= 0:
        touched[0] += 1
        watched.clear()
        return
    for group in (args, (kwargs or {}).values()):
        for a in group:
            if type(a) in (list, tuple):
                if not any(id(e) in watched for e in a):
                    continue
            elif id(a) not in watched:
                continue
            touched[0] += 1
            watched.clear()
            return


def live_tensors() -> list[LazyTensor]:
    """Every live LazyTensor, in creation order (dead references are dropped on the way)."""
    seen = len(_live)  # tensors made meanwhile (another thread) are appended after this point and kept
    alive, refs = [], []
    for r in _live[:seen]:
        t = r()
        if t is not None:
            alive.append(t)
            refs.append(r)
    _live[:seen] = refs
    return alive


def _dispatch(func, args, kwargs):
    raise RuntimeError("lazyxla internal error: no op handler installed (lazyxla.lazy.record installs it)")


def set_dispatch(handler) -> None:
    """Route every op on a LazyTensor (``__torch_dispatch__``) to ``handler(func, args, kwargs)``.

    The recorder (``lazy/record.py``) installs its ``dispatch`` when it is imported: it imports this
    module, so this module cannot import it (the layering rule: no cycles). ``_dispatch`` is a module
    global read per op, so the handler costs one global lookup.

    Example::

        set_dispatch(record.dispatch)      # at the end of lazy/record.py
    """
    global _dispatch
    _dispatch = handler


def dispatch_op(func, args, kwargs):
    """Run one aten op on LazyTensors through the installed handler, as ``__torch_dispatch__`` does: the
    device's own kernels (factories) call this, so that eager mode (``lazy/eager.py``) sees their ops too.

    Example::

        out = dispatch_op(torch.ops.aten.randn.default, ([2, 3],), {"device": dev})
    """
    if watched:
        _watch(args, kwargs)
    return _dispatch(func, args, kwargs)


def wrap(lt: LazyTensor) -> torch.Tensor:
    """The user-visible tensor: a functionalization wrapper around ``lt``."""
    return _to_functional(lt)


def rebind(t: torch.Tensor, lt: LazyTensor, value: tuple) -> None:
    """Make ``t`` (a user-visible tensor, or the LazyTensor ``lt`` inside it) hold the IR ``value`` as an in-place
    op would, its views and aliases too (``t.detach()``, a module's ``state_dict()`` entries), without touching
    autograd: no version bump, the same ``grad_fn``.

    Example::

        rebind(t, unwrap(t), (node, 0))
    """
    if t is lt:
        lt._value = value
    else:
        torch_private.replace_inner(t, LazyTensor(value, lt._aval))


def unwrap(t: torch.Tensor) -> LazyTensor:
    """The LazyTensor inside a user-visible lazyxla tensor, after applying pending view updates."""
    if isinstance(t, LazyTensor):
        return t
    if _is_functional(t):
        _functional_sync(t)
        inner = _from_functional(t)
        if isinstance(inner, LazyTensor):
            return inner
    raise TypeError(f"expected a lazyxla tensor, got a tensor on {t.device} of type {type(t).__name__}")
