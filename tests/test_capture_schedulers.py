"""A captured step under an LR scheduler (lazy/step_world.py ``_lr_as_tensor``): an Adam/AdamW learning rate
that a scheduler changes every step becomes a device tensor the scheduler fills, so the step is replayed, and
computes what lazy mode computes with that tensor learning rate (and what CPU eager computes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazyxla
from tests.util import captured_step

_SCHEDULERS = {
    "lambda": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)),
    "linear_warmup": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4)),
    "cosine": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
    "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
}


def _run(device, captured, sched, opt_kind="adamw", tensor_lr=False, steps=12):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(device)
    lr = torch.tensor(0.01, device=device) if tensor_lr else 0.01
    capturable = {} if device.type == "cpu" or opt_kind == "sgd" else {"capturable": True}
    if opt_kind == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, **capturable)
    elif opt_kind == "adamw_fused":  # HF Trainer's default optimizer
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, fused=True)
    elif opt_kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False, **capturable)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scheduler = _SCHEDULERS[sched](opt)

    step = captured_step(lambda x, y: F.mse_loss(model(x), y), opt, captured)
    g = torch.Generator().manual_seed(1)
    losses, lrs = [], []
    lazyxla.metrics.reset()
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        losses.append(step(x.to(device), y.to(device)).item())
        scheduler.step()
        lrs.append(float(scheduler.get_last_lr()[0]))
    params = [p.detach().cpu() for p in model.parameters()]
    return losses, params, lrs, lazyxla.metrics.counters().get("capture_replays", 0), opt


@pytest.mark.parametrize("sched", list(_SCHEDULERS))
@pytest.mark.parametrize("opt_kind", ["adamw", "adam", "adamw_fused"])
def test_a_scheduled_learning_rate_is_replayed_and_equals_lazy_mode(dev, sched, opt_kind):
    lazy = _run(dev, False, sched, opt_kind, tensor_lr=True)  # lazy mode, the learning rate a tensor from the start
    replayed = _run(dev, True, sched, opt_kind)  # a float learning rate, made a tensor by capture
    assert replayed[3] >= 7, replayed[3]  # every step but the first few is replayed
    assert lazy[0] == replayed[0]
    assert lazy[2] == replayed[2]  # the schedule itself
    for a, b in zip(lazy[1], replayed[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert isinstance(replayed[4].param_groups[0]["lr"], torch.Tensor)


@pytest.mark.parametrize("sched", ["lambda", "cosine"])
def test_a_scheduled_learning_rate_matches_cpu_eager(dev, sched):
    eager = _run(torch.device("cpu"), None, sched)
    replayed = _run(dev, True, sched)
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(eager[0]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(replayed[2]), torch.tensor(eager[2]), rtol=1e-6, atol=0)
    for a, b in zip(eager[1], replayed[1]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_sgd_under_a_scheduler_is_recorded_each_step_and_stays_right(dev):
    """SGD's learning rate stays a Python number (its step would read a tensor one on the host): each call is
    recorded, with lazy mode's numbers."""
    lazy = _run(dev, False, "lambda", "sgd")
    captured = _run(dev, True, "lambda", "sgd")
    assert captured[3] == 0
    assert lazy[0] == captured[0]
    assert type(captured[4].param_groups[0]["lr"]) is float


def test_no_scheduler_keeps_a_float_learning_rate(dev):
    torch.manual_seed(0)
    model = nn.Linear(4, 2).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    @lazyxla.compile(capture=True)
    def step(x):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(4):
        step(torch.randn(3, 4).to(dev))
    assert type(opt.param_groups[0]["lr"]) is float and opt.param_groups[0]["capturable"] is True
