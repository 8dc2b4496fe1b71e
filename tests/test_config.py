"""lazyxla.config: environment values checked at import with the variable's name, misspelled LAZYXLA_* names
warned, assignments checked against a flag's accepted values."""

from __future__ import annotations

import subprocess
import sys

import pytest

import lazyxla
from lazyxla.config import _Config, unknown_variables
from tests.util import ROOT, script_env


@pytest.mark.parametrize(
    "variable, value, expected",
    [
        ("LAZYXLA_MATMUL_PRECISION", "fast", "LAZYXLA_MATMUL_PRECISION='fast': expected one of 'default', 'high'"),
        ("LAZYXLA_COMPILE_CACHE_SIZE", "abc", "LAZYXLA_COMPILE_CACHE_SIZE='abc': expected an integer"),
        ("LAZYXLA_HOST_READ_COMPUTES", "some", "LAZYXLA_HOST_READ_COMPUTES='some': expected one of 'needed', 'all'"),
        ("LAZYXLA_DONATE", "maybe", "LAZYXLA_DONATE='maybe': expected one of 1/0"),
    ],
)
def test_a_bad_environment_value_names_the_variable_and_what_it_takes(monkeypatch, variable, value, expected):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as info:
        _Config()
    assert str(info.value).startswith(expected), str(info.value)


def test_good_environment_values_parse(monkeypatch):
    monkeypatch.setenv("LAZYXLA_MATMUL_PRECISION", "high")
    monkeypatch.setenv("LAZYXLA_COMPILE_CACHE_SIZE", " 16 ")
    values = _Config()
    assert (values.matmul_precision, values.compile_cache_size) == ("high", 16)


def _import_lazyxla(**env: str) -> subprocess.CompletedProcess:
    code = [sys.executable, "-c", "import lazyxla"]
    return subprocess.run(code, env=script_env(**env), capture_output=True, text=True, timeout=120)


def test_the_import_fails_at_a_bad_value():
    # the check runs when lazyxla is imported, not at the first sync inside jax
    proc = _import_lazyxla(LAZYXLA_MATMUL_PRECISION="fast")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "ValueError: LAZYXLA_MATMUL_PRECISION='fast': expected one of" in proc.stderr


def test_an_assignment_outside_the_choices_raises():
    with pytest.raises(ValueError, match="lazyxla.config.matmul_precision = 'fast': expected one of 'default'"):
        lazyxla.config.matmul_precision = "fast"
    assert lazyxla.config.matmul_precision == "highest"


def test_misspelled_variables_are_warned_with_the_closest_name():
    environ = {
        "LAZYXLA_PERSISTANT_CACHE": "0",
        "LAZYXLA_EAGER_MODE": "1",
        "LAZYXLA_XYZZY": "1",
        "LAZYXLA_STRICT": "1",  # a flag's own variable: no warning
        "PERSISTANT_CACHE": "0",  # not lazyxla's
    }
    messages = unknown_variables(environ)
    assert messages == [
        "LAZYXLA_EAGER_MODE is not a lazyxla variable and is ignored; did you mean LAZYXLA_EAGER?",
        "LAZYXLA_PERSISTANT_CACHE is not a lazyxla variable and is ignored; did you mean LAZYXLA_PERSISTENT_CACHE?",
        "LAZYXLA_XYZZY is not a lazyxla variable and is ignored; lazyxla.config.describe() lists the variables",
    ]


def test_the_import_warns_of_a_misspelled_variable():
    proc = _import_lazyxla(LAZYXLA_PERSISTANT_CACHE="0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    warning = "UserWarning: LAZYXLA_PERSISTANT_CACHE is not a lazyxla variable and is ignored; did you mean"
    assert warning in proc.stderr, proc.stderr[-2000:]


def test_every_lazyxla_variable_the_code_names_is_a_flag():
    # a LAZYXLA_* name used anywhere in the repository (read outside config.py, set for a child) must be known to
    # the misspelling check, or users setting it would be told it is ignored
    files = ["*.py", "*.md", "Makefile", "*.toml", ":!lazyxla/config.py", ":!tests/test_config.py"]
    names = subprocess.run(
        ["git", "grep", "-ohE", "LAZYXLA_[A-Z0-9_]*[A-Z0-9]", "--", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert names, "git grep found nothing"
    assert unknown_variables(dict.fromkeys(names, "")) == []
