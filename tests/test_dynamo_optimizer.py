"""torch.compile(backend="lazyxla") over the optimizer step too: ``torch.compile(opt.step)`` next to a compiled model,
and a whole training step compiled (graph breaks at ``backward`` and ``zero_grad``). Numbers equal CPU eager; a
warm step records O(1) ops (no optimizer op recorded one by one), reads nothing back to the host before the loss,
and compiles nothing after step 2; an LR scheduler changing the learning rate every step recompiles nothing."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import lazyxla
from lazyxla.frontend import dynamo
from tests.models import GPT, MLP

STEPS = 5
WARM_OPS = 2  # ops a warm step may record (the backward's seed gradient of ones, made by autograd in lazy mode)

OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _count(name: str) -> int:
    return lazyxla.metrics.counters().get(name, 0)


def _data(kind: str):
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        return MLP(), torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g), F.cross_entropy
    x = torch.randint(0, 64, (2, 16), generator=g)
    y = torch.randint(0, 64, (2, 16), generator=g)
    return GPT(), x, y, lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten(), label_smoothing=0.1)


def _train(kind, make_opt, device, how, schedule=None):
    """Losses, final state and per-step counters of STEPS steps; ``how``: 'eager' (plain calls), 'parts' (model +
    loss compiled, ``torch.compile(opt.step)``) or 'whole' (one compiled function: forward, backward, step,
    zero_grad)."""
    torch.manual_seed(0)
    model, x, y, loss_fn = _data(kind)
    model = model.to(device)
    opt = make_opt(model.parameters())
    sched = schedule(opt) if schedule else None
    x, y = x.to(device), y.to(device)
    forward, opt_step = (lambda a, b: loss_fn(model(a), b)), opt.step
    if how == "parts":
        forward = torch.compile(forward, backend="lazyxla")
        opt_step = torch.compile(opt.step, backend="lazyxla")

    def train_step(a, b):
        loss = forward(a, b)
        loss.backward()
        opt_step()
        opt.zero_grad()
        return loss

    if how == "whole":
        train_step = torch.compile(train_step, backend="lazyxla")
    losses, stats = [], []
    for _ in range(STEPS):
        before = dict(lazyxla.metrics.counters())
        loss = train_step(x, y)
        if sched is not None:
            sched.step()
        if device.type == "lazyxla":
            lazyxla.sync()
        after = lazyxla.metrics.counters()
        stats.append({k: after.get(k, 0) - before.get(k, 0) for k in after})
        losses.append(loss.detach())
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return [float(v.item()) for v in losses], state, stats, opt


def _assert_equal_to_eager(kind, make_opt, dev, how, schedule=None):
    ref_losses, ref_state, _, _ = _train(kind, make_opt, torch.device("cpu"), "eager", schedule)
    losses, state, stats, opt = _train(kind, make_opt, dev, how, schedule)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    for name, ref in ref_state.items():
        torch.testing.assert_close(state[name], ref, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    return stats, opt


def _assert_warm(stats):
    """Steps 3..: O(1) ops recorded, no host read before the loss's, nothing compiled, no Dynamo graph made."""
    warm = stats[2:]
    assert all(s.get("ops_recorded", 0) <= WARM_OPS for s in warm), [s.get("ops_recorded", 0) for s in stats]
    assert all(s.get("device_to_host", 0) == 0 for s in warm), [s.get("device_to_host", 0) for s in stats]
    assert all(s.get("compiles", 0) == 0 for s in warm), [s.get("compiles", 0) for s in stats]
    assert all(s.get("dynamo_graphs", 0) == 0 for s in warm), [s.get("dynamo_graphs", 0) for s in stats]
    assert all(s.get("dynamo_op_by_op_calls", 0) == 0 for s in stats)


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_compiled_optimizer_step_equals_eager_and_records_one_op(kind, opt, dev):
    """model + loss compiled and ``torch.compile(opt.step)``: the optimizer step is one IR op per call."""
    stats, optimizer = _assert_equal_to_eager(kind, OPTIMIZERS[opt], dev, "parts")
    _assert_warm(stats)
    assert all(s["dynamo_calls"] == 3 for s in stats)  # forward, backward, optimizer step
    if opt != "sgd_momentum":  # Adam's step counters live on the device (capturable), as Dynamo does on CUDA
        assert all(g["capturable"] for g in optimizer.param_groups)
        assert all(s["step"].device.type == dev.type for s in optimizer.state.values())


@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw"])
def test_whole_compiled_training_step_equals_eager_and_records_one_op(opt, dev):
    """One compiled function with backward, step and zero_grad inside: Dynamo breaks the graph at backward and
    zero_grad; every piece is one IR op per call."""
    stats, _ = _assert_equal_to_eager("gpt", OPTIMIZERS[opt], dev, "whole")
    _assert_warm(stats)


@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw"])
def test_scheduler_changing_lr_every_step_recompiles_nothing(opt, dev):
    """A float learning rate an LR scheduler drives becomes a 0-d device tensor when Dynamo first traces the step
    (PyTorch's advice for compiled optimizers): a Python float would be baked into the graph and recompile per
    value, until Dynamo's recompile limit sends the step back to lazy mode."""
    schedule = lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0 / (1 + k))
    stats, optimizer = _assert_equal_to_eager("mlp", OPTIMIZERS[opt], dev, "parts", schedule)
    _assert_warm(stats)
    lr = optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.device.type == dev.type
    assert float(lr) == pytest.approx(OPTIMIZERS[opt]([torch.zeros(1)]).defaults["lr"] / (1 + STEPS))


def test_optimizer_writes_reach_views_of_the_parameters(dev):
    """The compiled step writes parameters back through functionalization (not by copy_): a view of a parameter
    taken before the step sees the new value."""
    torch.manual_seed(0)
    model = MLP().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    view = model.net[0].weight[:2]
    step = torch.compile(opt.step, backend="lazyxla")
    for _ in range(2):
        model(torch.randn(4, 32).to(dev)).sum().backward()
        step()
        lazyxla.sync()
    torch.testing.assert_close(view.cpu(), model.net[0].weight[:2].cpu(), rtol=0, atol=0)
    traces = [t for g in _compiled_graphs() for t in g.traces.values() if not isinstance(t, str)]
    assert any(len(t.mutated) == 4 * len(list(model.parameters())) for t in traces)  # param, exp_avg(_sq), step


def _compiled_graphs():
    import gc

    return [o for o in gc.get_objects() if type(o) is dynamo.CompiledGraph]


def test_fused_adam_runs_in_lazy_mode_as_one_update_op(dev):
    """PyTorch does not trace fused optimizers (``torch.compiler.disable`` on ``_fused_adam``): under
    torch.compile the step runs in lazy mode, where the fused kernel records one op per step, not eight per
    parameter: its functional form is one node, and each parameter's step counter one ``add``."""
    make = lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True)
    ref_losses, ref_state, _, _ = _train("gpt", make, torch.device("cpu"), "eager")
    losses, state, stats, _ = _train("gpt", make, dev, "parts")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    for name, ref in ref_state.items():
        torch.testing.assert_close(state[name], ref, rtol=1e-4, atol=1e-5)
    n_params = len(list(GPT().parameters()))  # (lazy mode's foreach Adam records ~8 ops per parameter)
    assert all(s.get("ops_recorded", 0) <= n_params + WARM_OPS + 1 for s in stats[2:]), [
        s.get("ops_recorded", 0) for s in stats
    ]
    assert all(s.get("compiles", 0) == 0 for s in stats[2:])
