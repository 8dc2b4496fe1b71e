"""Compile time against depth: a GPT whose blocks run as ``lazyxla.scan_layers`` vs the unrolled loop.

Usage: ``python -m benchmarks.scan [--layers 2,4,8,16,24] [--modes scan,stacked,unrolled] [--parts model,step]
[--repeats N] [--json PATH] [--quick]`` (``make bench-scan``).

Each row is a fresh process (every cache cold, ``LAZYXLA_PERSISTENT_CACHE=0``) that builds the benchmark GPT
(``benchmarks.spec.GPTSpec``: d_model 256, 4 heads, seq 128, batch 8, vocab 1024) with the given number of
layers, its blocks run by ``lazyxla.scan_layers`` (mode ``scan``), held as ``lazyxla.StackedLayers``
(``stacked``: the parameters stacked, one tensor per name) or as the plain loop (``unrolled``), and runs ONE
first step, then reports:

- ``compile s``: XLA's compile time of that step's programs (lazyxla's ``compile`` timer, wall clock);
- ``build CPU s``: the process's CPU time over the ``lazyxla.sync()`` that lowers and compiles the step (its
  run is asynchronous): the compiler's work, much less sensitive than wall time to other processes sharing
  the cores;
- ``lower s``: jax tracing of the programs (the ``lower`` timer);
- ``first step s``: wall time from the first recorded op to the loss on the host (record + lower + compile
  + run);
- ``HLO lines``: the StableHLO text of the step's program (``lazyxla.debug.stablehlo_text``), its size.

Parts: ``model`` is forward, loss and backward (the gradients computed), what ``scan_layers`` turns into
loops; ``step`` adds ``torch.optim.AdamW``'s update and ``zero_grad``, whose program grows with the number
of parameter tensors (12 per layer with ``scan`` and ``unrolled``, 12 in all with ``stacked``). Results and
method: ``docs/performance.md`` ("Deep models").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks import report as R
from benchmarks import spec as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "SCAN-RESULT "


def child(mode: str, layers: int, part: str, quick: bool) -> dict[str, Any]:
    """One first step in this (fresh) process; the numbers of the module doc."""
    import torch  # (a child process: it imports what it measures)
    import torch.nn.functional as F

    import lazyxla
    from benchmarks.torch_models import GPT

    class ScannedGPT(GPT):
        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            blocks = lazyxla.scan_layers if mode == "scan" else lambda blocks, x: blocks(x)
            return self.head(self.ln(blocks(self.blocks, x)))

    spec = _spec(layers, quick)
    dev = lazyxla.device()
    torch.manual_seed(0)
    model = (GPT if mode == "unrolled" else ScannedGPT)(spec)
    if mode == "stacked":
        model.blocks = lazyxla.StackedLayers(model.blocks)
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    x = torch.randint(0, spec.vocab, (spec.batch, spec.seq)).to(dev)
    y = torch.randint(0, spec.vocab, (spec.batch, spec.seq)).to(dev)
    lazyxla.sync(wait=True)
    lazyxla.metrics.reset()

    def record():
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        if part == "step":
            opt.step()
            opt.zero_grad()
            return [loss, *model.parameters()]
        return [loss, *(p.grad for p in model.parameters())]

    lines = len(lazyxla.debug.stablehlo_text(record()).splitlines())  # a step recorded for its program text
    lazyxla.sync(wait=True)
    model.zero_grad(set_to_none=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)  # the timed step is a first step
    lazyxla.sync(wait=True)
    lazyxla.metrics.reset()
    started = time.perf_counter()
    outs = record()
    recorded = time.perf_counter()
    cpu = time.process_time()
    lazyxla.sync()  # lowers and compiles before it returns (the run is asynchronous)
    cpu = time.process_time() - cpu
    outs[0].item()
    done = time.perf_counter()
    timers = lazyxla.metrics.timers()
    return {
        "mode": mode,
        "layers": layers,
        "part": part,
        "compile_s": timers.get("compile", {}).get("total_s", 0.0),
        "build_cpu_s": cpu,
        "lower_s": timers.get("lower", {}).get("total_s", 0.0),
        "record_s": recorded - started,
        "first_step_s": done - started,
        "compiles": lazyxla.metrics.counters()["compiles"],
        "hlo_lines": lines,
    }


def _spec(layers: int, quick: bool) -> S.GPTSpec:
    if quick:
        return S.GPTSpec(vocab=64, d_model=32, layers=layers, heads=4, seq=16, batch=2)
    return S.GPTSpec(layers=layers)


def run_child(mode: str, layers: int, part: str, quick: bool) -> dict[str, Any]:
    env = dict(os.environ, LAZYXLA_PERSISTENT_CACHE="0", OMP_WAIT_POLICY="PASSIVE")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "benchmarks.scan", "--child", mode, str(layers), part]
    cmd += ["--quick"] if quick else []
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    raise RuntimeError(f"benchmark child {cmd[3:]} failed:\n{proc.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="2,4,8,16,24")
    p.add_argument("--modes", default="scan,stacked,unrolled")
    p.add_argument("--parts", default="model,step")
    p.add_argument("--repeats", type=int, default=1, help="fresh processes per row (the table shows medians)")
    p.add_argument("--quick", action="store_true", help="a tiny GPT: a smoke test of the harness")
    p.add_argument("--json", default=os.path.join(ROOT, "build", "bench-scan.json"))
    p.add_argument("--child", nargs=3, metavar=("MODE", "LAYERS", "PART"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        mode, layers, part = args.child
        print(MARKER + json.dumps(child(mode, int(layers), part, args.quick)), flush=True)
        return {}
    layers = [int(v) for v in args.layers.split(",")]
    rows = []
    started = time.perf_counter()
    for part in args.parts.split(","):
        for n in layers:
            for mode in args.modes.split(","):
                runs = [run_child(mode, n, part, args.quick) for _ in range(args.repeats)]
                row = {k: statistics.median(r[k] for r in runs) if isinstance(runs[0][k], float) else runs[0][k]
                       for k in runs[0]}  # fmt: skip
                rows.append(row)
                print(
                    f"[bench-scan] {part} {n} layers {mode}: compile {row['compile_s']:.2f} s, build CPU "
                    f"{row['build_cpu_s']:.2f} s, {row['hlo_lines']} lines",
                    file=sys.stderr,
                )
    result = {"meta": _meta(args, time.perf_counter() - started), "rows": rows}
    print(_table(rows, args))
    R.write_json(args.json, result)
    return result


def _meta(args, wall_s: float) -> dict[str, Any]:
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(),
        "spec": _spec(0, args.quick).describe().replace("0 layers, ", ""),
        "repeats": args.repeats,
        "quick": args.quick,
        "wall_s": wall_s,
    }


def _table(rows: list[dict], args) -> str:
    out = []
    for part in args.parts.split(","):
        base = {r["mode"]: r for r in rows if r["part"] == part and r["layers"] == min(x["layers"] for x in rows)}
        body = []
        for r in (r for r in rows if r["part"] == part):
            first = base[r["mode"]]
            body.append([
                str(r["layers"]), r["mode"], R.fmt(r["compile_s"]), R.fmt(R.ratio(r["compile_s"], first["compile_s"])),
                R.fmt(r["build_cpu_s"]), R.fmt(R.ratio(r["build_cpu_s"], first["build_cpu_s"])), R.fmt(r["lower_s"]),
                R.fmt(r["record_s"]), R.fmt(r["first_step_s"]), str(r["hlo_lines"]),
            ])  # fmt: skip
        header = ["layers", "mode", "compile s", "x", "build CPU s", "x", "lower s", "record s", "first step s"]
        header.append("HLO lines")
        title = f"GPT blocks scanned vs unrolled: {'forward+backward' if part == 'model' else 'training step (AdamW)'}"
        note = "x: against the same mode's fewest layers"
        out.append(R.table(title, header, body, [note]))
    return "\n".join(out)


if __name__ == "__main__":
    main()
