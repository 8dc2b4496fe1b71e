"""The lazy runtime's state: one ``Session`` per process, the one place its history lives.

What the recorder, syncs, host reads and whole-step capture remember between two calls lives here, not in module
globals spread over ``lazy/``: the live tensors, how many were made, the epoch, the work a host read left pending,
the positions learned per key, the device RNG's stream, and whole-step capture's replay watch. One object, so that
a reader sees every piece of state a change could break, and a test can look at all of it.

One per process, not per device: a sync computes every device's pending work and the live tensors of all of them
(a step in SPMD mode is one program over every local device), the RNG stream is the process's (as
``torch.manual_seed`` seeds every device), and the epoch counts the process's syncs and reads.

Threads. The main thread records; a ``DeviceLoader``'s thread uploads batches (each upload makes a LazyTensor);
autograd's engine records a backward pass on a thread of its own. The policy (docs/architecture.md, "Threads"):

- a count whole-step capture trusts is changed by one thread only: ``recorded`` (LazyTensors made from existing
  values) is counted by the recording thread, since the only tensors another thread makes, a DeviceLoader's uploads,
  are ``fresh`` and leave it alone. (Counted as made minus fresh, two counters an upload bumped apart, an upload
  halfway on the loader's thread hid a recorded tensor, and a replay took its quiet path past a new holder of a
  buffer it donates.) ``made`` is counted by every thread, without a lock: it only tells a host read whether
  anything was made since the last one, and a count lost to a race defers left-over work to the next read. The
  replay watch (``watched``, ``touched``) changes under the session's ``lock``;
- settings scoped to a block (eager mode's metrics prefix, ``meta.shared_scalars``, a view op under inference
  mode, the Dynamo backend's and ``lazyxla.export``'s flags: ``config.scoped``) are ``ContextVar``s: they hold in
  the thread (and task) that set them only. Two blocks set flags for the whole process on purpose, because
  autograd records their backward pass on a thread of its own: a compiled region's lazy mode inside eager mode
  (``eager.disabled``) and a scanned function's ``strict`` tracing (``frontend/scan_body.py``);
- the rest (the epoch, left-pending work, positions, the RNG) is changed by the recording thread only: lazyxla
  records from one thread at a time, as torch_xla does (its per-device lock serializes the same work).

Example::

    from lazyxla.lazy.session import session
    session.made, session.epoch        # LazyTensors made so far; syncs and host reads so far
"""

from __future__ import annotations

import math
import threading

# After a captured step's replay, the ops it watches for (``Session.watched``) before giving up: other lazy work
# between two steps (an evaluation loop) does not pay the scan for long (the next replay then takes its full path).
WATCH_OPS = 256


class Session:
    """The lazy runtime's state for this process (see the module docstring); ``session`` is the one instance.

    Example::

        before = session.recorded
        y = x + 1                                  # records one op: one LazyTensor made from existing values
        assert session.recorded == before + 1
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()  # (the replay watch's: ``arm_watch``, ``touch``)
        # Every LazyTensor made since the last scan, as weak references in creation order: sync() finds pending
        # work among the live ones, and donation asks which device buffers a tensor still holds. (A list of weakrefs
        # costs a tenth of a WeakValueDictionary insert; dead ones are dropped by scans. ``list.append`` is atomic,
        # so another thread's uploads need no lock here.)
        self.live: list = []
        # How many LazyTensors were ever made (a host read that left nothing pending skips its walk over the live
        # tensors until this changes: graph.py)
        self.made = 0
        # How many of those were made from existing values: every one but fresh device data and factory results
        # (``LazyTensor(..., fresh=True)``: an upload's, ``torch.empty``'s), which cannot read or hold a replayed
        # step's buffers. A replay whose count is unchanged since the last one knows nothing was recorded meanwhile
        # (lazy/capture.py); a DeviceLoader's uploads on its own thread leave it alone.
        self.recorded = 0
        # ids of the LazyTensors a captured step's next quiet replay changes in place (lazy/capture.py arms it after
        # each replay); the first op that reads or writes one of them (or a rebinding of one: ``tensor.retarget``)
        # counts in ``touched`` and disarms it. Empty otherwise, so an op costs one truth test of an empty set. Armed,
        # each op scans its arguments; after ``WATCH_OPS`` ops the watch gives up, counting a touch.
        self.watched: set = set()
        self.touched = 0
        self.watch_left = 0
        # How many syncs, host reads and replayed steps have run: the recording between two of them is one epoch.
        # In a multi-process run host reads do not count (a read on one rank only must not change its programs).
        # lazy/positions.py tells a position that changes from step to step from the several positions of one step
        # by it.
        self.epoch = 0
        # Per read site (the read and its line), the pending nodes its last host read left (id -> weak reference; a
        # full sync computes them all and forgets them).
        self.left_pending: dict = {}
        # ``made`` when the last host read left nothing a later read would compute (only views of device data, which
        # stay pending), else None: until another LazyTensor is made, the next read skips its walk over every live
        # tensor (``all(t)`` reads each of ``t``'s pieces, all live: a walk per read made iterating quadratic).
        self.quiet_at: int | None = None
        # ``recorded`` then: when only fresh uploads and factory results were made since (a loader's next batch),
        # nothing a read would compute was recorded either (``graph.nothing_left``, asked before a replay)
        self.quiet_recorded: int | None = None
        # The last failure of the work a host read computes for the previous one (graph._compute_left_over: not
        # raised there, since the read did not need it; its tensors raise it when read)
        self.left_over_error: BaseException | None = None
        # ``host_to_device`` transfers counted at the last sync (a SyncReport says how many happened since)
        self.transfers_at_last_sync = 0
        # Called with a ``graph.Ran`` after each program a sync runs (whole-step capture watches the programs of the
        # steps it records). Empty unless a capture is recording.
        self.observers: list = []
        # lazy/positions.py: key -> (the epoch it was first used in, the positions it took then)
        self.positions: dict = {}
        # The device RNG (lazy/rng.py): the seed, and how many keys its stream has handed out
        self.seed = 0
        self.draws = 0
        # How many captured steps were replayed (with ``touched``, a replay's quiet key: lazy/capture.py)
        self.replays = 0
        # The ops_recorded count at which the recorder looks at the pending graph's size (lazy/growth.py): math.inf
        # once warned, or with the warning off; and that size once it has reached the limit, while the warning waits
        # for an op recorded from a user's line (autograd records the backward pass on a thread of its own)
        self.next_growth_check = math.inf
        self.growth_reached = 0
        # Why the last captured replay did not happen (``capture_status`` says it)
        self.last_miss = ""

    def new_epoch(self) -> None:
        """Start a new epoch: a sync, a host read (in a one-process run) or a replayed step happened.

        Example::

            session.new_epoch()
        """
        self.epoch += 1

    def arm_watch(self, ids) -> None:
        """Watch the LazyTensors ``ids`` until an op touches one or ``WATCH_OPS`` ops have run (a replay calls it).

        Example::

            session.arm_watch({id(lt)})
        """
        with self.lock:
            self.watched.clear()
            self.watched.update(ids)
            self.watch_left = WATCH_OPS

    def touch(self) -> None:
        """An op (or a rebinding) touched a watched tensor, or the watch gave up: count it and disarm.

        Example::

            session.touch()
        """
        with self.lock:
            self.touched += 1
            self.watched.clear()

    def summary(self) -> dict:
        """A summary of the state (for tests and debugging): each field's size or value.

        Example::

            session.summary()["live"]      # weak references held to LazyTensors
        """
        return {
            "live": len(self.live),
            "made": self.made,
            "recorded": self.recorded,
            "watched": len(self.watched),
            "touched": self.touched,
            "replays": self.replays,
            "epoch": self.epoch,
            "left_pending": len(self.left_pending),
            "quiet_at": self.quiet_at,
            "observers": len(self.observers),
            "positions": len(self.positions),
            "rng": (self.seed, self.draws),
            "last_miss": self.last_miss,
        }


session = Session()
