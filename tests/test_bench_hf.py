"""Smoke test of ``benchmarks/hf.py`` (HF GPT-2 / Llama training steps): ``python -m benchmarks.hf --quick`` runs
every lazyxla framework and eager in worker processes, with torch_xla's venv pointed at a folder that does not
exist (so its rows are skipped with a note, as on a machine without it).

Timings are never asserted (a shared machine); only that each number is there, finite and positive, that lazyxla's
losses equal eager PyTorch's on the CPU (same parameters, batch and math), and that the captured step replays
(records no op once warm) while lazy mode records every step.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.util import quick_compile_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORKS = {"eager", "lazyxla", "lazyxla captured", "lazyxla compiled"}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench-hf") / "hf.json"
    missing = tmp_path_factory.mktemp("no-venv") / "absent"
    env = dict(os.environ, TORCH_XLA_PEER_VENV=str(missing))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.hf", "--quick", "--json", str(path)],
        cwd=ROOT,
        env=quick_compile_env(env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "HF training step" in proc.stdout and "torch_xla: skipped, no venv at" in proc.stdout, proc.stdout
    return json.loads(path.read_text())


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_every_framework_measured(results, model):
    rows = results["models"][model]
    assert set(rows) == FRAMEWORKS  # no torch_xla rows without its venv
    for fw, r in rows.items():
        for key in ("host_ms", "cpu_ms", "step_ms"):
            assert _positive(r[key]), (fw, key, r)
        assert r["rounds"] >= 1 and r["ops_per_step"] >= 1, (fw, r)


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_lazyxla_losses_equal_eager(results, model):
    rows = results["models"][model]
    eager = rows["eager"]
    for fw in FRAMEWORKS - {"eager"}:
        assert rows[fw]["first_loss"] == pytest.approx(eager["first_loss"], rel=1e-5), fw
        assert rows[fw]["last_loss"] == pytest.approx(eager["last_loss"], rel=1e-4), fw


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_ops_recorded(results, model):
    rows = results["models"][model]
    assert rows["lazyxla"]["ops_recorded"] > 0  # lazy mode records every op of every step
    assert rows["lazyxla captured"]["ops_recorded"] == 0  # a warm captured step is replayed
    assert _positive(rows["lazyxla"]["us_per_op_cpu"])
