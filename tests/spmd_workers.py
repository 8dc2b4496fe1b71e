"""Functions the SPMD tests run in fresh processes (8 fake CPU devices: 1 process x 8, or 2 x 4)."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

BATCH, SEQ, VOCAB = 8, 16, 64


def _loss(out, t):
    return F.cross_entropy(out.flatten(0, 1), t.flatten(), label_smoothing=0.1)


def _annotate(model, mesh, mode: str) -> dict:
    """Shard ``model`` for ``mode``; returns {parameter name: mesh axis it is split over}."""
    import lazyxla

    spmd = lazyxla.spmd
    if mode == "fsdp":
        spmd.fsdp(model, mesh, axis="fsdp")
        return {name: "fsdp" for name, p in model.named_parameters()}
    split = {}
    with torch.no_grad():
        for i, blk in enumerate(model.blocks):  # Megatron-style: column-parallel in, row-parallel out
            for layer, spec in (
                (blk.qkv.weight, ("model", None)),
                (blk.fc1.weight, ("model", None)),
                (blk.fc1.bias, ("model",)),
                (blk.proj.weight, (None, "model")),
                (blk.fc2.weight, (None, "model")),
            ):
                spmd.mark_sharding(layer, mesh, spec)
            for name in ("qkv.weight", "fc1.weight", "fc1.bias", "proj.weight", "fc2.weight"):
                split[f"blocks.{i}.{name}"] = "model"
    return split


def gpt_spmd(rank: int, mode: str, steps: int = 5) -> dict:
    """Train the GPT-style test model sharded (``mode`` 'fsdp' or '2d') and on the CPU; compare."""
    import lazyxla
    from lazyxla.lazy.tensor import unwrap
    from tests.models import GPT

    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    mesh = spmd.mesh((-1,), ("fsdp",)) if mode == "fsdp" else spmd.mesh((2, -1), ("data", "model"))
    batch_axis = "fsdp" if mode == "fsdp" else "data"
    torch.manual_seed(0)
    ref = GPT()
    model = copy.deepcopy(ref).to(dev)
    split = _annotate(model, mesh, mode)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    procs = lazyxla.runtime.process_count()
    part = slice(rank * BATCH // procs, (rank + 1) * BATCH // procs)
    loader = lazyxla.DeviceLoader([(x[part], y[part])] * steps, dev, input_sharding=(mesh, (batch_axis, None)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    compiles, losses, ref_losses, text = [], [], [], ""
    for step, (xb, yb) in enumerate(loader):
        loss = _loss(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 0:
            text = lazyxla.debug.stablehlo_text([loss, *model.parameters()])
        losses.append(loss)  # read after the loop: a read here would split the step into two programs
        compiles.append(lazyxla.metrics.counters()["compiles"])  # (the loader's next() syncs the step)
        ref_loss = _loss(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(ref_loss.item())
    compiles.append(lazyxla.metrics.counters()["compiles"])  # after the last step's sync
    losses = [loss.item() for loss in losses]
    # assert_close's rule with rtol 1e-4, as the single-device training tests: |a - b| - 1e-4 |b| <= atol
    diff = max(
        ((p.cpu() - r.detach()).abs() - 1e-4 * r.detach().abs()).max().item()
        for p, r in zip(model.parameters(), ref.parameters())
    )
    fractions = {}
    for name, p in model.named_parameters():
        shards = unwrap(p)._value[0].payload.addressable_shards
        fractions[name] = [s.data.size / p.numel() for s in shards]
    specs = {name: lazyxla.spmd.get_sharding(p) for name, p in model.named_parameters()}
    return {
        "diff": diff,
        "losses": losses,
        "ref_losses": ref_losses,
        "compiles": compiles,
        "fractions": fractions,
        "split": split,
        "axis_size": mesh.axis_size("fsdp" if mode == "fsdp" else "model"),
        "specs": {k: (None if v is None else v[1]) for k, v in specs.items()},
        "text_has_shardings": f'{{"{"fsdp" if mode == "fsdp" else "model"}"}}' in text,
        "devices": lazyxla.spmd.device_count(),
    }


def sharding_errors(rank: int) -> dict:
    """Each bad annotation raises at the call: the messages, by case (None: accepted)."""
    import lazyxla

    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    mesh = spmd.mesh((2, 4), ("data", "model"))
    t = torch.zeros(8, 6).to(dev)
    cases = {
        "rank": (t, ("data",)),
        "unknown": (t, ("data", "nope")),
        "twice": (t, ("model", "model")),
        "divisible": (t, (None, "model")),
        "tuple_divisible": (torch.zeros(4, 6).to(dev), (("data", "model"), None)),
    }
    out = {}
    for name, (x, spec) in cases.items():
        try:
            spmd.mark_sharding(x, mesh, spec)
            out[name] = None
        except spmd.ShardingError as e:
            out[name] = str(e)
    try:
        spmd.Mesh(range(8), (3, 3), ("a", "b"))
    except spmd.ShardingError as e:
        out["mesh"] = str(e)
    ok = spmd.mark_sharding(torch.zeros(8, 8).to(dev), mesh, (("data", "model"), None))
    out["tuple_ok"] = spmd.get_sharding(ok)[1]
    pending = torch.ones(8, 4).to(dev) * 3
    spmd.mark_sharding(pending, mesh, ("model", None))
    out["pending_spec"] = spmd.get_sharding(pending)[1]
    out["constraint_in_program"] = "sharding_constraint" in lazyxla.debug.stablehlo_text([pending])
    out["pending_value"] = pending.sum().item()
    spmd.clear_sharding(pending)
    out["cleared"] = spmd.get_sharding(pending)
    return out


def meshes(rank: int) -> dict:
    """The meshes lazyxla builds over the run's devices: which process each mesh position belongs to."""
    import jax

    import lazyxla

    spmd = lazyxla.spmd
    spmd.enable()
    owner = {d.id: d.process_index for d in jax.devices()}

    def processes(m):
        return np.vectorize(lambda d: owner[d.id])(m.jax_mesh.devices).tolist()

    hybrid = spmd.hybrid_mesh((1, 4), (2, 1), ("data", "model"))
    flat = spmd.mesh((2, -1), ("data", "model"))
    out = {"hybrid": processes(hybrid), "hybrid_shape": hybrid.mesh_shape, "flat": processes(flat)}
    try:
        spmd.hybrid_mesh((1, 8), (1, 1), ("a", "b"))
    except spmd.ShardingError as e:
        out["bad_hybrid"] = str(e)
    return out


def gpt_spmd_cached(rank: int, cache_dir: str, mode: str) -> dict:
    """``gpt_spmd`` (3 steps) with the persistent cache on in ``cache_dir``; adds the disk cache counters."""
    import lazyxla

    lazyxla.config.persistent_cache = True
    lazyxla.config.cache_dir = cache_dir
    out = gpt_spmd(rank, mode, steps=3)
    counters = lazyxla.metrics.counters()
    out.update(hits=counters["persistent_cache_hits"], misses=counters["persistent_cache_misses"])
    return out


def master_only_read(rank: int) -> dict:
    """Rank 0 reads a value mid-step that rank 1 does not: both must raise a clear error, not hang or abort."""
    import lazyxla
    from lazyxla.device.processes import DistributedError

    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    mesh = spmd.mesh((-1,), ("data",))
    w = spmd.mark_sharding(torch.ones(8, 8).to(dev), mesh, ("data", None))
    agreed = (w * 2).sum().item()  # every process reads: the same program, it runs
    y = (w @ w).sum()
    z = (w + 1).sum()  # also pending: rank 1's sync computes y and z, rank 0's read y alone
    try:
        if rank == 0:
            y.item()  # master-only read
        lazyxla.sync()
    except DistributedError as e:
        return {"agreed": agreed, "error": str(e)}
    return {"agreed": agreed, "error": None, "z": z.item()}


DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")


def _host_value(dtype: torch.dtype, shape=(BATCH, SEQ), seed: int = 3) -> torch.Tensor:
    """The same CPU tensor of ``dtype`` in every process (ints in [0, 128): token ids for the embedding)."""
    g = torch.Generator().manual_seed(seed)
    ints = torch.randint(0, 128, shape, generator=g)
    if dtype == torch.bool:
        return ints % 3 == 0
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    return ints.to(dtype)


def _uses(t: torch.Tensor, emb: torch.nn.Module) -> list[torch.Tensor]:
    """Programs reading ``t`` (sharded over the batch): data movement across shards, a reduction, and for
    index dtypes the token-id embedding that crashed the process (int64 ids sharded on the batch)."""
    out = [t.flip(0), t.sum(dim=1), (t == t.flip(1)).sum()]
    if t.dtype in (torch.int64, torch.int32):
        out.append(emb(t).sum(dim=(1, 2)))
    return out


class _Toy(torch.nn.Module):
    """A model of one dtype for ``spmd.fsdp``: a trainable linear layer for floats, a lookup table (a frozen
    parameter) for integers and bool."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        if dtype.is_floating_point:
            self.lin = torch.nn.Linear(SEQ, BATCH, dtype=dtype)
        else:
            self.table = torch.nn.Parameter(_host_value(dtype, seed=4), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dtype.is_floating_point:
            return self.lin(x).float().pow(2).mean()
        return self.table[x.long() % BATCH].long().sum(dim=1)


def _fsdp_run(dtype: torch.dtype, dev, mesh) -> tuple[list, list]:
    """Two steps of the toy model sharded with ``spmd.fsdp`` (SGD for floats) and on the CPU: outputs, params."""
    import lazyxla

    torch.manual_seed(5)
    ref = _Toy(dtype)
    model = copy.deepcopy(ref).to(dev)
    lazyxla.spmd.fsdp(model, mesh, axis="data")
    x = _host_value(dtype if dtype.is_floating_point else torch.int64, seed=6)
    got, want = [], []
    for m, inp in ((model, x.to(dev)), (ref, x)):
        opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad] or [torch.zeros(1)], lr=0.1)
        outs = []
        for _ in range(2):
            out = m(inp)
            if out.requires_grad:
                out.backward()
                opt.step()
                opt.zero_grad()
            outs.append(out.detach())
        (got if m is model else want).append([o.cpu() for o in outs] + [p.detach().cpu() for p in m.parameters()])
    return got[0], want[0]


def dtype_layouts(rank: int) -> dict:
    """Every dtype sharded over the batch, as transferred data, computed data (a program's output, and a
    pending value) and an fsdp model, compared with the CPU: {case: max abs difference or an error}."""
    import lazyxla
    from lazyxla.parallel.spmd import from_local

    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    mesh = spmd.mesh((-1,), ("data",))
    procs = lazyxla.runtime.process_count()
    part = slice(rank * BATCH // procs, (rank + 1) * BATCH // procs)
    torch.manual_seed(0)
    emb_ref = torch.nn.Embedding(128, 4)
    emb = copy.deepcopy(emb_ref).to(dev)
    spec = ("data", None)
    results = {}
    for name in DTYPES:
        dtype = getattr(torch, name)
        host = _host_value(dtype)
        want = _uses(host, emb_ref)
        transferred = spmd.mark_sharding(host.to(dev), mesh, spec)
        local = from_local(host[part], mesh, spec)  # DeviceLoader(input_sharding=...)'s transfer
        computed = host.to(dev).flip(0).flip(0)  # a program's output (its layout chosen by XLA)
        lazyxla.sync()
        spmd.mark_sharding(computed, mesh, spec)
        pending = spmd.mark_sharding(host.to(dev).flip(0).flip(0), mesh, spec)  # a constraint in the program
        for case, t in (
            ("transferred", transferred),
            ("from_local", local),
            ("computed", computed),
            ("pending", pending),
        ):
            got = [g.cpu() for g in _uses(t, emb)]
            results[f"{name}/{case}"] = _difference(got + [t.cpu()], want + [host])
        got, ref = _fsdp_run(dtype, dev, mesh)
        results[f"{name}/fsdp"] = _difference(got, ref)
    return results


def _difference(got: list, want: list) -> float | str:
    """The largest |got - want| / (1 + |want|) over floating tensors; a string saying what differs when shapes,
    dtypes or integer/bool values are not equal."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"got {g.dtype}{list(g.shape)}, want {w.dtype}{list(w.shape)}"
        if not g.dtype.is_floating_point and not torch.equal(g, w):
            return f"{g.dtype} values differ: got {g.flatten()[:8].tolist()}, want {w.flatten()[:8].tolist()}"
        g64, w64 = g.double(), w.double()
        worst = max(worst, ((g64 - w64).abs() / (1 + w64.abs())).max().item() if g.numel() else 0.0)
    return worst


def forced_mismatch(rank: int) -> dict:
    """An int64 tensor whose sharded buffers were narrowed to int32 by a relayout outside 64-bit mode (the
    jax behaviour behind the SPMD crash): the program must raise a Python error naming it, not abort."""
    import jax

    import lazyxla
    from lazyxla.lazy.tensor import unwrap

    spmd = lazyxla.spmd
    spmd.enable()
    # ids is small: the host would know its value and compute (ids * 2).sum() itself (lazy/known.py); the
    # device's program, with the corrupted buffer, is what this checks
    lazyxla.config.known_values_limit = 0
    dev = lazyxla.device()
    mesh = spmd.mesh((-1,), ("data",))
    ids = torch.arange(BATCH * SEQ).reshape(BATCH, SEQ).to(dev)
    node = unwrap(ids)._value[0]
    node.payload = jax.device_put(node.payload, mesh.sharding(("data", None)))  # not in x64: s32 buffers
    narrowed = sorted({str(b.dtype) for b in node.payload._arrays})
    try:
        (ids * 2).sum().item()
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    with jax.enable_x64(True):  # a correct buffer again: the tensor still works
        node.payload = jax.device_put(np.arange(BATCH * SEQ).reshape(BATCH, SEQ), mesh.sharding(("data", None)))
    return {"narrowed": narrowed, "dtype": str(node.payload.dtype), "error": error, "after": (ids * 2).sum().item()}


def kept_intermediates(rank: int) -> dict:
    """2-D GPT steps while the user keeps every attention output alive: XLA lays those outputs out split over
    both mesh axes, which jax could not name on the 1-D mesh of the program's first (replicated) argument."""
    import lazyxla
    from tests.models import GPT

    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    mesh = spmd.mesh((2, -1), ("data", "model"))
    torch.manual_seed(0)
    ref = GPT()
    model = copy.deepcopy(ref).to(dev)
    _annotate(model, mesh, "2d")
    kept: list = []
    sdpa = F.scaled_dot_product_attention

    def keeping(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        kept.append(out)
        return out

    F.scaled_dot_product_attention = keeping
    try:
        x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        xd = x.to(dev)
        spmd.mark_sharding(xd, mesh, ("data", None))
        loss = _loss(model(xd), xd)
        lazyxla.sync()
        got = [t.cpu() for t in kept]
        kept.clear()
        _loss(ref(x), x)
        want = [t.detach() for t in kept]
    finally:
        F.scaled_dot_product_attention = sdpa
    diff = max((g - w).abs().max().item() for g, w in zip(got, want))
    return {"kept": len(got), "diff": diff, "loss": loss.item()}
