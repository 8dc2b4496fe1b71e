"""The persistent compilation cache: a second process loads the first one's executables instead of compiling."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import jax
import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla import util
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


def _entries(folder: Path) -> list[Path]:
    return sorted(p for p in _files(folder) if p.name.endswith(".lxc"))


@pytest.fixture
def disk_cache(tmp_path, monkeypatch):
    """The persistent cache on, in a fresh folder of this test's (warnings and folder checks forgotten)."""
    monkeypatch.setattr(util, "_warned", set())
    monkeypatch.setattr(cache, "_broken", {})
    monkeypatch.setattr(cache, "_ready", type(cache._ready)())
    folder = tmp_path / "xla"
    with lazyxla.config.override(persistent_cache=True, cache_dir=str(folder)):
        cache.clear()
        yield folder
    cache.clear()


def _caught(fn):
    """``fn()`` and the texts of the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped byte"])
def test_corrupt_entry_is_dropped_and_recompiled(disk_cache, dev, damage):
    assert _step(dev, 7) == 70.0
    entries = _entries(disk_cache)
    assert len(entries) == 1
    good = entries[0].read_bytes()
    bad = {
        "garbage": b"garbage",
        "truncated": good[: len(good) // 2],
        "flipped byte": good[:-100] + bytes([good[-100] ^ 1]) + good[-99:],
    }[damage]
    entries[0].write_bytes(bad)
    cache.clear()
    value, warned = _caught(lambda: _step(dev, 7))
    assert value == 70.0
    assert len([w for w in warned if "could not be loaded" in w]) == 1, warned
    assert entries[0].read_bytes() not in (bad, b"")  # written afresh
    cache.clear()
    before = lazyxla.metrics.counters()["persistent_cache_hits"]
    assert _step(dev, 7) == 70.0
    assert lazyxla.metrics.counters()["persistent_cache_hits"] == before + 1


def test_an_entry_copied_under_another_programs_name_is_not_used(disk_cache, dev):
    """A valid entry (same folder, same key) stored under another program's name is a miss, not its results."""
    m = torch.arange(9.0).reshape(3, 3).to(dev)
    assert m.sum(dim=0).tolist() == [9.0, 12.0, 15.0]
    (columns,) = _entries(disk_cache)
    assert m.sum(dim=1).tolist() == [3.0, 12.0, 21.0]  # same shapes and program signature, another constant
    (rows,) = set(_entries(disk_cache)) - {columns}
    rows.write_bytes(columns.read_bytes())  # the row sums' name now holds the column sums' program
    cache.clear()
    counters = lazyxla.metrics.counters()
    value, warned = _caught(lambda: m.sum(dim=1).tolist())
    assert value == [3.0, 12.0, 21.0]
    assert len([w for w in warned if "another program" in w]) == 1, warned
    after = lazyxla.metrics.counters()
    assert after["persistent_cache_hits"] == counters["persistent_cache_hits"]
    assert after["persistent_cache_misses"] == counters["persistent_cache_misses"] + 1
    assert rows.read_bytes() != columns.read_bytes()  # rewritten with its own program
    cache.clear()
    assert m.sum(dim=1).tolist() == [3.0, 12.0, 21.0]
    assert m.sum(dim=0).tolist() == [9.0, 12.0, 15.0]
    assert lazyxla.metrics.counters()["persistent_cache_hits"] == after["persistent_cache_hits"] + 2


class _Plant:
    """A pickle that, when unpickled, creates a file (as an attacker's command would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("form", ["v1 checksum", "forged tag"])
def test_a_planted_entry_is_never_unpickled(disk_cache, dev, tmp_path, form):
    """An entry written by someone without the folder's key is rejected before any of it is unpickled."""
    import hashlib
    import hmac
    import pickle

    assert _step(dev, 6) == 51.0
    (entry,) = _entries(disk_cache)
    marker = tmp_path / "the-attacker-ran"
    payload = pickle.dumps(_Plant(marker))
    if form == "v1 checksum":  # the format of the unauthenticated cache: a checksum anyone can compute
        planted = b"lazyxla-executable-v1\n" + hashlib.blake2b(payload, digest_size=32).digest() + payload
    else:  # today's format, its name and environment right, tagged with a guessed key
        body = bytes.fromhex(entry.name[: -len(".lxc")]) + cache._environment_digest() + payload
        planted = cache._MAGIC + hmac.new(os.urandom(32), cache._MAGIC + body, hashlib.sha256).digest() + body
    entry.write_bytes(planted)
    cache.clear()
    value, warned = _caught(lambda: _step(dev, 6))
    assert value == 51.0
    assert not marker.exists(), "the planted pickle was unpickled"
    assert len([w for w in warned if "could not be loaded" in w]) == 1, warned
    assert entry.read_bytes() != planted


def _refused(dev, folder: Path) -> list[str]:
    """Run two programs with the cache in ``folder``: right results, nothing written; the warnings."""
    before = sorted(folder.rglob("*"))
    counters = lazyxla.metrics.counters()

    def run():
        return _step(dev, 5), _step(dev, 6)

    values, warned = _caught(run)
    assert values == (35.0, 51.0)
    after = lazyxla.metrics.counters()
    for name in ("persistent_cache_hits", "persistent_cache_misses"):
        assert after[name] == counters[name], name
    assert sorted(folder.rglob("*")) == before
    return [w for w in warned if "persistent compilation cache" in w]


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_folder_others_can_write_turns_the_cache_off(disk_cache, dev, mode):
    disk_cache.mkdir(mode=0o700)
    os.chmod(disk_cache, mode)
    warned = _refused(dev, disk_cache)
    assert len(warned) == 1, warned
    assert "writable by" in warned[0] and "chmod go-w" in warned[0] and "is off" in warned[0]


@pytest.mark.parametrize("mode", [0o1777, 0o1770])
def test_a_shared_folder_is_never_advised_a_chmod(disk_cache, dev, mode):
    # a sticky folder others write to by design (as /tmp): the advice is a private subfolder, which then works
    disk_cache.mkdir(mode=0o700)
    os.chmod(disk_cache, mode)
    warned = _refused(dev, disk_cache)
    assert len(warned) == 1 and "writable by" in warned[0], warned
    assert "chmod" not in warned[0] and "private subfolder" in warned[0], warned
    private = re.search(r"LAZYXLA_CACHE_DIR=(\S+) \(created 0700\)", warned[0]).group(1)
    assert os.path.dirname(private) == str(disk_cache)
    with lazyxla.config.override(cache_dir=private):
        cache.clear()
        assert _step(dev, 5) == 35.0
        assert len(_entries(Path(private))) == 1


def test_a_folder_of_another_user_turns_the_cache_off(disk_cache, dev, monkeypatch):
    disk_cache.mkdir(mode=0o700)
    monkeypatch.setattr(cache, "_uid", lambda: os.stat(disk_cache).st_uid + 1)  # as if it were someone else's
    warned = _refused(dev, disk_cache)
    assert len(warned) == 1 and "belongs to another user" in warned[0], warned


def test_under_the_user_cache_root_parents_are_checked_and_created_private(tmp_path, dev, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(util, "_warned", set())
    monkeypatch.setattr(cache, "_broken", {})
    monkeypatch.setattr(cache, "_ready", type(cache._ready)())
    folder = tmp_path / "xdg" / "lazyxla" / "xla"
    with lazyxla.config.override(persistent_cache=True, cache_dir=str(folder)):
        cache.clear()
        assert _step(dev, 5) == 35.0
        for made in (folder.parent, folder):
            assert made.stat().st_mode & 0o777 == 0o700, made
        assert (folder / "hmac-key").stat().st_mode & 0o777 == 0o600
        assert len(_entries(folder)) == 1
        os.chmod(folder.parent, 0o777)  # someone else could now swap lazyxla/xla for a folder of theirs
        monkeypatch.setattr(cache, "_ready", type(cache._ready)())
        cache.clear()
        warned = _refused(dev, folder.parent)
    cache.clear()
    assert len(warned) == 1 and str(folder.parent) in warned[0] and "writable by" in warned[0], warned


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_key_file_others_can_read_is_refused(disk_cache, dev, mode):
    disk_cache.mkdir(mode=0o700)
    key = disk_cache / "hmac-key"
    key.write_bytes(os.urandom(32))
    os.chmod(key, mode)
    warned = _refused(dev, disk_cache)
    assert len(warned) == 1 and "key file" in warned[0] and "chmod 600" in warned[0], warned


def test_processes_share_the_folder_key(disk_cache, dev):
    """The key is made once and kept: a new process (here: forgetting the checked folder) loads the entry."""
    assert _step(dev, 9) == 117.0
    key = (disk_cache / "hmac-key").read_bytes()
    cache._ready.clear()
    cache.clear()
    hits = lazyxla.metrics.counters()["persistent_cache_hits"]
    assert _step(dev, 9) == 117.0
    assert lazyxla.metrics.counters()["persistent_cache_hits"] == hits + 1
    assert (disk_cache / "hmac-key").read_bytes() == key


def test_least_recently_used_entries_are_evicted_beyond_the_cap(disk_cache, dev):
    programs = {n: 3 * n * (n - 1) / 2 + n for n in (3, 4, 5, 6)}  # arange(n) * 3 + 1, summed
    for n in (3, 4, 5):
        assert _step(dev, n) == programs[n]
    named = {}
    for n, entry in zip((3, 4, 5), sorted(_entries(disk_cache), key=lambda p: p.stat().st_mtime_ns)):
        named[n] = entry
    # the write order, made unambiguous (a file system's clock may not tell apart writes a moment apart)
    now = time.time()
    for age, n in ((300, 3), (200, 4), (100, 5)):
        os.utime(named[n], (now - age, now - age))
    sizes = [p.stat().st_size for p in named.values()]
    cap = sum(sizes) + min(sizes) // 2  # room for three entries, not four
    with lazyxla.config.override(persistent_cache_max_bytes=cap):
        cache.clear()
        assert _step(dev, 3) == programs[3]  # a load: 3 becomes the most recently used
        assert _step(dev, 6) == programs[6]  # a fourth entry: the least recently used one (4) goes
        left = _entries(disk_cache)
        assert sum(p.stat().st_size for p in left) <= cap
        assert named[4] not in left and named[3] in left and named[5] in left and len(left) == 3
        assert lazyxla.metrics.counters()["persistent_cache_evictions"] == 1
        cache.clear()
        hits = lazyxla.metrics.counters()["persistent_cache_hits"]
        assert _step(dev, 5) == programs[5] and _step(dev, 3) == programs[3]
        assert lazyxla.metrics.counters()["persistent_cache_hits"] == hits + 2
        assert _step(dev, 4) == programs[4]  # evicted: compiled again
        assert lazyxla.metrics.counters()["persistent_cache_hits"] == hits + 2
        assert sum(p.stat().st_size for p in _entries(disk_cache)) <= cap


def test_an_entry_larger_than_the_cap_is_not_kept(disk_cache, dev):
    with lazyxla.config.override(persistent_cache_max_bytes=100):
        value, warned = _caught(lambda: _step(dev, 8))
    assert value == 92.0
    assert not _entries(disk_cache)
    assert len([w for w in warned if "larger than" in w and "PERSISTENT_CACHE_MAX_BYTES" in w]) == 1, warned


def _dead_pid() -> int:
    probe = [sys.executable, "-c", "import os; print(os.getpid())"]
    proc = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    return int(proc.stdout)  # exited and reaped


def test_temporary_files_of_killed_writers_are_removed_when_the_folder_is_opened(disk_cache, dev):
    from lazyxla import util

    disk_cache.mkdir(mode=0o700)
    name = "0" * 64 + ".lxc"
    dead = disk_cache / f".{name}.tmp.{_dead_pid()}.0123abcd.{util._HOST}"
    writing = disk_cache / f".{name}.tmp.{os.getpid()}.4567abcd.{util._HOST}"  # a live writer's
    elsewhere = disk_cache / f".{name}.tmp.1.89abcdef.another-host"  # a writer on another host sharing the folder
    abandoned = disk_cache / f".{name}.tmp.1.cdef0123.another-host"
    unrelated = disk_cache / "notes.tmp"
    for p in (dead, writing, elsewhere, abandoned, unrelated):
        p.write_bytes(b"partial")
    two_days = time.time() - 2 * 24 * 3600
    os.utime(abandoned, (two_days, two_days))
    assert _step(dev, 5) == 35.0
    assert not dead.exists() and not abandoned.exists()
    assert writing.exists() and elsewhere.exists() and unrelated.exists()
    assert len(_entries(disk_cache)) == 1


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

    monkeypatch.setattr(util, "_warned", set())
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


def _edit(path: Path) -> None:
    path.write_text(path.read_text() + "\n# an edit\n")


def test_the_code_digest_covers_program_code_only(tmp_path):
    """Editing the torch_xla layer (or tools, launchers, diagnostics) keeps every cached executable;
    editing a lowering rule does not."""
    package = tmp_path / "lazyxla"
    shutil.copytree(ROOT / "lazyxla", package, ignore=shutil.ignore_patterns("__pycache__"))
    before = cache.code_digest(str(package))
    assert before == cache.code_digest()  # named by paths inside the package, wherever it lies
    _edit(package / "compat" / "torch_xla" / "core" / "xla_model.py")
    _edit(package / "tools" / "coverage.py")
    _edit(package / "observe" / "diagnostics.py")
    assert cache.code_digest(str(package)) == before
    _edit(package / "lowering" / "rules" / "pointwise.py")
    assert cache.code_digest(str(package)) != before


def test_every_file_of_the_package_is_declared_program_code_or_not():
    """A new or moved file must be a decision in ``cache.PROGRAM_CODE``, and no entry may name a file that
    is gone (after a move, it would leave the moved code out of the digest or in it by accident)."""
    files = cache.package_files()
    assert "lowering/rules/pointwise.py" in files
    assert [f for f in files if cache.code_entry(f) is None] == []
    assert [e for e in cache.PROGRAM_CODE if not any(cache.code_entry(f) == e for f in files)] == []


def test_every_rank_of_a_multi_process_run_loads_its_programs_in_the_next_run(tmp_path):
    # Each rank has a lazyxla:0, but XLA binds a program to the rank's own device: keyed by the local index,
    # both ranks wrote one entry, and in the next run one rank met "could not be loaded (KeyError: 2048)"
    import replica_workers as W  # tests/ is on sys.path (pytest puts it there); the children import it by name

    folder = str(tmp_path / "xla")
    first = lazyxla.spawn(W.cached_training, args=(folder,), nprocs=2, timeout_s=180)
    second = lazyxla.spawn(W.cached_training, args=(folder,), nprocs=2, timeout_s=180)
    for rank, (a, b) in enumerate(zip(first, second)):
        # (the all-reduce's program spans both ranks' devices: one entry, which the later rank may load)
        assert a["hits"] + a["misses"] == a["compiles"] > a["hits"], (rank, a)
        assert b["hits"] == b["compiles"] == a["compiles"] and b["misses"] == 0, (rank, b)
        assert a["warnings"] == b["warnings"] == [], rank
        assert b["losses"] == a["losses"]
