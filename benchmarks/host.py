"""(i) Host time of a warm step, each framework alone: the accelerator's bottleneck.

In (a)/(b) the frameworks' steps interleave, so between two captured steps other lazyxla modes record: each
captured step then takes its non-quiet path (a sync first, a scan of the live tensors, every result put through
functionalization). A training loop runs one step function, so here each framework runs its steps in a block of
its own, and the table gives the CPU time of the step's thread until its loss is read (median).

On this CPU backend the XLA program runs on the same cores, and a step's computation evicts the Python objects a
host touches from the caches: each step's host work starts cold, as jax.jit's dispatch does. On an accelerator
the computation runs elsewhere. The second column approximates that: the same model structure (the same layers,
parameters, optimizer state tensors and program arguments) at tiny sizes, whose computation is negligible.

Example::

    results = run("gpt", S.Settings.full())
    print(table({"gpt": results}))
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from benchmarks import report as R
from benchmarks import spec as S

FRAMEWORKS = ("jax.jit", "lazyxla", "lazyxla captured", "lazyxla captured" + S.ZERO_GRAD_FIRST)
WARMUP = 6  # a captured step replays from its third or fourth call


def negligible(spec: S.MLPSpec | S.GPTSpec) -> S.MLPSpec | S.GPTSpec:
    """``spec`` with the same structure (layers, heads, tensors) at tiny sizes: its computation is negligible."""
    if isinstance(spec, S.MLPSpec):
        return S.MLPSpec(sizes=(16,) * (len(spec.sizes) - 1) + (spec.sizes[-1],), batch=8)
    return dataclasses.replace(spec, vocab=64, d_model=4 * spec.heads, seq=8, batch=2)


def _host_ms(framework: str, model: str, spec, steps: int) -> dict[str, Any]:
    step = S.make_step(framework, model, spec)
    for _ in range(WARMUP):
        step()
    hosts, walls = [], []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t)
        hosts.append(step.host_s)
    return {"host": R.summary(hosts), "step": R.summary(walls)}


def run(model: str, settings: S.Settings) -> dict[str, Any]:
    """Per framework, host and step time of ``model`` at its benchmark size and at negligible compute."""
    import lazyxla

    spec = settings.spec(model)
    out: dict[str, Any] = {"sizes": {"benchmark": spec.describe(), "negligible": negligible(spec).describe()}}
    for size, s in (("benchmark", spec), ("negligible", negligible(spec))):
        rows = {fw: _host_ms(fw, model, s, max(settings.steps, 10)) for fw in FRAMEWORKS}
        lazyxla.sync(wait=True)
        floor = rows["jax.jit"]["host"]["median_ms"]
        for row in rows.values():
            row["host_ratio_to_jax"] = R.ratio(row["host"]["median_ms"], floor)
        out[size] = rows
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    """The (i) table: per model and framework, host ms per warm step at both sizes."""
    rows = []
    for model, r in results.items():
        for fw in FRAMEWORKS:
            b, n = r["benchmark"][fw], r["negligible"][fw]
            cells = [R.fmt(b["host"]["median_ms"], 3), R.fmt(b["host_ratio_to_jax"]), R.fmt(b["step"]["median_ms"])]
            rows.append([model, fw, *cells, R.fmt(n["host"]["median_ms"], 3), R.fmt(n["host_ratio_to_jax"])])
    notes = [f"{m}: negligible compute = {r['sizes']['negligible']}" for m, r in results.items()]
    notes.append("host ms: CPU time of the step's thread until its loss is read (median); step ms: wall time.")
    title = "(i) host time per warm step, each framework alone (a block of consecutive steps)"
    header = ["model", "framework", "host ms", "x jax.jit", "step ms", "host ms, negligible compute", "x jax.jit"]
    return R.table(title, header, rows, notes)
