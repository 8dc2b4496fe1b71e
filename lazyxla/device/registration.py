"""Registration of the ``lazyxla`` device with PyTorch (PrivateUse1, renamed, as a Python backend).

This is the one module that touches private PyTorch registration APIs. It checks the torch version it
was written against and fails with a clear message otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lazyxla.device import runtime

SUPPORTED_TORCH = ((2, 13), (2, 14))  # inclusive range of major.minor
NAME = "lazyxla"
_done = False


def check_torch_version(version: str = torch.__version__) -> None:
    major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    lo, hi = SUPPORTED_TORCH
    if not lo <= (major, minor) <= hi:
        raise ImportError(
            f"lazyxla supports torch {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}, but torch {version} is installed; "
            f"install a supported release, e.g. pip install 'torch=={lo[0]}.{lo[1]}.*'"
        )


class _BackendModule:
    """``torch.lazyxla``: what PyTorch asks of a device module (seeding, counts, availability)."""

    def __init__(self, seed_fn: Callable[[int], None]) -> None:
        self._seed_fn = seed_fn

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def device_count(self) -> int:
        return len(runtime.local_devices())

    def current_device(self) -> int:
        return 0

    def manual_seed(self, seed: int) -> None:
        self._seed_fn(seed)

    def manual_seed_all(self, seed: int) -> None:
        self._seed_fn(seed)


_library = None


def register(kernels: dict[str, Callable], seed_fn: Callable[[int], None], fallback: Callable) -> None:
    """Rename PrivateUse1 to ``lazyxla`` and install the backend kernels (idempotent).

    ``kernels`` are per-op kernels; ``fallback`` receives every other op that reaches the lazyxla
    backend key, as ``fallback(op, *args, **kwargs)``.
    """
    global _done, _library
    if _done:
        return
    check_torch_version()
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    if torch._C._get_privateuse1_backend_name() not in ("privateuseone", NAME):
        raise RuntimeError(
            f"PyTorch's PrivateUse1 device is already taken by {torch._C._get_privateuse1_backend_name()!r}; "
            "lazyxla cannot be used in the same process as that backend"
        )
    _setup_privateuseone_for_python_backend(NAME, backend_module=_BackendModule(seed_fn))
    for name, fn in kernels.items():
        torch.library.impl(name, "privateuseone")(fn)
    _library = torch.library.Library("_", "IMPL")
    _library.fallback(fallback, "PrivateUse1")
    _done = True


def patch_printing(to_cpu: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Print lazyxla tensors from one host copy, as PyTorch does for XLA tensors (no per-element syncs)."""
    import torch._tensor_str as ts

    original = ts._str
    if getattr(original, "_lazyxla", False):
        return

    def _str(self, *, tensor_contents=None):
        if self.device.type != NAME:
            return original(self, tensor_contents=tensor_contents)
        text = original(to_cpu(self), tensor_contents=tensor_contents)
        extra = [f"device='{self.device}'"]
        if self.grad_fn is not None:
            extra.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
        elif self.requires_grad:
            extra.append("requires_grad=True")
        cut = text.find(", dtype=")
        cut = len(text) - 1 if cut < 0 else cut
        return text[:cut] + ", " + ", ".join(extra) + text[cut:]

    _str._lazyxla = True
    ts._str = _str
