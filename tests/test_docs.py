"""The README and the migration guide say what the code does: the flag list is config's, the rule count is
the rule table's (to 5%), the jax range is pyproject's and jax_private's, the example counts are the folder's."""

from __future__ import annotations

import re
from pathlib import Path

from lazyxla.config import FLAGS
from lazyxla.jax_private import SUPPORTED_JAX
from lazyxla.lowering.registry import RULES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
MIGRATION = (ROOT / "docs" / "migrating-from-torch_xla.md").read_text()
NUMBERS = dict(
    enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven"])
)


def test_readme_lists_every_flag_and_no_other():
    section = README.split("## Configuration", 1)[1].split("Compiled programs are also kept", 1)[0]
    listed = set(re.findall(r"`([a-z0-9_]+)`", section)) - {"lazyxla", "xla"}  # device_name's two values
    assert listed == {f.name for f in FLAGS}, (
        sorted(listed - {f.name for f in FLAGS}),
        "missing:",
        sorted({f.name for f in FLAGS} - listed),
    )


def test_readme_rule_count_is_the_rule_tables():
    said = int(re.search(r"About (\d+) lowering rules", README).group(1))
    assert abs(said - len(RULES)) <= 0.05 * len(RULES), (said, len(RULES))


def test_readme_jax_range_is_pyprojects():
    pyproject = (ROOT / "pyproject.toml").read_text()
    pinned = re.search(r'"jax>=([0-9.]+),<([0-9.]+)"', pyproject)
    low, high = SUPPORTED_JAX
    assert pinned.group(1).startswith(f"{low[0]}.{low[1]}.") and pinned.group(2) == f"{high[0]}.{high[1] + 1}"
    said = re.search(r"Requirements: [^\n]*?jax ([0-9.]+)(?:–([0-9.]+))?", README)
    assert (said.group(1), said.group(2) or said.group(1)) == (f"{low[0]}.{low[1]}", f"{high[0]}.{high[1]}"), said[0]


def test_example_counts_are_the_folders():
    scripts = sorted(p.name for p in (ROOT / "examples" / "torch_xla").glob("*.py") if "__main__" in p.read_text())
    word = NUMBERS[len(scripts)]
    assert f"`examples/torch_xla/` has {word} such" in README, (word, scripts)
    assert f"`examples/torch_xla/` holds {word} scripts" in MIGRATION, (word, scripts)
    paragraph = MIGRATION.split(f"`examples/torch_xla/` holds {word} scripts", 1)[1].split("\n\n", 1)[0]
    assert all(f"`{name}`" in paragraph for name in scripts), [n for n in scripts if f"`{n}`" not in paragraph]
