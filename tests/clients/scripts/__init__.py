"""Client scripts written for torch_xla (they import nothing from lazyxla), and how the tests run them.

:func:`run_script` runs one under ``python -m lazyxla.run`` or plain ``python`` (the CPU) in a child process
and returns each replica's ``result_<rank>.pt``; :func:`assert_params_close` is the comparison rule of the
client tests (1e-4, relative and absolute).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.util import run_python

HERE = Path(__file__).resolve().parent
RTOL = 1e-4  # relative (and, for parameters, absolute) difference allowed between lazyxla and the CPU


def run_script(name: str, folder: Path, batch: int, on_lazyxla: bool, replicas: int | None = None) -> list[dict]:
    """Each replica's result of ``scripts/<name>`` writing into ``folder``, run under ``python -m lazyxla.run``
    (``replicas``: ``CPU_NUM_DEVICES``, the replicas ``xmp.spawn`` starts) or with plain python on the CPU."""
    folder.mkdir()
    launcher = ["-m", "lazyxla.run"] if on_lazyxla else []
    extra = {"CPU_NUM_DEVICES": str(replicas)} if replicas else {}
    proc = run_python([*launcher, str(HERE / name), str(folder), str(batch)], folder, timeout=600, **extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [torch.load(p, weights_only=True) for p in sorted(folder.glob("result_*.pt"))]


def assert_params_close(got: dict, want: dict) -> None:
    """Every tensor of ``got`` within :data:`RTOL` of ``want``'s (same names)."""
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=RTOL, atol=RTOL, msg=lambda m, n=name: f"{n}: {m}")


def largest_change(after: dict, before: dict) -> float:
    """How far training moved the parameters: the largest element-wise difference."""
    return max((after[n] - before[n]).abs().max().item() for n in after)
