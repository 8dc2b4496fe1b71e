"""One framework, one model, in a fresh process: time to the first step and peak memory of a short run.

Run by ``benchmarks.run`` (``python -m benchmarks.child FRAMEWORK MODEL [--quick] [--steps N]``), once
per framework and model, so every cache is cold (the parent sets ``LAZYXLA_PERSISTENT_CACHE``). It
imports only the framework it measures and prints one line ``BENCH_RESULT <json>`` on stdout.

Memory: where jax reports device memory (``memory_stats()``, e.g. on a GPU) the device's
``peak_bytes_in_use`` growth over the steps; otherwise (the CPU backend, eager PyTorch) the process's
peak RSS during the steps minus its RSS after setup. On Linux the peak-RSS mark is reset after setup
(``/proc/self/clear_refs``), so setup's own transient peak does not count; without that,
``ru_maxrss`` after the steps minus ``ru_maxrss`` after setup. The run's peak includes the compiler's
memory (first steps); with the RSS method the mark is reset again after step 2, giving a second
number, the steady-state peak (steps 3..N) over the same baseline.

Process peak: the process's peak RSS from its start (imports, setup and the run: the highest of the peak-RSS
marks read before each reset and at the end), and the RSS importing torch added (the lazyxla and eager processes
import it first and alone; jax.jit's process never does), so that the comparison can be made with and without it.

Both XLA frameworks start XLA's compiler in setup (``_start_xla``): jax.jit's setup compiles anyway, so its
baseline held the compiler's one-time start while lazyxla's growth counted it.

XLA buffers (jax.jit and lazyxla): device memory as XLA accounts for it, the measure a GPU or TPU
user cares about, which the CPU backend does not report as it runs: for each step, the bytes of every
live ``jax.Array`` before the step plus what the step's compiled program adds while it runs (its
``memory_analysis()``: temporaries, and outputs not aliased to donated inputs). Compilers, allocator
slack and the host runtimes (PyTorch's and jax's, both in lazyxla's process) are not in it.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time
from typing import Any

MARKER = "BENCH_RESULT "
_MB = 1024 * 1024


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


class MemoryProbe:
    """Peak memory growth between :meth:`start` (after setup) and :meth:`stop` (after the steps)."""

    def __init__(self, framework: str) -> None:
        self.device = None
        if framework in ("jax.jit", "lazyxla"):
            import jax

            stats = jax.local_devices()[0].memory_stats()
            if stats and "peak_bytes_in_use" in stats:
                self.device = jax.local_devices()[0]

    def start(self) -> None:
        """Take the baseline (and reset the peak-RSS mark where the OS allows)."""
        gc.collect()
        self.hwm_marks = [_status_kb("VmHWM")]  # the process's peak so far (setup's included), before any reset
        if self.device is not None:
            self.base = self.device.memory_stats()["bytes_in_use"]
            self.method = "jax device memory_stats: peak_bytes_in_use during the run - bytes_in_use after setup"
        elif _reset_peak_rss():
            self.base = _status_kb("VmRSS") * 1024
            self.method = "peak RSS (VmHWM, reset after setup) - RSS after setup"
        else:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.method = "ru_maxrss after the steps - ru_maxrss after setup"

    def _peak(self) -> int:
        if self.device is not None:
            return self.device.memory_stats()["peak_bytes_in_use"]
        if self.method.startswith("peak RSS"):
            return _status_kb("VmHWM") * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def mark_steady(self) -> None:
        """Called after the compiling steps: the peak so far is the run's; restart the mark for steady steps."""
        self.run_peak = self._peak()
        self.hwm_marks.append(_status_kb("VmHWM"))
        self.steady = self.method.startswith("peak RSS") and _reset_peak_rss()

    def stop(self) -> dict[str, Any]:
        """Peak growth over the whole run and over the steady steps, baseline and peak, in MB; the method."""
        peak = self._peak()
        run_peak = max(peak, getattr(self, "run_peak", peak))
        steady = (peak - self.base) / _MB if getattr(self, "steady", False) else None
        marks = [m for m in self.hwm_marks + [_status_kb("VmHWM")] if m is not None]
        return {
            "peak_growth_mb": (run_peak - self.base) / _MB,
            "steady_peak_growth_mb": steady,
            "baseline_mb": self.base / _MB,
            "peak_mb": run_peak / _MB,
            "process_peak_mb": max(marks) / 1024 if marks else None,
            "method": self.method,
        }


def _live_buffer_bytes() -> int:
    """Bytes of the live device buffers: an array and the per-device views jax makes of it (and caches on it, e.g.
    when lazyxla checks a program's arguments) are one buffer, counted once."""
    import jax

    buffers = {}
    for a in jax.live_arrays():
        for shard in a.addressable_shards:
            buffers[(shard.device, shard.data.unsafe_buffer_pointer())] = shard.data.nbytes
    return sum(buffers.values())


def _program_growth(program) -> int:
    """Bytes a compiled program allocates beyond its arguments while it runs (XLA's own accounting)."""
    m = program.memory_analysis()
    return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


def _last_lazyxla_program():
    from lazyxla.lowering import cache

    return next(reversed(cache._cache.values())).executable  # the LRU's newest entry: the program just run


def _start_xla(framework: str) -> None:
    """In setup, for both XLA frameworks: compile and run one tiny jax program, so XLA's compiler has started.

    It starts once per process, at the first compile: ~45 MB of RSS on the CPU backend (mostly its code pages)
    and ~0.1 s. jax.jit's setup starts it (``jnp.zeros_like`` for the optimizer state compiles); lazyxla's
    setup compiles nothing, so its first step paid the start and its memory growth counted it while jax.jit's
    baseline held it. Started here, it is in the setup (time and baseline) of both.
    """
    if framework in ("jax.jit", "lazyxla"):
        import jax  # (the XLA frameworks only: eager's process never imports jax)
        import numpy as np

        jax.jit(lambda x: x + 1)(np.float32(0)).block_until_ready()


def measure(framework: str, model: str, quick: bool, steps: int) -> dict[str, Any]:
    """Set up ``model`` on ``framework``, time the first step, run ``steps`` in all, report memory."""
    t0 = time.perf_counter()
    rss_start = _status_kb("VmRSS")
    if framework != "jax.jit":
        import torch  # noqa: F401  (first and alone: the RSS it adds is reported apart)
    rss_torch = _status_kb("VmRSS")
    lazyxla = None
    if framework == "lazyxla":
        import lazyxla  # before any torch autograd runs (see docs/performance.md)
    from benchmarks import spec as S

    settings = S.Settings.quick() if quick else S.Settings.full()
    probe = MemoryProbe(framework)
    _start_xla(framework)
    step = S.make_step(framework, model, settings.spec(model))
    setup_s = time.perf_counter() - t0
    probe.start()
    compiles = []
    losses = []
    xla_peak = 0
    for i in range(steps):
        before = lazyxla.metrics.counters()["compiles"] if lazyxla else 0
        live = _live_buffer_bytes() if framework != "eager" else 0
        t = time.perf_counter()
        losses.append(step())
        if i == 0:
            first_step_s = time.perf_counter() - t
        if i == 1 and steps > 2:
            probe.mark_steady()
        if lazyxla:
            compiles.append(lazyxla.metrics.counters()["compiles"] - before)
            xla_peak = max(xla_peak, live + _program_growth(_last_lazyxla_program()))
        elif framework == "jax.jit":
            xla_peak = max(xla_peak, live)  # + the program's growth, below (the same program every step)
    memory = probe.stop()
    if framework == "jax.jit":
        xla_peak += _program_growth(step.program())  # after the probe: compiling again takes memory
    if framework == "jax.jit":
        memory["torch_import_mb"] = 0.0  # never imported (the RSS between the two reads only jitters)
    elif rss_start is not None and rss_torch is not None:
        memory["torch_import_mb"] = (rss_torch - rss_start) / 1024
    out = {
        "framework": framework,
        "model": model,
        "setup_s": setup_s,
        "first_step_s": first_step_s,
        "steps": steps,
        "losses": losses,
        "memory": memory,
    }
    if framework != "eager":
        out["memory"]["xla_buffers_peak_mb"] = xla_peak / _MB
    if lazyxla:
        out["compiles_per_step"] = compiles
        out["persistent_cache_flag"] = hasattr(lazyxla.config, "persistent_cache")
        out["persistent_cache"] = getattr(lazyxla.config, "persistent_cache", None)
        counters = lazyxla.metrics.counters()
        out["persistent_cache_hits"] = counters.get("persistent_cache_hits")  # None: lazyxla has no such counter
        timers = lazyxla.metrics.timers()
        out["compile_s"] = timers.get("compile", {}).get("total_s", 0.0)
        out["timers_s"] = {name: t["total_s"] for name, t in timers.items()}
        out["fallbacks"] = {k: v for k, v in counters.items() if k.startswith("fallback.")}
    return out


def main() -> None:
    """Command line: ``python -m benchmarks.child FRAMEWORK MODEL [--quick] [--steps N]``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("framework", choices=("jax.jit", "eager", "lazyxla"))
    parser.add_argument("model", choices=("mlp", "gpt"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    result = measure(args.framework, args.model, args.quick, max(1, args.steps))
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
