"""Giving the host memory that XLA's compiler freed back to the operating system.

XLA allocates a lot of host memory while it compiles a large program (the benchmark GPT's training step:
~250-300 MB on the CPU backend, for a program the size of a few thousand StableHLO lines) and frees it when
it is done. glibc's allocator keeps most of what was freed in its arenas (fragmented, in the arenas of the
compiler's threads), so the process's resident memory stayed at the compiler's peak for the rest of the run:
the steps' buffers and the next compile (a training loop compiles twice: the first ``opt.step()`` creates
the optimizer state) came on top of it instead of reusing it. In the benchmark that made lazyxla's peak
RSS 1.7x ``jax.jit``'s (which compiles once, so keeps one compiler peak, not two stacked).

:func:`release` hands the allocator's free pages back (glibc's ``malloc_trim(0)``, which also returns the
free pages inside arenas, not just their tops). The compile cache calls it right before and right after an
XLA compile: before, for what the steps and the lowering freed since the last compile; after, for the
compiler's own memory. It takes ~0.2 ms after a small program and ~50-80 ms after the GPT's multi-second
compile (timed as ``release_host_memory``); pages are not touched, moved or changed, so no number changes.
Where the C library has no ``malloc_trim`` (macOS, musl, Windows) it does nothing.

On XLA's CPU backend the device buffers are host memory too, and glibc's defaults cost steps time:
:func:`keep_freed_buffers` (called once, before the first CPU program is built) fixes the allocator's thresholds
so that freed buffers of up to 32 MB stay in the process and serve the next step's. glibc's dynamic defaults
give free memory at the heap's top back to the system once it exceeds twice the largest buffer freed so far:
three 16 MB buffers freed together are returned every time, and the next step's allocation faults their 12288
pages in afresh. Memory the compiler frees is still returned, by :func:`release`.
"""

from __future__ import annotations

import ctypes

from lazyxla.observe import metrics


def _libc_function(name: str, argtypes: list, restype):
    """A C library function from the process's own symbols (the allocator lives there), typed; None where glibc's
    allocator is not (its ``malloc_trim`` missing: macOS, musl, Windows) or the function is."""
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded: the C library the allocator lives in
    except (OSError, TypeError):  # (Windows: no such handle)
        return None
    if getattr(libc, "malloc_trim", None) is None:
        return None
    f = getattr(libc, name, None)
    if f is not None:
        f.argtypes, f.restype = argtypes, restype
    return f


_trim = _libc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
_mallopt = _libc_function("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_MMAP_THRESHOLD = 32 << 20  # glibc's largest: buffers up to this size come from (and go back to) the heap
_TRIM_THRESHOLD = 1 << 30  # free memory at the heap's top kept before the allocator gives it back by itself
_kept = []  # the (parameter, value) pairs set, once


def supported() -> bool:
    """Whether :func:`release` can return memory here (the C library is glibc).

    Example::

        host_memory.supported()      # True on Linux with glibc
    """
    return _trim is not None


def release() -> bool:
    """Return the C allocator's free pages to the operating system (timed as ``release_host_memory``).

    Live allocations are untouched; only pages no allocation uses leave the process's resident memory.
    False where the C library cannot (see :func:`supported`).

    Example::

        with metrics.timer("compile"):
            executable = lowered.compile()
        host_memory.release()        # the compiler's freed memory leaves the process's RSS
    """
    if _trim is None:
        return False
    with metrics.timer("release_host_memory"):
        _trim(0)
    return True


def keep_freed_buffers() -> bool:
    """Fix glibc's allocator thresholds for device buffers that live in host memory (XLA's CPU backend):
    buffers up to 32 MB come from the heap, and the heap keeps up to 1 GB of free memory at its top, so a step's
    freed buffers serve the next step's without page faults. Once per process; False where the C library is not
    glibc (nothing is changed).

    Example::

        if devices.platform() == "cpu":
            host_memory.keep_freed_buffers()
    """
    if _kept:
        return True
    if _mallopt is None:
        return False
    for param, value in ((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)):
        if _mallopt(param, value) == 1:
            _kept.append((param, value))
    return bool(_kept)
