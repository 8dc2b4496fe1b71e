"""Every lazyxla flag, declared once.

Each flag has a name, a type, a default, a help text, the environment variable that sets it, and
whether it changes compiled output (such flags are part of the compile-cache key). No other module
reads ``os.environ``.

Example::

    import lazyxla
    lazyxla.config.strict = True          # CPU fallbacks become errors
    with lazyxla.config.override(strict=False):
        ...
    lazyxla.config.persistent_cache = False   # or LAZYXLA_PERSISTENT_CACHE=0: compiled programs stay in memory
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import os
import warnings
from collections.abc import Iterator
from typing import Any


@dataclasses.dataclass(frozen=True)
class Flag:
    name: str
    type: type
    default: Any
    help: str
    affects_compile: bool = False
    choices: tuple = ()  # the values a str flag accepts (empty: any)

    @property
    def env(self) -> str:
        return "LAZYXLA_" + self.name.upper()


def user_cache_root() -> str:
    """The user's own cache folder: ``$XDG_CACHE_HOME``, else ``~/.cache``.

    Example::

        root = user_cache_root()      # e.g. /home/me/.cache
    """
    return os.path.abspath(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"))


def _user_cache_dir() -> str:
    """``$XDG_CACHE_HOME/lazyxla/xla``, else ``~/.cache/lazyxla/xla``."""
    return os.path.join(user_cache_root(), "lazyxla", "xla")


# set to 1: an installed torch or jax outside lazyxla's checked range warns instead of refusing (a trial of that
# release); read by util.require_version while the private-API modules import, before any flag is
UNSUPPORTED_VERSIONS_VARIABLE = "LAZYXLA_ALLOW_UNSUPPORTED_VERSIONS"

FLAGS: tuple[Flag, ...] = (
    Flag("strict", bool, False, "Raise instead of falling back to CPU for an op with no lowering."),
    Flag("warn_fallback", bool, True, "Warn once per op that falls back to CPU."),
    Flag(
        "check_max_elements",
        int,
        1 << 20,
        "The first call of each op signature (op, shapes, dtypes, constants) whose tensors hold at most this "
        "many elements in all also runs once on PyTorch's CPU kernel with stand-in values, so that errors "
        "PyTorch's meta kernels miss (unsupported dtypes, mixed dtypes in matmuls, dims out of range) raise at "
        "the call as on the CPU, not at the sync. It costs ~0.3-1 ms per new signature (25-100 ms in a small GPT's "
        "first step); later calls of the signature cost nothing. 0: no check.",
    ),
    Flag("donate", bool, True, "Donate the device buffers of tensors a full sync overwrites."),
    Flag(
        "known_values_limit",
        int,
        4096,
        "Integer and bool tensors of at most this many elements whose values the host has (copied from the CPU, "
        "or made by factories and ops from such values) keep a CPU copy: ops on them are computed on the host by "
        "PyTorch's CPU kernels and their host reads (.item(), .tolist(), bool(t)) compile and sync nothing; "
        "programs take them as inputs, never as constants. 0: off. See docs/performance.md (generation).",
    ),
    Flag(
        "dynamic_positions",
        bool,
        True,
        "A select, slice (of a fixed size) or write through one at a Python int position (x[i], "
        "x[:, i:i + n], x[:, i] = v) bakes the position into the program; once the same call (op, shapes, dim, "
        "size) meets a new position after a sync or host read, the position becomes a program input from then "
        "on, so a loop indexing at a changing position compiles once more, not at every position. The "
        "positions one step takes again in every step (a qkv split) stay constants. See docs/performance.md.",
    ),
    Flag(
        "eager",
        bool,
        False,
        "Eager mode, for debugging: every op is computed as soon as it is recorded (one small program per op, "
        "compiled once per op signature), so a failing op raises at its own line. lazyxla.compile regions and "
        "torch.compile'd functions still run as one program. Off: ops are recorded and computed together at "
        "the next sync (lazy mode). Same as lazyxla.eager_mode(True).",
    ),
    Flag(
        "check_indices",
        bool,
        False,
        "Check every index an op reads (index, index_put_, index_select, gather, scatter*, embedding, nll_loss/"
        "cross_entropy targets, take, index_add/copy/fill) and raise PyTorch's error (IndexError: index out of "
        "range in self, ...) at the call for one out of range. An index whose values the host has (small "
        "integer tensors copied from the CPU) is always checked, for free; any other costs a sync at the call "
        "(its min and max read on the host, counted as index_checks). Off: out-of-range reads give a fill value "
        "(NaN, the lowest integer) and writes are dropped, as XLA does. Always on in eager mode. See "
        "docs/debugging.md.",
    ),
    Flag(
        "host_read_computes",
        str,
        "needed",
        "What a host read (.item(), .cpu(), print) computes. 'needed': the values it reads, every live tensor "
        "computed on the way, and the values other pending tensors take from that work (so no pending graph "
        "keeps work already done). 'all': every pending tensor, as lazyxla.sync() (torch_xla's mark_step) does, "
        "except that a pending torch.cat stays pending with its pieces computed, and so do views of computed "
        "data (slices, reshapes: they hold no work); inputs no tensor holds are "
        "donated. A multi-process run always computes what a read needs (and what is on the way), nothing more. "
        "See docs/performance.md (generation) for what each costs.",
        choices=("needed", "all"),
    ),
    Flag(
        "capture_generate",
        bool,
        True,
        "Hugging Face generate() on a lazyxla model with a static cache replays its decode step: where transformers "
        "would torch.compile the forward (on CUDA), lazyxla captures it (lazyxla.compile(capture=True), the KV cache "
        "as the step's state), so a warm token runs one program without recording its ops. Off: every token is "
        "recorded. generate(..., disable_compile=True) turns it off for one call. See docs/performance.md "
        "(generation).",
    ),
    Flag(
        "freeze_gc",
        bool,
        True,
        "At the first sync, move the objects alive then (PyTorch, jax, the model) out of the scans of "
        "Python's cyclic garbage collector (gc.freeze()); otherwise each full collection during training "
        "scans ~400k of them (~0.1 s).",
    ),
    Flag(
        "explain_recompiles",
        bool,
        False,
        "Keep each recorded op's source line and explain every recompile: the first op that differs from the "
        "last graph compiled at the same sync site, its changed shapes, dtypes or constants, and the line "
        "(logged by the 'lazyxla' logger, listed by lazyxla.metrics.recompiles()). Costs ~2 µs per op.",
    ),
    Flag(
        "capture",
        bool,
        False,
        "Whole-step capture by default for step functions: lazyxla.compile(fn) and torch_xla.compile(fn) made "
        "while this is on capture as lazyxla.compile(fn, capture=True) does (a verified step replays without "
        "running its Python; a step that cannot be replayed is recorded, as before, and its status says why); "
        "lazyxla.compile(fn, capture=False) opts one function out. HF Trainer's training_step on a lazyxla model "
        "is captured too. Regions written as `with` blocks, and loops with no step function (the work between two "
        "mark_step() calls), run their Python every step, so they are recorded. See docs/performance.md "
        "(whole-step capture).",
    ),
    Flag(
        "warn_graph_nodes",
        int,
        100_000,
        "Warn once when the pending graph (ops recorded and not yet computed) reaches this many nodes: a loop "
        "that never syncs (no lazyxla.sync() / xm.mark_step(), no DeviceLoader) records every step into one "
        "ever larger program. A training step of a GPT-2-sized model is a few thousand nodes. 0: never warn.",
    ),
    Flag(
        "dump_dir",
        str,
        "",
        "A folder to write each compiled program to, as <graph hash>.stablehlo.mlir and <graph hash>.ir.txt "
        "(empty: no dumps).",
    ),
    Flag(
        "compile_cache_size",
        int,
        1024,
        "Compiled programs kept in memory (least recently used ones are dropped beyond this).",
    ),
    Flag(
        "matmul_precision",
        str,
        "highest",
        "Precision of float32 matmuls and convolutions (jax's names: 'default', 'high', 'highest', or 'bfloat16', "
        "'tensorfloat32', 'float32').",
        affects_compile=True,
        choices=("default", "high", "highest", "bfloat16", "tensorfloat32", "float32"),
    ),
    Flag(
        "sdpa_implementation",
        str,
        "auto",
        "How F.scaled_dot_product_attention's fused op (no dropout, same head count for queries and keys, 4-d) is "
        "computed. 'auto': cuDNN flash attention (jax.nn.dot_product_attention) on a CUDA GPU where jax offers it for"
        " the call (float16/bfloat16, query and value head dims equal, <= 128 and a multiple of 8, <= 256 from Hopper"
        " on; with a mask or bias, even sequence lengths) outside SPMD, lazyxla's XLA formulation in float32 "
        "otherwise and on CPU/TPU. 'xla': always XLA's. 'cudnn': always cuDNN; a call it cannot take (another "
        "platform, dtype or shape, or dropout / grouped-query attention, which take PyTorch's math path) raises at "
        "the call, saying why. The program dump names the choice (call @sdpa_xla / @sdpa_cudnn in the StableHLO). See"
        " docs/performance.md (attention).",
        affects_compile=True,
        choices=("auto", "xla", "cudnn"),
    ),
    Flag(
        "round_half_intermediates",
        bool,
        True,
        "Round every bfloat16/float16 intermediate of a program to its dtype, as PyTorch does op by op (XLA's "
        "xla_allow_excess_precision=false), so half-precision math gives eager PyTorch's numbers. False lets XLA "
        "keep fused intermediates in float32: slightly faster on some accelerators, and results then differ "
        "from eager in the last bits.",
        affects_compile=True,
    ),
    Flag(
        "persistent_cache",
        bool,
        True,
        "Keep compiled programs on disk in cache_dir, keyed by the recorded graph, so another process "
        "running the same steps loads them instead of lowering and compiling.",
    ),
    Flag(
        "cache_dir",
        str,
        _user_cache_dir(),
        "Folder of the persistent compilation cache, created on first use ($XDG_CACHE_HOME or ~/.cache, "
        "then lazyxla/xla). Only lazyxla's programs go there; jax's own cache settings are left alone. The "
        "folder must be yours and not writable by group or others (else the cache is off, with a warning): "
        "entries are machine code this process runs.",
    ),
    Flag(
        "persistent_cache_max_bytes",
        int,
        2 * 1024**3,
        "Size cap of the persistent compilation cache's entries in bytes (0: no cap). Beyond it, writing an "
        "entry removes the least recently used ones (a load counts as a use). 2 GiB holds hundreds of "
        "programs (a small GPT's training step on CPU is ~2 MB; large GPU/TPU programs tens of MB).",
    ),
    Flag(
        "coordinator_address",
        str,
        "",
        "host:port of jax's distributed coordinator for a multi-process run (set by lazyxla.spawn; under "
        "torchrun it defaults to MASTER_ADDR:MASTER_PORT+1).",
    ),
    Flag(
        "coordinator_bind_address",
        str,
        "",
        "Where jax's distributed coordinator (process 0 of a multi-process run) listens: 'host' or 'host:port' "
        "(e.g. '0.0.0.0' or '[::]'). Empty: on the coordinator's own address when that is a loopback one (a "
        "single-host run: lazyxla.spawn, torchrun on 127.0.0.1), else on every interface, so that the "
        "other hosts reach it.",
    ),
    Flag(
        "preemption_service",
        bool,
        False,
        "Start jax's preemption service in multi-process runs: it catches SIGTERM so that "
        "jax.experimental.multihost_utils.reached_preemption_sync_point can tell every process. Off: SIGTERM "
        "stops a process at once, as in PyTorch, so lazyxla.spawn and torchrun stop ranks without waiting to "
        "SIGKILL them.",
    ),
    Flag("num_processes", int, 0, "Processes of a multi-process run (0: from torchrun's WORLD_SIZE, else 1)."),
    Flag("process_id", int, -1, "This process's index in a multi-process run (-1: from torchrun's RANK)."),
    Flag("local_rank", int, -1, "This process's index on its host (-1: from torchrun's LOCAL_RANK, else process_id)."),
    Flag(
        "cpu_devices",
        int,
        0,
        "CPU devices jax makes in this process (jax_num_cpu_devices; 0: jax's default). Several fake CPU "
        "devices let sharded programs run on one machine.",
    ),
    Flag(
        "device_name",
        str,
        "lazyxla",
        "The name PyTorch knows lazyxla's device by: 'lazyxla', or 'xla' (torch_xla's, so that code written for "
        "torch_xla can say torch.device('xla'), .to('xla'), t.device.type == 'xla'). Read once, when lazyxla is "
        "imported: set LAZYXLA_DEVICE_NAME before. `python -m lazyxla.run` chooses 'xla' (for its children too).",
    ),
    Flag(
        "cluster_detection",
        bool,
        False,
        "Let jax find the multi-process run (TPU pods, Slurm, Open MPI, ...) when nothing else describes it; "
        "on by itself under Slurm with several tasks and under Open MPI with several processes.",
    ),
    Flag(
        "distributed_timeout_s",
        int,
        120,
        "Seconds to wait for every process to join a multi-process run, and for rendezvous/mesh_reduce.",
    ),
    Flag(
        "spmd_check_programs",
        bool,
        True,
        "Multi-process SPMD: before each program runs, the processes compare what they are about to run (a "
        "rendezvous, ~1-3 ms per step). A process that runs another program, or none (e.g. a .item() on the "
        "master only), then raises an error naming each process's trigger and line, instead of XLA's "
        "collectives waiting for it until the run aborts.",
    ),
)

# The variables torchrun (and other PyTorch launchers) set for each process, and those by which Slurm and
# Open MPI tell a process its task count (jax's cluster detection reads the rest itself).
LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "OMPI_COMM_WORLD_SIZE",
)


def launcher_env() -> dict[str, str]:
    """The torchrun-style launcher variables present in this process's environment."""
    return {k: os.environ[k] for k in LAUNCHER_VARIABLES if k in os.environ}


# Variables other tools own that lazyxla reads as they define them (besides LAUNCHER_VARIABLES):
# torch_xla's PJRT runtime (for scripts run through lazyxla.compat), torchelastic's, jax's and XLA's.
FOREIGN_VARIABLES = (
    "PJRT_DEVICE",
    "XLA_USE_EAGER_DEBUG_MODE",
    "CPU_NUM_DEVICES",
    "GPU_NUM_DEVICES",
    "TPU_NUM_DEVICES",
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "JAX_PLATFORMS",
    "XLA_FLAGS",
    "PYTHONPATH",
    *LAUNCHER_VARIABLES,
)


def foreign_env(name: str, default: str = "") -> str:
    """The value of an environment variable another tool defines (``FOREIGN_VARIABLES``), or ``default``.

    lazyxla reads the environment only here and in its own flags, so every variable it looks at is listed
    in this module.

    Example::

        device = foreign_env("PJRT_DEVICE").upper()     # torch_xla's runtime selector
    """
    if name not in FOREIGN_VARIABLES:
        raise KeyError(f"lazyxla internal error: {name} is not declared in lazyxla.config.FOREIGN_VARIABLES")
    return os.environ.get(name, default)


_BY_NAME = {f.name: f for f in FLAGS}


def _parse(flag: Flag, raw: str) -> Any:
    """The value of ``flag``'s environment variable, or a ValueError naming the variable and what it takes."""
    if flag.type is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{flag.env}={raw!r}: expected one of 1/0/true/false/yes/no/on/off")
    if flag.type is int:
        try:
            return int(raw.strip())
        except ValueError:
            raise ValueError(f"{flag.env}={raw!r}: expected an integer (default: {flag.default})") from None
    _check_choice(flag, raw, f"{flag.env}={raw!r}")
    return raw


def _check_choice(flag: Flag, value: Any, where: str) -> None:
    # checked where the value is given (the environment at import, or an assignment), not where it is used: a
    # bad precision would otherwise fail inside jax at the first sync, with no word of the variable
    if flag.choices and value not in flag.choices:
        raise ValueError(f"{where}: expected one of {', '.join(map(repr, flag.choices))}")


def unknown_variables(environ: dict[str, str]) -> list[str]:
    """Warnings for ``LAZYXLA_*`` names in ``environ`` that are no flag's variable (lazyxla reads no other),
    each with the closest flag's variable: a misspelled name would otherwise be ignored without a word.

    Example::

        unknown_variables({"LAZYXLA_PERSISTANT_CACHE": "0"})
        # ['LAZYXLA_PERSISTANT_CACHE is not a lazyxla variable and is ignored; did you mean LAZYXLA_PERSISTENT_CACHE?']
    """
    known = {f.env for f in FLAGS} | {UNSUPPORTED_VERSIONS_VARIABLE}
    messages = []
    for name in sorted(k for k in environ if k.startswith("LAZYXLA_") and k not in known):
        # compared without the common prefix, which would make every name look close to every other
        close = difflib.get_close_matches(name.removeprefix("LAZYXLA_").lower(), list(_BY_NAME), n=1, cutoff=0.6)
        hint = f"did you mean {_BY_NAME[close[0]].env}?" if close else "lazyxla.config.describe() lists the variables"
        messages.append(f"{name} is not a lazyxla variable and is ignored; {hint}")
    return messages


# Flags lazyxla itself sets for one block of its own work (``config.scoped``: the Dynamo backend's trace, eager mode's
# "lazy inside"). Each is read through ``config.<name>`` wherever it is read, never through the values dict, so a
# scoped value holds in the thread (and asyncio task) that set it only. (Flags read per op through the values dict
# stay process-wide: ``override``.)
SCOPABLE = frozenset({"strict", "eager", "known_values_limit"})
_EMPTY: dict = {}  # (never changed: the default of every context's scoped flags)
_scoped: contextvars.ContextVar[dict] = contextvars.ContextVar("lazyxla_config_scoped", default=_EMPTY)


class _Config:
    """The live flag values; attribute access reads and writes them."""

    def __init__(self) -> None:
        values = {}
        for flag in FLAGS:
            raw = os.environ.get(flag.env)
            values[flag.name] = flag.default if raw is None else _parse(flag, raw)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_watchers", {})

    def __getattr__(self, name: str) -> Any:
        scoped = _scoped.get()
        if scoped and name in scoped:
            return scoped[name]
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"lazyxla.config has no flag {name!r}; flags: {sorted(_BY_NAME)}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        flag = _BY_NAME.get(name)
        if flag is None:
            raise AttributeError(f"lazyxla.config has no flag {name!r}; flags: {sorted(_BY_NAME)}")
        if not isinstance(value, flag.type):
            raise TypeError(f"lazyxla.config.{name} takes a {flag.type.__name__}, got {value!r}")
        _check_choice(flag, value, f"lazyxla.config.{name} = {value!r}")
        self._values[name] = value
        watcher = self._watchers.get(name)
        if watcher is not None:
            watcher(value)

    def watch(self, name: str, callback) -> None:
        """Call ``callback(value)`` now and whenever flag ``name`` is set: for a flag whose change must take
        effect at once rather than being read where it is used (``eager`` swaps the op handler, so that lazy
        mode pays nothing per op for it). One watcher per flag.

        Example::

            config.watch("eager", eager.apply)
        """
        if name not in _BY_NAME:
            raise AttributeError(f"lazyxla.config has no flag {name!r}; flags: {sorted(_BY_NAME)}")
        self._watchers[name] = callback
        callback(self._values[name])

    def compile_key(self) -> tuple:
        """The values of the flags that change compiled output, for the compile-cache key."""
        return tuple(self._values[f.name] for f in FLAGS if f.affects_compile)

    @contextlib.contextmanager
    def override(self, **changes: Any) -> Iterator[None]:
        """Set flags for the duration of a ``with`` block.

        Example::

            with lazyxla.config.override(strict=True):
                run_step()
        """
        old = {name: getattr(self, name) for name in changes}
        try:
            for name, value in changes.items():
                setattr(self, name, value)
            yield
        finally:
            for name, value in old.items():
                setattr(self, name, value)

    @contextlib.contextmanager
    def scoped(self, **changes: Any) -> Iterator[None]:
        """Set flags of ``SCOPABLE`` for a ``with`` block in this thread only (and its asyncio task): lazyxla's own
        temporary settings, which must not change what another thread does meanwhile (a DeviceLoader's uploads,
        autograd's backward thread, a user's second thread). ``override`` sets flags for the whole process.
        ``eager`` can only be turned off here (lazy mode inside eager mode).

        Example::

            with lazyxla.config.scoped(strict=True, eager=False):    # the Dynamo backend tracing a graph
                out = gm(*inputs)
        """
        for name, value in changes.items():
            if name not in SCOPABLE:
                raise ValueError(
                    f"lazyxla.config.scoped({name}=...): only {sorted(SCOPABLE)} can be set for one thread; "
                    "use lazyxla.config.override for the whole process"
                )
            flag = _BY_NAME[name]
            if not isinstance(value, flag.type):
                raise TypeError(f"lazyxla.config.{name} takes a {flag.type.__name__}, got {value!r}")
        if changes.get("eager"):
            raise ValueError(
                "lazyxla.config.scoped(eager=True): eager mode is turned on for the whole process only "
                "(lazyxla.eager_mode(True) or lazyxla.config.override(eager=True))"
            )
        token = _scoped.set({**_scoped.get(), **changes})
        try:
            yield
        finally:
            _scoped.reset(token)

    def describe(self) -> str:
        """A table of every flag: name, value, environment variable and help."""
        rows = [f"{f.name} = {self._values[f.name]!r}  ({f.env}; default {f.default!r}) {f.help}" for f in FLAGS]
        return "\n".join(rows)


config = _Config()
for _message in unknown_variables(os.environ):
    warnings.warn(_message, stacklevel=1)
