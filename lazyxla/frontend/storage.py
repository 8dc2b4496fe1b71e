"""``torch.save``, ``torch.load``, pickle and ``copy.deepcopy`` of lazyxla tensors, as for a CUDA tensor.

Why: a lazyxla tensor is a functionalization wrapper, and PyTorch reports a storage for it (functionalization's,
with no data pointer). PyTorch's serializer and ``Tensor.__deepcopy__`` take the path of a tensor whose storage
holds its bytes: ``torch.save`` raised ("invalid python storage") and ``copy.deepcopy`` crashed the process, as
did ``torch.load(map_location=lazyxla.device())`` and ``storage.to(device)``, which allocate device storage
with the device's C++ allocator (a Python backend has none). PyTorch offers a device no hook for these, so:

- **Saving** (``torch.save``, pickle, ``copy.copy``): a lazyxla tensor reduces to PyTorch's own
  ``_rebuild_tensor_v2`` over a :class:`DeviceStorage`, a host copy of its values that reports the lazyxla
  device. The file is an ordinary PyTorch checkpoint whose storages are tagged ``lazyxla:0``, as a CUDA
  checkpoint's are tagged ``cuda:0``: ``torch.load(f)`` puts them back on the device, ``map_location="cpu"``
  loads them on any machine (without lazyxla too), ``weights_only=True`` accepts them. Tensors that hold one
  value of one storage (a tied weight's ``state_dict()`` entries, ``t`` and ``t.detach()``) are written once.
- **Storages on the device** (``torch.UntypedStorage(n, device="lazyxla")``, ``storage.to(device)``,
  ``torch.load``'s restore): a :class:`DeviceStorage`, host memory standing for the device's, since lazyxla's
  device memory belongs to jax. ``tensor.set_(storage, ...)`` on a lazyxla tensor copies it to the device
  (``lazy/special.py``), which is how PyTorch's ``_rebuild_tensor`` makes the loaded tensor.
- **Deep copies**: a clone (free: the same recorded value), as PyTorch does for XLA tensors; tensors that share
  a storage and value in the original share one in the copy (aliases, as ``detach()`` makes), and a view of a base
  holding its storage is the same view of that base's copy (one per storage and ``deepcopy`` call, as PyTorch
  copies a CPU storage once).

Not kept across a save: views of one storage with different shapes are written as separate storages (the
wrapper's strides are not the view's, so the relation cannot be rebuilt), and tensors rebuilt from one saved
storage are separate device values (equal, not aliased). ``copy.copy`` of a lazyxla tensor is a copy, not an
alias.

Example::

    torch.save(model.state_dict(), "ckpt.pt")                      # storages tagged lazyxla:0
    sd = torch.load("ckpt.pt", map_location=lazyxla.device())     # or map_location="cpu" anywhere
    ema = copy.deepcopy(model)                                     # no host round trip
"""

from __future__ import annotations

import copy
import functools
import os
import weakref
from collections import OrderedDict

import torch
import torch.utils.dlpack

from lazyxla import torch_private
from lazyxla.device.devices import on_device
from lazyxla.frontend import layout
from lazyxla.lazy.special import note_storage_owner, refilled, storage_bytes, storage_holder
from lazyxla.lazy.tensor import unwrap
from lazyxla.util import atomic_write, contiguous_strides


class DeviceStorage(torch.UntypedStorage):
    """Host memory standing for a lazyxla device's: the storage of a saved lazyxla tensor, and what
    ``torch.UntypedStorage(n, device="lazyxla")``, ``storage.to(device)`` and ``torch.load`` give for the device.
    It reports the device (``storage.device``), so PyTorch's serializer tags it ``lazyxla:N`` and
    ``torch.empty(0, device=storage.device).set_(storage)`` builds a lazyxla tensor with its bytes.

    Example:
        >>> s = torch.ones(3).untyped_storage().to(device=lazyxla.device())
        >>> s.device, torch.empty(0, device=s.device).set_(s).view(torch.float32).cpu()
        (device(type='lazyxla', index=0), tensor([1., 1., 1.]))
    """

    @property
    def device(self) -> torch.device:
        return self._lazyxla_device

    @property
    def is_cuda(self) -> bool:
        return False


def _as_device_storage(storage: torch.UntypedStorage, device: torch.device) -> DeviceStorage:
    """``storage`` (host memory nobody else holds) relabelled as ``device``'s: no copy."""
    storage.__class__ = DeviceStorage  # same C layout: the Python class only changes what .device says
    storage._lazyxla_device = device
    return storage


def _device_of(device) -> torch.device | None:
    """The lazyxla device ``device`` names, or None (``device`` as ``torch.UntypedStorage`` takes it)."""
    if isinstance(device, (str, torch.device)) and on_device(torch.device(device)):
        return torch.device(device)
    return None


def _storage_new(cls, *args, device=None, **kwargs):
    """``torch.UntypedStorage.__new__``: a :class:`DeviceStorage` for a lazyxla device, PyTorch's otherwise."""
    target = _device_of(device)
    if target is None:
        if device is not None:
            kwargs["device"] = device
        return torch_private.storage_new(cls, *args, **kwargs)
    storage = torch_private.storage_new(DeviceStorage, *args, **kwargs)
    storage._lazyxla_device = target
    return storage


def _restore(storage, location: str):
    """``torch.load``'s restore for a storage tagged (or mapped to) a lazyxla device: the host storage read from the
    file, relabelled as the device's (PyTorch's own restore for a PrivateUse1 device would copy it first)."""
    if not isinstance(location, str) or _device_of(location.split(":")[0]) is None:
        return None
    device = torch.device(location)
    if device.index is not None and device.index >= torch.accelerator.device_count():
        raise RuntimeError(
            f"torch.load: the checkpoint's tensors are on {location}, and this process has "
            f"{torch.accelerator.device_count()} {device.type} device(s); pass map_location "
            f"(e.g. map_location='{device.type}:0' or 'cpu')"
        )
    return _as_device_storage(storage, device)


def _is_lazyxla(t: torch.Tensor) -> bool:
    """A user-visible lazyxla tensor (a wrapper with functionalization's storage), not a fake one."""
    return on_device(t) and torch_private.has_storage(t) and not torch_private.is_fake(t)


# The host copies made for saving, by (storage, value): tensors holding one value of one storage (a tied weight's
# state-dict entries) reduce to one DeviceStorage, which the serializer writes once. Weak: a copy lives as long as a
# save or pickle holds it; the value's node is kept with it, so an id reused by a later node never matches.
_saved: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _host_storage(t: torch.Tensor) -> DeviceStorage:
    """A :class:`DeviceStorage` holding ``t``'s values in row-major order (one host read, shared as above)."""
    value = unwrap(t)._value
    key = (torch_private.storage_id(t), id(value[0]), value[1], t.dtype, tuple(t.shape))
    held = _saved.get(key)
    if held is not None and held._lazyxla_value[0] is value[0]:
        return held
    if torch_private.serialization_tls.skip_data:  # torch.serialization.skip_data(): no bytes are written
        storage = torch.UntypedStorage(t.numel() * t.element_size())
    else:
        storage = t.detach().cpu().clone(memory_format=torch.contiguous_format).untyped_storage()
    storage = _as_device_storage(storage, t.device)
    storage._lazyxla_value = value
    _saved[key] = storage
    return storage


def _reduce_ex_internal(self: torch.Tensor, proto):
    """``Tensor._reduce_ex_internal`` (what ``torch.save``, pickle and ``copy.copy`` call): PyTorch's for every
    tensor but lazyxla's, which reduce to ``_rebuild_tensor_v2`` over a :class:`DeviceStorage`."""
    if not _is_lazyxla(self):
        return _original_reduce(self, proto)
    torch_private.warn_if_has_hooks(self)
    storage = torch.storage.TypedStorage(wrap_storage=_host_storage(self), dtype=self.dtype, _internal=True)
    args = (storage, 0, tuple(self.size()), contiguous_strides(self.shape), self.requires_grad, OrderedDict())
    metadata = torch_private.tensor_metadata(self)
    if metadata:
        args = args + (metadata,)
    return torch_private.rebuild_tensor_v2, args


def _deepcopy(self: torch.Tensor, memo):
    """``Tensor.__deepcopy__``: PyTorch's for every tensor but lazyxla's, which are cloned as PyTorch clones XLA
    tensors (no host read); tensors sharing a storage and value stay aliases of one copy, views stay views of it."""
    if not _is_lazyxla(self) or not self.is_leaf:  # PyTorch's raises its own error for a non-leaf
        return _original_deepcopy(self, memo)
    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        new = _copied_value(self, memo)
        if self.requires_grad:
            new.requires_grad_()
        if self.grad is not None:
            new.grad = self.grad.__deepcopy__(memo)
        if type(self) is not torch.Tensor:
            if type(new) is not type(self):
                raise RuntimeError(
                    f"copy.deepcopy of a {type(self).__name__} on {self.device}: its clone() returned a "
                    f"{type(new).__name__}; give the subclass a clone() that keeps its type, or a __deepcopy__"
                )
            for slot in torch_private.slot_names(type(self)):
                if hasattr(self, slot):
                    setattr(new, slot, copy.deepcopy(getattr(self, slot), memo))
        torch_private.clear_non_serializable_cached_data(self)
        new.__dict__ = copy.deepcopy(self.__dict__, memo)
    memo[id(self)] = new
    return new


def _copied_value(self: torch.Tensor, memo) -> torch.Tensor:
    """The copy of ``self``'s value in the deep copy ``memo`` belongs to: an alias of the copy of a tensor holding
    the same value of the same storage (``t`` and ``t.detach()``); for a view of a base holding its whole storage,
    the same view of the copy of that base (copied once per storage, as PyTorch copies a CPU tensor's storage once
    in a ``deepcopy`` call: ``deepcopy([a, a.view(25)])`` gives a view of the copied ``a``); a clone otherwise."""
    value = unwrap(self)._value
    key = ("lazyxla storage", torch_private.storage_id(self), id(value[0]), value[1], self.dtype, tuple(self.shape))
    shared = memo.get(key)
    if shared is not None:
        return shared.detach()
    covers = torch_private.covers_its_storage(self)
    root = self if covers else torch_private.view_base(self)
    new = None
    if type(self) is not torch.Tensor:  # a subclass: its own clone() (its view ops may not be aten's)
        new = self.clone()
        if covers:
            memo.setdefault("torch", {}).setdefault(_storage_key(self), new.untyped_storage())
    elif root is self:
        made = ("lazyxla storage root", torch_private.storage_id(self)) not in memo
        new = _root_copy(self, memo)
        if not made:  # an alias of the copy its storage got earlier in this call, which that storage reads from
            new = new.detach()  # (the copy itself lives only as long as the memo)
            note_storage_owner(new, new.untyped_storage())
    elif root is not None and torch_private.covers_its_storage(root):
        new = layout.view_like(self, _root_copy(root, memo))
    if new is None:  # a view of part of a storage (a detached view, a dtype view's views), or not replayable
        new = self.clone()
    memo[key] = new
    return new


def _root_copy(root: torch.Tensor, memo) -> torch.Tensor:
    """The copy, in the deep copy ``memo`` belongs to, of ``root`` (a tensor holding its whole storage): made once
    per storage, and the copy of the storage too, as PyTorch's ``UntypedStorage.__deepcopy__`` memo
    (``memo["torch"]``) links them for a CPU tensor: ``deepcopy([t, t.storage()])`` gives a storage that reads the
    copied tensor's values, in either order."""
    key = ("lazyxla storage root", torch_private.storage_id(root))
    found = memo.get(key)
    if found is None:
        with torch.no_grad():
            found = memo[key] = root.clone()
        memo.setdefault("torch", {})[_storage_key(root)] = found.untyped_storage()
    return found


def _storage_key(t: torch.Tensor) -> int:
    """The key of ``t``'s storage in PyTorch's storage deep-copy memo (``memo["torch"]``)."""
    return torch_private.storage_identity(t.untyped_storage())


def _storage_deepcopy(deepcopy):
    """``UntypedStorage.__deepcopy__`` that copies a lazyxla tensor's storage as the storage of a copy of the tensor
    holding it (``_root_copy``), so that the tensor, copied after its storage in the same call, shares it
    (``deepcopy([t.storage(), t])``); PyTorch's otherwise (a host copy for a storage no tensor holds)."""

    @functools.wraps(deepcopy)
    def copied(self, memo):
        links = memo.get("torch", {})
        if torch_private.storage_identity(self) not in links and not isinstance(self, DeviceStorage):
            holder = storage_holder(self) if on_device(self.device) else None
            if holder is not None:
                _root_copy(holder, memo)
        return deepcopy(self, memo)

    copied._lazyxla = True
    return copied


def _holds_lazyxla(obj, depth: int = 0) -> bool:
    """Whether ``obj`` holds a lazyxla tensor where a checkpoint keeps them: in nested dicts, lists and tuples, a
    module's parameters and buffers, an optimizer's state (a custom object's attributes are not searched)."""
    if isinstance(obj, torch.Tensor):
        return on_device(obj)
    if depth > 8:
        return False
    if isinstance(obj, dict):
        return any(_holds_lazyxla(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return any(_holds_lazyxla(v, depth + 1) for v in obj)
    if isinstance(obj, torch.nn.Module):
        return any(on_device(t) for t in obj.state_dict(keep_vars=True).values())
    if isinstance(obj, torch.optim.Optimizer):
        return _holds_lazyxla(obj.state, depth + 1) or _holds_lazyxla(obj.param_groups, depth + 1)
    return False


def _mode_for(path) -> int:
    """The permission bits ``open(path, "wb")`` would leave: the existing file's, else 0666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0o022)  # reading the umask means setting it: put it back at once
        os.umask(umask)
        return 0o666 & ~umask


def _saving_atomically(save):
    """``torch.save`` that, for a path and an object holding lazyxla tensors, writes a temporary file in the same
    folder and renames it over the path: a save that fails (a device error computing a tensor, an object pickle
    refuses) leaves the previous checkpoint as it was. Anything else is PyTorch's ``torch.save`` unchanged."""

    @functools.wraps(save)
    def atomic_save(obj, f, *args, **kwargs):
        if not isinstance(f, (str, os.PathLike)) or not _holds_lazyxla(obj):
            return save(obj, f, *args, **kwargs)
        folder = os.path.dirname(os.path.abspath(f))
        if not os.path.isdir(folder):  # PyTorch's own error for a missing folder, before anything is computed
            return save(obj, f, *args, **kwargs)
        mode = _mode_for(f)
        atomic_write(f, lambda file: save(obj, file, *args, **kwargs))
        os.chmod(f, mode)  # the temporary file was private (0600); the checkpoint gets the mode open() gives it

    atomic_save._lazyxla = True
    return atomic_save


def _loading(load):
    """``torch.load`` that gives the tensors it put on a lazyxla device the bytes it read after building them
    (PyTorch's legacy format; ``lazy/special.py``). Anything else is PyTorch's ``torch.load`` unchanged."""

    @functools.wraps(load)
    def lazyxla_load(*args, **kwargs):
        with refilled():
            return load(*args, **kwargs)

    lazyxla_load._lazyxla = True
    return lazyxla_load


def _identifying(data_ptr):
    """``UntypedStorage.data_ptr`` that answers for a lazyxla tensor's storage (functionalization's, which has no
    host bytes) with an address that identifies it, as a CUDA storage's answer is a device address the host cannot
    read either: libraries group tied tensors by it (transformers' ``id_tensor_storage``, safetensors), and PyTorch's
    own answer was an error. Views of one storage give the same address; other storages give others."""

    @functools.wraps(data_ptr)
    def identified(self):
        try:
            return data_ptr(self)
        except RuntimeError:
            if not on_device(self.device):
                raise
            return torch_private.storage_identity(self)

    identified._lazyxla = True
    return identified


def _addressing(data_ptr):
    """``Tensor.data_ptr`` that answers for a lazyxla tensor (functionalization's wrapper answers 0 for every one)
    with its storage's identifying address (``_identifying``) plus the offset the tensor has in that storage on the
    CPU (``frontend/layout.py``), as a CUDA tensor answers with a device address: a view and its base share a
    storage, a copy does not, and ``x[1]`` sits past ``x[0]``. Libraries compare these to find aliases."""

    @functools.wraps(data_ptr)
    def addressed(self):
        ptr = data_ptr(self)
        if ptr or not on_device(self):
            return ptr
        base = self.untyped_storage().data_ptr()
        if not base:  # an empty storage: 0, as on the CPU
            return 0
        cpu = layout.cpu_layout(self)
        offset = self.storage_offset() if cpu is None else cpu.storage_offset()
        return base + offset * self.element_size()

    addressed._lazyxla = True
    return addressed


def _noting_owner(untyped_storage):
    """``Tensor.untyped_storage`` that remembers a lazyxla tensor as its storage's holder (``lazy/special.py``), so
    that the storage can be read and ``set_()`` to."""

    @functools.wraps(untyped_storage)
    def noted(self):
        storage = untyped_storage(self)
        # a bare LazyTensor (a DTensor's local tensor in SPMD mode) has no functionalization storage to note
        if _is_lazyxla(self) and torch_private.is_functional(self):
            note_storage_owner(self, storage)
        return storage

    noted._lazyxla = True
    return noted


def _holding_owner(typed_storage):
    """``Tensor.storage`` (a TypedStorage, a plain Python object) that keeps the holder of a lazyxla tensor's values
    alive as long as it lives: the storage of a temporary (``torch.tensor(a.to(torch.int8).storage(), ...)``) is
    read as on the CPU, where the storage keeps its bytes. Only the TypedStorage holds it: the UntypedStorage's
    Python object is kept by its C++ storage, the holder's own, so a reference from it would make a cycle through
    C++ that Python's collector cannot see."""

    @functools.wraps(typed_storage)
    def holding(self):
        typed = typed_storage(self)
        if _is_lazyxla(self):
            holder = storage_holder(typed.untyped())
            if holder is not None:
                typed._lazyxla_holder = holder
        return typed

    holding._lazyxla = True
    return holding


def _lazyxla_bytes(storage) -> torch.UntypedStorage | None:
    """A host copy of the bytes of a lazyxla tensor's storage (functionalization's), None for any other storage."""
    if isinstance(storage, DeviceStorage) or not isinstance(storage, torch.UntypedStorage):
        return None
    if not on_device(storage.device):
        return None
    host = storage_bytes(storage)
    if host is None:
        raise RuntimeError(
            f"this storage of a {storage.device} tensor cannot be read: lazyxla reads a storage through the tensor "
            "holding its values, and none of its tensors that holds them all was asked for it (a view's storage is "
            "read through its base: base.untyped_storage())"
        )
    return host.untyped_storage()


def _reading(method):
    """A storage method that reads (``__getitem__``, ``tolist``, ``_write_file``: pickle, the legacy format):
    PyTorch's, on a host copy for a lazyxla tensor's storage (lazyxla refuses storage writes, below)."""

    @functools.wraps(method)
    def read(self, *args, **kwargs):
        host = _lazyxla_bytes(self)
        return method(self if host is None else host, *args, **kwargs)

    read._lazyxla = True
    return read


def _writing(method):
    """A storage method that writes (``__setitem__``, ``fill_``, ``copy_``, ``resize_``): PyTorch's, with a clear
    error for a lazyxla tensor's storage; ``copy_`` from one into host memory reads it."""

    @functools.wraps(method)
    def write(self, *args, **kwargs):
        if not isinstance(self, DeviceStorage) and isinstance(self, torch.UntypedStorage) and on_device(self.device):
            raise RuntimeError(
                f"writing to the storage of a {self.device} tensor: lazyxla's device values are written through "
                "tensors (t.copy_(...), t.fill_(...), t[i] = v), not through their storage"
            )
        if method.__name__ == "copy_" and args:
            host = _lazyxla_bytes(args[0])
            if host is not None:
                args = (host, *args[1:])
        return method(self, *args, **kwargs)

    write._lazyxla = True
    return write


def _refusing_dlpack(export):
    """``to_dlpack`` / ``Tensor.__dlpack__`` that refuse a lazyxla tensor with a clear error. DLPack hands the
    consumer a pointer to the tensor's memory; a lazyxla tensor's values are a jax buffer that only a sync makes
    exist and that XLA may donate, so no pointer can alias them (PyTorch's own export would hand out a null one)."""

    @functools.wraps(export)
    def refuse(tensor, *args, **kwargs):
        if on_device(tensor):
            raise BufferError(
                f"DLPack cannot export a {tensor.device} tensor: its values live in XLA device memory that lazyxla "
                "does not let other libraries alias. Export a host copy (tensor.cpu()) instead."
            )
        return export(tensor, *args, **kwargs)

    refuse._lazyxla = True
    return refuse


_original_reduce = torch_private.tensor_reduce_ex_internal
_original_deepcopy = torch_private.tensor_deepcopy
_installed = False


def install() -> None:
    """Install the tensor reduction, deep copy and device storages above (once)."""
    global _installed
    if not _installed:
        torch_private.set_tensor_methods(_reduce_ex_internal, _deepcopy)
        torch_private.set_storage_new(_storage_new)
        torch_private.accept_wrapped_storage(DeviceStorage)
        torch_private.wrap_storage_method("data_ptr", _identifying)
        torch_private.wrap_storage_method("__deepcopy__", _storage_deepcopy)
        for name in ("__getitem__", "tolist", "_write_file"):
            torch_private.wrap_storage_method(name, _reading)
        for name in ("__setitem__", "fill_", "copy_", "resize_"):
            torch_private.wrap_storage_method(name, _writing)
        torch_private.wrap_tensor_untyped_storage(_noting_owner)
        if not getattr(torch.Tensor.data_ptr, "_lazyxla", False):
            torch.Tensor.data_ptr = _addressing(torch.Tensor.data_ptr)
        if not getattr(torch.Tensor.storage, "_lazyxla", False):
            torch.Tensor.storage = _holding_owner(torch.Tensor.storage)
        torch.serialization.register_package(15, lambda storage: None, _restore)  # before PyTorch's PrivateUse1 (23)
        if not getattr(torch.save, "_lazyxla", False):
            torch.save = _saving_atomically(torch.save)
            torch.load = _loading(torch.load)
        torch.Tensor.__dlpack__ = _refusing_dlpack(torch.Tensor.__dlpack__)
        torch.utils.dlpack.to_dlpack = torch.to_dlpack = _refusing_dlpack(torch.utils.dlpack.to_dlpack)
        _installed = True


__all__ = ["DeviceStorage", "install"]
