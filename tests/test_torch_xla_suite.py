"""The torch_xla yardstick tools: ``lazyxla.tools.torch_xla_suite`` (runs test files under ``lazyxla.run``
and records each case) and ``lazyxla.tools.torch_xla_api`` (the API coverage table), on small files written
here in torch_xla's style; pytorch/xla's own source is not needed.
"""

from __future__ import annotations

import importlib.util
import textwrap

from lazyxla.tools import torch_xla_api as api
from lazyxla.tools import torch_xla_suite as suite
from lazyxla.tools import torch_xla_suite_reasons as reasons

UNITTEST_FILE = """
import sys, unittest
import torch, torch_xla
import torch_xla.core.xla_model as xm


class Cases(unittest.TestCase):
    def test_passes(self):
        t = torch.ones(3, device=torch_xla.device()) * 2
        self.assertEqual(t.cpu().tolist(), [2.0] * 3)

    def test_fails(self):
        self.assertEqual(1, 2)

    def test_errors(self):
        import torch_xla.no_such_module

    @unittest.skip("not on CPU")
    def test_skipped(self):
        pass

    def test_sub(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertLess(i, 2)


if __name__ == "__main__":
    test = unittest.main()
"""


def _source(tmp_path, files: dict[str, str]):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_each_case_of_a_unittest_file_is_recorded(tmp_path):
    src = _source(tmp_path, {"test/test_fake.py": UNITTEST_FILE})
    row = suite.run_file(src, "test/test_fake.py", suite.Setting(devices=1, timeout=180))
    outcomes = {c["id"].split(".")[-1].split(" ")[0]: (c["outcome"], c["reason"]) for c in row["cases"]}
    assert outcomes["test_passes"] == ("passed", "")
    assert outcomes["test_fails"][0] == "failed" and outcomes["test_errors"][0] == "error"
    assert outcomes["test_errors"][1] == "a torch_xla name the layer does not provide"
    assert outcomes["test_skipped"][0] == "skipped"
    assert outcomes["test_sub"][0] == "failed"  # the subtest i=2
    s = suite.summarize([row])
    assert (s["run"], s["passed"], s["skipped"]) == (4, 1, 1)


def test_scripts_count_once_and_time_limits_hold(tmp_path):
    src = _source(
        tmp_path,
        {
            "test/test_mp_ok.py": "import torch_xla\nprint(torch_xla.device())\n",
            "test/test_mp_bad.py": "import torch_xla.core.xla_model as xm\nxm.no_such_function()\n",
            "test/test_mp_slow.py": "import time\ntime.sleep(60)\n",
            # lazyxla's _XLAC has a few of torch_xla's C++ functions; this one it does not
            "test/test_unit_broken.py": "from torch_xla._XLAC import _xla_sync_multi\nimport unittest\n"
            "class T(unittest.TestCase):\n    def test_a(self): pass\n    def test_b(self): pass\n",
        },
    )
    ok = suite.run_file(src, "test/test_mp_ok.py", suite.Setting(devices=1))
    assert [c["outcome"] for c in ok["cases"]] == ["passed"]
    tpu_only = suite.run_file(src, "test/test_mp_ok.py", suite.Setting(devices=1, tpu_only=True))
    assert [c["outcome"] for c in tpu_only["cases"]] == ["skipped"]
    bad = suite.run_file(src, "test/test_mp_bad.py", suite.Setting(devices=1, known="known reason"))
    assert [(c["outcome"], c["reason"]) for c in bad["cases"]] == [
        ("failed", "a torch_xla name the layer does not provide")
    ]
    slow = suite.run_file(src, "test/test_mp_slow.py", suite.Setting(devices=1, timeout=3))
    assert [c["outcome"] for c in slow["cases"]] == ["timeout"] and slow["rc"] is None
    broken = suite.run_file(src, "test/test_unit_broken.py", suite.Setting(devices=1))
    assert [(c["id"], c["outcome"], c["reason"]) for c in broken["cases"]] == [
        ("T.test_a", "not run", reasons.XLAC),
        ("T.test_b", "not run", reasons.XLAC),
    ]
    files = [ok, bad, broken]
    s = suite.summarize(files)  # the cases needing torch_xla's C++ internals are outside python_api_run
    assert (s["passed"], s["run"], s["python_api_run"]) == (1, 4, 2)
    table = suite.markdown({"finished": "today", "source_commit": "abc", "seconds": 60, "cpus": 2, "files": files})
    assert "**1 of 2 test cases that use only torch_xla's public or `_internal` Python API passed (50%)**" in table
    assert "1 of 4 (25%)" in table and f"| *outside the API:* {reasons.XLAC} | 2 |" in table
    assert "| `test/test_mp_bad.py` | 0 / 1 | 0 |" in table
    assert "Without the files added to the selection later" not in table  # none of LATER_FILES ran
    # a file of LATER_FILES: the headline counts it, and a second figure gives the selection before it
    later = dict(bad, file=next(iter(suite.LATER_FILES)) + "test_new.py")
    run = {"finished": "today", "source_commit": "abc", "seconds": 60, "cpus": 2, "files": [*files, later]}
    table = suite.markdown(run)
    assert "**1 of 3 test cases that use only torch_xla's public or `_internal` Python API passed (33%)**" in table
    assert "Without the files added to the selection later" in table and "**1 of 2 (50%)**" in table


TWO_CLASSES = """
import sys, unittest


class A(unittest.TestCase):
    def test_rank0(self):
        pass

    def test_fails(self):
        self.assertEqual(sys.argv[1:], [])


class B(unittest.TestCase):
    def test_other(self):
        pass


if __name__ == "__main__":
    unittest.main()
"""


def test_a_run_limited_to_some_classes_counts_only_them(tmp_path):
    src = _source(tmp_path, {"test/test_two.py": TWO_CLASSES})
    row = suite.run_file(src, "test/test_two.py", suite.Setting(devices=1, cases=("A",)))
    # the file failed (its argv named the class): A's cases are recorded once each, B's are another run's
    outcomes = sorted((c["id"].split(".", 1)[1], c["outcome"]) for c in row["cases"])
    assert outcomes == [("A.test_fails", "failed"), ("A.test_rank0", "passed")]


def test_reasons_come_from_the_error_then_the_last_traceback():
    assert reasons.classify("RuntimeError: PyTorch is not linked with support for xla devices") == reasons.XLA_DEVICE
    assert reasons.classify("AssertionError: 1 != 2") == reasons.OTHER
    output = "noise TPU\nTraceback (most recent call last):\n  x\nModuleNotFoundError: No module named 'torchvision'\n"
    assert reasons.classify("SpawnError: spawn: rank 1 raised:", output) == "needs torchvision (not installed)"
    assert reasons.last_error("x\nValueError: bad\nSpawnError: rank 0 raised:\n") == "ValueError: bad"


def test_failures_reading_the_debug_bindings_name_what_differs():
    """Cases that call lazyxla's _XLAC debugging bindings and fail on torch_xla's own text (the errors of torch_xla's
    test/spmd/test_xla_sharding.py, test_fsdp_v2.py, test_xla_virtual_device.py, test_torch_distributed_xla_backend.py
    as lazyxla answers them) are sorted by what differs, outside the public API."""
    cases = {
        "AssertionError: '%p1.1 = f32[1,8]{1,0} parameter(1), sharding' not found in 'HloModule jit_fn, ...'": (
            reasons.HLO_NAMES
        ),
        "RuntimeError: Expected `nn.Linear` lowering to contain `%dot`. Full HLO: [test_scan_spmd.py:225]": (
            reasons.HLO_NAMES
        ),
        "AssertionError: 'opt-barrier.1 = (f32[1,64]{0,1}) opt-barrier(' not found in 'HloModule jit_fn'": (
            reasons.FSDPV2_BARRIER
        ),
        "AssertionError: HloModule jit_fn, entry_computation_layout={(s64[2]{0})->s64[2]{0}}": reasons.ONE_REPLICA_HLO,
        "AssertionError: 'Tensor on host: with size [5, 5]' not found in 'XLATensor {\nTensorID: 9'": reasons.HOST_COPY,
        "AssertionError: 'ShardingSpec: None' unexpectedly found in 'XLATensor {\n'": reasons.DYNAMO_OUTPUT_SPEC,
    }
    for detail, label in cases.items():
        assert reasons.classify(detail) == label, detail
        assert label in reasons.OUTSIDE_PYTHON_API


def test_api_table_reads_public_names_and_looks_them_up(tmp_path):
    src = _source(
        tmp_path,
        {
            "torch_xla/runtime.py": "A = 'A'\nB = object()\ndef world_size(): ...\ndef _private(): ...\n"
            "def no_such_name(): ...\nclass R: ...\n",
            "torch_xla/distributed/spmd/__init__.py": "from .xla_sharding import Mesh, mark_sharding\n"
            "from .api import auto_policy\n__all__ = ['Mesh' 'mark_sharding', 'auto_policy']\n",
            "torch_xla/core/dynamo_bridge.py": "def extract_compiled_graph(): ...\n",
        },
    )
    assert api.public_names(src / "torch_xla/runtime.py") == ["A", "R", "no_such_name", "world_size"]
    # an __all__ whose entries run together is not trusted: the package's imports are its names
    assert api.public_names(src / "torch_xla/distributed/spmd/__init__.py") == ["Mesh", "auto_policy", "mark_sharding"]
    rows = {(m, n): (s, note) for m, n, s, note in api.table(src)}
    assert rows[("torch_xla.runtime", "world_size")] == ("implemented", "")
    assert rows[("torch_xla.runtime", "no_such_name")] == ("missing", "not provided")
    assert rows[("torch_xla.distributed.spmd", "auto_policy")][0] == "partial"  # a fixed policy stands for XLA's pass
    assert rows[("torch_xla.core.dynamo_bridge", "extract_compiled_graph")][0] == (
        "implemented" if importlib.util.find_spec("lazyxla.compat.torch_xla.core.dynamo_bridge") else "missing"
    )
    text = api.markdown(api.table(src))
    assert text.startswith("8 public names in 3 modules") and "| `torch_xla.runtime` |" in text
