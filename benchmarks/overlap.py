"""(g) Does recording step N+1 overlap the device running step N?

``sync()`` only queues the program, so a loop that reads each loss one step late records the next step
while the device still runs the previous one, and a step should cost about max(host, device) rather
than host + device. The same lazyxla training step, run two ways (each in its own block of steps):

- serial: record, ``sync()``, read the loss (each step waits for its own result). Its parts: host =
  recording + ``sync()`` (the Python thread's time), device = the wait for the loss after that;
- pipelined: record, ``sync()``, then read the previous step's loss.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import report as R
from benchmarks import spec as S
from benchmarks import torch_models


def run(model: str, settings: S.Settings) -> dict[str, Any]:
    """Median seconds per step of each way, for ``model`` on lazyxla."""

    record, sync = torch_models.setup(model, settings.spec(model), "lazyxla")
    for _ in range(settings.warmup):
        loss = record()
        sync()
        loss.item()
    host, device, serial, pipelined = [], [], [], []
    for _ in range(settings.steps):
        t0 = time.perf_counter()
        loss = record()
        sync()
        t1 = time.perf_counter()
        loss.item()
        t2 = time.perf_counter()
        host.append(t1 - t0)
        device.append(t2 - t1)
        serial.append(t2 - t0)
    previous = record()
    sync()
    for _ in range(settings.steps):
        t0 = time.perf_counter()
        loss = record()
        sync()
        previous.item()
        previous = loss
        pipelined.append(time.perf_counter() - t0)
    previous.item()
    out = {name: R.summary(ts) for name, ts in (("host", host), ("device", device), ("serial", serial))}
    out["pipelined"] = R.summary(pipelined)
    out["model"] = model
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    """The (g) table: per model, host, device, serial and pipelined step times."""
    rows = []
    for model, r in results.items():
        bound = max(r["host"]["median_ms"], r["device"]["median_ms"])
        rows.append(
            [
                model,
                R.fmt(r["host"]["median_ms"]),
                R.fmt(r["device"]["median_ms"]),
                R.fmt(r["serial"]["median_ms"]),
                R.fmt(r["pipelined"]["median_ms"]),
                R.fmt(r["pipelined"]["median_ms"] / bound),
            ]
        )
    return R.table(
        "(g) overlap: recording step N+1 while the device runs step N (lazyxla, median ms per step)",
        ["model", "host", "device", "serial", "pipelined", "pipelined / max(host, device)"],
        rows,
        ["serial: read each loss at once (host: record + sync(); device: the wait for the loss after it);",
         "pipelined: read each loss one step late, so the next step's recording overlaps the device"],
    )  # fmt: skip
