"""Benchmarks: lazyxla vs eager PyTorch (CPU) vs the same math in pure jax.jit, in one run.

Usage: ``python -m benchmarks.run [--quick] [--json PATH] [--steps N] [--warmup N] [--repeats N]``
(``make bench``). Sections, each printed as a table with medians, min–max and ratios to jax.jit:

(a), (b) a training step of an MLP and of a small GPT, the frameworks' steps interleaved in rounds: jax.jit,
    eager, lazyxla (lazy mode) and lazyxla compiled (model + loss and ``opt.step`` under
    torch.compile(backend="lazyxla")), with each torch step's host time before the sync (recording); each torch
    framework in both loop idioms: ``zero_grad()`` after ``step()``, and first in the loop (", zero_grad first":
    the gradients are alive at the sync);
(c) time to the first step (tracing + compile) in a fresh process per framework and model, and for
    lazyxla also with a warm persistent compilation cache;
(d) recording cost: a chain of tiny ops, µs per op (lazy mode, and the chain under torch.compile);
(e) peak memory of a short training run, from the same fresh processes as (c);
(f) lazyxla's compiles per step, lazy and compiled (none after step 2 is the target);
(g) overlap: lazyxla's step with each loss read at once vs one step late (recording step N+1 while the
    device runs step N);
(h) program size: StableHLO lines of lazyxla's warm training step against jax.value_and_grad's;
(i) host time of a warm step, each framework alone (jax.jit, lazy mode, whole-step capture in both idioms), at
    the benchmark size and with the same model structure at negligible compute (the host's part on an
    accelerator);
(j) Hugging Face GPT-2 and Llama training steps (``benchmarks/hf.py``): host ms per warm step of eager, lazy mode,
    captured and torch.compile, and torch_xla's lazy mode and openxla when its venv exists;
(k) an SPMD training step on 8 devices (``benchmarks/spmd.py``): host ms per warm step, lazy mode and captured,
    FSDP and a 2 x 4 mesh;
(l) Hugging Face ``generate()`` (``benchmarks/generate.py``): ms per decode token (wall and CPU) replayed, recorded
    and eager, tokens compared with the CPU's, GPT-2, Llama and T5 with a static cache, greedy and sampling.

All results go to a JSON file (default ``build/bench.json``). Method: ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import report as R
from benchmarks import spec as S
from benchmarks.child import MARKER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST_STEPS_SHOWN = 5
# what --only chooses from: (a)(b)(f) training, (i) host, (g) overlap, (h) program_size, (c)(e) fresh, (d) recording,
# (j) hf
SECTIONS = ("training", "host", "overlap", "program_size", "fresh", "recording", "hf", "spmd", "generate")
# the frameworks whose compiles per step are counted
LAZY_FRAMEWORKS = tuple(fw for fw in S.FRAMEWORKS if fw.startswith("lazyxla"))
# Idle OpenMP workers (PyTorch's) sleep instead of spinning: three runtimes share this process and the
# cores, and spinning workers slowed the other runtimes' steps (and eager's own) several-fold on 2 cores.
ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}

# (c) rows: (framework, label, persistent cache): None = not lazyxla, "off" = LAZYXLA_PERSISTENT_CACHE=0,
# "fill"/"warm" = the first/second process sharing one fresh LAZYXLA_CACHE_DIR with the cache on.
PROCESS_ROWS = (
    ("jax.jit", "jax.jit", None),
    ("eager", "eager", None),
    ("lazyxla", "lazyxla (cache off)", "off"),
    ("lazyxla", "lazyxla (pcache, 1st process)", "fill"),
    ("lazyxla", "lazyxla (pcache, 2nd process)", "warm"),
)


# What (c) keeps from the last process of a row besides the timings (lazyxla's counters, warnings).
CHILD_DETAILS = (
    "compiles_per_step",
    "persistent_cache_flag",
    "persistent_cache_hits",
    "compile_s",
    "timers_s",
    "fallbacks",
    "warnings",
)


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _run_child(framework: str, model: str, quick: bool, steps: int, env_extra: dict[str, str]) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # jax's own disk cache would make jax.jit warm
    env["LAZYXLA_PERSISTENT_CACHE"] = "0"
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "benchmarks.child", framework, model, "--steps", str(steps)]
    cmd += ["--quick"] if quick else []
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            result = json.loads(line[len(MARKER) :])
            warnings = [w.strip() for w in proc.stderr.splitlines() if "warn" in w.lower()]
            result["warnings"] = sorted(set(warnings))
            return result
    raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def _process_chain(model: str, rows: list[tuple[str, str, str | None]], quick: bool, steps: int, tag: str):
    """Run ``rows`` of one model one after another (a 'fill' row before its 'warm' row, sharing a cache dir)."""
    cache_dir = tempfile.mkdtemp(prefix="lazyxla-bench-cache-")
    try:
        out = []
        for framework, label, pcache in rows:
            env = {}
            if pcache in ("fill", "warm"):
                env = {"LAZYXLA_PERSISTENT_CACHE": "1", "LAZYXLA_CACHE_DIR": cache_dir}
            _log(f"fresh process {tag}: {model} {label}")
            out.append((label, _run_child(framework, model, quick, steps, env)))
        return model, out
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def fresh_processes(settings: S.Settings, quick: bool, jobs: int = 1) -> tuple[dict, dict]:
    """(c) and (e): every row of ``PROCESS_ROWS`` for each model, ``settings.process_repeats`` rounds, one
    process each; the rows' medians (first step, setup, memory) over the rounds.

    With ``jobs`` > 1 independent processes run side by side (for a quick smoke test: their timings then
    disturb each other); the persistent-cache pair always runs in order.
    """
    runs: dict[str, dict[str, list[dict]]] = {m: {label: [] for _, label, _ in PROCESS_ROWS} for m in S.MODELS}
    chains = []
    repeats = settings.process_repeats
    for r in range(repeats):
        for model in S.MODELS:
            pcache_rows = [row for row in PROCESS_ROWS if row[2] in ("fill", "warm")]
            tag = f"{r + 1}/{repeats}"
            chains += [(model, [row], tag) for row in PROCESS_ROWS if row not in pcache_rows]
            chains.append((model, pcache_rows, tag))
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        steps = settings.memory_steps
        futures = [pool.submit(_process_chain, m, rows, quick, steps, tag) for m, rows, tag in chains]
        for future in futures:
            model, out = future.result()
            for label, result in out:
                runs[model][label].append(result)
    return _summarize_processes(runs, settings)


def _summarize_processes(runs: dict[str, dict[str, list[dict]]], settings: S.Settings) -> tuple[dict, dict]:
    first, memory = {}, {}
    for model in S.MODELS:
        first[model], memory[model] = {}, {}
        for framework, label, pcache in PROCESS_ROWS:
            rs = runs[model][label]
            first[model][label] = {
                "framework": framework,
                "persistent_cache": pcache,
                "first_step": R.summary([x["first_step_s"] for x in rs], scale=1.0, unit="s"),
                "setup": R.summary([x["setup_s"] for x in rs], scale=1.0, unit="s"),
                "first_loss": rs[-1]["losses"][0],
            }
            for key in CHILD_DETAILS:
                if key in rs[-1]:
                    first[model][label][key] = rs[-1][key]
            if pcache in (None, "off"):
                mems = [x["memory"] for x in rs]
                steady = [m["steady_peak_growth_mb"] for m in mems]
                memory[model][framework] = {
                    "peak_growth": R.summary([m["peak_growth_mb"] for m in mems], scale=1.0, unit="mb"),
                    "steady_peak_growth": None if None in steady else R.summary(steady, scale=1.0, unit="mb"),
                    "baseline_mb": mems[-1]["baseline_mb"],
                    "peak_mb": mems[-1]["peak_mb"],
                    "steps": settings.memory_steps,
                    "method": mems[-1]["method"],
                }
                if "xla_buffers_peak_mb" in mems[-1]:
                    memory[model][framework]["xla_buffers_peak"] = R.summary(
                        [m["xla_buffers_peak_mb"] for m in mems], scale=1.0, unit="mb"
                    )
                for key in ("process_peak", "torch_import"):  # (absent from a child that cannot read /proc)
                    values = [m.get(key + "_mb") for m in mems]
                    if None not in values:
                        memory[model][framework][key] = R.summary(values, scale=1.0, unit="mb")
        floor = first[model]["jax.jit"]["first_step"]["median_s"]
        for row in first[model].values():
            row["ratio_to_jax"] = R.ratio(row["first_step"]["median_s"], floor)
        floor = memory[model]["jax.jit"]["peak_growth"]["median_mb"]
        xla_floor = memory[model]["jax.jit"]["xla_buffers_peak"]["median_mb"]
        process_floor = memory[model]["jax.jit"].get("process_peak", {}).get("median_mb")
        for row in memory[model].values():
            row["ratio_to_jax"] = R.ratio(row["peak_growth"]["median_mb"], floor)
            if "xla_buffers_peak" in row:
                row["xla_buffers_ratio_to_jax"] = R.ratio(row["xla_buffers_peak"]["median_mb"], xla_floor)
            if "process_peak" in row and process_floor:
                peak = row["process_peak"]["median_mb"]
                row["process_ratio_to_jax"] = R.ratio(peak, process_floor)
                torch_mb = row.get("torch_import", {}).get("median_mb", 0.0)
                row["process_ratio_to_jax_without_torch_import"] = R.ratio(peak - torch_mb, process_floor)
    return first, memory


def training(model: str, settings: S.Settings) -> tuple[dict, dict]:
    """(a)/(b) and (f): warm-up, then ``settings.steps`` rounds, each running every framework's step once.

    The order within a round rotates, so no framework always runs right after the same other one.
    Returns the per-framework timings (and, for the torch steps, their host time before the sync) and
    lazyxla's compiles per step (lazy mode; and the compiled path's under ``"compiled"``).
    """
    import lazyxla

    spec = settings.spec(model)
    steps = {fw: S.make_step(fw, model, spec) for fw in S.FRAMEWORKS}
    lazyxla.metrics.reset()
    compiles: dict[str, list[int]] = {fw: [] for fw in LAZY_FRAMEWORKS}
    losses: dict[str, list[float]] = {fw: [] for fw in S.FRAMEWORKS}
    times: dict[str, list[float]] = {fw: [] for fw in S.FRAMEWORKS}
    records: dict[str, list[float]] = {fw: [] for fw in S.FRAMEWORKS}
    hosts: dict[str, list[float]] = {fw: [] for fw in S.FRAMEWORKS}

    def call(fw: str) -> float:
        before = lazyxla.metrics.counters()["compiles"]
        t = time.perf_counter()
        losses[fw].append(steps[fw]())
        elapsed = time.perf_counter() - t
        if fw in compiles:
            compiles[fw].append(lazyxla.metrics.counters()["compiles"] - before)
        return elapsed

    for _ in range(settings.warmup):
        for fw in S.FRAMEWORKS:
            call(fw)
    n = len(S.FRAMEWORKS)
    for r in range(settings.steps):
        for fw in S.FRAMEWORKS[r % n :] + S.FRAMEWORKS[: r % n]:
            times[fw].append(call(fw))
            recorded = getattr(steps[fw], "record_s", None)
            if recorded is not None:
                records[fw].append(recorded)
            hosts[fw].append(steps[fw].host_s)
    counters = lazyxla.metrics.counters()
    result: dict[str, Any] = {
        "description": spec.describe(),
        "spec": dataclasses.asdict(spec),
        "warmup": settings.warmup,
        "steps": settings.steps,
        "frameworks": {},
    }
    floor = R.summary(times["jax.jit"])["median_ms"]
    lazy = R.summary(times["lazyxla"])["median_ms"]
    for fw in S.FRAMEWORKS:
        row = R.summary(times[fw])
        row["ratio_to_jax"] = R.ratio(row["median_ms"], floor)
        row["ratio_to_lazyxla"] = R.ratio(row["median_ms"], lazy)
        row["record"] = R.summary(records[fw]) if records[fw] else None  # host time before the sync
        row["host"] = R.summary(hosts[fw])  # the step's thread CPU time before its loss is read
        row["first_loss"], row["last_loss"] = losses[fw][0], losses[fw][-1]
        result["frameworks"][fw] = row
    result["lazyxla_fallbacks"] = {k: v for k, v in counters.items() if k.startswith("fallback.")}
    result["lazyxla_timers"] = lazyxla.metrics.timers()
    comp = _compiles_summary(compiles["lazyxla"])
    comp["compiled"] = _compiles_summary(compiles["lazyxla compiled"])
    comp["captured"] = _compiles_summary(compiles["lazyxla captured"])
    comp["replays"] = counters.get("capture_replays", 0)
    comp["zero_grad_first"] = {
        fw: _compiles_summary(compiles[fw]) for fw in LAZY_FRAMEWORKS if fw.endswith(S.ZERO_GRAD_FIRST)
    }
    steps.clear()
    gc.collect()
    lazyxla.sync(wait=True)
    return result, comp


def _compiles_summary(per_step: list[int]) -> dict[str, Any]:
    return {
        "per_step": per_step,
        "first_steps": per_step[:FIRST_STEPS_SHOWN],
        "after_step_2": sum(per_step[2:]),
        "steps": len(per_step),
    }


def _meta(args: argparse.Namespace, settings: S.Settings) -> dict[str, Any]:
    import jax
    import torch

    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
        git = rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        git = None
    return {
        "argv": sys.argv[1:],
        "quick": args.quick,
        "settings": dataclasses.asdict(settings),
        "repeats": args.repeats,
        "jobs": args.jobs,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "git": git,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "sections": args.only.split(","),
        "env": {name: os.environ.get(name) for name in ENV_DEFAULTS},
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(d) for d in jax.local_devices()],
    }


# ---- tables -------------------------------------------------------------------------------------------------


def training_table(tag: str, res: dict, comp: dict) -> str:
    """The (a)/(b) table of one model."""
    rows = []
    for fw, r in res["frameworks"].items():
        rng = R.fmt_range(r["min_ms"], r["max_ms"])
        record = (r.get("record") or {}).get("median_ms")
        host = (r.get("host") or {}).get("median_ms")
        cells = [fw, R.fmt(r["median_ms"]), rng, R.fmt(r["ratio_to_jax"]), R.fmt(r.get("ratio_to_lazyxla"))]
        rows.append([*cells, R.fmt(record), R.fmt(host), R.fmt(r["last_loss"], 5)])
    fallbacks = ", ".join(f"{k}={v}" for k, v in res["lazyxla_fallbacks"].items()) or "none"
    notes = [
        f"lazyxla compiles in steps 1..{len(comp['first_steps'])}: {comp['first_steps']}; "
        f"after step 2: {comp['after_step_2']} (over {comp['steps']} steps); CPU fallbacks: {fallbacks}",
        "lazyxla compiled: model + loss and opt.step under torch.compile(backend='lazyxla') (one forward, one "
        "backward and one optimizer IR op per step).",
        "record ms: host time of a step before its sync (forward, backward, optimizer; eager computes meanwhile).",
        "host ms per warm step: CPU time of the step's thread until its loss is read (recording, sync and dispatch;"
        " jax.jit: its dispatch; eager: its computation) - on an accelerator, the host's part of a step.",
        "lazyxla captured: the whole step under lazyxla.compile(capture=True), replayed once verified (AdamW made "
        "capturable, as torch.compile does).",
        f"'{S.ZERO_GRAD_FIRST[2:]}': opt.zero_grad() at the top of the loop (the gradients are alive at the sync); "
        "without it, zero_grad() after opt.step().",
    ]
    if "compiled" in comp:
        c = comp["compiled"]
        notes.append(
            f"lazyxla compiled: compiles in steps 1..{len(c['first_steps'])}: {c['first_steps']}; "
            f"after step 2: {c['after_step_2']}"
        )
    for fw, c in comp.get("zero_grad_first", {}).items():
        shown = f"compiles in steps 1..{len(c['first_steps'])}: {c['first_steps']}"
        notes.append(f"{fw}: {shown}; after step 2: {c['after_step_2']}")
    title = (
        f"({tag}) {res['description']}\n"
        f"    {res['steps']} measured steps per framework after {res['warmup']} warm-up, interleaved; "
        "each step synced and its loss read"
    )
    header = ["framework", "median ms", "min–max ms", "x jax.jit", "x lazyxla", "record ms", "host ms", "loss at end"]
    return R.table(title, header, rows, notes)


def first_step_table(first: dict, repeats: int, jobs: int) -> str:
    """The (c) table."""
    rows = []
    for model, by_label in first.items():
        for label, r in by_label.items():
            fs, setup = r["first_step"], r["setup"]
            cells = [f"{model} {label}", R.fmt(fs["median_s"]), R.fmt_range(fs["min_s"], fs["max_s"])]
            cells += [R.fmt(r["ratio_to_jax"]), R.fmt(setup["median_s"]), str(r.get("compiles_per_step", "-"))]
            rows.append([*cells, R.fmt(r.get("persistent_cache_hits")), R.fmt(r.get("compile_s"))])
    notes = [
        "first step: build done (imports, model, optimizer, data on the device), then one step until its loss is",
        "read: tracing + compile + run. setup: process start of the measurement to that point (imports + build).",
        "lazyxla (cache off): LAZYXLA_PERSISTENT_CACHE=0. pcache rows: LAZYXLA_PERSISTENT_CACHE=1 and one fresh",
        "LAZYXLA_CACHE_DIR shared by two processes in a row; the 2nd process is the warm-cache number.",
        "lazyxla columns: compiles/step = metrics 'compiles' per step (programs built: compiled or loaded from",
        "disk); disk hits = 'persistent_cache_hits'; compile s = the 'compile' timer's total over the run.",
    ]
    flags = {
        r.get("persistent_cache_flag") for by in first.values() for r in by.values() if r["framework"] == "lazyxla"
    }
    warned = sorted({w for by in first.values() for r in by.values() for w in r.get("warnings", [])})
    notes += [f"warning in a fresh process: {w[:200]}" for w in warned]
    if False in flags:
        notes.append(
            "lazyxla has no `persistent_cache` flag yet: the env vars are ignored and every lazyxla row is cold."
        )
    title = (
        f"(c) time to first step, a fresh process per row (cold caches); median of {repeats} "
        f"process{'es' if repeats > 1 else ''}"
    )
    if jobs > 1:
        title += f"; {jobs} processes ran side by side, so these times disturb each other"
    header = ["model / framework", "first step s", "min–max s", "x jax.jit", "setup s", "compiles/step", "disk hits"]
    header.append("compile s")
    return R.table(title, header, rows, notes)


def memory_table(memory: dict, settings: S.Settings) -> str:
    """The (e) table."""
    rows = []
    methods = set()
    for model, by_fw in memory.items():
        for fw, r in by_fw.items():
            pg, st = r["peak_growth"], r["steady_peak_growth"]
            cells = [f"{model} {fw}", R.fmt(pg["median_mb"], 1), R.fmt_range(pg["min_mb"], pg["max_mb"], 1)]
            cells += [R.fmt(r["ratio_to_jax"]), R.fmt(st["median_mb"] if st else None, 1), R.fmt(r["baseline_mb"], 1)]
            xb = r.get("xla_buffers_peak")
            cells += [R.fmt(xb["median_mb"], 1) if xb else "-", R.fmt(r.get("xla_buffers_ratio_to_jax"))]
            pp, ti = r.get("process_peak"), r.get("torch_import")
            cells += [R.fmt(pp["median_mb"], 1) if pp else "-", R.fmt(r.get("process_ratio_to_jax"))]
            cells += [R.fmt(ti["median_mb"], 1) if ti else "-"]
            cells += [R.fmt(r.get("process_ratio_to_jax_without_torch_import"))]
            rows.append(cells)
            methods.add(r["method"])
    notes = [f"method: {m}" for m in sorted(methods)]
    notes += [
        "run = steps 1..N, compilation included (the compiler's memory counts); steady = steps 3..N over the same",
        "baseline. RSS rarely shrinks (allocators keep freed memory), so steady is usually the run's peak too.",
        "Both XLA frameworks start XLA's compiler in setup (one tiny jax.jit program): its one-time start is in both",
        "baselines (jax.jit's setup compiles anyway). PyTorch creates the optimizer state in step 1 (in the run),",
        "jax.jit's reference in setup (in the baseline).",
        "XLA buffers: peak device memory as XLA accounts for it (live jax arrays before a step + the step program's",
        "temporaries and non-donated outputs, from memory_analysis()); no compiler or host runtime.",
        "process peak: the process's peak RSS from its start (imports, setup, the run); torch import: the RSS",
        "importing torch added (first and alone; jax.jit's process never imports it); 'w/o torch': (process peak -",
        "torch import) / jax.jit's process peak.",
    ]
    title = (
        f"(e) peak memory growth of a {settings.memory_steps}-step training run, a fresh process per row (the "
        f"processes of (c), cache off); median of {settings.process_repeats}"
    )
    header = ["model / framework", "run peak MB", "min–max MB", "x jax.jit", "steady peak MB", "after setup MB"]
    header += ["XLA buffers MB", "x jax.jit", "process peak MB", "x jax.jit", "torch import MB", "x w/o torch"]
    return R.table(title, header, rows, notes)


def recording_table(rec: dict) -> str:
    """The (d) table."""
    lz, jx = rec["lazyxla"], rec["jax"]
    floor = jx["jit_warm_total"]["median_us"]
    entries = [
        ("eager PyTorch, loop", rec["eager"]["loop"]),
        ("lazyxla cold, loop (recording)", lz["cold_loop"]),
        ("lazyxla cold, loop + sync + read", lz["cold_total"]),
        ("lazyxla warm, loop (recording)", lz["warm_loop"]),
        ("lazyxla warm, loop + sync + read", lz["warm_total"]),
    ]
    cz = rec.get("lazyxla_compiled")
    if cz:
        entries += [
            ("lazyxla compiled cold, call (Dynamo + trace)", cz["cold_loop"]),
            ("lazyxla compiled cold, call + sync + read", cz["cold_total"]),
            ("lazyxla compiled warm, call (recording)", cz["warm_loop"]),
            ("lazyxla compiled warm, call + sync + read", cz["warm_total"]),
        ]
    entries += [
        ("jax.jit cold, trace+compile+run+read", jx["jit_cold_total"]),
        ("jax.jit warm, call + read", jx["jit_warm_total"]),
        ("jax op by op (no jit) + read", jx["op_by_op_total"]),
    ]
    rows = [
        [
            name,
            R.fmt(s["median_us"]),
            R.fmt_range(s["min_us"], s["max_us"]),
            R.fmt(R.ratio(s["median_us"], floor), 1),
            str(s["samples"]),
        ]
        for name, s in entries
    ]
    c = rec["op_counts"]
    notes = [
        f"ops = torch calls: {rec['ops']} = {c['mul']} mul (x * 1.0001) + {c['add']} add (x + 0.0001) "
        f"+ {c['sin']} sin, cycling mul, add, sin.",
        "Each number: wall time / ops. cold = first run of the chain in this process.",
        f"lazyxla recorded {lz['ops_recorded_per_chain']} ops per chain; compiles: cold {lz['compiles_cold']}, "
        f"warm {lz['compiles_warm']} (target 0).",
    ]
    if cz:
        notes.append(
            f"lazyxla compiled: the chain under torch.compile(backend='lazyxla'); a warm call records "
            f"{cz['ops_recorded_warm']} ops and {cz['graph_calls_warm']} compiled-graph op (the first call traced "
            f"{cz['ops_recorded_cold']}); compiles: cold {cz['compiles_cold']}, warm {cz['compiles_warm']}."
        )
    title = (
        f"(d) recording cost: chain of {rec['ops']} torch calls on a {rec['shape'][0]}x{rec['shape'][1]} float32 tensor"
    )
    header = ["", "µs/op", "min–max µs", "x jax.jit warm", "samples"]
    return R.table(title, header, rows, notes)


def compiles_table(compiles: dict, first: dict | None) -> str:
    """The (f) table."""
    rows = []
    for model, c in compiles.items():
        cells = [model, str(c["first_steps"]), str(c["after_step_2"]), str(c["steps"])]
        cold = (first or {}).get(model, {}).get("lazyxla (cache off)", {}).get("compiles_per_step")
        rows.append([*cells, str(cold) if cold is not None else "-"])
        if "compiled" in c:
            cc = c["compiled"]
            rows.append([f"{model} compiled", str(cc["first_steps"]), str(cc["after_step_2"]), str(cc["steps"]), "-"])
    title = "(f) lazyxla compiles per step, lazy mode and torch.compile (target: none after step 2)"
    header = ["model", f"steps 1..{FIRST_STEPS_SHOWN}", "after step 2", "steps", "fresh process (c)"]
    return R.table(title, header, rows)


# ---- main ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every benchmark, print the tables, write the JSON; returns the results."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes and few steps: a smoke test, not a measurement"
    )
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "bench.json"), help="where to write the results")
    parser.add_argument("--steps", type=int, default=None, help="measured training steps per framework, (a) and (b)")
    parser.add_argument("--warmup", type=int, default=None, help="training steps before measuring")
    parser.add_argument(
        "--repeats", type=int, default=None, help="fresh processes per row in (c) and (e) (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="fresh processes run side by side (default 1; 2 with --quick)"
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run, of {', '.join(SECTIONS)} (default: all)",
    )
    args = parser.parse_args(argv)
    sections = args.only.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    settings = S.Settings.quick() if args.quick else S.Settings.full()
    changes = {k: getattr(args, k) for k in ("steps", "warmup") if getattr(args, k) is not None}
    if args.repeats is not None:
        changes["process_repeats"] = args.repeats
    settings = dataclasses.replace(settings, **changes)
    args.repeats = settings.process_repeats
    args.jobs = args.jobs or (2 if args.quick else 1)

    # Before torch, jax or lazyxla load: they read these at import (children inherit them).
    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # In this process: no disk cache, so "cold" below means compiled here (children set their own).
    os.environ["LAZYXLA_PERSISTENT_CACHE"] = "0"
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    import lazyxla  # noqa: F401  (before any CPU autograd runs: see docs/performance.md)
    from benchmarks import generate, hf, host, overlap, program_size, recording, spmd

    start = time.perf_counter()
    results: dict[str, Any] = {"meta": _meta(args, settings)}
    if "training" in sections:
        results["training"], results["compiles"] = {}, {}
        for model in S.MODELS:
            _log(f"training step: {model}")
            results["training"][model], results["compiles"][model] = training(model, settings)
    for name, module, label in (("host", host, "host time alone"), ("overlap", overlap, "overlap")):
        if name in sections:
            results[name] = {}
            for model in S.MODELS:
                _log(f"{label}: {model}")
                results[name][model] = module.run(model, settings)
    if "program_size" in sections:
        _log("program size")
        results["program_size"] = {m: program_size.measure(m, settings.spec(m)) for m in S.MODELS}
    if "fresh" in sections:
        results["first_step"], results["memory"] = fresh_processes(settings, args.quick, args.jobs)
    if "recording" in sections:
        _log("recording cost")
        results["recording"] = recording.run(settings.chain_ops, settings.chain_repeats)
    if "hf" in sections:
        _log("HF training steps (benchmarks/hf.py)")
        # --quick: a smoke test of the hook (tests/test_bench_hf.py tests the module): one model, no torch_xla
        models = hf.MODELS[:1] if args.quick else hf.MODELS
        results["hf"] = hf.run(quick=args.quick, models=models, torch_xla=not args.quick)
    if "spmd" in sections:
        _log("SPMD training step (benchmarks/spmd.py)")
        results["spmd"] = spmd.run(quick=args.quick)
    if "generate" in sections:
        _log("generate() (benchmarks/generate.py)")
        results["generate"] = generate.run(quick=args.quick)
    results["meta"]["wall_s"] = time.perf_counter() - start
    R.write_json(args.json, results)  # before the tables: a table bug loses no measurement
    tables = []
    if "training" in sections:
        for tag, m in (("a", "mlp"), ("b", "gpt")):
            tables.append(training_table(tag, results["training"][m], results["compiles"][m]))
    if "fresh" in sections:
        tables.append(first_step_table(results["first_step"], args.repeats, args.jobs))
    if "recording" in sections:
        tables.append(recording_table(results["recording"]))
    if "fresh" in sections:
        tables.append(memory_table(results["memory"], settings))
    if "training" in sections:
        tables.append(compiles_table(results["compiles"], results.get("first_step")))
    if "overlap" in sections:
        tables.append(overlap.table(results["overlap"]))
    if "program_size" in sections:
        tables.append(program_size.table(results["program_size"]))
    if "host" in sections:
        tables.append(host.table(results["host"]))
    if "hf" in sections:
        tables.append("(j) " + hf.table(results["hf"]))
    if "spmd" in sections:
        tables.append(spmd.table(results["spmd"]))
    if "generate" in sections:
        tables.append("(l) " + generate.table(results["generate"]))
    print("\n\n".join(tables) + "\n", flush=True)
    print(f"wrote {args.json} ({results['meta']['wall_s']:.0f} s)")
    return results


if __name__ == "__main__":
    main()
