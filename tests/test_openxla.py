"""``torch.compile(backend='openxla')`` (and ``'openxla_eval'``) through lazyxla's Dynamo backend, and collectives
inside compiled functions.

PyTorch registers both backends and hands their graphs to ``torch_xla.core.dynamo_bridge``: with the compatibility
layer installed that is lazyxla's (``lazyxla/compat/torch_xla/_dynamo``), without it the backends fail. Training
through them equals CPU eager with one program per step. Collectives (torch_xla's ``xm.*`` and lazyxla's own) are
called inside ``fullgraph=True`` functions without a graph break, in 2 replicas, with the results of lazy mode.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.compat as compat
from lazyxla.lowering import cache
from tests import compile_workers as W
from tests.models import MLP


def test_the_openxla_backends_are_there_only_with_the_compat_layer(dev):
    x = torch.ones(3).to(dev)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="install torch_xla"):
        torch.compile(torch.sin, backend="openxla")(x)
    torch._dynamo.reset()
    assert compat.install()
    try:
        torch.testing.assert_close(torch.compile(torch.sin, backend="openxla")(x).cpu(), torch.sin(torch.ones(3)))
    finally:
        compat.uninstall()
        torch._dynamo.reset()


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("backend", ["openxla", "openxla_eval"])
def test_training_through_openxla_equals_cpu_eager(dev, torch_xla, backend):
    torch.manual_seed(0)
    ref = MLP()
    model = copy.deepcopy(ref).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    forward = torch.compile(model, backend=backend)
    losses, want, programs, compiles = [], [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every graph is one op: no op-by-op fallback warning
        for x, y in _batches(4):
            start = lazyxla.metrics.counters()
            loss = F.cross_entropy(forward(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
            torch_xla.sync()
            end = lazyxla.metrics.counters()
            programs.append(end["executions"] - start["executions"])
            compiles.append(end["compiles"] - start["compiles"])
            losses.append(loss.item())
            ref_loss = F.cross_entropy(ref(x), y)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            want.append(ref_loss.item())
    torch.testing.assert_close(losses, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    assert programs == [1, 1, 1, 1]  # forward, backward and AdamW: one program per step
    assert compiles[2:] == [0, 0]  # (step 2 has AdamW's state: a new program once)
    counters = lazyxla.metrics.counters()
    assert counters.get("dynamo_op_by_op_calls", 0) == 0 and counters["dynamo_calls"] >= 2


def test_openxla_eval_writes_in_place_updates_back(dev, torch_xla):
    def sub_in_place(a, b):
        a.sub_(b)
        return b - 1, b + 1

    a, b = torch.ones(4).to(dev), torch.arange(4.0).to(dev)
    minus, plus = torch.compile(sub_in_place, backend="openxla_eval")(a, b)
    assert a.cpu().tolist() == [1.0, 0.0, -1.0, -2.0]
    assert minus.cpu().tolist() == [-1.0, 0.0, 1.0, 2.0] and plus.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


class _InPlace(torch.nn.Module):
    def forward(self, a, b):
        a.sub_(b)
        return b - 1, b + 1


def test_extract_compiled_graph_of_a_traced_module(dev, torch_xla):
    import torch_xla._dynamo.dynamo_bridge as bridge
    import torch_xla.core.dynamo_bridge as old_bridge

    assert old_bridge.extract_compiled_graph is bridge.extract_compiled_graph
    torch.manual_seed(0)
    linear = torch.nn.Linear(10, 5)
    x = torch.randn(2, 10)
    module = copy.deepcopy(linear).to(dev)
    compiled = bridge.extract_compiled_graph(torch.fx.symbolic_trace(module), (x.to(dev),))
    out = compiled(x.to(dev))  # one output: the tensor itself, as torch_xla's bridge returns it
    torch.testing.assert_close(out.cpu(), linear(x), rtol=1e-6, atol=1e-6)

    a, b = torch.randn(10), torch.randn(10)
    da, db = a.to(dev), b.to(dev)
    compiled = bridge.extract_compiled_graph(torch.fx.symbolic_trace(_InPlace()), (da, db))
    minus, plus = compiled(da, db)
    torch.testing.assert_close(da.cpu(), a - b)  # the traced module's in-place update reached the argument
    torch.testing.assert_close(minus.cpu(), b - 1)
    torch.testing.assert_close(plus.cpu(), b + 1)


def test_lazyxla_collectives_in_a_full_graph(dev):
    """One replica: the collectives are in the graph (no break under fullgraph=True) and the graph is one op."""

    def fn(t):
        s = lazyxla.all_reduce(lazyxla.ReduceOp.SUM, t * 2, scale=0.5)
        g = lazyxla.all_gather(t, dim=0)
        return s + g

    x = torch.arange(4.0).to(dev)
    lazyxla.metrics.reset()
    got = torch.compile(fn, backend="lazyxla", fullgraph=True)(x)
    torch.testing.assert_close(got.cpu(), fn(x).cpu())
    counters = lazyxla.metrics.counters()
    assert counters["dynamo_traces"] == 1 and counters.get("dynamo_op_by_op_calls", 0) == 0


def test_xm_collectives_inside_compiled_functions_in_two_replicas():
    runs = lazyxla.spawn(W.compiled_collectives, args=(("openxla", "lazyxla"),), nprocs=2, timeout_s=280)
    for rank, per_backend in enumerate(runs):
        for backend, run in per_backend.items():
            where = (rank, backend)
            # every output equals lazy mode's, for the first call, a second call and a call in eager mode
            assert run["mismatch"] == run["mismatch_again"] == run["mismatch_eager"] == [], (where, run)
            assert len(run["gathered"]) == 2 * 8  # gathered over both replicas
            # one graph, traced once, one op per call: computed with the rest at the sync, at the call in eager mode
            assert (run["traces"], run["calls"], run["op_by_op"]) == (1, 1, 0), (where, run)
            assert run["programs_before_sync"] == 0 and run["eager_programs"] == 1, (where, run)
            got, want = run["loss"]
            assert got == pytest.approx(want, rel=1e-6), where
        assert runs[0][backend]["loss"] == runs[1][backend]["loss"]  # the all-reduced mean, the same on both


@pytest.mark.parametrize("backend", ["openxla", "openxla_eval", "lazyxla"])
def test_openxla_compiles_at_the_first_call_and_lazyxla_at_the_sync(dev, torch_xla, backend):
    """torch_xla's openxla backends compile a graph when it is first called (``CompileTime`` has a sample when the
    call returns); nothing runs before the read, which reuses that program. ``backend='lazyxla'`` compiles at the
    sync only. A later call with new shapes compiles again at the call; the values equal CPU eager."""
    import torch_xla.debug.metrics as met

    cache.clear()  # (the other parametrizations built the same programs)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh()).eval()
    model = copy.deepcopy(ref).to(dev)
    forward = torch.compile(model, backend=backend)
    at_call = backend != "lazyxla"
    for rows, new_shape in ((4, True), (4, False), (6, True)):
        x = torch.randn(rows, 16)
        xd = x.to(dev)
        torch_xla.sync()
        met.clear_all()
        out = forward(xd)
        compiled_at_call = lazyxla.metrics.counters()["compiles"]
        timed_at_call = met.metric_data("CompileTime") is not None
        assert lazyxla.metrics.counters()["executions"] == 0  # the call records; nothing runs yet
        got = out.cpu()
        counters = lazyxla.metrics.counters()
        torch.testing.assert_close(got, ref(x), rtol=1e-6, atol=1e-6)
        assert counters["executions"] == 1
        if new_shape:
            assert compiled_at_call == (1 if at_call else 0), (backend, rows)
            assert timed_at_call == at_call
            assert counters["compiles"] == 1  # the read reuses the program the call built (lazyxla: builds it)
        else:
            assert counters["compiles"] == 0  # same shapes: the call and the read hit the cache
