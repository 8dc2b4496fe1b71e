"""Functions the torch.compile tests run in each spawned replica (importable by the children)."""

from __future__ import annotations

import torch


def _collectives(xm, world: int):
    """A function calling torch_xla's collectives (every form the compat layer lets Dynamo put in a graph)."""

    def fn(t):
        y = t * 2
        total = xm.all_reduce(xm.REDUCE_SUM, y, scale=0.5)
        biggest = xm.all_reduce(xm.REDUCE_MAX, y + 1)
        gathered = xm.all_gather(y, dim=0)
        scattered = xm.reduce_scatter(xm.REDUCE_SUM, y, 1.0, 0, world)
        swapped = xm.all_to_all(y.reshape(world, -1), 0, 0, world)
        shifted = xm.collective_permute(y, [[i, (i + 1) % world] for i in range(world)])
        pair = [y + 1, y * 3]
        xm.all_reduce(xm.REDUCE_SUM, pair)  # a list: reduced in place
        return total + 1, biggest, gathered, scattered, swapped, shifted, pair[0], pair[1]

    return fn


def compiled_collectives(rank: int, backends: tuple[str, ...]) -> dict:
    """torch_xla's collectives inside ``torch.compile(fullgraph=True)`` (one graph, no break) against the same
    function run in lazy mode and in eager mode; also a compiled function whose output is all-reduced.
    Returns {backend: findings}."""
    import lazyxla.compat

    lazyxla.compat.install()
    return {backend: _compiled_collectives(rank, backend) for backend in backends}


def _compiled_collectives(rank: int, backend: str) -> dict:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    import lazyxla

    dev = torch_xla.device()
    world = xr.world_size()
    fn = _collectives(xm, world)
    x = (torch.arange(8, dtype=torch.float32) * (rank + 1) - rank).to(dev)
    want = [t.cpu() for t in fn(x)]

    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    lazyxla.metrics.reset()
    got = compiled(x)
    programs_before_sync = lazyxla.metrics.counters()["executions"]
    torch_xla.sync()
    got = [t.cpu() for t in got]
    calls = dict(lazyxla.metrics.counters())
    again = [t.cpu() for t in compiled(x + 0)]  # a second call: the same trace

    lazyxla.eager_mode(True)
    lazyxla.metrics.reset()
    eager = compiled(x)
    eager_programs = lazyxla.metrics.counters()["executions"]  # computed at the call: one program
    eager = [t.cpu() for t in eager]
    lazyxla.eager_mode(False)

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2).to(dev)
    batch = (torch.arange(32, dtype=torch.float32).reshape(4, 8) / (rank + 3)).to(dev)

    def mean_loss(b):
        loss = model(b).square().mean()
        return xm.all_reduce(xm.REDUCE_SUM, loss, scale=1.0 / world)

    with torch.no_grad():  # (collectives have no gradient, as torch_xla's xm.all_reduce)
        loss_want = mean_loss(batch).item()
        loss_got = torch.compile(mean_loss, backend=backend, fullgraph=True)(batch).item()

    def bad(outs):
        return [i for i, (a, b) in enumerate(zip(outs, want)) if a.shape != b.shape or not torch.equal(a, b)]

    return {
        "mismatch": bad(got),
        "mismatch_again": bad(again),
        "mismatch_eager": bad(eager),
        "programs_before_sync": programs_before_sync,
        "eager_programs": eager_programs,
        "traces": calls.get("dynamo_traces", 0),
        "calls": calls.get("dynamo_calls", 0),
        "op_by_op": calls.get("dynamo_op_by_op_calls", 0),
        "gathered": got[2].tolist(),
        "loss": (loss_got, loss_want),
    }
