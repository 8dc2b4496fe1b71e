"""examples/train_fsdp2.py: PyTorch's FSDP2 (and FSDP2 x tensor parallel) on lazyxla's SPMD mode, and FSDP2 under
torchrun (one process per device), train the same model to the same losses as eager PyTorch on the CPU, run as a
user runs it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_fsdp2.py"


def _losses(*args: str, launcher: tuple[str, ...] = ()) -> tuple[list[float], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), LAZYXLA_PERSISTENT_CACHE="0")
    cmd = [sys.executable, *launcher, str(SCRIPT), "--steps", "4", "--log-every", "1", *args]
    # (a session of its own: on a timeout the launcher's children are killed with it)
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd} ran past 600 s: {err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    return [float(v) for v in re.findall(r"step +\d+ loss ([0-9.]+)", out)], out


def _free_pair() -> int:
    """A port P with P + 1 free too (torchrun's store on P, jax's coordinator on P + 1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")


@pytest.fixture(scope="module")
def cpu_losses():
    losses, _ = _losses("--device", "cpu")
    assert len(losses) == 4
    return losses


@pytest.mark.parametrize(
    "args, placements",
    [((), "(Shard(dim=0),)"), (("--tp", "4"), "(_StridedShard(dim=0, sf=4), Shard(dim=0))")],
    ids=["fsdp2", "fsdp2-x-tp"],
)
def test_train_fsdp2_equals_cpu_eager(cpu_losses, args, placements):
    losses, out = _losses(*args)
    assert losses == pytest.approx(cpu_losses, rel=1e-4)
    assert f"DTensor (128, 64) {placements}" in out  # the parameter is FSDP2's (and TP's) DTensor, laid out


def test_train_fsdp2_under_torchrun_equals_cpu_eager(cpu_losses):
    # one process per device: init_process_group("lazyxla"), each rank on its rows, FSDP2's collectives in-graph
    torchrun = ("-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1")
    losses, out = _losses(launcher=(*torchrun, "--master-port", str(_free_pair())))
    assert losses == pytest.approx(cpu_losses, rel=1e-4)  # the whole batch's loss, averaged over the two ranks
    assert out.count("DTensor (128, 64) (Shard(dim=0),)") == 1  # rank 0 reports; each rank holds half a weight
