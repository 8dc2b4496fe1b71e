"""Streams, events and memory queries of the ``torch.lazyxla`` device module, as a lazy device has them.

PyTorch's device-generic code (FSDP2, DTensor, ``torch.distributed.checkpoint``) orders its work with streams
and events: an all-gather on one stream, the compute that reads it on another after ``wait_event``. On lazyxla
every op is recorded in program order and one compiled program runs a step: there is no concurrency to order,
and every op already sees the results of the ops recorded before it. So a ``Stream`` here is an ordering, not a
queue that runs beside others: ``wait_stream``/``wait_event`` are satisfied by program order and record
nothing; ``synchronize`` and ``query`` wait for the work already sent to the device (as
``torch.lazyxla.synchronize``); the current stream is kept per thread so that ``with torch.lazyxla.stream(s)``
and ``current_stream()`` answer as PyTorch's code expects. An ``Event`` marks a point in that order; it has no
device time (the op it follows is not run when it is recorded), so ``elapsed_time`` raises and says what to use.

Memory queries read jax's ``Device.memory_stats()`` (GPU, TPU). A backend that reports none (the CPU) answers
from the arrays alive on the device (``jax.live_arrays``): ``memory_allocated`` is their bytes there,
``max_memory_allocated`` the most this module has seen since ``reset_peak_memory_stats``, and ``mem_get_info``
the host's free and total memory.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import jax
import torch

from lazyxla.device import devices

_current = threading.local()  # .stream: this thread's current stream per device index


def _index(device) -> int:
    """The local device index of ``device`` (None, an int, "lazyxla:1", a torch.device, a Stream)."""
    if device is None:
        return 0
    if isinstance(device, Stream):
        return device.device_index
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != devices.torch_name():
            raise ValueError(f"expected a {devices.torch_name()} device, got {device}")
        index = device.index or 0
    count = len(devices.local_devices())
    if not 0 <= index < count:
        raise ValueError(f"{devices.torch_name()} device index {index} is out of range: this process has {count}")
    return index


class Stream:
    """A lazyxla stream: an ordering of work, not a concurrent queue (see the module docstring).

    Example:
        >>> s = torch.lazyxla.Stream(priority=-1)
        >>> s.wait_stream(torch.lazyxla.current_stream())   # satisfied by program order
        >>> with torch.lazyxla.stream(s):
        ...     y = x * 2                                    # recorded after everything before it
        >>> torch.lazyxla.current_stream().wait_event(s.record_event())
    """

    _synchronize: Callable[[], None] = staticmethod(lambda: None)  # set by the device module

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device_index = _index(device)
        self.priority = priority
        self.stream_id = id(self)

    @property
    def device(self) -> torch.device:
        return devices.torch_device(self.device_index)

    @property
    def device_type(self) -> str:
        return devices.torch_name()

    def wait_stream(self, stream: Stream) -> None:
        """Work recorded later on this stream comes after ``stream``'s: always so in program order."""
        _check(stream, Stream, "wait_stream")

    def wait_event(self, event: Event) -> None:
        """Work recorded later on this stream comes after ``event``: always so in program order."""
        _check(event, Event, "wait_event")

    def record_event(self, event: Event | None = None) -> Event:
        """An event at this point of the order (``event``, recorded again, or a new one)."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def synchronize(self) -> None:
        """Wait until the work sent to the device is done (ops recorded since the last sync are not sent)."""
        Stream._synchronize()

    def query(self) -> bool:
        """Whether the work sent is done: waits for it (the device is not polled), so always True."""
        self.synchronize()
        return True

    def __enter__(self) -> Stream:
        self._previous = current_stream(self.device_index)
        set_stream(self)
        return self

    def __exit__(self, *exc) -> None:
        set_stream(self._previous)

    def __eq__(self, other) -> bool:
        return self is other

    def __hash__(self) -> int:
        return self.stream_id

    def __repr__(self) -> str:
        return f"<torch.{devices.torch_name()}.Stream device={self.device} priority={self.priority}>"


class Event:
    """A point in a lazyxla stream's order (see the module docstring).

    Example:
        >>> e = torch.lazyxla.Event(); e.record()
        >>> torch.lazyxla.current_stream().wait_event(e)   # satisfied by program order
        >>> e.query()                                       # waits for the work sent, then True
        True
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.stream: Stream | None = None

    def record(self, stream: Stream | None = None) -> None:
        self.stream = current_stream() if stream is None else _check(stream, Stream, "Event.record")

    def wait(self, stream: Stream | None = None) -> None:
        """``stream`` (the current one) waits for this event: always so in program order."""
        if stream is not None:
            _check(stream, Stream, "Event.wait")

    def query(self) -> bool:
        """Whether the work before this event is done: waits for the work sent, so always True."""
        self.synchronize()
        return True

    def synchronize(self) -> None:
        Stream._synchronize()

    def elapsed_time(self, end_event: Event) -> float:
        raise RuntimeError(
            f"torch.{devices.torch_name()}.Event.elapsed_time: a lazyxla event has no device time (the ops before "
            "it run later, in the step's compiled program). Time a step on the host around lazyxla.sync() and "
            f"torch.{devices.torch_name()}.synchronize(), or use lazyxla.profiler for per-program device times."
        )


def _check(value, kind: type, what: str):
    if not isinstance(value, kind):
        raise TypeError(f"{what} expects a torch.{devices.torch_name()}.{kind.__name__}, got {value!r:.80}")
    return value


_defaults: dict[int, Stream] = {}


def default_stream(device=None) -> Stream:
    """The stream work is recorded on unless a ``stream`` context says otherwise (one per device)."""
    index = _index(device)
    if index not in _defaults:
        _defaults[index] = Stream(index)
    return _defaults[index]


def current_stream(device=None) -> Stream:
    """This thread's current stream of ``device`` (its default stream unless ``set_stream``/``stream`` set one)."""
    index = _index(device)
    chosen = getattr(_current, "streams", {}).get(index)
    return chosen if chosen is not None else default_stream(index)


def set_stream(stream: Stream) -> None:
    """Make ``stream`` its device's current stream in this thread."""
    _check(stream, Stream, "set_stream")
    if not hasattr(_current, "streams"):
        _current.streams = {}
    _current.streams[stream.device_index] = stream


class stream:  # noqa: N801  (torch.cuda.stream's name: a context manager class)
    """``with torch.lazyxla.stream(s):`` makes ``s`` current inside (``None``: changes nothing).

    Example:
        >>> with torch.lazyxla.stream(torch.lazyxla.Stream()):
        ...     pass
    """

    def __init__(self, s: Stream | None) -> None:
        self.s = None if s is None else _check(s, Stream, "stream")

    def __enter__(self) -> Stream | None:
        if self.s is not None:
            self.s.__enter__()
        return self.s

    def __exit__(self, *exc) -> None:
        if self.s is not None:
            self.s.__exit__(*exc)


# ---- memory ----

_peaks: dict[int, int] = {}  # per device: the most memory_allocated has seen since reset_peak_memory_stats
_reset: set[int] = set()  # devices whose peak was reset: jax's own peak counter cannot be


def _stats(index: int) -> dict | None:
    return devices.jax_device(index).memory_stats() or None


def _live_bytes(index: int) -> int:
    """Bytes of the arrays alive on the device (their shards there)."""
    device = devices.jax_device(index)
    total = 0
    for a in jax.live_arrays():
        for shard in a.addressable_shards:
            if shard.device == device:
                total += shard.data.nbytes
    return total


def memory_allocated(device=None) -> int:
    """Bytes in use on the device (jax's ``bytes_in_use``; without device statistics, the live arrays' bytes)."""
    index = _index(device)
    stats = _stats(index)
    used = int(stats.get("bytes_in_use", 0)) if stats else _live_bytes(index)
    _peaks[index] = max(_peaks.get(index, 0), used)
    return used


def max_memory_allocated(device=None) -> int:
    """The most bytes in use (jax's ``peak_bytes_in_use``; since ``reset_peak_memory_stats``, or without device
    statistics: the most that ``memory_allocated`` has seen, this call included)."""
    index = _index(device)
    used = memory_allocated(index)
    stats = _stats(index)
    if stats and index not in _reset and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    return max(_peaks.get(index, 0), used)


def reset_peak_memory_stats(device=None) -> None:
    index = _index(device)
    _reset.add(index)
    _peaks[index] = 0


def memory_reserved(device=None) -> int:
    """Bytes the allocator holds (jax's ``bytes_reserved`` where reported, else ``memory_allocated``)."""
    index = _index(device)
    stats = _stats(index)
    if stats and "bytes_reserved" in stats:
        return int(stats["bytes_reserved"])
    return memory_allocated(index)


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes: the device's limit less its use, or the host's memory where the device reports none."""
    index = _index(device)
    stats = _stats(index)
    if stats and stats.get("bytes_limit"):
        limit = int(stats["bytes_limit"])
        return limit - int(stats.get("bytes_in_use", 0)), limit
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def empty_cache() -> None:
    """Nothing to free: XLA frees a buffer when the last tensor holding it dies; lazyxla caches none."""
