"""Functions the distributed checkpoint tests (tests/test_dcp.py) run in fresh processes: FSDP2 models saved and loaded
with ``torch.distributed.checkpoint`` in SPMD mode (one process, fake CPU devices) and over replicas."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch

from tests.dtensor_spmd_workers import _tiny_llama

LR = 1e-2


def tiny_llama():
    """A tiny random transformers LlamaForCausalLM (nothing downloaded) on the CPU, and 4 batches of token ids."""
    model = _tiny_llama()
    g = torch.Generator().manual_seed(1)
    return model, [torch.randint(0, 64, (8, 16), generator=g) for _ in range(4)]


def mlp():
    """A tiny MLP (its initial state) and 4 batches of (input, target)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8)
    )
    g = torch.Generator().manual_seed(1)
    return model, [(torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)) for _ in range(4)]


def llama_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def mlp_loss(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def train(model, opt, loss_fn, batches) -> list[float]:
    """AdamW steps over ``batches``; the losses, read after each step."""
    losses = []
    for batch in batches:
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return [float(v.cpu().item()) for v in losses]


def cpu_state(model, opt) -> dict:
    """The model's parameters and the optimizer's state as whole CPU tensors (DTensors gathered), by their key in a
    DCP checkpoint of ``{"model": ..., "optim": ...}`` (DCP flattens nested dicts so)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    def whole(v):
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        return v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v

    msd, osd = get_state_dict(model, opt)
    out = {f"model.{k}": whole(v) for k, v in msd.items()}
    for fqn, state in osd["state"].items():
        out.update({f"optim.state.{fqn}.{k}": whole(v) for k, v in state.items()})
    return out


def _fsdp(model, mesh, blocks) -> None:
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _llama_blocks(model):
    return list(model.model.layers)


def _mlp_blocks(model):
    return [m for m in model if isinstance(m, torch.nn.Linear)]


def _fresh(problem: str, dev, mesh):
    """The problem's model on ``dev`` with other initial values (a checkpoint must replace them), FSDP2 over
    ``mesh``, its AdamW, loss function and batches."""
    model, batches = tiny_llama() if problem == "llama" else mlp()
    model.to(dev)
    _fsdp(model, mesh, _llama_blocks(model) if problem == "llama" else _mlp_blocks(model))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
    return model, opt, llama_loss if problem == "llama" else mlp_loss, batches


def _perturb(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)


def _on_device(batch, dev):
    return tuple(t.to(dev) for t in batch) if isinstance(batch, tuple) else batch.to(dev)


def spmd_save(rank: int, problem: str, folder: str, devices: int) -> dict:
    """SPMD mode: FSDP2 (per block and root) on a (devices,) mesh, 2 AdamW steps, ``dcp.save`` of
    ``get_state_dict(model, opt)``; the saved state (whole, on the CPU), the losses and what the checkpoint holds."""
    import lazyxla

    lazyxla.spmd.enable()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    dev = lazyxla.device()
    model, opt, loss_fn, batches = _fresh(problem, dev, init_device_mesh("lazyxla", (devices,)))
    losses = train(model, opt, loss_fn, [_on_device(b, dev) for b in batches[:2]])
    msd, osd = get_state_dict(model, opt)
    metadata = dcp.save({"model": msd, "optim": osd}, checkpoint_id=folder)
    chunks = {
        k: [(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks]
        for k, md in metadata.state_dict_metadata.items()
        if hasattr(md, "chunks")
    }
    return {"losses": losses, "state": cpu_state(model, opt), "chunks": chunks, "files": sorted(os.listdir(folder))}


def spmd_resume(rank: int, problem: str, folder: str, devices: int) -> dict:
    """SPMD mode: a fresh FSDP2 model on a (devices,) mesh loads the checkpoint in ``folder`` (``dcp.load`` into
    ``get_state_dict``'s dicts, then ``set_state_dict``), then trains the last 2 steps; the loaded state, the losses,
    the final state and compiles per step."""
    import lazyxla

    lazyxla.spmd.enable()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    dev = lazyxla.device()
    model, opt, loss_fn, batches = _fresh(problem, dev, init_device_mesh("lazyxla", (devices,)))
    _perturb(model)
    msd, osd = get_state_dict(model, opt)  # (makes the optimizer's state, as PyTorch's resume does)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=folder)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    loaded = cpu_state(model, opt)
    layouts = {n: lazyxla.spmd.get_sharding(p._local_tensor) for n, p in model.named_parameters()}
    compiles = []
    losses = []
    for batch in batches[2:]:
        losses += train(model, opt, loss_fn, [_on_device(batch, dev)])
        compiles.append(lazyxla.metrics.counters()["compiles"])
    return {
        "loaded": loaded,
        "losses": losses,
        "final": cpu_state(model, opt),
        "compiles": compiles,
        "sharded": {n: v is not None and v[1][0] is not None for n, v in layouts.items()},
    }


# --- replicas ----------------------------------------------------------------------------------------------------


def _replica_batch(batch, rank: int, n: int, dev):
    return tuple(t.chunk(n)[rank].to(dev) for t in batch)


def local_state(model, opt) -> dict:
    """``cpu_state``'s keys, each this rank's part (a DTensor's local shard; other tensors whole), on the CPU."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    def mine(v):
        v = v.to_local() if hasattr(v, "to_local") else v
        return v.detach().cpu().clone()

    msd, osd = get_state_dict(model, opt)
    out = {f"model.{k}": mine(v) for k, v in msd.items()}
    for fqn, state in osd["state"].items():
        out.update({f"optim.state.{fqn}.{k}": mine(v) for k, v in state.items()})
    return out


def replica_save(rank: int, folder: str, steps: int, die_rank: int = -1, pids: str = "", how: str = "SIGKILL") -> dict:
    """Replicas: FSDP2 over ``init_process_group("lazyxla")``'s ranks, ``steps`` AdamW steps (each rank on its rows
    of the batch), ``dcp.save`` with ``AtomicFileSystemWriter``; this rank's losses and part of the saved state.
    Rank ``die_rank`` sends itself ``how`` (SIGKILL, SIGSTOP) once it has written its first data file; with ``pids``
    (a folder) each rank writes its process id there first (``rank<i>``), so a test can check that none is left."""
    if pids:
        Path(pids, f"rank{rank}").write_text(str(os.getpid()))
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    import lazyxla
    from lazyxla.parallel.atomic_checkpoint import AtomicFileSystemWriter

    dist.init_process_group("lazyxla")
    n = dist.get_world_size()
    dev = lazyxla.device()
    model, opt, loss_fn, batches = _fresh("mlp", dev, init_device_mesh("lazyxla", (n,)))
    losses = train(model, opt, loss_fn, [_replica_batch(b, rank, n, dev) for b in batches[:steps]])
    msd, osd = get_state_dict(model, opt)
    if rank == die_rank:
        _die_after_first_file(signal.Signals[how])
    dcp.save({"model": msd, "optim": osd}, storage_writer=AtomicFileSystemWriter(folder))
    state = local_state(model, opt)
    dist.destroy_process_group()
    return {"losses": losses, "state": state}


def replica_load(rank: int, folder: str) -> dict:
    """Replicas: a fresh FSDP2 model (other values) loads the checkpoint in ``folder`` at this world size
    (``dcp.load`` into ``get_state_dict``'s dicts, then ``set_state_dict``); this rank's part of the loaded state."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    import lazyxla

    dist.init_process_group("lazyxla")
    n = dist.get_world_size()
    model, opt, _, _ = _fresh("mlp", lazyxla.device(), init_device_mesh("lazyxla", (n,)))
    _perturb(model)
    msd, osd = get_state_dict(model, opt)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=folder)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    state = local_state(model, opt)
    dist.destroy_process_group()
    return {"state": state}


def _die_after_first_file(how: signal.Signals = signal.SIGKILL) -> None:
    """Make this process SIGKILL itself (or stop, with ``how=SIGSTOP``: a hung rank) right after DCP's writer has
    written (and synced) its first data file."""
    from torch.distributed.checkpoint import filesystem

    original = filesystem._write_files_from_queue

    def write_then_die(*args, **kwargs):
        original(*args, **kwargs)
        os.kill(os.getpid(), how)

    filesystem._write_files_from_queue = write_then_die


def spmd_save_with(rank: int, folder: str, atomic: bool, die: bool) -> dict:
    """SPMD mode, the MLP on 8 devices: 2 AdamW steps and a save into ``folder`` with ``AtomicFileSystemWriter``
    (``atomic``) or PyTorch's ``FileSystemWriter``; with ``die``, other values (perturbed, one step) and the process
    SIGKILLs itself once the writer has written its first data file. The saved state, whole on the CPU."""
    import lazyxla

    lazyxla.spmd.enable()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from lazyxla.parallel.atomic_checkpoint import AtomicFileSystemWriter

    dev = lazyxla.device()
    model, opt, loss_fn, batches = _fresh("mlp", dev, init_device_mesh("lazyxla", (8,)))
    if die:
        _perturb(model)
    train(model, opt, loss_fn, [_on_device(b, dev) for b in batches[: 1 if die else 2]])
    msd, osd = get_state_dict(model, opt)
    writer = (AtomicFileSystemWriter if atomic else dcp.FileSystemWriter)(folder)
    if die:
        _die_after_first_file()
    dcp.save({"model": msd, "optim": osd}, storage_writer=writer)
    return {"state": cpu_state(model, opt)}


def cpu_load(problem: str, folder: str, no_dist: bool = True):
    """A plain CPU model and AdamW of ``problem`` (other initial values) loaded from the checkpoint in ``folder``
    with DCP in this process (no process group); the model, optimizer and loaded state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, _ = tiny_llama() if problem == "llama" else mlp()
    _perturb(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
    msd, osd = get_state_dict(model, opt)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=folder, no_dist=no_dist)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    return model, opt, cpu_state(model, opt)


# --- what the FSDP2 recipes hold: fused / capturable AdamW (DTensor step counters), bf16 compute, int64 buffers ----

RECIPES = {
    # AdamW fused=True: its step counters are replicated DTensors in SPMD mode; an int64 buffer counts the steps
    "a": {"optim": {"fused": True}, "mixed": False},
    # AdamW capturable=True (DTensor step counters too) over bf16 compute with fp32 reductions
    "b": {"optim": {"capturable": True, "foreach": True}, "mixed": True},
}


def counted_mlp():
    """``mlp()`` with int64 buffers: ``seen`` (steps taken, a 0-d counter) and ``ids`` (constant), and its batches."""
    model, batches = mlp()
    model.register_buffer("seen", torch.zeros((), dtype=torch.int64))
    model.register_buffer("ids", torch.arange(6, dtype=torch.int64) * 3)
    return model, batches


def counted_train(model, opt, batches, dev=None) -> list[float]:
    """``train`` of the MLP (output compared in fp32) that also counts its steps in ``model.seen``."""
    losses = []
    for x, y in batches:
        x, y = (x, y) if dev is None else (x.to(dev), y.to(dev))
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        model.seen.add_(1)
        losses.append(loss.detach())
    return [float(v.cpu().item()) for v in losses]


def _recipe_models(dev, mesh, perturb: bool) -> dict:
    """Each of ``RECIPES``' models on ``dev``, FSDP2 (per Linear and root) over ``mesh``, with its AdamW."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    out = {}
    for name, recipe in RECIPES.items():
        model, _ = counted_mlp()
        if perturb:
            _perturb(model)
        model.to(dev)
        policy = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if recipe["mixed"] else MixedPrecisionPolicy()
        for block in [*_mlp_blocks(model), model]:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        out[name] = (model, torch.optim.AdamW(model.parameters(), lr=LR, **recipe["optim"]))
    return out


def _recipe_state(models) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state = {name: dict(zip(("model", "optim"), get_state_dict(m, o))) for name, (m, o) in models.items()}
    return {**state, "epoch": 0}


def spmd_recipes_save(rank: int, folder: str) -> dict:
    """SPMD mode, 8 devices: ``RECIPES``' models trained 2 steps and saved in one checkpoint with a Python int
    ``epoch`` (2); then 2 more steps (the uninterrupted run). Per model: the saved state (whole, on the CPU), the
    types of its optimizer's step counters and of its buffers, the parameters' dtypes, and the 2 later losses and
    final state."""
    import lazyxla

    lazyxla.spmd.enable()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    dev = lazyxla.device()
    models = _recipe_models(dev, init_device_mesh("lazyxla", (8,)), perturb=False)
    _, batches = mlp()
    out: dict = {}
    for model, opt in models.values():
        counted_train(model, opt, batches[:2], dev)
    state = _recipe_state(models)
    state["epoch"] = 2
    dcp.save(state, checkpoint_id=folder)
    for name, (model, opt) in models.items():
        out[name] = {
            "saved": cpu_state(model, opt),
            "step_types": sorted({type(s["step"]).__name__ for s in state[name]["optim"]["state"].values()}),
            "buffer_types": {k: type(state[name]["model"][k]).__name__ for k in ("seen", "ids")},
            "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        }
        out[name]["losses"] = counted_train(model, opt, batches[2:], dev)
        out[name]["final"] = cpu_state(model, opt)
    return out


def spmd_recipes_resume(rank: int, folder: str) -> dict:
    """SPMD mode, 4 devices: ``RECIPES``' models (other values) load the checkpoint and train its last 2 steps; per
    model the loaded state, losses and final state, and the loaded ``epoch``."""
    import lazyxla

    lazyxla.spmd.enable()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    dev = lazyxla.device()
    models = _recipe_models(dev, init_device_mesh("lazyxla", (4,)), perturb=True)
    state = _recipe_state(models)  # (makes the optimizers' state, as PyTorch's resume does)
    dcp.load(state, checkpoint_id=folder)
    _, batches = mlp()
    out: dict = {"epoch": state["epoch"]}
    for name, (model, opt) in models.items():
        set_state_dict(model, opt, model_state_dict=state[name]["model"], optim_state_dict=state[name]["optim"])
        loaded = cpu_state(model, opt)
        out[name] = {"loaded": loaded, "losses": counted_train(model, opt, batches[2:], dev)}
        out[name]["final"] = cpu_state(model, opt)
    return out
