"""``torch_xla._internal`` (tpu, pjrt, gpu, rendezvous) and the older ``xla_env_vars`` names, against what torch_xla
does: the expected values are those of torch_xla's own tests (test/pjrt/test_internal_tpu.py, test_ddp.py,
test_mesh_service.py) and of its source where it has no test (gpu, rendezvous). The replica runs go through one
subprocess under ``python -m lazyxla.run`` with two CPU devices.
"""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
import torch.distributed as dist
from torch import nn

import lazyxla.compat as compat
from tests.util import run_python, run_torch_xla_script

V4_16_METADATA = textwrap.dedent(
    """
    ACCELERATOR_TYPE: 'v4-16'
    CHIPS_PER_HOST_BOUNDS: '2,2,1'
    TPU_CHIPS_PER_PROCESS_BOUNDS: '2,2,1'
    TPU_PROCESS_BOUNDS: '1,1,2'
    WORKER_ID: '0'
    """
)
FOUR_HOSTS = (
    "t1v-n-0f996b37-w-0:12345:10.130.0.26,t1v-n-0f996b37-w-1:12346:10.130.0.27,"
    "t1v-n-0f996b37-w-2:12347:10.130.0.25,t1v-n-0f996b37-w-3:12348:10.130.0.28"
)
TPU_VARIABLES = (
    "TPU_SKIP_MDS_QUERY",
    "TPU_ACCELERATOR_TYPE",
    "TPU_PROCESS_BOUNDS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "TPU_VISIBLE_CHIPS",
    "TPU_PROCESS_PORT",
    "TPU_PROCESS_ADDRESSES",
    "CLOUD_TPU_TASK_ID",
)


@pytest.fixture
def tpu(monkeypatch, tmp_path):
    """``torch_xla._internal.tpu`` on a host without TPU chips (an empty PCI bus) and no TPU variables."""
    assert compat.install()
    from torch_xla._internal import tpu

    monkeypatch.setattr(tpu, "_PCI_DEVICES", str(tmp_path))
    for name in TPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield tpu
    compat.uninstall()


def test_metadata_is_read_only_on_a_tpu_vm(tpu, monkeypatch):
    with pytest.raises(tpu.NotATpuHostError, match="no TPU chips"):  # torch_xla's request fails there too
        tpu.get_tpu_env()
    assert tpu.get_worker_ips() == ["localhost"]  # lazyxla's devices on this host are the whole slice
    monkeypatch.setattr(tpu, "_get_metadata", {"tpu-env": V4_16_METADATA, "worker-network-endpoints": FOUR_HOSTS}.get)
    env = tpu.get_tpu_env()
    assert env["ACCELERATOR_TYPE"] == "v4-16" and env["TPU_PROCESS_BOUNDS"] == "1,1,2" and env["WORKER_ID"] == "0"
    assert tpu.version() == 4 and tpu.get_tpu_type() == "v4"
    assert tpu.get_worker_ips() == ["10.130.0.26", "10.130.0.27", "10.130.0.25", "10.130.0.28"]
    assert tpu.num_tpu_workers() == 4


@pytest.mark.parametrize(
    ("accelerator", "version"), [("v5abcdefg-16", 5), ("tpu7x-8", 7), ("v2-8", 2), ("cpu-8", None), (None, None)]
)
def test_version_parses_torch_xla_accelerator_types(tpu, monkeypatch, accelerator, version):
    monkeypatch.setattr(tpu, "get_tpu_env", lambda: {"ACCELERATOR_TYPE": accelerator})
    if version is None:
        with pytest.raises(OSError, match="Failed to parse TPU version"):
            tpu.version()
    else:
        assert tpu.version() == version


# (tpu env, worker ips, local rank, local world size, the variables torch_xla's test expects)
TOPOLOGIES = {
    "v4-8_process_3": (
        {"ACCELERATOR_TYPE": "v4-8", "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1"},
        ["localhost"],
        3,
        {
            "TPU_PROCESS_BOUNDS": "2,2,1",
            "CLOUD_TPU_TASK_ID": "3",
            "TPU_PROCESS_PORT": "8479",
            "TPU_PROCESS_ADDRESSES": "localhost:8476,localhost:8477,localhost:8478,localhost:8479",
            "TPU_VISIBLE_CHIPS": "3",
        },
    ),
    "v4-16_worker_1_process_0": (
        {"ACCELERATOR_TYPE": "v4-16", "TPU_PROCESS_BOUNDS": "1,1,2", "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1"},
        ["10.130.0.31", "10.130.0.30"],
        0,
        {
            "TPU_PROCESS_BOUNDS": "2,2,2",
            "CLOUD_TPU_TASK_ID": "4",
            "TPU_PROCESS_PORT": "8476",
            "TPU_PROCESS_ADDRESSES": ",".join(
                f"{ip}:{port}" for ip in ("10.130.0.31", "10.130.0.30") for port in range(8476, 8480)
            ),
            "TPU_VISIBLE_CHIPS": "0",
        },
    ),
    "v3-8_process_0": (  # no bounds in v3 metadata: torch_xla's host-bounds table and 2x2 chips per host
        {"ACCELERATOR_TYPE": "v3-8"},
        ["localhost"],
        0,
        {"TPU_PROCESS_BOUNDS": "2,2,1", "CLOUD_TPU_TASK_ID": "0", "TPU_PROCESS_PORT": "8476", "TPU_VISIBLE_CHIPS": "0"},
    ),
}


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_configure_topology_sets_torch_xla_s_variables(tpu, monkeypatch, name):
    env, ips, rank, expected = TOPOLOGIES[name]
    monkeypatch.setattr(tpu, "get_tpu_env", lambda: {"WORKER_ID": "1" if len(ips) > 1 else "0", **env})
    monkeypatch.setattr(tpu, "get_worker_ips", lambda: ips)
    tpu.configure_topology(rank, 4)
    assert {k: os.environ.get(k) for k in expected} == expected
    assert os.environ["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"
    assert tpu.discover_master_worker_ip() == ("localhost" if len(ips) == 1 else ips[1])  # one process: its own


def test_jax_leaves_the_tpu_metadata_switch_unset(tmp_path):
    """jax sets TPU_SKIP_MDS_QUERY=1 when imported on a host without TPU chips; ``import lazyxla`` removes it
    again unless the user had set it, so torch_xla code does not take this host for a described TPU VM."""
    code = "import os, lazyxla; print(os.environ.get('TPU_SKIP_MDS_QUERY'))"
    unset = run_python(["-c", code], tmp_path, timeout=120)
    assert unset.returncode == 0 and unset.stdout.split()[-1] == "None", unset.stderr[-2000:]
    given = run_python(["-c", code], tmp_path, timeout=120, TPU_SKIP_MDS_QUERY="yes")
    assert given.returncode == 0 and given.stdout.split()[-1] == "yes", given.stderr[-2000:]


def test_gpu_local_processes_and_old_variable_names(monkeypatch):
    assert compat.install()
    try:
        import torch_xla.core.xla_env_vars as xenv
        from torch_xla._internal import gpu

        monkeypatch.delenv("GPU_NUM_DEVICES", raising=False)
        with pytest.raises(AssertionError, match="GPU_NUM_DEVICES"):
            gpu.num_local_processes()
        monkeypatch.setenv("GPU_NUM_DEVICES", "3")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        assert gpu.num_local_processes() == 3 and os.environ["LOCAL_WORLD_SIZE"] == "3"
        # XRT's names, which Lightning's pre-2.1 branch reads (getenv_as(xenv.HOST_ORDINAL, int, 0))
        assert (xenv.HOST_ORDINAL, xenv.HOST_WORLD_SIZE, xenv.ORDINAL) == (
            "XRT_HOST_ORDINAL",
            "XRT_HOST_WORLD_SIZE",
            "XRT_SHARD_ORDINAL",
        )
        assert xenv.GPU_NUM_DEVICES == "GPU_NUM_DEVICES" and xenv.WORLD_SIZE == "WORLD_SIZE"
    finally:
        compat.uninstall()


def test_rendezvous_of_one_replica(monkeypatch):
    assert compat.install()
    try:
        from torch_xla._internal import rendezvous

        monkeypatch.delenv("MASTER_ADDR", raising=False)
        monkeypatch.delenv("MASTER_PORT", raising=False)
        store, rank, world = next(rendezvous.pjrt_rendezvous_handler("xla://"))
        assert (rank, world) == (0, 1) and isinstance(store, dist.Store)
        store.set("k", "v")
        assert store.get("k") == b"v"
        assert isinstance(rendezvous.DummyStore(), dist.Store)
    finally:
        compat.uninstall()


REPLICAS = r"""
import json, os, threading
import torch, torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch_xla._internal import pjrt


def where():
    return xr.global_ordinal(), os.getpid(), os.environ.get("PJRT_LOCAL_PROCESS_COUNT")


def total():
    t = torch.tensor([float(xr.global_ordinal() + 1)], device=torch_xla.device())
    return xm.all_reduce(xm.REDUCE_SUM, t).cpu().item()


def str_payload():
    return xm.rendezvous("tag", "a str")  # torch_xla raises TypeError: payload must be bytes


def indexed(index, out):
    out.append((index, threading.current_thread().name))


if __name__ == "__main__":
    res = {"where": pjrt.run_multiprocess(where), "total": pjrt.run_multiprocess(total), "me": os.getpid()}
    try:
        pjrt.run_multiprocess(str_payload)
    except TypeError as e:
        res["raised"] = ["TypeError", type(e.__cause__).__name__]
    try:
        pjrt.spawn(indexed, nprocs=2, args=([],))
    except ValueError as e:
        res["nprocs"] = str(e).split(".")[0]
    try:  # this process drives both CPU devices: torch_xla would run a thread per device as a replica
        pjrt.spawn_threads(indexed, args=([],))
    except NotImplementedError as e:
        res["threads"] = str(e).split(";")[0]
    print("RESULT " + json.dumps(res))
"""

THREADS = r"""
import json, threading
from torch_xla._internal import pjrt


def indexed(index, out):
    out.append((index, threading.current_thread().name))


def fails(index):
    raise KeyError("from the thread")


if __name__ == "__main__":
    out = []
    pjrt.spawn_threads(indexed, args=(out,))
    pjrt.spawn(indexed, nprocs=1, args=(out,))
    try:
        pjrt.spawn_threads(fails)
    except KeyError as e:
        out.append(str(e))
    print("RESULT " + json.dumps(out))
"""


def test_run_multiprocess_spawn_and_spawn_threads(tmp_path):
    res = run_torch_xla_script(REPLICAS, tmp_path, timeout=400, CPU_NUM_DEVICES="2")
    where = {int(k): v for k, v in res["where"].items()}
    assert sorted(where) == [0, 1] and [where[i][0] for i in (0, 1)] == [0, 1]
    assert res["me"] not in {where[0][1], where[1][1]} and where[0][1] != where[1][1]  # a new process per replica
    assert [where[i][2] for i in (0, 1)] == ["2", "2"]  # initialize_multiprocess's PJRT_LOCAL_PROCESS_COUNT
    assert {int(k): v for k, v in res["total"].items()} == {0: 3.0, 1: 3.0}
    assert res["raised"] == ["TypeError", "SpawnError"]  # the replica's exception, as torch_xla's pool raises it
    assert res["nprocs"] == "Unsupported nprocs (2)"
    assert "spawn_threads over 2 devices of one process" in res["threads"]


def test_spawn_threads_and_spawn_of_one_replica_run_here(tmp_path):
    out = run_torch_xla_script(THREADS, tmp_path, timeout=200, CPU_NUM_DEVICES="1")
    assert out[:2] == [[0, "spawn_threads-0"], [0, "MainThread"]]  # nprocs=1 runs in this process, as torch_xla's
    assert out[2] == "'from the thread'"  # the thread's exception is raised in the caller


def test_backward_optimization_barrier_keeps_gradients(dev):
    """``xs.apply_backward_optimization_barrier(m)`` (torch_xla's hook): one barrier over ``m``'s gradients in the
    backward program, and every gradient as CPU eager's."""
    import lazyxla

    assert compat.install()
    try:
        import torch_xla.distributed.spmd as xs

        torch.manual_seed(0)
        model, x = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(2, 8)
        model(x).sum().backward()
        expected = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        model.to(dev)
        xs.apply_backward_optimization_barrier(model[2])
        model(x.to(dev)).sum().backward()
        grads = [p.grad for p in model.parameters()]
        hlo = lazyxla.debug.stablehlo_text(grads)
        assert hlo.count("stablehlo.optimization_barrier") == 1
        for want, got in zip(expected, grads):
            torch.testing.assert_close(got.cpu(), want)
    finally:
        compat.uninstall()
