"""Where lazy mode's host time per recorded op goes on the HF GPT-2 training step of ``benchmarks/hf.py``.

Usage: ``python -m benchmarks.hf_profile [--model gpt2] [--steps N] [--top N]``. Runs the warm lazy-mode step
``--steps`` times under cProfile and sums each function's own time (``tottime``) into groups: PyTorch's C++ (the
dispatcher, autograd, functionalization: the time of its built-in calls, without the Python they call back),
PyTorch's Python (``torch/``: module calls, the optimizer, the functional-tensor mode), the model's Python
(``transformers/``), lazyxla's code by file, and the sync (``lazyxla.sync``, cumulative). cProfile slows Python
functions more than C calls, so the shares are its view; the µs per op are those shares of the unprofiled CPU time.

Example::

    python -m benchmarks.hf_profile --model gpt2 --steps 20
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
from collections import defaultdict

from benchmarks import hf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def group(filename: str, function: str) -> str:
    """The group of one profiled function (see the module's doc)."""
    if filename == "~":  # a built-in: where it comes from is in its name
        if "torch" in function or "_C." in function:
            return "PyTorch C++ (dispatch, autograd, functionalization)"
        if "jax" in function or "jaxlib" in function or "xla" in function:
            return "jax / XLA C++"
        return "Python built-ins"
    path = os.path.abspath(filename)
    if path.startswith(os.path.join(ROOT, "lazyxla")):
        return "lazyxla " + os.path.relpath(path, ROOT)
    if "/torch/" in path:  # by file: lazyxla's meta inference and decompositions run PyTorch's Python too
        return "PyTorch Python " + path.split("/torch/", 1)[1]
    if "/transformers/" in path:
        return "model Python (transformers)"
    if "/jax/" in path or "/jaxlib/" in path:
        return "jax Python"
    return "other Python"


def profile(model: str, steps: int, size: str = "full"):
    """``(stats, cpu_ms, ops)``: cProfile's stats of ``steps`` warm lazy-mode steps, the median unprofiled CPU ms
    per step and the ops recorded per step."""
    import lazyxla  # the lazyxla worker's package (benchmarks.hf imports no framework at module level)

    step = hf.make_step("lazyxla", model, size)
    for _ in range(hf.WARMUP[size]):
        step()
    cpu = statistics.median(step()["cpu_ms"] for _ in range(steps))
    before = lazyxla.metrics.counters()["ops_recorded"]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    ops = (lazyxla.metrics.counters()["ops_recorded"] - before) / steps
    return pstats.Stats(prof), cpu, ops


def breakdown(stats: pstats.Stats, steps: int) -> tuple[dict[str, float], list[tuple[float, str]], float]:
    """Seconds per step by group, lazyxla's functions by own time per step, and the sync's cumulative seconds."""
    groups: dict[str, float] = defaultdict(float)
    ours: list[tuple[float, str]] = []
    sync = 0.0
    for (filename, _line, function), (_, _, tottime, cumtime, _) in stats.stats.items():
        g = group(filename, function)
        groups[g] += tottime / steps
        if g.startswith("lazyxla "):
            ours.append((tottime / steps, f"{os.path.relpath(filename, ROOT)}:{function}"))
        if function == "sync" and filename.endswith(os.path.join("lazy", "graph.py")):
            sync = max(sync, cumtime / steps)
    return dict(groups), sorted(ours, reverse=True), sync


def main(argv: list[str] | None = None) -> None:
    """Profile, then print the groups and lazyxla's costliest functions in µs per recorded op."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2", choices=list(hf.MODELS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args(argv)
    stats, cpu_ms, ops = profile(a.model, a.steps)
    groups, ours, sync = breakdown(stats, a.steps)
    total = sum(groups.values())
    scale = cpu_ms * 1e3 / ops / total  # profiled seconds per step -> unprofiled CPU µs per op
    print(f"{a.model} lazy mode: {cpu_ms:.2f} CPU ms per step unprofiled, {ops:.0f} ops recorded per step, "
          f"{cpu_ms * 1e3 / ops:.1f} CPU µs/op; profiled {total * 1e3:.1f} ms per step")  # fmt: skip
    torch_files = sorted(((v, k) for k, v in groups.items() if k.startswith("PyTorch Python ")), reverse=True)
    for _, k in torch_files:
        groups.setdefault("PyTorch Python", 0.0)
        groups["PyTorch Python"] += groups.pop(k)
    lazyxla_total = sum(v for k, v in groups.items() if k.startswith("lazyxla "))
    print(f"{'group':60s} {'share':>6s} {'µs/op':>7s}")
    rows = sorted(groups.items(), key=lambda kv: -kv[1])
    for name, sec in [(n, s) for n, s in rows if not n.startswith("lazyxla ")] + [("lazyxla (all)", lazyxla_total)]:
        print(f"{name:60s} {sec / total:6.1%} {sec * scale:7.2f}")
    print(f"  of which in the sync (lazyxla.sync, cumulative): {sync / total:6.1%} {sync * scale:7.2f} µs/op")
    print("PyTorch Python files:")
    for sec, name in torch_files[: a.top]:
        print(f"  {name[15:]:58s} {sec / total:6.1%} {sec * scale:7.2f}")
    print("lazyxla files:")
    for name, sec in [(n, s) for n, s in rows if n.startswith("lazyxla ")][: a.top]:
        print(f"  {name[8:]:58s} {sec / total:6.1%} {sec * scale:7.2f}")
    print("lazyxla functions (own time):")
    for sec, name in ours[: a.top]:
        print(f"  {name:58s} {sec / total:6.1%} {sec * scale:7.2f}")


if __name__ == "__main__":
    main()
