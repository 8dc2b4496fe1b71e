"""Ops recorded by a handler of their own rather than straight from their rule.

Transfers (``copy`` from a CPU tensor or another lazyxla device, ``_to_copy`` to the CPU or another
device, ``lift`` of a tensor built on the host), host reads (``.item()``), aliases (``detach``,
``clone``: a new LazyTensor on the same value), batch norm's running statistics (rebound after a
functional op), ``nonzero`` (a data-dependent shape: a counted sync, then ``nonzero_static``), margin
losses of one sample, the bounds checks of ``random_``/``randint_like``, slices and selects (read through the
pending concatenation, reshape or slice they view: ``lazy/view_reads.py``) and writes through them (at positions
that may be program inputs: ``lazy/positions.py``). ``SPECIAL`` maps each op to its handler;
``lazy.record.dispatch`` takes it before any rule.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch

from lazyxla import torch_private
from lazyxla.device import devices
from lazyxla.ir import Leaf, raise_if_error
from lazyxla.lazy import graph, known, pieces, positions, view_reads
from lazyxla.lazy.meta import record
from lazyxla.lazy.tensor import LazyTensor, retarget, set_value, unwrap, wrap
from lazyxla.observe import diagnostics, metrics
from lazyxla.util import Memo, contiguous_strides

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
    if t._piece:
        value = _read_piece(t, reason)
        if value is not None:
            return value if dtype is None or dtype == value.dtype else value.to(dtype)
    arr = _materialize(t, reason)
    metrics.inc("device_to_host")
    out = devices.to_host(arr, t.dtype)  # timed there (transfer_from_device), as every copy to the host
    return out if dtype is None or dtype == out.dtype else out.to(dtype)


def _read_piece(t: LazyTensor, reason: str) -> torch.Tensor | None:
    """A host read of a piece of an iterated tensor (``lazy/pieces.py``): its base is computed (the pieces
    re-pointed at the result, none of them an output) and copied to the host once, and the piece's value is
    taken from that copy. None if ``t`` no longer views its base (a sync computed it)."""
    n = t._value[0]
    if n.op is not pieces.SELECT:
        return None
    base = n.inputs[0]
    if base[0].op is not Leaf.DATA:
        graph.sync_tensors([LazyTensor(base, base[0].avals[base[1]])], reason=reason, host_read=True)
        n = t._value[0]
        if n.op is not pieces.SELECT or n.inputs[0][0].op is not Leaf.DATA:
            return None
        base = n.inputs[0]
    else:  # still a host read: it computes what the previous read left pending (graph.sync_tensors)
        graph.sync_tensors([], reason=reason, host_read=True)
    host = _on_host(base[0])
    return host.select(n.template[0][1], n.inputs[1][0].payload).clone()


# Host copies of iterated tensors' values: id(device-data node) -> (weak reference to it, CPU tensor). A few,
# so that zip(a, b) over two tensors does not copy each again at every step (a few: they hold whole tensors); an entry
# leaves with its node.
_host_copies = Memo("lazyxla.lazy.special._host_copies", limit=4)


def _on_host(n) -> torch.Tensor:
    """The CPU copy of device data ``n``'s value (``n`` is immutable: the copy stays right while it lives)."""
    found = _host_copies.table.get(id(n))
    if found is not None and found[0]() is n:
        return found[1]
    raise_if_error(n)
    metrics.inc("device_to_host")
    host = devices.to_host(n.payload, n.avals[0].dtype)
    key = id(n)
    _host_copies.remember(key, (weakref.ref(n, lambda _: _host_copies.table.pop(key, None)), host))
    return host


def cpu_to_lazy(t: torch.Tensor, device: int) -> LazyTensor:
    """A bare LazyTensor on lazyxla device ``device`` holding a copy of the CPU tensor ``t``."""
    metrics.inc("host_to_device")
    if known.knowable(t):
        t = t.clone(memory_format=torch.contiguous_format)  # the host's copy: the caller may write to ``t`` later
    return known.upload(t, device, f"copied from the CPU at {diagnostics.user_frame(2)}")


def upload(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t.to(device)`` for a CPU tensor ``t`` that records nothing: the user-visible lazyxla tensor of a
    device copy of ``t``. Any other tensor goes through ``t.to(device)``: one already on ``device`` is returned
    as it is, and one that requires grad keeps its autograd link.

    Background threads (``DeviceLoader``'s) move batches with it. ``t.to(device)`` records a pending
    ``empty`` that its copy then replaces; a sync on the main thread that falls between the two took that
    ``empty`` into its program (a different program: a recompile that depended on timing).

    Example::

        x = upload(torch.arange(6).reshape(2, 3)[:, 1:], lazyxla.device())   # equals .to(device)
    """
    if t.device.type != "cpu" or t.requires_grad:
        return t.to(device)
    index = torch.device(device).index or 0
    devices.jax_device(index)  # raises a clear error for a device that does not exist
    return wrap(cpu_to_lazy(t, index))


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
    if device is not None and not devices.on_device(torch.device(device)):
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
    metrics.inc("scalar_reads")  # torch_xla users read it as the aten::_local_scalar_dense counter
    return lazy_to_cpu(x, reason=".item()").item()  # a known value: no sync


def _batch_norm_updating_stats(x, w, b, running_mean, running_var, training, momentum, eps):
    # Batch norm in training mode updates the running statistics in place; native_batch_norm's schema
    # does not say so, and _native_batch_norm_legit arrives here only below functionalization (from a
    # decomposition). Record the functional variant and rebind the statistics.
    args = (x, w, b, running_mean, running_var, training, momentum, eps)
    out = record(aten._native_batch_norm_legit_functional.default, args, {})
    # the functional op gives float16/bfloat16 statistics back in float32: kept in their own dtype, as the CPU's
    # in-place update keeps them (rebinding a bfloat16 tensor to a float32 value made its aval lie)
    stats = [s if s._aval.dtype == r._aval.dtype else _cast(s, r._aval.dtype) for s, r in zip(out[3:5], args[3:5])]
    retarget((running_mean, running_var), [s._value for s in stats])
    return out[:3]


def _cast(t: LazyTensor, dtype: torch.dtype) -> LazyTensor:
    return record(aten._to_copy.default, (t,), {"dtype": dtype})


def _eval_batch_norm(x, w, b, running_mean, running_var, momentum, eps):
    # In eval mode PyTorch's CPU kernel returns empty saved statistics; the meta kernel says (C,).
    out = record(
        aten._native_batch_norm_legit_no_training.default, (x, w, b, running_mean, running_var, momentum, eps), {}
    )
    kw = {"dtype": out[1].dtype, "device": devices.torch_device(x._value[0].device)}
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


def _pack_padded_sequence(x, lengths, batch_first):
    """``pack_padded_sequence`` on the device. ``lengths`` is a CPU tensor, as PyTorch requires, and so is the
    ``batch_sizes`` it returns, which the recurrent modules read on the host: PyTorch's kernel runs on a meta
    stand-in of the input (its checks and errors, and ``batch_sizes``), and the packed data is recorded as the
    same slices of the input, concatenated."""
    stand_in = torch.empty(x.shape, dtype=x.dtype, device="meta")
    if isinstance(lengths, LazyTensor):  # PyTorch's error for lengths not on the CPU
        lengths = torch.empty(lengths.shape, dtype=lengths.dtype, device="meta")
    _, batch_sizes = aten._pack_padded_sequence.default(stand_in, lengths, batch_first)
    steps = record(aten.transpose_copy.int, (x, 0, 1), {}) if batch_first else x
    rest = tuple(steps.shape[2:])
    pieces, start, sizes = [], 0, batch_sizes.tolist()
    for t in range(len(sizes) + 1):  # one piece per run of steps with the same batch size
        if t == len(sizes) or sizes[t] != sizes[start]:
            piece = view_reads.slice_copy(view_reads.slice_copy(steps, 0, start, t), 1, 0, sizes[start])
            pieces.append(view_reads.reshaped(piece, ((t - start) * sizes[start], *rest)))
            start = t
    return record(aten.cat.default, (pieces, 0), {}), batch_sizes


# The tensors whose storage was asked for (``t.untyped_storage()``, ``t.storage()``), by the storage's identity: a
# lazyxla tensor's storage is functionalization's and holds no bytes, so reading it (``storage[i]``, ``tolist``,
# ``.cpu()``) or setting another tensor to it (``t.set_(w.storage(), ...)``) reads the tensor that holds the whole
# storage in order (the base, or an alias of it; ``torch_private.covers_its_storage``). Weak: an entry lives as long
# as its tensor, and a lookup checks the tensor still has that storage (an identity is reused after a storage dies).
_owners: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def note_storage_owner(t: torch.Tensor, storage) -> None:
    """Remember ``t`` (a user-visible lazyxla tensor whose ``storage`` was asked for) as the holder of the storage's
    values: ``t`` itself when it covers its storage, else its autograd base when that does (a view's).

    Example::

        note_storage_owner(w[2:], w[2:].untyped_storage())    # w's values are the storage's
    """
    owner = t if torch_private.covers_its_storage(t) else torch_private.view_base(t)
    if owner is not None and (owner is t or torch_private.covers_its_storage(owner)):
        _owners[torch_private.storage_identity(storage)] = owner


def storage_holder(storage) -> torch.Tensor | None:
    """The user-visible lazyxla tensor holding the values of the lazyxla ``storage`` in order (the wrapper of
    ``storage_owner``'s LazyTensor), or None.

    Example::

        storage_holder(w[2:].untyped_storage()) is w     # after w[2:].untyped_storage() was asked for
    """
    key = torch_private.storage_identity(storage)
    owner = _owners.get(key)
    if owner is None or torch_private.storage_identity(_storage_of(owner)) != key:
        return None
    return owner


def storage_owner(storage) -> LazyTensor | None:
    """The LazyTensor holding the values of the lazyxla ``storage`` in order (see ``note_storage_owner``), or None
    when no tensor of it was asked for its storage or the storage is not a lazyxla tensor's."""
    owner = storage_holder(storage)
    return None if owner is None else unwrap(owner)


_storage_of = torch.Tensor.untyped_storage  # PyTorch's own: frontend/storage.py wraps the method to note owners


def storage_bytes(storage) -> torch.Tensor | None:
    """The bytes of the lazyxla ``storage`` as a CPU uint8 tensor (a host read of the tensor holding them), or None
    when no tensor holds them (``storage_owner``)."""
    owner = storage_owner(storage)
    if owner is None:
        return None
    host = lazy_to_cpu(owner, reason="storage read").contiguous().reshape(-1)
    return host.view(torch.uint8) if host.numel() else torch.empty(0, dtype=torch.uint8)


def _set_from_storage(x, source, storage_offset=0, size=None, stride=None):
    """``aten.set.source_Storage(_storage_offset)`` (``t.set_(storage, ...)``, after functionalization).

    The storage of a lazyxla tensor (``t.set_(w.storage(), offset, size, stride)``): ``w``'s values read through
    ``as_strided`` -- the values the storage holds now, not an alias of it (functionalization keeps no storage two
    bases share). A storage in host memory -- a CPU storage, or the host memory that stands for the device's
    (``frontend/storage.py``: what ``torch.load`` and ``storage.to(device)`` give; PyTorch's ``_rebuild_tensor`` builds
    every loaded tensor this way): a new device value with its bytes."""
    owner = storage_owner(source) if devices.on_device(source.device) else None
    if owner is not None:
        return _view_of_storage(x, owner, storage_offset, size, stride)
    host = torch.empty(0, dtype=x.dtype)
    try:
        host = host.set_(source) if size is None else host.set_(source, storage_offset, size, stride or ())
    except RuntimeError as e:
        if "different device" not in str(e):
            raise
        raise RuntimeError(
            f"set_() with the storage of a {devices.torch_name()} tensor that lazyxla cannot read: ask its tensor for "
            "it (t.untyped_storage() of the tensor holding the values), or use t.set_(other_tensor)"
        ) from None
    out = cpu_to_lazy(host.clone(memory_format=torch.contiguous_format), x._value[0].device)
    if _refills.depth and getattr(source, "_torch_load_uninitialized", False):
        _refills.pending.append((out, host))  # PyTorch's legacy format reads the bytes in after this
    return out


def _view_of_storage(x, owner: LazyTensor, storage_offset, size, stride):
    """``x.set_(storage, storage_offset, size, stride)`` over the values of ``owner``, the storage's holder."""
    if owner.dtype != x.dtype:
        raise RuntimeError(
            f"set_(): the storage holds {owner.dtype} values and the tensor is {x.dtype}: on "
            f"{devices.torch_name()} a storage is read as its tensor's dtype (use .view(dtype) on that tensor)"
        )
    n = owner.numel()
    if size is None:
        size, stride, storage_offset = [n], [1], 0
    if not stride:
        stride = contiguous_strides(size)
    flat = record(aten.view_copy.default, (owner, [n]), {}) if owner.dim() != 1 else owner
    reach = storage_offset + sum((d - 1) * st for d, st in zip(size, stride) if d > 0) + 1
    if all(d > 0 for d in size) and reach > n:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {storage_offset} require a "
            f"storage of {reach} elements, and it has {n}"
        )
    return record(aten.as_strided_copy.default, (flat, list(size), list(stride), storage_offset), {})


class _Refills(threading.local):
    """Tensors ``torch.load`` built from storages whose bytes it reads only later (PyTorch's legacy format builds
    every tensor first, then fills the storages), copied again when the outermost load ends (``refilled``)."""

    depth = 0

    def __init__(self):
        self.pending: list = []


_refills = _Refills()


@contextlib.contextmanager
def refilled():
    """Around ``torch.load``: tensors it built on the device from storages it filled afterwards get their bytes.

    Example::

        with refilled():
            state = torch.load(f)      # a checkpoint in PyTorch's legacy format, onto the device
    """
    _refills.depth += 1
    try:
        yield
    finally:
        _refills.depth -= 1
    if _refills.depth == 0:  # only after a load that returned: a failed one's tensors are not handed out
        pending, _refills.pending = _refills.pending, []
        for lt, host in pending:
            set_value(lt, cpu_to_lazy(host.clone(memory_format=torch.contiguous_format), lt._value[0].device)._value)


def _compatible_shallow_copy_type(self, from_) -> bool:
    """``torch._has_compatible_shallow_copy_type`` (``Module._apply`` asks it per parameter: may ``.data`` take the
    converted tensor?). Outside inference mode autograd's composite kernel answers on the user's tensors; under
    ``torch.inference_mode`` (``model.to(dev)`` inside it) autograd is skipped and functionalization passes the op
    down with the inner tensors, so it arrives here. Two LazyTensors have one implementation; a LazyTensor and a
    CPU tensor do not, as their wrappers do not."""
    return isinstance(self, LazyTensor) and isinstance(from_, LazyTensor)


SPECIAL = {
    aten._has_compatible_shallow_copy_type.default: _compatible_shallow_copy_type,
    aten.multi_margin_loss.default: _single_sample_loss(aten.multi_margin_loss.default, lambda x, t: t.dim() == 0),
    aten.multilabel_margin_loss_forward.default: _single_sample_loss(
        aten.multilabel_margin_loss_forward.default, lambda x, t: x.dim() <= 1
    ),
    aten.native_batch_norm.default: _native_batch_norm,
    aten._native_batch_norm_legit.default: _native_batch_norm_legit,
    aten._native_batch_norm_legit_functional.default: _native_batch_norm_legit_functional,
    aten.nonzero.default: _nonzero,
    aten.slice_copy.Tensor: view_reads.slice_copy,
    aten.select_copy.int: view_reads.select_copy,
    aten.unbind_copy.int: pieces.unbind,
    aten.select_scatter.default: positions.select_scatter,
    aten.slice_scatter.default: positions.slice_scatter,
    aten.copy.default: copy_into,
    aten.set.source_Storage: _set_from_storage,
    aten.set.source_Storage_storage_offset: _set_from_storage,
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
    aten._pack_padded_sequence.default: _pack_padded_sequence,
}


SPECIAL.update({func: _random_bounds_checked(func) for func in _RANDOM_BOUNDS})

SPECIAL_OPS = frozenset(SPECIAL)

# Handlers of ops a library defines only when it is imported (``"_dtensor.shard_dim_alltoall.default"``, from
# torch.distributed.tensor, slow to import): keyed by the op's name, found when the op is first dispatched.
SPECIAL_BY_NAME: dict[str, object] = {}
