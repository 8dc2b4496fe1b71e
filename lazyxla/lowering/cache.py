"""The compile cache: graph key -> compiled XLA executable, in memory and on disk.

In memory: an LRU of ``config.compile_cache_size`` programs, keyed by the graph's structural hash.

On disk (``config.persistent_cache``, on by default): lazyxla's own store of serialized executables
(single-device, replica and SPMD programs; an SPMD program's name also covers its inputs' layouts)
in ``config.cache_dir``, one file per program, named by a 256-bit digest of the graph itself (every
node's op, constant arguments, output shapes and dtypes, and wiring; the leaves, the results, the
donations, the device), of lazyxla's source code, the lowering flags and the jax/XLA build and device.
Because the key is the recorded graph and not the lowered program, a new process running the same
steps skips lowering as well as compiling: it walks the graph, hashes it and loads the executable.

Entries are written atomically (a temporary file in the folder, then a rename) and carry a checksum:
a torn or corrupt file is found, removed and the program compiled again, with one warning. The folder
is created private (0700): an entry is machine code that this process will run, so, as with jax's own
cache, only point ``cache_dir`` at folders you trust. jax's configuration is never changed; a jax
compilation cache the user turned on for jax applies to lazyxla's compiles as to any ``jax.jit``.
"""

from __future__ import annotations

import collections
import hashlib
import os
import tempfile
import warnings

import jax
import numpy as np

from lazyxla.collectives.ops import COLLECTIVE_OPS
from lazyxla.config import config, foreign_env
from lazyxla.device import distributed, runtime
from lazyxla.lazy import metrics
from lazyxla.lowering import replica
from lazyxla.lowering.to_jax import ArgLayout, graph_fn

_cache: collections.OrderedDict = collections.OrderedDict()  # least recently used first

_broken: dict[str, str] = {}  # cache folder -> why the disk cache is off for it (warned once)
_ready: set[str] = set()  # cache folders created and usable
_warned: set[str] = set()


class ProgramInputError(RuntimeError):
    """An argument that is not what a compiled program was built for: the program was not run."""


class Compiled:
    """One compiled step: the executable, which leaves it donates, and how its arguments carry the leaves."""

    __slots__ = ("executable", "donated", "layout", "replicas", "spmd", "expect")

    def __init__(self, executable, donated: tuple[int, ...], layout: ArgLayout, replicas=None, spmd=False) -> None:
        self.executable = executable
        self.donated = donated  # leaf indices
        self.layout = layout
        self.replicas = replicas  # a replica.Replicas when the program spans the run's replicas, else None
        self.spmd = spmd  # an SPMD program: global arguments, partitioned by XLA over every device
        # (shape, dtype, sharding) of each argument, as the executable itself declares them
        avals, shardings = executable.in_avals[0], executable.input_shardings[0]
        self.expect = tuple((tuple(a.shape), np.dtype(a.dtype), s) for a, s in zip(avals, shardings))

    def check_arguments(self, args: list, leaves: list) -> None:
        """Raise ``ProgramInputError`` naming the first argument that is not what the program was built for.

        Each argument's shape, dtype and layout, and the dtype of each of its device buffers (jax can
        make an array whose buffers are narrower than its dtype says), are compared with the program's
        own input avals and shardings: a mismatched buffer given to XLA can abort the process.

        Example::

            compiled.check_arguments(args, leaves)     # in lazy.graph, before compiled.executable(*args)
        """
        expect = self.expect
        if len(args) != len(expect):
            raise ProgramInputError(
                f"lazyxla internal error: a program built for {len(expect)} arguments was given {len(args)}; "
                "it was not run"
            )
        for k, a in enumerate(args):
            if not _fits(a, *expect[k]):
                raise ProgramInputError(self._mismatch(k, a, leaves))

    def _mismatch(self, k: int, a, leaves: list) -> str:
        shape, dtype, sharding = self.expect[k]
        data = self.layout.data
        if k < len(data):
            n = leaves[data[k]]
            what = f"graph input {k} (a tensor of shape {list(n.avals[0].shape)} and dtype {n.avals[0].dtype}"
            what += f", {n.source})" if n.source else ")"
        else:
            packed = "Python scalars" if k == len(data) and self.layout.scalars else "RNG keys"
            what = f"argument {k} (the packed {packed})"
        got = f"{np.dtype(a.dtype)}{list(a.shape)}"
        if type(a) is not np.ndarray and a.is_deleted():
            got += " whose buffers were deleted (donated to an earlier program, or deleted through jax)"
        elif type(a) is not np.ndarray:
            buffers = sorted({f"{b.dtype}{list(b.shape)}" for b in a._arrays})
            got += f" laid out as {a.sharding}, with device buffers {', '.join(buffers)}"
        return (
            f"lazyxla: {what} does not match the compiled program: it is {got}, but the program takes "
            f"{dtype}{list(shape)} laid out as {sharding}. The program was not run and no tensor changed. "
            "This is a lazyxla bug (a transfer or relayout that changed the buffer): please report it with "
            "this message"
        )


def _fits(a, shape: tuple, dtype: np.dtype, sharding) -> bool:
    """Whether argument ``a`` is what the program takes: shape, dtype, layout, and each device buffer's dtype."""
    if a.shape != shape or a.dtype != dtype:
        return False
    if type(a) is np.ndarray:  # the packed scalars and keys outside SPMD: jax places them itself
        return True
    layout = a.sharding  # (sharding None: an argument the program does not read, pruned by jax)
    same = layout is sharding or sharding is None or layout == sharding
    if not same and not _equivalent(layout, sharding, len(shape)):
        return False
    # the per-device buffers: private, but the one place where they can be seen (None: deleted)
    buffers = a._arrays
    return buffers is not None and all(b.dtype == dtype for b in buffers)


_equivalent_layouts: dict = {}


def _equivalent(layout, expected, ndim: int) -> bool:
    """Whether two shardings place the same data on the same devices (``GSPMDSharding`` outputs of a
    step vs the ``NamedSharding`` it was compiled for), memoized."""
    key = (layout, expected, ndim)
    try:
        return _equivalent_layouts[key]
    except KeyError:
        if len(_equivalent_layouts) >= 4096:  # layouts that keep changing: start over rather than grow forever
            _equivalent_layouts.clear()
        same = _equivalent_layouts[key] = layout.is_equivalent_to(expected, ndim)
        return same


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
    """The compiled program for a sync's graph: from memory, else loaded from disk, else lowered and compiled.

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
    layout = ArgLayout(leaves)
    spmd = runtime.spmd_enabled()
    collective = any(n.op in COLLECTIVE_OPS for n in order)
    if spmd and collective:
        raise RuntimeError(
            "lazyxla: replica collectives (lazyxla.all_reduce, ...) do not mix with SPMD mode, where one program "
            "spans every device and XLA partitions it from the shardings: annotate tensors with "
            "lazyxla.spmd.mark_sharding instead"
        )
    reps = replica.replicas() if collective and distributed.world_size() > 1 else None
    dev = None if spmd else runtime.jax_device(device)
    folder = _folder()
    path = None
    executable = None
    if folder is not None:
        with metrics.timer("disk_cache"):
            if spmd:  # one program over every device, compiled for its inputs' layouts
                devices = list(runtime.global_devices())
                from lazyxla.lazy.graph import _layouts  # the in-memory key's canonical layouts

                where = ("spmd", distributed.process_index(), tuple(str(d) for d in devices), _layouts(leaves))
            elif reps is not None:
                devices, where = reps.devices, ("replicas", tuple(str(d) for d in reps.devices))
            else:
                devices, where = [dev], device
            path = os.path.join(folder, _digest(order, leaves, roots, where, donated) + _SUFFIX)
            executable = _load(path, devices, len(layout.specs(leaves, None)), len(roots))
    if executable is not None:
        metrics.inc("persistent_cache_hits")
    else:
        with runtime.x64(), jax.default_matmul_precision(config.matmul_precision):
            with metrics.timer("lower"):
                lowered = _lower(order, leaves, roots, layout, layout.positions(donated), dev, reps)
            with metrics.timer("compile"):
                executable = lowered.compile()
        if path is not None:
            metrics.inc("persistent_cache_misses")
            with metrics.timer("disk_cache"):
                _save(path, executable)
    metrics.inc("compiles")  # a program this process built: compiled, or loaded from disk (counted apart)
    compiled = Compiled(executable, donated, layout, reps, spmd)
    _cache[key] = compiled
    while len(_cache) > max(config.compile_cache_size, 1):
        _cache.popitem(last=False)
        metrics.inc("cache_evictions")
    return compiled


def _lower(order, leaves, roots, layout: ArgLayout, donate: tuple[int, ...], dev, reps):
    """The graph as a lowered jax program: on one device, over the replicas, or SPMD over every device."""
    if reps is not None:
        local = layout.specs(leaves, None)
        body = graph_fn(order, leaves, roots, layout, replica.AXIS, reps.world)
        fn = jax.jit(reps.wrap(body, local, len(roots)), donate_argnums=donate)
        return fn.lower(*[reps.global_spec(s) for s in local])
    if dev is None:  # SPMD: inputs keep their layouts, XLA's partitioner chooses the outputs'
        fn = jax.jit(graph_fn(order, leaves, roots, layout), donate_argnums=donate)
        shardings = [leaves[i].payload.sharding for i in layout.data]
        return fn.lower(*layout.specs(leaves, runtime.replicated(), shardings))
    sharding = jax.sharding.SingleDeviceSharding(dev)
    fn = jax.jit(graph_fn(order, leaves, roots, layout), donate_argnums=donate, out_shardings=sharding)
    return fn.lower(*layout.specs(leaves, sharding))


def lower(order, leaves, roots, device: int):
    """The jax ``Lowered`` program of a graph, as a sync would build it (no donation): for inspection.

    Example::

        text = cache.lower(order, leaves, roots, 0).as_text()     # StableHLO
    """
    layout = ArgLayout(leaves)
    collective = any(n.op in COLLECTIVE_OPS for n in order)
    reps = replica.replicas() if collective and distributed.world_size() > 1 else None
    dev = None if runtime.spmd_enabled() else runtime.jax_device(device)
    with runtime.x64(), jax.default_matmul_precision(config.matmul_precision):
        return _lower(order, leaves, roots, layout, (), dev, reps)


def clear() -> None:
    """Forget every compiled executable in memory (the next sync of each graph builds it again).

    The persistent cache on disk is kept, so the next build of a graph it holds is a load.

    Example::

        from lazyxla.lowering import cache
        cache.clear()
    """
    _cache.clear()


# --- the persistent (disk) cache --------------------------------------------------------------------

_MAGIC = b"lazyxla-executable-v1\n"
_SUFFIX = ".lxc"
_CHECK = 32  # bytes of the entry's blake2b checksum, after the magic
_environment: tuple | None = None


def _fingerprint() -> tuple:
    """What, besides the graph, decides the compiled program: lazyxla's code, jax/XLA's build, the device."""
    global _environment
    if _environment is None:
        import jaxlib

        code = hashlib.blake2b(digest_size=32)
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for root, dirs, files in os.walk(package):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    with open(os.path.join(root, name), "rb") as f:
                        code.update(name.encode() + b"\0" + f.read())
        dev = runtime.local_devices()[0]
        _environment = (
            code.hexdigest(),
            jax.__version__,
            jaxlib.__version__,
            dev.platform,
            dev.client.platform_version,
            dev.device_kind,
            foreign_env("XLA_FLAGS"),
        )
    return _environment


def _digest(order, leaves, roots, device, donated) -> str:
    """The 256-bit name of a program on disk: the graph exactly (ops, constants, wiring) and its setting."""
    index: dict[int, int] = {}
    parts: list = [_fingerprint(), config.compile_key(), device, tuple(donated)]
    for n in leaves:
        index[id(n)] = len(index)
        parts.append((n.op.value, n.avals))
    for n in order:
        index[id(n)] = len(index)
        parts.append((str(n.op), n.template, n.avals, tuple([(index[id(m)], i) for m, i in n.inputs])))
    parts.append(tuple([(index[id(m)], i) for m, i in roots]))
    return hashlib.blake2b(repr(parts).encode(), digest_size=32).hexdigest()


def _folder() -> str | None:
    """The disk cache's folder for this compile, or None: turned off, or unusable (warned once)."""
    if not config.persistent_cache or not config.cache_dir:
        return None
    path = os.path.abspath(os.path.expanduser(config.cache_dir))
    if path in _ready:
        return path
    if path in _broken:
        return None
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)  # entries are executable code: keep them private
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{path} is not writable")
    except Exception as e:
        _broken[path] = str(e)
        _warn_once(
            "off:" + path,
            f"lazyxla: the persistent compilation cache in {path} is off for this process: the folder cannot "
            f"be created or used ({type(e).__name__}: {e}). Programs are compiled as usual, just not reused "
            "by other processes. Point lazyxla.config.cache_dir (LAZYXLA_CACHE_DIR) at a writable folder, or "
            "turn the cache off with LAZYXLA_PERSISTENT_CACHE=0.",
        )
        return None
    _ready.add(path)
    return path


def _load(path: str, devices: list, n_args: int, n_outs: int):
    """The executable stored at ``path`` loaded onto ``devices`` (one, or the replica mesh's), or None
    (absent; unreadable: removed, warned)."""
    from jax.experimental import serialize_executable

    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn_once("read", f"lazyxla: cannot read the persistent compilation cache entry {path} ({e}); compiling.")
        return None
    try:
        head = len(_MAGIC)
        payload = blob[head + _CHECK :]
        if blob[:head] != _MAGIC or blob[head : head + _CHECK] != hashlib.blake2b(payload, digest_size=_CHECK).digest():
            raise ValueError("not a lazyxla cache entry, or truncated or corrupt (checksum mismatch)")
        in_tree = jax.tree_util.tree_structure((tuple(range(n_args)), {}))
        out_tree = jax.tree_util.tree_structure(tuple(range(n_outs)))
        return serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, backend=devices[0].client, execution_devices=devices
        )
    except Exception as e:
        _warn_once(
            "read",
            f"lazyxla: the persistent compilation cache entry {path} could not be loaded ({type(e).__name__}: "
            f"{e}); it is removed and the program compiled again. If this repeats, delete the folder (it is only "
            "a cache).",
        )
        try:
            os.remove(path)
        except OSError:
            pass
        return None


def _save(path: str, executable) -> None:
    """Write the executable to ``path`` atomically (temporary file, rename); a failure warns once."""
    from jax.experimental import serialize_executable

    tmp = None
    try:
        payload, _, _ = serialize_executable.serialize(executable)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=_SUFFIX, dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.blake2b(payload, digest_size=_CHECK).digest() + payload)
        os.replace(tmp, path)
        tmp = None
    except Exception as e:
        _warn_once(
            "write",
            f"lazyxla: could not write to the persistent compilation cache in {os.path.dirname(path)} "
            f"({type(e).__name__}: {e}); runs go on, but another process will compile again. Make the "
            "folder writable, point lazyxla.config.cache_dir (LAZYXLA_CACHE_DIR) elsewhere, or turn the "
            "cache off with LAZYXLA_PERSISTENT_CACHE=0.",
        )
    finally:
        if tmp is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
