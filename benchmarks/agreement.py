"""Agreement: the benchmark models trained by eager PyTorch and by lazyxla from the same start, in float32 and
under bfloat16 autocast, step by step.

The check for a new device: run where eager PyTorch has that device's twin (``--eager-device cuda`` on a GPU
host; the CPU elsewhere) and compare the losses of every step. Both start from :mod:`benchmarks.spec`'s numpy
parameters and batch, each framework in a process of its own (with lazyxla imported, PyTorch's autograd engine
fails every CUDA backward: pytorch/pytorch#161129). Prints one row per model and precision (the largest relative
loss difference over the steps, and the final losses) and writes the losses to JSON; exits 1 when a difference
passes its tolerance (float32: 1e-3; bfloat16 autocast: 5e-2, as two bfloat16 programs round differently).

Example::

    python -m benchmarks.agreement --eager-device cuda --steps 20 --json build/agreement.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from benchmarks import report as R
from benchmarks import spec as S

TOLERANCE = {"float32": 1e-3, "bfloat16 autocast": 5e-2}


def losses(framework: str, model: str, spec, steps: int, autocast) -> list[float]:
    """``steps`` losses of ``model`` trained by ``framework`` ('eager' or 'lazyxla'), each read after its step."""
    from benchmarks import torch_models

    step = torch_models.make_step(model, spec, framework, autocast=autocast)
    return [step() for _ in range(steps)]


def _child(framework: str, model: str, precision: str, steps: int, quick: bool) -> list[float]:
    """The losses of one framework, computed in a fresh process (its last stdout line, as JSON)."""
    cmd = [sys.executable, "-m", "benchmarks.agreement", "--child", framework, model, precision, "--steps", str(steps)]
    proc = subprocess.run(cmd + ["--quick"] * quick, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{framework} {model} {precision} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(settings: S.Settings, steps: int, quick: bool = False, models=S.MODELS) -> dict[str, Any]:
    """Per model and precision: both frameworks' losses and their largest relative difference."""
    results: dict[str, Any] = {}
    for model in models:
        for precision in TOLERANCE:
            row = {fw: _child(fw, model, precision, steps, quick) for fw in ("eager", "lazyxla")}
            diffs = [abs(a - b) / max(abs(a), 1e-6) for a, b in zip(row["eager"], row["lazyxla"])]
            row["max_rel_diff"] = max(diffs)
            row["agree"] = row["max_rel_diff"] <= TOLERANCE[precision]
            results[f"{model}, {precision}"] = row
    return results


def table(results: dict[str, Any], eager_device: str) -> str:
    """One row per model and precision."""
    rows = [
        [
            name,
            f"{r['max_rel_diff']:.2e}",
            f"{r['eager'][-1]:.5f}",
            f"{r['lazyxla'][-1]:.5f}",
            "yes" if r["agree"] else "NO",
        ]
        for name, r in results.items()
    ]
    header = ["model, precision", "max rel. loss diff", f"eager ({eager_device}) last", "lazyxla last", "agree"]
    return R.table("agreement: eager PyTorch vs lazyxla, every step's loss", header, rows)


def main(argv: list[str] | None = None) -> int:
    """Command line; returns 1 when a difference passes its tolerance."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the benchmarks' tiny sizes")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eager-device", default=None, help="the device eager PyTorch runs on (default cpu)")
    parser.add_argument("--json", default=None, help="where to write the losses")
    parser.add_argument("--models", default=",".join(S.MODELS), help="comma-separated, of " + ", ".join(S.MODELS))
    parser.add_argument("--child", nargs=3, metavar=("FRAMEWORK", "MODEL", "PRECISION"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.eager_device:
        os.environ[S.EAGER_DEVICE_VARIABLE] = args.eager_device  # the children read it
    settings = S.Settings.quick() if args.quick else S.Settings.full()
    if args.child:
        framework, model, precision = args.child
        if framework == "lazyxla":
            import lazyxla  # noqa: F401  (before any backward: the autograd engine sizes its device queues once)
        import torch

        dtype = torch.bfloat16 if precision.startswith("bfloat16") else None
        print(json.dumps(losses(framework, model, settings.spec(model), args.steps, dtype)))
        return 0
    results = run(settings, args.steps, args.quick, args.models.split(","))
    if args.json:
        R.write_json(args.json, results)
    print(table(results, os.environ.get(S.EAGER_DEVICE_VARIABLE, "cpu")), flush=True)
    return 0 if all(r["agree"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
