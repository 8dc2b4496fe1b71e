"""lazyxla.save / lazyxla.load: nested state with device tensors, written atomically."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lazyxla

ROOT = Path(__file__).resolve().parents[1]


def test_round_trip_of_nested_state(dev, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3).to(dev)).sum().backward()
    opt.step()
    extra = [torch.ones(2).to(dev), (1, "a")]
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 3, "extra": extra}
    path = tmp_path / "ckpt.pt"
    lazyxla.save(state, path)
    on_cpu = lazyxla.load(path)
    assert isinstance(on_cpu["model"], collections.OrderedDict)
    assert on_cpu["epoch"] == 3 and on_cpu["extra"][1] == (1, "a")
    for k, v in model.state_dict().items():
        assert on_cpu["model"][k].device.type == "cpu"
        assert torch.equal(on_cpu["model"][k], v.cpu())
    on_dev = lazyxla.load(path, device=dev)
    assert on_dev["extra"][0].device.type == "lazyxla"
    fresh = torch.nn.Linear(3, 2).to(dev)
    fresh.load_state_dict(on_dev["model"])
    assert torch.equal(fresh.weight.cpu(), model.weight.cpu())
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].cpu()
    assert torch.equal(on_cpu["opt"]["state"][0]["momentum_buffer"], momentum)


# A process that saves a large checkpoint over an existing one and is killed in the middle of writing it.
_KILLED_MID_SAVE = r"""
import os, sys, time, torch, lazyxla
from lazyxla.parallel import training
path, marker = sys.argv[1], sys.argv[2]
real_fsync = os.fsync
def slow_fsync(fd):
    open(marker, "w").close()   # the temporary file is written: tell the test, then wait to be killed
    time.sleep(60)
    real_fsync(fd)
os.fsync = slow_fsync
lazyxla.save({"w": torch.full((1000, 1000), 7.0).to(lazyxla.device()), "epoch": 2}, path)
"""


def test_a_save_into_a_missing_folder_raises_as_torch_save(dev, tmp_path):
    path = tmp_path / "missing" / "ckpt.pt"
    with pytest.raises(RuntimeError) as reference:
        torch.save({"w": torch.ones(2)}, path)
    with pytest.raises(RuntimeError) as ours:
        lazyxla.save({"w": torch.ones(2, device=dev)}, path)
    assert str(ours.value).startswith(str(reference.value)), (str(ours.value), str(reference.value))
    assert str(tmp_path / "missing") in str(ours.value)
    assert not (tmp_path / "missing").exists()


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint_intact(dev, tmp_path):
    path = tmp_path / "ckpt.pt"
    lazyxla.save({"w": torch.ones(3).to(dev), "epoch": 1}, path)
    before = path.read_bytes()
    marker = tmp_path / "writing"
    env = dict(os.environ, PYTHONPATH=str(ROOT), LAZYXLA_PERSISTENT_CACHE="0")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_MID_SAVE, str(path), str(marker)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, "the saving process ended before it was killed"
            assert time.monotonic() < deadline, "the saving process never started writing"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert path.read_bytes() == before
    state = lazyxla.load(path)
    assert state["epoch"] == 1 and torch.equal(state["w"], torch.ones(3))
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(f".ckpt.pt.tmp.{proc.pid}.")]
    assert partial.stat().st_size > 0  # the killed writer's temporary file: named after the file and its pid
    lazyxla.save({"w": torch.zeros(2).to(dev), "epoch": 3}, path)
    assert not partial.exists()  # the next save of the file removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "writing"]
    state = lazyxla.load(path)
    assert state["epoch"] == 3 and torch.equal(state["w"], torch.zeros(2))


def test_a_save_removes_only_its_own_files_stale_temporaries(dev, tmp_path):
    from lazyxla import util

    probe = [sys.executable, "-c", "import os; print(os.getpid())"]
    proc = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    dead = int(proc.stdout)  # a process that has exited
    host = util._HOST
    stale = tmp_path / f".ckpt.pt.tmp.{dead}.0123abcd.{host}"
    live = tmp_path / f".ckpt.pt.tmp.{os.getpid()}.4567abcd.{host}"  # another thread of a running writer
    other_target = tmp_path / f".other.pt.tmp.{dead}.89abcdef.{host}"
    mkstemp_like = tmp_path / ".ckpt.pt.x1y2z3.tmp"  # not named as lazyxla names its temporaries: not ours
    for p in (stale, live, other_target, mkstemp_like):
        p.write_bytes(b"partial")
    lazyxla.save({"epoch": 4, "w": torch.arange(3).to(dev)}, tmp_path / "ckpt.pt")
    assert not stale.exists()
    assert live.exists() and other_target.exists() and mkstemp_like.exists()
    state = lazyxla.load(tmp_path / "ckpt.pt")
    assert state["epoch"] == 4 and torch.equal(state["w"], torch.arange(3))
