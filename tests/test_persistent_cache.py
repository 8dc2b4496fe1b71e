"""The persistent compilation cache: a second process loads the first one's executables instead of compiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.lowering import cache

ROOT = Path(__file__).resolve().parents[1]

# A tiny MLP trained 3 steps with SGD in a fresh process; prints losses, counters and the first step's time.
TRAIN = r"""
import json, time, warnings
import torch, torch.nn.functional as F
import lazyxla

warnings.simplefilter("always")
dev = lazyxla.device()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(6, 8).to(dev), torch.randint(0, 4, (6,)).to(dev)
losses, first = [], None
with warnings.catch_warnings(record=True) as caught:
    for step in range(3):
        t = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        losses.append(loss.item())
        first = time.perf_counter() - t if first is None else first
c = lazyxla.metrics.counters()
warned = [str(w.message) for w in caught if "cache" in str(w.message)]
t = lazyxla.metrics.timers()
print(json.dumps({"losses": losses, "first_step_s": first, "warnings": warned,
                  "lowered": t.get("lower", {}).get("count", 0), "xla_compiled": t.get("compile", {}).get("count", 0),
                  **{k: c[k] for k in ("compiles", "cache_hits", "persistent_cache_hits", "persistent_cache_misses")}}))
"""


def _train(tmp_path: Path, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LAZYXLA_", "JAX_COMPILATION_CACHE"))}
    full.update(PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(tmp_path / "xdg"), **env)
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN], env=full, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_second_process_loads_executables_instead_of_compiling(tmp_path):
    folder = tmp_path / "xla"
    first = _train(tmp_path, LAZYXLA_CACHE_DIR=str(folder))
    assert first["persistent_cache_hits"] == 0
    assert first["persistent_cache_misses"] == first["compiles"] > 0
    assert len([p for p in _files(folder) if p.name.endswith(".lxc")]) == first["compiles"]
    assert first["lowered"] == first["xla_compiled"] == first["compiles"]
    second = _train(tmp_path, LAZYXLA_CACHE_DIR=str(folder))
    assert second["persistent_cache_hits"] == second["compiles"] == first["compiles"]
    assert second["persistent_cache_misses"] == 0
    assert second["lowered"] == second["xla_compiled"] == 0  # loaded by the graph's digest: not even lowered
    assert second["cache_hits"] == first["cache_hits"]  # the in-memory cache behaves the same either way
    assert second["losses"] == first["losses"]
    assert not first["warnings"] and not second["warnings"]


def test_default_folder_is_under_the_user_cache_dir(tmp_path):
    out = _train(tmp_path)
    assert out["persistent_cache_misses"] > 0
    assert _files(tmp_path / "xdg" / "lazyxla" / "xla")


def test_off_switch_writes_nothing(tmp_path):
    folder = tmp_path / "xla"
    out = _train(tmp_path, LAZYXLA_CACHE_DIR=str(folder), LAZYXLA_PERSISTENT_CACHE="0")
    assert out["persistent_cache_hits"] == out["persistent_cache_misses"] == 0
    assert out["compiles"] > 0
    assert not _files(folder) and not _files(tmp_path / "xdg")


def test_unusable_folder_warns_once_and_trains(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    reference = _train(tmp_path, LAZYXLA_PERSISTENT_CACHE="0")
    out = _train(tmp_path, LAZYXLA_CACHE_DIR=str(tmp_path / "file" / "xla"))
    assert out["losses"] == reference["losses"]
    assert out["persistent_cache_hits"] == out["persistent_cache_misses"] == 0
    assert len(out["warnings"]) == 1
    assert "persistent compilation cache" in out["warnings"][0] and "LAZYXLA_CACHE_DIR" in out["warnings"][0]


# In-process checks (this process's jax state is shared with the other tests: each one restores it).

def _step(dev, n: int) -> float:
    x = torch.arange(float(n)).to(dev)
    return (x * 3 + 1).sum().item()


def test_corrupt_entry_is_dropped_and_recompiled(tmp_path, dev, monkeypatch):
    monkeypatch.setattr(cache, "_warned", set())
    with lazyxla.config.override(persistent_cache=True, cache_dir=str(tmp_path)):
        cache.clear()
        assert _step(dev, 7) == 70.0
        entries = [p for p in _files(tmp_path) if p.name.endswith(".lxc")]
        assert len(entries) == 1
        entries[0].write_bytes(b"garbage")
        cache.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert _step(dev, 7) == 70.0
        assert [str(w.message) for w in caught if "could not be loaded" in str(w.message)]
        assert entries[0].read_bytes() != b"garbage"  # written afresh
        cache.clear()
        before = lazyxla.metrics.counters()["persistent_cache_hits"]
        assert _step(dev, 7) == 70.0
        assert lazyxla.metrics.counters()["persistent_cache_hits"] == before + 1
    cache.clear()


def test_user_jit_compiles_do_not_use_lazyxla_folder(tmp_path, dev):
    import jax.numpy as jnp

    with lazyxla.config.override(persistent_cache=True, cache_dir=str(tmp_path)):
        cache.clear()
        _step(dev, 5)
        written = _files(tmp_path)
        assert written
        jax.jit(lambda a: jnp.sin(a) * 41.5)(jnp.ones(3)).block_until_ready()
        assert _files(tmp_path) == written
        assert jax.config.jax_compilation_cache_dir is None  # the user's jax configuration is untouched
    cache.clear()


@pytest.mark.parametrize("value", ["", "0", "off"])
def test_persistent_cache_flag_parses(value, monkeypatch):
    from lazyxla.config import _Config

    monkeypatch.setenv("LAZYXLA_PERSISTENT_CACHE", value)
    assert _Config().persistent_cache is False


def test_a_failing_load_falls_back_to_compiling(tmp_path, dev, monkeypatch):
    from jax.experimental import serialize_executable

    def broken(*args, **kwargs):
        raise RuntimeError("deliberately broken")

    monkeypatch.setattr(cache, "_warned", set())
    with lazyxla.config.override(persistent_cache=True, cache_dir=str(tmp_path)):
        cache.clear()
        _step(dev, 4)  # writes the entry
        cache.clear()
        monkeypatch.setattr(serialize_executable, "deserialize_and_load", broken)
        with pytest.warns(RuntimeWarning, match="could not be loaded.*deliberately broken"):
            assert _step(dev, 4) == 22.0
    cache.clear()


def test_the_disk_key_tells_apart_graphs_that_differ_only_in_a_constant(tmp_path, dev):
    """Entries are named by the graph's contents: a different constant argument is a different program."""
    with lazyxla.config.override(persistent_cache=True, cache_dir=str(tmp_path)):
        cache.clear()
        m = torch.arange(9.0).reshape(3, 3).to(dev)
        assert m.sum(dim=0).tolist() == [9.0, 12.0, 15.0]
        assert m.sum(dim=1).tolist() == [3.0, 12.0, 21.0]  # same shapes, another constant
        assert len([p for p in _files(tmp_path) if p.name.endswith(".lxc")]) == 2
        cache.clear()
        hits = lazyxla.metrics.counters()["persistent_cache_hits"]
        assert m.sum(dim=1).tolist() == [3.0, 12.0, 21.0]  # loaded, and the right one
        assert m.sum(dim=0).tolist() == [9.0, 12.0, 15.0]
        assert lazyxla.metrics.counters()["persistent_cache_hits"] == hits + 2
    cache.clear()


def _sgd_run(dev) -> list[torch.Tensor]:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(5, 8).to(dev), torch.randint(0, 3, (5,)).to(dev)
    for _ in range(3):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
    return [p.cpu() for p in model.parameters()]


def test_results_are_the_same_with_the_disk_cache_on_or_off(tmp_path, dev):
    cache.clear()
    with lazyxla.config.override(persistent_cache=False):
        off = _sgd_run(dev)
    cache.clear()
    with lazyxla.config.override(persistent_cache=True, cache_dir=str(tmp_path)):
        on = _sgd_run(dev)
        assert lazyxla.metrics.counters()["persistent_cache_misses"] > 0
    cache.clear()
    for a, b in zip(off, on):
        assert torch.equal(a, b)


_HASHES = """
import torch, lazyxla
from lazyxla.lazy.tensor import unwrap
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("lazyxla")
opt = torch.optim.AdamW(model.parameters())
x, y = torch.randn(3, 4).to("lazyxla"), torch.randn(3).to("lazyxla")
loss = model(x).sum() + (x * 2).sum() + (y * 2).sum()
loss.backward()
opt.step()
print([unwrap(t)._value[0].hash for t in [loss, *model.parameters()]])
"""


def test_graph_hashes_are_the_same_in_every_process():
    """A sync orders a program's arguments and results by node hashes; they must not depend on the
    process (Python's hash() of strings and dtypes does), or the disk cache would never hit."""
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, LAZYXLA_PERSISTENT_CACHE="0")
        proc = subprocess.run([sys.executable, "-c", _HASHES], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.add(proc.stdout.strip().splitlines()[-1])
    assert len(outs) == 1, outs
