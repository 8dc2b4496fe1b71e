"""Worker of tests/test_mesh2d_replicas.py: a 2-D lazyxla DeviceMesh over 4 replicas (one process per device).

The children of ``lazyxla.spawn`` import this module by name (tests/ is on their ``sys.path``).
"""

from __future__ import annotations

import torch

from tests.dtensor_spmd_workers import _FeedForward as FeedForward


def problem():
    """The MLP (its initial state), 4 batches of (input, target) and a (4, 6) matrix: the same in every rank."""
    torch.manual_seed(0)
    model = FeedForward(8, 16)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 8, generator=g), torch.randn(4, 3, 8, generator=g)) for _ in range(4)]
    return model, batches, torch.randn(4, 6, generator=g)


def _collectives(mesh, rank: int, dev) -> dict:
    """torch.distributed's collectives on the mesh's per-dimension groups, and DTensor redistributions on each
    dimension (CPU copies)."""
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    _, _, a = problem()
    out = {}
    for dim in ("tp", "dp"):
        group = mesh.get_group(dim)
        t = (torch.arange(6.0) + 10 * rank).to(dev)
        dist.all_reduce(t, group=group)
        gathered = torch.empty(2, 6, device=dev)
        dist.all_gather_into_tensor(gathered, (torch.arange(6.0) * (rank + 1)).to(dev), group=group)
        b = torch.full((3,), float(rank)).to(dev)
        dist.broadcast(b, group_src=1, group=group)
        sub = mesh[dim]
        A = distribute_tensor(a.to(dev), sub, [Shard(0)])
        B = distribute_tensor(a.to(dev), sub, [Replicate()])
        out[dim] = {
            "ranks": dist.get_process_group_ranks(group),
            "all_reduce": t,
            "all_gather": gathered,
            "broadcast": b,
            "shard(0) local": A.to_local(),
            "shard->replicate": A.redistribute(sub, [Replicate()]).to_local(),
            "replicate->shard(1)": B.redistribute(sub, [Shard(1)]).to_local(),
            "shard(0)->shard(1)": A.redistribute(sub, [Shard(1)]).to_local(),
        }
    both = distribute_tensor(a.to(dev), mesh, [Shard(0), Shard(1)])
    out["2-d local"] = both.to_local()
    out["2-d full"] = both.full_tensor()
    out["2-d -> (replicate, shard(0))"] = both.redistribute(mesh, [Replicate(), Shard(0)]).to_local()
    return {
        k: (
            {n: v.cpu() if isinstance(v, torch.Tensor) else v for n, v in d.items()} if isinstance(d, dict) else d.cpu()
        )
        for k, d in out.items()
    }


def fsdp_tp(rank: int) -> dict:
    """On ``init_device_mesh("lazyxla", (2, 2), mesh_dim_names=("dp", "tp"))``: the collectives of
    ``_collectives``; then the SwiGLU MLP tensor-parallel over "tp" (w1/w3 column-wise, w2 row-wise) and FSDP2 over
    "dp", 4 AdamW steps, each dp rank on its half of the batch. Losses, compiles and programs per step, and the
    final parameters (full tensors)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import lazyxla

    dist.init_process_group("lazyxla")
    mesh = init_device_mesh("lazyxla", (2, 2), mesh_dim_names=("dp", "tp"))
    dev = lazyxla.device()
    out = {"mesh": mesh.mesh.tolist(), "collectives": _collectives(mesh, rank, dev)}
    model, batches, _ = problem()
    model.to(dev)
    plan = {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
    parallelize_module(model, mesh["tp"], plan)
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    dp = mesh.get_local_rank("dp")
    losses, compiles, programs = [], [], []
    for x, y in batches:
        before = lazyxla.metrics.counters()["executions"]
        loss = F.mse_loss(model(x.chunk(2)[dp].to(dev)), y.chunk(2)[dp].to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        losses.append(loss.detach().full_tensor().cpu() if hasattr(loss, "full_tensor") else loss.detach().cpu())
        c = lazyxla.metrics.counters()
        compiles.append(c["compiles"])
        programs.append(c["executions"] - before)
    out.update(losses=losses, compiles=compiles, programs=programs)
    out["params"] = {k: p.full_tensor().cpu() for k, p in model.named_parameters()}
    out["placements"] = {k: str(p.placements) for k, p in model.named_parameters()}
    dist.destroy_process_group()
    return out
