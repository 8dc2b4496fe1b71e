"""Functions the multi-process tests run in each spawned rank (importable by the children)."""

from __future__ import annotations

import numpy as np
import torch


def _data(rank: int, shape, dtype: torch.dtype) -> torch.Tensor:
    n = int(np.prod(shape)) if shape else 1
    base = torch.arange(n, dtype=torch.float64).reshape(shape) * (rank + 1) + 3 * rank - 2
    if dtype == torch.bool:
        return (base.long() % 3 == rank % 2).reshape(shape)
    return base.to(dtype)


def _np_reduce(op: str, values: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(values)
    if stack.dtype == np.bool_:
        return {"SUM": stack.any(0), "MUL": stack.all(0), "MIN": stack.min(0), "MAX": stack.max(0),
                "AND": stack.all(0), "OR": stack.any(0)}[op]
    if op in ("AND", "OR"):
        out = values[0]
        for v in values[1:]:
            out = (out & v) if op == "AND" else (out | v)
        return out
    return {"SUM": stack.sum(0), "MUL": stack.prod(0), "MIN": stack.min(0), "MAX": stack.max(0)}[op].astype(stack.dtype)


def check_collectives(rank: int, groups) -> list[str]:
    """Every collective against NumPy, for several shapes and dtypes; returns the mismatches."""
    import lazyxla
    from lazyxla import ReduceOp
    from lazyxla.lowering import cache

    dev = lazyxla.device()
    n = lazyxla.runtime.world_size()
    bad: list[str] = []

    def expect(name, got, want):
        got = got.cpu().numpy()
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6, atol=1e-6):
            bad.append(f"rank {rank} {name}: got {got.tolist()} want {want.tolist()}")

    every = [list(range(n))]
    for shape in [(), (4,), (2, 6)]:
        for dtype in [torch.float32, torch.int32, torch.bool]:
            xs = [_data(r, shape, dtype).numpy() for r in range(n)]
            x = _data(rank, shape, dtype).to(dev)
            ops = ["SUM", "MUL", "MIN", "MAX"] + (["AND", "OR"] if dtype != torch.float32 else [])
            for op in ops:
                scale = 0.5 if dtype == torch.float32 else 1.0
                for g in (None, groups):
                    mine = next(gr for gr in (g or every) if rank in gr)
                    want = _np_reduce(op, [xs[r] for r in mine])
                    if scale != 1.0:
                        want = (want * scale).astype(want.dtype)
                    got = lazyxla.all_reduce(ReduceOp[op], x, scale=scale, groups=g)
                    expect(f"all_reduce {op} {shape} {dtype} groups={g}", got, want)
            if shape:
                for g in (None, groups):
                    mine = next(gr for gr in (g or every) if rank in gr)
                    d = len(shape) - 1
                    want = np.concatenate([xs[r] for r in mine], axis=d)
                    expect(f"all_gather {shape} {dtype} groups={g}", lazyxla.all_gather(x, d, groups=g), want)
            lazyxla.sync()
    # reduce_scatter, all_to_all, collective_permute, broadcast, and the list variants
    for g in (None, groups):
        mine = next(gr for gr in (g or every) if rank in gr)
        k, pos = len(mine), mine.index(rank)
        xs = [_data(r, (2 * k, 3), torch.float32).numpy() for r in range(n)]
        x = _data(rank, (2 * k, 3), torch.float32).to(dev)
        full = sum(xs[r] for r in mine) * 0.25
        got = lazyxla.reduce_scatter(ReduceOp.SUM, x, 0.25, 0, k, groups=g)
        expect(f"reduce_scatter SUM groups={g}", got, full[2 * pos : 2 * pos + 2])
        mx = np.max(np.stack([xs[r] for r in mine]), 0)
        got = lazyxla.reduce_scatter(ReduceOp.MAX, x, 1.0, 0, k, groups=g)
        expect(f"reduce_scatter MAX groups={g}", got, mx[2 * pos : 2 * pos + 2])
        got = lazyxla.all_to_all(x, 0, 1, k, groups=g)
        want = np.concatenate([xs[r][2 * pos : 2 * pos + 2] for r in mine], axis=1)
        expect(f"all_to_all groups={g}", got, want)
        pair = [lazyxla.all_gather([x, x * 2], 0, groups=g)]
        expect(f"all_gather list[0] groups={g}", pair[0][0], np.concatenate([xs[r] for r in mine], 0))
        expect(f"all_gather list[1] groups={g}", pair[0][1], np.concatenate([2 * xs[r] for r in mine], 0))
        lst = [x.clone(), (x * 3).clone()]
        lazyxla.all_reduce(ReduceOp.SUM, lst, groups=g)
        expect(f"all_reduce list[0] groups={g}", lst[0], sum(xs[r] for r in mine))
        expect(f"all_reduce list[1] groups={g}", lst[1], sum(3 * xs[r] for r in mine))
        rs = lazyxla.reduce_scatter(ReduceOp.SUM, [x, x + 1], 1.0, 0, k, groups=g)
        expect(f"reduce_scatter list[1] groups={g}", rs[1], sum(xs[r] + 1 for r in mine)[2 * pos : 2 * pos + 2])
        lazyxla.sync()
    x = _data(rank, (3,), torch.float32).to(dev)
    ring = [(i, (i + 1) % n) for i in range(n)]
    left = _data((rank - 1) % n, (3,), torch.float32).numpy()
    expect("collective_permute ring", lazyxla.collective_permute(x, ring), left)
    half = [(0, 1)]
    want = _data(0, (3,), torch.float32).numpy() if rank == 1 else np.zeros(3, np.float32)
    expect("collective_permute partial", lazyxla.collective_permute(x, half), want)
    expect("broadcast root 1", lazyxla.broadcast(x, root=1), _data(1, (3,), torch.float32).numpy())
    b = [x.clone(), _data(rank, (2,), torch.int32).to(dev)]
    lazyxla.broadcast(b, root=n - 1)
    expect("broadcast list[0]", b[0], _data(n - 1, (3,), torch.float32).numpy())
    expect("broadcast list[1]", b[1], _data(n - 1, (2,), torch.int32).numpy())
    # the collective runs inside the step's program: no host transfer, an all-reduce in the executable
    before = lazyxla.metrics.counters()["device_to_host"]
    y = lazyxla.all_reduce(ReduceOp.SUM, x * 2)
    lazyxla.sync(wait=True)
    if lazyxla.metrics.counters()["device_to_host"] != before:
        bad.append("a collective step moved data to the host")
    text = next(reversed(cache._cache.values())).executable.as_text()
    if "all-reduce" not in text:
        bad.append("no all-reduce in the compiled program")
    expect("all_reduce after the check", y, sum(2 * _data(r, (3,), torch.float32).numpy() for r in range(n)))
    return bad


def runtime_facts(rank: int) -> dict:
    """What lazyxla.runtime reports in this rank, a rendezvous payload exchange and a mesh_reduce."""
    import lazyxla

    rt = lazyxla.runtime
    payloads = rt.rendezvous("facts", f"rank{rank}".encode())
    total = rt.mesh_reduce("sum", rank + 1, sum)
    return {
        "world": rt.world_size(),
        "ordinal": rt.global_ordinal(),
        "local": rt.local_ordinal(),
        "processes": rt.process_count(),
        "index": rt.process_index(),
        "master": rt.is_master(),
        "payloads": [p.decode() for p in payloads],
        "total": total,
    }


def fail_at_step(rank: int, bad_rank: int, pid_dir: str, how: str) -> None:
    """Train a little; ``bad_rank`` raises (or kills itself) at step 3, the others go on syncing collectives."""
    import os
    import signal
    import time

    import lazyxla

    with open(os.path.join(pid_dir, f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    dev = lazyxla.device()
    x = torch.ones(4).to(dev)
    for step in range(1000):
        if rank == bad_rank and step == 3:
            with open(os.path.join(pid_dir, "failed_at"), "w") as f:
                f.write(repr(time.time()))
            if how == "raise":
                raise ValueError(f"deliberate failure in rank {rank} at step {step}")
            os.kill(os.getpid(), signal.SIGKILL)
        x = lazyxla.all_reduce(lazyxla.ReduceOp.SUM, x, scale=0.5)
        lazyxla.sync()
        x.cpu()


def dp_problem(world: int, batch: int = 3, seed: int = 0):
    """A small MLP regression problem: the model, and the global batch the replicas split."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(world * batch, 5, generator=g)
    y = torch.randn(world * batch, 2, generator=g)
    return model, x, y


def dp_train(rank: int, world: int, steps: int, batch: int = 3) -> list:
    """Data-parallel SGD with momentum: each replica trains on its slice; lazyxla.optimizer_step averages."""
    import lazyxla

    dev = lazyxla.device()
    model, x, y = dp_problem(world, batch)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xs, ys = x[rank * batch : (rank + 1) * batch].to(dev), y[rank * batch : (rank + 1) * batch].to(dev)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        lazyxla.optimizer_step(opt)
        opt.zero_grad()
        lazyxla.sync()
    return [p.detach().cpu().numpy() for p in model.parameters()]


def ddp_train(rank: int, world: int, steps: int, batch: int = 3) -> dict:
    """The same data-parallel run through torch.distributed: DistributedDataParallel over the lazyxla group."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import lazyxla

    dist.init_process_group("lazyxla")
    dev = lazyxla.device()
    model, x, y = dp_problem(world, batch)
    if rank:  # start from other weights: DDP must broadcast rank 0's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(rank)
    ddp = DDP(model.to(dev))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    xs, ys = x[rank * batch : (rank + 1) * batch].to(dev), y[rank * batch : (rank + 1) * batch].to(dev)
    compiles = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(ddp(xs), ys)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        compiles.append(lazyxla.metrics.counters()["compiles"])
    t = torch.tensor([float(rank + 1)]).to(dev)
    dist.all_reduce(t)
    total = t.item()
    dist.destroy_process_group()
    return {"params": [p.detach().cpu().numpy() for p in model.parameters()], "compiles": compiles, "total": total}


def cached_collective(rank: int, cache_dir: str) -> dict:
    """A step with an all-reduce, compiled through the persistent cache in ``cache_dir``."""
    import lazyxla

    lazyxla.config.persistent_cache = True
    lazyxla.config.cache_dir = cache_dir
    x = (torch.arange(4.0) + rank).to(lazyxla.device())
    y = lazyxla.all_reduce(lazyxla.ReduceOp.SUM, x * 2)
    value = y.tolist()
    c = lazyxla.metrics.counters()
    return {"value": value, "hits": c["persistent_cache_hits"], "misses": c["persistent_cache_misses"]}
