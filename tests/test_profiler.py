"""lazyxla.profiler.trace: a JAX profile with lazyxla's phases named per step."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from tests.models import MLP


def _events(logdir) -> list[dict]:
    files = [f for f in lazyxla.profiler.trace_files(logdir) if f.endswith(".trace.json.gz")]
    assert files, f"no Perfetto trace under {logdir}: {lazyxla.profiler.trace_files(logdir)}"
    with gzip.open(files[0], "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def test_trace_file_has_the_phases_of_every_step(tmp_path, dev):
    torch.manual_seed(0)
    model = MLP().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    with lazyxla.profiler.trace(tmp_path / "prof") as logdir:
        assert lazyxla.profiler.active()
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            lazyxla.sync()
        loss.item()
    assert not lazyxla.profiler.active()
    files = lazyxla.profiler.trace_files(logdir)
    assert any(f.endswith(".xplane.pb") for f in files)  # TensorBoard's format
    names = [e.get("name", "") for e in _events(logdir)]
    steps = [n for n in names if n == "lazyxla.step"]
    assert len(steps) == 3, sorted(set(names))[:50]
    for phase in ("record", "trace", "lower", "compile", "transfer", "execute"):
        assert f"lazyxla.{phase}" in names, f"no lazyxla.{phase} span"
    assert names.count("lazyxla.execute") >= 3  # one program per step (and the .item()'s)
    assert names.count("lazyxla.compile") == lazyxla.metrics.counters()["compiles"] >= 1  # the first step's


def test_one_trace_at_a_time(tmp_path):
    outer = lazyxla.profiler.trace(tmp_path / "a")
    with outer, pytest.raises(RuntimeError, match="already running"), lazyxla.profiler.trace(tmp_path / "b"):
        pass
    assert not lazyxla.profiler.active()
