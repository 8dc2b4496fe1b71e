"""The real-client tier's figures, per architecture: ``python -m tests.clients.report`` (about 2 min on 2 cores).

Trains every architecture of ``tests/clients/architectures.py`` as ``test_architectures.py`` does (4 steps of
fused AdamW, checked step by step by ``agreement.train_like_eager``) and prints a markdown table: the largest
loss difference to an independent CPU run, the largest parameter difference to that run's end point (AdamW
moves rounding-noise elements by up to lr: see ``agreement.py``; reported, not asserted), the compile count
after each step and the ops that fell back to the CPU. A run that breaks the agreement rule prints its error.
"""

from __future__ import annotations

import sys

import lazyxla
from tests.clients.agreement import train_like_eager
from tests.clients.architectures import ARCHITECTURES, build
from tests.clients.test_architectures import STEPS, _adamw, _loss


def main() -> int:
    dev = lazyxla.device()
    print(
        "| architecture | largest loss difference | largest parameter difference | compiles after each step | CPU "
        "fallbacks |"
    )
    print("| --- | ---: | ---: | --- | --- |")
    failed = 0
    for name in ARCHITECTURES:
        lazyxla.sync()
        lazyxla.metrics.reset()
        model, batch = build(name)
        try:
            r = train_like_eager(model, batch, _loss, _adamw, dev, STEPS)
        except AssertionError as e:
            failed += 1
            print(f"| {name} | FAILED: {str(e).splitlines()[0][:120]} | | | |")
            continue
        fallbacks = sorted(k for k in lazyxla.metrics.counters() if k.startswith("fallback."))
        cells = (name, f"{r['loss_diff']:.1e}", f"{r['param_diff']:.1e}", r["compiles"], ", ".join(fallbacks) or "none")
        print("| " + " | ".join(str(c) for c in cells) + " |")
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
