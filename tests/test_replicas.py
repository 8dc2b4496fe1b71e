"""Replicas across processes: collectives in the graph, the runtime, spawn's fail-fast supervision.

Multi-process tests start real processes on 127.0.0.1 through ``lazyxla.spawn`` (bounded by its
``timeout_s``; every child is stopped and reaped before it returns or raises).
"""

from __future__ import annotations

import os
import time

import pytest
import replica_workers as W  # tests/ is on sys.path (pytest puts it there); the children import it by name
import torch

import lazyxla
from lazyxla import ReduceOp


@pytest.mark.parametrize("nprocs,groups", [(2, [[1], [0]]), (4, [[0, 1], [2, 3]])])
def test_collectives_equal_numpy(nprocs, groups):
    bad = lazyxla.spawn(W.check_collectives, args=(groups,), nprocs=nprocs, timeout_s=240)
    assert bad == [[]] * nprocs, [b for b in bad if b]


def test_runtime_facts_in_every_rank():
    facts = lazyxla.spawn(W.runtime_facts, nprocs=2, timeout_s=120)
    for rank, f in enumerate(facts):
        assert f["world"] == f["processes"] == 2
        assert f["ordinal"] == f["index"] == f["local"] == rank
        assert f["master"] == (rank == 0)
        assert f["payloads"] == ["rank0", "rank1"]
        assert f["total"] == 3


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_rank_stops_the_run_and_is_named(tmp_path, how):
    with pytest.raises(lazyxla.SpawnError) as info:
        lazyxla.spawn(W.fail_at_step, args=(1, str(tmp_path), how), nprocs=2, timeout_s=120)
    stopped_after = time.time() - float((tmp_path / "failed_at").read_text())
    assert stopped_after < 30, f"the run took {stopped_after:.1f} s to stop after rank 1 failed"
    assert info.value.rank == 1
    message = str(info.value)
    assert "rank 1" in message
    if how == "raise":
        assert "deliberate failure in rank 1 at step 3" in message and "Traceback" in message
    else:
        assert "SIGKILL" in message
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2 and all(_gone(p) for p in pids)


def test_spawn_checks_its_arguments():
    with pytest.raises(ValueError, match="nprocs"):
        lazyxla.spawn(W.runtime_facts, nprocs=0)
    with pytest.raises(TypeError, match="callable"):
        lazyxla.spawn(42)


# --- one process: collectives over a single replica, and argument checks at the call ------------


def test_single_replica_collectives_are_identities(dev):
    x = torch.arange(6.0).reshape(2, 3).to(dev)
    half = lazyxla.all_reduce(ReduceOp.SUM, x, scale=0.5).cpu()
    torch.testing.assert_close(half, torch.arange(6.0).reshape(2, 3) / 2)
    assert torch.equal(lazyxla.all_gather(x, 1).cpu(), x.cpu())
    assert torch.equal(lazyxla.reduce_scatter(ReduceOp.MAX, x, 1.0, 0, 1).cpu(), x.cpu())
    assert torch.equal(lazyxla.all_to_all(x, 0, 1, 1).cpu(), x.cpu())
    assert torch.equal(lazyxla.collective_permute(x, [(0, 0)]).cpu(), x.cpu())
    assert torch.equal(lazyxla.broadcast(x).cpu(), x.cpu())
    lst = [x.clone(), x * 2]
    assert lazyxla.all_reduce(ReduceOp.SUM, lst, scale=3.0) is lst
    assert torch.equal(lst[1].cpu(), x.cpu() * 6)
    assert lazyxla.runtime.world_size() == 1 and lazyxla.runtime.is_master()


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda x: lazyxla.all_reduce("sum", x), TypeError, "lazyxla.ReduceOp"),
        (lambda x: lazyxla.all_reduce(ReduceOp.SUM, x.cpu()), TypeError, "lazyxla tensors"),
        (lambda x: lazyxla.all_reduce(ReduceOp.SUM, x, groups=[[0], [1]]), ValueError, "split the 1 replicas"),
        (lambda x: lazyxla.all_gather(x, 2), IndexError, "out of range"),
        (lambda x: lazyxla.reduce_scatter(ReduceOp.SUM, x, 1.0, 0, 2), ValueError, "shard_count=2"),
        (lambda x: lazyxla.all_to_all(x, 0, 1, 3), ValueError, "split_count=3"),
        (lambda x: lazyxla.collective_permute(x, [(0, 1)]), ValueError, "0..0"),
        (lambda x: lazyxla.collective_permute(x, [(0,)]), ValueError, "pairs"),
        (lambda x: lazyxla.broadcast(x, root=2), ValueError, "root=2"),
        (lambda x: lazyxla.all_reduce(ReduceOp.SUM, []), ValueError, "empty list"),
    ],
)
def test_bad_collective_arguments_raise_at_the_call(dev, call, error, match):
    x = torch.ones(2, 3).to(dev)
    with pytest.raises(error, match=match):
        call(x)


def test_rendezvous_and_mesh_reduce_in_one_process():
    assert lazyxla.runtime.rendezvous("alone", b"x") == [b"x"]
    assert lazyxla.runtime.mesh_reduce("alone", 5, sum) == 5
    with pytest.raises(TypeError, match="bytes"):
        lazyxla.runtime.rendezvous("alone", "not bytes")


def _assert_equal_to_one_process_on_the_whole_batch(per_rank_params: list, world: int, steps: int) -> None:
    """CPU eager SGD on the concatenated batch: every rank's parameters must match it within 1e-5."""
    model, x, y = W.dp_problem(world)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    for params in per_rank_params:
        for got, want in zip(params, model.parameters()):
            torch.testing.assert_close(torch.from_numpy(got), want.detach(), rtol=0, atol=1e-5)


def test_data_parallel_training_equals_one_process_on_the_whole_batch():
    world, steps = 4, 5
    per_rank = lazyxla.spawn(W.dp_train, args=(world, steps), nprocs=world, timeout_s=240)
    _assert_equal_to_one_process_on_the_whole_batch(per_rank, world, steps)


def test_distributed_data_parallel_over_the_lazyxla_process_group():
    world, steps = 4, 5
    runs = lazyxla.spawn(W.ddp_train, args=(world, steps), nprocs=world, timeout_s=240)
    _assert_equal_to_one_process_on_the_whole_batch([run["params"] for run in runs], world, steps)
    for run in runs:
        assert run["total"] == sum(range(1, world + 1))  # dist.all_reduce on a lazyxla tensor
        steady = run["compiles"][2:]  # no compile after step 3 (DDP rebuilds its gradient buckets once)
        assert steady == [steady[0]] * len(steady), run["compiles"]


def test_multi_replica_programs_are_loaded_from_the_disk_cache(tmp_path):
    first = lazyxla.spawn(W.cached_collective, args=(str(tmp_path),), nprocs=2, timeout_s=120)
    second = lazyxla.spawn(W.cached_collective, args=(str(tmp_path),), nprocs=2, timeout_s=120)
    want = [2.0 * (2 * i + 1) for i in range(4)]  # 2 * (x_0 + x_1)
    for a, b in zip(first, second):
        assert a["value"] == b["value"] == want
        # First run: each rank compiles and writes (a miss) or, when the other rank wrote the same program
        # a moment before, loads it; at least one rank compiled.
        assert a["misses"] + a["hits"] >= 1
        assert b["hits"] == a["misses"] + a["hits"] and b["misses"] == 0  # second run: every program loaded
    assert sum(a["misses"] for a in first) >= 1


@pytest.mark.parametrize(
    "env,run,detect",
    [
        ({}, {}, False),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
            {"num_processes": 2, "process_id": 1, "coordinator_address": "10.0.0.1:29501"},
            False,
        ),
        ({"RANK": "0", "WORLD_SIZE": "1"}, {}, False),
        ({"SLURM_NTASKS": "4"}, {}, True),
        ({"SLURM_NTASKS": "1"}, {}, False),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, {}, True),
        ({"OMPI_COMM_WORLD_SIZE": "2", "RANK": "0", "WORLD_SIZE": "2"}, {"num_processes": 2, "process_id": 0}, False),
    ],
)
def test_how_a_process_learns_its_run(monkeypatch, env, run, detect):
    from lazyxla.device import distributed

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert distributed._from_environment() == run
    assert distributed._cluster_detected() == detect
    with lazyxla.config.override(num_processes=3, process_id=2, coordinator_address="h:1"):
        assert distributed._from_environment() == {"num_processes": 3, "process_id": 2, "coordinator_address": "h:1"}
        assert not distributed._cluster_detected()  # the run is described: no detection
    with lazyxla.config.override(cluster_detection=True):
        assert distributed._cluster_detected()


def test_initialize_after_the_backend_started_is_a_clear_error(dev, monkeypatch):
    from lazyxla.device import distributed

    monkeypatch.setattr(distributed, "_state", {})
    with pytest.raises(distributed.DistributedError, match="before the first use of a device"):
        distributed.initialize("127.0.0.1:1", num_processes=2, process_id=0)
    with pytest.raises(distributed.DistributedError, match="needs \\['coordinator_address'\\]"):
        distributed.initialize(num_processes=2, process_id=0)
