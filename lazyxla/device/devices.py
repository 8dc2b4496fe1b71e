"""The jax devices behind lazyxla and host<->device transfer, on top of jax's default backend: which devices,
the platform, 64-bit mode, SPMD mode's global layout, dtype mapping.

Every copy between the host and the devices goes through :func:`send`, :func:`send_to` or :func:`to_host`, which
time it and count its bytes and the device buffers it makes (``observe/metrics.py``: ``transfer_to_device``,
``bytes_to_device``, ``device_buffers``, ...).
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import torch
from jax.experimental import multihost_utils

from lazyxla import torch_private
from lazyxla.device import processes
from lazyxla.observe import metrics

# All jax work of lazyxla runs with 64-bit types on, so that int64/float64 keep their width; the
# user's own global jax config is left as it is.
x64 = functools.partial(jax.enable_x64, True)


# ---- the device's name in PyTorch ----
#
# lazyxla's device is PyTorch's PrivateUse1 device, renamed when lazyxla registers it: "lazyxla", or "xla" in a
# process that runs code written for torch_xla (``python -m lazyxla.run``, ``LAZYXLA_DEVICE_NAME=xla``), where
# ``torch.device("xla")``, ``"xla:1"`` and ``t.device.type == "xla"`` then mean lazyxla's device. PyTorch takes the
# name once per process, so it is fixed before any lazyxla tensor exists; every check of "is this tensor on the
# device" reads it here.
DEVICE_NAMES = ("lazyxla", "xla")
_name = ["lazyxla"]
_torch_devices: list[torch.device] = []  # torch.device(name, i), made once per index


def set_torch_name(name: str) -> None:
    """Name the device ``name`` (one of ``DEVICE_NAMES``): ``frontend.registration`` calls it once, before it
    renames PyTorch's PrivateUse1 device."""
    if name not in DEVICE_NAMES:
        raise ValueError(f"lazyxla's device can be named {' or '.join(map(repr, DEVICE_NAMES))}, not {name!r}")
    _name[0] = name
    _torch_devices.clear()


def torch_name() -> str:
    """The device type PyTorch knows lazyxla's device by in this process: ``"lazyxla"`` or ``"xla"``.

    Example::

        on_device = t.device.type == torch_name()
    """
    return _name[0]


def torch_device(index: int) -> torch.device:
    """``torch.device(torch_name(), index)``, made once per index (LazyTensors are made per op)."""
    while len(_torch_devices) <= index:
        _torch_devices.append(torch.device(_name[0], len(_torch_devices)))
    return _torch_devices[index]


def on_device(t) -> bool:
    """Whether ``t`` (a tensor or a ``torch.device``) is on lazyxla's device."""
    return (t.type if isinstance(t, torch.device) else t.device.type) == _name[0]


_spmd = [False]  # SPMD mode (lazyxla.spmd.enable): the lazyxla device stands for every device of the run


def set_spmd(on: bool) -> None:
    _spmd[0] = on


def spmd_enabled() -> bool:
    return _spmd[0]


@functools.cache
def global_devices() -> tuple[jax.Device, ...]:
    """Every device of the run, by process then id."""
    processes.ensure_initialized()
    return tuple(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))


@functools.cache
def replicated() -> jax.sharding.NamedSharding:
    """The layout of a plain device tensor in SPMD mode: every device of the run holds all of it."""
    mesh = jax.sharding.Mesh(np.array(global_devices()), ("all",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def put_global(host: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array laid out as ``sharding`` from the same host value in every process."""
    with x64():
        if sharding.is_fully_addressable:
            return jax.device_put(host, sharding)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def relayout(a: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """``a`` laid out as ``sharding`` (an SPMD annotation), with its own dtype.

    Outside 64-bit mode jax's resharding path narrows 64-bit buffers (int64 -> int32) while the array
    still says int64; an executable compiled for s64 then gets s32 buffers (and XLA aborts).
    """
    with x64():
        return jax.device_put(a, sharding)


@functools.cache
def local_devices() -> tuple[jax.Device, ...]:
    processes.ensure_initialized()  # a multi-process run is joined before jax starts its backend
    return tuple(jax.local_devices())


def platform() -> str:
    """The jax platform that backs the lazyxla device: 'cpu', 'gpu' or 'tpu'."""
    return local_devices()[0].platform


def jax_device(index: int | None) -> jax.Device:
    devs = local_devices()
    i = 0 if index is None else index
    if not 0 <= i < len(devs):
        raise RuntimeError(
            f"{_name[0]}:{i} does not exist: this process has {len(devs)} lazyxla device(s) "
            f"(jax platform {devs[0].platform!r}); use an index in 0..{len(devs) - 1}"
        )
    return devs[i]


_NP_OF_TORCH = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.bfloat16: jax.numpy.bfloat16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.uint16: np.uint16,
    torch.uint32: np.uint32,
    torch.uint64: np.uint64,
    torch.bool: np.bool_,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
}
_TORCH_OF_NP = {np.dtype(v): k for k, v in _NP_OF_TORCH.items()}


def np_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return np.dtype(_NP_OF_TORCH[dtype])
    except KeyError:
        supported = sorted(map(str, _NP_OF_TORCH))
        raise TypeError(f"lazyxla does not support dtype {dtype}; supported: {supported}") from None


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return _TORCH_OF_NP[np.dtype(dtype)]


def check_dense(t: torch.Tensor) -> None:
    """Refuse, naming what to do, a CPU tensor no lazyxla tensor can hold: a sparse layout, a nested tensor, a
    quantized tensor (XLA buffers are dense arrays of a plain dtype; torch_xla has none of these either).

    Example::

        check_dense(torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8))   # RuntimeError: ... dequantize()
    """
    if t.layout != torch.strided:
        raise TypeError(f"lazyxla tensors are dense: convert this {t.layout} tensor with .to_dense() first")
    if t.is_nested:  # its layout says strided; its shape cannot even be asked
        raise RuntimeError(
            "lazyxla tensors are dense: a nested tensor (torch.nested) cannot live on lazyxla; "
            "pad it first (nt.to_padded_tensor(0.0)) or keep it on the CPU"
        )
    if t.is_quantized:
        raise RuntimeError(
            f"lazyxla has no quantized tensors ({t.dtype}): call .dequantize() before moving it to lazyxla, "
            "or keep quantized work on the CPU"
        )


def host_array(t: torch.Tensor) -> np.ndarray:
    """A private C-contiguous numpy copy of a CPU tensor, in the dtype jax uses for it."""
    t = t.detach()
    check_dense(t)
    if torch_private.is_zerotensor(t):  # autograd's symbolic zeros have no storage
        t = torch.zeros(t.shape, dtype=t.dtype)
    if t.dtype == torch.bfloat16:
        host = t.view(torch.int16).numpy().view(jax.numpy.bfloat16)
    else:
        host = t.resolve_conj().resolve_neg().numpy()
    # A private copy: jax's CPU client may alias a host buffer instead of copying it, and the user may
    # change the CPU tensor after .to(device).
    return np.array(host, order="C", copy=True)


def to_device(t: torch.Tensor, index: int | None) -> jax.Array:
    """Copy a CPU tensor to the jax device behind ``lazyxla:index`` (in SPMD mode: to every device)."""
    return send([host_array(t)], index)[0]


def send(hosts: list[np.ndarray], index: int | None) -> list[jax.Array]:
    """Copy host arrays to the jax device behind ``lazyxla:index`` (in SPMD mode: to every device of the run), as
    one transfer: timed, its bytes (over every device it fills) one sample of ``bytes_to_device``, each buffer it
    makes counted (``device_buffers``).

    Example::

        scalars, keys = send([np.array([0.5, 2.0]), keys], 0)
    """
    if _spmd[0]:
        sharding = replicated()
        copies = len(sharding.addressable_devices)
        with metrics.transfer("to_device", copies * sum(h.nbytes for h in hosts)):
            out = [put_global(h, sharding) for h in hosts]
        metrics.inc("device_buffers", copies * len(out))
        return out
    with metrics.transfer("to_device", sum(h.nbytes for h in hosts)), x64():
        out = jax.device_put(hosts, jax_device(index))
    metrics.inc("device_buffers", len(out))
    return out


def passed(hosts: list[np.ndarray]) -> list[np.ndarray]:
    """Host arrays a program call takes as they are (one device, no SPMD): jax copies them inside the call.
    Their bytes and buffers are counted as :func:`send`'s are, but not timed apart: a separate ``device_put``
    per program costs ~50 us of host time, as much as the rest of a small sync.

    Example::

        args[n:] = passed(args[n:])   # the packed scalars and RNG keys, in lazy.graph
    """
    metrics.transferred("to_device", sum(h.nbytes for h in hosts))
    metrics.inc("device_buffers", len(hosts))
    return hosts


def send_to(host: np.ndarray, device: jax.Device) -> jax.Array:
    """Copy a host array to the jax device ``device`` (a shard, a replica's block), timed and counted as
    :func:`send` does.

    Example::

        block = send_to(host_array(part), shard.device)
    """
    with metrics.transfer("to_device", host.nbytes), x64():
        out = jax.device_put(host, device)
    metrics.inc("device_buffers")
    return out


def buffers(arrays: list[jax.Array]) -> int:
    """How many device buffers of this process hold ``arrays`` (one per array, but in SPMD mode one per device
    that holds a part of it)."""
    if not _spmd[0]:
        return len(arrays)
    return sum(len(a.sharding.addressable_devices) for a in arrays)


def to_host(a: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """Copy a jax array to a new CPU tensor (blocks until the array is ready), timed and its bytes counted
    (``transfer_from_device``, ``bytes_from_device``)."""
    with metrics.transfer("from_device", math.prod(a.shape) * a.dtype.itemsize):
        host = _fetch(a)
    if dtype == torch.bfloat16:
        return torch.from_numpy(host.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(host, copy=True))


def _fetch(a: jax.Array) -> np.ndarray:
    if not a.is_fully_addressable:  # a global array of a multi-process SPMD run: every process gets all of it
        with x64():  # the gather is a jax program: 64-bit values must keep their width through it
            return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    return np.asarray(a)
