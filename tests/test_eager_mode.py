"""Eager mode (``lazyxla.eager_mode``, torch_xla's ``torch_xla.experimental.eager_mode``): each op is computed as
it is recorded, with the numbers of lazy mode, while ``lazyxla.compile`` regions and ``torch.compile``'d functions
still run as one program.

Each op is checked to run at once by the counters (one program per op, none left pending) and by an error: a
broken lowering rule raises at the op's own line in eager mode, at the sync in lazy mode.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.ir import Leaf
from lazyxla.lazy.tensor import unwrap
from lazyxla.lowering import cache
from lazyxla.lowering.registry import RULES, Rule
from lazyxla.lowering.to_jax import LoweringError
from tests.fsdpv2_workers import cpu_reference
from tests.models import MLP
from tests.util import ROOT, run_python


@pytest.fixture(autouse=True)
def _lazy_mode_after():
    yield
    lazyxla.eager_mode(False)


def _executions() -> int:
    return lazyxla.metrics.counters()["executions"]


def _computed(t: torch.Tensor) -> bool:
    return unwrap(t)._value[0].op is Leaf.DATA


def test_each_op_runs_as_it_is_recorded(dev):
    x = torch.randn(5, 5).to(dev)  # a copy to the device: data, no program
    lazyxla.eager_mode(True)
    assert lazyxla.is_eager_mode() and lazyxla.config.eager
    start = _executions()
    t = torch.randn(5, 5, device=dev)
    assert _executions() == start + 1 and _computed(t)
    t *= 5  # in place: one program, the tensor holds its result
    assert _executions() == start + 2 and _computed(t)
    s = torch.logsumexp(t @ x, 0)  # matmul, then logsumexp (decomposed inside: still one program)
    assert _executions() == start + 4 and _computed(s)
    timers = lazyxla.metrics.timers()
    assert timers["eager_execute"]["count"] == 4 and "execute" not in timers  # eager programs time apart
    before = lazyxla.metrics.counters()["compiles"]
    u = torch.logsumexp(t @ x, 0)  # the same op signatures: programs from the cache
    assert lazyxla.metrics.counters()["compiles"] == before and _executions() == start + 6
    torch.testing.assert_close(u.cpu(), s.cpu(), rtol=0, atol=0)

    lazyxla.eager_mode(False)  # lazy mode again: recorded only
    v = torch.logsumexp(t @ x, 0)
    assert _executions() == start + 6 and not _computed(v)
    torch.testing.assert_close(v.cpu(), s.cpu(), rtol=1e-6, atol=1e-6)


def test_ops_that_update_their_arguments_leave_nothing_pending(dev):
    bn = torch.nn.BatchNorm1d(4).to(dev)  # .to(dev) copies into an empty tensor: nothing to compute
    x = torch.randn(8, 4).to(dev)
    with lazyxla.config.override(eager=True):
        start = _executions()
        bn2 = torch.nn.Linear(4, 4).to(dev)
        assert _executions() == start
        y = bn(x)  # num_batches_tracked += 1 (a known value: computed on the host), then batch norm updating
        assert _executions() == start + 1  # its running statistics: one program
        assert all(_computed(t) for t in (y, bn.running_mean, bn.running_var, bn.num_batches_tracked))
        params = list(bn2.parameters())
        with torch.no_grad():
            torch._foreach_add_(params, 1.0)  # one op on a list: one program
        assert _executions() == start + 2 and all(_computed(p) for p in params)
    assert not lazyxla.is_eager_mode()  # override restores lazy mode


@pytest.fixture
def broken_cos(monkeypatch):
    """aten.cos's rule raises when lowered; no program built with it outlives the test."""

    def broken(ctx, x):
        raise ValueError("deliberately broken rule")

    cache.clear()
    monkeypatch.setitem(RULES, torch.ops.aten.cos.default, Rule(broken))
    yield
    cache.clear()


def _raised_at(info) -> list[int]:
    """The lines of this file among the traceback's frames."""
    return [e.lineno + 1 for e in info.traceback if str(e.path) == __file__]


def test_a_failing_op_raises_at_its_own_line(dev, broken_cos):
    x = torch.randn(3).to(dev)
    y = torch.cos(x)  # lazy mode: recorded, nothing raised
    with pytest.raises(LoweringError, match="deliberately broken rule"):
        lazyxla.sync()
    del y

    lazyxla.eager_mode(True)
    with pytest.raises(LoweringError, match="deliberately broken rule") as info:
        z = torch.sin(x)
        line = inspect.currentframe().f_lineno + 1
        w = torch.cos(z)
    assert _raised_at(info)[0] == line  # raised from the op's line, the sin above has run
    assert _computed(z)
    del info
    start = _executions()
    w = torch.exp(z)  # the failed op left nothing pending: the next ops run on
    assert _executions() == start + 1 and _computed(w)
    torch.testing.assert_close(w.cpu(), torch.sin(x.cpu()).exp())


def _train(model, opt, batches, dev, step=None) -> list[float]:
    losses = []
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        if step is None:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        else:
            loss = step(x, y)
        lazyxla.sync()
        losses.append(loss.item())
    return losses


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(n)]


def test_training_equals_lazy_mode_and_cpu(dev):
    torch.manual_seed(0)
    ref = MLP()
    batches = _batches(3)
    runs, programs = {}, {}
    for mode in ("lazy", "eager", "cpu"):
        model = copy.deepcopy(ref).to(dev if mode != "cpu" else "cpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        lazyxla.eager_mode(mode == "eager")
        start = _executions()
        runs[mode] = (_train(model, opt, batches, dev if mode != "cpu" else "cpu"), model)
        programs[mode] = _executions() - start
        lazyxla.eager_mode(False)
    for mode in ("lazy", "eager"):
        losses, model = runs[mode]
        torch.testing.assert_close(losses, runs["cpu"][0], rtol=1e-5, atol=1e-6)
        for p, q in zip(model.parameters(), runs["cpu"][1].parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    assert programs["lazy"] == 3  # one program per step
    assert programs["eager"] > 20 * 3  # forward, backward and AdamW op by op


def test_compiled_regions_and_functions_stay_one_program(dev):
    torch.manual_seed(0)
    ref = MLP()
    batches = _batches(3)
    models = {k: copy.deepcopy(ref).to(dev) for k in ("region", "torch.compile")}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in models.items()}

    @lazyxla.compile(full_graph=True)
    def step(x, y):
        assert not lazyxla.is_eager_mode()  # lazy inside the region
        loss = F.cross_entropy(models["region"](x), y)
        loss.backward()
        opts["region"].step()
        opts["region"].zero_grad()
        return loss

    forward = torch.compile(models["torch.compile"], backend="lazyxla")

    def compiled_step(x, y):
        loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opts["torch.compile"].step()
        opts["torch.compile"].zero_grad()
        return loss

    lazyxla.eager_mode(True)
    region_programs = []
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        start = _executions()
        step(x, y)
        region_programs.append(_executions() - start)
    assert region_programs == [1, 1, 1] and lazyxla.is_eager_mode()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the graphs are one op each: no op-by-op warning
        start = _executions()
        lazyxla.metrics.reset()
        losses = _train(models["torch.compile"], None, batches, dev, compiled_step)
    counters = lazyxla.metrics.counters()
    assert counters["dynamo_calls"] == 2 * 3  # forward and backward, each one op computed at its call
    assert lazyxla.metrics.timers()["execute"]["count"] == 2 * 3  # timed as programs, not as eager ops
    lazyxla.eager_mode(False)

    cpu = copy.deepcopy(ref)
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    want = _train(cpu, cpu_opt, batches, "cpu")
    torch.testing.assert_close(losses, want, rtol=1e-5, atol=1e-6)
    for model in models.values():
        for p, q in zip(model.parameters(), cpu.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_torch_xla_names(dev, torch_xla):
    import torch_xla.debug.metrics as met
    from torch_xla.experimental import eager_mode, eager_mode_context, is_eager_mode

    assert torch_xla.experimental.eager_mode is eager_mode
    assert not is_eager_mode()
    with eager_mode_context(True) as before:
        assert before is False and is_eager_mode() and lazyxla.config.eager
        met.clear_all()
        t = torch.randn(4, device=dev) * 2

        @torch_xla.compile
        def double(v):
            return torch.cos(torch.sin(v)) * 2

        y = double(t)
        assert _computed(t) and _computed(y)
        assert met.metric_data("EagerOpExecuteTime")[0] == 2  # randn, mul
        assert met.metric_data("ExecuteTime")[0] == 1  # the compiled function
    assert not is_eager_mode() and not lazyxla.config.eager
    eager_mode(True)
    assert lazyxla.is_eager_mode()


def test_torch_xla_eager_script_equals_cpu_eager(tmp_path, torch_xla, monkeypatch):
    """examples/torch_xla/eager_train.py under ``python -m lazyxla.run``: batches prepared op by op, the step
    compiled as one program per call, losses as on the CPU."""
    script = ROOT / "examples" / "torch_xla" / "eager_train.py"
    monkeypatch.syspath_prepend(str(script.parent))  # (its model module, imported as the script imports it)
    proc = run_python(["-m", "lazyxla.run", str(script), "--steps", "3"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = [float(v) for v in re.findall(r"^loss step=\d+ value=(\S+)$", proc.stdout, re.M)]
    eager, compiled = map(int, re.search(r"^programs eager=(\d+) compiled=(\d+)$", proc.stdout, re.M).groups())
    assert compiled == 3  # one program per compiled step
    # per batch: the scale's float, mean, division and addition, one each (slicing the integer ids, whose values
    # the host has, is computed on the host: lazy/known.py)
    assert eager == 3 * 4

    spec = importlib.util.spec_from_file_location("_eager_train_example", script)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    want, _, _ = cpu_reference(ex, ex.parse_args(["--steps", "3"]), scale=ex.token_scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
