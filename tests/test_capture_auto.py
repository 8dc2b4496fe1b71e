"""Capture by default (``lazyxla.config.capture``, ``LAZYXLA_CAPTURE=1``): step functions wrapped by
``lazyxla.compile(fn)`` or torch_xla's ``torch_xla.compile(fn)`` replay without editing the script, and compute
what an explicit ``capture=True`` computes; ``with`` regions and ``capture=False`` are left as they were."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch
from torch import nn

import lazyxla
from tests.fsdpv2_workers import cpu_reference
from tests.util import ROOT, run_python

STEPS = 7


@pytest.fixture
def capture_on():
    before = lazyxla.config.capture
    lazyxla.config.capture = True
    try:
        yield
    finally:
        lazyxla.config.capture = before


def _train(wrap) -> tuple[list[float], list[torch.Tensor], object]:
    dev = lazyxla.device()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)) for _ in range(STEPS)]

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    run = wrap(step)
    losses = [run(x.to(dev), y.to(dev)).item() for x, y in batches]
    return losses, [p.detach().cpu() for p in model.parameters()], run


def test_a_compiled_step_captures_by_default_when_the_flag_is_on(capture_on):
    lazyxla.metrics.reset()
    losses, params, run = _train(lazyxla.compile)
    assert run.capture_status == "replaying"
    assert lazyxla.metrics.counters().get("capture_replays", 0) == STEPS - 3  # calls 1-3 learn, record, verify
    lazyxla.config.capture = False
    want_losses, want_params, _ = _train(lambda f: lazyxla.compile(f, capture=True))  # the explicit form
    assert losses == want_losses
    for a, b in zip(params, want_params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_capture_false_and_with_regions_opt_out(capture_on):
    lazyxla.metrics.reset()
    _, _, run = _train(lambda f: lazyxla.compile(f, capture=False))
    with pytest.raises(ValueError, match="does not capture"):
        _ = run.capture_status
    dev = lazyxla.device()
    x = torch.ones(3, device=dev)
    for _ in range(4):
        with lazyxla.compile():
            x = x * 2
    assert x.cpu().tolist() == [16.0] * 3
    assert lazyxla.metrics.counters().get("capture_replays", 0) == 0


def test_the_flag_off_leaves_compiled_steps_recorded():
    assert not lazyxla.config.capture
    lazyxla.metrics.reset()
    _train(lazyxla.compile)
    assert lazyxla.metrics.counters().get("capture_replays", 0) == 0


WRAPPER = """
import runpy, sys
import torch_xla.debug.metrics as met
script = sys.argv[1]
sys.argv = [script] + sys.argv[2:]
runpy.run_path(script, run_name="__main__")
print(f"capture replays={met.counter_value('capture_replays') or 0} marks={met.counter_value('MarkStep') or 0}")
"""


@pytest.mark.parametrize("capture", ["1", "0"])
def test_a_torch_xla_script_replays_its_compiled_step_unmodified(tmp_path, torch_xla, monkeypatch, capture):
    """examples/torch_xla/eager_train.py (a ``torch_xla.compile(step_fn, full_graph=True)`` step, batches prepared
    op by op in eager mode) under ``python -m lazyxla.run`` with ``LAZYXLA_CAPTURE=1``: the step replays from its
    fourth call, losses as on the CPU, torch_xla's step markers as without capture."""
    script = ROOT / "examples" / "torch_xla" / "eager_train.py"
    monkeypatch.syspath_prepend(str(script.parent))  # (its model module, imported as the script imports it)
    (tmp_path / "wrap.py").write_text(WRAPPER)
    steps = 8
    proc = run_python(
        ["-m", "lazyxla.run", "wrap.py", str(script), "--steps", str(steps)],
        tmp_path,
        PYTHONPATH=f"{ROOT}:{script.parent}",
        LAZYXLA_CAPTURE=capture,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = [float(v) for v in re.findall(r"^loss step=\d+ value=(\S+)$", proc.stdout, re.M)]
    replays, marks = map(int, re.search(r"^capture replays=(\d+) marks=(\d+)$", proc.stdout, re.M).groups())
    assert replays == (steps - 3 if capture == "1" else 0)
    assert marks >= 2 * steps  # a region marks a step on entry and on exit, replayed or not
    spec = importlib.util.spec_from_file_location("_eager_train_example", script)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    want, _, _ = cpu_reference(ex, ex.parse_args(["--steps", str(steps)]), scale=ex.token_scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
