"""Resuming an optimizer from a checkpoint costs no host reads per step (issue 26, point 4).

A non-fused, non-capturable optimizer reads its ``step`` counter on the host every step; loaded onto the device
(``lazyxla.load(path, device=dev)``, or a state dict moved there as ``torch.load(map_location=dev)`` does), each
read was a sync: 4 programs per step instead of 1. ``frontend/optimizers.py`` keeps the counters on the host at
``load_state_dict``, as a fresh run has them. Each case runs in its own process; the reference is PyTorch's own
route (``torch.load(map_location="cpu")`` + ``load_state_dict``) and CPU eager for the numbers.
"""

from __future__ import annotations

import copy
import os
import tempfile

import pytest
import torch
from torch import nn

import lazyxla
from lazyxla.util import map_tensors
from tests.util import run_case

OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
    "adam_single_tensor": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False),
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
}
STEPS = 3


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _checkpoint(make_opt, path):
    """Two CPU steps, then save model and optimizer (step counters 2, CPU tensors)."""
    model = _model()
    opt = make_opt(model.parameters())
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    lazyxla.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    return x


def _resume(make_opt, path, device, route):
    if route == "lazyxla.load":
        state = lazyxla.load(path, device=device)
    elif route == "moved to the device":  # what torch.load(path, map_location=dev) gives
        state = map_tensors(torch.load(path, map_location="cpu"), lambda t: t.to(device))
    else:
        assert route == "torch.load cpu", route
        state = torch.load(path, map_location="cpu")
    model = _model().to(device)
    model.load_state_dict(state["model"])
    opt = make_opt(model.parameters())
    opt.load_state_dict(state["opt"])
    return model, opt


def _run(model, opt, x, device):
    """STEPS steps; per step the programs run and compiled (lazyxla), and the losses."""
    losses, programs, compiles = [], [], []
    for _ in range(STEPS):
        before = dict(lazyxla.metrics.counters())
        opt.zero_grad()
        loss = model(x.to(device)).square().mean()
        loss.backward()
        opt.step()
        lazyxla.sync()
        after = lazyxla.metrics.counters()
        programs.append(after["executions"] - before.get("executions", 0))
        compiles.append(after["compiles"] - before.get("compiles", 0))
        losses.append(loss.item())
    return losses, programs, compiles


def _resume_costs_what_a_fresh_run_costs(name):
    make_opt = OPTIMIZERS[name]
    dev = lazyxla.device()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckpt.pt")
        x = _checkpoint(make_opt, path)
        ref_model, ref_opt = _resume(make_opt, path, "cpu", "torch.load cpu")
        ref_losses = []
        for _ in range(STEPS):
            ref_opt.zero_grad()
            loss = ref_model(x).square().mean()
            loss.backward()
            ref_opt.step()
            ref_losses.append(loss.item())
        runs = {}
        for route in ("torch.load cpu", "lazyxla.load", "moved to the device"):
            model, opt = _resume(make_opt, path, dev, route)
            lazyxla.sync()
            lazyxla.metrics.reset()
            losses, programs, compiles = _run(model, opt, x, dev)
            runs[route] = (programs, compiles)
            assert programs == [1] * STEPS, (name, route, programs, lazyxla.metrics.syncs())
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
            for a, b in zip(model.parameters(), ref_model.parameters()):
                torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-5, msg=route)
            for state, ref_state in zip(opt.state.values(), ref_opt.state.values()):
                if "step" in state:  # where PyTorch's own route puts it: the CPU, unless fused
                    assert state["step"].device.type == ("lazyxla" if "fused" in name else "cpu"), route
                    assert float(state["step"]) == float(ref_state["step"])
        # the first route's programs are compiled by then: the later routes must compile nothing new
        assert runs["lazyxla.load"][1] == runs["moved to the device"][1] == [0] * STEPS, runs


def _a_read_per_step_names_the_optimizer_line():
    """When a step counter does sit on the device (put there by hand), ``metrics.syncs()`` names the line."""
    dev = lazyxla.device()
    model = nn.Linear(4, 2).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    model(torch.ones(3, 4).to(dev)).sum().backward()
    opt.step()
    for state in opt.state.values():
        state["step"] = state["step"].to(dev)
    lazyxla.sync()
    lazyxla.metrics.reset()
    model(torch.ones(3, 4).to(dev)).sum().backward()
    opt.step()
    reads = [s for s in lazyxla.metrics.syncs() if s["reason"] == ".item()"]
    assert reads and reads[0]["count"] == 2, lazyxla.metrics.syncs()
    assert "torch/optim/adam.py" in reads[0]["via"] and "_get_value" in reads[0]["via"], reads


def _cpu_programs_are_pytorchs():
    """A CPU optimizer's load_state_dict is PyTorch's: a device step counter of a CPU model is left alone."""
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    state = copy.deepcopy(opt.state_dict())
    opt.load_state_dict(state)
    assert all(s["step"].device.type == "cpu" for s in opt.state.values())


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_resume_costs_what_a_fresh_run_costs(name):
    run_case(__file__, "_resume_costs_what_a_fresh_run_costs", name, timeout=300)


def test_a_read_per_step_names_the_optimizer_line():
    run_case(__file__, "_a_read_per_step_names_the_optimizer_line")


def test_cpu_load_state_dict_is_pytorchs():
    run_case(__file__, "_cpu_programs_are_pytorchs")
