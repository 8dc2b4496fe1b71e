"""``DeviceLoader``: batches moved to the device ahead of use by a background thread; a sync per step.

Example::

    for x, y in lazyxla.DeviceLoader(train_loader, lazyxla.device()):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        lazyxla.optimizer_step(opt)
        opt.zero_grad()
    # each next() ends the previous step with lazyxla.sync(), so every step is one program

    # variable-length batches: padded on the host to one of a few lengths, one compile per length
    for batch in lazyxla.DeviceLoader(hf_dataloader, lazyxla.device(), pad_to_buckets=(64, 128, 256)):
        model(**batch).loss.backward()
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from lazyxla.device.devices import on_device
from lazyxla.lazy.graph import sync
from lazyxla.lazy.special import upload
from lazyxla.parallel import spmd
from lazyxla.parallel.buckets import Buckets, as_buckets
from lazyxla.util import map_tensors

_END = object()


def _put(q: queue.Queue, stop: threading.Event, item: Any) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _fill(loader: Iterable, prepare, q: queue.Queue, stop: threading.Event) -> None:
    """The background thread: batches from ``loader``, each ``prepare``d (padded, moved to the device), into ``q``."""
    source = iter(loader)
    try:
        for batch in source:
            if stop.is_set():
                break
            if not _put(q, stop, ("batch", prepare(batch))):
                break
    except BaseException as e:  # handed to the consumer, raised there at its next()
        _put(q, stop, ("error", e))
    finally:
        del source  # a DataLoader iterator shuts its worker processes down when dropped
        _put(q, stop, ("end", _END))


class DeviceLoader:
    """Iterate ``loader`` with every tensor of each batch already on ``device``.

    A background thread takes batches from ``loader`` (a ``torch.utils.data.DataLoader``, with or
    without workers, or any iterable) and moves them to the device, keeping up to ``prefetch`` batches
    ready. Each ``next()`` after the first syncs (ends the step that used the previous batch), as
    torch_xla's ``MpDeviceLoader`` does; ``sync_each_step=False`` leaves syncing to the loop. Breaking
    out of the loop, or deleting the iterator, stops the thread and the loader's workers.

    In SPMD mode ``input_sharding=(mesh, partition_spec)`` lays every batch tensor out sharded (see
    ``lazyxla.spmd.from_local``): the loader of each process yields only that process's part.

    ``pad_to_buckets`` (bucket lengths, or a ``lazyxla.Buckets`` for every option) pads each batch in the
    background thread, before the transfer, to the smallest bucket that holds its sequence length: attention
    masks with 0, labels with -100 (see ``lazyxla.Buckets``). A loop over variable-length batches then compiles
    once per bucket it uses instead of once per length. A batch longer than the largest bucket raises
    ``ValueError`` at the ``next()`` that would return it.

    Example::

        loader = lazyxla.DeviceLoader(DataLoader(ds, batch_size=64, num_workers=2), lazyxla.device())
        for step, (x, y) in enumerate(loader):
            ...
        buckets = lazyxla.Buckets((128, 256, 512), pad_values={"input_ids": tokenizer.pad_token_id})
        for batch in lazyxla.DeviceLoader(hf_dataloader, lazyxla.device(), pad_to_buckets=buckets):
            loss = model(**batch).loss
    """

    def __init__(
        self,
        loader: Iterable,
        device: torch.device | str,
        prefetch: int = 2,
        sync_each_step: bool = True,
        input_sharding: tuple | None = None,
        *,
        pad_to_buckets: Buckets | Sequence[int] | None = None,
    ) -> None:
        if prefetch < 1:
            raise ValueError(f"DeviceLoader: prefetch must be at least 1, got {prefetch}")
        self.loader = loader
        self.device = torch.device(device)
        if not on_device(self.device):
            raise ValueError(f"DeviceLoader moves batches to a lazyxla device, got {self.device}")
        self.prefetch = prefetch
        self.sync_each_step = sync_each_step
        if input_sharding is not None:
            spmd._require_spmd("DeviceLoader(input_sharding=...)")
            mesh, spec = input_sharding
            self.move = lambda t: spmd.from_local(t, mesh, spec)
        else:
            self.move = lambda t: upload(t, self.device)  # records nothing: see upload
        self.buckets = as_buckets(pad_to_buckets)

    def _prepare(self, batch: Any) -> Any:
        """A batch as the loop gets it (this runs in the background thread): padded on the host, then moved."""
        if self.buckets is not None:
            batch = self.buckets(batch)
        return map_tensors(batch, self.move)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> _DeviceIterator:
        return _DeviceIterator(self)


class _DeviceIterator(Iterator):
    def __init__(self, owner: DeviceLoader) -> None:
        self._owner = owner
        self._queue: queue.Queue = queue.Queue(maxsize=owner.prefetch)
        self._stop = threading.Event()
        self._started = False
        self._done = False
        # The thread must not hold the iterator: a loop that breaks drops it, and __del__ stops the thread.
        self._thread = threading.Thread(
            target=_fill,
            args=(owner.loader, owner._prepare, self._queue, self._stop),
            name="lazyxla-DeviceLoader",
            daemon=True,
        )
        self._thread.start()

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self._started and self._owner.sync_each_step:
            sync()
        self._started = True
        kind, value = self._queue.get()
        if kind == "batch":
            return value
        self.close()
        if kind == "error":
            raise value
        if self._owner.sync_each_step:
            sync()
        raise StopIteration

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the background thread (and with it the loader's workers); idempotent.

        A loader blocked for more than ``timeout_s`` in producing its next batch is left to finish in
        the (daemon) thread.
        """
        self._done = True
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and time.monotonic() < deadline:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(0.05)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
