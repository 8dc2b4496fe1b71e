"""Functions tests/test_capture_spmd.py runs in fresh processes with 8 fake CPU devices: an SPMD training step,
captured (``lazyxla.compile(step, capture=True)``) or in lazy mode (the same step as one ``lazyxla.compile``
region per call, without capture)."""

from __future__ import annotations

import time

import torch
from torch import nn

BATCH, D_IN, D, D_OUT = 8, 16, 32, 8


def _mlp() -> nn.Module:
    """A 4-layer MLP whose every dimension 8 devices (and a 2 x 4 mesh's axes) divide."""
    return nn.Sequential(
        nn.Linear(D_IN, D), nn.GELU(), nn.Linear(D, D), nn.GELU(), nn.Linear(D, D), nn.GELU(), nn.Linear(D, D_OUT)
    )


def _batches(n: int) -> list:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, D_OUT, generator=g)) for _ in range(n)]


def _shard(model: nn.Module, mesh, mode: str) -> str:
    """Shard ``model`` for ``mode``; returns the mesh axis the batch is split over."""
    import lazyxla

    spmd = lazyxla.spmd
    if mode == "fsdp":
        spmd.fsdp(model, mesh, axis="fsdp")
        return "fsdp"
    for k, layer in enumerate(m for m in model if isinstance(m, nn.Linear)):  # Megatron-style: column, row, ...
        spec = ("model", None) if k % 2 == 0 else (None, "model")
        spmd.mark_sharding(layer.weight, mesh, spec)
        if k % 2 == 0:
            spmd.mark_sharding(layer.bias, mesh, ("model",))
    return "data"


def compare(rank: int, mode: str, steps: int = 10, relayout_at: int | None = None) -> dict:
    """``train`` in lazy mode, then captured, in one SPMD process (``mode``: 'fsdp' over 8 devices, or '2d' over
    a 2 x 4 mesh)."""
    import lazyxla

    lazyxla.spmd.enable()
    return {
        "lazy": train(mode, False, steps, relayout_at),
        "captured": train(mode, True, steps, relayout_at),
    }


def train(mode: str, captured: bool, steps: int, relayout_at: int | None) -> dict:
    """Train the MLP ``steps`` steps under SPMD; ``relayout_at``: before that call, lay one weight out anew (another
    spec). Returns the losses, the parameters and gradients after the last step, the capture counters and
    statuses, and host ms (wall and this thread's CPU) per call."""
    import lazyxla

    spmd = lazyxla.spmd
    dev = lazyxla.device()
    mesh = spmd.mesh((2, -1), ("data", "model")) if mode == "2d" else spmd.mesh((-1,), ("fsdp",))
    torch.manual_seed(0)
    model = _mlp().to(dev)
    axis = _shard(model, mesh, "2d" if mode == "2d" else "fsdp")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, capturable=True)
    # 'uneven': 6 rows split over 8 devices (meshes.ask): the batch, a buffer the step updates and re-annotates
    # (an input and a result split unevenly, from step to step), and a per-example loss it returns
    rows = 6 if mode == "uneven" else BATCH
    if mode == "uneven":
        model.register_buffer("count", torch.zeros(rows, device=dev))
        spmd.mark_sharding(model.count, mesh, ("fsdp",))

    def step(x, y):
        opt.zero_grad()
        out = model(x)
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        opt.step()
        if mode != "uneven":
            return loss
        model.count.add_(1)
        spmd.mark_sharding(model.count, mesh, ("fsdp",))  # (a pending value: a constraint in the program)
        return loss, spmd.mark_sharding((out.detach() - y).pow(2).mean(1), mesh, ("fsdp",))

    run = lazyxla.compile(step, capture=captured)
    lazyxla.metrics.reset()
    losses, statuses, host_ms, cpu_ms, replayed, extra = [], [], [], [], [], []
    for i, (x, y) in enumerate(_batches(steps)):
        if i == relayout_at:
            w = model[2].weight  # another spec than it had: an input's layout differs from the verified call's
            spmd.mark_sharding(w, mesh, (None, axis) if mode == "fsdp" else ("model", None))
        xb, yb = x[:rows].to(dev), y[:rows].to(dev)
        spmd.mark_sharding(xb, mesh, (axis, None))
        spmd.mark_sharding(yb, mesh, (axis, None))
        started, cpu = time.perf_counter(), time.thread_time()
        loss = run(xb, yb)
        if mode == "uneven":
            loss, per = loss
            extra.append((per.cpu(), spmd.get_sharding(per)[1], spmd.get_sharding(model.count)[1]))
        host_ms.append((time.perf_counter() - started) * 1e3)
        cpu_ms.append((time.thread_time() - cpu) * 1e3)
        statuses.append(run.capture_status if captured else None)
        replayed.append(lazyxla.metrics.counters().get("capture_replays", 0) > sum(replayed))
        losses.append(loss.item())  # outside the step: its own read
    counters = lazyxla.metrics.counters()
    return {
        "devices": lazyxla.spmd.device_count(),
        "losses": losses,
        "params": {k: v.cpu() for k, v in model.state_dict().items()},
        "uneven": extra,  # 'uneven': per call, the per-example losses and their and the buffer's specs
        "grads": {k: p.grad.cpu() for k, p in model.named_parameters()},
        "specs": {k: spmd.get_sharding(p) and spmd.get_sharding(p)[1] for k, p in model.named_parameters()},
        "replays": counters.get("capture_replays", 0),
        "records": counters.get("capture_records", 0),
        "refusals": counters.get("capture_refusals", 0),
        "input_misses": counters.get("capture_input_misses", 0),
        "compiles": counters.get("compiles", 0),
        "statuses": statuses,
        "replayed": replayed,  # per call: whether it was replayed
        "host_ms": host_ms,
        "cpu_ms": cpu_ms,
    }


def marks_inside(rank: int, steps: int = 5) -> dict:
    """A step that lays its batch out itself (``mark_sharding`` of device data inside it): lazy mode's losses,
    and the captured step's losses, replays and status."""
    import lazyxla

    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    mesh = spmd.mesh((-1,), ("fsdp",))
    out = {}
    for captured in (False, True):
        torch.manual_seed(0)
        model = _mlp().to(dev)
        spmd.fsdp(model, mesh, axis="fsdp")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)

        def step(x, y, model=model, opt=opt):
            spmd.mark_sharding(x, mesh, ("fsdp", None))
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss

        run = lazyxla.compile(step, capture=captured)
        lazyxla.metrics.reset()
        losses = [run(x.to(dev), y.to(dev)).item() for x, y in _batches(steps)]
        out["losses" if captured else "lazy_losses"] = losses
    out["replays"] = lazyxla.metrics.counters().get("capture_replays", 0)
    out["status"] = run.capture_status
    return out


def _closing_over_a_mesh(model, opt, mesh):
    """A step that constrains an activation over ``mesh``, a variable of its closure; and a function that rebinds
    that variable."""
    import lazyxla

    spmd = lazyxla.spmd

    def step(x, y):
        opt.zero_grad()
        h = spmd.mark_sharding(model[1](model[0](x)), mesh, ("fsdp", None))  # a pending value: a constraint
        for layer in list(model)[2:]:
            h = layer(h)
        loss = nn.functional.mse_loss(h, y)
        loss.backward()
        opt.step()
        return loss

    def rebind(other) -> None:
        nonlocal mesh
        mesh = other

    return step, rebind


def mesh_in_closure(rank: int, steps: int = 7, change_at: int = 4) -> dict:
    """A step that constrains an activation over a mesh it reads from its closure; before call ``change_at`` that
    variable is rebound to another mesh (its "fsdp" axis 2 devices long). Lazy mode's losses, and the captured
    step's losses, statuses and per-call replays."""
    import lazyxla

    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    meshes = [spmd.Mesh(range(8), (8,), ("fsdp",)), spmd.Mesh(range(8), (2, 4), ("fsdp", "other"))]
    out = {}
    for captured in (False, True):
        torch.manual_seed(0)
        model = _mlp().to(dev)
        spmd.fsdp(model, meshes[0], axis="fsdp")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
        step, rebind = _closing_over_a_mesh(model, opt, meshes[0])
        run = lazyxla.compile(step, capture=captured)
        lazyxla.metrics.reset()
        losses, statuses, replayed = [], [], []
        for i, (x, y) in enumerate(_batches(steps)):
            if i == change_at:
                rebind(meshes[1])
            losses.append(run(x.to(dev), y.to(dev)).item())
            statuses.append(run.capture_status if captured else None)
            replayed.append(lazyxla.metrics.counters().get("capture_replays", 0) > sum(replayed))
        out["captured" if captured else "lazy"] = {"losses": losses, "statuses": statuses, "replayed": replayed}
    return out


def fsdpv2(rank: int, steps: int = 8) -> dict:
    """torch_xla's FSDPv2 (``SpmdFullyShardedDataParallel`` per decoder block, examples/torch_xla/fsdpv2_train.py's
    model, AdamW, batches split over the 'fsdp' axis): lazy mode, then the same step captured, through the torch_xla
    compatibility layer."""
    import lazyxla.compat

    lazyxla.compat.install()
    import numpy as np
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    import lazyxla
    from tests.fsdpv2_workers import _example

    ex = _example()
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.array(range(n)), (n, 1), ("fsdp", "model"))
    xs.set_global_mesh(mesh)
    batches = [(ids[:, :-1], ids[:, 1:]) for ids in ex.fake_batches(steps, 16)]

    def train(captured: bool) -> dict:
        torch.manual_seed(1)
        model = FSDPv2(ex.DecoderOnly(), auto_wrap_policy=ex.block_policy)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, capturable=True)

        def step(inputs, targets):
            opt.zero_grad()
            loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            loss.backward()
            opt.step()
            return loss

        run = lazyxla.compile(step, capture=captured)
        lazyxla.metrics.reset()
        losses, statuses = [], []
        for inputs, targets in batches:
            x, y = inputs.to(torch_xla.device()), targets.to(torch_xla.device())
            xs.mark_sharding(x, mesh, ("fsdp", None))
            xs.mark_sharding(y, mesh, ("fsdp", None))
            losses.append(run(x, y).item())
            statuses.append(run.capture_status if captured else None)
        counters = lazyxla.metrics.counters()
        return {
            "losses": losses,
            "params": {k: v.cpu() for k, v in model.state_dict().items()},
            "statuses": statuses,
            "replays": counters.get("capture_replays", 0),
            "compiles": counters.get("compiles", 0),
        }

    return {"lazy": train(False), "captured": train(True)}
