"""Tied parameters and buffers stay one object across lazyxla moves, and tied models train like eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazyxla
from lazyxla.frontend import modules

TOL = {"rtol": 1e-4, "atol": 1e-5}  # the rule of tests/test_training.py


class TiedLM(nn.Module):
    """A toy LM whose output projection is its embedding, with a buffer shared by two submodules."""

    def __init__(self, vocab: int = 32, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        scale = torch.linspace(0.5, 1.5, width)
        self.hidden.register_buffer("scale", scale)
        self.head.register_buffer("scale", scale)

    def forward(self, x):
        h = torch.tanh(self.hidden(self.embed(x)) * self.hidden.scale)
        return self.head(h * self.head.scale)


def _assert_tied(m: TiedLM):
    assert m.head.weight is m.embed.weight
    assert m.head.scale is m.hidden.scale
    assert len(list(m.parameters())) == 3


def test_tied_weights_and_buffers_survive_the_move_and_back(dev):
    m = TiedLM()
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    m.to(dev)
    _assert_tied(m)
    assert m.embed.weight.device.type == "lazyxla" and m.hidden.scale.device.type == "lazyxla"
    m.to("cpu")
    _assert_tied(m)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, ref[k], rtol=0, atol=0)


def test_one_device_copy_and_one_gradient(dev):
    m = TiedLM()
    F.cross_entropy(m(torch.tensor([[1, 2, 3]])).flatten(0, 1), torch.tensor([2, 3, 4])).backward()
    m.to(dev)
    _assert_tied(m)
    assert m.embed.weight.grad is not None and m.embed.weight.grad.device.type == "lazyxla"
    m.half()  # a lazyxla -> lazyxla conversion keeps the tie too
    _assert_tied(m)
    assert m.embed.weight.dtype == torch.float16


def test_a_shared_submodule_and_an_optimizer_see_one_parameter(dev):
    lin = nn.Linear(4, 4)
    m = nn.Sequential(lin, nn.ReLU(), lin).to(dev)
    assert m[0] is m[2]
    opt = torch.optim.AdamW(TiedLM().to(dev).parameters())
    assert sum(len(g["params"]) for g in opt.param_groups) == 3


def _cpu_only_conversions(m: nn.Module) -> nn.Module:
    m.to(torch.float64)
    m.half()
    m._apply(lambda t: t + 1)  # not idempotent: PyTorch converts a tied tensor once per attribute
    return m


def test_cpu_only_conversions_behave_exactly_as_pytorch():
    """Importing lazyxla changes no CPU program: the same objects, the same values as PyTorch's own _apply."""
    ours, theirs = TiedLM(), TiedLM()
    theirs.load_state_dict(ours.state_dict())
    before = [id(p) for p in ours.parameters()]
    _cpu_only_conversions(ours)
    wrapped = nn.Module._apply
    try:
        nn.Module._apply = modules._original_apply
        _cpu_only_conversions(theirs)
    finally:
        nn.Module._apply = wrapped
    assert [id(p) for p in ours.parameters()] == before  # PyTorch kept identity: nothing replaced
    assert (ours.head.scale is ours.hidden.scale) == (theirs.head.scale is theirs.hidden.scale)
    for (k, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_overwrite_on_conversion_keeps_pytorchs_meaning_on_cpu():
    """With ``overwrite_module_params_on_conversion`` PyTorch unties on CPU; lazyxla does not change that."""
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        m = TiedLM().to(torch.float64)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert m.head.weight is not m.embed.weight


def test_state_dict_round_trip_keeps_ties(dev):
    src = TiedLM().to(dev)
    with torch.no_grad():
        src.embed.weight.add_(1.0)
    state = src.state_dict()
    dst = TiedLM().to(dev)
    dst.load_state_dict(state)  # copies in place: the objects, hence the ties, stay
    _assert_tied(dst)
    cpu = TiedLM()
    cpu.load_state_dict({k: v.cpu() for k, v in state.items()})
    _assert_tied(cpu)
    torch.testing.assert_close(cpu.head.weight, src.embed.weight.cpu(), rtol=0, atol=0)
    dst.to("cpu")
    _assert_tied(dst)


def test_load_state_dict_assign_unties_as_in_eager(dev):
    """``assign=True`` makes one Parameter per key on every device (eager too): documented, not changed."""
    eager, lazy = TiedLM(), TiedLM().to(dev)
    eager.load_state_dict(TiedLM().state_dict(), assign=True)
    lazy.load_state_dict(TiedLM().to(dev).state_dict(), assign=True)
    assert (lazy.head.weight is lazy.embed.weight) == (eager.head.weight is eager.embed.weight)


def _train_tied(model, x, y, make_opt, device, steps=4):
    model = model.to(device)
    opt = make_opt(model.parameters())
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "lazyxla":
            lazyxla.sync()
        losses.append(float(loss.item()))
    return model, losses


@pytest.mark.parametrize(
    "make_opt",
    [lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9), lambda ps: torch.optim.AdamW(ps, lr=1e-2)],
    ids=["sgd", "adamw"],
)
def test_tied_lm_trains_like_eager(make_opt, dev):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 32, (2, 8), generator=g), torch.randint(0, 32, (2, 8), generator=g)
    model = TiedLM()
    ref, ref_losses = _train_tied(copy.deepcopy(model), x, y, make_opt, torch.device("cpu"))
    lazy, losses = _train_tied(model, x, y, make_opt, dev)
    _assert_tied(lazy)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
    for (name, p), q in zip(lazy.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(p.cpu(), q, **TOL, msg=lambda m, n=name: f"{n}: {m}")
