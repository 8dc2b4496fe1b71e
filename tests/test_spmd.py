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
        assert run["diff"] < 1e-5, run["diff"]  # parameters after 5 AdamW steps vs CPU eager
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
    assert "dimension 1 of size 6 cannot be split evenly into 4 parts" in out["divisible"]
    assert "dimension 0 of size 4 cannot be split evenly into 8 parts" in out["tuple_divisible"]
    assert "holds 9 devices, but 8 ids" in out["mesh"]
    assert out["tuple_ok"] == (("data", "model"), None)
    assert out["pending_spec"] == ("model", None) and out["pending_value"] == 96.0
    assert out["cleared"] is None


def test_spmd_functions_need_spmd_mode(dev):
    x = torch.ones(2).to(dev)
    for call in (lambda: lazyxla.spmd.mark_sharding(x, None, (None,)), lambda: lazyxla.spmd.clear_sharding(x)):
        with pytest.raises(RuntimeError, match="lazyxla.spmd.enable"):
            call()
