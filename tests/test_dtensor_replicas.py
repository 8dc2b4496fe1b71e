"""PyTorch's device module, DeviceMesh and DTensor on lazyxla, against CPU eager.

Multi-process tests start real processes on 127.0.0.1 through ``lazyxla.spawn`` (bounded by its ``timeout_s``).
"""

from __future__ import annotations

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


def test_fsdp2_tiny_llama_over_two_replicas_trains_as_cpu_eager():
    pytest.importorskip("transformers", reason="the tiny Llama is transformers' LlamaForCausalLM")
    world = 2
    runs = lazyxla.spawn(W.fsdp_llama_replicas, nprocs=world, timeout_s=300)
    model, batches = W.tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    ref_losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss  # a mean over tokens: each rank has half, as many each
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_losses.append(loss.item())
    losses = torch.stack([torch.stack(run["losses"]) for run in runs]).mean(0)
    torch.testing.assert_close(losses, torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    for name, ref in model.named_parameters():
        got = torch.cat([run["params"][name] for run in runs])
        torch.testing.assert_close(got, ref.detach(), rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    for run in runs:
        for what, pairs in run["counts"].items():
            local, whole = map(sum, zip(*pairs))
            assert local * world == whole, (what, pairs)
        assert run["compiles"][1:] == [run["compiles"][1]] * 3, run["compiles"]
