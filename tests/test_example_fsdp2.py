"""examples/train_fsdp2.py: PyTorch's FSDP2 (and FSDP2 x tensor parallel) on lazyxla's SPMD mode trains the same
model to the same losses as eager PyTorch on the CPU, run as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_fsdp2.py"


def _losses(*args: str) -> tuple[list[float], str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LAZYXLA_PERSISTENT_CACHE="0")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "4", "--log-every", "1", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [float(v) for v in re.findall(r"step +\d+ loss ([0-9.]+)", proc.stdout)], proc.stdout


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
