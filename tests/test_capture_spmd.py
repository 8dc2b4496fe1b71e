"""Whole-step capture of SPMD programs (``lazyxla.compile(step, capture=True)`` under ``lazyxla.spmd``): a replayed
sharded step computes exactly what lazy mode computes, and an input laid out otherwise than in the verified call
is recorded again, saying so.

Each case runs in a fresh process with 8 fake CPU devices (``lazyxla.spawn(cpu_devices=8)``), lazy mode first,
then the same training captured, from the same seeds.
"""

from __future__ import annotations

import statistics

import pytest
import torch

import lazyxla
from tests import capture_spmd_workers as W

STEPS = 10


def _run(mode: str, relayout_at: int | None = None) -> tuple[dict, dict]:
    (out,) = lazyxla.spawn(W.compare, args=(mode, STEPS, relayout_at), nprocs=1, cpu_devices=8, timeout_s=280)
    return out["lazy"], out["captured"]


def _assert_identical(lazy: dict, captured: dict) -> None:
    assert captured["losses"] == lazy["losses"]
    for part in ("params", "grads"):
        for k, want in lazy[part].items():
            torch.testing.assert_close(captured[part][k], want, rtol=0, atol=0, msg=f"{part} {k}")
    assert captured["specs"] == lazy["specs"]  # the parameters keep their layouts through replays


def _host_figure(mode: str, lazy: dict, captured: dict) -> str:
    warm = slice(4, None)  # (lazy mode's first two calls compile; the captured step replays from its third)
    ms = {k: statistics.median(r["host_ms"][warm]) for k, r in (("lazy", lazy), ("captured", captured))}
    cpu = {k: statistics.median(r["cpu_ms"][warm]) for k, r in (("lazy", lazy), ("captured", captured))}
    return (
        f"SPMD {mode} 4-layer MLP, 8 CPU devices: host ms/step lazy {ms['lazy']:.2f}, captured "
        f"{ms['captured']:.2f}; CPU ms/step lazy {cpu['lazy']:.2f}, captured {cpu['captured']:.2f}"
    )


@pytest.mark.parametrize("mode", ["fsdp", "2d", "uneven"])
def test_captured_spmd_training_equals_lazy_mode(mode):
    lazy, captured = _run(mode)
    assert captured["devices"] == 8
    _assert_identical(lazy, captured)
    assert captured["statuses"][-1] == "replaying", captured["statuses"]
    assert captured["replays"] >= STEPS - 3, captured  # calls 1-3 are recorded (learn, record, verify)
    assert captured["replayed"][3:] == [True] * (STEPS - 3), captured["replayed"]
    assert captured["refusals"] == 1  # its first call only (its modules and optimizer are not known yet)
    assert captured["compiles"] == 0  # it runs lazy mode's programs (built in this process by the lazy run)
    split = {k: v for k, v in captured["specs"].items() if v}
    assert len(split) == (6 if mode == "2d" else 8), captured["specs"]  # sharded parameters, not replicated
    for (per, spec, count_spec), (want, want_spec, _) in zip(captured["uneven"], lazy["uneven"]):
        torch.testing.assert_close(per, want, rtol=0, atol=0)  # a result split unevenly, returned
        assert spec == want_spec == count_spec == ("fsdp",)  # the layouts asked for stay true through replays
    assert len(captured["uneven"]) == (STEPS if mode == "uneven" else 0)
    print(_host_figure(mode, lazy, captured))  # (a figure for the record; timing is not asserted)


@pytest.mark.parametrize("mode", ["fsdp", "2d"])
def test_an_input_laid_out_otherwise_records_again_and_equals_lazy_mode(mode):
    at = 5
    lazy, captured = _run(mode, relayout_at=at)
    _assert_identical(lazy, captured)
    assert captured["statuses"][at].startswith(
        "recorded this call: an input's sharding differs from the verified call's (parameter 2)"
    ), captured["statuses"]
    assert captured["input_misses"] >= 1
    assert captured["statuses"][-1] == "replaying", captured["statuses"]
    # calls 1-3 are recorded, then replayed until the changed one; then recorded until two calls run the same
    # program: XLA lays the step's outputs out, so lazy mode may run a new program in the next steps too (one more
    # recorded call than the programs lazy mode compiled after the change)
    assert captured["replayed"][3:at] == [True] * (at - 3), captured["replayed"]
    new_programs = lazy["compiles"] - 2  # (before the change: the first step's, and the next steps')
    assert 1 <= new_programs <= 2, lazy["compiles"]
    assert captured["replayed"][at:].count(False) == new_programs + 1, captured["replayed"]
    assert captured["replayed"][-2:] == [True, True], captured["replayed"]
    new = ((None, "fsdp") if mode == "fsdp" else ("model", None),)
    assert captured["specs"]["2.weight"] in new, captured["specs"]["2.weight"]


def test_torch_xla_fsdpv2_wrapper_step_captured_equals_lazy_mode():
    """torch_xla's FSDPv2 wrapper (per decoder block, through the compatibility layer): replayed calls compute
    exactly what lazy mode computes, and nothing compiles beyond lazy mode's programs."""
    (out,) = lazyxla.spawn(W.fsdpv2, args=(8,), nprocs=1, cpu_devices=8, timeout_s=280)
    lazy, captured = out["lazy"], out["captured"]
    assert captured["losses"] == lazy["losses"]
    for k, want in lazy["params"].items():
        torch.testing.assert_close(captured["params"][k], want, rtol=0, atol=0, msg=k)
    assert captured["statuses"][-1] == "replaying", captured["statuses"]
    assert captured["replays"] >= 8 - 3, captured
    assert captured["compiles"] == 0, captured


def test_mark_sharding_of_device_data_inside_the_step_is_refused_by_name():
    (out,) = lazyxla.spawn(W.marks_inside, nprocs=1, cpu_devices=8, timeout_s=280)
    assert out["replays"] == 0
    assert out["losses"] == out["lazy_losses"]
    assert "lays out a computed tensor anew (lazyxla.spmd.mark_sharding" in out["status"], out["status"]


def test_a_mesh_the_step_reads_is_guarded():
    """The step constrains an activation over the mesh in its closure; rebinding that variable to another mesh is
    a changed guard: the call is recorded (a replay would run the program built for the first mesh)."""
    at = 4
    (out,) = lazyxla.spawn(W.mesh_in_closure, args=(7, at), nprocs=1, cpu_devices=8, timeout_s=280)
    lazy, captured = out["lazy"], out["captured"]
    assert captured["losses"] == lazy["losses"]
    # calls 5 and 6 record and verify the step from the new guards; call 7 replays it
    assert captured["replayed"] == [False, False, False, True, False, False, True], captured["replayed"]
    assert captured["statuses"][at].startswith("recorded this call: its guards differ from every verified step's")


def test_captured_spmd_over_two_processes_equals_lazy_mode():
    """Multi-process SPMD (2 processes x 4 devices, FSDP over the 8): every process runs each program, so each call
    is agreed among the processes, as for replicas (tests/test_capture_replicas.py)."""
    runs = lazyxla.spawn(W.compare, args=("fsdp", STEPS, None), nprocs=2, cpu_devices=4, timeout_s=280)
    for out in runs:
        lazy, captured = out["lazy"], out["captured"]
        assert captured["devices"] == 8
        _assert_identical(lazy, captured)
        assert captured["replayed"][3:] == [True] * (STEPS - 3), captured["replayed"]
        assert captured["compiles"] == 0
    assert runs[0]["captured"]["losses"] == runs[1]["captured"]["losses"]
