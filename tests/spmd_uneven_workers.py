"""What the uneven-layout SPMD tests run in fresh processes (8 fake CPU devices: 1 process x 8, or 2 x 4)."""

from __future__ import annotations

import torch

ROWS, COLS = 63, 5  # 63 rows over 8 devices: parts of 8 rows, the last one 7


def _host() -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)


def _rows(shards) -> list:
    return [(s.index[0].start, s.index[0].stop) for s in shards]


def uneven_layouts(rank: int) -> dict:
    """A tensor laid out over mesh axes that do not divide its rows: what each device holds, what the queries and
    the programs see, and the values through a program, a pending annotation and a reload of the parts."""
    import lazyxla
    import lazyxla.parallel.spmd
    from lazyxla.lazy.tensor import unwrap

    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    n = spmd.device_count()
    row = spmd.mesh((n,), ("x",))
    grid = spmd.mesh((2, n // 2), ("data", "model"))
    host = _host()
    out = {}
    w = spmd.mark_sharding(host.to(dev), row, ("x", None))
    out["spec"] = spmd.get_sharding(w)[1]
    out["annotated"] = lazyxla.parallel.spmd.is_annotated(w)
    # jax keeps buffers only in even layouts: each device holds every row of it
    out["buffer_rows"] = [s.data.shape[0] for s in unwrap(w)._value[0].payload.addressable_shards]
    shards = spmd.local_shards(w)
    out["rows"] = _rows(shards)
    out["padded"] = [list(s.padded_shape) for s in shards]
    out["parts_equal"] = all(torch.equal(s.data, host[s.index]) for s in shards)
    # a program constrains it to the uneven layout (XLA pads inside); the same step again compiles nothing
    y = (w * 2).sum(0)
    out["constraint"] = 'sharding_constraint %arg0 <@mesh_0, [{"x"}, {}]>' in lazyxla.debug.stablehlo_text([y])
    out["sum_equal"] = torch.equal(y.cpu(), (host * 2).sum(0))
    compiles = lazyxla.metrics.counters().get("compiles", 0)
    out["again_equal"] = torch.equal((w * 2).sum(0).cpu(), (host * 2).sum(0))
    out["again_compiles"] = lazyxla.metrics.counters().get("compiles", 0) - compiles
    # a pending value annotated unevenly (over two mesh axes) keeps its layout once computed
    z = w * 3
    spmd.mark_sharding(z, grid, (("data", "model"), None))
    lazyxla.sync()
    out["pending_spec"] = spmd.get_sharding(z)[1]
    out["pending_equal"] = torch.equal(z.cpu(), host * 3)
    # each process reloads its devices' parts: the padded parts are gathered into the even buffer
    spmd.load_local_shards(w, [-s.data for s in spmd.local_shards(w)])
    out["loaded_equal"] = torch.equal(w.cpu(), -host)
    out["loaded_spec"] = spmd.get_sharding(w)[1]
    # one row over every device: the first device holds it, the others padding only
    one = spmd.mark_sharding(torch.ones(1, COLS).to(dev), row, ("x", None))
    out["one_rows"] = _rows(spmd.local_shards(one))
    out["one_sum"] = (one * 4).sum().item()
    spmd.clear_sharding(w)
    out["cleared"] = spmd.get_sharding(w)
    return out
