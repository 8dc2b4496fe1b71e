"""Workers of tests/test_call_jax.py that need 8 fake CPU devices (run by ``lazyxla.spawn(cpu_devices=8)``)."""

from __future__ import annotations

import torch


def spmd_call_jax(rank: int) -> dict:
    """A jnp function and a shard_map function on inputs sharded over 8 devices: values and gradients against
    the CPU, the output's layout, and the compiles per step."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import lazyxla

    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    mesh = spmd.mesh((8,), ("data",))
    torch.manual_seed(0)
    x_cpu, w_cpu = torch.randn(16, 8), torch.randn(8, 8, requires_grad=True)

    def mlp(x, w):
        return jnp.tanh(x @ w)

    def rowwise(x):  # per-shard code: each device normalizes its own rows
        return x / jnp.sum(jnp.abs(x), axis=-1, keepdims=True)

    shard_rows = jax.shard_map(rowwise, mesh=mesh.jax_mesh, in_specs=P("data"), out_specs=P("data"))
    w = w_cpu.detach().to(dev).requires_grad_()
    compiles, worst, shards = [], 0.0, None
    for _ in range(3):
        x = spmd.mark_sharding(x_cpu.to(dev), mesh, ("data", None))
        y = lazyxla.call_jax(shard_rows, lazyxla.call_jax(mlp, x, w))
        loss = y.square().sum()
        loss.backward()
        lazyxla.sync()
        compiles.append(lazyxla.metrics.counters().get("compiles", 0))
        shards = [s.data.shape for s in spmd.local_shards(y)]
        grad = w.grad.cpu()
        w.grad = None
    ref_w = w_cpu
    t = torch.tanh(x_cpu @ ref_w)
    ref = t / t.abs().sum(-1, keepdim=True)
    ref.square().sum().backward()
    worst = max(float((y.cpu() - ref).abs().max()), float((grad - ref_w.grad).abs().max()))
    arr = lazyxla.to_jax(x)  # the global array, still split by rows
    a = jax.device_put(jnp.arange(16.0, dtype=jnp.float32), jax.sharding.NamedSharding(mesh.jax_mesh, P("data")))
    t = lazyxla.from_jax(a)  # kept as it is laid out: no copy
    return {
        "worst": worst,
        "compiles": compiles,
        "shards": [tuple(s) for s in shards],
        "to_jax_spec": tuple(arr.sharding.spec),
        "to_jax_equal": bool((torch.from_numpy(np.asarray(arr).copy()) == x_cpu).all()),
        "from_jax_same": lazyxla.to_jax(t) is a,
        "from_jax_shards": [tuple(s.data.shape) for s in spmd.local_shards(t)],
        "from_jax_sum": (t * 2).sum().item(),
    }
