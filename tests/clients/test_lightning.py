"""PyTorch Lightning, unmodified, both ways: its XLA path under ``python -m lazyxla.run`` and
``lazyxla.lightning.Strategy`` without torch_xla; each equal to the CPU.

``scripts/lightning_train.py`` fits a tiny LightningModule one epoch (4 batches of 4, fixed data; SGD with
momentum, and Adam), validates, tests and predicts. Under ``python -m lazyxla.run`` with ``accelerator="tpu"``
or ``"auto"`` Lightning finds torch_xla (``importlib.metadata`` answers its version, ``torch_xla._internal.tpu``
its devices) and takes its XLA path: ``XLAAccelerator``, ``SingleDeviceXLAStrategy``, ``XLAPrecision``
(``xm.optimizer_step``), batches moved by ``MpDeviceLoader``; ``accelerator="cpu"`` there stays on the CPU.
Without the layer, ``strategy=lazyxla.lightning.Strategy()`` puts the run on lazyxla's device; its accelerator
alone is refused
(Lightning would give it a CPU strategy). The rule: losses, validation/test losses, predictions and final
parameters within 1e-4 of the plain CPU run, which moved the weights by far more. Each run is a subprocess
(about 10 s on 2 shared cores).
"""

from __future__ import annotations

import pytest
import torch

from tests.clients.scripts import HERE, RTOL, assert_params_close, assert_same_start_and_real_training
from tests.util import run_python

pytest.importorskip("lightning", reason="Lightning is pinned in requirements.txt; install it to run these tests")

SCRIPT = str(HERE / "lightning_train.py")


def _run(folder, accelerator: str, optimizer: str, lazy_run: bool, expect_ok: bool = True):
    folder.mkdir()
    launcher = ["-m", "lazyxla.run"] if lazy_run else []
    proc = run_python([*launcher, SCRIPT, str(folder), accelerator, "1", optimizer], folder, timeout=600)
    if not expect_ok:
        return proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(folder / "result_0.pt", weights_only=True)


@pytest.fixture(scope="module", params=["sgd", "adam"])
def cpu(request, tmp_path_factory) -> tuple[str, dict]:
    """The script on the CPU with plain python (Lightning's CPUAccelerator, no lazyxla)."""
    result = _run(tmp_path_factory.mktemp("cpu") / "out", "cpu", request.param, lazy_run=False)
    assert result["strategy"] == "SingleDeviceStrategy" and result["param_device"] == "cpu"
    return request.param, result


def _assert_equal_to_cpu(result: dict, cpu: dict) -> None:
    assert_same_start_and_real_training(result, cpu)
    for key in ("losses", "val", "test", "predictions"):
        assert result[key].shape == cpu[key].shape and result[key].numel() > 0, key
        torch.testing.assert_close(result[key], cpu[key], rtol=RTOL, atol=RTOL, msg=lambda m, k=key: f"{k}: {m}")
    assert_params_close(result["final"], cpu["final"])


@pytest.mark.parametrize("accelerator", ["tpu", "auto"])
def test_xla_path_under_lazyxla_run_equals_cpu(cpu, accelerator, tmp_path) -> None:
    optimizer, want = cpu
    got = _run(tmp_path / "out", accelerator, optimizer, lazy_run=True)
    assert (got["accelerator"], got["strategy"], got["precision"]) == (
        "XLAAccelerator",
        "SingleDeviceXLAStrategy",
        "XLAPrecision",
    )
    assert got["param_device"] == got["batch_device"] == "xla:0"
    _assert_equal_to_cpu(got, want)


def test_cpu_accelerator_under_lazyxla_run_stays_on_cpu(cpu, tmp_path) -> None:
    optimizer, want = cpu
    got = _run(tmp_path / "out", "cpu", optimizer, lazy_run=True)
    assert (got["accelerator"], got["strategy"]) == ("CPUAccelerator", "SingleDeviceStrategy")
    assert got["param_device"] == got["batch_device"] == "cpu"
    _assert_equal_to_cpu(got, want)


@pytest.mark.parametrize("placement", ["lazyxla", "lazyxla-names"])
def test_lazyxla_strategy_without_torch_xla_equals_cpu(cpu, placement, tmp_path) -> None:
    optimizer, want = cpu
    got = _run(tmp_path / "out", placement, optimizer, lazy_run=False)
    assert (got["accelerator"], got["strategy"]) == ("Accelerator", "Strategy")
    assert got["param_device"] == got["batch_device"] == "lazyxla:0"
    _assert_equal_to_cpu(got, want)


def test_lazyxla_accelerator_alone_is_refused_not_run_on_cpu(tmp_path) -> None:
    proc = _run(tmp_path / "out", "lazyxla-accelerator-only", "sgd", lazy_run=False, expect_ok=False)
    assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr[-3000:]
    assert "strategy=lazyxla.lightning.Strategy()" in proc.stderr
    assert not list((tmp_path / "out").glob("result_*.pt"))


def test_lazyxla_strategy_name_alone_is_refused_not_run_on_cpu(tmp_path) -> None:
    proc = _run(tmp_path / "out", "lazyxla-strategy-name-only", "sgd", lazy_run=False, expect_ok=False)
    assert proc.returncode == 1 and "CPUAccelerator" in proc.stderr, proc.stderr[-3000:]
    assert "Trainer(accelerator='lazyxla', strategy='lazyxla')" in proc.stderr
    assert not list((tmp_path / "out").glob("result_*.pt"))


def test_xla_path_on_two_processes_equals_cpu_whole_batch(tmp_path) -> None:
    """``Trainer(accelerator="tpu", devices=2)`` under ``python -m lazyxla.run`` (``CPU_NUM_DEVICES=2``):
    Lightning's XLA launcher calls ``xmp.spawn(..., join=False)``, then XLAStrategy trains each rank on half of
    every batch of 4 and ``xm.optimizer_step`` all-reduces the gradients. Equal to one CPU process training on
    the whole batches (in the order of Lightning's shuffling DistributedSampler): the ranks' mean loss is the
    whole batch's at every step, and both ranks end with the CPU's parameters. Then validation, ``trainer.test``
    and ``trainer.predict``, each over two new processes, equal the CPU-trained model on each rank's batches."""
    (tmp_path / "cpu").mkdir()
    proc = run_python([SCRIPT, str(tmp_path / "cpu"), "cpu-epoch-order", "1", "sgd"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    want = torch.load(tmp_path / "cpu" / "result_0.pt", weights_only=True)
    (tmp_path / "xla").mkdir()
    command = ["-m", "lazyxla.run", SCRIPT, str(tmp_path / "xla"), "tpu", "2", "sgd"]
    proc = run_python(command, tmp_path, timeout=300, CPU_NUM_DEVICES="2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [torch.load(tmp_path / "xla" / f"result_{r}.pt", weights_only=True) for r in (0, 1)]
    for rank, got in enumerate(ranks):
        assert (got["rank"], got["world_size"], got["strategy"], got["precision"]) == (
            rank,
            2,
            "XLAStrategy",
            "XLAPrecision",
        )
        assert got["param_device"] == got["batch_device"] == "xla:0"
        assert_same_start_and_real_training(got, want)
        assert_params_close(got["final"], want["final"])
    assert len(want["losses"]) == 4
    torch.testing.assert_close((ranks[0]["losses"] + ranks[1]["losses"]) / 2, want["losses"], rtol=RTOL, atol=RTOL)
    _assert_stages_equal_cpu_model(tmp_path / "xla", want["final"], samples=16)


def _assert_stages_equal_cpu_model(folder, final: dict, samples: int) -> None:
    """Validation (after fit), test and predict, each in Lightning's two new processes: every rank's losses or
    predictions equal the CPU-trained model's on the very batches that rank saw, and the ranks together saw
    every sample (Lightning's DistributedSampler splits them)."""
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    net.load_state_dict({k.removeprefix("net."): v for k, v in final.items()})
    for stage in ("val", "test", "predict"):
        seen = 0
        for rank in (0, 1):
            got = torch.load(folder / f"{stage}_{rank}.pt", weights_only=True)
            assert (got["rank"], got["world_size"]) == (rank, 2), stage
            assert len(got["inputs"]) == len(got["outputs"]) > 0, stage
            for x, output in zip(got["inputs"], got["outputs"], strict=True):
                seen += len(x)
                with torch.no_grad():
                    logits = net(x)
                if stage == "predict":
                    want = logits.softmax(-1)
                else:  # the loss needs the labels: the sample's row of the fixed data gives them
                    want = torch.nn.functional.cross_entropy(logits, _labels_of(x))
                torch.testing.assert_close(output, want, rtol=RTOL, atol=RTOL, msg=lambda m, s=stage: f"{s}: {m}")
        assert seen == samples, (stage, seen)


def _labels_of(x: torch.Tensor) -> torch.Tensor:
    """The labels of rows of lightning_train.py's fixed data (seed 0: x, then y), found by matching rows."""
    generator = torch.Generator().manual_seed(0)  # the script's torch.manual_seed(0), not touching the global RNG
    data_x, data_y = torch.randn(16, 6, generator=generator), torch.randint(0, 3, (16,), generator=generator)
    rows = [int(torch.nonzero((data_x == row).all(-1))[0]) for row in x]
    return data_y[rows]
