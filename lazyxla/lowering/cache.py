"""The compile cache: graph key -> compiled XLA executable (in memory; jax's persistent cache below)."""

from __future__ import annotations

import collections

import jax

from lazyxla.config import config
from lazyxla.device import runtime
from lazyxla.lazy import metrics
from lazyxla.lowering.to_jax import graph_fn

_cache: collections.OrderedDict = collections.OrderedDict()  # least recently used first


class Compiled:
    """One compiled step: the executable and which input positions it donates."""

    __slots__ = ("executable", "donated")

    def __init__(self, executable, donated: tuple[int, ...]) -> None:
        self.executable = executable
        self.donated = donated


def _usable_donations(candidates, in_avals, out_avals) -> tuple[int, ...]:
    """Donate only inputs an output of the same shape and dtype can reuse (XLA ignores the rest)."""
    free = collections.Counter(out_avals)
    chosen = []
    for i in candidates:
        if free[in_avals[i]] > 0:
            free[in_avals[i]] -= 1
            chosen.append(i)
    return tuple(chosen)


def get(key, order, leaves, roots, device: int, donate_candidates) -> Compiled:
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        metrics.inc("cache_hits")
        return hit
    in_avals = [leaf.avals[0] for leaf in leaves]
    out_avals = [m.avals[i] for m, i in roots]
    donated = _usable_donations(donate_candidates, in_avals, out_avals)
    dev = runtime.jax_device(device)
    sharding = jax.sharding.SingleDeviceSharding(dev)
    specs = [jax.ShapeDtypeStruct(a.shape, runtime.np_dtype(a.dtype), sharding=sharding) for a in in_avals]
    fn = jax.jit(graph_fn(order, leaves, roots), donate_argnums=donated, out_shardings=sharding)
    with runtime.x64(), jax.default_matmul_precision(config.matmul_precision):
        with metrics.timer("lower"):
            lowered = fn.lower(*specs)
        with metrics.timer("compile"):
            executable = lowered.compile()
    metrics.inc("compiles")
    compiled = Compiled(executable, donated)
    _cache[key] = compiled
    while len(_cache) > max(config.compile_cache_size, 1):
        _cache.popitem(last=False)
        metrics.inc("cache_evictions")
    return compiled


def clear() -> None:
    """Forget every compiled executable (the next sync of each graph compiles again)."""
    _cache.clear()
