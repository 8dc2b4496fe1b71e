"""Ops recorded by a handler of their own rather than straight from their rule.

Transfers (``copy`` from a CPU tensor or another lazyxla device, ``_to_copy`` to the CPU or another
device, ``lift`` of a tensor built on the host), host reads (``.item()``), aliases (``detach``,
``clone``: a new LazyTensor on the same value), batch norm's running statistics (rebound after a
functional op), ``nonzero`` (a data-dependent shape: a counted sync, then ``nonzero_static``), margin
losses of one sample, and the bounds checks of ``random_``/``randint_like``. ``SPECIAL`` maps each op
to its handler; ``lazy.record.dispatch`` takes it before any rule.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from lazyxla import torch_private
from lazyxla.device import devices
from lazyxla.ir import raise_if_error
from lazyxla.lazy import graph, known
from lazyxla.lazy.meta import record
from lazyxla.lazy.tensor import LazyTensor, wrap
from lazyxla.observe import diagnostics, metrics

aten = torch.ops.aten


def _materialize(t: LazyTensor, reason: str = "host read"):
    graph.sync_tensors([t], reason=reason, host_read=True)
    raise_if_error(t._value[0])
    return t._value[0].payload


def lazy_to_cpu(t: LazyTensor, dtype: torch.dtype | None = None, reason: str = "host read") -> torch.Tensor:
    """A new CPU tensor with ``t``'s value: ``t``'s graph is synced (counted under ``reason``), its error
    raised, its array copied to the host (converted to ``dtype`` if given). A known value (``lazy/known.py``)
    is copied from the host's copy: nothing is synced for it (the read still computes what the previous read
    left pending: ``graph.sync_tensors``)."""
    value = t._value[0].host
    if value is not None:
        graph.sync_tensors([t], reason=reason, host_read=True)
        return value.clone() if dtype is None or dtype == value.dtype else value.to(dtype)
    arr = _materialize(t, reason)
    metrics.inc("device_to_host")
    with metrics.timer("transfer"):
        out = devices.to_host(arr, t.dtype)
    return out if dtype is None or dtype == out.dtype else out.to(dtype)


def cpu_to_lazy(t: torch.Tensor, device: int) -> LazyTensor:
    """A bare LazyTensor on lazyxla device ``device`` holding a copy of the CPU tensor ``t``."""
    metrics.inc("host_to_device")
    if known.knowable(t):
        t = t.clone(memory_format=torch.contiguous_format)  # the host's copy: the caller may write to ``t`` later
    return known.upload(t, device, f"copied from the CPU at {diagnostics.user_frame(2)}")


def _alias(t: LazyTensor) -> LazyTensor:
    return LazyTensor(t._value, t._aval)


def copy_into(dst, src, non_blocking=False):
    """``aten.copy``: the LazyTensor ``dst`` becomes in ``dst.copy_(src)`` (``dst``'s shape and dtype;
    ``src`` a LazyTensor on any lazyxla device, or a CPU tensor)."""
    if isinstance(src, LazyTensor) and src._value[0].device == dst._value[0].device:
        if src.shape == dst.shape and src.dtype == dst.dtype:
            return _alias(src)
        return record(aten.copy.default, (dst, src), {})
    if isinstance(src, LazyTensor):  # another lazyxla device
        src = lazy_to_cpu(src, reason="copy between lazyxla devices")
    host = src.to(dst.dtype).expand(dst.shape).contiguous()
    return cpu_to_lazy(host, dst._value[0].device)


def _to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    if device is not None and torch.device(device).type != "lazyxla":
        return lazy_to_cpu(x, dtype, ".cpu() / .to(cpu)").to(device)
    target = x._value[0].device if device is None else (torch.device(device).index or 0)
    if target != x._value[0].device:
        # Functionalization does not wrap the result of a copy to another device (it assumes the copy
        # leaves the functional world, as .cpu() does), so the new lazyxla tensor is wrapped here.
        return wrap(cpu_to_lazy(lazy_to_cpu(x, dtype), target))
    if dtype is None or dtype == x.dtype:
        return _alias(x)
    return record(aten._to_copy.default, (x,), {"dtype": dtype})


# Per thread: how many PyTorch decompositions are running here, below functionalization. A factory they call
# (``torch.tensor(0, device=x.device)`` in ``_linspace_from_neg_one``) must give them a bare LazyTensor.
_nested = threading.local()


def _lift(fresh):
    """``aten.lift_fresh`` / ``lift`` (and ``lift_fresh_copy`` on a copy): the last step of ``torch.tensor``,
    ``as_tensor``, ``asarray`` and ``Tensor.new_tensor`` with ``device=``. PyTorch builds that tensor with
    functionalization switched off, so ``fresh`` is a bare LazyTensor, and leaves it to the device's lift
    kernel to put it under functionalization (torch_xla's wraps it there too). Handed to the user bare, it
    fails in ``.tolist()`` and in any in-place op mixing it with ordinary lazyxla tensors ("mutating a
    non-functional tensor with a functional tensor"). It stays bare where functionalization wraps it itself
    (its mode is on: the key is in the thread's include set) and inside a decomposition running here."""
    if getattr(_nested, "depth", 0) or torch_private.functionalization_included():
        return fresh
    return wrap(fresh)


@contextlib.contextmanager
def inside_decomposition():
    """Mark a PyTorch decomposition running here, on this thread: the tensors it lifts stay bare (``_lift``)."""
    _nested.depth = getattr(_nested, "depth", 0) + 1
    try:
        yield
    finally:
        _nested.depth -= 1


# PyTorch checks random_'s bounds in its CPU/CUDA kernels, not in the meta kernels that record an op: without
# this, torch.randint(0, 5, dtype=torch.bool, device=dev) drew numbers where PyTorch raises. The bounds are
# checked by PyTorch's own CPU kernel on an empty scratch tensor (no draw; a private generator, so never the
# user's CPU stream), which raises its exceptions and warnings, word for word, at the user's call.
_SCRATCH_GENERATOR = torch.Generator()
_RANDOM_BOUNDS = {  # op -> (x, *args, **kwargs) -> (dtype, from, to) as random_ takes them
    getattr(aten.random, "from"): lambda x, from_, to=None, **_: (x.dtype, from_, to),
    aten.random.to: lambda x, to, **_: (x.dtype, 0, to),
    aten.randint_like.default: lambda x, high, *, dtype=None, **_: (dtype or x.dtype, 0, high),
    aten.randint_like.low_dtype: lambda x, low, high, *, dtype=None, **_: (dtype or x.dtype, low, high),
}


def _random_bounds_checked(func):
    bounds = _RANDOM_BOUNDS[func]

    def handler(*args, **kwargs):
        dtype, from_, to = bounds(*args, **kwargs)
        torch.empty(0, dtype=dtype).random_(from_, to, generator=_SCRATCH_GENERATOR)
        return record(func, args, kwargs)

    return handler


def _local_scalar_dense(x):
    return lazy_to_cpu(x, reason=".item()").item()  # a known value: no sync


def _batch_norm_updating_stats(x, w, b, running_mean, running_var, training, momentum, eps):
    # Batch norm in training mode updates the running statistics in place; native_batch_norm's schema
    # does not say so, and _native_batch_norm_legit arrives here only below functionalization (from a
    # decomposition). Record the functional variant and rebind the statistics.
    args = (x, w, b, running_mean, running_var, training, momentum, eps)
    out = record(aten._native_batch_norm_legit_functional.default, args, {})
    running_mean._value, running_var._value = out[3]._value, out[4]._value
    return out[:3]


def _eval_batch_norm(x, w, b, running_mean, running_var, momentum, eps):
    # In eval mode PyTorch's CPU kernel returns empty saved statistics; the meta kernel says (C,).
    out = record(
        aten._native_batch_norm_legit_no_training.default, (x, w, b, running_mean, running_var, momentum, eps), {}
    )
    kw = {"dtype": out[1].dtype, "device": torch.device("lazyxla", x._value[0].device)}
    empty = record(aten.empty.memory_format, ([0],), kw)
    return out[0], empty, _alias(empty)


def _native_batch_norm(x, w, b, running_mean, running_var, training, momentum, eps):
    if not training and running_mean is not None:
        return _eval_batch_norm(x, w, b, running_mean, running_var, momentum, eps)
    if not training or running_mean is None:
        return record(aten.native_batch_norm.default, (x, w, b, running_mean, running_var, training, momentum, eps), {})
    return _batch_norm_updating_stats(x, w, b, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit(x, w, b, running_mean, running_var, training, momentum, eps):
    if not training:
        return _eval_batch_norm(x, w, b, running_mean, running_var, momentum, eps)
    return _batch_norm_updating_stats(x, w, b, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit_functional(x, w, b, running_mean, running_var, training, momentum, eps):
    if not training:  # functionalization's form of _native_batch_norm_legit in eval mode
        y, save_mean, save_rstd = _eval_batch_norm(x, w, b, running_mean, running_var, momentum, eps)
        return y, save_mean, save_rstd, _alias(running_mean), _alias(running_var)
    args = (x, w, b, running_mean, running_var, training, momentum, eps)
    return record(aten._native_batch_norm_legit_functional.default, args, {})


def _nonzero(x):
    """``nonzero``'s output shape depends on the data: the input is synced and its nonzero count read
    on the host (counted as the ``data_dependent_syncs`` metric), then ``nonzero_static`` of that size
    is recorded, so the result stays on the device."""
    count = record(aten.count_nonzero.default, (x,), {})
    graph.sync_tensors([x, count], reason="data-dependent shape (nonzero)")
    metrics.inc("data_dependent_syncs")
    return record(aten.nonzero_static.default, (x,), {"size": int(lazy_to_cpu(count).item())})


# ---- reads of one piece of a pending concatenation ----
#
# A sequence grown one step at a time (``ids = torch.cat([ids, token[:, None]], -1)``; generation does it to
# the token ids and the position ids) is read back at its end (``ids[:, -1:]``). Recorded as they are, those
# reads make every program that needs the last token take the whole sequence as an input, whose length
# changes each step: one compile per step. A slice or an index that falls within one piece of a pending
# ``cat`` is recorded on that piece instead, so such a program takes the new token only.


def _piece(x: LazyTensor, dim: int, start: int, stop: int):
    """If ``x`` is a pending ``cat`` along ``dim`` (0 <= dim < rank) whose piece holds all of [start, stop):
    that piece (a LazyTensor) and its offset; else None."""
    n, _ = x._value
    if n.op is not aten.cat.default or n.template[1]:
        return None
    args = n.template[0]
    if (args[1] if len(args) > 1 else 0) % x.dim() != dim:
        return None
    offset = 0
    for slot in args[0]:
        value = n.inputs[slot.i]
        aval = value[0].avals[value[1]]
        if len(aval.shape) != x.dim() or aval.dtype != x.dtype:  # a skipped empty piece, or a promoted dtype
            return None
        size = aval.shape[dim]
        if offset <= start and stop <= offset + size:
            return LazyTensor(value, aval), offset
        offset += size
    return None


def _slice(x, dim=0, start=None, end=None, step=1):
    """``aten.slice_copy``: on the piece of a pending ``cat`` that holds the slice, if one does."""
    if -x.dim() <= dim < x.dim() and step == 1:
        d = dim % x.dim()
        lo, hi, _ = slice(start, end).indices(x.shape[d])
        found = _piece(x, d, lo, hi) if lo < hi else None
        if found is not None:
            piece, offset = found
            if lo == offset and hi == offset + piece.shape[d]:
                return piece
            return _slice(piece, d, lo - offset, hi - offset)
    return record(aten.slice_copy.Tensor, (x, dim, start, end, step), {})


def _select(x, dim, index):
    """``aten.select_copy``: on the piece of a pending ``cat`` that holds the index, if one does."""
    if -x.dim() <= dim < x.dim():
        d = dim % x.dim()
        i = index + x.shape[d] if index < 0 else index
        found = _piece(x, d, i, i + 1) if 0 <= i < x.shape[d] else None
        if found is not None:
            return _select(found[0], d, i - found[1])
    return record(aten.select_copy.int, (x, dim, index), {})


def _single_sample_loss(func, single):
    """PyTorch's CPU margin losses give a 0-d loss for one sample (``single(input, target)``) with
    reduction='none'; their meta kernels say shape (1,). The loss is recorded, then viewed as 0-d."""

    def handler(*args, **kwargs):
        out = record(func, args, kwargs)
        loss = out[0] if type(out) is tuple else out
        if single(args[0], args[1]) and loss.dim() == 1:
            loss = record(aten.view.default, (loss, []), {})
            return (loss, *out[1:]) if type(out) is tuple else loss
        return out

    return handler


SPECIAL = {
    aten.multi_margin_loss.default: _single_sample_loss(aten.multi_margin_loss.default, lambda x, t: t.dim() == 0),
    aten.multilabel_margin_loss_forward.default: _single_sample_loss(
        aten.multilabel_margin_loss_forward.default, lambda x, t: x.dim() <= 1
    ),
    aten.native_batch_norm.default: _native_batch_norm,
    aten._native_batch_norm_legit.default: _native_batch_norm_legit,
    aten._native_batch_norm_legit_functional.default: _native_batch_norm_legit_functional,
    aten.nonzero.default: _nonzero,
    aten.slice_copy.Tensor: _slice,
    aten.select_copy.int: _select,
    aten.copy.default: copy_into,
    aten._to_copy.default: _to_copy,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.lift_fresh.default: _lift,
    aten.lift.default: _lift,
    aten.detach.default: _alias,
    aten.alias.default: _alias,
    aten.clone.default: lambda x, memory_format=None: _alias(x),
    aten.detach_copy.default: _alias,
    aten.alias_copy.default: _alias,
    aten.lift_fresh_copy.default: lambda x: _lift(_alias(x)),
}


SPECIAL.update({func: _random_bounds_checked(func) for func in _RANDOM_BOUNDS})

SPECIAL_OPS = frozenset(SPECIAL)
