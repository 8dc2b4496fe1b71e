"""A full sync computes a view, not also its base (lazy/rebase.py): values stay those of CPU eager.

nn.Linear's weight gradient is a transpose of the product autograd computes, and functionalization keeps the
product alive as the gradient's storage. With ``zero_grad()`` at the top of the loop the gradients are alive at
the sync, and the program returned the product and its transpose (twice the gradients' memory).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazyxla


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 5))


def _batches(n):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)) for _ in range(n)]


def _grad_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("idiom", ["zero_grad_at_top", "zero_grad_after_step", "accumulate_two"])
@pytest.mark.parametrize("opt_kind", ["sgd_momentum", "adamw_foreach", "adamw_fused"])
def test_training_idioms_equal_cpu_and_return_each_gradient_once(dev, idiom, opt_kind):
    make = {
        "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
        "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    }[opt_kind]
    ref = _mlp()
    model = copy.deepcopy(ref).to(dev)
    opts = {"cpu": make(ref.parameters()), "dev": make(model.parameters())}
    losses = {"cpu": [], "dev": []}
    reports = []
    for step, (x, y) in enumerate(_batches(6)):
        for where, m in (("cpu", ref), ("dev", model)):
            opt = opts[where]
            xx, yy = (x, y) if where == "cpu" else (x.to(dev), y.to(dev))
            if idiom == "zero_grad_at_top" or (idiom == "accumulate_two" and step % 2 == 0):
                opt.zero_grad()
            loss = F.cross_entropy(m(xx), yy)
            loss.backward()
            if idiom != "accumulate_two" or step % 2 == 1:
                opt.step()
            if idiom == "zero_grad_after_step":
                opt.zero_grad()
            if where == "dev":
                reports.append(lazyxla.sync())
            losses[where].append(loss)
    assert torch.allclose(torch.stack([v.cpu() for v in losses["dev"]]), torch.stack(losses["cpu"]), atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-5)
        if q.grad is not None:
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
    if idiom == "zero_grad_at_top" and opt_kind == "sgd_momentum":
        # a warm step returns the parameters and momenta (in donated buffers), each gradient once, and the loss
        (program,) = reports[-1].programs
        assert program.new_bytes == _grad_bytes(model) + 4, reports[-1]


def test_a_base_read_after_the_sync_is_its_view_inverted(dev):
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    y = a.to(dev) @ b.to(dev)
    v = y.t()  # a view: its base y is left out of the program and derived from v's result
    r = y.reshape(2, 10)  # another view of the same base
    lazyxla.sync()
    torch.testing.assert_close(y.cpu(), a @ b)
    torch.testing.assert_close(v.cpu(), (a @ b).t())
    torch.testing.assert_close(r.cpu(), (a @ b).reshape(2, 10))


@pytest.mark.parametrize(
    "view",
    [
        lambda y: y.t(),
        lambda y: y.transpose(0, 1),
        lambda y: y.permute(1, 0),
        lambda y: y.view(-1),
        lambda y: y.unsqueeze(0),
        lambda y: y.reshape(4, 5),
    ],
)
def test_mutating_the_view_after_the_sync_updates_the_base(dev, view):
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    want = (a @ b).clone()
    y = a.to(dev) @ b.to(dev)
    v = view(y)
    lazyxla.sync()
    v.mul_(2).add_(1)
    view(want).mul_(2).add_(1)
    torch.testing.assert_close(y.cpu(), want)
    y.sub_(3)  # and the other way round
    want.sub_(3)
    torch.testing.assert_close(v.cpu(), view(want))


def test_views_kept_across_steps_do_not_grow_programs(dev):
    """A base left as a view of device data stays pending through later syncs: nothing recompiles, and it is
    computed where it is read."""
    w = torch.randn(6, 4).to(dev)
    x = torch.randn(3, 6).to(dev)
    held = []
    compiles = []
    for _ in range(4):
        y = x @ w  # pending
        held.append((y, y.t()))  # both alive at the sync
        w = w * 0.5
        lazyxla.sync()
        compiles.append(lazyxla.metrics.counters()["compiles"])
    assert compiles[1:] == [compiles[1]] * 3, compiles
    xc, wc = x.cpu(), w.cpu() * 16
    for k, (y, yt) in enumerate(held):
        want = xc @ (wc * 0.5**k)
        torch.testing.assert_close(y.cpu(), want)
        torch.testing.assert_close(yt.cpu(), want.t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_dtypes_and_empty(dev, dtype):
    for shape in ((0, 3), (2, 3), (1, 1)):
        base = torch.arange(max(1, shape[0] * shape[1])).reshape(-1)[: shape[0] * shape[1]].reshape(shape).to(dtype)
        y = base.to(dev) * 2
        v = y.t()
        lazyxla.sync()
        assert torch.equal(y.cpu(), base * 2) and torch.equal(v.cpu(), (base * 2).t())


@pytest.mark.parametrize(
    "view",
    [
        lambda y: torch.ops.aten._reshape_copy(y, [20]),
        lambda y: y.view(4, 5),
        lambda y: y.mT,
    ],
)
def test_every_reshape_and_transpose_is_computed_without_its_base(dev, view):
    """Each reshape of ``lazy/views.py``'s table is invertible: the sync returns the view only (its base derived
    again). Before the one table, rebase did not count ``_reshape_copy`` as a reshape: both came out."""
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    y = a.to(dev) @ b.to(dev)
    v = view(y)
    (program,) = lazyxla.sync().programs
    assert program.new_bytes == 20 * 4, program
    torch.testing.assert_close(y.cpu(), a @ b)
    torch.testing.assert_close(v.cpu(), view(a @ b))
