"""``CheckpointManager``: one torch.distributed.checkpoint checkpoint per step in a folder.

Each checkpoint is the folder ``<path>/<step>``: the ranks write it into ``<path>/.<step>.partial`` and rank 0
renames it into place once every rank has written and the manager's record (``.manager_metadata``: the step and
the time, JSON) is in it, so a folder named by a step is always complete; an interrupted save leaves only a
``.partial`` folder, which is ignored and replaced. Saves can run in a background thread on host copies
(``save_async``); the oldest checkpoints beyond ``max_to_keep`` are deleted; with ``chkpt_on_preemption`` a
SIGTERM makes the next ``save``/``save_async`` call (on every rank: they agree through the process group) take
a checkpoint whatever the step.

Example::

    dist.init_process_group("gloo", ...)
    manager = CheckpointManager("/ckpt/run1", save_interval=100, max_to_keep=3)
    if manager.all_steps():
        manager.restore(max(manager.all_steps()), state)
    for step in range(steps):
        ...
        manager.save_async(step, {"model": model.state_dict()})
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import signal
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dist_cp

import lazyxla
from lazyxla.compat.torch_xla.experimental.distributed_checkpoint._helpers import _sharded_cpu_state_dict
from lazyxla.compat.torch_xla.experimental.distributed_checkpoint.planners import SPMDLoadPlanner, SPMDSavePlanner
from lazyxla.util import atomic_write

__all__ = ["CheckpointManager"]

_RECORD = ".manager_metadata"
_log = logging.getLogger(__name__)


class _Record:
    """A tracked checkpoint: its step and when it was taken."""

    def __init__(self, step: int, ts: datetime.datetime) -> None:
        self.step, self.ts = step, ts

    def to_json(self) -> bytes:
        return json.dumps({"step": self.step, "ts": self.ts.isoformat()}).encode()

    @staticmethod
    def read(folder: str) -> _Record:
        with open(os.path.join(folder, _RECORD), "rb") as f:
            entry = json.loads(f.read())
        return _Record(int(entry["step"]), datetime.datetime.fromisoformat(entry["ts"]))


class _Preemption:
    """Whether this process got SIGTERM (its handler, installed from the main thread, records it and calls
    the one that was there before)."""

    def __init__(self) -> None:
        self.signalled = threading.Event()
        self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signalled.set()
        if callable(self.previous):
            self.previous(signum, frame)


class CheckpointManager:
    """Checkpoints of a state dict by step under ``path`` (a local or mounted folder), written and read with
    ``SPMDSavePlanner`` / ``SPMDLoadPlanner`` over ``process_group`` (a new group of every rank by default; a
    process group must be initialized).

    ``save_interval``: steps between checkpoints; ``max_to_keep``: how many to keep (0: all);
    ``max_pending_async``: asynchronous saves that may wait at once; ``num_of_threads``: writer threads;
    ``chkpt_on_preemption``: take a checkpoint at the step after a SIGTERM.

    Example::

        manager = CheckpointManager(path, save_interval=10, max_to_keep=2)
        manager.save(step, {"model": model.state_dict()})
    """

    def __init__(
        self,
        path: str,
        save_interval: int,
        max_to_keep: int = 0,
        max_pending_async: int = 1,
        num_of_threads: int = 1,
        process_group: dist.ProcessGroup | None = None,
        chkpt_on_preemption: bool = True,
    ) -> None:
        assert dist.is_initialized(), "A process group is required."
        assert save_interval > 0, "save_interval must be positive"
        assert max_pending_async > 0, "max_pending_async must be positive"
        assert max_to_keep >= 0, "max_to_keep must be non-negative"
        if "://" in str(path):
            raise ValueError(f"CheckpointManager: {path!r}: lazyxla writes checkpoints to local or mounted folders")
        self.base_path = os.path.abspath(os.fspath(path))
        self.save_interval, self.max_to_keep = save_interval, max_to_keep
        self.num_of_threads, self.chkpt_on_preemption = num_of_threads, chkpt_on_preemption
        self.pg = process_group or dist.new_group()
        self._async_worker_pool = ThreadPoolExecutor(max_workers=1)
        self._async_sem = threading.Semaphore(max_pending_async)
        self._async_futures: list[Future] = []
        self._save_mutex = threading.Lock()  # one checkpoint written at a time
        os.makedirs(self.base_path, exist_ok=True)
        self._tracked_chkpts = self._load_tracked_chkpts()
        self._preemption = _Preemption() if chkpt_on_preemption else None

    def _load_tracked_chkpts(self) -> deque[_Record]:
        records, invalid = [], []
        for name in sorted(os.listdir(self.base_path)):
            folder = os.path.join(self.base_path, name)
            if name.startswith(".") or not os.path.isdir(folder):
                continue
            try:
                records.append(_Record.read(folder))
            except (OSError, ValueError, KeyError, TypeError):
                invalid.append(folder)
        if invalid:
            _log.warning("CheckpointManager: ignoring invalid checkpoints: %s", invalid)
        return deque(sorted(records, key=lambda r: r.ts))

    def _get_path(self, step: int) -> str:
        return os.path.join(self.base_path, str(step))

    def _is_rank0(self) -> bool:
        return dist.get_rank(self.pg) == 0

    def _release_oldest_checkpoints(self) -> None:
        while self.max_to_keep > 0 and len(self._tracked_chkpts) > self.max_to_keep:
            oldest = self._tracked_chkpts.popleft()
            if self._is_rank0():
                shutil.rmtree(self._get_path(oldest.step), ignore_errors=True)

    def _save(self, step: int, state_dict: dict) -> None:
        """Write the checkpoint of ``step`` (the values must be computed or on the host already)."""
        with self._save_mutex:
            final, partial = self._get_path(step), os.path.join(self.base_path, f".{step}.partial")
            if self._is_rank0():
                shutil.rmtree(partial, ignore_errors=True)
                os.makedirs(partial)
            dist.barrier(group=self.pg)  # the folder is fresh before anyone writes into it
            writer = dist_cp.FileSystemWriter(partial, thread_count=self.num_of_threads, per_thread_copy_ahead=0)
            dist_cp.save(state_dict=state_dict, storage_writer=writer, planner=SPMDSavePlanner(), process_group=self.pg)
            record = _Record(step, datetime.datetime.now())
            self._tracked_chkpts = deque(r for r in self._tracked_chkpts if r.step != step)
            self._tracked_chkpts.append(record)
            if self._is_rank0():
                atomic_write(os.path.join(partial, _RECORD), record.to_json())
                shutil.rmtree(final, ignore_errors=True)
                os.replace(partial, final)  # the checkpoint appears whole
            self._release_oldest_checkpoints()
            dist.barrier(group=self.pg)

    def should_save(self, step: int) -> bool:
        """Whether ``step`` takes a checkpoint: a multiple of ``save_interval``, or a SIGTERM reached a rank
        (with ``chkpt_on_preemption``).

        Example::

            if manager.should_save(step): ...
        """
        preempted = self.chkpt_on_preemption and self.reached_preemption(step)
        if preempted:
            _log.warning("CheckpointManager: preemption at step %d, taking a checkpoint", step)
        return step % self.save_interval == 0 or preempted

    def save(self, step: int, state_dict: dict, force: bool = False) -> bool:
        """Write a checkpoint of ``state_dict`` now if ``should_save(step)`` (or ``force``); whether it did.

        Example::

            manager.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict()})
        """
        if not (self.should_save(step) or force):
            return False
        lazyxla.sync(wait=True)
        self._save(step, state_dict)
        return True

    def save_async(self, step: int, state_dict: dict, force: bool = False) -> bool:
        """Like :meth:`save`, but only the copy to the host happens now; a background thread writes it (at
        most ``max_pending_async`` wait; more block here). Whether a checkpoint was started.

        Example::

            manager.save_async(step, {"model": model.state_dict()})
            manager.join()        # before exiting
        """
        if not (self.should_save(step) or force):
            return False
        lazyxla.sync(wait=True)
        cpu_state = _sharded_cpu_state_dict(state_dict)
        self._async_sem.acquire()
        future = self._async_worker_pool.submit(self._save, step, cpu_state)
        future.add_done_callback(lambda _: self._async_sem.release())
        self._async_futures.append(future)
        return True

    def restore(self, step: int, state_dict: dict) -> None:
        """Load the checkpoint of ``step`` into ``state_dict`` in place (its tensors keep their layouts); load
        the state dict into the model or optimizer afterwards for values that are not tensors.

        Example::

            state = {"model": model.state_dict()}
            manager.restore(max(manager.all_steps()), state)
        """
        tracked = {r.step for r in self._tracked_chkpts}
        assert step in tracked, f"Cannot restore from untracked step {step}. Valid steps are: {tracked}"
        reader = dist_cp.FileSystemReader(self._get_path(step))
        dist_cp.load(state_dict=state_dict, storage_reader=reader, planner=SPMDLoadPlanner(), process_group=self.pg)

    def all_steps(self) -> list[int]:
        """The steps of the checkpoints kept, in order.

        Example::

            latest = max(manager.all_steps(), default=None)
        """
        return sorted(r.step for r in self._tracked_chkpts)

    def join(self) -> None:
        """Wait for the asynchronous saves started so far (and raise the error of one that failed).

        Example::

            manager.join()
        """
        done, _ = wait(self._async_futures)
        for future in done:
            future.result()

    def reached_preemption(self, step: int) -> bool:
        """Whether a SIGTERM reached any rank (all ranks call it at the same step and get the same answer).

        Example::

            if manager.reached_preemption(step): ...
        """
        assert self.chkpt_on_preemption, "Preemption detection not enabled: create the manager with chkpt_on_preemption"
        flag = torch.tensor([1 if self._preemption.signalled.is_set() else 0])
        if dist.get_world_size(self.pg) > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.pg)
        return bool(flag.item())
