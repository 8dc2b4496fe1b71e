"""Every core ATen op has a lowering: a rule, a decomposition, or a special case (no CPU fallback)."""

from __future__ import annotations

import pytest

from lazyxla.lazy.record import status_of
from lazyxla.tools import coverage

# Core ATen ops that still run on the CPU, each with why. The list may only shrink: the test fails
# when an op here gets a lowering (remove it) or a new core op falls back (lower it).
KNOWN_CORE_FALLBACKS: dict[str, str] = {}


def test_core_aten_ops_do_not_fall_back():
    falling = {str(op) for op in coverage.core_aten_ops() if status_of(op) == "fallback"}
    assert falling - set(KNOWN_CORE_FALLBACKS) == set(), "core ATen ops without a lowering"
    assert set(KNOWN_CORE_FALLBACKS) - falling == set(), "lowered now: remove them from KNOWN_CORE_FALLBACKS"


def test_coverage_tool_runs(capsys, tmp_path):
    out = tmp_path / "ops.md"
    assert coverage.main(["--markdown", str(out), "--results", str(tmp_path / "none.json")]) == 0
    text = capsys.readouterr().out
    assert "core ATen overloads" in text and "run `make test-ops`" in text
    md = out.read_text()
    assert "| `aten.add.Tensor` | rule |" in md


@pytest.mark.parametrize("outcome,expected", [("passed", (1, 1, 0)), ("failed", (0, 1, 0)), ("skipped", None)])
def test_pass_rates(outcome, expected):
    results = {"results": [{"kind": "forward", "dtype": "float32", "outcome": outcome, "fallbacks": []}]}
    assert coverage.pass_rates(results).get(("forward", "float32")) == expected
