"""lazyxla as PyTorch's current accelerator: pinned host memory, torch.accelerator queries, and CPU programs
that import lazyxla computing exactly what they compute without it.

PyTorch reports a registered PrivateUse1 backend as the current accelerator, so after ``import lazyxla``
``DataLoader(..., pin_memory=True)`` over CPU tensors asked lazyxla for a pinned-memory allocator and raised
NotImplementedError ("register PrivateUse1HooksInterface ... getPinnedMemoryAllocator").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import lazyxla


def test_lazyxla_is_the_current_accelerator_and_answers_its_queries(dev):
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("lazyxla")
    assert torch.accelerator.device_count() == len(lazyxla.devices()) == torch.lazyxla.device_count()
    assert torch.accelerator.current_device_index() == 0
    x = torch.ones(3).to(dev) * 2
    lazyxla.sync()
    torch.accelerator.synchronize()  # PyTorch's Python device guard raised "doesn't support synchronizing"
    torch.accelerator.synchronize(0)
    torch.lazyxla.synchronize(dev)
    assert x.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="out of range"):
        torch.accelerator.synchronize(len(lazyxla.devices()))


def test_synchronize_waits_for_the_work_sent_to_the_device(dev, monkeypatch):
    waited = []
    monkeypatch.setattr(torch.lazyxla, "_wait", lambda: waited.append(True))
    torch.accelerator.synchronize()
    assert waited == [True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("shape", [(), (0,), (2, 3)], ids=["0d", "empty", "2x3"])
def test_pin_memory_copies_into_pinned_host_memory(dtype, shape):
    t = (torch.arange(int(torch.Size(shape).numel())).reshape(shape) % 3).to(dtype)
    assert not t.is_pinned()
    p = t.pin_memory()
    assert p.device.type == "cpu" and p.is_pinned() and not t.is_pinned()
    assert torch.equal(p, t) and p.dtype == dtype and p.stride() == t.stride()
    assert p.pin_memory() is p  # pinning pinned memory again is a no-op, as in PyTorch
    before = t.clone()
    p.fill_(1)  # a copy: changing it leaves the original alone
    assert torch.equal(t, before)


def test_pinned_views_and_storages():
    p = torch.arange(6.0).reshape(2, 3).pin_memory()
    assert p[1].is_pinned() and p.t().is_pinned()  # views of pinned memory are pinned
    assert not p.t().contiguous().is_pinned()  # a new tensor is not
    q = torch.arange(6.0).reshape(2, 3).t().pin_memory()
    assert q.stride() == (1, 3) and torch.equal(q, torch.arange(6.0).reshape(2, 3).t())
    s = torch.arange(4.0).untyped_storage().pin_memory()
    assert s.is_pinned() and s.tolist() == torch.arange(4.0).untyped_storage().tolist()


def test_pin_memory_keeps_autograd():
    w = torch.ones(2, requires_grad=True)
    w.pin_memory().mul(3).sum().backward()
    assert w.grad.tolist() == [3.0, 3.0]


def test_device_tensors_are_not_pinned_and_cannot_be_pinned(dev):
    x = torch.ones(2).to(dev) + 1
    assert not x.is_pinned()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        x.pin_memory()
    assert lazyxla.metrics.counters()["syncs"] == 0  # neither read the tensor


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_with_pin_memory_pins_cpu_batches(workers):
    ds = TensorDataset(torch.randn(8, 2), torch.arange(8))
    batches = list(DataLoader(ds, batch_size=4, pin_memory=True, num_workers=workers))
    assert len(batches) == 2
    for i, (x, y) in enumerate(batches):
        assert x.is_pinned() and y.is_pinned()
        assert torch.equal(x, ds.tensors[0][4 * i : 4 * i + 4]) and torch.equal(y, ds.tensors[1][4 * i : 4 * i + 4])


def test_pinned_batches_moved_non_blocking_onto_the_device(dev):
    """Hugging Face's path: a pin_memory DataLoader, then ``.to(dev, non_blocking=True)``."""
    ds = TensorDataset(torch.randn(12, 3), torch.randint(0, 5, (12,)))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 5)
    dev_model = torch.nn.Linear(3, 5).to(dev)
    dev_model.load_state_dict(model.state_dict())
    for x, y in DataLoader(ds, batch_size=4, pin_memory=True):
        expected = torch.nn.functional.cross_entropy(model(x), y)
        got = torch.nn.functional.cross_entropy(dev_model(x.to(dev, non_blocking=True)), y.to(dev, non_blocking=True))
        torch.testing.assert_close(got.cpu(), expected)


def test_device_loader_over_a_pin_memory_dataloader(dev):
    ds = TensorDataset(torch.arange(24.0).reshape(8, 3), torch.arange(8))
    seen = [(x.cpu(), y.cpu()) for x, y in lazyxla.DeviceLoader(DataLoader(ds, batch_size=4, pin_memory=True), dev)]
    assert len(seen) == 2
    for i, (x, y) in enumerate(seen):
        assert torch.equal(x, ds.tensors[0][4 * i : 4 * i + 4]) and torch.equal(y, ds.tensors[1][4 * i : 4 * i + 4])


# A CPU training loop that touches what importing lazyxla could change: the CPU RNG (init, shuffling,
# dropout), a pin_memory DataLoader, autograd, an optimizer with state. It prints every loss and every
# parameter bit for bit.
_CPU_TRAINING = textwrap.dedent(
    """
    import json, sys
    import torch
    if sys.argv[1] == "with":
        import lazyxla  # noqa: F401
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
    losses, pinned = [], []
    for epoch in range(2):
        for x, y in DataLoader(data, batch_size=16, shuffle=True, pin_memory=True):
            pinned.append(x.is_pinned())
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item().hex())
    params = [p.detach().numpy().tobytes().hex() for p in model.parameters()]
    print(json.dumps({"losses": losses, "params": params, "pinned": pinned, "rng": torch.rand(2).tolist()}))
    """
)


def _train_on_cpu(which: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CPU_TRAINING, which],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LAZYXLA_PERSISTENT_CACHE": "0"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_cpu_training_loop_is_bit_identical_with_and_without_lazyxla_imported():
    without, with_lazyxla = _train_on_cpu("without"), _train_on_cpu("with")
    assert with_lazyxla["losses"] == without["losses"]
    assert with_lazyxla["params"] == without["params"]
    assert with_lazyxla["rng"] == without["rng"]
    assert len(with_lazyxla["losses"]) == 6 and all(with_lazyxla["pinned"])  # lazyxla pinned every batch
