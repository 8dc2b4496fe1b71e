"""examples/train_ddp.py runs the same under lazyxla.spawn and under torchrun, with the same result."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

import lazyxla

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"


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


def _run(args: list[str], out: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), LAZYXLA_PERSISTENT_CACHE="0")
    proc = subprocess.run(
        [*args, str(SCRIPT), "--epochs", "2", "--out", str(out)],
        env=env,
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("final loss "), proc.stdout[-2000:]
    return last


def test_the_same_script_under_spawn_and_torchrun(tmp_path):
    spawned = _run([sys.executable], tmp_path / "spawn")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(_free_pair())]
    launched = _run(torchrun, tmp_path / "torchrun")
    assert spawned == launched
    assert 0.0 < float(spawned.split()[-1]) < 1.4  # it learned something (chance level is ln 4 = 1.386)
    state = lazyxla.load(tmp_path / "spawn" / "checkpoint.pt")
    assert state["epoch"] == 1 and set(state["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in state["model"].values())
