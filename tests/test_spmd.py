"""SPMD: sharded training equals unsharded, each device holds its share, errors at the call.

Every case runs in fresh processes with 8 fake CPU devices (``lazyxla.spawn(cpu_devices=...)``): one
process with 8, and two processes with 4 each forming one global mesh.
"""

from __future__ import annotations

import pytest
import torch

import lazyxla
from tests import spmd_workers as S

LAYOUTS = [pytest.param(1, 8, id="1x8"), pytest.param(2, 4, id="2x4")]


@pytest.mark.parametrize("mode", ["fsdp", "2d"])
@pytest.mark.parametrize("nprocs,cpu_devices", LAYOUTS)
def test_sharded_gpt_training_equals_unsharded(nprocs, cpu_devices, mode):
    runs = lazyxla.spawn(S.gpt_spmd, args=(mode,), nprocs=nprocs, cpu_devices=cpu_devices, timeout_s=280)
    for run in runs:
        assert run["devices"] == 8
        assert run["diff"] < 1e-5, run["diff"]  # parameters after 5 AdamW steps vs CPU eager (rtol 1e-4, atol 1e-5)
        for got, want in zip(run["losses"], run["ref_losses"]):
            assert abs(got - want) < 1e-5
        # step 1 and step 2 (optimizer state appears) compile one program each; nothing after
        assert run["compiles"] == [0, 1, 2, 2, 2, 2], run["compiles"]
        n = run["axis_size"]
        for name, fractions in run["fractions"].items():
            want = 1 / n if name in run["split"] else 1.0
            assert fractions == [want] * (8 // nprocs), (name, fractions)
        for name, axis in run["split"].items():
            assert axis in run["specs"][name], (name, run["specs"][name])
        assert run["text_has_shardings"]  # the StableHLO carries the parameters' shardings


def test_bad_annotations_raise_at_the_call():
    (out,) = lazyxla.spawn(S.sharding_errors, nprocs=1, cpu_devices=8, timeout_s=120)
    assert "has 1 entries but the tensor has 2 dimensions" in out["rank"]
    assert "'nope' (dimension 1) is not an axis of the mesh" in out["unknown"]
    assert "'model' is used twice" in out["twice"]
    # a dimension its mesh axes do not divide is split as XLA splits it, padded (tests/test_spmd_uneven.py)
    assert out["divisible"] is None and out["tuple_divisible"] is None
    assert "holds 9 devices, but 8 ids" in out["mesh"]
    assert out["tuple_ok"] == (("data", "model"), None)
    assert out["pending_spec"] == ("model", None) and out["pending_value"] == 96.0
    assert out["constraint_in_program"]  # an annotation on a pending value is a constraint in the program
    assert out["cleared"] is None


def test_spmd_functions_need_spmd_mode(dev):
    x = torch.ones(2).to(dev)
    for call in (lambda: lazyxla.spmd.mark_sharding(x, None, (None,)), lambda: lazyxla.spmd.clear_sharding(x)):
        with pytest.raises(RuntimeError, match="lazyxla.spmd.enable"):
            call()


def test_hybrid_mesh_puts_hosts_on_the_outer_axis():
    runs = lazyxla.spawn(S.meshes, nprocs=2, cpu_devices=4, timeout_s=120)
    for out in runs:
        assert out["hybrid_shape"] == (2, 4)
        assert out["hybrid"] == [[0, 0, 0, 0], [1, 1, 1, 1]]  # "data" across hosts, "model" within one
        assert out["flat"] == [[0, 0, 0, 0], [1, 1, 1, 1]]
        assert "does not match the run" in out["bad_hybrid"]


def _example(*args: str) -> list[str]:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), LAZYXLA_PERSISTENT_CACHE="0")
    proc = subprocess.run(
        [sys.executable, str(root / "examples" / "train_spmd.py"), "--steps", "10", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()


def test_the_spmd_example_gives_the_same_result_on_1x8_and_2x4():
    one, two = _example(), _example("--nprocs", "2")
    assert one[-1].startswith("final loss ") and one[-1] == two[-1]
    assert "laid out as ('model', None) over Mesh(shape=(2, 4)" in one[-2]


@pytest.mark.parametrize("nprocs,cpu_devices", LAYOUTS)
def test_spmd_programs_are_loaded_from_the_disk_cache(tmp_path, nprocs, cpu_devices):
    args = (str(tmp_path), "2d")
    first = lazyxla.spawn(S.gpt_spmd_cached, args=args, nprocs=nprocs, cpu_devices=cpu_devices, timeout_s=280)
    second = lazyxla.spawn(S.gpt_spmd_cached, args=args, nprocs=nprocs, cpu_devices=cpu_devices, timeout_s=280)
    for a, b in zip(first, second):
        assert a["losses"] == b["losses"] and b["diff"] < 1e-5  # the loaded programs compute the same steps
        assert a["misses"] == 2 and a["hits"] == 0  # steps 1 and 2, each process its own entry
        assert b["hits"] == 2 and b["misses"] == 0, (a, b)


def test_a_read_on_one_process_only_raises_on_every_process():
    runs = lazyxla.spawn(S.master_only_read, nprocs=2, cpu_devices=2, timeout_s=120)
    for rank, run in enumerate(runs):
        assert run["agreed"] == 128.0
        assert run["error"] is not None, rank
        assert "the processes are about to run different programs" in run["error"]
        assert ".item() at" in run["error"] and "spmd_workers.py" in run["error"]  # names the trigger and line


@pytest.mark.parametrize("nprocs,cpu_devices", LAYOUTS)
def test_every_dtype_keeps_its_width_when_sharded(nprocs, cpu_devices):
    """int64 token ids sharded on the batch crashed the process (XLA got s32 buffers for an s64 program, then
    SIGSEGV): every dtype, transferred, from_local, computed, pending and under fsdp, equals the CPU."""
    runs = lazyxla.spawn(S.dtype_layouts, nprocs=nprocs, cpu_devices=cpu_devices, timeout_s=400)
    for run in runs:
        assert len(run) == len(S.DTYPES) * 5
        for case, diff in run.items():
            tol = 1e-2 if case.split("/")[0] in ("bfloat16", "float16") else 1e-5
            assert isinstance(diff, float) and diff <= tol, (case, diff)  # integers and bool: equal


def test_a_mismatched_buffer_raises_naming_the_input_instead_of_crashing():
    (out,) = lazyxla.spawn(S.forced_mismatch, nprocs=1, cpu_devices=8, timeout_s=120)
    assert out["narrowed"] == ["int32"] and out["dtype"] == "int64"  # the inconsistent array jax makes
    assert out["error"].startswith("ProgramInputError: lazyxla: graph input 0 (a tensor of shape [8, 16]"), out
    assert "torch.int64" in out["error"] and "device buffers int32[1, 16]" in out["error"], out["error"]
    assert "takes int64[8, 16]" in out["error"] and "copied from the CPU at" in out["error"], out["error"]
    assert out["after"] == 2 * sum(range(128))  # the program did not run; with a correct buffer it does


def test_intermediates_the_user_keeps_alive_compile_and_equal_cpu():
    (out,) = lazyxla.spawn(S.kept_intermediates, nprocs=1, cpu_devices=8, timeout_s=300)
    assert out["kept"] == 2 and out["diff"] <= 1e-5, out
