"""Host and device memory of a training run: nothing of lazyxla's own stays alive or resident that a run does not need.

- the host memory XLA's compiler frees is handed back to the OS around each compile (``device/host_memory.py``),
  so two compiles (a training loop's first two steps) do not stack their peaks;
- after ``.to(dev)`` no CPU copy of a parameter stays alive;
- in steady steps the live device buffers are the parameters, the optimizer state and (when alive at the sync)
  the gradients: no buffer of an earlier step is kept by the recorded graph, a cache or a failed donation;
- ``import lazyxla`` imports no heavy optional package (Hugging Face's, Dynamo/Inductor, sympy): each costs
  host memory a lazy-mode run never needs.
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import weakref

import jax
import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.device import host_memory

_MB = 1024 * 1024


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_release_returns_freed_heap_pages_to_the_os():
    # 48 MB of small blocks (below malloc's mmap threshold: on the heap), touched, then all freed but the last:
    # the heap's top is still in use, so free() itself cannot shrink the heap and the freed pages stay resident.
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 768
    blocks = [libc.malloc(size) for _ in range(count)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, size)
    for b in blocks[:-1]:
        libc.free(b)
    before = _rss_anon()
    assert host_memory.supported() and host_memory.release()
    released = before - _rss_anon()
    libc.free(blocks[-1])
    assert released > 0.8 * size * (count - 1), f"only {released / _MB:.1f} MB of {size * count / _MB:.0f} MB returned"


_CYCLES = """
import ctypes, resource, sys
from lazyxla.device import host_memory
if sys.argv[1] == "kept":
    assert host_memory.keep_freed_buffers()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
size = 16 << 20  # a zero_grad-first MLP's largest gradient
faults = []
for _ in range(8):  # a step's buffers: allocated, written, freed together
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffers = [libc.malloc(size) for _ in range(3)]
    for b in buffers:
        ctypes.memset(b, 1, size)
    for b in buffers:
        libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[1:]))
"""


def test_freed_buffers_serve_the_next_without_page_faults():
    """keep_freed_buffers(): three 16 MB buffers freed and allocated again come back from the heap already
    touched (glibc's default trim threshold, twice the largest freed buffer, gives the 48 MB back to the system
    each time, and the next allocation faults its 12288 pages in afresh)."""
    if not host_memory.supported():
        pytest.skip("the C library is not glibc: nothing to tune")
    faults = {}
    for mode in ("default", "kept"):
        out = subprocess.run([sys.executable, "-c", _CYCLES, mode], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        faults[mode] = int(out.stdout.split()[-1])
    assert faults["default"] > 7 * 10000, faults  # each of the 7 later cycles faults its 12288 pages in again
    assert faults["kept"] < 500, faults


def test_the_first_cpu_program_keeps_freed_buffers(dev):
    if not host_memory.supported():
        pytest.skip("the C library is not glibc: nothing to tune")
    (torch.randn(4, 4).to(dev) * 2).sum().item()
    assert host_memory._kept == [(-3, 32 << 20), (-1, 1 << 30)]


def test_each_compile_releases_host_memory_before_and_after(dev):
    x = torch.randn(16, 16).to(dev)
    lazyxla.sync()
    lazyxla.metrics.reset()
    (x @ x).tanh().sum().item()
    assert lazyxla.metrics.counters()["compiles"] == 1
    assert lazyxla.metrics.timers()["release_host_memory"]["count"] == 2
    (x @ x).tanh().sum().item()  # a cache hit: no compile, nothing to release
    assert lazyxla.metrics.counters()["cache_hits"] == 1
    assert lazyxla.metrics.timers()["release_host_memory"]["count"] == 2


def test_no_cpu_copy_of_a_parameter_survives_to_dev(dev):
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    cpu = [weakref.ref(p) for p in net.parameters()]
    net = net.to(dev)
    gc.collect()
    assert all(p.device.type == dev.type for p in net.parameters())
    assert [r() for r in cpu] == [None] * len(cpu)


def _live_bytes() -> int:
    """Bytes of the live device buffers (an array and the per-device views jax makes of it share one buffer)."""
    gc.collect()
    buffers = {(a.device, a.unsafe_buffer_pointer()): a.nbytes for a in jax.live_arrays()}
    return sum(buffers.values())


def _train(dev, make_opt, zero_grad_first: bool, steps: int = 4):
    """Train a small MLP on ``dev``; per step after the sync, the live device bytes above those before the model."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 96).to(dev), torch.randint(0, 10, (16,)).to(dev)
    base = _live_bytes()
    net = torch.nn.Sequential(torch.nn.Linear(96, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
    opt = make_opt(net.parameters())
    live = []
    for _ in range(steps):
        if zero_grad_first:
            opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        if not zero_grad_first:
            opt.zero_grad()
        lazyxla.sync()
        loss.item()
        live.append(_live_bytes() - base)
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    return live, params


def test_steady_steps_keep_only_parameters_state_and_gradients(dev):
    """Live device bytes after each steady step: parameters + optimizer state (+ gradients when they are alive at
    the sync). A buffer an earlier step made and something of lazyxla's kept alive would show here."""
    margin = 4096  # the loss, the step counters, the RNG key: a few scalars
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01)
    for make_opt, states in ((sgd, 1), (adamw, 2)):
        for zero_grad_first in (False, True):
            live, params = _train(dev, make_opt, zero_grad_first)
            expected = params * (1 + states + zero_grad_first)
            for step, got in enumerate(live[2:], start=3):
                assert expected <= got <= expected + margin, (make_opt, zero_grad_first, step, got, expected)


def test_import_loads_no_heavy_optional_package():
    heavy = ("transformers", "accelerate", "peft", "torch._dynamo", "torch._inductor", "sympy", "torch_xla")
    code = f"import sys, lazyxla; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
