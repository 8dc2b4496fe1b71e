"""``torch_xla.distributed.parallel_loader`` (``pl``) on lazyxla: ``MpDeviceLoader`` and ``ParallelLoader``.

Batches are moved to the device ahead of use by ``lazyxla.DeviceLoader``'s background thread. As in
torch_xla, every ``next()`` first marks the step (``xm.mark_step()``: the previous step's program runs
and step closures fire), so a training loop over the loader needs no ``mark_step`` of its own.

Example::

    import torch_xla.distributed.parallel_loader as pl
    for x, y in pl.MpDeviceLoader(train_loader, xm.xla_device()):
        loss = loss_fn(model(x), y)
        loss.backward()
        xm.optimizer_step(opt)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch

import lazyxla
from lazyxla.compat._common import missing_attribute, unsupported
from lazyxla.compat.torch_xla.core import xla_model as xm
from lazyxla.device.devices import on_device
from lazyxla.lazy.special import upload
from lazyxla.parallel.buckets import as_buckets
from lazyxla.util import map_tensors

__all__ = ["MpDeviceLoader", "ParallelLoader", "PerDeviceLoader"]


def _device(d) -> torch.device:
    d = torch.device(d)
    return torch.device(d.type, 0) if on_device(d) and d.index is None else d


def _batch_size(batch, dim: int):
    sizes = []
    map_tensors(batch, lambda t: sizes.append(t.shape[dim]) or t)
    return sizes[0] if sizes else None


def _tensor_mover(device: torch.device, spec=None):
    """CPU tensors to ``device``, laid out by the ``xs.ShardingSpec`` ``spec`` if given (else replicated, see
    :func:`_mark_replicated`); others as they are."""
    if spec is not None:
        return lambda t: spec._move(t, device) if t.device.type == "cpu" else t
    # upload, not t.to: the background thread must record nothing (lazyxla.lazy.special.upload)
    return lambda t: _mark_replicated(upload(t, device)) if t.device.type == "cpu" else t


def _mark_replicated(t: torch.Tensor) -> torch.Tensor:
    """``t`` annotated as replicated over every device in SPMD mode (as it is otherwise).

    torch_xla's loader sends a tensor no sharding spec covers with an explicit replicated sharding (its
    ``_get_xla_sharding_spec`` reads ``'{replicated}'``), where ``.to('xla')`` leaves a tensor without one
    (``''``); users and torch_xla's tests read the difference."""
    if lazyxla.spmd.is_enabled():
        lazyxla.spmd.mark_sharding(t, _every_device_mesh(), (None,) * t.dim())
    return t


@functools.cache
def _every_device_mesh() -> lazyxla.spmd.Mesh:
    """A one-axis mesh over all the run's devices (the same object for every batch)."""
    return lazyxla.spmd.mesh((-1,), ("replica",))


def _batch_mover(device: torch.device, input_sharding):
    """The function that moves one batch to ``device``: every tensor with the one ``input_sharding``, or, for a
    dict of shardings, each key's tensor with its own (as torch_xla: the batch must then be a dict, and a key
    the dict does not name is a KeyError, unless the dict is empty: then nothing is sharded)."""
    if not isinstance(input_sharding, dict):
        move = _tensor_mover(device, input_sharding)
        return lambda batch: map_tensors(batch, move)
    movers = {key: _tensor_mover(device, spec) for key, spec in input_sharding.items()}
    plain = _tensor_mover(device)

    def move_dict(batch):
        if not isinstance(batch, dict):
            raise ValueError(
                f"input batch should be a dict when input sharding is a dict; got a {type(batch).__name__}"
            )
        missing = [key for key in batch if movers and key not in movers]
        if missing:
            raise KeyError(f"Keys: {missing} are missing from input_sharding.")
        return {key: map_tensors(value, movers.get(key, plain)) for key, value in batch.items()}

    return move_dict


class _Source:
    """The wrapped loader's batches, padded to their bucket (``buckets``) and moved to the device by ``move``
    (this runs in DeviceLoader's thread); with ``fixed_batch_size`` it stops at the first batch whose size
    (after padding) differs from the first one's."""

    def __init__(self, loader: Iterable, move, fixed_batch_size: bool, batchdim: int, buckets=None) -> None:
        self.loader, self.move, self.fixed, self.batchdim = loader, move, fixed_batch_size, batchdim
        self.buckets = buckets

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        first = None
        for batch in self.loader:
            if self.buckets is not None:  # on the host, before the transfer
                batch = self.buckets(batch)
            if self.fixed:
                size = _batch_size(batch, self.batchdim)
                if first is None:
                    first = size
                elif size != first:
                    break
            yield self.move(batch)


class ParallelLoader:
    """Wraps a DataLoader so that its batches reach ``devices`` in the background.

    lazyxla drives one device per process, so ``devices`` holds one device (torch_xla's thread-per-device
    replication is ``xmp.spawn`` or SPMD here). ``device_prefetch_size`` batches are kept ready;
    ``input_sharding`` (an ``xs.ShardingSpec``, or a dict of them for dict batches: one per key) lays batch
    tensors out in SPMD mode.
    ``loader_prefetch_size`` and ``host_to_device_transfer_threads`` are accepted and unused.
    ``pad_to_buckets`` (lazyxla's, not torch_xla's: bucket lengths or a ``lazyxla.Buckets``) pads variable-length
    batches on the host to a few shapes, as ``lazyxla.DeviceLoader`` does.

    Example::

        para = pl.ParallelLoader(train_loader, [dev])
        for x, y in para.per_device_loader(dev): ...
        pl.MpDeviceLoader(hf_dataloader, dev, pad_to_buckets=(128, 256, 512))   # one compile per bucket
    """

    def __init__(
        self,
        loader: Iterable,
        devices,
        batchdim: int = 0,
        fixed_batch_size: bool = False,
        loader_prefetch_size: int = 16,
        device_prefetch_size: int = 8,
        host_to_device_transfer_threads: int = 1,
        input_sharding=None,
        *,
        pad_to_buckets=None,
    ) -> None:
        self._loader = loader
        self._devices = [_device(d) for d in devices]
        if len(self._devices) != 1:
            unsupported(
                "torch_xla.distributed.parallel_loader.ParallelLoader over "
                f"{len(self._devices)} devices in one process",
                "one device per process (xmp.spawn, or SPMD with xs.ShardingSpec)",
            )
        move = _batch_mover(self._devices[0], input_sharding)
        source = _Source(loader, move, fixed_batch_size, batchdim, as_buckets(pad_to_buckets))
        self._device_loader = lazyxla.DeviceLoader(
            source, self._devices[0], prefetch=max(1, int(device_prefetch_size)), sync_each_step=False
        )
        self._iterator = iter(self._device_loader)  # starts the background transfers, as torch_xla does

    def per_device_loader(self, device) -> PerDeviceLoader:
        """The iterator of ``device``'s batches.

        Example::

            for batch in para.per_device_loader(dev): ...
        """
        device = _device(device)
        if device not in self._devices:
            raise ValueError(f"ParallelLoader: {device} is not one of its devices {self._devices}")
        return PerDeviceLoader(self, device)

    def per_device_samples(self) -> int:
        """Batches each device gets."""
        return len(self._loader) // len(self._devices)

    def next_item(self, device):
        """The next batch for ``device``, or None at the end."""
        try:
            return next(self._iterator)
        except StopIteration:
            return None

    def close(self) -> None:
        """Stop the background thread (and the DataLoader's workers)."""
        self._iterator.close()


class PerDeviceLoader:
    """One device's batches; every ``next()`` marks the step first (``xm.mark_step()``).

    Example::

        loader = para.per_device_loader(dev)
        x, y = next(loader)
    """

    def __init__(self, loader: ParallelLoader, device) -> None:
        self._loader = loader
        self._device = device

    def __iter__(self) -> PerDeviceLoader:
        return self

    def __next__(self):
        return self.next()

    def __len__(self) -> int:
        return self._loader.per_device_samples()

    def next(self):
        xm.mark_step()
        item = self._loader.next_item(self._device)
        if item is None:
            raise StopIteration
        return item


class MpDeviceLoader:
    """The loader of multi-process (one device per process) training: ``ParallelLoader(loader, [device],
    **kwargs)`` per iteration.

    Example::

        train_device_loader = pl.MpDeviceLoader(train_loader, xm.xla_device())
        for step, (data, target) in enumerate(train_device_loader): ...
    """

    def __init__(self, loader: Iterable, device, **kwargs) -> None:
        self._loader = loader
        self._device = device
        self._parallel_loader_kwargs = kwargs

    def __iter__(self) -> PerDeviceLoader:
        parallel_loader = ParallelLoader(self._loader, [self._device], **self._parallel_loader_kwargs)
        return parallel_loader.per_device_loader(self._device)

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def dataset(self):
        """The wrapped loader's dataset (a lazyxla addition: torch_xla's ``MpDeviceLoader`` has no
        ``dataset``, so accelerate's ``save_state``/``load_state``, which read it from every prepared
        loader, fail there with an AttributeError).

        Example::

            loader = pl.MpDeviceLoader(DataLoader(ds, batch_size=8), dev)
            assert loader.dataset is ds
        """
        return self.__dict__.get("_dataset", self._loader.dataset)

    @dataset.setter
    def dataset(self, value) -> None:
        # torch_xla's plain attribute is settable: Lightning's XLAStrategy sets it ("mimic a DataLoader")
        self.__dict__["_dataset"] = value


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
