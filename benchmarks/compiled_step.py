"""Host time per warm GPT training step, side by side in one run: lazy mode, ``torch.compile`` of model + loss
(the optimizer step in lazy mode) and ``torch.compile`` of model + loss and ``opt.step``.

Usage: ``python -m benchmarks.compiled_step [--negligible] [--rounds N]``. The three steps interleave in rounds
(each round runs a framework three steps in a row and keeps the last: a loop runs one step function); medians of
the step's wall time, of its wall time before the sync (recording), and of its thread's CPU time until the loss is
read. ``--negligible``: the same structure at tiny sizes (``benchmarks.host.negligible``), the host's part alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import host as H
from benchmarks import spec as S

FRAMEWORKS = ("lazyxla", S.COMPILED_LAZY_OPTIMIZER, "lazyxla compiled")
WARMUP = 6


def run(spec: S.GPTSpec, rounds: int) -> dict[str, dict[str, float]]:
    """Per framework: ops recorded per warm step and the medians (ms) of wall, recording and host CPU time."""
    import lazyxla

    steps = {fw: S.make_step(fw, "gpt", spec) for fw in FRAMEWORKS}
    ops = {}
    for fw, step in steps.items():
        for _ in range(WARMUP):
            step()
        before = lazyxla.metrics.counters()["ops_recorded"]
        step()
        ops[fw] = lazyxla.metrics.counters()["ops_recorded"] - before
    times: dict[str, dict[str, list[float]]] = {fw: {"wall": [], "record": [], "cpu": []} for fw in FRAMEWORKS}
    n = len(FRAMEWORKS)
    for r in range(rounds):
        for fw in FRAMEWORKS[r % n :] + FRAMEWORKS[: r % n]:
            for _ in range(3):
                start = time.perf_counter()
                steps[fw]()
                wall = time.perf_counter() - start
            times[fw]["wall"].append(wall)
            times[fw]["record"].append(steps[fw].record_s)
            times[fw]["cpu"].append(steps[fw].host_s)
    out = {}
    for fw in FRAMEWORKS:
        row = {k: 1e3 * statistics.median(v) for k, v in times[fw].items()}
        out[fw] = {"ops_per_step": ops[fw], **row}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--negligible", action="store_true", help="tiny sizes: the host's part alone")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    spec = H.negligible(S.GPTSpec()) if args.negligible else S.GPTSpec()
    rows = run(spec, args.rounds)
    lazy = rows["lazyxla"]
    print(spec.describe())
    print(f"{'framework':34s} {'ops/step':>8s} {'step ms':>9s} {'record ms':>9s} {'host CPU ms':>11s} {'x lazy':>6s}")
    for fw, r in rows.items():
        print(
            f"{fw:34s} {r['ops_per_step']:8d} {r['wall']:9.2f} {r['record']:9.2f} {r['cpu']:11.2f} "
            f"{r['cpu'] / lazy['cpu']:6.2f}"
        )


if __name__ == "__main__":
    main()
