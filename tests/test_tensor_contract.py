"""PyTorch's contract around the step (issue 26, point 1 and 2): save, load, pickle, copy, EMA, storages and pointers.

Every case runs in a subprocess (tests/contract_cases.py), so a crash of the process fails the test that started it,
named, instead of ending the whole run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import contract_cases

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {
    "serialization": [
        "save_load_every_dtype",
        "load_cpu_checkpoint_with_map_location",
        "legacy_format_and_buffers",
        "pickle_tensors_and_parameters",
        "failed_save_keeps_previous_checkpoint",
    ],
    "copies": [
        "ties_survive_save_and_deepcopy",
        "deepcopy_tensors_modules_optimizers",
        "deepcopy_keeps_views_of_the_copied_base",
        "ema_averaged_model",
    ],
    "resume": ["resume_optimizer_from_checkpoint", "hugging_face_save_pretrained"],
    "storages": ["storages", "no_crash_on_pointers", "tensor_from_storage_and_linked_deepcopy"],
}


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LAZYXLA_PERSISTENT_CACHE="0")
    env.pop("LAZYXLA_EAGER", None)
    return env


def run_cases(tmp_path, names: list[str], **env) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.contract_cases", str(tmp_path), *names],
        cwd=ROOT,
        env=dict(_env(), **env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    started = [line.split()[1] for line in out.splitlines() if line.startswith("START")]
    assert proc.returncode >= 0, (
        f"the process died from signal {-proc.returncode} during case {started[-1] if started else '?'}\n"
        f"{out}\n{proc.stderr[-3000:]}"
    )
    failed = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0 and not failed, out + proc.stderr[-3000:]
    assert [line.split()[1] for line in out.splitlines() if line.startswith("OK")] == names
    return out


def test_every_case_is_in_a_group():
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(contract_cases.CASES)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_contract(group, tmp_path):
    run_cases(tmp_path, GROUPS[group])


def test_contract_under_torch_xla_s_device_name(tmp_path):
    """torch_xla's scripts name the device ``xla`` (PyTorch's own code has XLA branches for that name)."""
    run_cases(tmp_path, ["save_load_every_dtype", "deepcopy_tensors_modules_optimizers"], LAZYXLA_DEVICE_NAME="xla")


def test_a_lazyxla_checkpoint_loads_without_lazyxla(tmp_path):
    """A checkpoint of lazyxla tensors is an ordinary PyTorch file: map_location='cpu' loads it where lazyxla is not
    imported (as a CUDA checkpoint on a CPU machine), and without it PyTorch says which device it needs."""
    save = (
        "import torch, lazyxla, sys\n"
        "d = lazyxla.device()\n"
        "torch.save({'w': torch.arange(6.).reshape(2, 3).to(d), 'i': torch.tensor([1, 2]).to(d)}, sys.argv[1])\n"
    )
    load = (
        "import torch, sys\n"
        "sd = torch.load(sys.argv[1], map_location='cpu', weights_only=True)\n"
        "assert 'lazyxla' not in sys.modules\n"
        "assert torch.equal(sd['w'], torch.arange(6.).reshape(2, 3)) and torch.equal(sd['i'], torch.tensor([1, 2]))\n"
        "try:\n"
        "    torch.load(sys.argv[1], weights_only=True)\n"
        "except RuntimeError as e:\n"
        "    assert 'lazyxla' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('should need the device')\n"
    )
    path = str(tmp_path / "ckpt.pt")
    for script in (save, load):
        proc = subprocess.run(
            [sys.executable, "-c", script, path], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
