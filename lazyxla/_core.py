"""Glue between PyTorch's device hooks and the lazy layer: factory and copy kernels, seeding."""

from __future__ import annotations

import torch

from lazyxla.device import registration, runtime
from lazyxla.lazy import rng
from lazyxla.lazy.record import _to_cpu, record
from lazyxla.lazy.tensor import LazyTensor, unwrap, wrap

aten = torch.ops.aten


def _empty(size, dtype=None, device=None):
    dtype = dtype or torch.get_default_dtype()
    index = 0 if device is None else (torch.device(device).index or 0)
    runtime.jax_device(index)  # raises a clear error for a device that does not exist
    kw = {"dtype": dtype, "device": torch.device("lazyxla", index)}
    lt = record(aten.empty.memory_format, (list(size),), kw)
    return wrap(lt)


def _empty_memory_format(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _empty(size, dtype, device)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _empty(size, dtype, device)


def _copy_from(src, dst, non_blocking=False):
    if dst.device.type == "lazyxla":
        inner = unwrap(dst)
        from lazyxla.lazy.record import _copy

        new = _copy(inner, src if src.device.type != "lazyxla" else unwrap(src))
        inner._value = new._value
        return dst
    dst.copy_(_to_cpu(unwrap(src)))
    return dst


def to_cpu(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _to_cpu(unwrap(t))


KERNELS = {
    "aten::empty.memory_format": _empty_memory_format,
    "aten::empty_strided": _empty_strided,
    "aten::_copy_from": _copy_from,
}


def install() -> None:
    registration.register(KERNELS, rng.manual_seed)
    registration.patch_printing(to_cpu)
    rng.manual_seed(torch.initial_seed())


__all__ = ["LazyTensor", "install", "to_cpu"]
