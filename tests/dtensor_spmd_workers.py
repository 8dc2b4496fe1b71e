"""Functions the SPMD DTensor tests run in fresh processes (one process, 8 fake CPU devices)."""

from __future__ import annotations

import torch

STEPS = 4


def _layout(dt) -> tuple | None:
    """The lazyxla partition spec of a DTensor's (global) local tensor, None when replicated."""
    import lazyxla

    got = lazyxla.spmd.get_sharding(dt._local_tensor)
    return None if got is None else tuple(got[1])


def _step(w1, w2, x, lr=0.1):
    """One SGD step of a two-layer MLP (column- then row-parallel); returns the loss."""
    loss = ((x @ w1).relu() @ w2).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        for w in (w1, w2):
            w.sub_(lr * w.grad)
            w.grad = None
    return loss


def basics(rank: int) -> dict:
    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    out: dict = {}
    torch.manual_seed(0)
    a, b = torch.randn(16, 8), torch.randn(8, 4)

    flat = init_device_mesh("lazyxla", (8,))
    out["flat_size"] = flat.size()
    da = distribute_tensor(a, flat, [Shard(0)])
    db = distribute_tensor(b, flat, [Replicate()])
    out["flat_layouts"] = (_layout(da), _layout(db))
    out["local_shape"] = tuple(da.to_local().shape)  # the global view: the local tensor is the whole tensor
    c = da @ db
    out["matmul"] = (c.placements, (c.full_tensor().cpu() - a @ b).abs().max().item())
    e = (da * 2 + 1).exp().sum()
    out["sum"] = (e.placements, e.full_tensor().cpu().item(), (a * 2 + 1).exp().sum().item())
    r = da.redistribute(flat, [Shard(1)])
    out["redistributed"] = (r.placements, _layout(r), (r.full_tensor().cpu() - a).abs().max().item())
    v = da.view(8, 16)  # a view's shape argument is the global shape
    out["view"] = (v.placements, tuple(v.shape), (v.full_tensor().cpu() - a.view(8, 16)).abs().max().item())

    mesh = init_device_mesh("lazyxla", (2, 4), mesh_dim_names=("dp", "tp"))
    out["mesh_shape"] = (tuple(mesh.shape), mesh.mesh_dim_names, mesh["tp"].size())
    x0, w10, w20 = torch.randn(16, 8), torch.randn(8, 32) / 3, torch.randn(32, 8) / 6
    x = distribute_tensor(x0, mesh, [Shard(0), Replicate()])
    w1 = distribute_tensor(w10.clone().requires_grad_(), mesh, [Replicate(), Shard(1)])
    w2 = distribute_tensor(w20.clone().requires_grad_(), mesh, [Replicate(), Shard(0)])
    out["layouts"] = {"x": _layout(x), "w1": _layout(w1), "w2": _layout(w2)}
    tp = distribute_tensor(w10, mesh["tp"], [Shard(1)])  # a sub-mesh: replicated over the other dimension
    out["submesh_layout"] = _layout(tp)

    loss = ((x @ w1).relu() @ w2).pow(2).mean()
    out["stablehlo"] = lazyxla.debug.stablehlo_text([loss._local_tensor])
    loss.backward()
    out["grad_placements"] = (w1.grad.placements, w2.grad.placements)
    out["grad_layouts"] = (_layout(w1.grad), _layout(w2.grad))
    cw1, cw2 = w10.clone().requires_grad_(), w20.clone().requires_grad_()
    ref = ((x0 @ cw1).relu() @ cw2).pow(2).mean()
    ref.backward()
    out["loss"] = (loss.full_tensor().cpu().item(), ref.item())
    out["grads"] = max(
        (w1.grad.full_tensor().cpu() - cw1.grad).abs().max().item(),
        (w2.grad.full_tensor().cpu() - cw2.grad).abs().max().item(),
    )
    w1.grad = w2.grad = None

    # a repeated step: one program per step, no compile after the second
    lazyxla.sync()
    losses, ref_losses, compiles = [], [], [lazyxla.metrics.counters()["compiles"]]
    cw1, cw2 = w10.clone().requires_grad_(), w20.clone().requires_grad_()
    for _ in range(STEPS):
        losses.append(_step(w1, w2, x).full_tensor())
        lazyxla.sync()
        compiles.append(lazyxla.metrics.counters()["compiles"])
        ref_losses.append(_step(cw1, cw2, x0).item())
    out["losses"] = [v.cpu().item() for v in losses]
    out["ref_losses"] = ref_losses
    out["compiles"] = compiles
    out["params"] = max(
        (w1.full_tensor().cpu() - cw1.detach()).abs().max().item(),
        (w2.full_tensor().cpu() - cw2.detach()).abs().max().item(),
    )
    out["param_layouts"] = (_layout(w1), _layout(w2))
    return out
