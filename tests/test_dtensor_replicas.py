"""PyTorch's device module, DeviceMesh and DTensor on lazyxla, against CPU eager.

Multi-process tests start real processes on 127.0.0.1 through ``lazyxla.spawn`` (bounded by its ``timeout_s``).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import jax
import pytest
import replica_workers as W  # tests/ is on sys.path (pytest puts it there); the children import it by name
import torch
import torch.nn.functional as F

import lazyxla

MODULE = torch.get_device_module("lazyxla")


def test_streams_and_events_order_work_in_program_order():
    s, cur = MODULE.Stream(priority=-1), MODULE.current_stream()
    assert cur is MODULE.default_stream() and s.priority == -1 and s.device == lazyxla.device()
    s.wait_stream(cur)
    x = torch.arange(4.0).to(lazyxla.device())
    with MODULE.stream(s):
        assert MODULE.current_stream() is s
        y = x * 2  # recorded after x, whatever the stream
        e = s.record_event()
    assert MODULE.current_stream() is cur
    cur.wait_event(e)
    e.wait()
    assert e.query() and s.query() and e.stream is s
    torch.testing.assert_close(y.cpu(), torch.arange(4.0) * 2)
    with pytest.raises(TypeError, match="wait_event expects a torch.lazyxla.Event"):
        cur.wait_event(s)
    with pytest.raises(RuntimeError, match="has no device time"):
        e.elapsed_time(e)


def test_device_selection_and_memory_queries():
    MODULE.set_device(0)
    assert MODULE.current_device() == 0 and MODULE.device_count() == len(jax.local_devices()) >= 1
    with pytest.raises(ValueError, match="out of range"):
        MODULE.set_device(MODULE.device_count())
    before = MODULE.memory_allocated()
    x = torch.ones(1 << 16).to(lazyxla.device())
    lazyxla.sync()
    assert MODULE.memory_allocated() - before >= x.numel() * 4  # the live array is counted (or jax's stats)
    assert MODULE.max_memory_allocated() >= MODULE.memory_allocated() > 0
    assert MODULE.memory_reserved() >= MODULE.memory_allocated()
    free, total = MODULE.mem_get_info()
    assert 0 < free <= total
    MODULE.reset_peak_memory_stats()
    MODULE.empty_cache()
    assert MODULE.max_memory_allocated() == MODULE.memory_allocated()
    del x


_ONE_PROCESS = """
import os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
import torch, lazyxla, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
dist.init_process_group("lazyxla", rank=0, world_size=1)
mesh = init_device_mesh("lazyxla", (1,))
dev = lazyxla.device()
a, b = torch.randn(4, 3), torch.randn(3, 2)
got = (distribute_tensor(a.to(dev), mesh, [Shard(0)]) @ distribute_tensor(b.to(dev), mesh, [Replicate()])).full_tensor()
torch.testing.assert_close(got.cpu(), a @ b)
assert torch._is_functional_tensor(got) and mesh.get_group().group_name
dist.destroy_process_group()
print("ok")
"""


def test_device_mesh_and_dtensor_matmul_in_one_process():
    # init_device_mesh raised "ProcessGroup name not set"; the matmul of a Shard(0) and a Replicate() DTensor raised
    # a DeviceMismatch naming lazyxla:0 twice (DTensor's dispatch skipped the local tensors' functionalization)
    code = _ONE_PROCESS.format(port=29000 + (hash("dmod") % 1000))
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


def _cpu_reference(world: int) -> dict:
    a, b, ids, table = W.dtensor_problem()
    p = torch.full((2, 4), float(sum(range(1, world + 1))))
    return {
        "matmul": a @ b,
        "elementwise": a * 2 + a.sin(),
        "sum": a.sum(),
        "sum dim 0": a.sum(0),
        "shard->replicate": a,
        "partial->replicate": p,
        "embedding": F.embedding(ids, table),
    }


def test_dtensor_over_two_replicas_equals_cpu_eager():
    world = 2
    runs = lazyxla.spawn(W.dtensor_ops, nprocs=world, timeout_s=300)
    a, b, _, _ = W.dtensor_problem()
    want = _cpu_reference(world)
    for rank, run in enumerate(runs):
        assert run["mesh"] == [0, 1] and run["device_type"] == "lazyxla"
        for name, value in want.items():
            torch.testing.assert_close(run[name], value, msg=f"rank {rank} {name}")
        torch.testing.assert_close(run["A local"], a.chunk(world)[rank])
        torch.testing.assert_close(run["replicate->shard(1)"], b.chunk(world, 1)[rank])
        torch.testing.assert_close(run["partial->shard(0)"], want["partial->replicate"].chunk(world)[rank])
        torch.testing.assert_close(run["shard(0)->shard(1)"], a.chunk(world, 1)[rank])
        assert run["local types"] == ["Tensor"]  # local shards stay lazyxla's functionalization wrappers
        assert run["host exchanges"] == 0  # every redistribution ran as an in-graph collective
        assert run["compiles"] == [run["compiles"][0]] * 3, run["compiles"]  # nothing compiles after step 1


def test_dtensor_backward_over_two_replicas_equals_cpu_eager():
    # raised in sharding propagation of the sum's backward (aten.expand of a 0-d DTensor): FakeTensor could not adopt
    # the tensor detached by the subclass relay's Python kernel of aten::detach (lazy/subclass_relay.py)
    runs = lazyxla.spawn(W.dtensor_backward, nprocs=2, timeout_s=300)
    a, w, _, _ = W.dtensor_problem()
    w.requires_grad_()
    loss = (a @ w).sin().sum()
    loss.backward()
    for rank, run in enumerate(runs):
        torch.testing.assert_close(run["loss"], loss.detach(), msg=f"rank {rank} loss")
        torch.testing.assert_close(run["grad"], w.grad, msg=f"rank {rank} grad")
        assert run["compiles"][1] == run["compiles"][0], run["compiles"]  # step 2 reuses step 1's programs


def test_fsdp2_mlp_over_two_replicas_trains_as_cpu_eager():
    # fully_shard failed on replicas: FSDP2's copy ops (fsdp::split_with_sizes_copy writes its `out`) were refused
    # by functionalization, and its reshard resized a lazy storage to 0 (parallel/fsdp_ops.py)
    world = 2
    runs = lazyxla.spawn(W.fsdp_mlp, nprocs=world, timeout_s=300)
    model, batches = W.fsdp_problem()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    ref_losses = []
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_losses.append(loss.item())
    # each rank's loss is over its half of the batch: their mean is the whole batch's
    losses = torch.stack([torch.stack(run["losses"]) for run in runs]).mean(0)
    torch.testing.assert_close(losses, torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    for name, ref in model.named_parameters():
        got = torch.cat([run["params"][name] for run in runs])  # Shard(0) over the ranks, in rank order
        torch.testing.assert_close(got, ref.detach(), rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    for run in runs:
        for what, pairs in run["counts"].items():
            local, whole = map(sum, zip(*pairs))
            assert local * world == whole, (what, pairs)  # each rank holds 1/2 (every dim 0 here is even)
        assert run["compiles"][1:] == [run["compiles"][1]] * 3, run["compiles"]  # nothing compiles after step 2
        assert "FSDP2 freed this all-gather output" in run["freed read"], run["freed read"]


def _replicas_reference(model, batches, world: int, dtype: torch.dtype) -> tuple[torch.Tensor, dict]:
    """CPU eager of FSDP2 over ``world`` ranks (with ``MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=f32)``):
    fp32 parameters and AdamW; each rank's forward and backward on a ``dtype`` copy of them, on its rows of the
    batch; the gradients made fp32 and averaged over the ranks (FSDP2's reduce-scatter). Each step's per-rank losses
    (steps x ranks) and the final parameters."""
    low = copy.deepcopy(model).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    losses = []
    for ids in batches:
        with torch.no_grad():
            for lo, hi in zip(low.parameters(), model.parameters()):
                lo.copy_(hi)
        step = []
        for rows in ids.chunk(world):
            loss = low(input_ids=rows, labels=rows).loss
            loss.backward()
            step.append(loss.detach().float())
            for lo, hi in zip(low.parameters(), model.parameters()):
                g = lo.grad.float() / world
                hi.grad = g if hi.grad is None else hi.grad + g
                lo.grad = None
        opt.step()
        opt.zero_grad()
        losses.append(torch.stack(step))
    return torch.stack(losses), {k: p.detach() for k, p in model.named_parameters()}


@pytest.mark.parametrize(
    "world, bf16_params", [(2, True), (4, False)], ids=["2-replicas-bf16-params", "4-replicas-f32"]
)
def test_fsdp2_tiny_llama_over_replicas_trains_as_cpu_eager(world, bf16_params):
    # (4 replicas: each holds 1/4; bf16: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32), FSDP2's casts
    # and fp32 reduce-scatter recorded in the step)
    pytest.importorskip("transformers", reason="the tiny Llama is transformers' LlamaForCausalLM")
    runs = lazyxla.spawn(W.fsdp_llama_replicas, args=(bf16_params,), nprocs=world, timeout_s=420)
    model, batches = W.tiny_llama()
    dtype = torch.bfloat16 if bf16_params else torch.float32
    ref_losses, ref_params = _replicas_reference(model, batches, world, dtype)
    losses = torch.stack([torch.stack(run["losses"]) for run in runs], 1)  # steps x ranks
    if bf16_params:
        # bf16 steps round differently on XLA and on the CPU: the losses to bf16's precision; AdamW moves a
        # parameter by at most lr (1e-2) a step, so one whose gradient's sign differs ends up at most 4e-2 away
        loss_tol, param_tol = {"rtol": 1e-2, "atol": 1e-2}, {"rtol": 0, "atol": 4e-2}
    else:
        loss_tol = {"rtol": 1e-4, "atol": 1e-5}
        # Parameters to 1e-4 (1% of one AdamW step of lr 1e-2; a wrong gradient moves them by ~lr): measured on 4
        # replicas, the first step's gradients agree to 1e-10, yet AdamW divides tiny gradients by their own size
        # plus eps, which turns 1e-10 into 2e-6 of parameter, and an element whose later gradient nearly cancels
        # (1.6e-6, from terms of 5e-5) ends up 1.7e-5 or 3.2e-5 away, a different one from run to run
        param_tol = {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(losses, ref_losses, **loss_tol)
    for name, ref in ref_params.items():
        got = torch.cat([run["params"][name] for run in runs])  # Shard(0) over the ranks, in rank order
        torch.testing.assert_close(got, ref, **param_tol, msg=lambda m, n=name: f"{n}: {m}")
    for run in runs:
        assert run["param dtypes"] == ["torch.float32"]  # the sharded (master) parameters stay fp32
        assert run["dtype"] == ("torch.bfloat16" if bf16_params else "torch.float32")  # what the forward computed in
        for what, pairs in run["counts"].items():
            local, whole = map(sum, zip(*pairs))
            assert local * world == whole, (what, pairs)  # each rank holds 1/world
        assert run["compiles"][1:] == [run["compiles"][1]] * 3, run["compiles"]  # nothing compiles after step 2
        assert run["programs"][1:] == [run["programs"][1]] * 3, run["programs"]


def _recipe_reference(recipe: dict, world: int) -> tuple[torch.Tensor, list, dict]:
    """CPU eager of an FSDP2 recipe over ``world`` ranks: per micro-batch each rank's rows of it through the model,
    the gradients averaged over the ranks (FSDP2's reduce-scatter, at the last micro-batch or at each: the sum is
    the same), then the recipe's clipping and AdamW (foreach: fused and capturable compute the same step). Each
    step's per-rank losses (steps x ranks), gradient norms and the final parameters."""
    from dtensor_spmd_workers import _llama_loss

    model, batches = W.recipe_problem(recipe)
    opt = torch.optim.AdamW(model.parameters(), lr=W.RECIPE_LR, foreach=True)
    micro, losses, norms = recipe["micro"], [], []
    for ids in batches:
        if recipe["zero_first"]:
            opt.zero_grad()
        step = torch.zeros(world)
        for r, rows in enumerate(ids.chunk(world)):
            for part in rows.chunk(micro):
                loss = _llama_loss(model, part) / micro
                (loss / world).backward()
                step[r] += loss.detach()
        clip = recipe["clip"]
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip) if clip else None)
        opt.step()
        if not recipe["zero_first"]:
            opt.zero_grad()
        losses.append(step)
    return torch.stack(losses), norms, {k: p.detach() for k, p in model.named_parameters()}


def test_fsdp2_recipes_over_two_replicas_train_as_cpu_eager():
    # FSDP2 recipes (see W.REPLICA_RECIPES) in one spawn: checkpoint_wrapper + fused AdamW + no-sync micro-batch +
    # clip_grad_norm_ (zero_grad first); torch.utils.checkpoint + capturable AdamW + plain accumulation (zero_grad
    # last). Fused and capturable AdamW raised functionalization's "mutating a non-functional tensor with a
    # functional tensor": their plain device step counters beside DTensor states (parallel/fsdp_ops.py), then the
    # in-place fused step DTensor runs on its local tensors, relayed below lazyxla's kernel (lazy/subclass_relay.py)
    world, names = 2, list(W.REPLICA_RECIPES)
    runs = lazyxla.spawn(W.fsdp_recipes_replicas, args=(names,), nprocs=world, timeout_s=480)
    for name in names:
        recipe = W.REPLICA_RECIPES[name]
        ref_losses, ref_norms, ref_params = _recipe_reference(recipe, world)
        got = [run[name] for run in runs]
        losses = torch.stack([torch.stack(g["losses"]) for g in got], 1)  # steps x ranks
        torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        for g in got:
            if recipe["clip"]:
                torch.testing.assert_close(torch.stack(g["norms"]), torch.stack(ref_norms), rtol=1e-4, atol=1e-5)
            assert g["compiles"][2:] == [0] * 2, (name, g["compiles"])  # nothing compiles after step 2
            assert g["programs"][1:] == [g["programs"][1]] * 3, (name, g["programs"])
            assert g["steps"] == ["DTensor"], (name, g["steps"])  # the device step counters are DTensors
            assert g["forwards"] == 4 * 2 * 2 * 2, (name, g["forwards"])  # steps x micro x blocks, each run twice
            for what, pairs in g["counts"].items():
                local, whole = map(sum, zip(*pairs))
                assert local * world == whole, (name, what, pairs)  # each rank holds 1/2
        for pname, ref in ref_params.items():
            value = torch.cat([g["params"][pname] for g in got])  # Shard(0) over the ranks, in rank order
            torch.testing.assert_close(value, ref, rtol=1e-4, atol=1e-5, msg=lambda m, n=f"{name} {pname}": f"{n}: {m}")
