"""(k) Host time of a warm SPMD training step: lazy mode against whole-step capture, on 8 devices in one process.

Usage: ``python -m benchmarks.spmd [--quick] [--rounds N] [--json PATH]`` (also a section of ``make bench``).

The step: an 8-layer MLP (hidden 64) sharded FSDP-style over 8 devices (``lazyxla.spmd.fsdp``), or Megatron-style
over a 2 x 4 ``("data", "model")`` mesh, AdamW, MSE; the batch laid out over the data axis before each call, as a
``DeviceLoader(input_sharding=...)`` does. Sizes are tiny so the devices' part is negligible: what is measured is
the host's (on an accelerator the bound). Per step: wall and thread CPU time from the call until the step is handed
to the devices (lazy mode: recording and ``lazyxla.sync()``; captured: the replay), the loss read after that. The
two modes run in one fresh process with 8 fake CPU devices (``lazyxla.spawn(cpu_devices=8)``), alternating blocks
of steps so that the machine's load hits both alike; their losses are compared (equal to float32 rounding: the
captured step's AdamW is ``capturable``, and so is lazy mode's here).

Example::

    results = run(quick=True)
    print(table(results))
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks import report as R

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHES = ("fsdp", "2d")
MODES = ("lazy", "captured")
WIDTH, LAYERS, BATCH = 64, 8, 16
SETTINGS = {"full": {"rounds": 8, "block": 5, "warmup": 6}, "quick": {"rounds": 2, "block": 2, "warmup": 4}}


def _model(mesh_kind: str, mesh):
    """The MLP on the device, sharded for ``mesh_kind``; returns it and the batch's mesh axis."""
    import torch
    from torch import nn

    import lazyxla

    layers = []
    for _ in range(LAYERS - 1):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, WIDTH)).to(lazyxla.device())
    if mesh_kind == "fsdp":
        lazyxla.spmd.fsdp(model, mesh, axis="fsdp")
        return model, "fsdp"
    for k, layer in enumerate(m for m in model if isinstance(m, torch.nn.Linear)):  # column, row, column, ...
        lazyxla.spmd.mark_sharding(layer.weight, mesh, ("model", None) if k % 2 == 0 else (None, "model"))
    return model, "data"


def _step_fn(mesh_kind: str, mode: str):
    """A training step of ``mode`` over ``mesh_kind``: a function of no arguments returning the loss tensor, and the
    CPU batch it cycles through."""
    import torch

    import lazyxla

    spmd = lazyxla.spmd
    mesh = spmd.mesh((-1,), ("fsdp",)) if mesh_kind == "fsdp" else spmd.mesh((2, -1), ("data", "model"))
    torch.manual_seed(0)
    model, axis = _model(mesh_kind, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)) for _ in range(4)]

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    run = lazyxla.compile(step, capture=True) if mode == "captured" else step
    calls = [0]

    def one() -> tuple[float, float, float]:
        x, y = batches[calls[0] % len(batches)]
        calls[0] += 1
        xb, yb = x.to(lazyxla.device()), y.to(lazyxla.device())
        spmd.mark_sharding(xb, mesh, (axis, None))
        spmd.mark_sharding(yb, mesh, (axis, None))
        wall, cpu = time.perf_counter(), time.thread_time()
        loss = run(xb, yb)
        if mode == "lazy":
            lazyxla.sync()
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        return wall * 1e3, cpu * 1e3, loss.item()

    return one


def worker(rank: int, mesh_kind: str, rounds: int, block: int, warmup: int) -> dict[str, Any]:
    """In a process with 8 devices: both modes' steps over ``mesh_kind``, alternating blocks of ``block`` steps."""
    import lazyxla

    lazyxla.spmd.enable()
    steps = {mode: _step_fn(mesh_kind, mode) for mode in MODES}
    samples: dict[str, dict[str, list]] = {m: {"wall": [], "cpu": [], "loss": []} for m in MODES}
    for mode, one in steps.items():
        for _ in range(warmup):
            samples[mode]["loss"].append(one()[2])
    before = lazyxla.metrics.counters()
    for _ in range(rounds):
        for mode, one in steps.items():
            for _ in range(block):
                wall, cpu, loss = one()
                for key, v in (("wall", wall), ("cpu", cpu), ("loss", loss)):
                    samples[mode][key].append(v)
    after = lazyxla.metrics.counters()
    measured = rounds * block * len(MODES)
    return {
        "devices": lazyxla.spmd.device_count(),
        "samples": samples,
        "compiles_measured": after.get("compiles", 0) - before.get("compiles", 0),
        "replays_measured": after.get("capture_replays", 0) - before.get("capture_replays", 0),
        "steps_measured": measured,
    }


def run(quick: bool = False, rounds: int | None = None) -> dict[str, Any]:
    """Both meshes, each in a fresh 8-device process; per mesh and mode the median host ms (wall, CPU)."""
    import lazyxla

    s = dict(SETTINGS["quick" if quick else "full"])
    if rounds is not None:
        s["rounds"] = rounds
    out: dict[str, Any] = {"settings": s, "model": f"MLP {LAYERS} layers, hidden {WIDTH}, batch {BATCH}, AdamW"}
    for mesh_kind in MESHES:
        (r,) = lazyxla.spawn(
            worker, args=(mesh_kind, s["rounds"], s["block"], s["warmup"]), nprocs=1, cpu_devices=8, timeout_s=900
        )
        rows = {}
        for mode in MODES:
            sm = r["samples"][mode]
            rows[mode] = {
                "wall_ms": R.summary([v / 1e3 for v in sm["wall"]]),
                "cpu_ms": R.summary([v / 1e3 for v in sm["cpu"]]),
                "losses": sm["loss"],
            }
        lazy_losses, cap_losses = rows["lazy"]["losses"], rows["captured"]["losses"]
        rows["max_loss_difference"] = max(abs(a - b) for a, b in zip(lazy_losses, cap_losses))
        for key in ("devices", "compiles_measured", "replays_measured", "steps_measured"):
            rows[key] = r[key]
        out[mesh_kind] = rows
    return out


def table(results: dict[str, Any]) -> str:
    """The (k) table: per mesh, lazy and captured host ms per warm step, and captured / lazy."""
    rows = []
    for mesh_kind in MESHES:
        r = results[mesh_kind]
        lazy_wall, lazy_cpu = r["lazy"]["wall_ms"]["median_ms"], r["lazy"]["cpu_ms"]["median_ms"]
        for mode in MODES:
            wall, cpu = r[mode]["wall_ms"]["median_ms"], r[mode]["cpu_ms"]["median_ms"]
            rows.append([
                mesh_kind, mode, R.fmt(wall, 3), R.fmt(cpu, 3), R.fmt(R.ratio(wall, lazy_wall)),
                R.fmt(R.ratio(cpu, lazy_cpu)), str(r["compiles_measured"]), f"{r['max_loss_difference']:.1e}",
            ])  # fmt: skip
    s = results["settings"]
    notes = [
        f"{results['model']}; fsdp: lazyxla.spmd.fsdp over 8 devices; 2d: Megatron-style over a 2 x 4 mesh.",
        f"{s['rounds']} rounds of {s['block']} steps per mode, alternating, after {s['warmup']} warm-up steps each; "
        "medians. host ms: from the call until the step is handed to the devices (lazy: recording and sync).",
        "compiles: during the measured steps (both modes); loss diff: largest |lazy - captured| over every step.",
    ]
    header = ["mesh", "mode", "host ms", "CPU ms", "x lazy", "CPU x lazy", "compiles", "loss diff"]
    return R.table("(k) SPMD training step on 8 devices, host time per warm step", header, rows, notes)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="few steps: a smoke test, not a measurement")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--json", default=os.path.join(ROOT, "build", "spmd.json"))
    a = p.parse_args(argv)
    os.environ["LAZYXLA_PERSISTENT_CACHE"] = "0"
    results = run(quick=a.quick, rounds=a.rounds)
    print(table(results))
    R.write_json(a.json, results)
    return results


if __name__ == "__main__":
    main()
