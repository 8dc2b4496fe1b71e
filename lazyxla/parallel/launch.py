"""``lazyxla.spawn``: one process per replica on this host, joined through jax's distributed runtime.

Fail fast, never hang: the parent watches every child; when one raises or dies, the others are
stopped (SIGTERM, then SIGKILL after a grace period) and ``spawn`` raises naming the rank that failed
first, with its traceback. A failure caused by another rank's (a communication error: "Connection
closed by peer", a rendezvous nobody else reached) never hides its cause: a rank killed by a signal, or
one that raised anything else, is named before it. A child whose parent disappears exits on its own,
so no process is left behind.

Every server of the run listens on 127.0.0.1 only: jax's coordinator (in rank 0), gloo's collectives,
and the torch.distributed store, which the parent hosts (as torchrun's agent does) for
``dist.init_process_group``'s ``env://`` rendezvous.
"""

from __future__ import annotations

import datetime
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from lazyxla.config import config
from lazyxla.device import processes
from lazyxla.device.processes import DistributedError
from lazyxla.lazy.graph import sync

_GRACE_S = 5.0  # between SIGTERM and SIGKILL when stopping the other ranks
# After a communication error (caused by another rank), how long to wait for the other ranks to report
# the cause (a rank's exit status reaches the parent after its peers may already have seen it close).
_ROOT_CAUSE_WAIT_S = 5.0

# The root cause first: killed by a signal, raised (not a communication error); then exited without a
# word (jax's coordination client exits so when another process died); last, a communication error.
_KILLED, _RAISED, _EXITED, _PEER = range(4)

# Messages of errors a rank gets when another rank fails: gloo's and NCCL's, sockets', and jax's
# coordination service's (its gRPC status codes are upper case).
_PEER_TEXT = re.compile(
    r"closed by peer|connection (?:closed|reset|refused|aborted)|broken pipe|socket closed|\bgloo\b|\bnccl\b|"
    r"coordination service|heartbeat|barrier timed out",
    re.IGNORECASE,
)
_PEER_STATUS = re.compile(r"\b(?:UNAVAILABLE|DEADLINE_EXCEEDED|ABORTED|CANCELLED)\b")


class SpawnError(RuntimeError):
    """A spawned rank raised or died; the message names it and carries its traceback.

    ``rank`` is the rank that failed first (-1 when the run timed out), ``exitcodes`` every rank's exit
    code once all were stopped (negative: killed by that signal), ``exception`` the exception that rank raised,
    rebuilt in this process (None when it did not raise, or its exception did not pickle): a caller that
    stands for a process pool re-raises it, as ``concurrent.futures`` does.
    """

    def __init__(self, rank: int, message: str, exception: BaseException | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcodes: list[int | None] = []
        self.exception = exception


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback_store() -> dist.TCPStore:
    """torch.distributed's store for the run, served from this process on 127.0.0.1 only (a TCPStore
    made by its rank 0 would listen on every interface: its own socket ignores the host it is given)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        port = listener.getsockname()[1]
        fd = listener.detach()  # the store owns the socket from here on, and closes it
    finally:
        listener.close()
    return dist.TCPStore(
        "127.0.0.1", port, None, True, datetime.timedelta(seconds=300), wait_for_workers=False, master_listen_fd=fd
    )


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(70)  # the parent is gone: nobody will collect this rank


def _caused_by_peer(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it chains) is a communication error, which another rank's
    failure causes: lazyxla's DistributedError, torch.distributed's errors, a closed connection."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, (DistributedError, dist.DistError, ConnectionError)):
            return True
        text = str(error)
        if _PEER_TEXT.search(text) or _PEER_STATUS.search(text):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _child(fn, rank, nprocs, address, store_port, cpu_devices, args, conn, parent) -> None:
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if cpu_devices:
        os.environ["LAZYXLA_CPU_DEVICES"] = str(cpu_devices)
    os.environ.update(
        LAZYXLA_COORDINATOR_ADDRESS=address,
        LAZYXLA_NUM_PROCESSES=str(nprocs),
        LAZYXLA_PROCESS_ID=str(rank),
        LAZYXLA_LOCAL_RANK=str(rank),
        # what torchrun sets, so that torch.distributed's env:// rendezvous works as under torchrun: every
        # rank a client of the store the parent serves (as torchrun's agent serves its own), none a server
        RANK=str(rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(nprocs),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store_port),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    try:
        for name, value in (("coordinator_address", address), ("num_processes", nprocs)):
            setattr(config, name, value)
        config.process_id = rank
        config.local_rank = rank
        if cpu_devices:
            config.cpu_devices = cpu_devices
        processes.initialize()
        result = fn(rank, *args)
        try:
            # pickled here, with the standard pickler: multiprocessing's own sends a CPU tensor's storage as a
            # shared-memory handle that the parent opens later, and a rank that had exited by then left its
            # result unreadable ("exited with code 0 without reporting an error"); these bytes hold the data
            conn.send(("ok", pickle.dumps(result)))
        except Exception as e:  # an unpicklable result
            conn.send(("ok", f"<result not sent back: {type(e).__name__}: {e}>"))
        if nprocs > 1:
            sync(wait=True)
            processes.rendezvous("lazyxla.spawn: exit")  # nobody leaves while another still needs it
    except BaseException as e:
        text = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        conn.send(("error", text, _caused_by_peer(e), _pickled(e)))
        conn.close()
        os._exit(1)
    conn.close()


def _pickled(error: BaseException) -> bytes | None:
    """``error`` as bytes the parent can rebuild it from (SpawnError.exception), or None if it does not pickle."""
    try:
        return pickle.dumps(error)
    except Exception:  # an exception holding an unpicklable value: the parent has its text
        return None


def spawn(
    fn: Callable[..., Any],
    args: tuple = (),
    nprocs: int | None = None,
    *,
    timeout_s: float | None = None,
    cpu_devices: int | None = None,
    start_method: str = "spawn",
) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``nprocs`` new processes (default: one), joined as one run.

    Each process is one replica driving its own device (on CPU, one CPU device per process, with gloo
    collectives). The children also get torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``), so ``torch.distributed.init_process_group("lazyxla")`` works in them
    (its store is served by this process, on 127.0.0.1). Returns the ranks' return values, in rank order.
    If a rank raises or dies, the others are stopped and :class:`SpawnError` names the rank that failed
    first (not one that lost its connection to it) with its traceback; ``timeout_s`` bounds the whole run
    the same way. ``fn`` must be importable by the children (a module-level function).
    ``cpu_devices``: fake CPU devices per process (``config.cpu_devices``), e.g. for SPMD on one machine.

    Example::

        def train(rank):
            dev = lazyxla.device()
            ...

        if __name__ == "__main__":
            lazyxla.spawn(train, nprocs=4)
    """
    if nprocs is None:
        nprocs = 1
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"spawn: nprocs must be a positive int, got {nprocs!r}")
    if not callable(fn):
        raise TypeError(f"spawn: fn must be callable, got {fn!r}")
    ctx = multiprocessing.get_context(start_method)
    address = f"127.0.0.1:{_free_port()}"  # jax's coordinator
    store = _loopback_store()  # torch.distributed's store, for dist.init_process_group("lazyxla")
    store_port = store.port
    procs, conns = [], []
    for rank in range(nprocs):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_child,
            args=(fn, rank, nprocs, address, store_port, cpu_devices, tuple(args), send, os.getpid()),
            name=f"lazyxla-rank{rank}",
        )
        p.start()
        send.close()
        procs.append(p)
        conns.append(recv)
    try:
        return _supervise(procs, conns, timeout_s)
    except SpawnError as e:
        _stop(procs)
        e.exitcodes = [p.exitcode for p in procs]
        raise
    finally:
        _stop(procs)
        del store  # its server stops with the run


def _supervise(procs, conns, timeout_s) -> list[Any]:
    """Every rank's result, in rank order; or SpawnError naming the rank that failed first.

    Each round reads every exit status, then every message (a message a rank sent before it exited is
    in its pipe by then). Once a rank failed, the run is over: at once when a rank was killed or raised
    an error of its own; else (communication errors, or exits without a word, which jax's coordination
    client does when another process died) when every rank has ended or ``_ROOT_CAUSE_WAIT_S`` has
    passed, whichever comes first, so that the rank that caused the others' errors is the one named.
    """
    n = len(procs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    results: dict[int, Any] = {}
    errors: dict[int, tuple[str, bool]] = {}  # rank -> (traceback text, caused by a peer)
    exits: dict[int, int] = {}
    listening = set(range(n))  # ranks whose pipe may still bring a message
    failed_at, stalled = None, False
    while True:
        progress = False
        for rank in range(n):
            if rank not in exits and procs[rank].exitcode is not None:
                exits[rank], progress = procs[rank].exitcode, True
        for rank in sorted(listening):
            while (message := _receive(conns[rank])) is not None:
                progress = True
                if message is _EOF:
                    listening.discard(rank)
                    break
                if message[0] == "ok":
                    # our own child's bytes over its private pipe (conn.recv unpickled them as much): trusted
                    results[rank] = pickle.loads(message[1]) if isinstance(message[1], bytes) else message[1]
                elif message[0] == "error":
                    errors[rank] = (message[1], bool(message[2]), message[3])
        failures = _failures(n, results, errors, exits)
        now = time.monotonic()
        if failures:
            failed_at = now if failed_at is None else failed_at
            ranked = sorted(failures, key=lambda r: (failures[r][0], r))
            first = ranked[0]
            waited_enough = len(exits) == n or now >= failed_at + _ROOT_CAUSE_WAIT_S
            if failures[first][0] < _EXITED or waited_enough or (deadline is not None and now >= deadline):
                raise SpawnError(first, _failure_message(first, failures, ranked), _raised(errors.get(first)))
        elif len(exits) == n:
            return [results[r] for r in range(n)]
        elif deadline is not None and now >= deadline:
            raise SpawnError(-1, f"spawn: the run did not finish within {timeout_s} s; every rank was stopped")
        ends = [t for t in (deadline, None if failed_at is None else failed_at + _ROOT_CAUSE_WAIT_S) if t is not None]
        if progress:
            stalled = False
            continue  # look again before waiting: more may have come in
        if stalled:  # a rank's sentinel is ready a moment before its exit status can be read: don't spin
            time.sleep(0.001)
        watched = [procs[r].sentinel for r in range(n) if r not in exits] + [conns[r] for r in listening]
        stalled = bool(multiprocessing.connection.wait(watched, max(0.0, min(ends) - now) if ends else None))


def _failures(n, results, errors, exits) -> dict[int, tuple[int, str, str]]:
    """Each failed rank's (class, what happened, in one line): killed, raised, exited without a word,
    or raised a communication error (another rank's failure)."""
    out = {}
    for rank in range(n):
        code = exits.get(rank)
        if code is not None and code < 0:
            what = f"was killed by signal {_signal_name(-code)}"
            out[rank] = (_KILLED, what, what)
        elif rank in errors:
            text, by_peer, _ = errors[rank]
            out[rank] = (_PEER if by_peer else _RAISED, f"raised:\n{text}", f"raised {text.splitlines()[0]}")
        elif code is not None and (code != 0 or rank not in results):
            what = f"exited with code {code} without reporting an error"
            out[rank] = (_EXITED, what, what)
    return out


def _raised(error) -> BaseException | None:
    """The exception a rank raised, from its ``errors`` entry (our own child's bytes over its private pipe)."""
    if error is None or error[2] is None:
        return None
    try:
        return pickle.loads(error[2])
    except Exception:  # its class cannot be imported here: the message has its text
        return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal
        return str(number)


def _failure_message(first: int, failures, ranked: list[int]) -> str:
    message = f"spawn: rank {first} {failures[first][1]}"
    others = [f"rank {r} {failures[r][2]}" for r in ranked[1:]]
    if others:
        message += "\nthe other ranks' failures (likely consequences): " + "; ".join(others)
    return message


_EOF = ("eof", None)


def _receive(conn):
    """The next message on ``conn``, ``_EOF`` once the child closed it, None if nothing is there yet."""
    try:
        if conn.poll():
            return conn.recv()
    except (EOFError, OSError):
        return _EOF
    return None


def _stop(procs) -> None:
    """Stop every rank still running: SIGTERM, then SIGKILL after the grace period; reap them all."""
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    end = time.monotonic() + _GRACE_S
    for p in alive:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
