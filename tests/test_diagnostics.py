"""Diagnostics: recompile explanations, sync attribution, compile regions, step reports, dumps."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

import lazyxla


def _line(marker: str) -> str:
    """``this_file:line`` of the line in this file that contains ``marker`` (a comment tag)."""
    with open(__file__) as f:
        lines = f.read().splitlines()
    for number, text in enumerate(lines, 1):
        if marker in text and "_line(" not in text:
            return f"{os.path.abspath(__file__)}:{number}"
    raise AssertionError(marker)


@pytest.fixture
def explain():
    with lazyxla.config.override(explain_recompiles=True):
        yield


def test_a_changing_input_length_is_explained_with_the_dimension_and_the_line(dev, explain):
    w = torch.ones(3, 2).to(dev)
    for n in (4, 5, 5):
        x = torch.ones(n, 3).to(dev)
        y = (x @ w).relu().sum()  # tag:matmul
        lazyxla.sync()  # tag:sync
    assert y.item() == 5 * 2 * 3
    (why,) = lazyxla.metrics.recompiles()
    assert why["site"] == f"lazyxla.sync() at {_line('tag:sync')}"
    assert "shape [4, 3] -> [5, 3] (dimension 0: 4 -> 5)" in why["reason"]
    assert f"first used by aten.mm.default (recorded at {_line('tag:matmul')})" in why["reason"]


def test_a_python_number_baked_into_a_shape_is_explained(dev, explain):
    for n in (2, 3):
        z = torch.ones(6).to(dev)
        q = z.view(n, -1).sum(1)  # tag:view
        lazyxla.sync()
    assert q.tolist() == [2.0, 2.0, 2.0]
    (why,) = lazyxla.metrics.recompiles()
    assert f"aten.view_copy.default (recorded at {_line('tag:view')})" in why["reason"]
    changed = "a Python value in its arguments changed: size: [2, -1] -> [3, -1]. `size` is an int argument"
    assert changed in why["reason"]
    assert "To avoid it, keep such values to a few (pad lengths to a few sizes)" in why["reason"]


def test_recompile_explanations_are_off_by_default(dev, caplog):
    for n in (2, 3):
        y = torch.ones(n).to(dev) * 2
        lazyxla.sync()
    assert lazyxla.metrics.recompiles() == []
    from lazyxla.lazy.tensor import unwrap

    assert unwrap(y * 3)._value[0].source is None  # no source lines kept: no per-op cost


def test_every_sync_is_attributed_to_its_trigger_and_line(dev):
    x = torch.ones(3).to(dev) + 1
    x.sum().item()  # tag:item
    (x * 2).cpu()  # tag:cpu
    str(x * 3)  # tag:print
    for _ in range(2):
        y = x * 4
        lazyxla.sync()  # tag:explicit
    assert y is not None
    found = {(s["reason"], s["where"]): s["count"] for s in lazyxla.metrics.syncs()}
    assert found[(".item()", _line("tag:item"))] == 1
    assert found[(".cpu() / .to(cpu)", _line("tag:cpu"))] == 1
    assert found[("print", _line("tag:print"))] == 1
    assert found[("lazyxla.sync()", _line("tag:explicit"))] == 2


def test_full_graph_region_raises_at_a_host_read_naming_the_line(dev):
    x = torch.ones(4).to(dev)
    with pytest.raises(lazyxla.CompileRegionError) as info, lazyxla.compile(full_graph=True, name="full-graph"):
        y = x * 2
        y.sum().item()  # tag:region-item
    assert f".item() at {_line('tag:region-item')}" in str(info.value)
    assert "full_graph=True" in str(info.value)
    # torch_xla's words first: its tests and users match them
    assert str(info.value).startswith("Unexpected execution happens inside the compiled function, exiting")


def test_a_full_graph_region_runs_as_one_program(dev):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 3).to(dev)

    @lazyxla.compile(full_graph=True, max_different_graphs=2, name="decorated-step")
    def step():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    before = lazyxla.metrics.counters()["executions"]
    losses = [step() for _ in range(4)]
    assert lazyxla.metrics.counters()["executions"] - before == 4  # one program per call, nothing else
    assert losses[-1].item() < losses[0].item()


def test_max_different_graphs_raises_with_the_difference(dev, explain):
    region = lazyxla.compile(max_different_graphs=1, name="shape-changing-region")
    with region:
        a = (torch.ones(4).to(dev) * 2).sum()
    with pytest.raises(lazyxla.CompileRegionError) as info, region:
        b = (torch.ones(6).to(dev) * 2).sum()  # tag:second-graph
    assert a.item() == 8.0 and b is not None
    message = str(info.value)
    assert "max_different_graphs=1" in message and "graph number 2" in message
    assert "dimension 0: 4 -> 6" in message and _line("tag:second-graph") in message


def test_sync_returns_a_step_report(dev):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 256).to(dev)
    reports = []
    for _ in range(3):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        reports.append(lazyxla.sync())
    first, _, third = reports
    assert first.compiled and not third.compiled
    (p,) = third.programs
    assert p.nodes > 5 and p.inputs >= 3 and p.build_ms == 0.0
    assert p.donated_bytes >= 256 * 256 * 4  # the weight's buffer goes to the new weight
    assert "cache hit" in str(third) and p.graph in str(third)
    assert third.host_to_device == 0 and first.host_to_device >= 0
    assert lazyxla.sync().programs == []  # nothing pending


def test_dump_dir_writes_each_compiled_program(dev, tmp_path):
    with lazyxla.config.override(dump_dir=str(tmp_path)):
        y = torch.ones(3).to(dev).sin()
        report = lazyxla.sync()
    (p,) = report.programs
    hlo = (tmp_path / f"{p.graph}.stablehlo.mlir").read_text()
    ir = (tmp_path / f"{p.graph}.ir.txt").read_text()
    assert "stablehlo.sine" in hlo and "func.func" in hlo
    assert "aten.sin.default" in ir
    assert y.cpu().allclose(torch.ones(3).sin())


def test_debug_texts(dev):
    x = torch.ones(2, 2).to(dev)
    y = (x @ x).cos()
    assert "stablehlo.dot_general" in lazyxla.debug.stablehlo_text([y])
    ir = lazyxla.debug.ir_text([y])
    assert "aten.mm.default" in ir and "aten.cos.default" in ir and ir.endswith("return %2")
    y.cpu()
    with pytest.raises(ValueError, match="no pending computation"):
        lazyxla.debug.ir_text([y])
    assert inspect.getdoc(lazyxla.debug.stablehlo_text)
