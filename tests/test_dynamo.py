"""torch.compile(backend="lazyxla"): registration, inference and training equal to eager, one IR op per
compiled-graph call (no per-op recording on later calls), one compile per input signature, graph breaks,
ops without a rule, random ops."""

from __future__ import annotations

import copy
import inspect
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

import lazyxla
from lazyxla.frontend import dynamo
from lazyxla.lowering.rules import compiled_graph
from tests.models import CNN, GPT, MLP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _count(name: str) -> int:
    return lazyxla.metrics.counters().get(name, 0)


def _gpt_data():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 64, (2, 16), generator=g)
    y = torch.randint(0, 64, (2, 16), generator=g)
    return x, y, lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten(), label_smoothing=0.1)


def test_backend_is_registered_at_import_and_as_entry_point():
    assert "lazyxla" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("lazyxla") is dynamo.lazyxla_backend
    # importing lazyxla before torch._dynamo registers it too (when Dynamo's registry loads)
    code = "import lazyxla, torch._dynamo; assert 'lazyxla' in torch._dynamo.list_backends(), 'not registered'"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the packaging entry point is in the group PyTorch reads
    from torch._dynamo.backends import registry

    assert 'group_name = "torch_dynamo_backends"' in inspect.getsource(registry._discover_entrypoint_backends)
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    section = text.split("[project.entry-points.torch_dynamo_backends]", 1)[1].split("[", 1)[0]
    assert 'lazyxla = "lazyxla.dynamo:lazyxla_backend"' in section


def test_default_backend_on_device_tensors_names_the_lazyxla_backend(dev):
    # Inductor has no code generator for the device: without the check it fails deep in its codegen
    # (InductorError: KeyError: 'lazyxla'), with nothing saying what to do
    compiled = torch.compile(nn.Linear(4, 4).to(dev))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match='backend="lazyxla"'):
        compiled(torch.randn(2, 4, device=dev))
    # CPU graphs go to Inductor untouched (the check looks at the inputs' device only)
    seen = []
    checked = dynamo._refuse_lazyxla_inputs(lambda self, gm, inputs, **kw: seen.append(inputs) or "compiled")
    assert checked(None, None, [torch.ones(2), 3]) == "compiled" and len(seen) == 1


def test_inference_equals_eager_and_records_one_op_per_call(dev):
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(16, 32)
    ref = model(x)
    compiled = torch.compile(copy.deepcopy(model).to(dev), backend="lazyxla")
    xd = x.to(dev)
    outs, recorded, calls = [], [], []
    for _ in range(3):
        ops, n = _count("ops_recorded"), _count("dynamo_calls")
        with torch.no_grad():
            outs.append(compiled(xd))
        recorded.append(_count("ops_recorded") - ops)
        calls.append(_count("dynamo_calls") - n)
        lazyxla.sync()
    for out in outs:
        torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-5, atol=1e-6)
    assert recorded[0] > 0 and recorded[1:] == [0, 0], recorded  # the first call traces the graph
    assert calls == [1, 1, 1]
    assert _count("dynamo_graphs") == 1 and _count("dynamo_traces") == 1
    # the op is named by a digest of the traced graph: compiling again gives the same name
    names = set(compiled_graph.GRAPHS)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(copy.deepcopy(model).to(dev), backend="lazyxla")(xd)
    lazyxla.sync()
    assert set(compiled_graph.GRAPHS) == names


def test_gpt_trains_like_eager_and_compiles_once(dev):
    """5 AdamW steps of the GPT through torch.compile equal eager; later calls record no op, compile nothing."""
    torch.manual_seed(0)
    model = GPT()
    x, y, loss_fn = _gpt_data()

    def train(net, device, compile_it):
        net = net.to(device)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
        step = lambda a, b: loss_fn(net(a), b)
        if compile_it:
            step = torch.compile(step, backend="lazyxla")
        xs, ys = x.to(device), y.to(device)
        losses, stats = [], []
        for _ in range(5):
            ops = _count("ops_recorded")
            loss = step(xs, ys)
            forward_ops = _count("ops_recorded") - ops
            loss.backward()
            opt.step()
            opt.zero_grad()
            if device.type == "lazyxla":
                lazyxla.sync()
            losses.append(loss.detach())
            stats.append((forward_ops, _count("compiles"), _count("dynamo_graphs")))
        return [float(v.item()) for v in losses], {k: v.detach().cpu() for k, v in net.state_dict().items()}, stats

    ref_losses, ref_state, _ = train(copy.deepcopy(model), torch.device("cpu"), False)
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    losses, state, stats = train(copy.deepcopy(model), dev, True)
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) < 1e-5, (losses, ref_losses)
    for name, ref in ref_state.items():
        torch.testing.assert_close(state[name], ref, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    forward_ops, compiles, graphs = zip(*stats)
    assert forward_ops[0] > 0 and forward_ops[1:] == (0, 0, 0, 0), forward_ops  # calls 2..5 record no op
    assert compiles[2:] == (compiles[1],) * 3, compiles  # steps 3..5 compile nothing (lazy cache hits)
    assert graphs == (2,) * 5, graphs  # one forward and one backward graph, never recompiled by Dynamo
    assert torch._dynamo.utils.counters["frames"]["ok"] - frames == 1
    assert _count("dynamo_op_by_op_calls") == 0


class _Breaking(nn.Module):
    """An MLP whose forward breaks Dynamo's graph twice (an explicit break and a host read)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        h = torch.tanh(self.b(h))
        scale = float(h.abs().mean().item())  # a host read: Dynamo breaks, lazyxla syncs
        return self.c(h) * scale


def test_graph_breaks_fall_back_to_lazy_mode_between_graphs(dev):
    torch.manual_seed(0)
    model = _Breaking()
    x = torch.randn(6, 8)

    def train(net, device, compile_it):
        net = net.to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        fwd = torch.compile(net, backend="lazyxla") if compile_it else net
        xs = x.to(device)
        losses = []
        for _ in range(3):
            loss = fwd(xs).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if device.type == "lazyxla":
                lazyxla.sync()
            losses.append(float(loss.item()))
        return losses, {k: v.detach().cpu() for k, v in net.state_dict().items()}

    ref_losses, ref_state = train(copy.deepcopy(model), torch.device("cpu"), False)
    losses, state = train(copy.deepcopy(model), dev, True)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for name, ref in ref_state.items():
        torch.testing.assert_close(state[name], ref, rtol=1e-4, atol=1e-5)
    assert _count("dynamo_graphs") >= 4  # forward and backward graphs of the pieces between breaks
    assert _count("dynamo_op_by_op_calls") == 0


def test_op_without_rule_runs_op_by_op(dev):
    """A graph with an op lazyxla cannot lower runs op by op in lazy mode (that op on the CPU)."""
    assert lazyxla.lazy.record.status_of(torch.ops.aten.special_bessel_j0.default) == "fallback"

    def f(a):
        return torch.special.bessel_j0(a.sin()) * 2 + a

    x = torch.randn(5, 3)
    compiled = torch.compile(f, backend="lazyxla")
    xd = x.to(dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lazy mode's CPU-fallback warning (once per process)
        outs = [compiled(xd) for _ in range(2)]
    for out in outs:
        torch.testing.assert_close(out.cpu(), f(x), rtol=1e-5, atol=1e-6)
    assert _count("dynamo_op_by_op_calls") == 2 and _count("dynamo_calls") == 0
    assert _count("fallback.aten.special_bessel_j0.default") == 2


def test_random_ops_draw_fresh_numbers_each_call(dev):
    def f(a):
        return F.dropout(a, 0.5, training=True) + torch.rand_like(a)

    compiled = torch.compile(f, backend="lazyxla")
    ones = torch.ones(4000, device=dev)
    outs = [compiled(ones).cpu() for _ in range(3)]
    assert _count("dynamo_traces") == 1 and _count("dynamo_calls") == 3
    for out in outs:
        noise = out - out.floor()
        dropped = out - noise
        assert set(dropped.unique().tolist()) <= {0.0, 2.0}
        assert 0.45 < (dropped == 0).float().mean() < 0.55
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])
    torch.manual_seed(7)
    a = compiled(ones).cpu()
    torch.manual_seed(7)
    b = compiled(ones).cpu()
    assert torch.equal(a, b)  # the same stream as lazy mode: torch.manual_seed makes it repeatable


def test_batchnorm_buffers_views_and_mutations(dev):
    """Input mutations (BatchNorm's running statistics, an in-place add), views in and out."""
    torch.manual_seed(0)
    model = CNN()
    x = torch.randn(4, 3, 8, 8)
    ref_model = copy.deepcopy(model)
    ref_model(x).sum().backward()
    net = copy.deepcopy(model).to(dev)
    torch.compile(net, backend="lazyxla")(x.to(dev)).sum().backward()
    lazyxla.sync()
    for (name, ref), got in zip(ref_model.state_dict().items(), net.state_dict().values()):
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    for p_ref, p in zip(ref_model.parameters(), net.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=1e-4, atol=1e-5)

    def mutate(a, b):
        a.add_(1)
        return (a * b).t(), b[1:].view(-1)

    a, b = torch.randn(3, 4), torch.randn(5, 3, 4)[2]  # b: a view
    ad, bd = a.to(dev), torch.randn(5, 3, 4).to(dev)[2]
    bd.copy_(b)
    out, view = torch.compile(mutate, backend="lazyxla")(ad, bd)
    torch.testing.assert_close(ad.cpu(), a + 1)
    torch.testing.assert_close(out.cpu(), ((a + 1) * b).t())
    torch.testing.assert_close(view.cpu(), b[1:].reshape(-1))


def test_changing_shapes_trace_once_per_shape(dev):
    """After a shape change Dynamo hands over a graph with symbolic sizes: it is traced per concrete shape
    (as lazy mode records per shape), so every shape keeps running as one op per call."""
    torch.manual_seed(0)
    model = MLP()
    compiled = torch.compile(copy.deepcopy(model).to(dev), backend="lazyxla")
    batches = [torch.randn(b, 32) for b in (4, 6, 8, 6, 4, 4)]
    inputs = [b.to(dev) for b in batches]
    recorded = []
    for x, xd in zip(batches, inputs):
        ops = _count("ops_recorded")
        with torch.no_grad():
            out = compiled(xd)
        recorded.append(_count("ops_recorded") - ops)
        torch.testing.assert_close(out.cpu(), model(x).detach(), rtol=1e-5, atol=1e-6)
    # a static graph for batch 4, then one with a symbolic batch size, traced for 6, 8 and 4
    assert _count("dynamo_graphs") == 2 and _count("dynamo_traces") == 4
    assert recorded[3] == recorded[5] == 0, recorded  # shapes seen before by the same graph
    assert _count("dynamo_calls") == 6 and _count("dynamo_op_by_op_calls") == 0


def test_autocast_graphs_run_in_lazy_mode(dev):
    """AOTAutograd would drop PrivateUse1 autocast's casts: such graphs run as lazy mode does."""
    torch.manual_seed(0)
    net = MLP().to(dev)
    x = torch.randn(16, 32).to(dev)

    def inner(a):
        with torch.autocast("lazyxla", dtype=torch.bfloat16):
            return F.softmax(a @ a.t(), -1) @ a

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-time warning that says so
        with torch.autocast("lazyxla", dtype=torch.bfloat16):
            outer, ref = torch.compile(net, backend="lazyxla")(x), net(x)
        got = torch.compile(inner, backend="lazyxla")(x)
    assert outer.dtype == ref.dtype == torch.bfloat16 and torch.equal(outer.cpu(), ref.cpu())
    assert got.dtype == torch.bfloat16 and torch.equal(got.cpu(), inner(x).cpu())
    assert _count("dynamo_autocast_graphs") == 2
