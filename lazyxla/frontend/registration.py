"""Registration of the ``lazyxla`` device with PyTorch (PrivateUse1, renamed, as a Python backend).

The device is named ``lazyxla``, or ``xla`` in a process that runs code written for torch_xla (the name is
chosen once, before the device is registered: ``lazyxla.device.devices.torch_name``).

The private PyTorch APIs this takes (the device guard, the Python-backend set-up, the engine's entry point,
tensor printing) come from ``lazyxla.torch_private``, which checks the torch version first.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import warnings
import weakref
from collections.abc import Callable

import numpy as np
import torch

from lazyxla import torch_private
from lazyxla.device import devices
from lazyxla.frontend import inplace_checks, streams
from lazyxla.lazy import subclass_relay

_done = False


class _BackendModule:
    """``torch.lazyxla`` (``torch.xla`` where the device is named ``xla``): what PyTorch asks of a device module
    (seeding, RNG state, counts, availability, the current device, streams and events, memory queries).

    Streams and events order work and run nothing concurrently: every op is recorded in program order, so a wait
    between streams is always satisfied (``lazyxla.frontend.streams`` says what each call does); FSDP2, DTensor
    and ``torch.distributed.checkpoint`` run their stream code unchanged on it.

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

    # streams and events (an ordering, not concurrency: lazyxla.frontend.streams), and memory queries
    Stream = streams.Stream
    Event = streams.Event
    stream = staticmethod(streams.stream)
    current_stream = staticmethod(streams.current_stream)
    default_stream = staticmethod(streams.default_stream)
    set_stream = staticmethod(streams.set_stream)
    memory_allocated = staticmethod(streams.memory_allocated)
    max_memory_allocated = staticmethod(streams.max_memory_allocated)
    memory_reserved = staticmethod(streams.memory_reserved)
    mem_get_info = staticmethod(streams.mem_get_info)
    reset_peak_memory_stats = staticmethod(streams.reset_peak_memory_stats)
    empty_cache = staticmethod(streams.empty_cache)

    def __init__(self, rng, synchronize: Callable[[], None]) -> None:
        self._rng = rng
        self._wait = synchronize
        self._device = 0
        streams.Stream._synchronize = staticmethod(synchronize)

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def device_count(self) -> int:
        return len(devices.local_devices())

    def current_device(self) -> int:
        """The index ``set_device`` chose (0 unless it was called): what device-generic code places work on."""
        return self._device

    def set_device(self, device) -> None:
        """Choose the current device (an index, ``"lazyxla:1"`` or a torch.device); checks that it exists."""
        self._check_index(device)
        self._device = (torch.device(device).index or 0) if isinstance(device, (str, torch.device)) else int(device)

    @contextlib.contextmanager
    def device(self, index):
        """A context for ``index`` (the RNG is shared, so nothing changes inside it); checks the index."""
        self._check_index(index)
        yield

    def synchronize(self, device=None) -> None:
        """Wait until the work already sent to the device is done (as ``torch.cuda.synchronize``); ops recorded
        since the last ``lazyxla.sync()`` are not sent yet, so they are not waited for. One process's devices
        run one program per step, so every index waits for all of them.

        Example:
            >>> lazyxla.sync(); torch.lazyxla.synchronize()   # e.g. before reading a wall clock
        """
        self._check_index(device)
        self._wait()

    def _check_index(self, device) -> None:
        index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
        if index is not None and not 0 <= int(index) < self.device_count():
            raise ValueError(
                f"{devices.torch_name()} device index {index} is out of range: this process has {self.device_count()}"
            )

    def manual_seed(self, seed: int) -> None:
        self._rng.manual_seed(seed)

    manual_seed_all = manual_seed

    def seed(self) -> None:
        """Seed the stream with a non-deterministic number."""
        self._rng.manual_seed(int.from_bytes(os.urandom(8), "little"))

    seed_all = seed

    def initial_seed(self) -> int:
        return self._rng.get_state()[0]

    def get_rng_state(self, device=None) -> torch.Tensor:
        """The stream's state as a 16-byte ``torch.uint8`` CPU tensor (seed and counter)."""
        return torch.from_numpy(np.array(self._rng.get_state(), dtype=np.uint64).view(np.uint8).copy())

    def set_rng_state(self, new_state: torch.Tensor, device=None) -> None:
        """Restore a state that ``get_rng_state`` returned."""
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.numel() != 16:
            raise ValueError(
                f"torch.{devices.torch_name()}.set_rng_state expects the 16-byte torch.uint8 tensor that "
                f"torch.{devices.torch_name()}.get_rng_state() returned, got {new_state!r:.80}"
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


class _Hooks(torch_private.PrivateUse1Hooks):
    """What PyTorch's C++ side asks of the PrivateUse1 backend (PyTorch's own defaults for a Python backend)."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch_private.DeviceGuard):
    """The device guard PyTorch calls for lazyxla tensors; see the note above for why it parks errors."""

    def __getattribute__(self, name):
        _park_pending_error()
        return object.__getattribute__(self, name)

    def type_(self):
        return torch_private.PRIVATEUSE1


# PyTorch's own limit (pytorch/pytorch#161129, open): once a PrivateUse1 backend is registered, the autograd engine
# takes it for the process's accelerator and finds no stream for a CUDA node, so a CUDA backward (and a lazyxla one
# after it) fails an INTERNAL ASSERT in engine.cpp. Seen on an H200 with torch 2.11 (docs/performance.md).
CUDA_BACKWARD_MESSAGE = (
    "a backward over CUDA tensors cannot run in a process where lazyxla is imported: PyTorch's autograd engine "
    "takes the registered PrivateUse1 device (lazyxla) for the accelerator and finds no stream for CUDA's nodes "
    "(its INTERNAL ASSERT 'opt_ready_stream && opt_parent_stream', pytorch/pytorch#161129). Train on lazyxla's "
    "device, or run the CUDA reference in another process that does not import lazyxla."
)


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
            if "opt_ready_stream && opt_parent_stream" in str(e):
                raise RuntimeError(CUDA_BACKWARD_MESSAGE) from None
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
    torch_private.wrap_engine_run_backward(_raising_parked_errors)


# ---- pinned host memory and torch.accelerator ----
#
# With lazyxla registered, PyTorch reports it as the current accelerator (torch.accelerator), so
# ``Tensor.pin_memory()`` and ``DataLoader(pin_memory=True)`` ask it for a pinned-memory allocator. PyTorch's
# Python hooks (PrivateUse1Hooks in torch._C._acc, torch 2.13 and 2.14) cannot provide one: its C++ side raises
# NotImplementedError, so importing lazyxla broke CPU programs that pin. jax copies to the device from
# ordinary host memory, so lazyxla's pinned memory is ordinary CPU memory: ``_pin_memory`` for lazyxla copies
# the tensor into a new CPU tensor (as PyTorch's kernel copies it into pinned memory) and remembers its
# storage, which ``is_pinned`` then reports. For any other device both run PyTorch's own kernels.

_pinned_storages: weakref.WeakSet = weakref.WeakSet()  # storages of tensors _pin_memory made for lazyxla


def _pins_for_lazyxla(device) -> bool:
    if device is not None:
        return devices.on_device(torch.device(device))
    current = torch.accelerator.current_accelerator()
    return current is not None and devices.on_device(current)


def _pin_memory_kernels() -> dict[str, Callable]:
    # PyTorch's CPU kernels, taken before lazyxla registers its own
    pin = torch_private.computed_kernel("aten::_pin_memory", "CPU")
    is_pinned = torch_private.computed_kernel("aten::is_pinned", "CPU")

    def _pin_memory(keyset, self, device=None):
        if not _pins_for_lazyxla(device):
            return pin.call_boxed(keyset, self, device)
        out = torch.empty_strided(self.size(), self.stride(), dtype=self.dtype, device="cpu")
        out.copy_(self)
        _pinned_storages.add(out.untyped_storage())
        return out

    def _is_pinned(keyset, self, device=None):
        if not _pins_for_lazyxla(device):
            return is_pinned.call_boxed(keyset, self, device)
        return self.untyped_storage() in _pinned_storages

    return {"_pin_memory": _pin_memory, "is_pinned": _is_pinned}


def _pin_device_tensor(self, device=None):
    """``lazyxla_tensor.pin_memory()``: PyTorch's error for a tensor that is not on the CPU."""
    raise RuntimeError(
        f"cannot pin a tensor on {self.device}: only dense CPU tensors can be pinned (it is on the device already)"
    )


def _device_tensor_is_pinned(self, device=None) -> bool:
    """``lazyxla_tensor.is_pinned()``: False, as PyTorch answers for any tensor not on the CPU (no host read)."""
    return False


def _lazyxla_is_current(query: Callable) -> Callable:
    """``torch.accelerator.<query>`` that answers from ``torch.lazyxla`` while lazyxla is the current accelerator.
    PyTorch asks these of the device guard in C++, and its Python device guard has no way to answer them:
    it says one device, and raises for synchronize."""

    @functools.wraps(query)
    def answer(*args, **kwargs):
        current = torch.accelerator.current_accelerator()
        if current is None or not devices.on_device(current):
            return query(*args, **kwargs)
        return getattr(getattr(torch, devices.torch_name()), query.__name__)(*args, **kwargs)

    answer._lazyxla = True
    return answer


def _install_accelerator_queries() -> None:
    for name in ("device_count", "synchronize"):
        query = getattr(torch.accelerator, name)
        if not getattr(query, "_lazyxla", False):
            setattr(torch.accelerator, name, _lazyxla_is_current(query))


_library = None
_autograd_library = None
_cpu_library = None


def register(
    kernels: dict[str, Callable],
    rng,
    fallback: Callable,
    autograd_kernels: dict[str, Callable],
    synchronize: Callable[[], None],
    name: str = "lazyxla",
) -> None:
    """Rename PrivateUse1 to ``name`` (``lazyxla``, or ``xla`` for torch_xla's code) and install the backend
    kernels (idempotent: the first call's name stays, as PyTorch renames its device once per process).

    ``kernels`` are per-op kernels; ``rng`` is the device RNG (``manual_seed``, ``get_state``, ``set_state``);
    ``fallback`` receives every other op that reaches the lazyxla backend key, as
    ``fallback(op, *args, **kwargs)``; ``autograd_kernels`` replace PyTorch's composite kernels of some
    aten ops for lazyxla tensors, above autograd (``"scaled_dot_product_attention": fn``); ``synchronize``
    waits for the work sent to the devices (``torch.lazyxla.synchronize``, ``torch.accelerator.synchronize``).
    Also pinned host memory for lazyxla (``Tensor.pin_memory``, ``DataLoader(pin_memory=True)``).
    """
    global _done, _library, _autograd_library, _cpu_library
    if _done:
        return
    taken = torch_private.privateuse1_backend_name()
    if taken not in ("privateuseone", name):
        raise RuntimeError(
            f"PyTorch's PrivateUse1 device is already taken by {taken!r}; "
            "lazyxla cannot be used in the same process as that backend"
        )
    devices.set_torch_name(name)
    torch_private.setup_python_backend(name, _BackendModule(rng, synchronize), _DeviceGuard(), _Hooks())
    _install_backward_error_relay()
    _install_accelerator_queries()
    inplace_checks.install()
    for op, fn in kernels.items():
        torch.library.impl(op, "privateuseone")(subclass_relay.kernel(op, fn))
    _library = torch.library.Library("_", "IMPL")
    _library.fallback(subclass_relay.fallback(fallback), "PrivateUse1")
    _autograd_library = torch.library.Library("aten", "IMPL")
    for op, fn in autograd_kernels.items():
        _autograd_library.impl(op, fn, "AutogradPrivateUse1", with_keyset=getattr(fn, "with_keyset", False))
    _autograd_library.impl("_pin_memory", _pin_device_tensor, "AutogradPrivateUse1")
    _autograd_library.impl("is_pinned", _device_tensor_is_pinned, "AutogradPrivateUse1")
    _cpu_library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": PyTorch's, which ours call
        warnings.simplefilter("ignore", UserWarning)
        for op, fn in _pin_memory_kernels().items():
            _cpu_library.impl(op, fn, "CPU", with_keyset=True)
    _done = True


def patch_printing(to_cpu: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Print lazyxla tensors from one host copy, as PyTorch does for XLA tensors (no per-element syncs)."""
    original = torch_private.tensor_str()
    if getattr(original, "_lazyxla", False):
        return

    def _str(self, *, tensor_contents=None):
        # fake tensors (torch.compile's tracing): no values
        if not devices.on_device(self) or torch_private.is_fake(self):
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
    torch_private.set_tensor_str(_str)
