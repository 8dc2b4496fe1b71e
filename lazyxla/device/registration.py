"""Registration of the ``lazyxla`` device with PyTorch (PrivateUse1, renamed, as a Python backend).

This is the one module that touches private PyTorch registration APIs. It checks the torch version it
was written against and fails with a clear message otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable

import numpy as np
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
    """``torch.lazyxla``: what PyTorch asks of a device module (seeding, RNG state, counts, availability).

    One RNG stream (a seed and a counter) serves every lazyxla device of the process, so the
    per-device calls (``get_rng_state(device)``, ``manual_seed_all``) all read or set that stream.
    PyTorch's own helpers rely on these: ``torch.random.fork_rng(device_type="lazyxla")`` and
    ``torch.utils.checkpoint`` (which replays dropout with the state saved in the forward).

    Example:
        >>> state = torch.lazyxla.get_rng_state()
        >>> a = torch.rand(3, device="lazyxla")
        >>> torch.lazyxla.set_rng_state(state)
        >>> torch.equal(a.cpu(), torch.rand(3, device="lazyxla").cpu())
        True
    """

    _initialized = True  # torch.utils.checkpoint saves the RNG state only of initialized device modules

    def __init__(self, rng) -> None:
        self._rng = rng

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

    @contextlib.contextmanager
    def device(self, index):
        """A context for ``index`` (the RNG is shared, so nothing changes inside it); checks the index."""
        index = torch.device(index).index if isinstance(index, (str, torch.device)) else index
        if index is not None and not 0 <= int(index) < self.device_count():
            raise ValueError(f"lazyxla device index {index} is out of range: this process has {self.device_count()}")
        yield

    def manual_seed(self, seed: int) -> None:
        self._rng.manual_seed(seed)

    manual_seed_all = manual_seed

    def seed(self) -> None:
        """Seed the stream with a non-deterministic number."""
        self._rng.manual_seed(int.from_bytes(os.urandom(8), "little"))

    seed_all = seed

    def initial_seed(self) -> int:
        return self._rng.get_state()[0]

    def get_rng_state(self, device="lazyxla") -> torch.Tensor:
        """The stream's state as a 16-byte ``torch.uint8`` CPU tensor (seed and counter)."""
        return torch.from_numpy(np.array(self._rng.get_state(), dtype=np.uint64).view(np.uint8).copy())

    def set_rng_state(self, new_state: torch.Tensor, device="lazyxla") -> None:
        """Restore a state that ``get_rng_state`` returned."""
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.numel() != 16:
            raise ValueError(
                "torch.lazyxla.set_rng_state expects the 16-byte torch.uint8 tensor that "
                f"torch.lazyxla.get_rng_state() returned, got {new_state!r:.80}"
            )
        seed, counter = new_state.detach().cpu().contiguous().numpy().view(np.uint64)
        self._rng.set_state((int(seed), int(counter)))

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state(i) for i in range(self.device_count())]

    def set_rng_state_all(self, new_states) -> None:
        for state in new_states:
            self.set_rng_state(state)

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        """The dtypes ``torch.autocast("lazyxla", dtype=...)`` accepts."""
        return [torch.bfloat16, torch.float16]


# ---- exceptions raised inside backward ----
#
# PyTorch's Python device guard answers the autograd engine by calling back into Python (its ``type_``),
# also from the destructor of the stream guard the engine holds around every node it runs. When a Python
# exception is leaving a node (a tensor hook that raises, or a lazyxla kernel that refuses an op), Python's
# error indicator is still set at that moment, the callback fails inside a destructor, and the C++ runtime
# aborts the whole process. So the guard first moves any pending exception aside (``PyErr_Fetch``); the
# engine then reports a bare SystemError, and the wrapper around its entry point raises the moved-aside
# exception in its place, in the thread that called ``backward``.

_err_fetch = ctypes.pythonapi.PyErr_Fetch
_err_fetch.restype = None  # no argtypes: ctypes must not call Python converters while an error is pending
_err_cells = (ctypes.py_object(), ctypes.py_object(), ctypes.py_object())
_err_refs = tuple(ctypes.pointer(c) for c in _err_cells)
_parked: list[BaseException] = []


def _park_pending_error() -> None:
    _err_fetch(*_err_refs)  # clears the indicator; only now may Python objects be touched
    try:
        kind = _err_cells[0].value
    except ValueError:  # NULL: nothing was pending
        return
    try:
        value = _err_cells[1].value
    except ValueError:
        value = None
    try:
        tb = _err_cells[2].value
    except ValueError:
        tb = None
    if not isinstance(value, BaseException):
        value = kind() if value is None else kind(*(value if isinstance(value, tuple) else (value,)))
    _parked.append(value.with_traceback(tb) if tb is not None else value)


class _DeviceGuard(torch._C._acc.DeviceGuard):
    """The device guard PyTorch calls for lazyxla tensors; see the note above for why it parks errors."""

    def __getattribute__(self, name):
        _park_pending_error()
        return object.__getattribute__(self, name)

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _raising_parked_errors(run_backward: Callable) -> Callable:
    @functools.wraps(run_backward)
    def run(*args, **kwargs):
        _parked.clear()
        try:
            return run_backward(*args, **kwargs)
        except SystemError:
            if not _parked:
                raise
            error = _parked[0]
            _parked.clear()
            raise error from None
        except RuntimeError as e:
            if "device_ready_queues_" not in str(e):
                raise
            raise RuntimeError(
                "lazyxla was imported after PyTorch's autograd engine had started (a backward ran before "
                "`import lazyxla`): the engine sizes its per-device worker queues once, so gradients of "
                "lazyxla tensors cannot be computed in this process. Import lazyxla before any backward, "
                "e.g. right after `import torch` at the top of the script (or restart the notebook kernel)."
            ) from None

    return run


def _install_backward_error_relay() -> None:
    import torch.autograd.graph

    run = _raising_parked_errors(torch.autograd.graph._engine_run_backward)
    torch.autograd.graph._engine_run_backward = run
    torch.autograd._engine_run_backward = run


_library = None
_autograd_library = None


def register(kernels: dict[str, Callable], rng, fallback: Callable, autograd_kernels: dict[str, Callable]) -> None:
    """Rename PrivateUse1 to ``lazyxla`` and install the backend kernels (idempotent).

    ``kernels`` are per-op kernels; ``rng`` is the device RNG (``manual_seed``, ``get_state``, ``set_state``);
    ``fallback`` receives every other op that reaches the lazyxla backend key, as
    ``fallback(op, *args, **kwargs)``; ``autograd_kernels`` replace PyTorch's composite kernels of some
    aten ops for lazyxla tensors, above autograd (``"scaled_dot_product_attention": fn``).
    """
    global _done, _library, _autograd_library
    if _done:
        return
    check_torch_version()
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    if torch._C._get_privateuse1_backend_name() not in ("privateuseone", NAME):
        raise RuntimeError(
            f"PyTorch's PrivateUse1 device is already taken by {torch._C._get_privateuse1_backend_name()!r}; "
            "lazyxla cannot be used in the same process as that backend"
        )
    _setup_privateuseone_for_python_backend(NAME, backend_module=_BackendModule(rng), device_guard=_DeviceGuard())
    _install_backward_error_relay()
    for name, fn in kernels.items():
        torch.library.impl(name, "privateuseone")(fn)
    _library = torch.library.Library("_", "IMPL")
    _library.fallback(fallback, "PrivateUse1")
    _autograd_library = torch.library.Library("aten", "IMPL")
    for name, fn in autograd_kernels.items():
        _autograd_library.impl(name, fn, "AutogradPrivateUse1", with_keyset=getattr(fn, "with_keyset", False))
    _done = True


def patch_printing(to_cpu: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Print lazyxla tensors from one host copy, as PyTorch does for XLA tensors (no per-element syncs)."""
    import torch._tensor_str as ts

    original = ts._str
    if getattr(original, "_lazyxla", False):
        return

    from torch._subclasses.fake_tensor import is_fake

    def _str(self, *, tensor_contents=None):
        if self.device.type != NAME or is_fake(self):  # fake tensors (torch.compile's tracing) have no values
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
