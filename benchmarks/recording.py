"""(d) Recording cost: a long chain of tiny ops, where per-op overhead is all there is to measure.

The chain is ``n`` calls on a 16x16 float32 tensor cycling through ``x = x * 1.0001``,
``x = x + 0.0001``, ``x = sin(x)`` (one op each), i.e. ``x = x * 1.0001 + 0.0001`` alternating with
``x = torch.sin(x)``. Every number is wall time divided by ``n``.

The compiled rows run the same chain as one function under ``torch.compile(backend="lazyxla")``: a call
records one IR op for the whole chain, so its recording cost per torch call is the call's cost / ``n``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SHAPE = (16, 16)


def chain(x: Any, n: int, sin: Callable[[Any], Any]) -> Any:
    """Apply exactly ``n`` ops to ``x``: multiply by 1.0001, add 0.0001, ``sin``, repeating."""
    for _ in range(n // 3):
        x = x * 1.0001
        x = x + 0.0001
        x = sin(x)
    if n % 3 > 0:
        x = x * 1.0001
    if n % 3 > 1:
        x = x + 0.0001
    return x


def op_counts(n: int) -> dict[str, int]:
    """How many of each op a chain of ``n`` calls makes."""
    return {"mul": n // 3 + (n % 3 > 0), "add": n // 3 + (n % 3 > 1), "sin": n // 3}


def _summary(per_op_s: list[float]) -> dict[str, Any]:
    us = [t * 1e6 for t in per_op_s]
    return {"median_us": statistics.median(us), "min_us": min(us), "max_us": max(us), "samples": len(us)}


def _input() -> np.ndarray:
    return np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)


def _eager_sampler(n: int) -> Callable[[], dict[str, float]]:
    import torch

    x0 = torch.from_numpy(_input())
    chain(x0, n, torch.sin)  # first-call costs (kernel selection, allocator) out of the samples

    def sample() -> dict[str, float]:
        t = time.perf_counter()
        chain(x0, n, torch.sin)
        return {"loop": (time.perf_counter() - t) / n}

    return sample


def _lazyxla_sampler(n: int) -> Callable[[], dict[str, float]]:
    import torch

    return _device_sampler(n, lambda x: chain(x, n, torch.sin))


def _compiled_sampler(n: int) -> Callable[[], dict[str, float]]:
    import torch

    import lazyxla  # noqa: F401  (registers the "lazyxla" torch.compile backend)

    return _device_sampler(n, torch.compile(lambda x: chain(x, n, torch.sin), backend="lazyxla"))


def _device_sampler(n: int, run: Callable) -> Callable[[], dict[str, float]]:
    """Time ``run`` (lazy mode, or a torch.compile'd function) on a fresh device input: the recording
    loop, then the sync and read."""
    import torch

    import lazyxla

    dev = lazyxla.device()

    def sample() -> dict[str, float]:
        x0 = torch.from_numpy(_input()).to(dev)
        lazyxla.sync(wait=True)
        before = lazyxla.metrics.counters()
        t0 = time.perf_counter()
        y = run(x0)
        t1 = time.perf_counter()
        lazyxla.sync()
        y.cpu()
        t2 = time.perf_counter()
        after = lazyxla.metrics.counters()
        return {
            "loop": (t1 - t0) / n,
            "total": (t2 - t0) / n,
            "compiles": after["compiles"] - before["compiles"],
            "ops_recorded": after["ops_recorded"] - before["ops_recorded"],
            "graph_calls": after.get("dynamo_calls", 0) - before.get("dynamo_calls", 0),
        }

    return sample


def _jax_sampler(n: int) -> tuple[Callable[[], dict[str, float]], float]:
    import jax
    import jax.numpy as jnp

    x0 = jnp.asarray(_input())
    jitted = jax.jit(lambda x: chain(x, n, jnp.sin))
    t = time.perf_counter()
    np.asarray(jitted(x0))  # trace, compile, run, read: the cold number
    cold = (time.perf_counter() - t) / n
    np.asarray(chain(x0, n, jnp.sin))  # first-call costs of each op out of the samples

    def sample() -> dict[str, float]:
        t = time.perf_counter()
        np.asarray(jitted(x0))
        t1 = time.perf_counter()
        np.asarray(chain(x0, n, jnp.sin))
        return {"jit": (t1 - t) / n, "op_by_op": (time.perf_counter() - t1) / n}

    return sample, cold


def run(n: int, repeats: int) -> dict[str, Any]:
    """Every recording-cost row, in µs per op; the warm samples of the frameworks interleaved.

    - eager: the loop alone on the CPU (each op computes as it is called);
    - lazyxla cold: the first run of this chain in the process, the loop alone (recording) and loop +
      ``lazyxla.sync()`` + ``.cpu()`` (the sync compiles the chain);
    - lazyxla warm: the same chain again on a fresh input of the same shape (compiled program from the
      in-memory cache), loop alone and loop + sync + read;
    - lazyxla compiled: the chain as one function under ``torch.compile(backend="lazyxla")``; cold (Dynamo,
      AOTAutograd, the trace into lazyxla's IR, XLA compile) and warm (a call records one op);
    - jax: the chain under one ``jax.jit``, cold (trace + compile + run + read, once) and warm (call +
      read); and op by op without jit, for reference.

    Also reports lazyxla's compiles and recorded ops (``ops_recorded``) per chain.
    """
    lazy = _lazyxla_sampler(n)
    cold = lazy()  # before anything else compiles or warms this chain
    compiled = _compiled_sampler(n)
    compiled_cold = compiled()  # its program holds one op for the chain: compiled apart from lazy mode's
    jax_sample, jax_cold = _jax_sampler(n)
    samplers = {"eager": _eager_sampler(n), "lazyxla": lazy, "compiled": compiled, "jax": jax_sample}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in samplers}
    for _ in range(repeats):
        for name, sample in samplers.items():
            samples[name].append(sample())
    col = lambda name, key: _summary([s[key] for s in samples[name]])
    return {
        "ops": n,
        "op_counts": op_counts(n),
        "shape": list(SHAPE),
        "eager": {"loop": col("eager", "loop")},
        "lazyxla": {
            "cold_loop": _summary([cold["loop"]]),
            "cold_total": _summary([cold["total"]]),
            "warm_loop": col("lazyxla", "loop"),
            "warm_total": col("lazyxla", "total"),
            "compiles_cold": cold["compiles"],
            "compiles_warm": sum(s["compiles"] for s in samples["lazyxla"]),
            "ops_recorded_per_chain": cold["ops_recorded"],
        },
        "lazyxla_compiled": {
            "cold_loop": _summary([compiled_cold["loop"]]),
            "cold_total": _summary([compiled_cold["total"]]),
            "warm_loop": col("compiled", "loop"),
            "warm_total": col("compiled", "total"),
            "compiles_cold": compiled_cold["compiles"],
            "compiles_warm": sum(s["compiles"] for s in samples["compiled"]),
            "ops_recorded_cold": compiled_cold["ops_recorded"],
            "ops_recorded_warm": max(s["ops_recorded"] for s in samples["compiled"]),
            "graph_calls_warm": max(s["graph_calls"] for s in samples["compiled"]),
        },
        "jax": {
            "jit_cold_total": _summary([jax_cold]),
            "jit_warm_total": col("jax", "jit"),
            "op_by_op_total": col("jax", "op_by_op"),
        },
    }
