"""The PyTorch yardstick's runner (``lazyxla.tools.pytorch_suite``) on a tiny test folder written here: a
conftest speaking the same protocol as ``../shared/pytorch-tests/conftest.py`` (PTS_LOG, PTS_SKIP, PTS_ONLY,
PTS_MATCH, PTS_DEVICE), and a file whose tests pass, fail on lazyxla only, fail on both devices, segfault, hang, or are
listed. ``../shared`` is not needed; the children import neither torch nor lazyxla, so this takes seconds.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from lazyxla.tools import pytorch_suite as suite
from lazyxla.tools import pytorch_suite_reasons as reasons

CONFTEST = """
import json, os, re, time

_DEV = os.environ.get("PTS_DEVICE", "lazyxla")
_fh = open(os.environ["PTS_LOG"], "a", buffering=1) if os.environ.get("PTS_LOG") else None


def _w(rec):
    if _fh:
        _fh.write(json.dumps(rec) + "\\n")
        _fh.flush()


def _read(var):
    p = os.environ.get(var)
    return {ln.strip() for ln in open(p) if ln.strip()} if p and os.path.exists(p) else None


def pytest_collection_modifyitems(session, config, items):
    skip, only, match = _read("PTS_SKIP") or set(), _read("PTS_ONLY"), os.environ.get("PTS_MATCH")
    suffix = "PRIVATEUSE1" if _DEV == "lazyxla" else "CPU"
    keep = [it for it in items if it.cls.__name__.endswith(suffix) and it.nodeid not in skip
            and (only is None or it.nodeid in only) and (not match or re.search(match, it.nodeid))]
    items[:] = keep


def pytest_runtest_logstart(nodeid, location):
    _w({"event": "start", "nodeid": nodeid, "t": time.time()})


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        msg = "" if report.outcome == "passed" else report.longreprtext
        _w({"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail"), "duration": report.duration, "msg": msg})
"""

TESTS = """
import os, signal, time, unittest

DEV = os.environ.get("PTS_DEVICE", "lazyxla")


class Generic:
    def test_passes(self):
        self.assertEqual(1 + 1, 2)

    def test_ours(self):
        if DEV == "lazyxla":
            raise RuntimeError("index 7 is out of bounds for lazyxla:0")

    def test_ours_too(self):
        if DEV == "lazyxla":
            raise RuntimeError("index 9 is out of bounds for lazyxla:0")

    def test_gap(self):
        raise AttributeError("module 'torch' has no attribute 'old_name'")

    def test_segfaults(self):
        if DEV == "lazyxla":
            os.kill(os.getpid(), signal.SIGSEGV)

    def test_hangs(self):
        if DEV == "lazyxla":
            time.sleep(60)

    def test_sparse_listed(self):
        raise RuntimeError("not reached: listed")

    def test_zzz_after_crash(self):
        pass

    @unittest.skip("the test skips itself")
    def test_skips(self):
        pass


class TestThingsPRIVATEUSE1(Generic, unittest.TestCase):
    pass


class TestThingsCPU(Generic, unittest.TestCase):
    pass
"""
# pytest would name the lazyxla tests test_x (no device suffix here): cpu_twin maps only the class


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_fake.py").write_text(textwrap.dedent(TESTS))
    return tmp_path


def test_crash_isolation_cpu_twin_and_listing(folder):
    table = ((r"_sparse", "sparse layouts: a test of the table"),)
    limits = suite.Limits(test=5.0, file=120.0, budget=120.0)
    row = suite.run_file(folder, "test_fake.py", 1, None, limits, table=table)
    t = {nid.split("::")[-1]: r for nid, r in row["tests"].items()}
    assert t["test_passes"]["outcome"] == "passed"
    assert t["test_zzz_after_crash"]["outcome"] == "passed"  # ran in a process started after the crash
    assert t["test_segfaults"]["outcome"] == "crashed" and t["test_segfaults"]["signal"] == "SIGSEGV"
    assert t["test_segfaults"]["cpu"] == "passed"  # the CPU twin ran and passed: ours
    assert t["test_hangs"]["outcome"] == "timeout" and t["test_hangs"]["cpu"] == "passed"
    assert t["test_ours"]["outcome"] == "failed" and t["test_ours"]["cpu"] == "passed"
    assert t["test_gap"]["outcome"] == "failed" and t["test_gap"]["cpu"] == "failed"
    assert t["test_sparse_listed"] == {"outcome": "listed", "reason": "sparse layouts: a test of the table"}
    assert t["test_skips"]["outcome"] == "skipped"
    c = suite.file_counts(row)
    # run: passes, zzz, ours, ours_too, gap, segfaults, hangs; the gap leaves the denominator
    assert (c["run"], c["passed"], c["crashed"], c["timeout"], c["gap"], c["listed"]) == (7, 2, 1, 1, 1, 1)
    assert c["rate"] == pytest.approx(2 / 6)
    top = suite.causes([row])
    # the two out-of-bounds errors are one cause once numbers and devices are normalised; the gap is not counted
    assert top[0][:2] == ("RuntimeError: index N is out of bounds for DEV", 2)
    assert {k for k, _, _ in top} == {top[0][0], "the process died (SIGSEGV)", "ran past the per-test time limit"}
    text = suite.markdown(
        {
            "finished": "today",
            "commit": "abc",
            "torch": "2.13",
            "machine": "2 cores",
            "tests": "x",
            "seconds": 60,
            "files": [row],
        }
    )
    assert "| `test_fake.py` | 1/1 | 7 | 2 | 3 | 1 | 1 | 1 | 1 | 1 | 33.3% |" in text
    assert "test_segfaults`: SIGSEGV" in text


def test_time_bound_leaves_the_rest_not_run(folder):
    limits = suite.Limits(test=60.0, file=3.0, budget=60.0)
    row = suite.run_file(folder, "test_fake.py", 1, "hangs|zzz", limits)
    t = {nid.split("::")[-1]: r["outcome"] for nid, r in row["tests"].items()}
    assert t == {"test_hangs": "not run", "test_zzz_after_crash": "not run"}


def test_a_slow_entry_sets_its_tests_time_limit(folder, monkeypatch):
    monkeypatch.setattr(reasons, "SLOW", ((r"::test_hangs$", 2.0, "a test of the table: why it is slow"),))
    assert reasons.time_limit("test_fake.py::TestFake::test_hangs", 1.0) == 2.0
    assert reasons.time_limit("test_fake.py::TestFake::test_passes", 1.0) == 1.0
    limits = suite.Limits(test=0.5, file=60.0, budget=60.0)  # the hang is killed at its own 2 s, not at 0.5 s
    row = suite.run_file(folder, "test_fake.py", 1, "hangs|passes", limits)
    t = {nid.split("::")[-1]: r for nid, r in row["tests"].items()}
    assert t["test_hangs"]["outcome"] == "timeout" and "time limit of 2 s" in t["test_hangs"]["msg"]
    assert t["test_passes"]["outcome"] == "passed"


def test_cpu_twin_names():
    nid = "test_torch.py::TestTorchDeviceTypeLAZYXLA::test_abs_lazyxla_float32"
    assert suite.cpu_twin(nid) == "test_torch.py::TestTorchDeviceTypeCPU::test_abs_cpu_float32"
    nid = "test_view_ops.py::TestViewOpsPRIVATEUSE1::test_view_lazyxla"
    assert suite.cpu_twin(nid) == "test_view_ops.py::TestViewOpsCPU::test_view_cpu"


def test_reasons_table_shape():
    assert reasons.LISTED, "the table lists the true differences"
    for pattern, reason in reasons.LISTED:
        re.compile(pattern)
        assert len(reason) > 20 and ":" in reason, f"{pattern!r} needs a reason that says why: {reason!r}"
    for pattern, seconds, reason in reasons.SLOW:
        re.compile(pattern)
        assert seconds > suite.Limits.test and len(reason) > 20, (pattern, seconds, reason)
    for pattern, label in reasons.CAUSES:
        re.compile(pattern)
        assert label
    assert reasons.normalise("x\nE   IndexError: index 12 is out of range (0x7f3a)\nE   more") == (
        "IndexError: index N is out of range (ADDR)"
    )


def test_results_document(tmp_path):
    doc = tmp_path / "testing.md"
    doc.write_text(f"# t\n{suite.BEGIN}\nold\n{suite.END}\ntail\n")
    row = {"file": "a.py", "sample": 2, "seconds": 1.0, "tests": {"a.py::TCPU::test_x": {"outcome": "passed"}}}
    data = {"finished": "d", "commit": "c", "torch": "t", "machine": "m", "tests": "x", "seconds": 1, "files": [row]}
    suite.update_doc(data, doc)
    text = doc.read_text()
    assert "old" not in text and "| `a.py` | 1/2 | 1 | 1 |" in text and text.endswith("tail\n")
    json.dumps(data)  # results are plain JSON
