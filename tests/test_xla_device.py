"""The ``xla`` device: torch_xla code that names the device ``'xla'`` runs under ``python -m lazyxla.run``.

PyTorch names its PrivateUse1 device once per process, so the device's name is chosen when lazyxla is
imported: ``lazyxla`` (this process), or ``xla`` under ``python -m lazyxla.run`` and with
``LAZYXLA_DEVICE_NAME=xla``. The cases of ``tests/xla_device_cases.py`` (device spellings, factories, ``.to``,
``xla:1`` with two fake CPU devices, mixing with CPU tensors, autocast, ``torch.save``, training against CPU
eager, transformers' and accelerate's device checks and mixed precision) run once, in one child process started
as ``CPU_NUM_DEVICES=2 python -m lazyxla.run -m pytest``; each test here reports one case function's outcome.
The rest checks, in this process and in small children, how the name is chosen.
"""

from __future__ import annotations

import ast
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import lazyxla
import lazyxla.compat as compat
from lazyxla.device import devices
from tests.util import ROOT, run_python

CASES = Path(__file__).with_name("xla_device_cases.py")


def _case_names() -> list[str]:
    tree = ast.parse(CASES.read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[tuple[str, str | None]]]:
    """Each case function's runs in the child session: [(test id, failure text or None)]."""
    folder = tmp_path_factory.mktemp("xla_device")
    report = folder / "report.xml"
    args = ["-m", "lazyxla.run", "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES), f"--junitxml={report}"]
    proc = run_python(args, ROOT, timeout=600, CPU_NUM_DEVICES="2")
    if not report.exists():
        pytest.fail(
            f"the child session wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    runs: dict[str, list[tuple[str, str | None]]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        text = None if problem is None else f"{problem.tag}: {problem.get('message')}\n{problem.text or ''}"
        runs.setdefault(case.get("name").split("[")[0], []).append((case.get("name"), text))
    return runs


@pytest.mark.parametrize("case", _case_names())
def test_case_passes_on_the_xla_device(outcomes, case):
    runs = outcomes.get(case)
    assert runs, f"{case} did not run in the child session"
    failed = [f"{name}: {text}" for name, text in runs if text is not None]
    assert not failed, "\n\n".join(failed)


# ---- how the name is chosen ----------------------------------------------------------------------------------


def test_this_process_keeps_lazyxlas_name():
    assert devices.torch_name() == "lazyxla" and lazyxla.device() == torch.device("lazyxla", 0)
    assert torch.zeros(1, device="lazyxla").device.type == "lazyxla"
    assert not devices.on_device(torch.device("xla"))  # 'xla' stays PyTorch's own XLA device type here


@pytest.mark.parametrize(
    "argv, orig_argv, flag, want",
    [
        (["script.py"], ["python", "script.py"], "lazyxla", "lazyxla"),
        (["-m", "a.py"], ["python", "-m", "lazyxla.run", "a.py"], "lazyxla", "xla"),
        (["-m", "a.py"], ["python", "-u", "-X", "dev", "-mlazyxla.run", "a.py"], "lazyxla", "xla"),
        (["-m"], ["python", "-m", "lazyxla.run"], "lazyxla", "xla"),
        (["-m", "lazyxla.run"], ["python", "-m", "pkg.tool", "lazyxla.run"], "lazyxla", "lazyxla"),
        (["-c"], ["python", "-c", "import lazyxla"], "xla", "xla"),
    ],
)
def test_the_name_is_xla_under_lazyxla_run_or_when_the_flag_says_so(monkeypatch, argv, orig_argv, flag, want):
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    with lazyxla.config.override(device_name=flag):
        assert compat.device_name() == want


def test_a_real_torch_xla_keeps_the_name_xla(monkeypatch):
    monkeypatch.setattr(compat, "real_torch_xla", lambda: "/site-packages/torch_xla/__init__.py")
    monkeypatch.setattr(sys, "argv", ["-m", "a.py"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "lazyxla.run", "a.py"])
    assert compat.device_name() == "lazyxla"
    with lazyxla.config.override(device_name="xla"), pytest.raises(RuntimeError, match="real torch_xla"):
        compat.device_name()
    with lazyxla.config.override(device_name="cuda"), pytest.raises(ValueError, match="'lazyxla' or 'xla'"):
        compat.device_name()


def test_children_of_lazyxla_run_name_the_device_as_it_does(tmp_path):
    """``python -m lazyxla.run`` exports the name: a subprocess and a multiprocessing child say ``xla`` too; a
    process that sets the flag itself says ``xla``; ``install()`` after ``import lazyxla`` keeps ``lazyxla``."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import multiprocessing, subprocess, sys
            import torch, torch_xla

            def child(queue):
                import lazyxla
                queue.put(str(lazyxla.device()))

            if __name__ == "__main__":
                print("parent", torch_xla.device(), torch.ones(1, device="xla").device)
                code = "import lazyxla; print('subprocess', lazyxla.device())"
                print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())
                queue = multiprocessing.get_context("spawn").Queue()
                p = multiprocessing.get_context("spawn").Process(target=child, args=(queue,))
                p.start()
                print("spawned", queue.get(timeout=120))
                p.join(timeout=60)
            """
        )
    )
    proc = run_python(["-m", "lazyxla.run", str(script)], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:3] == ["parent xla:0 xla:0", "subprocess xla:0", "spawned xla:0"]

    flag = run_python(["-c", "import lazyxla; print(lazyxla.device())"], tmp_path, LAZYXLA_DEVICE_NAME="xla")
    assert flag.stdout.strip() == "xla:0", flag.stderr[-2000:]
    late = "import lazyxla.compat; lazyxla.compat.install(); import torch_xla; print(torch_xla.device())"
    late_proc = run_python(["-c", late], tmp_path)
    assert late_proc.stdout.strip() == "lazyxla:0", late_proc.stderr[-2000:]
