"""Smoke test of ``make bench``'s sections (k) and (l): ``benchmarks/spmd.py`` and ``benchmarks/generate.py`` run
through ``benchmarks.run --quick`` and write their numbers. Timings are never asserted (a shared machine); what
is asserted: every number is there and positive, the captured SPMD step replayed every measured call with no
compile and lazy mode's losses, and generate()'s tokens equal the CPU's with the decode tokens replayed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.util import quick_compile_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--json", str(path), "--only", "spmd,generate"],
        cwd=ROOT,
        env=quick_compile_env(env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "(k) SPMD training step on 8 devices" in proc.stdout, proc.stdout
    assert "(l) generate()" in proc.stdout, proc.stdout
    return json.loads(path.read_text())


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.parametrize("mesh", ["fsdp", "2d"])
def test_spmd_section(results, mesh):
    r = results["spmd"][mesh]
    assert r["devices"] == 8
    for mode in ("lazy", "captured"):
        assert _positive(r[mode]["wall_ms"]["median_ms"]) and _positive(r[mode]["cpu_ms"]["median_ms"])
    assert r["compiles_measured"] == 0
    assert r["replays_measured"] == r["steps_measured"] // 2  # every measured captured call replayed
    assert r["max_loss_difference"] == 0.0  # the captured step computes lazy mode's numbers


def test_generate_section(results):
    (row,) = results["generate"]
    assert row["equal_to_cpu"] and not row["fallbacks"]
    s = row["summary"]
    assert _positive(s["lazyxla_ms_per_token"]) and _positive(s["eager_ms_per_token"])
    assert s["replayed_tokens"] >= 1 and s["programs_per_token"] == 1
