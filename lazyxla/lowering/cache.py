"""The compile cache: graph key -> compiled XLA executable, in memory, backed on disk by JAX's persistent cache.

In memory: an LRU of ``config.compile_cache_size`` programs, keyed by the graph's structural hash.
On disk (``config.persistent_cache``, on by default): JAX's own persistent compilation cache in
``config.cache_dir``, keyed by jax on the lowered program, the devices, the compile options and the
jax/XLA versions, so a new process running the same steps loads its executables instead of compiling.

A new process finds its programs there because a sync lays a program out (argument and result order)
by the nodes' structural hashes, which are the same in every process (``lazy.ir.stable_hash``), so
the same step lowers to the same program text.

The disk cache is scoped to lazyxla's compiles, and the user's jax configuration is never changed:
around lazyxla's ``lowered.compile()`` the jax options it needs are set with jax's thread-local
config contexts, and jax's process-wide cache object is swapped for lazyxla's and put back after.
The user's own ``jax.jit`` compiles neither read nor write lazyxla's folder. If the user set a cache
folder for jax itself (``jax_compilation_cache_dir``), lazyxla's compiles use that one, as jax does.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import warnings
from collections.abc import Iterator

import jax

from lazyxla.config import config
from lazyxla.device import runtime
from lazyxla.lazy import metrics
from lazyxla.lowering.to_jax import ArgLayout, graph_fn

try:  # jax internals the scoped disk cache needs (checked: jax 0.10); without them it stays off
    from jax._src import compilation_cache as _jcc
    from jax._src import config as _jcfg
    from jax._src import lru_cache as _jlru
    from jax._src.compilation_cache_interface import CacheInterface as _CacheInterface

    _JAX_INTERNALS = all(hasattr(_jcc, a) for a in ("_cache", "_cache_initialized", "decompress_executable"))
except ImportError:  # pragma: no cover - depends on the jax version
    _CacheInterface = object
    _JAX_INTERNALS = False

_cache: collections.OrderedDict = collections.OrderedDict()  # least recently used first

_HIT_EVENT = "/jax/compilation_cache/cache_hits"  # jax loaded the executable from its persistent cache
_LOOKUP_EVENT = "/jax/compilation_cache/compile_requests_use_cache"  # jax looked there first
_events = threading.local()  # .seen: jax's cache events during the lazyxla compile on this thread
_listening = False
_stores: dict[str, _DiskStore] = {}  # cache folder -> lazyxla's jax cache object over it
_broken: dict[str, str] = {}  # cache folder -> why the disk cache is off for it (warned once)
_warned: set[str] = set()


class Compiled:
    """One compiled step: the executable, which leaves it donates, and how its arguments carry the leaves."""

    __slots__ = ("executable", "donated", "layout")

    def __init__(self, executable, donated: tuple[int, ...], layout: ArgLayout) -> None:
        self.executable = executable
        self.donated = donated  # leaf indices
        self.layout = layout


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
    """The compiled program for a sync's graph: from memory, else lowered and compiled (or loaded from disk).

    ``order``, ``leaves`` and ``roots`` are the graph as the sync walked it; the program takes the
    leaves' arrays as ``Compiled.layout`` arranges them and returns the roots' arrays in order,
    donating the leaves ``Compiled.donated`` (those of ``donate_candidates`` an output can reuse).

    Example::

        compiled = cache.get(key, order, leaves, roots, device, donate)   # in lazy.graph
        data = [leaves[i].payload for i in compiled.layout.data]
        outs = compiled.executable(*compiled.layout.arguments(data, leaves))
    """
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        metrics.inc("cache_hits")
        return hit
    in_avals = [leaf.avals[0] for leaf in leaves]
    out_avals = [m.avals[i] for m, i in roots]
    donated = _usable_donations(donate_candidates, in_avals, out_avals)
    store = _store()
    with runtime.x64(), jax.default_matmul_precision(config.matmul_precision):
        with metrics.timer("lower"):
            dev = runtime.jax_device(device)
            sharding = jax.sharding.SingleDeviceSharding(dev)
            layout = ArgLayout(leaves)
            fn = jax.jit(
                graph_fn(order, leaves, roots, layout),
                donate_argnums=layout.positions(donated),
                out_shardings=sharding,
            )
            lowered = fn.lower(*layout.specs(leaves, sharding))
        with metrics.timer("compile"):  # an XLA compile, or a load from the persistent cache
            executable = _compile(lowered, store)
    metrics.inc("compiles")  # a program this process built: compiled, or loaded from disk (counted apart)
    compiled = Compiled(executable, donated, layout)
    _cache[key] = compiled
    while len(_cache) > max(config.compile_cache_size, 1):
        _cache.popitem(last=False)
        metrics.inc("cache_evictions")
    return compiled


def clear() -> None:
    """Forget every compiled executable in memory (the next sync of each graph builds it again).

    The persistent cache on disk is kept, so the next build of a graph it holds is a load.

    Example::

        from lazyxla.lowering import cache
        cache.clear()
    """
    _cache.clear()


# --- the persistent (disk) cache --------------------------------------------------------------------


class _DiskStore(_CacheInterface):
    """jax's file cache over one folder; a corrupt entry is dropped and a failed write skipped, warned once."""

    def __init__(self, path: str) -> None:
        os.makedirs(path, mode=0o700, exist_ok=True)  # entries are executable code: keep them private
        self._base = _jlru.LRUCache(path, max_size=-1)
        self._path = self._base._path

    def get(self, key: str) -> bytes | None:
        try:
            value = self._base.get(key)
            if value is not None:
                _jcc.decompress_executable(value)  # a truncated or corrupt entry fails here, not inside jax
            return value
        except Exception as e:
            _warn_once(
                "read",
                f"lazyxla: the persistent compilation cache entry {key} in {self._path} could not be read "
                f"({type(e).__name__}: {e}); it is removed and the program compiled again. If this repeats, "
                "delete the folder (it is only a cache).",
            )
            with contextlib.suppress(OSError):
                os.remove(os.path.join(str(self._path), key + getattr(_jlru, "_CACHE_SUFFIX", "-cache")))
            return None

    def put(self, key: str, value: bytes) -> None:
        try:
            self._base.put(key, value)
        except Exception as e:
            _warn_once(
                "write",
                f"lazyxla: could not write to the persistent compilation cache in {self._path} "
                f"({type(e).__name__}: {e}); runs go on, but another process will compile again. Make the "
                "folder writable, point lazyxla.config.cache_dir (LAZYXLA_CACHE_DIR) elsewhere, or turn the "
                "cache off with LAZYXLA_PERSISTENT_CACHE=0.",
            )


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


def _disable(path: str, why: str) -> None:
    _broken[path] = why
    _warn_once(
        "off:" + path,
        f"lazyxla: the persistent compilation cache in {path} is off for this process: {why}. Programs are "
        "compiled as usual, just not reused by other processes. Point lazyxla.config.cache_dir "
        "(LAZYXLA_CACHE_DIR) at a writable folder, or turn the cache off with LAZYXLA_PERSISTENT_CACHE=0.",
    )


def _on_jax_event(event: str, **kwargs) -> None:
    seen = getattr(_events, "seen", None)
    if seen is not None:
        seen.append(event)


def _store() -> _DiskStore | None:
    """lazyxla's disk cache for this compile, or None: off, the user's own jax cache applies, or unusable."""
    if not config.persistent_cache or not config.cache_dir:
        return None
    if _jcfg_value("compilation_cache_dir") is not None or _jcfg_value("enable_compilation_cache") is False:
        return None  # the user configured jax's cache (a folder, or off): theirs decides, never overridden
    path = os.path.abspath(os.path.expanduser(config.cache_dir))
    if path in _broken:
        return None
    store = _stores.get(path)
    if store is None:
        if not _JAX_INTERNALS:
            _disable(path, f"jax {jax.__version__} lacks the internals lazyxla scopes it with")
            return None
        try:
            store = _stores[path] = _DiskStore(path)
        except Exception as e:
            _disable(path, f"the folder cannot be created or used ({type(e).__name__}: {e})")
            return None
    return store


def _jcfg_value(name: str):
    state = getattr(_jcfg, name, None) if _JAX_INTERNALS else None
    return None if state is None else state.value


@contextlib.contextmanager
def _jax_cache(store: _DiskStore | None) -> Iterator[None]:
    """Within the block jax's compiles use ``store`` (None: no disk cache) instead of its own cache object."""
    saved = _jcc._cache, _jcc._cache_initialized
    _jcc._cache, _jcc._cache_initialized = store, True
    try:
        yield
    finally:
        _jcc._cache, _jcc._cache_initialized = saved


@contextlib.contextmanager
def _scope(store: _DiskStore | None) -> Iterator[list[str]]:
    """Collect jax's cache events for this thread; with a store, also route jax's disk cache to it."""
    global _listening
    if not _listening:
        jax.monitoring.register_event_listener(_on_jax_event)
        _listening = True
    _events.seen = seen = []
    try:
        with contextlib.ExitStack() as stack:
            if store is not None:
                stack.enter_context(_jcfg.compilation_cache_dir(str(store._path)))
                stack.enter_context(_jcfg.persistent_cache_min_compile_time_secs(0.0))  # keep every program
                stack.enter_context(_jcfg.persistent_cache_min_entry_size_bytes(-1))  # of any size
                stack.enter_context(_jcfg.raise_persistent_cache_errors(False))  # cache trouble warns, never fails
                stack.enter_context(_jax_cache(store))
            yield seen
    finally:
        _events.seen = None


def _compile(lowered, store: _DiskStore | None):
    """``lowered.compile()`` through the persistent cache, counting its hits and misses."""
    failure = None
    try:
        with _scope(store) as seen:
            executable = lowered.compile()
    except Exception as e:
        if store is None:
            raise
        failure = e
    if failure is None:
        if _HIT_EVENT in seen:
            metrics.inc("persistent_cache_hits")
        elif _LOOKUP_EVENT in seen and (store is not None or _jcfg_value("compilation_cache_dir") is not None):
            metrics.inc("persistent_cache_misses")  # (jax "looks" even with no cache folder at all)
        return executable
    # Was it the disk cache? Compile once more without it: a program that does not compile raises again.
    with _jax_cache(None):
        executable = lowered.compile()
    _disable(str(store._path), f"compiling through it raised {type(failure).__name__}: {failure}")
    return executable
