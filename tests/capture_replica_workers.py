"""Functions tests/test_capture_replicas.py runs in every rank of a 2-process run on 127.0.0.1: a data-parallel
training step with collectives, captured (``lazyxla.compile(step, capture=True)``) or in lazy mode (the same step
as one ``lazyxla.compile`` region per call, without capture)."""

from __future__ import annotations

import time

import torch
from torch import nn

BATCH, D_IN, D, D_OUT = 4, 6, 16, 3


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(D_IN, D), nn.Tanh(), nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D_OUT))


def _batches(rank: int, n: int) -> list:
    """This rank's slices of ``n`` global batches (the same global batches in every rank)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        x, y = torch.randn(2 * BATCH, D_IN, generator=g), torch.randn(2 * BATCH, D_OUT, generator=g)
        out.append((x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]))
    return out


def compare(rank: int, mode: str, steps: int, asym_at: int | None = None) -> dict:
    """``train`` in lazy mode, then captured, in this rank (``mode``: 'optimizer_step', 'groups' or 'ddp')."""
    import torch.distributed as dist

    if mode == "ddp":
        dist.init_process_group("lazyxla")
    try:
        return {"lazy": train(rank, mode, False, steps, asym_at), "captured": train(rank, mode, True, steps, asym_at)}
    finally:
        if mode == "ddp":
            dist.destroy_process_group()


def _model_and_optimizer(rank: int, mode: str):
    import lazyxla

    dev = lazyxla.device()
    torch.manual_seed(0)
    model = _mlp()
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        if rank:  # other weights in rank 1: DDP broadcasts rank 0's
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
        wrapped = DDP(model.to(dev))
        return model, wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    model = model.to(dev)
    return model, model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, capturable=True)


def train(rank: int, mode: str, captured: bool, steps: int, asym_at: int | None) -> dict:
    """Train ``steps`` steps; ``asym_at``: at that call, rank 1 alone passes another loss scale (a Python number, so
    its guards differ from rank 0's), or in mode 'groups' every rank's replica groups change. Returns the losses
    (every rank's mean, all-reduced inside the step), the parameters after the last step, the capture counters,
    statuses and misses, and host ms per call."""
    import lazyxla

    dev = lazyxla.device()
    model, net, opt = _model_and_optimizer(rank, mode)
    groups = [[0, 1]]  # ('groups': the replica groups of the gradients' all-reduce, changed in place at asym_at)

    def step(x, y, scale):
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        (loss * scale).backward()
        if mode == "ddp":
            opt.step()  # DDP's hooks all-reduced the gradients
        elif mode == "groups":
            lazyxla.reduce_gradients(opt, groups=groups)
            opt.step()
        else:
            lazyxla.optimizer_step(opt)  # gradients averaged over the replicas, then the step
        return lazyxla.all_reduce(lazyxla.ReduceOp.SUM, loss.detach(), scale=0.5)  # the replicas' mean loss

    run = lazyxla.compile(step, capture=captured)
    lazyxla.metrics.reset()
    from lazyxla.lazy.session import session

    losses, statuses, replayed, host_ms, cpu_ms, misses = [], [], [], [], [], []
    for i, (x, y) in enumerate(_batches(rank, steps)):
        scale = 0.5 if (i == asym_at and rank == 1 and mode != "groups") else 1.0
        if i == asym_at and mode == "groups":
            groups[:] = [[0], [1]]  # every rank: each averages its own gradients from now on
        xb, yb = x.to(dev), y.to(dev)
        started, cpu = time.perf_counter(), time.thread_time()
        loss = run(xb, yb, scale)
        host_ms.append((time.perf_counter() - started) * 1e3)
        cpu_ms.append((time.thread_time() - cpu) * 1e3)
        # (the status says why a call was recorded until the step verifies again, which rank 0's recorded call does
        # at once: the last replay's miss is kept in the session)
        statuses.append(run.capture_status if captured else None)
        misses.append(session.last_miss)
        replayed.append(lazyxla.metrics.counters().get("capture_replays", 0) > sum(replayed))
        losses.append(loss.item())
    counters = lazyxla.metrics.counters()
    return {
        "losses": losses,
        "params": {k: v.cpu() for k, v in model.state_dict().items()},
        "replays": counters.get("capture_replays", 0),
        "refusals": counters.get("capture_refusals", 0),
        "compiles": counters.get("compiles", 0),
        "statuses": statuses,
        "misses": misses,
        "replayed": replayed,
        "host_ms": host_ms,
        "cpu_ms": cpu_ms,
    }


def one_call_more(rank: int, steps: int = 5) -> dict:
    """Train ``steps`` captured steps in both ranks; then rank 0 alone calls the step once more, as a bug in a loop
    would (in lazy mode its program's collectives would wait for rank 1 for good). Returns what that call raised
    and how long it took."""
    import lazyxla
    from lazyxla.device import processes

    dev = lazyxla.device()
    model, net, opt = _model_and_optimizer(rank, "optimizer_step")

    def step(x, y):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        lazyxla.optimizer_step(opt)

    run = lazyxla.compile(step, capture=True)
    batches = [(x.to(dev), y.to(dev)) for x, y in _batches(rank, steps)]
    for x, y in batches:
        run(x, y)
    replays = lazyxla.metrics.counters().get("capture_replays", 0)
    if rank:
        return {"replays": replays}
    lazyxla.config.distributed_timeout_s = 5
    started = time.perf_counter()
    try:
        run(*batches[0])
        error = None
    except processes.DistributedError as e:
        error = str(e)
    return {"replays": replays, "error": error, "seconds": time.perf_counter() - started}
