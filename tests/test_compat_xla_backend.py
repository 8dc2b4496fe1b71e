"""torch_xla's ``"xla"`` torch.distributed backend (``ProcessGroupXla``): its collectives under two real replicas
(``xmp.spawn``, ``CPU_NUM_DEVICES=2``, one subprocess) against values worked out by hand, and, in this process,
the group meshes torch_xla's ``new_group`` gives and the operations it leaves unimplemented.
"""

from __future__ import annotations

import json

import pytest
import torch

import lazyxla.compat as compat
from tests.util import run_python

SCRIPT = r"""
import json
import torch
import torch.distributed as dist
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.xla_backend as xb
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr


def _mp_fn(index):
    dist.init_process_group("xla", init_method="xla://")
    dev, r = torch_xla.device(), xr.global_ordinal()
    res = {"rank": r, "world": dist.get_world_size(), "is_xla": isinstance(dist.group.WORLD, xb.ProcessGroupXla)}
    t = torch.tensor([1.0 + r, 10.0 * (r + 1)], device=dev)
    dist.all_reduce(t)
    res["all_reduce"] = t.cpu().tolist()
    t = torch.tensor([3.0 + r, -1.0 * r], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    res["all_reduce_max"] = t.cpu().tolist()
    outs = [torch.zeros(2, device=dev) for _ in range(2)]
    dist.all_gather(outs, torch.tensor([r, r + 0.5], device=dev))
    res["all_gather"] = [o.cpu().tolist() for o in outs]
    stacked = torch.zeros(2, 2, device=dev)
    dist.all_gather_into_tensor(stacked, torch.tensor([r, 7.0], device=dev))
    res["all_gather_into_tensor"] = stacked.cpu().tolist()
    t = torch.tensor([5.0 + r, 6.0 + r], device=dev)
    dist.broadcast(t, src=1)
    res["broadcast"] = t.cpu().tolist()
    out = torch.zeros(2, device=dev)
    dist.reduce_scatter(out, [torch.full((2,), 1.0 + r, device=dev), torch.full((2,), 10.0 * (r + 1), device=dev)])
    res["reduce_scatter"] = out.cpu().tolist()
    outs, opts = [torch.zeros(2, device=dev), torch.zeros(3, device=dev)], dist.ReduceScatterOptions()
    pieces = [[torch.full((2,), 1.0 + r, device=dev)] * 2]
    pieces.append([torch.arange(3.0, device=dev) * (k + 1) + r for k in range(2)])
    dist.group.WORLD.reduce_scatter_coalesced(outs, pieces, opts)
    res["reduce_scatter_coalesced"] = [o.cpu().tolist() for o in outs]
    t = torch.tensor([2.0 + r], device=dev)
    dist.reduce(t, dst=0)
    res["reduce"] = t.cpu().tolist()
    gathered = [torch.zeros(1, device=dev) for _ in range(2)] if r == 1 else None
    dist.gather(torch.tensor([4.0 + r], device=dev), gathered, dst=1)
    res["gather"] = [g.cpu().tolist() for g in gathered] if gathered else None
    got = torch.zeros(2, device=dev)
    pieces = [torch.tensor([1.0, 2.0], device=dev), torch.tensor([3.0, 4.0], device=dev)] if r == 0 else None
    dist.scatter(got, pieces, src=0)
    res["scatter"] = got.cpu().tolist()
    outs = [torch.zeros(1, device=dev) for _ in range(2)]
    dist.all_to_all(outs, [torch.tensor([10.0 * r + j], device=dev) for j in range(2)])
    res["all_to_all"] = [o.cpu().tolist() for o in outs]
    mine = [dist.new_group(ranks=[k]) for k in range(2)][r]  # every rank makes every group, in one order
    res["singleton_mesh"] = mine._mesh
    t = torch.tensor([8.0 + r], device=dev)
    dist.broadcast(t, src=r, group=mine)
    res["singleton_broadcast"] = t.cpu().tolist()
    dist.barrier()
    res["fallbacks"] = met.executed_fallback_ops()
    with open(f"result_{r}.json", "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=())
"""


def test_xla_backend_collectives_under_two_replicas(tmp_path):
    (tmp_path / "xla_backend_2.py").write_text(SCRIPT)
    proc = run_python(["-m", "lazyxla.run", "xla_backend_2.py"], tmp_path, timeout=300, CPU_NUM_DEVICES="2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    results = {row["rank"]: row for row in (json.loads(p.read_text()) for p in tmp_path.glob("result_*.json"))}
    assert sorted(results) == [0, 1]
    for r, res in results.items():
        assert res["world"] == 2 and res["is_xla"] and res["fallbacks"] == []
        assert res["all_reduce"] == [1.0 + 2.0, 10.0 + 20.0]
        assert res["all_reduce_max"] == [4.0, 0.0]
        assert res["all_gather"] == [[0.0, 0.5], [1.0, 1.5]]
        assert res["all_gather_into_tensor"] == [[0.0, 7.0], [1.0, 7.0]]
        assert res["broadcast"] == [6.0, 7.0]  # rank 1's values
        # piece r of the sum over ranks: piece 0 = 1 + 2, piece 1 = 10 + 20
        assert res["reduce_scatter"] == ([3.0, 3.0] if r == 0 else [30.0, 30.0])
        # output i: piece r of input list i summed over the ranks (XLA's CPU reduce-scatter: torch_xla skips it)
        want = [[3.0, 3.0], [1.0, 3.0, 5.0] if r == 0 else [1.0, 5.0, 9.0]]
        assert res["reduce_scatter_coalesced"] == want
        assert res["reduce"] == ([2.0 + 3.0] if r == 0 else [2.0 + r])  # only the destination keeps the sum
        assert res["gather"] == ([[4.0], [5.0]] if r == 1 else None)
        assert res["scatter"] == ([1.0, 2.0] if r == 0 else [3.0, 4.0])
        assert res["all_to_all"] == [[0.0 + r], [10.0 + r]]  # input j of rank i lands at output i of rank j
        assert res["singleton_mesh"] == [[0], [1]] and res["singleton_broadcast"] == [8.0 + r]


@pytest.fixture
def xla_group():
    """The compatibility layer and a one-process "xla" world group (both removed again afterwards)."""
    import torch.distributed as dist

    assert compat.install()
    import torch_xla.distributed.xla_backend as xb

    dist.init_process_group("xla", init_method="xla://")
    yield xb
    dist.destroy_process_group()
    compat.uninstall()


def test_meshes_of_new_groups_follow_torch_xla(xla_group):
    infer = xla_group._infer_mesh
    assert infer([4, 5, 6, 7], 12) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert infer([3, 7, 11], 12) == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    for bad in ([4, 5, 6], [7, 8, 9, 10], [1, 5], [1, 5, 10], [0, 1, 2, 3, 4]):
        with pytest.raises(ValueError):
            infer(bad, 12)
    spmd = {"xla_pg_options": {"spmd": True}}
    mesh_of = xla_group._mesh_of
    assert mesh_of([0, 1, 2, 3], 4, None) == [[0, 1, 2, 3]]
    assert mesh_of([2], 4, None) == [[0], [1], [2], [3]]
    assert mesh_of([0, 2], 4, spmd) == [[0, 2], [1, 3]]
    assert mesh_of([0, 2], 4, None) == [[0, 2]]  # without options: the group alone
    assert mesh_of([0, 1], 4, {"xla_pg_options": {"mesh": [[0, 1], [2, 3]]}}) == [[0, 1], [2, 3]]

    import torch.distributed as dist

    whole = dist.new_group(ranks=[0])
    assert isinstance(whole, xla_group.ProcessGroupXla) and whole._mesh == [[0]] and whole.size() == 1
    assert isinstance(dist.new_group(), xla_group.ProcessGroupXla)


def test_unimplemented_operations_raise_as_in_torch_xla(xla_group, dev):
    import torch.distributed as dist

    world = dist.group.WORLD
    assert world.getBackendName() == "xla" and world._mesh == []
    for name in ("allreduce_coalesced", "recv_anysource", "monitored_barrier", "Options"):
        with pytest.raises(NotImplementedError):
            getattr(world, name)(torch.ones(2, device=dev))
    t = torch.tensor([1.0, 2.0], device=dev)
    dist.all_reduce(t)  # one replica: its own values
    assert t.cpu().tolist() == [1.0, 2.0]


SEND_RECV = r"""
import json
import torch
import torch.distributed as dist
import torch_xla
import torch_xla.distributed.xla_backend  # noqa: F401
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr


def payloads(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return {
        "float32": torch.randn(3, 5, generator=g),
        "int64": torch.randint(-2**40, 2**40, (7,), generator=g, dtype=torch.int64),
        "bool": torch.rand(4, 2, generator=g) > 0.5,
        "bfloat16": torch.randn(6, generator=g).to(torch.bfloat16),
        "0-d": torch.tensor(1.5 + rank, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
    }


def exact(t):  # every value, its dtype kept (bfloat16 through float32: exact)
    return [str(t.dtype), list(t.shape), (t.float() if t.dtype == torch.bfloat16 else t).tolist()]


def _mp_fn(index):
    dist.init_process_group("xla", init_method="xla://")
    dev, r, n = torch_xla.device(), xr.global_ordinal(), xr.world_size()
    res = {"rank": r, "sent": {k: exact(v) for k, v in payloads(r).items()}, "got": {}, "kept": {}}
    for name, value in payloads(r).items():  # the first half sends to the second half
        t = value.to(dev)
        if r < n // 2:
            dist.send(t, r + n // 2)
            res["kept"][name] = exact(t.cpu())  # the sender's tensor keeps its value
        else:
            t = torch.full_like(value, 7).to(dev)
            dist.recv(t, r - n // 2)
            res["got"][name] = exact(t.cpu())
    mine, got = torch.tensor([float(r)], device=dev), torch.tensor([-1.0], device=dev)
    if r % 2 == 0:  # a ring: even ranks send first, odd ranks receive first
        dist.send(mine, (r + 1) % n)
        dist.recv(got, (r - 1) % n)
    else:
        dist.recv(got, (r - 1) % n)
        dist.send(mine, (r + 1) % n)
    res["ring"] = got.cpu().tolist()
    pending = torch.arange(4.0, device=dev) * (r + 1) + 1  # pending work: computed before it is sent
    into = torch.zeros(4, device=dev)
    view = into[1:]
    if r in (0, 1):
        dist.send(pending, 1 - r) if r == 0 else dist.recv(into, 0)
    res["pending"], res["view"] = into.cpu().tolist(), view.cpu().tolist()
    cpu = torch.arange(3) * (r + 1)
    if r in (2, 3):
        dist.send(cpu, 3) if r == 2 else dist.recv(cpu, 2)
    res["cpu"] = cpu.tolist()
    try:
        if r in (0, 1):
            bad = torch.zeros(2 + r, device=dev)
            dist.send(bad, 1) if r == 0 else dist.recv(bad, 0)
        res["mismatch"] = None
    except ValueError as e:
        res["mismatch"] = str(e)
    with open(f"result_{r}.json", "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=())
"""


def test_send_and_recv_between_four_replicas(tmp_path):
    """``dist.send``/``dist.recv`` on the "xla" backend deliver the sender's exact values (every dtype class, 0-d and
    empty tensors, pending values, a receiving tensor's views, CPU tensors), pair by pair while the other replicas
    do other pairs, and a shape mismatch raises on both sides instead of hanging."""
    (tmp_path / "send_recv.py").write_text(SEND_RECV)
    proc = run_python(["-m", "lazyxla.run", "send_recv.py"], tmp_path, timeout=300, CPU_NUM_DEVICES="4")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    assert "Individual send/recv ops are inefficient" in proc.stderr  # torch_xla's warning at each call
    res = {row["rank"]: row for row in (json.loads(p.read_text()) for p in tmp_path.glob("result_*.json"))}
    assert sorted(res) == [0, 1, 2, 3]
    for r in (0, 1):
        assert res[r]["kept"] == res[r]["sent"]
        assert res[r + 2]["got"] == res[r]["sent"]  # bit for bit, dtype and shape included
        assert res[r + 2]["got"]["int64"] != res[r + 2]["sent"]["int64"]  # (the ranks' values differ)
    assert [res[r]["ring"] for r in range(4)] == [[3.0], [0.0], [1.0], [2.0]]  # from (r - 1) % 4
    assert res[1]["pending"] == [1.0, 2.0, 3.0, 4.0] and res[1]["view"] == [2.0, 3.0, 4.0]
    assert res[0]["pending"] == [0.0] * 4
    assert res[3]["cpu"] == [0, 3, 6] and res[2]["cpu"] == [0, 3, 6]
    for r in (0, 1):
        assert "process 0 sends" in res[r]["mismatch"] or "process 1 receives into" in res[r]["mismatch"]
        assert "[2]" in res[r]["mismatch"] and "[3]" in res[r]["mismatch"]
    assert res[2]["mismatch"] is None
