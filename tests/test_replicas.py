"""Replicas across processes: collectives in the graph, the runtime, spawn's fail-fast supervision.

Multi-process tests start real processes on 127.0.0.1 through ``lazyxla.spawn`` (bounded by its
``timeout_s``; every child is stopped and reaped before it returns or raises).
"""

from __future__ import annotations

import ipaddress
import multiprocessing
import os
import pickle
import signal

import numpy as np
import pytest
import replica_workers as W  # tests/ is on sys.path (pytest puts it there); the children import it by name
import torch

import lazyxla
from lazyxla import ReduceOp
from lazyxla.parallel import launch


@pytest.mark.parametrize("nprocs,groups", [(2, [[1], [0]]), (4, [[0, 1], [2, 3]])])
def test_collectives_equal_numpy(nprocs, groups):
    bad = lazyxla.spawn(W.check_collectives, args=(groups,), nprocs=nprocs, timeout_s=240)
    assert bad == [[]] * nprocs, [b for b in bad if b]


def test_numbers_that_differ_between_ranks_are_program_inputs():
    # float(rank) is 0.0 on rank 0 and 1.0 on rank 1: as constants they gave the ranks different programs,
    # which met in the all-reduce with wrong sums (rank 0 read 0, rank 1 read 4 for x * s + s)
    results = lazyxla.spawn(W.rank_numbers, nprocs=2, timeout_s=240)
    want = {"rank": [2.0] * 4, "rank+1": [6.0] * 4, "-rank": [-2.0] * 4, "alpha": [3.0] * 4, "beta": [[5.0] * 2] * 2}
    assert results == [want, want]


def test_ranks_return_cpu_copies_of_device_tensors():
    # multiprocessing sent a CPU tensor as a shared-memory handle the parent opened after the rank had exited:
    # about one run in three lost a rank's result ("exited with code 0 without reporting an error")
    for _ in range(3):
        results = lazyxla.spawn(W.device_results, nprocs=2, timeout_s=120)
        for rank, got in enumerate(results):
            assert int(got[-1]) == rank
            torch.testing.assert_close(got[0] / (rank + 1), results[0][0])  # the same initial weight, scaled


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
    assert info.value.rank == 1, str(info.value)
    message = str(info.value)
    assert message.startswith("spawn: rank 1 ")
    if how == "raise":
        assert "deliberate failure in rank 1 at step 3" in message and "Traceback" in message
    else:
        assert "SIGKILL" in message
    # a rank that reported an error exits with 1 unless the stop's SIGTERM reaches it first; rank 0 reported
    # its communication error and exited, or was stopped by SIGTERM: neither was left to SIGKILL
    assert info.value.exitcodes[1] in ((1, -signal.SIGTERM) if how == "raise" else (-signal.SIGKILL,))
    assert info.value.exitcodes[0] in (1, -signal.SIGTERM), info.value.exitcodes
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2 and all(_gone(p) for p in pids)


def test_a_hung_rank_is_stopped_by_sigterm():
    # jax's preemption notifier used to swallow SIGTERM, so every stop waited 5 s for SIGKILL
    with pytest.raises(lazyxla.SpawnError, match="deliberate failure in rank 0") as info:
        lazyxla.spawn(W.hang_after_failure, nprocs=2, timeout_s=120)
    assert info.value.rank == 0
    assert info.value.exitcodes[1] == -signal.SIGTERM, info.value.exitcodes


class _FakeRank:
    """A rank as spawn's supervisor sees it: its exit status is readable only after ``hidden`` reads
    (as when its peers saw its sockets close before its parent can reap it), or never (still running)."""

    def __init__(self, exitcode: int | None, hidden: int = 0) -> None:
        self._exitcode, self._hidden = exitcode, hidden
        read, self._write = os.pipe()
        self.sentinel = read
        if exitcode is not None:
            os.close(self._write)  # a dead process: its sentinel is ready
            self._write = None

    @property
    def exitcode(self) -> int | None:
        if self._hidden > 0:
            self._hidden -= 1
            return None
        return self._exitcode

    def close(self) -> None:
        os.close(self.sentinel)
        if self._write is not None:
            os.close(self._write)


def _supervise(ranks: list[_FakeRank], messages: list[list[tuple]]) -> lazyxla.SpawnError:
    conns = []
    for sent in messages:
        recv, send = multiprocessing.Pipe(duplex=False)
        for m in sent:
            send.send(m)
        send.close()
        conns.append(recv)
    try:
        with pytest.raises(lazyxla.SpawnError) as info:
            launch._supervise(ranks, conns, timeout_s=60)
    finally:
        for r in ranks:
            r.close()
    return info.value


_GLOO = "ValueError: UNKNOWN: Gloo all-reduce failed: [pair.cc:547] Connection closed by peer [127.0.0.1]:11397\n"


@pytest.mark.parametrize("hidden", [0, 1, 50])
def test_the_rank_killed_first_is_named_even_when_its_peers_error_arrives_first(hidden):
    # rank 0's communication error is in its pipe, and rank 0 has exited, before rank 1's exit status shows
    got = _supervise([_FakeRank(1), _FakeRank(-9, hidden)], [[("error", _GLOO, True, None)], []])
    assert got.rank == 1 and str(got).startswith("spawn: rank 1 was killed by signal SIGKILL")
    assert "rank 0 raised ValueError: UNKNOWN: Gloo all-reduce failed" in str(got)


def test_a_rank_that_raised_its_own_error_is_named_before_its_peers_communication_errors():
    raised = "ValueError: deliberate failure in rank 2\nTraceback ...\n"
    ranks = [_FakeRank(1), _FakeRank(1), _FakeRank(1, hidden=3)]
    own = pickle.dumps(ValueError("deliberate failure in rank 2"))  # the exception, as the rank pickled it
    peer = ("error", _GLOO, True, None)
    got = _supervise(ranks, [[peer], [("ok", 1), peer], [("error", raised, False, own)]])
    assert got.rank == 2 and "deliberate failure in rank 2" in str(got)
    assert type(got.exception) is ValueError and str(got.exception) == "deliberate failure in rank 2"


def test_a_communication_error_is_named_when_no_other_rank_reports_a_cause(monkeypatch):
    monkeypatch.setattr(launch, "_ROOT_CAUSE_WAIT_S", 0.05)  # rank 1 never ends: wait this long for it
    got = _supervise([_FakeRank(1), _FakeRank(None)], [[("error", _GLOO, True, None)], []])
    assert got.rank == 0 and "Connection closed by peer" in str(got)


def test_communication_errors_are_told_from_a_ranks_own_errors():
    from lazyxla.device.processes import DistributedError

    def chained(outer, inner):
        try:
            try:
                raise inner
            except Exception:
                raise outer  # noqa: B904 - the implicit chain (__context__) is what is checked
        except Exception as e:
            return e

    assert launch._caused_by_peer(ValueError(_GLOO))
    assert launch._caused_by_peer(DistributedError("rendezvous('x') in process 0 of 2: not every process arrived"))
    assert launch._caused_by_peer(torch.distributed.DistNetworkError("failed to recv"))
    assert launch._caused_by_peer(chained(RuntimeError("the step failed"), ConnectionResetError()))
    assert launch._caused_by_peer(RuntimeError("DEADLINE_EXCEEDED: Barrier timed out"))
    assert not launch._caused_by_peer(ValueError("deliberate failure in rank 1 at step 3"))
    assert not launch._caused_by_peer(RuntimeError("shape mismatch: the deadline for unavailable data"))
    assert not launch._caused_by_peer(chained(RuntimeError("the step failed"), KeyError("w")))


# --- the run's servers listen on loopback; values between processes are never unpickled ----------------


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None and (
        ip.ipv4_mapped.is_loopback
    ))  # fmt: skip


def test_every_server_of_a_spawned_run_listens_on_loopback_only():
    runs = lazyxla.spawn(W.listening_sockets, nprocs=2, timeout_s=120)
    for rank, run in enumerate(runs):
        assert run["total"] == [2.0, 2.0, 2.0]
        assert run["own"], f"rank {rank} listens on nothing: gloo's sockets were not found"
        assert run["coordinator"] and run["store"], run
        for address, port in run["own"] + run["coordinator"] + run["store"]:
            assert _loopback(address), f"rank {rank}: a server listens on {address}:{port}, not on loopback"
    coordinator_port = runs[0]["coordinator"][0][1]
    assert coordinator_port in [port for _, port in runs[0]["own"]]  # jax's coordinator, in rank 0
    assert not any(a in run["own"] for run in runs for a in runs[0]["store"])  # the store is the parent's


@pytest.mark.parametrize(
    "flag,address,bound",
    [
        ("", "127.0.0.1:1234", "127.0.0.1:1234"),
        ("", "localhost:1234", "localhost:1234"),
        ("", "[::1]:1234", "[::1]:1234"),
        ("", "10.0.0.1:1234", None),  # another host must reach it: jax's default, every interface
        ("", "node0:1234", None),
        ("0.0.0.0", "10.0.0.1:1234", "0.0.0.0:1234"),
        ("10.0.0.1:999", "10.0.0.1:1234", "10.0.0.1:999"),
        ("::", "10.0.0.1:1234", "[::]:1234"),
        ("[::]", "10.0.0.1:1234", "[::]:1234"),
    ],
)
def test_the_coordinator_binds_to_loopback_unless_told_otherwise(flag, address, bound):
    from lazyxla.device import processes

    with lazyxla.config.override(coordinator_bind_address=flag):
        assert processes.bind_address(address) == bound
    with (
        lazyxla.config.override(coordinator_bind_address="0.0.0.0"),
        pytest.raises(processes.DistributedError, match="names no port"),
    ):
        processes.bind_address(None)


def test_values_exchanged_between_processes_keep_every_dtype():
    bad = lazyxla.spawn(W.exchange_every_dtype, nprocs=2, timeout_s=240)
    assert bad == [[], []], [b for b in bad if b]


def test_a_planted_pickle_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "planted-code-ran"
    errors, _ = lazyxla.spawn(W.planted_values, args=(str(marker),), nprocs=2, timeout_s=120)
    assert not marker.exists(), "unpickling a value from the coordination service ran code"
    assert len(errors) == 2
    for e in errors:
        assert e.startswith("ValueError: lazyxla: the data received from ") and "wire encoding" in e, e
    assert "process 1 in mesh_reduce('planted')" in errors[0]
    assert "rank 1 in the lazyxla process group" in errors[1]


def test_values_that_cannot_travel_safely_are_refused_at_the_sender():
    from lazyxla.device import wire

    for value, match in [
        (object(), "builtins.object"),
        ({"model": torch.nn.Linear(1, 1)}, r"value\['model'\].*torch.nn.modules.linear.Linear"),
        (np.array([None]), "Python objects"),
        (torch.ones(2).to_sparse(), "to_dense"),
    ]:
        with pytest.raises(TypeError, match=match):
            wire.encode(value)
    with pytest.raises(TypeError, match="mesh_reduce"):
        lazyxla.runtime.mesh_reduce("alone", object(), list)


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
    for r in range(2):  # one process's values go through the same encoding as many processes'
        got = lazyxla.runtime.mesh_reduce("alone", W.exchanged_value(r), list)
        assert W._same(got, [W.exchanged_value(r)])
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


def test_reads_on_the_master_only_run_no_collective():
    """Rank 0 reads its loss twice while the step's all-reduce is pending: each read computes what it needs (the
    forward), never the pending collective, which the other ranks run only at their sync."""
    world, steps = 2, 2
    per_rank = lazyxla.spawn(W.dp_train, args=(world, steps, 3, 2), nprocs=world, timeout_s=240)
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
    from lazyxla.device import processes

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert processes._from_environment() == run
    assert processes._cluster_detected() == detect
    with lazyxla.config.override(num_processes=3, process_id=2, coordinator_address="h:1"):
        assert processes._from_environment() == {"num_processes": 3, "process_id": 2, "coordinator_address": "h:1"}
        assert not processes._cluster_detected()  # the run is described: no detection
    with lazyxla.config.override(cluster_detection=True):
        assert processes._cluster_detected()


def test_initialize_after_the_backend_started_is_a_clear_error(dev, monkeypatch):
    from lazyxla.device import processes

    monkeypatch.setattr(processes, "_state", {})
    with pytest.raises(processes.DistributedError, match="before the first use of a device"):
        processes.initialize("127.0.0.1:1", num_processes=2, process_id=0)
    with pytest.raises(processes.DistributedError, match="needs \\['coordinator_address'\\]"):
        processes.initialize(num_processes=2, process_id=0)
