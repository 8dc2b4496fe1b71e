"""Smoke test of the benchmark harness: ``python -m benchmarks.run --quick`` runs and writes every section.

Timings and ratios are never asserted (they measure a shared machine); only that each number is there,
finite and positive, that lazyxla compiled nothing after step 2, and that the three frameworks agree on
the losses (same parameters, same math).
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
FRAMEWORKS = ("jax.jit", "eager", "lazyxla")
# (a), (b): also torch.compile(backend="lazyxla"), and every torch framework with zero_grad() first in the loop
TRAINING_FRAMEWORKS = (
    *FRAMEWORKS,
    "lazyxla compiled",
    "lazyxla captured",
    *(fw + ", zero_grad first" for fw in ("eager", "lazyxla", "lazyxla compiled", "lazyxla captured")),
)
MODELS = ("mlp", "gpt")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _stats(d: dict, unit: str) -> None:
    for key in (f"median_{unit}", f"min_{unit}", f"max_{unit}"):
        assert _positive(d[key]), (key, d)
    assert d[f"min_{unit}"] <= d[f"median_{unit}"] <= d[f"max_{unit}"], d
    assert d["samples"] >= 1


def _env() -> dict[str, str]:
    """The benchmarks' environment: this checkout on ``PYTHONPATH``, XLA compiling fast (numbers are never timed)."""
    return quick_compile_env(
        dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    )


_SECTIONS = ("training", "host", "overlap", "program_size", "fresh", "recording")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    env = _env()
    proc = subprocess.run(
        # every section but (j): tests/test_bench_hf.py runs benchmarks/hf.py itself (here it would add ~90 s)
        [sys.executable, "-m", "benchmarks.run", "--quick", "--json", str(path), "--only", ",".join(_SECTIONS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    titles = ("(a) MLP", "(b) GPT", "(c) time to first step", "(d) recording cost", "(e) peak memory", "(f)")
    for title in (*titles, "(g) overlap", "(h) program size", "(i) host time per warm step"):
        assert title in proc.stdout, proc.stdout
    return json.loads(path.read_text())


def test_every_section_is_there(results):
    sections = {"meta", "training", "first_step", "recording", "memory", "compiles", "overlap", "program_size", "host"}
    assert sections <= set(results)
    assert results["meta"]["quick"] is True
    assert _positive(results["meta"]["wall_s"])


@pytest.mark.parametrize("model", MODELS)
def test_training_steps(results, model):
    res = results["training"][model]
    assert set(res["frameworks"]) == set(TRAINING_FRAMEWORKS)
    for fw, row in res["frameworks"].items():
        _stats(row, "ms")
        if fw != "jax.jit":
            _stats(row["record"], "ms")  # host time before the sync
        _stats(row["host"], "ms")  # host ms per warm step, for every mode
        assert row["samples"] == res["steps"] >= 1
        assert _positive(row["ratio_to_jax"]), fw
        assert _positive(row["last_loss"]), fw
    losses = [row["last_loss"] for row in res["frameworks"].values()]
    assert max(losses) - min(losses) < 1e-3 * max(losses), losses  # same parameters, data and math
    assert res["lazyxla_fallbacks"] == {}


@pytest.mark.parametrize("model", MODELS)
def test_program_size(results, model):
    """(h): StableHLO lines of lazyxla's warm step and of jax.value_and_grad's, and their ratio."""
    r = results["program_size"][model]
    assert type(r["lazyxla"]) is int and type(r["jax.jit"]) is int and r["lazyxla"] > 0 and r["jax.jit"] > 0, r
    assert r["ratio"] == r["lazyxla"] / r["jax.jit"]


@pytest.mark.parametrize("model", MODELS)
def test_compiles_per_step(results, model):
    comp = results["compiles"][model]
    assert comp["steps"] == len(comp["per_step"]) >= 3
    assert comp["per_step"][0] >= 1  # the first step compiles
    assert comp["after_step_2"] == sum(comp["per_step"][2:]) == 0
    assert comp["compiled"]["per_step"][0] >= 1 and comp["compiled"]["after_step_2"] == 0
    assert comp["captured"]["after_step_2"] == 0 and comp["replays"] >= 1  # whole-step capture replays
    for fw in ("lazyxla, zero_grad first", "lazyxla compiled, zero_grad first"):  # the other idiom: as stable
        assert comp["zero_grad_first"][fw]["after_step_2"] == 0, comp["zero_grad_first"]


@pytest.mark.parametrize("model", MODELS)
def test_first_step_in_fresh_processes(results, model):
    rows = results["first_step"][model]
    assert {r["framework"] for r in rows.values()} == set(FRAMEWORKS)
    assert {r["persistent_cache"] for r in rows.values()} == {None, "off", "fill", "warm"}
    for label, r in rows.items():
        _stats(r["first_step"], "s")
        _stats(r["setup"], "s")
        assert _positive(r["ratio_to_jax"]), label
        assert _positive(r["first_loss"]), label
        if r["framework"] == "lazyxla":
            assert r["fallbacks"] == {}, label
            assert r["compiles_per_step"][0] >= 1, label


@pytest.mark.parametrize("model", MODELS)
def test_memory(results, model):
    mem = results["memory"][model]
    assert set(mem) == set(FRAMEWORKS)
    for fw, r in mem.items():
        _stats(r["peak_growth"], "mb")
        assert _positive(r["baseline_mb"]) and _positive(r["peak_mb"]), fw
        assert r["method"], fw
        assert r["steady_peak_growth"] is None or _positive(r["steady_peak_growth"]["median_mb"]), fw
        if fw != "eager":
            _stats(r["xla_buffers_peak"], "mb")
            assert _positive(r["xla_buffers_ratio_to_jax"]), fw
        # the whole process's peak (imports and setup too), and what importing torch alone added to its RSS
        _stats(r["process_peak"], "mb")
        assert r["process_peak"]["median_mb"] >= r["peak_growth"]["median_mb"], fw
        assert _positive(r["process_ratio_to_jax"]) and _positive(r["process_ratio_to_jax_without_torch_import"]), fw
        if fw == "jax.jit":
            assert r["torch_import"]["max_mb"] == 0 and r["process_ratio_to_jax"] == 1, fw
        else:
            _stats(r["torch_import"], "mb")
            assert r["process_ratio_to_jax_without_torch_import"] < r["process_ratio_to_jax"], fw


def test_recording(results):
    rec = results["recording"]
    assert rec["ops"] == sum(rec["op_counts"].values()) >= 3
    rows = [rec["eager"]["loop"]]
    rows += [rec["lazyxla"][k] for k in ("cold_loop", "cold_total", "warm_loop", "warm_total")]
    rows += [rec["jax"][k] for k in ("jit_cold_total", "jit_warm_total", "op_by_op_total")]
    for row in rows:
        _stats(row, "us")
    assert rec["lazyxla"]["compiles_cold"] >= 1
    assert rec["lazyxla"]["compiles_warm"] == 0
    assert rec["lazyxla"]["ops_recorded_per_chain"] > 0
    compiled = rec["lazyxla_compiled"]
    for key in ("cold_loop", "cold_total", "warm_loop", "warm_total"):
        _stats(compiled[key], "us")
    assert compiled["compiles_warm"] == 0 and compiled["ops_recorded_warm"] == 0 and compiled["graph_calls_warm"] == 1


@pytest.mark.parametrize("model", MODELS)
def test_host_time_alone(results, model):
    """(i): every framework's host and step times, at the benchmark's size and at negligible compute."""
    r = results["host"][model]
    for size in ("benchmark", "negligible"):
        assert set(r[size]) == {"jax.jit", "lazyxla", "lazyxla captured", "lazyxla captured, zero_grad first"}
        for fw, row in r[size].items():
            _stats(row["host"], "ms")
            _stats(row["step"], "ms")
            assert _positive(row["host_ratio_to_jax"]), fw
    assert r["sizes"]["negligible"] != r["sizes"]["benchmark"]


@pytest.mark.parametrize("model", MODELS)
def test_overlap(results, model):
    r = results["overlap"][model]
    for way in ("host", "device", "serial", "pipelined"):
        _stats(r[way], "ms")


def test_scan_benchmark_smoke(tmp_path):
    """``python -m benchmarks.scan --quick``, one row: every number is there, one program built."""
    path = tmp_path / "scan.json"
    env = _env()
    cmd = [sys.executable, "-m", "benchmarks.scan", "--quick", "--layers", "2", "--modes", "stacked"]
    proc = subprocess.run(
        [*cmd, "--parts", "model", "--json", str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "forward+backward" in proc.stdout
    rows = json.loads(path.read_text())["rows"]
    assert [(r["layers"], r["mode"], r["part"]) for r in rows] == [(2, "stacked", "model")]
    assert all(_positive(rows[0][k]) for k in ("compile_s", "build_cpu_s", "first_step_s", "hlo_lines")), rows
    assert rows[0]["compiles"] == 1


def test_only_runs_the_sections_asked_for(tmp_path):
    path = tmp_path / "bench.json"
    env = _env()
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--json", str(path)]
    proc = subprocess.run(
        [*cmd, "--only", "program_size"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "(h) program size" in proc.stdout and "(a) MLP" not in proc.stdout, proc.stdout
    results = json.loads(path.read_text())
    assert set(results) == {"meta", "program_size"} and results["meta"]["sections"] == ["program_size"]
    bad = subprocess.run([*cmd, "--only", "trainig"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown section(s) trainig" in bad.stderr, bad.stderr


def test_agreement_compares_every_step_in_float32_and_bfloat16_autocast(tmp_path):
    path = tmp_path / "agreement.json"
    # XLA at its default optimizations here: this one compares numbers (and compiling faster saved nothing)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.agreement",
        "--quick",
        "--steps",
        "2",
        "--models",
        "mlp",
        "--json",
        str(path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    results = json.loads(path.read_text())
    assert set(results) == {"mlp, float32", "mlp, bfloat16 autocast"}
    for row in results.values():
        assert len(row["eager"]) == len(row["lazyxla"]) == 2 and row["agree"], row
        assert all(_positive(x) for x in row["eager"] + row["lazyxla"])
