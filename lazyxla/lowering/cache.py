"""The compile cache: graph key -> compiled XLA executable, in memory and on disk.

In memory: an LRU of ``config.compile_cache_size`` programs, keyed by the graph's structural hash.

On disk (``config.persistent_cache``, on by default): lazyxla's own store of serialized executables
(single-device, replica and SPMD programs; an SPMD program's name also covers its inputs' layouts)
in ``config.cache_dir``, one file per program, named by a 256-bit digest of the graph itself (every
node's op, constant arguments, output shapes and dtypes, and wiring; the leaves, the results, the
donations, the device), of lazyxla's source code, the lowering flags and the jax/XLA build and device.
Because the key is the recorded graph and not the lowered program, a new process running the same
steps skips lowering as well as compiling: it walks the graph, hashes it and loads the executable.

Trust: an entry is machine code this process will run, so the folder must be the user's and writable by
no one else (and, under the user's cache root, so must its parents up to that root); else the disk cache
is off for the process, with one warning. Missing folders are created 0700. Each entry is authenticated
with HMAC-SHA256 under a random key kept in the folder (``hmac-key``, 0600, made by the first process)
before any of it is unpickled, and carries its own name and the environment's digest: a corrupt, foreign
or renamed entry is a miss (warned once per kind), compiled again and rewritten, never another program's
results. Entries are written with ``atomic_write`` (fsync, rename); temporary files of killed writers are
removed when a process opens the folder. The entries are kept under ``config.persistent_cache_max_bytes``
by removing the least recently used (a load touches the entry's modification time). jax's configuration
is never changed; a jax compilation cache the user turned on for jax applies to lazyxla's compiles as to
any ``jax.jit``.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import hmac
import os
import secrets
import stat

import jax
import jaxlib
import numpy as np
import torch
from jax.experimental import serialize_executable

from lazyxla import jax_private
from lazyxla.config import config, foreign_env, user_cache_root
from lazyxla.device import devices, host_memory, meshes, processes
from lazyxla.device.meshes import layouts
from lazyxla.ir import digest
from lazyxla.lowering import replica
from lazyxla.lowering.rules import jax_call
from lazyxla.lowering.to_jax import ArgLayout, graph_fn
from lazyxla.observe import metrics
from lazyxla.ops import REPLICA_OPS, ops
from lazyxla.util import Memo, atomic_write, remove_stale_temps, warn_once

_cache: collections.OrderedDict = collections.OrderedDict()  # least recently used first

_broken: dict[str, str] = {}  # cache folder -> why the disk cache is off for it (warned once)
_ready: dict[str, bytes] = {}  # cache folder checked and usable -> its key


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

    def check_argument(self, k: int, a, leaves: list) -> None:
        """``check_arguments`` for argument ``k`` alone (a replayed step checks the buffers it did not make)."""
        if not _fits(a, *self.expect[k]):
            raise ProgramInputError(self._mismatch(k, a, leaves))

    def _mismatch(self, k: int, a, leaves: list) -> str:
        shape, dtype, sharding = self.expect[k]
        data = self.layout.data
        if k < len(data):
            n = leaves[data[k]]
            what = f"graph input {k} (a tensor of shape {list(n.avals[0].shape)} and dtype {n.avals[0].dtype}"
            what += f", {n.source})" if n.source else ")"
        else:
            what = f"argument {k} (the packed {self.layout.describe(k)})"
        got = f"{np.dtype(a.dtype)}{list(a.shape)}"
        if type(a) is not np.ndarray and a.is_deleted():
            got += " whose buffers were deleted (donated to an earlier program, or deleted through jax)"
        elif type(a) is not np.ndarray:
            buffers = sorted({f"{b.dtype}{list(b.shape)}" for b in _device_buffers(a)})
            got += f" laid out as {a.sharding}, with device buffers {', '.join(buffers)}"
        return (
            f"lazyxla: {what} does not match the compiled program: it is {got}, but the program takes "
            f"{dtype}{list(shape)} laid out as {sharding}. The program was not run and no tensor changed. "
            "This is a lazyxla bug (a transfer or relayout that changed the buffer): please report it with "
            "this message"
        )


# per program argument: an array's per-device buffers (private: the one place where their dtypes can be seen)
_device_buffers = jax_private.device_buffers


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
    buffers = _device_buffers(a)  # None: deleted
    return buffers is not None and all(b.dtype == dtype for b in buffers)


# (layout, expected layout, ndim) -> whether they place data alike: a few per sharded step; layouts that keep changing
# would grow it forever, so the oldest leave past 4,096
_equivalent_layouts = Memo("lazyxla.lowering.cache._equivalent_layouts", limit=4096)


def _equivalent(layout, expected, ndim: int) -> bool:
    """Whether two shardings place the same data on the same devices (``GSPMDSharding`` outputs of a
    step vs the ``NamedSharding`` it was compiled for), memoized."""
    key = (layout, expected, ndim)
    try:
        return _equivalent_layouts.table[key]
    except KeyError:
        return _equivalent_layouts.remember(key, layout.is_equivalent_to(expected, ndim))


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
    spmd = devices.spmd_enabled()
    collective = any(n.op in REPLICA_OPS for n in order)
    if spmd and collective:
        raise RuntimeError(
            "lazyxla: replica collectives (lazyxla.all_reduce, ...) do not mix with SPMD mode, where one program "
            "spans every device and XLA partitions it from the shardings: annotate tensors with "
            "lazyxla.spmd.mark_sharding instead"
        )
    reps = replica.replicas() if collective and processes.world_size() > 1 else None
    dev = None if spmd else devices.jax_device(device)
    store = None if jax_call.calls_python(order) else _folder()  # Python callbacks live in this process only
    name = None
    executable = None
    if store is not None:
        with metrics.timer("disk_cache"):
            if spmd:  # one program over every device, compiled for its inputs' layouts (canonical, as keyed)
                targets = list(devices.global_devices())
                where = ("spmd", processes.process_index(), tuple(str(d) for d in targets), layouts(leaves))
            elif reps is not None:
                targets, where = reps.devices, ("replicas", tuple(str(d) for d in reps.devices))
            else:  # the device's global id, not its local index: each rank of a multi-process run has a
                # lazyxla:0, but XLA binds the executable to the rank's own device (a rank that loaded another
                # rank's entry met KeyError: <its device id>, and no rank ever hit)
                targets, where = [dev], ("device", dev.id)
            name = _digest(order, leaves, roots, where, donated)
            executable = _load(store, name, targets, len(layout.specs(leaves, None)), len(roots))
    if devices.platform() == "cpu":  # (buffers in host memory: once, before the first program runs)
        host_memory.keep_freed_buffers()
    if executable is not None:
        metrics.inc("persistent_cache_hits")
    else:
        with devices.x64(), jax.default_matmul_precision(config.matmul_precision):
            with metrics.timer("lower"):
                lowered = _lower(order, leaves, roots, layout, layout.positions(donated), dev, reps)
            # The compiler's peak comes on top of what the steps and the lowering freed but the C allocator kept;
            # after it, its own freed memory is returned too, or the next compile stacks on it (host_memory).
            host_memory.release()
            with metrics.timer("compile"):
                executable = lowered.compile(compiler_options=_compiler_options())
            del lowered  # its MLIR module, before the release
            host_memory.release()
        if name is not None:
            metrics.inc("persistent_cache_misses")
            with metrics.timer("disk_cache"):
                _save(store, name, executable)
    metrics.inc("compiles")  # a program this process built: compiled, or loaded from disk (counted apart)
    compiled = Compiled(executable, donated, layout, reps, spmd)
    _cache[key] = compiled
    while len(_cache) > max(config.compile_cache_size, 1):
        _cache.popitem(last=False)
        metrics.inc("cache_evictions")
    return compiled


def _compiler_options() -> dict:
    """XLA options every lazyxla program is compiled with (from ``config``; part of the cache key)."""
    return {"xla_allow_excess_precision": not config.round_half_intermediates}


def _lower(order, leaves, roots, layout: ArgLayout, donate: tuple[int, ...], dev, reps):
    """The graph as a lowered jax program: on one device, over the replicas, or SPMD over every device."""
    if reps is not None:
        local = layout.specs(leaves, None)
        body = graph_fn(order, leaves, roots, layout, replica.AXIS, reps.world)
        fn = jax.jit(reps.wrap(body, local, len(roots)), donate_argnums=donate)
        return fn.lower(*[reps.global_spec(s) for s in local])
    if dev is None:  # SPMD: inputs keep their layouts, XLA's partitioner chooses the outputs'
        body = _uneven_layouts(graph_fn(order, leaves, roots, layout), leaves, roots, layout)
        fn = jax.jit(body, donate_argnums=donate)
        # (an input without a buffer stands in for a pending value, ``graph.prepare``: lowered replicated)
        shardings = [None if leaves[i].payload is None else leaves[i].payload.sharding for i in layout.data]
        replicated = _replicated_like(shardings, order)
        shardings = [replicated if s is None or s.is_fully_replicated else s for s in shardings]
        return fn.lower(*layout.specs(leaves, replicated, shardings))
    sharding = jax.sharding.SingleDeviceSharding(dev)
    fn = jax.jit(graph_fn(order, leaves, roots, layout), donate_argnums=donate, out_shardings=sharding)
    return fn.lower(*layout.specs(leaves, sharding))


def _uneven_layouts(fn, leaves, roots, layout: ArgLayout):
    """SPMD: ``fn`` with its inputs that stand for a layout splitting a dimension unevenly constrained to that
    layout, and its results that are such a layout returned in the even one their buffers keep (``meshes.ask``)."""
    ins = [meshes.asked(leaves[i]) for i in layout.data]
    outs = [meshes.uneven_constraint(m) for m, _ in roots]
    if not any(ins) and not any(outs):
        return fn
    ins = [meshes.named_sharding(*a) if a else None for a in ins]
    outs = [meshes.even_sharding(*u, m.avals[i].shape) if u else None for u, (m, i) in zip(outs, roots)]

    @functools.wraps(fn)  # (the program keeps its name)
    def constrained(*args):
        args = [a if s is None else jax.lax.with_sharding_constraint(a, s) for a, s in zip(args, ins)] + list(
            args[len(ins) :]
        )
        return tuple(o if s is None else jax.lax.with_sharding_constraint(o, s) for o, s in zip(fn(*args), outs))

    return constrained


def _replicated_like(shardings: list, order=()) -> jax.sharding.NamedSharding:
    """The layout a replicated argument of an SPMD program is lowered with: replicated over the mesh of its
    first argument split over a mesh, else of its first sharding annotation (``mark_sharding`` of a pending value,
    a DTensor made from a new tensor), else over every device (the same layout either way).

    jax names the layouts XLA's partitioner chose for the outputs on the mesh of the program's first argument;
    a 1-D mesh of all devices cannot name one split over two mesh axes (a 2-D GPT's attention output kept
    alive; dropout's mask of a new tensor annotated over a (2, 4) mesh: jax raised IndivisibleError at compile).
    """
    for s in shardings:
        if isinstance(s, jax.sharding.NamedSharding) and not s.is_fully_replicated:
            return jax.sharding.NamedSharding(s.mesh, jax.sharding.PartitionSpec())
    for node in order:  # (only programs with no split argument get here: few, and most have no annotation)
        if node.op is ops.shard.default:
            layout = meshes.named_sharding(*node.template[0][1:3])
            return jax.sharding.NamedSharding(layout.mesh, jax.sharding.PartitionSpec())
    return devices.replicated()


def lower(order, leaves, roots, device: int):
    """The jax ``Lowered`` program of a graph, as a sync would build it (no donation): for inspection.

    Example::

        text = cache.lower(order, leaves, roots, 0).as_text()     # StableHLO
    """
    layout = ArgLayout(leaves)
    collective = any(n.op in REPLICA_OPS for n in order)
    reps = replica.replicas() if collective and processes.world_size() > 1 else None
    dev = None if devices.spmd_enabled() else devices.jax_device(device)
    with devices.x64(), jax.default_matmul_precision(config.matmul_precision):
        return _lower(order, leaves, roots, layout, (), dev, reps)


def holds(key) -> bool:
    """Whether the in-memory cache has the program for ``key`` (a sync that will build one explains why).

    Example::

        missed = not cache.holds(key)      # in lazy.graph, before cache.get
    """
    return key in _cache


def clear() -> None:
    """Forget every compiled executable in memory (the next sync of each graph builds it again).

    The persistent cache on disk is kept, so the next build of a graph it holds is a load.

    Example::

        from lazyxla.lowering import cache
        cache.clear()
    """
    _cache.clear()


# --- the persistent (disk) cache --------------------------------------------------------------------
#
# An entry: _MAGIC, then the HMAC-SHA256 (under the folder's key) of the magic and the body, then the body:
# the program's name (its 32-byte digest, which the file is named by), the environment's digest, and jax's
# serialized executable. jax's serialization is a pickle wrapping XLA's executable (machine code): it is
# only ever read after the tag is verified, so a file this user's lazyxla did not write is never unpickled.

_MAGIC = b"lazyxla-executable-v2\n"
_SUFFIX = ".lxc"
_KEY_FILE = "hmac-key"  # the folder's secret: 32 random bytes, mode 0600, created by the first process
_KEY_BYTES = 32
_TAG = 32  # bytes of the HMAC-SHA256 tag
_NAME = 32  # bytes of the program's digest, then as many of the environment's
_environment: tuple | None = None


class _Unsafe(Exception):
    """The cache folder or its key could be written by someone else: not to be trusted."""


# The code a cached executable depends on besides its graph, as paths in the lazyxla package (a folder ends in
# "/"; the longest entry that matches a file decides): True for code that changes the programs built from a
# graph -- the recording and the IR, decompositions and kernels that record ops, the lowering, the flags
# (config.py declares which change output) -- and False for the rest. Entries are named under a digest of the
# True files only, so editing a False one (the torch_xla layer, tools, launchers, loaders, diagnostics) keeps
# every cached executable. A file no entry matches counts as True (a stale executable is worse than a
# compile), and tests/test_persistent_cache.py requires every file to match an entry and every entry a file:
# a new or moved file is a decision made here.
PROGRAM_CODE: dict[str, bool] = {
    "config.py": True,  # flags: defaults, and which ones change compiled output
    "ir.py": True,  # the IR, its hashes and the graph digest that names entries
    "ops.py": True,  # the lazyxla op schemas and ReduceOp, as their rules read them
    "util.py": False,  # atomic writes, warn-once
    # Private PyTorch/jax names, bound once. Mostly aliases, but their helpers decide program content: the
    # dtype pointwise rules compute in, which decompositions lazy mode records (torch_private); the HLO form
    # of a sharding that canonical layouts, part of a program's key, are made of (jax_private).
    "torch_private.py": True,
    "jax_private.py": True,
    "observe/": False,  # metrics, diagnostics, profiler phases
    "device/": True,  # dtype mapping, x64, devices and transfers, meshes and canonical layouts
    "device/__init__.py": False,
    "device/host_memory.py": False,  # returns freed host memory to the OS around compiles
    "device/processes.py": False,  # ranks and the coordination service
    "device/wire.py": False,
    "lowering/": True,  # the rules, graph -> jax function, replica programs, how programs are lowered
    "lazy/": True,  # recording, meta inference, decompositions, RNG keys, sync's walk (argument order)
    "lazy/check.py": False,  # raises PyTorch's errors at the call; records nothing
    "lazy/bounds.py": False,  # index bounds checks: raise at the call; what they record is a graph like any
    "lazy/regions.py": False,
    "frontend/": True,  # device kernels that record functional forms, autocast's casts, torch.compile traces
    "frontend/export.py": False,  # export lowers on its own, outside this cache
    "frontend/lightning.py": False,  # Lightning's strategy and accelerator: where work runs, not what is recorded
    "parallel/": False,  # user-facing collectives, SPMD annotations, launch, process group, training, loader
    "compat/": False,
    "tools/": False,
    # public faces and deprecated aliases
    "__init__.py": False,
    "autocast.py": False,
    "collectives.py": False,
    "data.py": False,
    "debug.py": False,
    "device/distributed.py": False,
    "device/runtime.py": False,
    "dynamo.py": False,
    "lightning.py": False,
    "metrics.py": False,
    "profiler.py": False,
    "regions.py": False,
    "run.py": False,
    "runtime.py": False,
    "spmd.py": False,
    "stablehlo.py": False,
}

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code_entry(path: str) -> str | None:
    """The ``PROGRAM_CODE`` entry that decides about ``path`` (relative to the package, "/"-separated)."""
    matches = [e for e in PROGRAM_CODE if path == e or (e.endswith("/") and path.startswith(e))]
    return max(matches, key=len, default=None)


def package_files(package: str = _PACKAGE) -> list[str]:
    """Every Python file of the package, relative and "/"-separated, sorted."""
    found = []
    for root, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(root, package).replace(os.sep, "/")
        found += [name if rel == "." else f"{rel}/{name}" for name in files if name.endswith(".py")]
    return sorted(found)


def code_digest(package: str = _PACKAGE) -> str:
    """A digest of the package's files that change programs (``PROGRAM_CODE``): part of every entry's
    environment.

    Example::

        cache.code_digest()          # '3f1c...': changes with a lowering rule, not with compat/
    """
    code = hashlib.blake2b(digest_size=32)
    for path in package_files(package):
        entry = code_entry(path)
        if entry is None or PROGRAM_CODE[entry]:
            with open(os.path.join(package, path), "rb") as f:
                code.update(path.encode() + b"\0" + f.read())
    return code.hexdigest()


def _fingerprint() -> tuple:
    """What, besides the graph, decides the compiled program: lazyxla's code that changes programs,
    PyTorch's version (rules follow its promotion and decompositions), jax/XLA's build, the device."""
    global _environment
    if _environment is None:
        dev = devices.local_devices()[0]
        _environment = (
            code_digest(),
            torch.__version__,
            jax.__version__,
            jaxlib.__version__,
            dev.platform,
            dev.client.platform_version,
            dev.device_kind,
            foreign_env("XLA_FLAGS"),
        )
    return _environment


def _environment_digest() -> bytes:
    return hashlib.sha256(repr(_fingerprint()).encode()).digest()


def _digest(order, leaves, roots, where, donated) -> str:
    """The 256-bit name of a program on disk: the graph exactly (``ir.digest``: ops, constants, wiring,
    leaves' kinds and avals) and its setting (environment, flags, device or layouts, donations)."""
    return digest(order, leaves, roots, extra=(_fingerprint(), config.compile_key(), where, tuple(donated)))


def _uid() -> int:
    return os.geteuid()


def _folder() -> tuple[str, bytes] | None:
    """The disk cache's folder for this compile and its key, or None: turned off, or unusable or unsafe
    (warned once). The first use of a folder also removes the temporary files of killed writers."""
    if not config.persistent_cache or not config.cache_dir:
        return None
    path = os.path.abspath(os.path.expanduser(config.cache_dir))
    if path in _ready:
        return path, _ready[path]
    if path in _broken:
        return None
    try:
        for folder in _chain(path):
            _make_private(folder)
            _check_folder(folder)
        key = _key(path)
    except Exception as e:
        _broken[path] = str(e)
        why = str(e) if isinstance(e, _Unsafe) else f"the folder cannot be created or used ({type(e).__name__}: {e})"
        _warn_once(
            "off:" + path,
            f"lazyxla: the persistent compilation cache in {path} is off for this process: {why}. Programs are "
            "compiled as usual, just not reused by other processes. Point lazyxla.config.cache_dir "
            "(LAZYXLA_CACHE_DIR) at a folder of yours that only you can write, or turn the cache off with "
            "LAZYXLA_PERSISTENT_CACHE=0.",
        )
        return None
    remove_stale_temps(path)
    _ready[path] = key
    return path, key


def _chain(path: str) -> list[str]:
    """The folders that must be safe: from below the user's cache root down to ``path`` for a folder
    in it (no one else may swap a parent), else ``path`` itself (the user chose it)."""
    root = user_cache_root()
    if path != root and os.path.commonpath([root, path]) == root:
        parts = os.path.relpath(path, root).split(os.sep)
        return [os.path.join(root, *parts[: i + 1]) for i in range(len(parts))]
    return [path]


def _make_private(path: str) -> None:
    """Create ``path`` and its missing parents, each 0700 (os.makedirs gives parents the default mode)."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        _make_private(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def _check_folder(folder: str) -> None:
    """Raise unless ``folder`` is a folder of this user's that no one else can write to."""
    st = os.stat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{folder} is not a folder")
    if st.st_uid != _uid():
        raise _Unsafe(
            f"{folder} belongs to another user (uid {st.st_uid}, you are {_uid()}), who could plant entries "
            "(machine code this process would run)"
        )
    if st.st_mode & 0o022:
        who = {0o022: "group and others", 0o020: "group", 0o002: "others"}[st.st_mode & 0o022]
        raise _Unsafe(
            f"{folder} is writable by {who} "
            f"(mode {stat.S_IMODE(st.st_mode):04o}), who could plant entries (machine code this process would "
            f"run); {_privacy_advice(folder, st.st_mode)}"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"{folder} is not writable")


def _privacy_advice(folder: str, mode: int) -> str:
    """What to do about a cache folder others can write: a shared folder (sticky, as /tmp, /var/tmp, /dev/shm)
    is meant to be writable by all, and taking that away breaks every other user of the machine, so the
    advice there is a private subfolder (created 0700, and the sticky bit keeps others from swapping it);
    only a folder of the user's own is made private with chmod."""
    if mode & stat.S_ISVTX:
        private = os.path.join(folder, f"lazyxla-cache-{_uid()}")
        return f"it is a shared folder: use a private subfolder instead, LAZYXLA_CACHE_DIR={private} (created 0700)"
    return f"make it private with `chmod go-w {folder}` (and delete its entries if you do not trust them)"


def _key(folder: str) -> bytes:
    """The folder's secret key, from its key file (created on first use: random, 0600, atomically)."""
    path = os.path.join(folder, _KEY_FILE)
    if not os.path.lexists(path):
        try:
            atomic_write(path, secrets.token_bytes(_KEY_BYTES), replace=False)
        except FileExistsError:  # another process created it first: use theirs
            pass
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != _uid() or st.st_mode & 0o077:
            raise _Unsafe(
                f"its key file {path} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}) must be a "
                f"file of yours that only you can read (mode 0600): `chmod 600 {path}` if you trust it, else "
                "delete it (a new key is made; entries written under the old one are compiled again)"
            )
        key = f.read(_KEY_BYTES + 1)
    if len(key) != _KEY_BYTES:
        raise _Unsafe(f"its key file {path} is not {_KEY_BYTES} bytes long; delete it (a new key is made)")
    return key


def _tag(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, _MAGIC + body, hashlib.sha256).digest()


def _rejected(key: bytes, blob: bytes, name: str) -> tuple[str, str] | None:
    """Why the entry ``blob`` stored as ``name`` must not be used ((warning kind, reason)), or None."""
    head = len(_MAGIC)
    if blob[:head] != _MAGIC:
        return "format", "not a lazyxla cache entry of this version"
    tag, body = blob[head : head + _TAG], blob[head + _TAG :]
    if len(body) < 2 * _NAME or not hmac.compare_digest(tag, _tag(key, body)):
        return "tag", "its authentication tag does not match: truncated, corrupt, or not written with this folder's key"
    if body[:_NAME] != bytes.fromhex(name):
        return "name", "it is another program's entry (copied or renamed to this program's name)"
    if body[_NAME : 2 * _NAME] != _environment_digest():
        return "environment", "it was compiled for another environment (lazyxla, jax, XLA or device)"
    return None


def _load(store: tuple[str, bytes], name: str, devices: list, n_args: int, n_outs: int):
    """The executable stored as ``name`` loaded onto ``devices`` (one, or the replica mesh's), or None:
    absent, or unusable (warned once per kind; the caller compiles and rewrites it)."""
    folder, key = store
    path = os.path.join(folder, name + _SUFFIX)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn_once("read", f"lazyxla: cannot read the persistent compilation cache entry {path} ({e}); compiling.")
        return None
    rejected = _rejected(key, blob, name)
    if rejected is None:
        try:  # authenticated: jax's pickle of the executable is ours
            in_tree = jax.tree_util.tree_structure((tuple(range(n_args)), {}))
            out_tree = jax.tree_util.tree_structure(tuple(range(n_outs)))
            executable = serialize_executable.deserialize_and_load(
                blob[len(_MAGIC) + _TAG + 2 * _NAME :],
                in_tree,
                out_tree,
                backend=devices[0].client,
                execution_devices=devices,
            )
        except Exception as e:
            rejected = "load", f"{type(e).__name__}: {e}"
        else:
            try:
                os.utime(path)  # a use: the least recently used entries are evicted first
            except OSError:
                pass
            return executable
    kind, why = rejected
    _warn_once(
        kind,
        f"lazyxla: the persistent compilation cache entry {path} could not be loaded ({why}); the program is "
        "compiled again and the entry rewritten. If this repeats, delete the folder (it is only a cache).",
    )
    return None


def _save(store: tuple[str, bytes], name: str, executable) -> None:
    """Write the executable as ``name`` (atomic_write: fsync, rename), then keep the folder under the size
    cap; a failure warns once."""
    folder, key = store
    path = os.path.join(folder, name + _SUFFIX)
    cap = config.persistent_cache_max_bytes
    try:
        payload, _, _ = serialize_executable.serialize(executable)
        body = bytes.fromhex(name) + _environment_digest() + payload
        blob = _MAGIC + _tag(key, body) + body
        if 0 < cap < len(blob):
            _warn_once(
                "large",
                f"lazyxla: a compiled program of {len(blob)} bytes is not kept in the persistent compilation cache: "
                f"it is larger than lazyxla.config.persistent_cache_max_bytes ({cap}). Raise the cap "
                "(LAZYXLA_PERSISTENT_CACHE_MAX_BYTES) to keep such programs.",
            )
            return
        atomic_write(path, blob)
        _evict(folder, cap, keep=path)
    except Exception as e:
        _warn_once(
            "write",
            f"lazyxla: could not write to the persistent compilation cache in {folder} "
            f"({type(e).__name__}: {e}); runs go on, but another process will compile again. Make the "
            "folder writable, point lazyxla.config.cache_dir (LAZYXLA_CACHE_DIR) elsewhere, or turn the "
            "cache off with LAZYXLA_PERSISTENT_CACHE=0.",
        )


def _evict(folder: str, cap: int, keep: str) -> None:
    """Remove the least recently used entries (oldest modification time: written or loaded) until the
    folder's entries fit in ``cap`` bytes (0: no cap); ``keep`` (the entry just written) stays."""
    if cap <= 0:
        return
    entries = []
    for entry in os.scandir(folder):
        if entry.name.endswith(_SUFFIX) and not entry.name.startswith("."):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:  # evicted meanwhile by another process
                continue
            entries.append((st.st_mtime_ns, entry.name, st.st_size, entry.path))
    total = sum(e[2] for e in entries)
    for _, _, size, path in sorted(entries):
        if total <= cap:
            break
        if path == keep:
            continue
        try:
            os.remove(path)
        except FileNotFoundError:  # another process evicted it: it no longer counts either
            pass
        except OSError:
            continue
        total -= size
        metrics.inc("persistent_cache_evictions")


def _warn_once(kind: str, message: str) -> None:
    warn_once("cache:" + kind, message, RuntimeWarning, stacklevel=2)
