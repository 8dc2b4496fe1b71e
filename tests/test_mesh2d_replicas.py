"""A 2-D lazyxla DeviceMesh over 4 replicas (one process per device), against CPU eager.

``init_device_mesh("lazyxla", (2, 2), mesh_dim_names=("dp", "tp"))`` makes a process group per row and per column;
their collectives record with XLA's replica groups. One 4-process run (``lazyxla.spawn`` on 127.0.0.1, bounded by
its ``timeout_s``) does every check; the tests below read its results.
"""

from __future__ import annotations

import functools

import mesh2d_workers as W  # tests/ is on sys.path (pytest puts it there); the children import it by name
import pytest
import torch
import torch.nn.functional as F

import lazyxla

# rank r sits at (dp, tp) = (r // 2, r % 2): the "tp" groups are the rows [0, 1], [2, 3], the "dp" ones the columns
GROUPS = {"tp": lambda r: [r - r % 2, r - r % 2 + 1], "dp": lambda r: [r % 2, r % 2 + 2]}


@functools.cache
def _runs() -> list[dict]:
    return lazyxla.spawn(W.fsdp_tp, nprocs=4, timeout_s=540)


def test_collectives_and_redistributions_on_each_dimension_of_a_2d_mesh():
    # new_group of some replicas was refused: init_device_mesh("lazyxla", (2, 2)) raised in its creator
    _, _, a = W.problem()
    for rank, run in enumerate(_runs()):
        assert run["mesh"] == [[0, 1], [2, 3]]
        got = run["collectives"]
        for dim, members in GROUPS.items():
            mine, me = got[dim], GROUPS[dim](rank).index(rank)
            assert mine["ranks"] == members(rank)
            torch.testing.assert_close(mine["all_reduce"], sum(torch.arange(6.0) + 10 * r for r in members(rank)))
            torch.testing.assert_close(
                mine["all_gather"], torch.stack([torch.arange(6.0) * (r + 1) for r in members(rank)])
            )
            torch.testing.assert_close(mine["broadcast"], torch.full((3,), float(members(rank)[1])))
            torch.testing.assert_close(mine["shard(0) local"], a.chunk(2)[me])
            torch.testing.assert_close(mine["shard->replicate"], a)
            torch.testing.assert_close(mine["replicate->shard(1)"], a.chunk(2, 1)[me])
            torch.testing.assert_close(mine["shard(0)->shard(1)"], a.chunk(2, 1)[me])
        dp, tp = divmod(rank, 2)
        torch.testing.assert_close(got["2-d local"], a.chunk(2)[dp].chunk(2, 1)[tp])
        torch.testing.assert_close(got["2-d full"], a)
        torch.testing.assert_close(got["2-d -> (replicate, shard(0))"], a.chunk(2)[tp])


def test_fsdp2_over_dp_with_tensor_parallel_over_tp_trains_as_cpu_eager():
    # FSDP2 (fully_shard on mesh["dp"]) of a SwiGLU MLP made tensor-parallel on mesh["tp"] (ColwiseParallel w1/w3,
    # RowwiseParallel w2); each dp rank on its half of the batch, so the CPU reference is the whole batch
    runs = _runs()
    model, batches, _ = W.problem()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    want = []
    for x, y in batches:
        halves = [F.mse_loss(model(xs), ys) for xs, ys in zip(x.chunk(2), y.chunk(2))]
        torch.stack(halves).mean().backward()  # FSDP2 averages the dp ranks' gradients
        opt.step()
        opt.zero_grad()
        want.append(torch.stack(halves).detach())
    for rank, run in enumerate(runs):
        dp = rank // 2
        torch.testing.assert_close(torch.stack(run["losses"]), torch.stack(want)[:, dp], rtol=1e-4, atol=1e-5)
        for name, ref in model.named_parameters():
            torch.testing.assert_close(run["params"][name], ref.detach(), rtol=1e-4, atol=1e-4, msg=name)
        assert run["placements"]["w2.weight"] == "(Shard(dim=0), Shard(dim=1))"  # dp-sharded and tp-sharded
        assert run["compiles"][1:] == [run["compiles"][1]] * 3, run["compiles"]  # nothing compiles after step 2
        assert run["programs"][1:] == [3, 3, 3], run["programs"]  # (FSDP2's all_gather_copy_in runs on the CPU)


def test_groups_that_do_not_split_the_replicas_equally_are_refused():
    from lazyxla.parallel import process_group

    told = {0: [0, 1], 1: [0, 1], 2: [2], 3: [3]}  # what each process's group would be: sizes 2, 1, 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(process_group.processes, "rendezvous", lambda tag, payload: [str(told[i]).encode() for i in told])
        with pytest.raises(NotImplementedError, match="do not split the replicas into groups of equal size"):
            process_group._partition_of([0, 1], "mesh_tp")
        told[2] = [2, 3]
        told[3] = [3, 2]  # inconsistent: process 3 names another group than process 2 (order differs)
        with pytest.raises(NotImplementedError, match="do not split"):
            process_group._partition_of([0, 1], "mesh_tp")
        told[3] = [2, 3]
        assert process_group._partition_of([0, 1], "mesh_tp") == [[0, 1], [2, 3]]
