"""The layout a lazyxla view would have on the CPU, and PyTorch's check of a written tensor's layout.

A lazyxla tensor is a functionalization wrapper whose strides are its value's, contiguous whatever view it is:
``x.expand(3, 3)`` reports strides (3, 1), not (0, 1). PyTorch's kernels refuse to write to a tensor in which
several elements share one memory location (``torch.ones(3).expand(3, 3).add_(1)``: "unsupported operation: more
than one element of the written-to tensor refers to a single memory location"); on lazyxla, functionalization
wrote the sum of the view's elements back to the base instead (4s, no error). Functionalization keeps the ops a
view was made by (its view metas): replayed on a meta tensor of its base's shape, they give the sizes, strides and
offset the view has on the CPU (``cpu_layout``).

``check_written`` runs in the AutogradPrivateUse1 kernels of in-place and ``out=`` ops (frontend/kernels.py). A
written tensor that is no view costs one C call; a view costs its view-meta list, and only a chain holding an
``expand`` or ``as_strided`` (the views that make a stride 0) is replayed. When the replayed layout overlaps,
PyTorch's CPU kernel runs once on stand-ins of that layout and its overlap error, if it raises one, is raised at
the call (not every op checks: ``fill_`` and ``index_put_`` write to an expanded tensor). Memoized per op and
view chain.

Example::

    torch.ones(3, device=dev).expand(3, 3).add_(1)    # RuntimeError: unsupported operation: more than one ...
"""

from __future__ import annotations

import math
import warnings

import torch
from torch.utils.weak import WeakIdKeyDictionary

from lazyxla import torch_private
from lazyxla.util import Memo

aten = torch.ops.aten
_META = torch.device("meta")
_OVERLAP = "more than one element of the written-to tensor refers to a single memory location"
_UNSUPPORTED = "unsupported operation:"  # PyTorch's overlap errors (internal, input/output, index ops)
# view metas whose op can give a stride 0 (every overlap starts with one of them)
_STRIDE_0 = frozenset({"expand_ViewMeta", "as_strided_ViewMeta"})
# Memo tables (lazyxla.util.Memo) keyed by view chains and call signatures, which may keep changing: the oldest
# leave past 10,000 entries (a layout entry holds a meta tensor, no data)
_LIMIT = 10_000
# (base shape, dtype, chain) -> a meta tensor with the view's CPU layout, or None
_layouts = Memo("lazyxla.frontend.layout._layouts", _LIMIT)
# (id(op), base shape, dtype, chain) -> the CPU's overlap error message, or None
_verdicts = Memo("lazyxla.frontend.layout._verdicts", _LIMIT)
# view meta class name -> the view op it replays (one per view op)
_ops = Memo("lazyxla.frontend.layout._ops", 1_000)


def cpu_layout(t: torch.Tensor) -> torch.Tensor | None:
    """A meta tensor with the sizes, strides and storage offset the lazyxla view ``t`` would have on the CPU; None
    where its base is not known (a view of a view of part of a storage, ...).

    Example::

        cpu_layout(torch.ones(3, 1, device=dev).expand(3, 4)).stride()     # (1, 0)
    """
    key = _key(t)
    return None if key is None else _layout(key)


def check_scatter_layout(size, stride, storage_offset=None) -> None:
    """Raise PyTorch's internal-overlap error if ``as_strided_scatter`` writes a layout whose elements share memory
    (a stride 0 in a dim of size > 1), as the CPU's kernel does when it copies ``src`` into it.

    Example::

        check_scatter_layout((2, 3), (1, 0))     # RuntimeError: unsupported operation: more than one element ...
    """
    if 0 not in stride:  # every overlap the CPU refuses has a stride 0
        return
    target = torch.empty_strided(size, stride, device=_META)
    if torch_private.has_internal_overlap(target):
        raise RuntimeError(
            f"unsupported operation: {_OVERLAP}. Please clone() the tensor before performing the operation."
        )


def copies_on_reshape(t: torch.Tensor, shape) -> bool:
    """Whether ``t.reshape(shape)`` copies on the CPU: ``t`` is a view whose CPU layout cannot be viewed as
    ``shape`` (``x.t().reshape(-1)``). The wrapper's own strides are contiguous, so PyTorch's reshape would make a
    view, and a write through it would reach ``x``, where the CPU's copy leaves ``x`` alone. Memoized per view
    chain and shape; False where the layout is unknown or ``shape`` is invalid (the reshape raises its own error).

    Example::

        copies_on_reshape(torch.ones(5, 5, device=dev).t(), (25,))     # True
    """
    key = _key(t)
    if key is None or not key[2]:
        return False
    try:
        shape = tuple(shape)
        found = _reshapes.table.get((key, shape))
    except TypeError:  # symbolic sizes: unhashable, and lazyxla records none
        return False
    if found is None:
        layout = _layout(key)
        try:
            found = layout is not None and not layout.reshape(shape)._is_view()
        except Exception:  # an invalid shape: PyTorch's reshape raises the error itself
            found = False
        _reshapes.remember((key, shape), found)
    return found


def copies_on_contiguous(t: torch.Tensor) -> bool:
    """Whether ``t.contiguous()`` copies on the CPU: ``t`` is a view whose CPU layout is not contiguous
    (``x.t()``, ``x[:, 0]``), though the wrapper reports contiguous strides. Memoized per view chain.

    Example::

        copies_on_contiguous(torch.ones(5, 5, device=dev).t())     # True
    """
    key = _key(t)
    if key is None or not key[2]:
        return False
    layout = _layout(key)
    return layout is not None and not layout.is_contiguous()


# ((base shape, dtype, chain), shape) -> whether reshape copies on the CPU
_reshapes = Memo("lazyxla.frontend.layout._reshapes", _LIMIT)


def check_written(op, args: tuple, kwargs: dict, written) -> None:
    """Raise PyTorch's internal-overlap error if ``op`` (an in-place or out= overload) writes to a tensor of
    ``written`` whose CPU layout has elements sharing a memory location and PyTorch's CPU kernel refuses it.

    Example::

        check_written(aten.add_.Tensor, (y, 1), {}, (y,))      # y = x.expand(3, 3): raises
    """
    for t in written:
        # a functionalization wrapper's view only (a tensor subclass wrapping one, e.g. XLAShardedTensor, has no
        # view metas of its own: its inner tensor's op comes here again)
        if not (isinstance(t, torch.Tensor) and torch_private.is_view(t) and torch_private.is_functional(t)):
            continue
        if not any(type(m).__name__ in _STRIDE_0 for m in torch_private.view_meta_sequence(t)):
            continue
        key = _key(t)
        if key is None:
            continue
        verdict_key = (id(op), *key)
        if verdict_key not in _verdicts.table:
            _verdicts.remember(verdict_key, _cpu_verdict(op, args, kwargs, t, _layout(key)))
        message = _verdicts.table[verdict_key]
        if message is not None:
            raise RuntimeError(message)


def check_inputs(op, args: tuple, kwargs: dict, written, inputs) -> None:
    """Raise PyTorch's input/output overlap error if ``op`` writes to a tensor of ``written`` that shares memory
    with a tensor of ``inputs`` (the op's other tensor arguments) in a way PyTorch's CPU kernel refuses.

    On the CPU, ``y[:9].copy_(y[1:10])`` raises "unsupported operation: some elements of the input tensor and the
    written-to tensor refer to a single memory location" (a partial overlap; ``x.copy_(x)`` is allowed), and
    ``y.index_add_(0, i, y[:3])`` refuses any overlap. On lazyxla functionalization computed such ops out of place,
    silently. A tensor aliases a written one when it is the same tensor, or both are the same storage's base or
    its views (``t._base``). Only then are both views replayed on one CPU tensor of their base (their real
    layouts, sharing its memory) and PyTorch's CPU kernel asked on those stand-ins, memoized per op, layouts and
    argument shapes. The common call (no view among the arguments, no argument written too) costs a few
    identity checks and one C call per tensor argument.

    Example::

        check_inputs(aten.copy_.default, (y[:9], y[1:10]), {}, (y[:9],), (y[1:10],))   # raises
    """
    for w in written:
        if not (isinstance(w, torch.Tensor) and torch_private.is_functional(w)):
            continue
        aliased = _aliasing(w, inputs)
        if aliased:
            _check_aliased(op, args, kwargs, w, aliased)


def _aliasing(w: torch.Tensor, inputs) -> list:
    """The tensors of ``inputs`` (one level of lists included) that share ``w``'s storage: ``w`` itself, or the
    same base or its views."""
    root = torch_private.view_base(w) if torch_private.is_view(w) else w
    found = []
    for x in inputs:
        if isinstance(x, (list, tuple)):
            found += _aliasing(w, [e for e in x if isinstance(e, torch.Tensor)])
        elif isinstance(x, torch.Tensor) and (
            x is w or x is root or (torch_private.is_view(x) and torch_private.view_base(x) is root)
        ):
            found.append(x)
    return found


def _check_aliased(op, args: tuple, kwargs: dict, w: torch.Tensor, aliased: list) -> None:
    keys = [_key(t) for t in (w, *aliased)]
    if any(k is None for k in keys) or len({k[:2] for k in keys}) != 1:
        return  # a layout not known (or a dtype view of the storage): no check
    try:
        verdict_key = (id(op), *keys, _shapes(args), _shapes(tuple(kwargs.items())), _positions(args, w, aliased))
        hash(verdict_key)
    except TypeError:  # an unhashable argument
        return
    if verdict_key not in _verdicts.table:
        _verdicts.remember(verdict_key, _cpu_alias_verdict(op, args, kwargs, (w, *aliased), keys))
    message = _verdicts.table[verdict_key]
    if message is not None:
        raise RuntimeError(message)


def _shapes(x):
    """What a call's overlap or broadcast verdict depends on: tensors' shapes and dtypes, other arguments (but not
    float values, which a loop changes: ``add_(x, alpha=-lr)``)."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_shapes(e) for e in x)
    if isinstance(x, (float, complex)):
        return type(x)
    return x


def _positions(args: tuple, w, aliased: list) -> tuple:
    """Which arguments are the written tensor or which of its aliases (the verdict's memo key)."""
    return tuple(
        (i, next((j for j, t in enumerate((w, *aliased)) if t is a), -1))
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor)
    )


def _cpu_alias_verdict(op, args: tuple, kwargs: dict, tensors: tuple, keys: list) -> str | None:
    """PyTorch's CPU overlap error for ``op`` called with ``tensors`` (a written tensor and its aliases) as views of
    one CPU tensor with their lazyxla layouts (``keys``); other tensors are zeros of their shapes."""
    shape, dtype, _ = keys[0]
    base = torch.zeros(shape, dtype=dtype)
    views = {}
    for t, key in zip(tensors, keys):
        view = _replay(key, base)
        if view is None:
            return None
        views[id(t)] = view
    return _ask_cpu(op, args, kwargs, _UNSUPPORTED, views)


def check_inplace_shape(op, args: tuple, kwargs: dict) -> None:
    """Raise PyTorch's broadcast error if the in-place op ``op`` would give ``args[0]`` (``self``) another shape.

    PyTorch's in-place kernels never resize ``self``: ``a.atan2_(b)`` with ``a`` of shape (1, 3) and ``b`` of
    shape (4, 3) raises "output with shape [1, 3] doesn't match the broadcast shape [4, 3]". Functionalization
    checks an in-place op's shapes with its meta kernel, and some of PyTorch's meta kernels (``atan2_``, ``ge_``,
    ``remainder_``, ... written as an out= call into ``self``) resize ``self`` instead, so lazyxla gave ``a`` a
    new shape. Called when a tensor argument's shape differs from ``self``'s; the meta kernel's answer is memoized
    per op and argument shapes.

    Example::

        check_inplace_shape(aten.atan2_.default, (a, b), {})     # a: (1, 3), b: (4, 3): raises
    """
    try:
        key = (id(op), _shapes(args), _shapes(tuple(kwargs.items())))
        found = _reshaped.table.get(key, False)
    except TypeError:  # an unhashable argument: asked every time
        key, found = None, False
    if found is False:
        found = _reshape_error(op, args, kwargs)
        if key is not None:
            _reshaped.remember(key, found)
    if found is not None:
        raise RuntimeError(found)


# (id(op), argument shapes) -> the error of an in-place op that would reshape self, or None
_reshaped = Memo("lazyxla.frontend.layout._reshaped", _LIMIT)


def _reshape_error(op, args: tuple, kwargs: dict) -> str | None:
    """The error PyTorch raises for the in-place ``op`` whose result (by its meta kernel, or its functional form's,
    which functionalization runs) has another shape than ``self``: the CPU kernel's, asked on stand-ins (zeros of
    the arguments' shapes), else TensorIterator's broadcast message."""
    self = args[0]
    found = _meta_resizes(op, args, kwargs, [self])
    new = found[1] if found is not None else _functional_shape(op, args, kwargs)
    if new is None or tuple(new) == tuple(self.shape):
        return None

    message = _ask_cpu(op, args, kwargs, "")
    return message or f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(new)}"


def _functional_shape(op, args: tuple, kwargs: dict) -> tuple | None:
    """The shape of the result of ``op``'s functional form (``masked_scatter`` for ``masked_scatter_``) on meta
    stand-ins; None where it has none or its meta kernel fails."""
    packet, overload = op._schema.name.removeprefix("aten::"), op._overloadname
    functional = getattr(getattr(aten, packet[:-1], None), overload, None) if packet.endswith("_") else None
    if functional is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = functional(*_metas(args), **{k: _metas(v) for k, v in kwargs.items()})
    except Exception:  # no meta kernel, or an error the real call raises itself
        return None
    return tuple(out.shape) if isinstance(out, torch.Tensor) else None


def _metas(x):
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype, device=_META)
    if isinstance(x, (list, tuple)):
        return type(x)(_metas(e) for e in x)
    return _META if isinstance(x, torch.device) else x


def check_out_views(op, args: tuple, kwargs: dict, written) -> None:
    """Raise a clear error if the out= op ``op`` would resize an ``out`` tensor that is a view of another.

    On the CPU the view is resized over its base's storage (the base sees the overlapping elements); a lazyxla
    view's values live in its base's value, of its base's shape, so functionalization cannot write a result of
    another shape back (it failed in a scatter: "expected src to have a size equal to the slice of self"). The
    result's shapes come from PyTorch's meta kernel, memoized per call signature.

    Example::

        torch.add(a, b, out=buffer[:4])    # a, b of shape (2, 3): RuntimeError naming the out= view
    """
    views = [t for t in written if isinstance(t, torch.Tensor) and torch_private.is_view(t)]
    if not views:
        return
    try:
        key = (
            id(op),
            _signature(args),
            _signature(tuple(kwargs.items())),
            tuple(any(t is v for v in views) for t in written),
        )
        found = _resized.table.get(key, False)
    except TypeError:  # an unhashable argument: asked every time
        key, found = None, False
    if found is False:
        found = _meta_resizes(op, args, kwargs, views)
        if key is not None:
            _resized.remember(key, found)
    if found is not None:
        old, new = found
        raise RuntimeError(
            f"lazyxla: {op} resizes its out= tensor from {list(old)} to {list(new)}, but that tensor is a view of "
            "another tensor: a lazyxla view cannot change its shape in place over its base's storage as on the CPU "
            f"(its base keeps its values). Pass an out= tensor of shape {list(new)}, or one that is no view "
            "(torch.empty(0, device=...))."
        )


# (id(op), call signature) -> (old shape, new shape) of a resized out= view, or None
_resized = Memo("lazyxla.frontend.layout._resized", _LIMIT)


def kept_out_shape(op, args: tuple, kwargs: dict, out) -> tuple | None:
    """The shape of ``op``'s result when ``out`` has as many elements but another shape, else None: for the ops
    whose CPU kernel then keeps ``out``'s shape (arange, range, linspace, logspace; frontend/kernels.py). The
    result's shape comes from PyTorch's meta kernel, memoized per call signature.

    Example::

        kept_out_shape(aten.arange.out, (9,), {"out": torch.empty(3, 3, device=dev)}, out)     # (9,)
    """
    if not isinstance(out, torch.Tensor):
        return None
    try:
        key = (id(op), _signature(args), _signature(tuple(kwargs.items())))
        found = _kept.table.get(key, False)
    except TypeError:  # an unhashable argument: asked every time
        key, found = None, False
    if found is False:
        found = _meta_result_shape(op, args, kwargs, out)
        if key is not None:
            _kept.remember(key, found)
    if found is None or found == tuple(out.shape) or math.prod(found) != out.numel():
        return None
    return found


# (id(op), call signature) -> the shape of the op's result, or None
_kept = Memo("lazyxla.frontend.layout._kept", _LIMIT)


def _meta_result_shape(op, args: tuple, kwargs: dict, out) -> tuple | None:
    def meta(x):
        if x is out:
            return torch.empty(0, dtype=x.dtype, device=_META)
        if isinstance(x, torch.Tensor):
            return torch.empty(x.shape, dtype=x.dtype, device=_META)
        return x

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = op(*map(meta, args), **{k: meta(v) for k, v in kwargs.items()})
    except Exception:  # an error the real call raises itself
        return None
    return tuple(result.shape)


def _signature(x):
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_signature(e) for e in x)
    return x


def _meta_resizes(op, args: tuple, kwargs: dict, views: list):
    metas: dict = {}

    def meta(x):
        if isinstance(x, torch.Tensor):
            metas[id(x)] = m = torch.empty(x.shape, dtype=x.dtype, device=_META)
            return m
        if isinstance(x, (list, tuple)):
            return type(x)(meta(e) for e in x)
        if isinstance(x, torch.device):
            return _META
        return x

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the resize warning is PyTorch's to give, at the real call
            op(*meta(args), **{k: meta(v) for k, v in kwargs.items()})
    except Exception:  # no meta kernel, or an error the real call raises itself
        return None
    for t in views:
        new = metas[id(t)].shape
        if new != t.shape:
            return tuple(t.shape), tuple(new)
    return None


def _key(t: torch.Tensor) -> tuple | None:
    """(base shape, dtype, view chain) of ``t``: what its CPU layout depends on; None for an unknown base, or for a
    tensor that is no functionalization wrapper (Dynamo's fake tensors on the device have no view metas)."""
    if not torch_private.is_functional(t):
        return None
    chain = torch_private.view_meta_sequence(t)
    if not chain:
        return (tuple(t.shape), t.dtype, ())
    root = _root(t)
    if root is None:
        return None
    return (*root, tuple((type(m).__name__, _hashable(m.as_tuple())) for m in chain))


def _root(t: torch.Tensor) -> tuple | None:
    """(shape, dtype) of the tensor whose storage the view ``t``'s chain starts from: its ``_base`` when that holds
    the whole storage; for a dtype view (which has no ``_base``) and the views of one, what ``note_dtype_view``
    kept; None otherwise."""
    found = _roots.get(t)
    if found is not None:
        return found
    base = torch_private.view_base(t)
    if base is None:
        return None
    if torch_private.covers_its_storage(base):
        return (tuple(base.shape), base.dtype)
    return _roots.get(base)


# dtype view -> (shape, dtype) of its storage's base. ``x.view(dtype)`` is no autograd view (its ``_base`` is None,
# as on the CPU), so its chain's start is kept here when it is made (weakly: an entry lives as long as its view).
_roots = WeakIdKeyDictionary()


def note_dtype_view(view: torch.Tensor, source: torch.Tensor) -> None:
    """Remember, for ``view = source.view(dtype)``, the base its view chain starts from, so that its CPU layout
    (``data_ptr``'s offset, its views' layouts) is known as for any other view.

    Example::

        note_dtype_view(y, x[1:])      # y = x[1:].view(torch.int16): cpu_layout(y).storage_offset() == 2
    """
    if not torch_private.is_functional(view):
        return
    root = (tuple(source.shape), source.dtype) if covers(source) else _root(source)
    if root is not None:
        _roots[view] = root


def covers(t: torch.Tensor) -> bool:
    """Whether the functionalization wrapper ``t`` holds its whole storage (no view chain but aliases)."""
    return torch_private.is_functional(t) and torch_private.covers_its_storage(t)


def check_view_dtype(t: torch.Tensor, dtype: torch.dtype) -> None:
    """Raise PyTorch's error for ``t.view(dtype)`` to a larger element size where ``t``'s CPU layout does not allow
    it: a storage offset or a stride that is no multiple of the size ratio (``x[1:].view(torch.float64)`` of
    float32 ``x``, ``x.as_strided((4, 2), (1, 1)).view(torch.float64)``). PyTorch's own check read the wrapper's
    offset and strides (0 and contiguous whatever view it is) and passed. Asked on the CPU layout (a meta tensor),
    where its last dim is contiguous; where it is not, the CPU refuses every such view, and lazyxla views the values
    its wrapper reports (``t.stride(-1) == 1``; PyTorch's own tests decide by that stride).

    Example::

        check_view_dtype(torch.ones(4, device=dev)[1:], torch.float64)   # RuntimeError: self.storage_offset() ...
    """
    if dtype.itemsize <= t.element_size() or not t.dim():
        return
    cpu = cpu_layout(t)
    if cpu is None or cpu.stride(-1) != 1:
        return
    try:
        cpu.view(dtype)
    except RuntimeError as e:
        raise RuntimeError(str(e).split("\n")[0]) from None


def view_like(t: torch.Tensor, base: torch.Tensor) -> torch.Tensor | None:
    """``t``'s view made again, by the same view ops, from ``base`` (a tensor of the shape and dtype of the base
    ``t``'s view chain starts from); None where that base is not known or an op cannot be replayed.

    Example::

        view_like(x[1:].t(), y)      # y[1:].t(), a view of y
    """
    key = _key(t)
    if key is None or tuple(base.shape) != key[0] or base.dtype != key[1]:
        return None
    return _replay(key, base)


def _strided_meta(size, stride, storage_offset: int, dtype) -> torch.Tensor:
    """A meta tensor of ``size``, ``stride`` and ``storage_offset`` (over a storage just large enough)."""
    extent = 1 + storage_offset + sum((n - 1) * s for n, s in zip(size, stride) if n)
    return torch.empty(extent, dtype=dtype, device=_META).as_strided(size, stride, storage_offset)


def _view_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.view(dtype)`` on the meta tensor ``t`` (a CPU layout), also where the CPU refuses that layout (a strided
    last dim: the lazyxla view was made from its wrapper's contiguous strides): then a contiguous layout of the
    view's size that starts at the same byte, which is all ``data_ptr`` reads of it."""
    try:
        return t.view(dtype)
    except RuntimeError:
        old, new = t.element_size(), dtype.itemsize
        size = list(t.shape)
        if size and old != new:
            size[-1] = size[-1] * old // new
        offset = t.storage_offset() * old // new
        strides = [1] * len(size)
        for i in range(len(size) - 2, -1, -1):
            strides[i] = strides[i + 1] * max(size[i + 1], 1)
        return _strided_meta(tuple(size), tuple(strides), offset, dtype)


def _hashable(x):
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(e) for e in x)
    return x


def _layout(key: tuple) -> torch.Tensor | None:
    found = _layouts.table.get(key, False)
    if found is False:
        found = _replay(key)
        _layouts.remember(key, found)
    return found


def _replay(key: tuple, base: torch.Tensor | None = None) -> torch.Tensor | None:
    """The view ``key`` describes, made by its view ops from ``base`` (a meta tensor of its base's shape if none)."""
    shape, dtype, chain = key
    t = torch.empty(shape, dtype=dtype, device=_META) if base is None else base
    try:
        for name, fields in chain:
            # fields: reapply_views, [out_index,] symbolic, InverseReturnMode, *the op's arguments
            at = next(i for i, f in enumerate(fields) if isinstance(f, torch_private.InverseReturnMode))
            op = _op(name)
            args, kwargs = [t], {}
            for a, v in zip(op._schema.arguments[1:], fields[at + 1 :]):  # the op's arguments after self, in order
                if a.kwarg_only:
                    kwargs[a.name] = v
                else:
                    args.append(v)
            meta_dtype_view = op is aten.view.dtype and t.device == _META
            out = _view_dtype(t, *args[1:]) if meta_dtype_view else op(*args, **kwargs)
            t = out[fields[1]] if at == 3 else out
    except Exception:  # a view op this replay does not know how to call: no layout, no check
        return None
    return t


def _op(name: str):
    """``aten.slice.Tensor`` for ``slice_Tensor_ViewMeta``, ``aten.t.default`` for ``t_ViewMeta``."""
    op = _ops.table.get(name)
    if op is None:
        stem = name.removesuffix("_ViewMeta")
        packet, _, overload = stem.rpartition("_")
        if packet and hasattr(aten, packet) and overload in getattr(aten, packet).overloads():
            op = getattr(getattr(aten, packet), overload)
        else:
            op = getattr(aten, stem).default
        _ops.remember(name, op)
    return op


def _cpu_verdict(op, args: tuple, kwargs: dict, written: torch.Tensor, layout: torch.Tensor | None) -> str | None:
    """PyTorch's CPU overlap error for ``op`` writing to a tensor of ``layout``, asked on stand-ins; None if it
    raises none (or the layout is unknown)."""
    if layout is None or not torch_private.has_internal_overlap(layout):
        return None
    extent = 1 + layout.storage_offset() + sum((n - 1) * s for n, s in zip(layout.shape, layout.stride()) if n)
    target = torch.zeros(extent, dtype=layout.dtype).as_strided(layout.shape, layout.stride(), layout.storage_offset())
    return _ask_cpu(op, args, kwargs, _OVERLAP, {id(written): target})


def _ask_cpu(op, args: tuple, kwargs: dict, wanted: str, placed: dict | None = None) -> str | None:
    """:func:`_cpu_error` for ``op`` called on CPU stand-ins of its arguments: ``placed[id(t)]`` for a tensor ``t``
    placed there (a view with its CPU layout), zeros of its shape and dtype for any other tensor.

    Example::

        _ask_cpu(aten.copy_.default, (a, b), {}, "unsupported", {id(a): a_cpu, id(b): b_cpu})
    """
    placed = placed or {}

    def stand_in(x):
        if isinstance(x, torch.Tensor):
            return placed.get(id(x)) if id(x) in placed else torch.zeros(x.shape, dtype=x.dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(stand_in(e) for e in x)
        return torch.device("cpu") if isinstance(x, torch.device) else x

    return _cpu_error(op, stand_in(args), {k: stand_in(v) for k, v in kwargs.items()}, wanted)


def _cpu_error(op, args: tuple, kwargs: dict, wanted: str) -> str | None:
    """The first line of the error PyTorch's CPU kernel raises for ``op`` on stand-ins, if it contains ``wanted``."""
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]), torch.no_grad():
            warnings.simplefilter("ignore")  # the CPU's deprecation warnings for stand-ins are not the user's
            op(*args, **kwargs)
    except RuntimeError as e:
        if wanted in str(e):
            return str(e).split("\n")[0]
    except Exception:  # the stand-ins' values are not the user's: no other error is PyTorch's answer here
        pass
    return None
