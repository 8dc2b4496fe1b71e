"""``LazyTensor``: a ``torch.Tensor`` wrapper subclass holding one IR value.

Users never see it directly: every lazyxla tensor they hold is a functionalization wrapper around a
``LazyTensor``, so views and in-place ops reach us as functional ops.
"""

from __future__ import annotations

import contextvars
import weakref

import torch

from lazyxla import torch_private
from lazyxla.device.devices import torch_device
from lazyxla.ir import Aval, Leaf
from lazyxla.lazy.session import session
from lazyxla.util import Memo

# per op: bound once (a global lookup instead of an attribute chain)
_make_wrapper_subclass = torch_private.make_wrapper_subclass
_to_functional = torch_private.to_functional
_from_functional = torch_private.from_functional
_is_functional = torch_private.is_functional
_functional_sync = torch_private.functional_sync
_inference_enabled = torch.is_inference_mode_enabled
_inference_mode = torch_private.InferenceMode

# The session's state, bound once: read per op and per LazyTensor made (the set and list are never replaced, only
# changed in place; see lazy/session.py for what each holds and the thread policy)
_session = session
_live = session.live
_watched = session.watched


class LazyTensor(torch.Tensor):
    _value: tuple  # (Node, output index)
    _aval: Aval  # its shape and dtype, as the recorder keys ops by them
    _piece = False  # a piece of a wide unbind (iterating a tensor): syncs and host reads differ (lazy/pieces.py)

    @staticmethod
    def __new__(cls, value: tuple, aval: Aval, requires_grad: bool = False, fresh: bool = False):
        """``fresh``: ``value`` is new device data or a factory's result (an upload, ``torch.empty``), made from no
        existing value, so it cannot read or hold a replayed step's buffers (``Session.recorded`` does not count it).
        """
        device = torch_device(value[0].device)
        if _inference_enabled() and _making_views.get():
            t = _normal_tensor(cls, aval, device, requires_grad)
        else:
            t = _make_wrapper_subclass(cls, aval.shape, dtype=aval.dtype, device=device, requires_grad=requires_grad)
        t._value = value
        t._aval = aval
        _live.append(weakref.ref(t))
        # (no lock, per the session's thread policy: ``recorded`` is counted by the recording thread only, since
        # the only tensors another thread makes, a DeviceLoader's uploads, are fresh; ``made`` by every thread, and a
        # count lost to another thread only defers left-over work to the next host read)
        _session.made += 1
        if not fresh:
            _session.recorded += 1
        return t

    __torch_function__ = torch_private.disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if len(types) != 1 and not all(issubclass(t, LazyTensor) for t in types):
            # another subclass among the arguments (a DTensor beside a bare local tensor: a user's plain parameter in
            # a foreach step over DTensor ones): its own ``__torch_dispatch__`` decides (DTensor's error names the
            # mix), as for CUDA, where a plain tensor has no dispatch of its own to get in first
            return NotImplemented
        if _watched:
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
# inside a view op's dispatch under inference mode: LazyTensor.__new__ makes normal tensors (in this thread only)
_making_views: contextvars.ContextVar[bool] = contextvars.ContextVar("lazyxla_making_views", default=False)
# op -> whether it is a ``*_copy`` view op (tagged view_copy), filled as ops are seen: one entry per view op used
_view_copies = Memo("lazyxla.lazy.tensor._view_copies", limit=20_000)


def _is_view_copy(func) -> bool:
    known = _view_copies.table.get(func)
    if known is None:
        known = _view_copies.remember(func, torch.Tag.view_copy in func.tags)
    return known


def _dispatch_view(func, args, kwargs):
    """Run the view op ``func`` under inference mode, its results made as normal tensors."""
    token = _making_views.set(True)
    try:
        return _dispatch(func, args, kwargs)
    finally:
        _making_views.reset(token)


def _normal_tensor(cls, aval: Aval, device: torch.device, requires_grad: bool) -> LazyTensor:
    """A LazyTensor made as a normal (not inference) tensor while inference mode is on."""
    with _inference_mode(False):
        return _make_wrapper_subclass(cls, aval.shape, dtype=aval.dtype, device=device, requires_grad=requires_grad)


def _watch(args, kwargs) -> None:
    """Count an op on a watched LazyTensor (an argument, or one in a list argument) and disarm the watch."""
    _session.watch_left -= 1  # (a lost decrement only delays the give-up by an op)
    if _session.watch_left <= 0:
        _session.touch()
        return
    watched = _watched
    for group in (args, (kwargs or {}).values()):
        for a in group:
            if type(a) in (list, tuple):
                if not any(id(e) in watched for e in a):
                    continue
            elif id(a) not in watched:
                continue
            _session.touch()
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
    if _watched:
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
        set_value(lt, value)
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


class Holder:
    """Stands for one pending value in a sync, as a tensor would (a cut's frontier value, the base an iterated
    tensor's pieces view: lazy/cut.py, lazy/pieces.py): the sync rebinds it to its result (``retarget``, which
    checks the result's aval against ``_aval``). Here, beside ``set_value``, as the other place a ``_value`` is set.

    Example::

        h = Holder((node, 0)); graph._run_groups([h], ...); h._value     # the node's computed value
    """

    __slots__ = ("_value", "_aval")

    def __init__(self, value: tuple) -> None:
        self._value = value
        self._aval = value[0].avals[value[1]]


def set_value(lt: LazyTensor, value: tuple) -> None:
    """Make the LazyTensor ``lt`` hold the IR ``value`` ``(node, output index)``: the one way a tensor is rebound
    (a sync's results, a failure's error leaves, a cut, a rebased view, a replayed step's results, placeholders,
    decompositions, kernels), so the checks live here: ``value`` must be of ``lt``'s shape and dtype (a mismatch is
    lazyxla's bug, raised here rather than as a wrong program later), and a tensor that whole-step capture watches
    counts as touched (its next replay then checks every holder of the buffers it takes over: lazy/capture.py).

    Example::

        set_value(lt, (node, 0))
    """
    aval = value[0].avals[value[1]]
    if aval != lt._aval and (aval.shape != lt._aval.shape or aval.dtype != lt._aval.dtype):
        raise AssertionError(f"lazyxla internal error: a {lt._aval} tensor rebound to a value of {aval}")
    if _watched and id(lt) in _watched:
        _session.touch()
    lt._value = value


def retarget(tensors, values) -> None:
    """``set_value`` for each of ``tensors`` and its value in ``values`` (two sequences of the same length).

    Example::

        retarget(pending, [new[(id(t._value[0]), t._value[1])] for t in pending])
    """
    for lt, value in zip(tensors, values, strict=True):
        set_value(lt, value)
