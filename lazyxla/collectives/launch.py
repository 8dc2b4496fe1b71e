"""``lazyxla.spawn``: one process per replica on this host, joined through jax's distributed runtime.

Fail fast, never hang: the parent watches every child; when one raises or dies, the others are
stopped (SIGTERM, then SIGKILL after a grace period) and ``spawn`` raises naming that rank, with its
traceback. A child whose parent disappears exits on its own, so no process is left behind.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

_GRACE_S = 5.0  # between SIGTERM and SIGKILL when stopping the other ranks


class SpawnError(RuntimeError):
    """A spawned rank raised or died; the message names it and carries its traceback."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(message)
        self.rank = rank


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(70)  # the parent is gone: nobody will collect this rank


def _child(fn, rank, nprocs, address, store_port, cpu_devices, args, conn, parent) -> None:
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if cpu_devices:
        os.environ["LAZYXLA_CPU_DEVICES"] = str(cpu_devices)
    os.environ.update(
        LAZYXLA_COORDINATOR_ADDRESS=address,
        LAZYXLA_NUM_PROCESSES=str(nprocs),
        LAZYXLA_PROCESS_ID=str(rank),
        LAZYXLA_LOCAL_RANK=str(rank),
        # what torchrun sets, so that torch.distributed's env:// rendezvous works as under torchrun
        RANK=str(rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(nprocs),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store_port),
    )
    try:
        import lazyxla

        for name, value in (("coordinator_address", address), ("num_processes", nprocs)):
            setattr(lazyxla.config, name, value)
        lazyxla.config.process_id = rank
        lazyxla.config.local_rank = rank
        if cpu_devices:
            lazyxla.config.cpu_devices = cpu_devices
        lazyxla.runtime.initialize()
        result = fn(rank, *args)
        try:
            conn.send(("ok", result))
        except Exception as e:  # an unpicklable result
            conn.send(("ok", f"<result not sent back: {type(e).__name__}: {e}>"))
        if nprocs > 1:
            lazyxla.sync(wait=True)
            lazyxla.runtime.rendezvous("lazyxla.spawn: exit")  # nobody leaves while another still needs it
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        conn.close()
        os._exit(1)
    conn.close()


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
    ``MASTER_ADDR``, ``MASTER_PORT``), so ``torch.distributed.init_process_group("lazyxla")`` works in them.
    Returns the ranks' return values, in rank order. If a rank raises or dies, the
    others are stopped and :class:`SpawnError` names the rank with its traceback; ``timeout_s`` bounds
    the whole run the same way. ``fn`` must be importable by the children (a module-level function).
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
    store_port = _free_port()  # torch.distributed's store, for dist.init_process_group("lazyxla")
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
    finally:
        _stop(procs)


def _supervise(procs, conns, timeout_s) -> list[Any]:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    results: dict[int, Any] = {}
    running = set(range(len(procs)))
    listening = set(range(len(procs)))  # ranks whose pipe may still bring a message
    while running:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        watched = [procs[r].sentinel for r in running] + [conns[r] for r in listening]
        if not multiprocessing.connection.wait(watched, wait):
            raise SpawnError(-1, f"spawn: the run did not finish within {timeout_s} s; every rank was stopped")
        for rank in sorted(listening):
            message = _receive(conns[rank])
            if message is None:
                continue
            listening.discard(rank)
            kind, value = message
            if kind == "error":
                raise SpawnError(rank, f"spawn: rank {rank} raised:\n{value}")
            if kind == "ok":
                results[rank] = value
        for rank in sorted(running):
            code = procs[rank].exitcode
            if code is None:
                continue
            running.discard(rank)
            message = _receive(conns[rank]) if rank in listening else None
            if message is not None and message[0] == "error":
                raise SpawnError(rank, f"spawn: rank {rank} raised:\n{message[1]}")
            if message is not None:
                results[rank] = message[1]
            if code != 0 or rank not in results:
                how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                raise SpawnError(rank, f"spawn: rank {rank} {how} without reporting an error")
    return [results[r] for r in range(len(procs))]


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
