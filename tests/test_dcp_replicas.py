"""``torch.distributed.checkpoint`` of an FSDP2 model and its AdamW state over replicas (one process per device,
``init_process_group("lazyxla")``): saved by 4 ranks, loaded by 2 (DCP reshards), against the CPU reference.

Multi-process runs start on 127.0.0.1 through ``lazyxla.spawn``, bounded by its ``timeout_s``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import dcp_workers as W  # tests/ is on sys.path (pytest puts it there); the children import it by name
import pytest
import torch

import lazyxla


def _whole(runs: list[dict]) -> dict:
    """The ranks' parts joined: FSDP2 shards dimension 0 over the ranks in rank order (plain tensors: rank 0's)."""
    out = {}
    for k, v in runs[0]["state"].items():
        out[k] = torch.cat([r["state"][k] for r in runs]) if v.dim() > 0 else v
    return out


def test_fsdp2_state_saved_by_four_replicas_loads_on_two_equal(tmp_path):
    # DCP's plans travel in the process group's gather/scatter of CPU tensors, which raised NotImplementedError
    folder = str(tmp_path / "latest")
    saved = lazyxla.spawn(W.replica_save, args=(folder, 1), nprocs=4, timeout_s=300)
    loaded = lazyxla.spawn(W.replica_load, args=(folder,), nprocs=2, timeout_s=300)
    want, got = _whole(saved), _whole(loaded)
    # the saved state is the CPU run's (each rank's loss over its quarter of the batch: their mean the whole's)
    model, batches = W.mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=W.LR, foreach=True)
    (ref_loss,) = W.train(model, opt, W.mlp_loss, batches[:1])
    assert abs(sum(r["losses"][0] for r in saved) / 4 - ref_loss) < 1e-5
    ref = W.cpu_state(model, opt)
    assert sorted(want) == sorted(ref) == sorted(got)
    for k in ref:
        torch.testing.assert_close(want[k], ref[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"saved {k}: {m}")
        assert torch.equal(got[k], want[k]), k  # loaded at 2 ranks exactly as saved at 4


# --- a rank killed mid-save --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint1(tmp_path_factory):
    """Checkpoint 1: the MLP after 1 step on 2 replicas, saved with AtomicFileSystemWriter; its folder and state."""
    folder = str(tmp_path_factory.mktemp("killed") / "latest")
    saved = lazyxla.spawn(W.replica_save, args=(folder, 1), nprocs=2, timeout_s=300)
    return folder, _whole(saved)


def _children() -> set[str]:
    """This process's child processes (their pids)."""
    mine = str(os.getpid())
    return {p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == mine}


def _ppid(proc: Path) -> str | None:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):  # it ended meanwhile
        return None


@pytest.mark.parametrize(
    ("how", "named"),
    [
        # rank 1 SIGKILLed: spawn names it at once; rank 0, waiting for its write results in the process group's
        # gather (the host exchange), is stopped
        ("SIGKILL", r"rank 1 was killed by signal SIGKILL"),
        # rank 1 hung (SIGSTOPped): nobody is killed, so rank 0 must leave the host exchange on its own, within
        # distributed_timeout_s, with an error naming it; spawn then stops the hung rank
        ("SIGSTOP", r"rank 0 raised:\nDistributedError: rendezvous\('pg/\d+'\) in process 0 of 2: not every process"),
    ],
)
def test_a_rank_lost_mid_save_ends_the_run_and_leaves_the_previous_checkpoint(
    checkpoint1, tmp_path, monkeypatch, how, named
):
    folder, previous = checkpoint1
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("LAZYXLA_DISTRIBUTED_TIMEOUT_S", "10")  # (read by the children at import)
    before = _children()  # (multiprocessing's resource tracker, started by the first spawn, stays)
    versions = set(Path(folder).parent.glob("latest.v-*"))
    start = time.monotonic()
    with pytest.raises(lazyxla.SpawnError, match=named) as caught:
        # checkpoint 2 (2 steps: other values) over checkpoint 1, rank 1 lost after writing its data file
        lazyxla.spawn(W.replica_save, args=(folder, 2, 1, str(pids), how), nprocs=2, timeout_s=200)
    took = time.monotonic() - start
    assert took < 120, f"the run took {took:.0f} s to end"
    assert sorted(f.name for f in pids.iterdir()) == ["rank0", "rank1"]
    assert caught.value.exitcodes[1] == -signal.SIGKILL  # (a stopped rank is SIGKILLed after SIGTERM's grace)
    assert [f.name for f in pids.iterdir() if Path("/proc", f.read_text()).exists()] == []  # every rank reaped
    assert _children() <= before
    # the lost save's rank 1 wrote its file into the new version's folder, which the link never pointed at
    (staged,) = set(Path(folder).parent.glob("latest.v-*")) - versions
    assert (staged / "__1_0.distcp").exists() and Path(folder).resolve() != staged
    _, _, loaded = W.cpu_load("mlp", folder)  # a new run (this process, no process group) reads checkpoint 1
    assert sorted(loaded) == sorted(previous)
    for k in previous:
        assert torch.equal(loaded[k], previous[k]), k
