"""Make docs/img/profile.png: profile a few MLP training steps, then draw the lazyxla spans of the trace.

Two stages, so that the drawing needs only numpy and matplotlib (not a project dependency)::

    .venv/bin/python docs/render_profile.py trace /tmp/prof          # writes the trace (lazyxla.profiler)
    python docs/render_profile.py draw /tmp/prof docs/img/profile.png  # any Python with matplotlib

The picture is our own drawing of the Perfetto trace file that ``lazyxla.profiler.trace`` writes (one row
per thread, one bar per span), to show which phases a step has; TensorBoard and ui.perfetto.dev show the
same file interactively.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import sys


def trace(logdir: str) -> None:
    import torch
    import torch.nn.functional as F

    import lazyxla
    from tests.models import MLP

    dev = lazyxla.device()
    torch.manual_seed(0)
    model = MLP(256, 512, 10).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    with lazyxla.profiler.trace(logdir):
        for _ in range(5):
            loss = F.cross_entropy(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
            lazyxla.sync()
        print("loss", loss.item())


def draw(logdir: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (path,) = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.trace.json.gz"))
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e.get("name", "").startswith("lazyxla.")]
    t0 = min(e["ts"] for e in spans)
    colors = {
        "lazyxla.step": "#dddddd",
        "lazyxla.record": "#8fbbd9",
        "lazyxla.trace": "#f4a582",
        "lazyxla.lower": "#b2abd2",
        "lazyxla.compile": "#d6604d",
        "lazyxla.transfer": "#92c5de",
        "lazyxla.execute": "#4dac26",
    }
    rows = {"lazyxla.step": 0, "lazyxla.record": 1}
    steps = sorted((e for e in spans if e["name"] == "lazyxla.step"), key=lambda e: e["ts"])
    zoom = ((steps[-2]["ts"] - t0) / 1e3 - 0.5, (steps[-1]["ts"] + steps[-1]["dur"] - t0) / 1e3 + 0.5)
    fig, axes = plt.subplots(2, 1, figsize=(12, 5), dpi=110)
    for ax, title, xlim in (
        (axes[0], "5 MLP training steps: the first two compile (steps 1 and 2 differ: momentum appears)", None),
        (axes[1], "zoom on the last two steps: a few ms each, served from the compile cache", zoom),
    ):
        for e in spans:
            name = e["name"]
            start, width = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            row = rows.get(name, 2)
            ax.broken_barh([(start, width)], (row - 0.4, 0.8), color=colors.get(name, "#999"), edgecolor="#555")
        ax.set_yticks([0, 1, 2], ["steps", "your code (record)", "lazyxla's work"])
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.set_xlim(*(xlim or (0, None)))
    axes[1].set_xlabel("milliseconds since the trace started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    fig.legend(
        handles,
        [n.removeprefix("lazyxla.") for n in colors],
        ncol=7,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.95),
        frameon=False,
    )
    fig.suptitle("lazyxla.profiler.trace, drawn from its Perfetto trace file", y=0.99, fontsize=11)
    fig.subplots_adjust(top=0.86)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(out)


if __name__ == "__main__":
    if sys.argv[1] == "trace":
        trace(sys.argv[2])
    else:
        draw(sys.argv[2], sys.argv[3])
