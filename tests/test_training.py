"""End to end: MLP, CNN and GPT train on lazyxla exactly like CPU eager, and compile once."""

from __future__ import annotations

import copy
import math

import jax
import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.lazy.tensor import unwrap
from tests.models import CNN, GPT, MLP

STEPS = 10


def _data(kind: str):
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        return MLP(), torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g), F.cross_entropy
    if kind == "cnn":
        return CNN(), torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g), F.cross_entropy
    x = torch.randint(0, 64, (2, 16), generator=g)
    y = torch.randint(0, 64, (2, 16), generator=g)
    return GPT(), x, y, lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten(), label_smoothing=0.1)


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
}


def _train(model, x, y, loss_fn, make_opt, device, schedule=False, on_step=None):
    model = model.to(device)
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS) if schedule else None
    x, y = x.to(device), y.to(device)
    losses = []
    for step in range(STEPS):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        if device.type == "lazyxla":
            lazyxla.sync()
        losses.append(loss.detach())
        if on_step is not None:
            on_step(step)
    return [float(v.item()) for v in losses], {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw"])
@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_training_matches_eager_and_compiles_once(kind, opt, dev):
    torch.manual_seed(0)
    model, x, y, loss_fn = _data(kind)
    model_dev = copy.deepcopy(model)
    ref_losses, ref_state = _train(model, x, y, loss_fn, OPTIMIZERS[opt], torch.device("cpu"))

    compiles = []
    _, _ = None, None

    def on_step(step):
        compiles.append(lazyxla.metrics.counters()["compiles"])

    lazyxla.metrics.reset()
    losses, state = _train(model_dev, x, y, loss_fn, OPTIMIZERS[opt], dev, schedule=False, on_step=on_step)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    for name, ref in ref_state.items():
        torch.testing.assert_close(state[name], ref, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    # steps 3..10 compile nothing
    assert compiles[2:] == [compiles[1]] * (STEPS - 2), compiles
    assert not any(k.startswith("fallback.") for k in lazyxla.metrics.counters()), lazyxla.metrics.counters()


def test_cosine_lr_schedule_does_not_recompile(dev):
    torch.manual_seed(0)
    model, x, y, loss_fn = _data("mlp")
    ref_losses, ref_state = _train(copy.deepcopy(model), x, y, loss_fn, OPTIMIZERS["adamw"], torch.device("cpu"), True)
    compiles = []
    losses, state = _train(
        model,
        x,
        y,
        loss_fn,
        OPTIMIZERS["adamw"],
        dev,
        schedule=True,
        on_step=lambda s: compiles.append(lazyxla.metrics.counters()["compiles"]),
    )
    assert compiles[2:] == [compiles[1]] * (STEPS - 2), compiles
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    for name, ref in ref_state.items():
        torch.testing.assert_close(state[name], ref, rtol=1e-4, atol=1e-5)


def test_parameters_are_donated(dev):
    """A step does not keep two copies of the parameters: their old buffers are donated to the update."""
    torch.manual_seed(0)
    model, x, y, loss_fn = _data("mlp")
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = x.to(dev), y.to(dev)
    for _ in range(3):
        old = [unwrap(p)._value[0].payload for p in model.parameters()]
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
    assert all(isinstance(a, jax.Array) for a in old)
    assert all(a.is_deleted() for a in old), "old parameter buffers are still alive after the step"
    new = [unwrap(p)._value[0].payload for p in model.parameters()]
    assert not any(a.is_deleted() for a in new)


def test_a_held_buffer_is_not_donated_by_a_program_compiled_when_it_was_free(dev):
    """The same graph compiled while an input was free (donated) must not run when a tensor holds it."""
    x = torch.ones(4).to(dev)
    keep = None
    for i in range(4):
        if i == 2:
            keep = x  # from now on the step's input is still held after the step
        x = x + 1
        lazyxla.sync()
    assert x.cpu().tolist() == [5.0] * 4
    assert keep.cpu().tolist() == [3.0] * 4


def test_manual_seed_seeds_the_device(dev):
    torch.manual_seed(123)
    a = torch.randn(5, device=dev).cpu()
    b = torch.randn(5, device=dev).cpu()
    torch.manual_seed(123)
    a2 = torch.randn(5, device=dev).cpu()
    assert torch.equal(a, a2) and not torch.equal(a, b)


def test_dropout_masks_differ_and_do_not_recompile(dev):
    torch.manual_seed(0)
    x = torch.ones(64, 64, device=dev)
    lazyxla.sync()
    masks, compiles = [], []
    for _ in range(5):
        out = F.dropout(x, 0.5, training=True)
        lazyxla.sync()
        masks.append(out.cpu())
        compiles.append(lazyxla.metrics.counters()["compiles"])
    assert compiles[1:] == [compiles[0]] * 4
    assert not torch.equal(masks[0], masks[1])
    for m in masks:
        assert set(m.unique().tolist()) <= {0.0, 2.0}
        assert abs((m == 0).float().mean().item() - 0.5) < 0.05


def test_gpt_with_dropout_trains_without_recompiling(dev):
    torch.manual_seed(0)
    model = GPT(dropout=0.1).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 64, (2, 16)).to(dev)
    compiles = []
    losses = []
    for _ in range(6):
        loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        losses.append(loss.item())
        compiles.append(lazyxla.metrics.counters()["compiles"])
    assert compiles[2:] == [compiles[1]] * 4, compiles
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


def test_item_in_the_middle_of_a_training_step(dev):
    """Reading the loss before backward() splits the step, and the rest of the step still matches eager."""
    torch.manual_seed(0)
    model, x, y, loss_fn = _data("mlp")
    ref = copy.deepcopy(model)
    results = []
    for m, device in ((ref, torch.device("cpu")), (model.to(dev), dev)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        xd, yd = x.to(device), y.to(device)
        seen = []
        for _ in range(3):
            loss = loss_fn(m(xd), yd)
            seen.append(loss.item())  # host read mid-step
            loss.backward()
            opt.step()
            opt.zero_grad()
            if device.type == "lazyxla":
                lazyxla.sync()
        results.append((seen, {k: v.detach().cpu() for k, v in m.state_dict().items()}))
    (ref_seen, ref_state), (seen, state) = results
    torch.testing.assert_close(torch.tensor(seen), torch.tensor(ref_seen), rtol=1e-5, atol=1e-6)
    for k in ref_state:
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_activation_checkpointing_replays_dropout(p, dev):
    """torch.utils.checkpoint recomputes the forward in backward with the RNG state saved in the forward."""
    from torch.utils.checkpoint import checkpoint

    def run(device, use_checkpoint):
        torch.manual_seed(0)
        lin = torch.nn.Linear(8, 8).to(device)
        x = torch.randn(4, 8).to(device).requires_grad_()

        def f(x):
            return F.dropout(lin(x), p, training=True).sin()

        y = checkpoint(f, x, use_reentrant=False) if use_checkpoint else f(x)
        grads = torch.autograd.grad(y.sum(), [x, lin.weight])
        return [t.cpu() for t in (y, *grads)]

    plain, checkpointed = run(dev, False), run(dev, True)
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(a, b)
    if p == 0.0:
        for a, b in zip(run("cpu", False), checkpointed):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
