"""A failed sync never destroys state (DESIGN.md, decision 10).

A bad op recorded in the same step as ``opt.step()`` (and an unrelated in-place ``keep.add_(1)``) makes
the sync fail. When lowering or compiling fails, or the program's call fails before it takes its
inputs, nothing ran: every tensor keeps its recorded value and its inputs, reading the bad tensor
raises again, and once it is dropped training goes on exactly as CPU eager. When the program fails
while running, only the tensors that needed a buffer it consumed (donated inputs) lose their value.
"""

from __future__ import annotations

import copy

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.ir import ComputeError
from lazyxla.lazy.tensor import unwrap
from lazyxla.lowering import cache
from lazyxla.lowering.registry import RULES, Rule
from lazyxla.lowering.to_jax import LoweringError

OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
}


@pytest.fixture(autouse=True)
def _no_program_outlives_the_test():
    """The tests put broken rules into programs: no compiled program may be reused by another test."""
    cache.clear()
    yield
    cache.clear()


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)


class _Run:
    """The same model and optimizer on lazyxla and on the CPU, with a pending in-place op besides."""

    def __init__(self, dev, optimizer: str) -> None:
        torch.manual_seed(0)
        self.ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        self.model = copy.deepcopy(self.ref).to(dev)
        self.ref_opt = OPTIMIZERS[optimizer](self.ref.parameters())
        self.opt = OPTIMIZERS[optimizer](self.model.parameters())
        self.keep_ref = torch.zeros(3)
        self.keep = self.keep_ref.to(dev)
        self.dev = dev

    def step(self, i: int, device: bool = True, cpu: bool = True) -> None:
        x, y = _batch(i)
        for on, model, opt, keep, xb, yb in (
            (device, self.model, self.opt, self.keep, x.to(self.dev), y.to(self.dev)),
            (cpu, self.ref, self.ref_opt, self.keep_ref, x, y),
        ):
            if on:
                F.mse_loss(model(xb), yb).backward()
                opt.step()
                opt.zero_grad()
                keep.add_(1)

    def pre_step_buffers(self) -> list:
        """The device buffers the parameters hold now (what the next step reads, and may donate)."""
        return [unwrap(p)._value[0].payload for p in self.model.parameters()]

    def assert_equal_to_cpu(self) -> None:
        for p, r in zip(self.model.parameters(), self.ref.parameters()):
            torch.testing.assert_close(p.detach().cpu(), r.detach(), rtol=1e-5, atol=1e-6)
        for p, r in zip(self.model.parameters(), self.ref.parameters()):
            for name, value in self.ref_opt.state[r].items():
                if isinstance(value, torch.Tensor):
                    torch.testing.assert_close(self.opt.state[p][name].cpu(), value, rtol=1e-5, atol=1e-6)
        assert self.keep.tolist() == self.keep_ref.tolist()


def _broken(ctx, x):
    raise ValueError("deliberately broken rule")


def _raise_when_run(*args):
    raise ValueError("deliberately failing at run time")


def _fails_when_run(ctx, x):
    """A rule whose program fails while it runs (a host callback that raises): an execution-time error."""
    return jax.pure_callback(_raise_when_run, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.mark.parametrize("read_first", [False, True], ids=["sync_after_del", "read_then_sync"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_a_lowering_failure_in_the_step_of_opt_step_loses_nothing(dev, monkeypatch, optimizer, read_first):
    run = _Run(dev, optimizer)
    run.step(0)
    lazyxla.sync()
    before = [p.detach().cpu() for p in run.model.parameters()]  # their values before the failing step
    buffers = run.pre_step_buffers()
    monkeypatch.setitem(RULES, torch.ops.aten.cos.default, Rule(_broken))
    run.step(1, cpu=False)
    with lazyxla.config.override(explain_recompiles=True):
        line = __import__("inspect").currentframe().f_lineno + 1  # the next line records the bad op
        bad = torch.cos(run.keep * 2)
    with pytest.raises(LoweringError, match="lowering aten.cos.default on \\(float32\\[3\\]\\) failed") as info:
        lazyxla.sync()
    assert f"recorded at {__file__}:{line}" in str(info.value) and "deliberately broken rule" in str(info.value)
    del info
    # nothing ran: the step's inputs (the parameters' pre-step buffers) are intact, none was donated
    for buf, want in zip(buffers, before):
        assert not buf.is_deleted()
        np.testing.assert_array_equal(np.asarray(buf), want.numpy())
    run.step(1, device=False)
    if read_first:  # every tensor that does not need the broken op reads fine, with eager's value
        run.assert_equal_to_cpu()
        with pytest.raises(LoweringError, match="deliberately broken rule"):
            bad.cpu()  # and the bad one raises again
    del bad
    lazyxla.sync()  # runs the rest of the step (all of it when nothing was read)
    run.assert_equal_to_cpu()
    for i in (2, 3):  # training goes on as on the CPU
        run.step(i)
        lazyxla.sync()
    run.assert_equal_to_cpu()


def test_a_compile_failure_runs_nothing_and_the_next_sync_runs_the_step(dev, monkeypatch):
    run = _Run(dev, "adamw")
    run.step(0)
    lazyxla.sync()
    buffers = run.pre_step_buffers()
    real_lower = cache._lower

    class _FailingCompile:
        def __init__(self, lowered) -> None:
            self.lowered = lowered

        def compile(self, compiler_options=None):  # jax.stages.Lowered.compile's signature
            monkeypatch.setattr(cache, "_lower", real_lower)  # once: e.g. the compiler ran out of memory
            raise RuntimeError("RESOURCE_EXHAUSTED: simulated compiler failure")

    monkeypatch.setattr(cache, "_lower", lambda *a: _FailingCompile(real_lower(*a)))
    run.step(1)
    with pytest.raises(RuntimeError, match="simulated compiler failure"):
        lazyxla.sync()
    assert not any(b.is_deleted() for b in buffers)
    lazyxla.sync()  # the same graph again: compiles and runs
    run.assert_equal_to_cpu()
    assert all(b.is_deleted() for b in buffers)  # now the step ran, and took the old buffers (donated)


def test_a_call_that_fails_before_running_keeps_every_input(dev, monkeypatch):
    """The executable's call raises before the program takes its inputs (as an allocation failure at launch
    does): the step's tensors keep their values and inputs, and the next sync runs it."""
    run = _Run(dev, "sgd_momentum")
    run.step(0)
    lazyxla.sync()
    buffers = run.pre_step_buffers()
    real_get = cache.get

    def failing_once(*args):
        compiled = real_get(*args)
        executable = compiled.executable

        def launch(*arrays):
            compiled.executable = executable
            raise RuntimeError("RESOURCE_EXHAUSTED: simulated allocation failure at launch")

        compiled.executable = launch
        monkeypatch.setattr(cache, "get", real_get)
        return compiled

    monkeypatch.setattr(cache, "get", failing_once)
    run.step(1)
    with pytest.raises(RuntimeError, match="simulated allocation failure"):
        lazyxla.sync()
    assert not any(b.is_deleted() for b in buffers)
    lazyxla.sync()
    run.assert_equal_to_cpu()
    run.step(2)
    lazyxla.sync()
    run.assert_equal_to_cpu()


def test_a_program_failing_while_running_without_donation_loses_nothing(dev, monkeypatch):
    run = _Run(dev, "adamw")
    run.step(0)
    lazyxla.sync()
    monkeypatch.setitem(RULES, torch.ops.aten.cos.default, Rule(_fails_when_run))
    with lazyxla.config.override(donate=False):
        run.step(1)
        bad = torch.cos(run.keep * 2)
        with pytest.raises(Exception, match="deliberately failing at run time"):
            lazyxla.sync()
        del bad
        lazyxla.sync()
    run.assert_equal_to_cpu()
    run.step(2)
    lazyxla.sync()
    run.assert_equal_to_cpu()


def test_a_program_failing_while_running_marks_only_what_lost_its_inputs(dev, monkeypatch):
    """With donation (the default) a program that fails while running has taken the buffers donated to it:
    the tensors that needed them raise a ComputeError that says so; every other tensor keeps its value."""
    run = _Run(dev, "sgd_momentum")
    run.step(0)
    lazyxla.sync()
    held = torch.arange(3.0).to(dev)
    monkeypatch.setitem(RULES, torch.ops.aten.cos.default, Rule(_fails_when_run))
    run.step(1)
    other = held * 3  # reads a buffer that a live tensor holds: never donated
    bad = torch.cos(run.keep * 2)
    with pytest.raises(Exception, match="deliberately failing at run time"):
        lazyxla.sync()
    assert other.tolist() == [0.0, 3.0, 6.0] and held.tolist() == [0.0, 1.0, 2.0]
    for t in (*run.model.parameters(), run.keep, bad):
        with pytest.raises(ComputeError, match="failed while running .*deliberately failing.*donate = False"):
            t.cpu()
    with pytest.raises(ComputeError, match="failed while running"):
        (run.keep + 1).cpu()


@pytest.mark.parametrize("wrong", ["dtype", "shape"])
@lazyxla.config.override(known_values_limit=0)  # ids * 2 is recorded, not computed on the host (lazy/known.py)
def test_a_mismatched_argument_raises_naming_it_and_runs_nothing(dev, wrong):
    """Arguments are checked against the program before the call: a buffer that is not what the program
    was compiled for raises a ProgramInputError naming the graph input, and nothing runs or changes."""
    from lazyxla.lowering.cache import ProgramInputError

    ids = torch.arange(6).to(dev)
    keep = torch.ones(2).to(dev)
    y = ids * 2
    keep.add_(1)
    node = unwrap(ids)._value[0]
    right = node.payload
    with jax.enable_x64(True):
        bad = np.arange(6, dtype=np.int32) if wrong == "dtype" else np.arange(5, dtype=np.int64)
        node.payload = jax.device_put(bad, right.sharding)
    got = "int32[6]" if wrong == "dtype" else "int64[5]"
    with pytest.raises(ProgramInputError) as info:
        lazyxla.sync()
    message = str(info.value)
    del info
    assert "(a tensor of shape [6] and dtype torch.int64, copied from the CPU at " in message, message
    assert f"{__file__}:" in message and f"it is {got} laid out as" in message and "takes int64[6]" in message
    assert "The program was not run and no tensor changed" in message
    node.payload = right
    lazyxla.sync()
    assert y.tolist() == [0, 2, 4, 6, 8, 10] and keep.tolist() == [2.0, 2.0]
