"""The process model: joining a multi-process run through jax's distributed runtime, and its facts.

One *replica* is one process driving one device (torch_xla's classic data-parallel model). A run of
several processes, on one host or many, is joined with ``jax.distributed.initialize`` before the
first use of a device; after that ``jax.devices()`` lists every process's devices and a compiled
program can span them (gloo carries the collectives on CPU, NCCL on GPU, ICI on TPU).

How a process learns it is part of a run, in order:

1. ``initialize(...)`` called by the user before the first device use (explicit arguments, or
   ``cluster_detection=True`` for jax's auto-detection: Slurm, Open MPI, TPU pods, ...);
2. ``lazyxla.config`` ``num_processes``/``process_id``/``coordinator_address`` (``lazyxla.spawn``
   sets them in its children through ``LAZYXLA_*`` variables);
3. torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``, with jax's
   coordinator on ``MASTER_PORT + 1`` (torchrun's own store holds ``MASTER_PORT``);
4. jax's cluster detection, with ``config.cluster_detection`` (``LAZYXLA_CLUSTER_DETECTION=1``, e.g.
   on TPU pods), or by itself under Slurm or Open MPI with several tasks;
5. otherwise a single process.
"""

from __future__ import annotations

import ipaddress
import threading
import warnings
from typing import Any

import jax

from lazyxla import jax_private
from lazyxla.config import config, launcher_env
from lazyxla.device import wire


class DistributedError(RuntimeError):
    """A multi-process run could not be joined, or a rendezvous among its processes failed."""


_lock = threading.Lock()
_state: dict[str, Any] = {}  # 'initialized', 'local_rank', 'rendezvous' (tag -> count)
# True once this process has joined a run of several processes. Their programs over the replicas are one
# program that every process must build alike, so lazy/meta.py then bakes no Python number whose value may
# differ between ranks (0 and +-1, kept as constants in one process: float(rank) is 0.0 on rank 0 only).
programs_span_processes = [False]


_backend_started = jax_private.backend_started  # whether it is too late to join a run or set CPU devices


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_rank: int | None = None,
    cluster_detection: bool = False,
    timeout_s: int | None = None,
) -> None:
    """Join a multi-process run. Call it before anything uses a lazyxla device.

    With no arguments the run is described by ``lazyxla.config`` or torchrun's variables (see the
    module docstring); ``cluster_detection=True`` lets jax find it (Slurm, Open MPI, TPU pods).
    Calling it again with the same run is a no-op.

    Example::

        import lazyxla
        lazyxla.runtime.initialize("10.0.0.1:1234", num_processes=2, process_id=0)
        dev = lazyxla.device()
    """
    with _lock:
        if _state.get("initialized"):
            return
        if config.cpu_devices > 0 and not _backend_started():
            jax.config.update("jax_num_cpu_devices", config.cpu_devices)
        if cluster_detection:
            args: dict[str, Any] = {}
        else:
            args = _from_environment()
            if coordinator_address is not None:
                args["coordinator_address"] = coordinator_address
            if num_processes is not None:
                args["num_processes"] = int(num_processes)
            if process_id is not None:
                args["process_id"] = int(process_id)
            if not args or args.get("num_processes", 1) <= 1:
                _state.update(initialized=True, local_rank=0 if local_rank is None else local_rank)
                return
            missing = [k for k in ("coordinator_address", "num_processes", "process_id") if k not in args]
            if missing:
                raise DistributedError(
                    f"lazyxla.runtime.initialize: a multi-process run needs {missing} too (got {args}); pass "
                    "them, set LAZYXLA_COORDINATOR_ADDRESS / LAZYXLA_NUM_PROCESSES / LAZYXLA_PROCESS_ID, launch "
                    "with torchrun or lazyxla.spawn, or use cluster_detection=True on a cluster jax knows."
                )
        if _backend_started():
            raise DistributedError(
                "lazyxla.runtime.initialize must run before the first use of a device (jax has already "
                "started its backend in this process): call it at the top of the script, before "
                "lazyxla.device() or any jax computation."
            )
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # the CPU backend's collectives
        # jax's preemption notifier catches SIGTERM: a launcher stopping this rank would wait for its SIGKILL
        jax.config.update("jax_enable_preemption_service", config.preemption_service)
        timeout = int(timeout_s or config.distributed_timeout_s)
        bind = bind_address(args.get("coordinator_address"))
        try:
            jax.distributed.initialize(**args, initialization_timeout=timeout, coordinator_bind_address=bind)
        except Exception as e:
            raise DistributedError(
                f"lazyxla: joining the multi-process run {args or '(cluster auto-detection)'} failed: "
                f"{type(e).__name__}: {e}. Check that every process was started, with the same coordinator "
                "address and process count, and that the coordinator's port is reachable."
            ) from e
        if _is_loopback(_host(args.get("coordinator_address", ""))):
            _gloo_on_loopback()
        programs_span_processes[0] = jax.process_count() > 1
        rank = config.local_rank if config.local_rank >= 0 else int(launcher_env().get("LOCAL_RANK", -1))
        if local_rank is not None:
            rank = local_rank
        _state.update(initialized=True, local_rank=rank if rank >= 0 else jax.process_index())


def _host(address: str) -> str:
    """The host of ``host:port`` (``[v6]:port`` too), without brackets."""
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") else address
    return host.strip("[]")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: not resolved, as it may name another address on other hosts
        return False


def bind_address(coordinator_address: str | None) -> str | None:
    """Where process 0's coordinator listens for ``coordinator_address``: ``config.coordinator_bind_address``
    if set, else the coordinator's own address when it is a loopback one, else None (jax's default: every
    interface, for the other hosts of a multi-host run).

    Example::

        assert bind_address("127.0.0.1:1234") == "127.0.0.1:1234"
    """
    chosen = config.coordinator_bind_address.strip()
    if chosen:
        if chosen.count(":") > 1 and not chosen.startswith("["):  # a bare IPv6 address
            chosen = f"[{chosen}]"
        if not (chosen.endswith("]") or ":" not in chosen):
            return chosen  # host:port
        if not coordinator_address:
            raise DistributedError(
                f"lazyxla.config.coordinator_bind_address={config.coordinator_bind_address!r} names no port, and "
                "the coordinator's address is not known here (cluster detection): give 'host:port'."
            )
        return f"{chosen}:{coordinator_address.rsplit(':', 1)[1]}"  # the coordinator's port
    if coordinator_address and _is_loopback(_host(coordinator_address)):
        return coordinator_address
    return None


def _gloo_on_loopback() -> None:
    """A single-host run: gloo's CPU collectives listen on 127.0.0.1, not on the address the host name
    resolves to (reachable from the network). jax offers no setting, so its CPU backend factory is
    registered again with gloo collectives made here (private jax: no public API takes them)."""
    try:
        jax_private.gloo_on_loopback(_client())
    except (AttributeError, TypeError) as e:  # another jax version: gloo keeps jax's own address
        warnings.warn(f"lazyxla: gloo's CPU collectives could not be bound to 127.0.0.1 ({e})", stacklevel=2)


def _from_environment() -> dict[str, Any]:
    """The run described by lazyxla's config, else by torchrun's variables; {} for a single process."""
    if config.num_processes > 0:
        out: dict[str, Any] = {"num_processes": config.num_processes}
        if config.process_id >= 0:
            out["process_id"] = config.process_id
        if config.coordinator_address:
            out["coordinator_address"] = config.coordinator_address
        return out
    env = launcher_env()
    if int(env.get("WORLD_SIZE", "1")) <= 1:
        return {}
    out = {"num_processes": int(env["WORLD_SIZE"])}
    if "RANK" in env:
        out["process_id"] = int(env["RANK"])
    if config.coordinator_address:
        out["coordinator_address"] = config.coordinator_address
    elif "MASTER_ADDR" in env and "MASTER_PORT" in env:
        out["coordinator_address"] = f"{env['MASTER_ADDR']}:{int(env['MASTER_PORT']) + 1}"
    return out


def _cluster_detected() -> bool:
    """Whether jax's cluster detection should describe the run: asked for, or Slurm / Open MPI with
    several tasks (and neither lazyxla's config nor torchrun describes it)."""
    if config.cluster_detection:
        return True
    env = launcher_env()
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or env.get("OMPI_COMM_WORLD_SIZE") or "1"
    return int(tasks) > 1 and not _from_environment()


def ensure_initialized() -> None:
    """Join the run the environment describes, if not done yet (called before the first device use)."""
    if not _state.get("initialized"):
        initialize(cluster_detection=_cluster_detected())


# --- facts -----------------------------------------------------------------------------------------


def process_count() -> int:
    """Processes in this run (1 unless it is a multi-process run).

    Example::

        if lazyxla.runtime.process_count() > 1: ...
    """
    ensure_initialized()
    return jax.process_count()


def process_index() -> int:
    """This process's index in the run, 0..process_count()-1.

    Example::

        print(lazyxla.runtime.process_index())
    """
    ensure_initialized()
    return jax.process_index()


def world_size() -> int:
    """Replicas in the run: one per process (each drives its first lazyxla device).

    Example::

        lr = base_lr * lazyxla.runtime.world_size()
    """
    return process_count()


def global_ordinal() -> int:
    """This replica's index among all replicas (the process index).

    Example::

        sampler = DistributedSampler(ds, lazyxla.runtime.world_size(), lazyxla.runtime.global_ordinal())
    """
    return process_index()


def local_ordinal() -> int:
    """This replica's index among the replicas of its host (torchrun's LOCAL_RANK).

    Example::

        print(lazyxla.runtime.local_ordinal())
    """
    ensure_initialized()
    return _state["local_rank"]


def is_master(local: bool = False) -> bool:
    """True in the process of global ordinal 0 (with ``local=True``: local ordinal 0).

    Example::

        if lazyxla.runtime.is_master(): print("epoch done")
    """
    return (local_ordinal() if local else global_ordinal()) == 0


def replica_devices() -> list[jax.Device]:
    """One device per process, in process order: the devices the replica axis runs over."""
    ensure_initialized()
    first: dict[int, jax.Device] = {}
    for d in jax.devices():
        if d.process_index not in first or d.id < first[d.process_index].id:
            first[d.process_index] = d
    return [first[i] for i in sorted(first)]


# --- host-side agreement among processes ------------------------------------------------------------


_client = jax_private.coordination_client


def rendezvous(tag: str, payload: bytes = b"") -> list[bytes]:
    """Wait until every process reaches ``rendezvous(tag)``; returns every process's ``payload``, by index.

    Processes must meet the same tags in the same order. A process that does not arrive within
    ``config.distributed_timeout_s`` makes the others raise, naming the tag.

    Example::

        lazyxla.runtime.rendezvous("checkpoint written")
    """
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"rendezvous({tag!r}, payload): payload must be bytes, got {type(payload).__name__}")
    n = process_count()
    if n == 1:
        return [bytes(payload)]
    with _lock:
        counts = _state.setdefault("rendezvous", {})
        count = counts[tag] = counts.get(tag, 0) + 1
    me = process_index()
    base = f"lazyxla/rendezvous/{tag}/{count}"
    client = _client()
    timeout_ms = int(config.distributed_timeout_s * 1000)
    try:
        client.key_value_set_bytes(f"{base}/{me}", bytes(payload))
        out = [client.blocking_key_value_get_bytes(f"{base}/{i}", timeout_ms) for i in range(n)]
        client.wait_at_barrier(f"{base}/done", timeout_ms)  # nobody deletes a key another still reads
    except Exception as e:
        raise DistributedError(
            f"rendezvous({tag!r}) in process {me} of {n}: not every process arrived within "
            f"{config.distributed_timeout_s} s ({type(e).__name__}: {e}). Every process must call it with the "
            "same tags in the same order; a process that died or took another path leaves the others here."
        ) from e
    client.key_value_delete(f"{base}/{me}")
    return out


def meet(tag: str, payload: bytes) -> list[bytes]:
    """``rendezvous`` for a steady stream of meetings under one ``tag`` (one per step): every process's
    ``payload``, by index, in about half its time (no barrier: a process deletes its key of the previous meeting
    once it has read every key of this one, as the others set theirs of this one after reading that one).

    Example::

        votes = lazyxla.device.processes.meet("capture", b"replay 1f2e")
    """
    n = process_count()
    if n == 1:
        return [bytes(payload)]
    with _lock:
        counts = _state.setdefault("meet", {})
        count = counts[tag] = counts.get(tag, 0) + 1
    me = process_index()
    client = _client()
    timeout_ms = int(config.distributed_timeout_s * 1000)
    try:
        client.key_value_set_bytes(f"lazyxla/meet/{tag}/{count}/{me}", bytes(payload))
        out = [
            bytes(payload)
            if i == me
            else client.blocking_key_value_get_bytes(f"lazyxla/meet/{tag}/{count}/{i}", timeout_ms)
            for i in range(n)
        ]
    except Exception as e:
        raise DistributedError(
            f"meet({tag!r}) in process {me} of {n}: not every process arrived within {config.distributed_timeout_s} s "
            f"({type(e).__name__}: {e})"
        ) from e
    if count > 1:
        client.key_value_delete(f"lazyxla/meet/{tag}/{count - 1}/{me}")
    return out


def exchange(peer: int, tag: str, payload: bytes) -> bytes:
    """Give ``payload`` to process ``peer`` and return the one it gives this process: the two meet at their n-th
    ``exchange`` with each other under ``tag``; no other process takes part. A peer that does not arrive within
    ``config.distributed_timeout_s`` raises ``DistributedError``.

    Example::

        theirs = exchange(1 - process_index(), "shapes", json.dumps(shape).encode())
    """
    me = process_index()
    if not 0 <= peer < process_count() or peer == me:
        raise ValueError(f"exchange({peer}, {tag!r}): the peer must be another process of the {process_count()}")
    pair = (min(me, peer), max(me, peer))
    with _lock:
        counts = _state.setdefault("exchange", {})
        count = counts[(tag, pair)] = counts.get((tag, pair), 0) + 1
    base = f"lazyxla/exchange/{tag}/{pair[0]}-{pair[1]}/{count}"
    client = _client()
    try:
        client.key_value_set_bytes(f"{base}/{me}", bytes(payload))
        theirs = client.blocking_key_value_get_bytes(f"{base}/{peer}", int(config.distributed_timeout_s * 1000))
    except Exception as e:
        raise DistributedError(
            f"exchange({tag!r}) of process {me} with process {peer}: the peer did not arrive within "
            f"{config.distributed_timeout_s} s ({type(e).__name__}: {e})"
        ) from e
    client.key_value_delete(f"{base}/{peer}")  # read once, by this process only
    return theirs


def mesh_reduce(tag: str, data: Any, reduce_fn) -> Any:
    """Gather ``data`` from every process and return ``reduce_fn(list_of_values)``.

    ``data`` may hold Python scalars, strings, bytes, lists, tuples, dicts, NumPy arrays and scalars and
    torch tensors (they arrive as CPU tensors): it travels in lazyxla's wire encoding
    (:mod:`lazyxla.device.wire`), never pickled, so no process runs code another one sent.

    Example::

        mean_acc = lazyxla.runtime.mesh_reduce("acc", accuracy, lambda xs: sum(xs) / len(xs))
    """
    sent = wire.encode(data, f"mesh_reduce({tag!r}, data)")
    received = rendezvous(tag, sent)
    return reduce_fn([wire.decode(b, f"process {i} in mesh_reduce({tag!r})") for i, b in enumerate(received)])
