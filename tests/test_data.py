"""lazyxla.DeviceLoader: prefetching to the device, a sync per step, clean shutdown."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import lazyxla


def _dataset(n=20):
    return TensorDataset(torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n))


def _loader_threads():
    return [t for t in threading.enumerate() if t.name == "lazyxla-DeviceLoader"]


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_arrive_on_the_device_in_order(dev, workers):
    ds = _dataset()
    loader = lazyxla.DeviceLoader(DataLoader(ds, batch_size=4, num_workers=workers), dev)
    assert len(loader) == 5
    syncs = lazyxla.metrics.counters()["syncs"]
    seen = []
    for x, y in loader:
        assert x.device.type == "lazyxla" and y.device.type == "lazyxla"
        seen.append(((x * 2).cpu(), y.cpu()))
    assert len(seen) == 5
    for i, (x2, y) in enumerate(seen):
        assert torch.equal(x2, ds.tensors[0][4 * i : 4 * i + 4] * 2)
        assert torch.equal(y, ds.tensors[1][4 * i : 4 * i + 4])
    assert lazyxla.metrics.counters()["syncs"] - syncs >= 5  # one per step at least (reads sync too)
    assert not _loader_threads()


def _every_kind_of_batch(i):
    """One batch of every dtype and shape class a loader meets, some tensors non-contiguous."""
    ids = torch.arange(40).reshape(4, 10) + i
    return {
        "input_ids": ids[:, :-1],  # a non-contiguous slice: .to(device) records empty, then copies
        "labels": ids[:, 1:],
        "mask": ids[:, :-1] % 3 == 0,
        "pixels": torch.randn(2, 3, 4).to(torch.bfloat16).transpose(1, 2),
        "scale": torch.tensor(0.5 + i),
        "empty": torch.zeros(0, 3),
    }


def _loader_cases(dev):
    import lazyxla.compat  # why here: the compat layer's loader, installed only for this case

    lazyxla.compat.install()
    import torch_xla.distributed.parallel_loader as pl

    return {
        "DeviceLoader": lambda data: lazyxla.DeviceLoader(data, dev, sync_each_step=False),
        "MpDeviceLoader": lambda data: pl.MpDeviceLoader(data, dev),
    }


@pytest.mark.parametrize("kind", ["DeviceLoader", "MpDeviceLoader"])
def test_the_loader_thread_records_nothing(dev, kind):
    """A batch's move to the device records no op: a pending op the thread recorded could be taken into the
    program of a sync the main thread runs meanwhile, giving it a different program (a recompile that depends on
    timing; seen as an FSDPv2 script compiling 3 programs instead of 2 on a loaded machine)."""
    data = [_every_kind_of_batch(i) for i in range(3)]
    loader = _loader_cases(dev)[kind](data)
    recorded = lazyxla.metrics.counters()["ops_recorded"]
    batches = list(loader)  # MpDeviceLoader marks a step per next(): syncs record nothing
    assert lazyxla.metrics.counters()["ops_recorded"] == recorded
    assert len(batches) == 3
    for got, want in zip(batches, data, strict=True):
        for key, t in want.items():
            assert got[key].device == dev and got[key].dtype == t.dtype and got[key].shape == t.shape, key
            assert torch.equal(got[key].cpu(), t), key


def test_a_step_is_one_program(dev):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiles = []
    for x, y in lazyxla.DeviceLoader(DataLoader(_dataset(24), batch_size=4), dev):
        loss = ((model(x).squeeze(1) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        compiles.append(lazyxla.metrics.counters()["compiles"])
    assert compiles[3:] == [compiles[2]] * (len(compiles) - 3)  # steps after the first two compile nothing


def test_breaking_early_stops_the_thread_and_the_workers(dev):
    loader = lazyxla.DeviceLoader(DataLoader(_dataset(200), batch_size=2, num_workers=2), dev, prefetch=3)
    it = iter(loader)
    next(it)
    next(it)
    it.close()
    assert not _loader_threads()
    for x, _ in loader:  # a second pass works, and breaking out of a for loop cleans up too
        assert x.shape == (2, 3)
        break
    gc.collect()
    assert not _loader_threads()


def test_an_error_in_the_loader_reaches_the_loop(dev):
    def broken():
        yield torch.ones(2)
        raise RuntimeError("bad sample 1")

    it = iter(lazyxla.DeviceLoader(broken(), dev))
    assert next(it).device.type == "lazyxla"
    with pytest.raises(RuntimeError, match="bad sample 1"):
        next(it)
    assert not _loader_threads()


def test_bad_arguments(dev):
    with pytest.raises(ValueError, match="lazyxla device"):
        lazyxla.DeviceLoader([], "cpu")
    with pytest.raises(ValueError, match="prefetch"):
        lazyxla.DeviceLoader([], dev, prefetch=0)
