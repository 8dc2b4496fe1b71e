"""Functions the multi-process tests run in each spawned rank (importable by the children)."""

from __future__ import annotations

import ipaddress
import os
import pickle

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
        return {
            "SUM": stack.any(0),
            "MUL": stack.all(0),
            "MIN": stack.min(0),
            "MAX": stack.max(0),
            "AND": stack.all(0),
            "OR": stack.any(0),
        }[op]
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


def dp_train(rank: int, world: int, steps: int, batch: int = 3, master_reads: int = 0) -> list:
    """Data-parallel SGD with momentum: each replica trains on its slice; lazyxla.optimizer_step averages.
    ``master_reads``: rank 0 alone reads its loss that many times after each optimizer step (before the sync,
    while the step's gradient all-reduce is pending)."""
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
        for i in range(master_reads if rank == 0 else 0):
            print(f"loss x {i + 1}: {(loss * (i + 1)).item():.4f}")  # each a new pending value
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


# --- the run's servers, the values processes exchange, stopping a run -------------------------------


def _listeners() -> dict[str, tuple]:
    """Every listening TCP socket of this network namespace: inode -> (address, port), from /proc/net."""
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as f:
            rows = f.read().splitlines()[1:]
        for row in rows:
            fields = row.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            ip = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word in host order
            out[fields[9]] = (str(ipaddress.ip_address(ip)), int(hex_port, 16))
    return out


def _own_socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def listening_sockets(rank: int) -> dict:
    """The addresses this rank listens on, and those of jax's coordinator and torch.distributed's store,
    once every server of the run is up (the process group joined, gloo connected, a host exchange done)."""
    import torch.distributed as dist

    import lazyxla

    dist.init_process_group("lazyxla")
    x = lazyxla.all_reduce(lazyxla.ReduceOp.SUM, torch.ones(2).to(lazyxla.device()))
    on_host = torch.ones(1)
    dist.all_reduce(on_host)  # a CPU tensor: through the coordination service
    total = x.tolist() + on_host.tolist()
    lazyxla.runtime.rendezvous("every server is up")
    listeners, mine = _listeners(), _own_socket_inodes()
    coordinator_port = int(lazyxla.config.coordinator_address.rsplit(":", 1)[1])
    store_port = int(os.environ["MASTER_PORT"])
    lazyxla.runtime.rendezvous("listeners read")  # no server closes while another rank still looks
    dist.destroy_process_group()
    return {
        "own": [a for inode, a in listeners.items() if inode in mine],
        "coordinator": [a for a in listeners.values() if a[1] == coordinator_port],
        "store": [a for a in listeners.values() if a[1] == store_port],
        "total": total,
    }


EXCHANGED_DTYPES = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
)  # fmt: skip
EXCHANGED_SHAPES = ((), (0,), (2, 3))


def exchanged_value(rank: int) -> dict:
    """What ``rank`` sends through mesh_reduce: tensors and arrays of every dtype and shape class, scalars."""
    tensors = [_data(rank, shape, dtype) for dtype in EXCHANGED_DTYPES for shape in EXCHANGED_SHAPES]
    arrays = [t.numpy() for t in tensors if t.dtype != torch.bfloat16]  # NumPy has no bfloat16
    scalars = [rank, 1.5 * rank, float("inf"), -0.0, True, None, f"rank{rank}", bytes([rank, 255]), 2j, 2**70]
    numpy_scalars = [np.float32(rank), np.int64(-rank), np.bool_(rank == 1)]
    return {"tensors": tensors, "arrays": arrays, "scalars": tuple(scalars), "np": numpy_scalars, (rank, "key"): []}


def _same(got, want) -> bool:
    if type(got) is not type(want):
        return False
    if isinstance(want, torch.Tensor):
        return got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    if isinstance(want, (np.ndarray, np.generic)):
        return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return list(got) == list(want) and all(_same(got[k], want[k]) for k in want)
    return got == want and str(got) == str(want)  # str: -0.0 is not 0.0


def exchange_every_dtype(rank: int) -> list[str]:
    """mesh_reduce of every dtype, and the lazyxla process group's CPU-tensor collectives (through the
    coordination service), against the values computed here; returns the mismatches."""
    import torch.distributed as dist

    import lazyxla

    dist.init_process_group("lazyxla")
    n = lazyxla.runtime.world_size()
    bad = []
    gathered = lazyxla.runtime.mesh_reduce("every dtype", exchanged_value(rank), list)
    for r in range(n):
        if not _same(gathered[r], exchanged_value(r)):
            bad.append(f"rank {rank}: mesh_reduce brought {gathered[r]!r} for rank {r}")
    for dtype in EXCHANGED_DTYPES:
        for shape in EXCHANGED_SHAPES:
            values = [_data(r, shape, dtype) for r in range(n)]
            t = values[rank].clone()
            dist.all_reduce(t)
            want = torch.stack(values).sum(0).to(dtype)  # what CPU eager PyTorch sums
            if not _same(t, want):
                bad.append(f"rank {rank}: all_reduce {dtype} {shape} gave {t} want {want}")
            out = [torch.empty(shape, dtype=dtype) for _ in range(n)]
            dist.all_gather(out, values[rank])
            if not all(_same(o, v) for o, v in zip(out, values)):
                bad.append(f"rank {rank}: all_gather {dtype} {shape} gave {out}")
            t = values[rank].clone()
            dist.broadcast(t, src=n - 1)
            if not _same(t, values[n - 1]):
                bad.append(f"rank {rank}: broadcast {dtype} {shape} gave {t}")
    dist.destroy_process_group()
    return bad


class Planted:
    """An object whose unpickling creates the file ``marker`` (what a planted value could do instead)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def planted_values(rank: int, marker: str) -> list[str] | None:
    """Rank 1 writes a pickle that would create ``marker`` where rank 0 reads a mesh_reduce value, then
    where the process group reads a CPU tensor; returns rank 0's errors (type: message)."""
    import torch.distributed as dist
    from jax._src import distributed as jax_distributed

    import lazyxla

    dist.init_process_group("lazyxla")
    client = jax_distributed.global_state.client
    evil = pickle.dumps(Planted(marker))
    errors = []
    # the keys rendezvous uses: lazyxla/rendezvous/<tag>/<count>/<process>, then a barrier <...>/done
    for tag, call in (
        ("planted", lambda: lazyxla.runtime.mesh_reduce("planted", 1.0, sum)),
        ("pg/1", lambda: dist.all_reduce(torch.ones(2))),  # the group's first host exchange
    ):
        if rank == 1:
            client.key_value_set_bytes(f"lazyxla/rendezvous/{tag}/1/1", evil)
            client.wait_at_barrier(f"lazyxla/rendezvous/{tag}/1/done", 60_000)
            client.key_value_delete(f"lazyxla/rendezvous/{tag}/1/1")
        else:
            try:
                call()
                errors.append("no error")
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
    lazyxla.runtime.rendezvous("planted: done")
    dist.destroy_process_group()
    return errors if rank == 0 else None


def hang_after_failure(rank: int) -> None:
    """Rank 0 raises once both ranks are running; rank 1 sleeps (as a rank stuck in I/O would)."""
    import time

    import lazyxla

    lazyxla.runtime.rendezvous("both running")
    if rank == 0:
        raise ValueError("deliberate failure in rank 0")
    time.sleep(600)


def rank_numbers(rank: int) -> dict:
    """Python numbers whose value differs between ranks (0 on one rank, 1 on another) in math that a
    collective reduces: each rank's program must take them as inputs, not constants (a rank whose program
    had 0.0 baked in met the other's collective with a wrong sum)."""
    import lazyxla

    dev = lazyxla.device()
    total = lazyxla.ReduceOp.SUM
    x = torch.ones(4, device=dev)
    out = {}
    for name, s in (("rank", float(rank)), ("rank+1", float(rank + 1)), ("-rank", -float(rank))):
        out[name] = lazyxla.all_reduce(total, x * s + s).cpu().tolist()
    out["alpha"] = lazyxla.all_reduce(total, torch.add(x, x, alpha=rank)).cpu().tolist()
    # beta=0 ignores the input, NaNs included, as in PyTorch, also when beta is a program input
    a = torch.ones(2, 2, device=dev)
    bias = torch.full((2, 2), float("nan"), device=dev) if rank == 0 else a
    out["beta"] = lazyxla.all_reduce(total, torch.addmm(bias, a, a, beta=rank)).cpu().tolist()
    return out


def device_results(rank: int) -> list:
    """CPU copies of device tensors, as a training function returns its parameters."""
    import lazyxla

    dev = lazyxla.device()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(dev)
    return [p.detach().cpu() * (rank + 1) for p in model.parameters()] + [torch.tensor(rank)]


def cached_training(rank: int, folder: str) -> dict:
    """Two SGD steps of a small model whose gradients are all-reduced (a replica program) after a step that
    makes its data on the device (single-device programs), with the persistent cache in ``folder``; returns
    the losses, the disk-cache counters and the cache's warnings."""
    import warnings

    import lazyxla
    from lazyxla import ReduceOp

    lazyxla.config.persistent_cache = True
    lazyxla.config.cache_dir = folder
    dev = lazyxla.device()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = (torch.arange(12.0).reshape(3, 4) * (rank + 1)).to(dev) / 10
        lazyxla.sync()
        for _ in range(2):
            loss = model(x).square().mean()
            loss.backward()
            for p in model.parameters():
                p.grad = lazyxla.all_reduce(ReduceOp.SUM, p.grad, scale=0.5)
            opt.step()
            opt.zero_grad()
            lazyxla.sync()
            losses.append(loss.item())
    counters = lazyxla.metrics.counters()
    return {
        "losses": losses,
        "hits": counters.get("persistent_cache_hits", 0),
        "misses": counters.get("persistent_cache_misses", 0),
        "compiles": counters.get("compiles", 0),
        "warnings": [str(w.message) for w in caught if "cache" in str(w.message)],
    }


def dtensor_problem():
    """CPU tensors the DTensor tests distribute (the same in every rank): a, b, embedding ids and table."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 6, generator=g), torch.randn(6, 4, generator=g)
    return a, b, torch.tensor([[1, 5, 2], [0, 7, 7]]), torch.randn(8, 4, generator=g)


def dtensor_ops(rank: int) -> dict:
    """DTensor on a 1-D lazyxla DeviceMesh over the replicas: placements, redistributions and ops;
    CPU copies of the results, the host exchanges the process group made meanwhile, and compiles per step."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    import lazyxla

    dist.init_process_group("lazyxla")
    n = dist.get_world_size()
    mesh = init_device_mesh("lazyxla", (n,))
    dev = lazyxla.device()
    a, b, ids, table = dtensor_problem()
    out = {"mesh": mesh.mesh.tolist(), "device_type": mesh.device_type}
    host_calls = dist.group.WORLD._host_calls

    def step():
        A = distribute_tensor(a.to(dev), mesh, [Shard(0)])
        B = distribute_tensor(b.to(dev), mesh, [Replicate()])
        P = DTensor.from_local(torch.full((2, 4), float(rank + 1)).to(dev), mesh, [Partial()])
        got = {
            "A local": A.to_local(),
            "matmul": (A @ B).full_tensor(),
            "elementwise": (A * 2 + A.sin()).full_tensor(),
            "sum": A.sum().full_tensor(),
            "sum dim 0": A.sum(0).full_tensor(),
            "shard->replicate": A.redistribute(mesh, [Replicate()]).to_local(),
            "replicate->shard(1)": B.redistribute(mesh, [Shard(1)]).to_local(),
            "partial->replicate": P.redistribute(mesh, [Replicate()]).to_local(),
            "partial->shard(0)": P.redistribute(mesh, [Shard(0)]).to_local(),
            "shard(0)->shard(1)": A.redistribute(mesh, [Shard(1)]).to_local(),
            "embedding": F.embedding(
                distribute_tensor(ids.to(dev), mesh, [Shard(0)]), distribute_tensor(table.to(dev), mesh, [Replicate()])
            ).full_tensor(),
        }
        got["local types"] = sorted({type(A.to_local()).__name__, type(B.to_local()).__name__})
        lazyxla.sync()
        return got

    compiles = []
    for _ in range(3):
        got = step()
        compiles.append(lazyxla.metrics.counters()["compiles"])
    out.update({k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in got.items()})
    out["host exchanges"] = dist.group.WORLD._host_calls - host_calls
    out["compiles"] = compiles
    dist.destroy_process_group()
    return out


def dtensor_backward(rank: int) -> dict:
    """``(A @ W).sin().sum().backward()`` with A ``Shard(0)`` and W ``Replicate()`` on a 1-D lazyxla DeviceMesh
    over the replicas, twice: the loss, W's gradient (CPU copies) and compiles per step."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import lazyxla

    dist.init_process_group("lazyxla")
    mesh = init_device_mesh("lazyxla", (dist.get_world_size(),))
    dev = lazyxla.device()
    a, w, _, _ = dtensor_problem()
    compiles = []
    for _ in range(2):
        A = distribute_tensor(a.to(dev), mesh, [Shard(0)])
        W = distribute_tensor(w.to(dev), mesh, [Replicate()]).requires_grad_()
        loss = (A @ W).sin().sum()
        loss.backward()
        out = {"loss": loss.full_tensor(), "grad": W.grad.full_tensor(), "grad placements": str(W.grad.placements)}
        lazyxla.sync()
        compiles.append(lazyxla.metrics.counters()["compiles"])
    out = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    out["compiles"] = compiles
    dist.destroy_process_group()
    return out


def fsdp_problem():
    """A tiny MLP (its initial state) and 4 batches of (input, target): the same in every rank."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
    )
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)) for _ in range(4)]
    return model, batches


def fsdp_mlp(rank: int) -> dict:
    """FSDP2 (``fully_shard`` per Linear and at the root) over the replicas: 4 AdamW (foreach) steps, each rank on its
    part of the batch. Each step's loss (this rank's), compiles after each step, the final parameters' local shards,
    and the local and global element counts of parameters, gradients and optimizer state after the last backward."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import lazyxla

    dist.init_process_group("lazyxla")
    n = dist.get_world_size()
    mesh = init_device_mesh("lazyxla", (n,))
    dev = lazyxla.device()
    model, batches = fsdp_problem()
    model.to(dev)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    losses, compiles, counts = [], [], {}
    for x, y in batches:
        loss = F.mse_loss(model(x.chunk(n)[rank].to(dev)), y.chunk(n)[rank].to(dev))
        loss.backward()
        opt.step()
        params = list(model.parameters())
        counts = {
            "params": [(p.to_local().numel(), p.numel()) for p in params],
            "grads": [(p.grad.to_local().numel(), p.grad.numel()) for p in params],
            "optimizer state": [
                (v.to_local().numel(), v.numel()) for p in params for v in opt.state[p].values() if v.dim() > 0
            ],
        }
        opt.zero_grad()
        lazyxla.sync()
        losses.append(loss.detach().cpu())
        compiles.append(lazyxla.metrics.counters()["compiles"])
    out = {"losses": losses, "compiles": compiles, "counts": counts}
    out["params"] = {k: p.to_local().cpu() for k, p in model.named_parameters()}
    # between steps FSDP has freed its all-gather outputs: they hold no device buffer (a read says so)
    group = model[0]._get_fsdp_state()._fsdp_param_group
    try:
        group.fsdp_params[0].all_gather_outputs[0].cpu()
        out["freed read"] = "read"
    except RuntimeError as e:
        out["freed read"] = str(e)
    dist.destroy_process_group()
    return out


def tiny_llama():
    """A tiny random transformers LlamaForCausalLM (nothing downloaded) on the CPU, and 4 batches of token ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(1)
    return model, [torch.randint(0, 64, (4, 16), generator=g) for _ in range(4)]


def fsdp_llama_replicas(rank: int, bf16_params: bool = False) -> dict:
    """FSDP2 (``fully_shard`` per decoder layer and at the root) over the replicas: 4 AdamW (foreach) steps of a
    tiny Llama, each rank on its rows of the batch; ``bf16_params``: ``MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=f32)``. Its losses, compiles and programs run after each step, the final parameters' local shards,
    the dtype of the forward's unsharded parameters and the local and global element counts of parameters,
    gradients and optimizer state."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import lazyxla

    dist.init_process_group("lazyxla")
    n = dist.get_world_size()
    mesh = init_device_mesh("lazyxla", (n,))
    dev = lazyxla.device()
    model, batches = tiny_llama()
    model.to(dev)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16_params else None
    kwargs = {"mp_policy": mp} if mp is not None else {}
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    seen = []  # the dtype the forward computes in (FSDP2's unsharded parameters)
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    losses, compiles, programs, counts = [], [], [], {}
    for ids in batches:
        before = lazyxla.metrics.counters()["executions"]
        ids = ids.chunk(n)[rank].to(dev)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        params = list(model.parameters())
        counts = {
            "params": [(p.to_local().numel(), p.numel()) for p in params],
            "grads": [(p.grad.to_local().numel(), p.grad.numel()) for p in params],
            "optimizer state": [
                (v.to_local().numel(), v.numel()) for p in params for v in opt.state[p].values() if v.dim() > 0
            ],
        }
        opt.zero_grad()
        lazyxla.sync()
        losses.append(loss.detach().float().cpu())
        c = lazyxla.metrics.counters()
        compiles.append(c["compiles"])
        programs.append(c["executions"] - before)
    out = {"losses": losses, "compiles": compiles, "programs": programs, "counts": counts, "dtype": str(seen[0])}
    out["params"] = {k: p.to_local().cpu() for k, p in model.named_parameters()}
    out["param dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    dist.destroy_process_group()
    return out


# The FSDP2 recipes over replicas: (checkpointing, optimizer, micro-batches, gradient sync on the last only,
# zero_grad() first, clip_grad_norm_'s max norm); the keys of dtensor_spmd_workers.RECIPES
REPLICA_RECIPES = {
    # checkpoint_wrapper on each block, fused AdamW, 2 micro-batches with set_requires_gradient_sync(False) on the
    # first, clip_grad_norm_, zero_grad() first
    "wrapper_fused_sync": dict(
        checkpoint="wrapper", mixed=False, optimizer="fused", micro=2, sync=True, zero_first=True, clip=0.5
    ),
    # torch.utils.checkpoint.checkpoint(block, x) in the forward, AdamW(capturable=True), plain accumulation over 2
    # micro-batches, zero_grad() last
    "function_capturable_plain": dict(
        checkpoint="function", mixed=False, optimizer="capturable", micro=2, sync=False, zero_first=False, clip=None
    ),
}
RECIPE_LR = 1e-3


def recipe_problem(recipe: dict):
    """The tiny torchtitan-style Llama of the SPMD recipes (``checkpoint_wrapper`` around each block when the recipe
    says so) on the CPU, and 4 batches of int64 token ids: the same in every rank."""
    from dtensor_spmd_workers import _Llama  # tests/ is on the path of the spawned children too
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    torch.manual_seed(0)
    model = _Llama()
    if recipe["checkpoint"] == "wrapper":
        for i, layer in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(layer)
    model.checkpoint = recipe["checkpoint"] == "function"
    g = torch.Generator().manual_seed(1)
    return model, [torch.randint(0, 64, (8, 16), generator=g) for _ in range(4)]


def fsdp_recipes_replicas(rank: int, names: list) -> dict:
    """FSDP2 (``fully_shard`` per block and at the root) over the replicas, trained 4 steps by each of
    ``REPLICA_RECIPES[names]`` in turn (a fresh model each), each rank on its rows of the batch. Per recipe: each
    step's loss (this rank's, summed over its micro-batches), gradient norm (when clipped), compiles and programs
    run in each step, the final parameters' local shards, the optimizer's step-counter types and the local and
    global element counts of parameters and AdamW state."""
    import torch.distributed as dist
    from dtensor_spmd_workers import _recipe_step
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import lazyxla

    dist.init_process_group("lazyxla")
    n = dist.get_world_size()
    mesh = init_device_mesh("lazyxla", (n,))
    dev = lazyxla.device()
    results = {}
    for name in names:
        recipe = REPLICA_RECIPES[name]
        model, batches = recipe_problem(recipe)
        model.to(dev)
        forwards = [0]  # the blocks' forwards run (checkpointing runs each again in backward)
        for layer in model.layers:
            block = getattr(layer, "_checkpoint_wrapped_module", layer)
            block.register_forward_pre_hook(lambda *_, f=forwards: f.__setitem__(0, f[0] + 1))
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        kind = recipe["optimizer"]
        opt = torch.optim.AdamW(
            model.parameters(),
            lr=RECIPE_LR,
            foreach=kind != "fused" or None,
            fused=kind == "fused" or None,
            capturable=kind == "capturable",
        )
        lazyxla.sync()
        losses, norms, compiles, programs = [], [], [], []
        for ids in batches:
            before = lazyxla.metrics.counters()
            loss, norm = _recipe_step(model, opt, ids.chunk(n)[rank], recipe, lambda b: b.to(dev), sync_model=model)
            lazyxla.sync()
            after = lazyxla.metrics.counters()
            losses.append(loss.cpu())
            norms.append(None if norm is None else norm.full_tensor().cpu())
            compiles.append(after["compiles"] - before["compiles"])
            programs.append(after["executions"] - before["executions"])
        params = list(model.parameters())
        results[name] = {
            "losses": losses,
            "norms": norms,
            "compiles": compiles,
            "programs": programs,
            "params": {k: p.to_local().cpu() for k, p in model.named_parameters()},
            "steps": sorted({type(opt.state[p]["step"]).__name__ for p in params}),
            "forwards": forwards[0],
            "counts": {
                "params": [(p.to_local().numel(), p.numel()) for p in params],
                "optimizer state": [
                    (opt.state[p][k].to_local().numel(), p.numel()) for p in params for k in ("exp_avg", "exp_avg_sq")
                ],
            },
        }
        if recipe["zero_first"]:  # the last step's gradients are still held
            results[name]["counts"]["grads"] = [(p.grad.to_local().numel(), p.grad.numel()) for p in params]
    dist.destroy_process_group()
    return results
