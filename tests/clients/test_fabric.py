"""Lightning Fabric, unmodified, both ways: its XLA path under ``python -m lazyxla.run``
(``Fabric(accelerator="tpu", devices=1)``) and ``lazyxla.lightning.FabricStrategy`` without torch_xla; each
equal to the same script with ``accelerator="cpu"``.

``scripts/fabric_train.py`` trains a tiny model 4 steps through ``setup``, ``setup_dataloaders``, ``backward``
and the optimizer's step (SGD with momentum, and Adam), then evaluates once. The rule: losses, evaluation and
final parameters within 1e-4 of the CPU run, which moved the weights by far more. Each run is a subprocess.
"""

from __future__ import annotations

import pytest
import torch

from tests.clients.scripts import HERE, RTOL, assert_params_close, assert_same_start_and_real_training
from tests.util import run_python

pytest.importorskip("lightning", reason="Lightning is pinned in requirements.txt; install it to run these tests")

SCRIPT = str(HERE / "fabric_train.py")


def _run(folder, accelerator: str, optimizer: str, lazy_run: bool, expect_ok: bool = True):
    folder.mkdir()
    launcher = ["-m", "lazyxla.run"] if lazy_run else []
    proc = run_python([*launcher, SCRIPT, str(folder), accelerator, optimizer], folder, timeout=300)
    if not expect_ok:
        return proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(folder / "result_0.pt", weights_only=True)


@pytest.fixture(scope="module", params=["sgd", "adam"])
def cpu(request, tmp_path_factory) -> tuple[str, dict]:
    """The script with ``accelerator="cpu"`` and plain python (no lazyxla)."""
    result = _run(tmp_path_factory.mktemp("cpu") / "out", "cpu", request.param, lazy_run=False)
    assert result["strategy"] == "SingleDeviceStrategy" and result["param_device"] == "cpu"
    return request.param, result


def _assert_equal_to_cpu(result: dict, cpu: dict) -> None:
    assert_same_start_and_real_training(result, cpu)
    for key in ("losses", "evaluated"):
        assert result[key].shape == cpu[key].shape and result[key].numel() > 0, key
        torch.testing.assert_close(result[key], cpu[key], rtol=RTOL, atol=RTOL, msg=lambda m, k=key: f"{k}: {m}")
    assert_params_close(result["final"], cpu["final"])


def test_fabric_xla_path_under_lazyxla_run_equals_cpu(cpu, tmp_path) -> None:
    optimizer, want = cpu
    got = _run(tmp_path / "out", "tpu", optimizer, lazy_run=True)
    assert (got["accelerator"], got["strategy"], got["precision"]) == (
        "XLAAccelerator",
        "SingleDeviceXLAStrategy",
        "XLAPrecision",
    )
    assert got["device"] == got["param_device"] == got["batch_device"] == "xla:0"
    _assert_equal_to_cpu(got, want)


@pytest.mark.parametrize("mode", ["lazyxla", "lazyxla-names"])
def test_fabric_lazyxla_strategy_without_torch_xla_equals_cpu(cpu, mode, tmp_path) -> None:
    optimizer, want = cpu
    got = _run(tmp_path / "out", mode, optimizer, lazy_run=False)
    assert (got["accelerator"], got["strategy"], got["precision"]) == ("Accelerator", "FabricStrategy", "Precision")
    assert got["device"] == got["param_device"] == got["batch_device"] == "lazyxla:0"
    _assert_equal_to_cpu(got, want)


def test_fabric_strategy_name_alone_is_refused_not_run_on_cpu(tmp_path) -> None:
    proc = _run(tmp_path / "out", "lazyxla-strategy-name-only", "sgd", lazy_run=False, expect_ok=False)
    assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr[-3000:]
    assert "Fabric(accelerator='lazyxla', strategy='lazyxla')" in proc.stderr
    assert not list((tmp_path / "out").glob("result_*.pt"))
