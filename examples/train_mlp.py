"""Train an MLP on synthetic data on the lazyxla device (the `make demo` example).

Each step (forward, backward, optimizer) is recorded lazily and runs as one XLA program, compiled once.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import lazyxla


def progress(step: int, total: int, loss: float, rate: float) -> None:
    width = 30
    done = int(width * step / total)
    bar = "#" * done + "-" * (width - done)
    sys.stdout.write(f"\r[{bar}] step {step}/{total}  loss {loss:.4f}  {rate:6.1f} steps/s")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()

    torch.manual_seed(0)
    dev = lazyxla.device()
    print(f"lazyxla device: {dev} (jax platform: {lazyxla.platform()})")

    # Synthetic classification task: the label is which of 10 random directions the input is closest to.
    centers = torch.randn(10, 64)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    start = time.perf_counter()
    loss_value = float("nan")
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 64)
        y = (x @ centers.t()).argmax(dim=1)
        x, y = x.to(dev), y.to(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        if step % 10 == 0 or step == args.steps:
            loss_value = loss.item()
            progress(step, args.steps, loss_value, step / (time.perf_counter() - start))
    print()
    x = torch.randn(1000, 64)
    y = (x @ centers.t()).argmax(dim=1)
    with torch.no_grad():
        acc = (model(x.to(dev)).argmax(dim=1).cpu() == y).float().mean().item()
    print(f"final loss {loss_value:.4f}, held-out accuracy {acc:.1%}")
    print(lazyxla.metrics.report())


if __name__ == "__main__":
    main()
