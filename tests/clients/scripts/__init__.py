"""Client scripts written for torch_xla (they import nothing from lazyxla), and how the tests run them.

:func:`run_script` runs one under ``python -m lazyxla.run`` or plain ``python`` (the CPU) in a child process
and returns each replica's ``result_<rank>.pt`` (:func:`run_on_lazyxla`: on 1 or 2 replicas sharing a global
batch of 4); :func:`assert_params_close` is the comparison rule of the client tests (1e-4, relative and
absolute).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.util import run_python

HERE = Path(__file__).resolve().parent
RTOL = 1e-4  # relative (and, for parameters, absolute) difference allowed between lazyxla and the CPU


def run_script(
    name: str, folder: Path, batch: int, on_lazyxla: bool, replicas: int | None = None, *args: str, **env: str
) -> list[dict]:
    """Each replica's result of ``scripts/<name>`` writing into ``folder``, run under ``python -m lazyxla.run``
    (``replicas``: ``CPU_NUM_DEVICES``, the replicas ``xmp.spawn`` starts) or with plain python on the CPU;
    ``args``: the script's further arguments, ``env``: further environment variables."""
    folder.mkdir()
    launcher = ["-m", "lazyxla.run"] if on_lazyxla else []
    extra = {"CPU_NUM_DEVICES": str(replicas)} if replicas else {}
    command = [*launcher, str(HERE / name), str(folder), str(batch), *args]
    proc = run_python(command, folder, timeout=600, **extra, **env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [torch.load(p, weights_only=True) for p in sorted(folder.glob("result_*.pt"))]


def run_on_cpu(name: str, folder: Path) -> dict:
    """The result of ``scripts/<name>`` with plain python (no lazyxla: the CPU), one process, batch 4."""
    (result,) = run_script(name, folder, 4, on_lazyxla=False)
    assert not result["xla"] and result["distributed_type"] == "DistributedType.NO"
    return result


def run_on_lazyxla(name: str, folder: Path, replicas: int) -> list[dict]:
    """Each replica's result of ``scripts/<name>`` under ``python -m lazyxla.run`` on ``replicas`` replicas
    (``CPU_NUM_DEVICES``) that share a global batch of 4, as the CPU runs of the tests use."""
    results = run_script(name, folder, 4 // replicas, on_lazyxla=True, replicas=replicas if replicas > 1 else None)
    assert len(results) == replicas
    return results


def assert_xla_path(result: dict) -> None:
    """The script took the libraries' XLA path on lazyxla's device (named `xla`), and no op ran on the CPU."""
    assert result["xla"] and result["distributed_type"] == "DistributedType.XLA"
    assert result["device"] == result["param_device"] == "xla:0"  # torch_xla's name: python -m lazyxla.run chose it
    assert result["train_loader"] == "MpDeviceLoaderWrapper"  # accelerate's subclass of pl.MpDeviceLoader
    assert result["cpu_ops"] == [], f"ops ran on the CPU: {result['cpu_ops']}"


def assert_replicas_agree(results: list[dict], key: str) -> None:
    """Every replica holds the same parameters ``result[key]``: they applied the same all-reduced updates."""
    for other in results[1:]:
        for name, value in results[0][key].items():
            assert torch.equal(other[key][name], value), name


def assert_params_close(got: dict, want: dict) -> float:
    """Every tensor of ``got`` within :data:`RTOL` of ``want``'s (same names); returns the largest difference."""
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=RTOL, atol=RTOL, msg=lambda m, n=name: f"{n}: {m}")
    return max((got[n] - want[n]).abs().max().item() for n in want)


def assert_same_start_and_real_training(result: dict, cpu: dict) -> None:
    """Both runs started from the same weights, and the CPU run moved them far more than :data:`RTOL` (so
    that comparing trained weights at that tolerance means something)."""
    assert_params_close(result["initial"], cpu["initial"])
    moved = max((cpu["final"][n] - cpu["initial"][n]).abs().max().item() for n in cpu["final"])
    assert moved > 100 * RTOL, f"training moved the weights by {moved}: too little for the comparison"
