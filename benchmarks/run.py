"""Side-by-side step timings: lazyxla vs eager PyTorch (CPU) vs the same math in pure jax.jit.

Usage: ``python -m benchmarks.run [--steps N] [--json PATH]``. Each framework's steps are interleaved
in rounds so machine noise hits all three alike; the table reports medians and ratios to jax.jit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import lazyxla

SIZES = (784, 2048, 2048, 10)
BATCH = 128


def _torch_mlp(device):
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(BATCH, SIZES[0]).to(device)
    y = torch.randint(0, SIZES[-1], (BATCH,)).to(device)

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "lazyxla":
            lazyxla.sync()
        return loss.item()

    return step


def _jax_mlp():
    rng = np.random.default_rng(0)
    params = [
        (jnp.asarray(rng.standard_normal((b, a), np.float32) * 0.02), jnp.zeros((b,), jnp.float32))
        for a, b in zip(SIZES[:-1], SIZES[1:])
    ]
    moms = jax.tree.map(jnp.zeros_like, params)
    x = jnp.asarray(rng.standard_normal((BATCH, SIZES[0]), np.float32))
    y = jnp.asarray(rng.integers(0, SIZES[-1], BATCH))

    def loss_fn(ps):
        h = x
        for i, (w, b) in enumerate(ps):
            h = h @ w.T + b
            if i < len(ps) - 1:
                h = jax.nn.relu(h)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(h), y[:, None], axis=1))

    @jax.jit
    def train(ps, ms):
        loss, g = jax.value_and_grad(loss_fn)(ps)
        ms = jax.tree.map(lambda m, gi: 0.9 * m + gi, ms, g)
        ps = jax.tree.map(lambda p, m: p - 0.01 * m, ps, ms)
        return ps, ms, loss

    state = {"p": params, "m": moms}

    def step():
        state["p"], state["m"], loss = train(state["p"], state["m"])
        return float(loss)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    steps = {"jax.jit": _jax_mlp(), "eager": _torch_mlp(torch.device("cpu")), "lazyxla": _torch_mlp(lazyxla.device())}
    times = {name: [] for name in steps}
    for fn in steps.values():
        for _ in range(args.warmup):
            fn()
    compiles_before = lazyxla.metrics.counters()["compiles"]
    for _ in range(args.steps):
        for name, fn in steps.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    floor = statistics.median(times["jax.jit"])
    result = {}
    print(f"MLP {SIZES} batch {BATCH}, SGD momentum, {args.steps} steps, loss read every step")
    print(f"{'':10} {'median ms':>10} {'min':>8} {'max':>8} {'x jax.jit':>10}")
    for name, ts in times.items():
        med = statistics.median(ts)
        result[name] = {"median_ms": med * 1e3, "min_ms": min(ts) * 1e3, "max_ms": max(ts) * 1e3, "ratio": med / floor}
        print(f"{name:10} {med * 1e3:10.2f} {min(ts) * 1e3:8.2f} {max(ts) * 1e3:8.2f} {med / floor:10.2f}")
    result["lazyxla_compiles_after_warmup"] = lazyxla.metrics.counters()["compiles"] - compiles_before
    print(f"lazyxla compiles after warm-up: {result['lazyxla_compiles_after_warmup']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
