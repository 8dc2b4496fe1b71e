"""Whole-step capture guards the Python numbers the step's Python reads outside its own closure: a helper it calls
reading a module global, a lambda's closure cell, a module's ``forward`` reading a global. When one changes, the
call is recorded again (a replay would reuse the number the verified step was recorded with): the losses equal
lazy mode's exactly."""

from __future__ import annotations

import torch

import lazyxla

SCALE = 1.0  # read by _loss_of, a helper the step calls by name
FACTOR = 1.0  # read by _Scaled.forward
CHANGE_AT = 4


def _loss_of(model, x):
    return model(x).square().mean() * SCALE


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x) * FACTOR


def _run(kind: str, capture: bool) -> tuple[list[float], list[str]]:
    global SCALE, FACTOR
    SCALE = FACTOR = 1.0
    dev = lazyxla.device()
    torch.manual_seed(0)
    model = (_Scaled() if kind == "forward" else torch.nn.Linear(4, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    scale = 1.0  # a closure cell of ``w``, which the step's loss function calls

    def w():
        return scale

    loss_fn = {
        "helper": lambda x: _loss_of(model, x),
        "lambda": lambda x: model(x).square().mean() * w(),
        "forward": lambda x: model(x).square().mean(),
    }[kind]

    def step(x):
        opt.zero_grad()
        loss = loss_fn(x)
        loss.backward()
        opt.step()
        return loss

    run = lazyxla.compile(step, capture=capture)
    x = torch.ones(2, 4).to(dev)
    losses, statuses = [], []
    for i in range(7):
        if i == CHANGE_AT:
            SCALE, FACTOR, scale = 100.0, 100.0, 100.0
        losses.append(run(x).item())
        statuses.append(run.capture_status if capture else "")
    return losses, statuses


def _check(kind: str) -> None:
    lazy, _ = _run(kind, capture=False)
    captured, statuses = _run(kind, capture=True)
    assert captured == lazy, (captured, lazy)
    assert lazy[CHANGE_AT] > 10 * lazy[CHANGE_AT - 1]  # the number did change the step
    assert statuses[CHANGE_AT - 1] == "replaying" and "guards differ" in statuses[CHANGE_AT], statuses
    assert statuses[-1] == "replaying", statuses


def test_a_global_a_helper_reads_is_guarded():
    _check("helper")


def test_a_closure_cell_of_a_function_the_step_calls_is_guarded():
    _check("lambda")


def test_a_global_a_modules_forward_reads_is_guarded():
    _check("forward")
