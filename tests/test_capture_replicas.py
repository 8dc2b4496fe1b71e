"""Whole-step capture of multi-process replica steps (``lazyxla.compile(step, capture=True)`` with collectives in
the step: ``lazyxla.optimizer_step``, ``lazyxla.all_reduce``, DistributedDataParallel over the lazyxla process
group): every rank's replayed steps compute exactly what lazy mode computes, and a call whose guards differ on one
rank only is recorded on every rank (a replay on one rank while another records would meet mismatched
collectives).

Each case runs 2 processes on 127.0.0.1 (``lazyxla.spawn``, bounded by its ``timeout_s``: a hang fails the test),
lazy mode first, then the same training captured, from the same seeds.
"""

from __future__ import annotations

import statistics

import torch

import lazyxla
from tests import capture_replica_workers as W

STEPS = 10


def _run(mode: str, asym_at: int | None = None) -> list[tuple[dict, dict]]:
    ranks = lazyxla.spawn(W.compare, args=(mode, STEPS, asym_at), nprocs=2, timeout_s=280)
    return [(r["lazy"], r["captured"]) for r in ranks]


def _assert_identical(lazy: dict, captured: dict) -> None:
    assert captured["losses"] == lazy["losses"]
    for k, want in lazy["params"].items():
        torch.testing.assert_close(captured["params"][k], want, rtol=0, atol=0, msg=k)


def _host_figure(mode: str, lazy: dict, captured: dict) -> str:
    warm = slice(4, None)
    ms = {k: statistics.median(r["host_ms"][warm]) for k, r in (("lazy", lazy), ("captured", captured))}
    cpu = {k: statistics.median(r["cpu_ms"][warm]) for k, r in (("lazy", lazy), ("captured", captured))}
    return (
        f"replicas {mode}, 2 processes: host ms/step lazy {ms['lazy']:.2f}, captured {ms['captured']:.2f}; "
        f"CPU ms/step lazy {cpu['lazy']:.2f}, captured {cpu['captured']:.2f}"
    )


def test_captured_replica_training_equals_lazy_mode_on_every_rank():
    mode = "optimizer_step"
    runs = _run(mode)
    for lazy, captured in runs:
        _assert_identical(lazy, captured)
        assert captured["statuses"][-1] == "replaying", captured["statuses"]
        assert captured["replays"] >= STEPS - 3, captured  # calls 1-3 are recorded (learn, record, verify)
        assert captured["replayed"][3:] == [True] * (STEPS - 3), captured["replayed"]
        assert captured["compiles"] == 0  # it runs lazy mode's programs
    assert runs[0][0]["losses"] == runs[1][0]["losses"]  # (the all-reduced mean: the ranks did meet)
    print(_host_figure(mode, *runs[0]))  # (a figure for the record; timing is not asserted)


def test_a_guard_that_differs_on_one_rank_records_that_call_on_every_rank():
    """At call 5 rank 1 alone passes another loss scale (a Python number of the step: a changed guard there).
    Rank 0's guards match its verified step, but it records too: both ranks run the recorded program, whose
    collectives meet, and equal lazy mode."""
    at = 5
    runs = _run("optimizer_step", asym_at=at)
    for rank, (lazy, captured) in enumerate(runs):
        _assert_identical(lazy, captured)
        assert captured["replayed"][3:at] == [True] * (at - 3), captured["replayed"]
        assert captured["replayed"][at] is False, captured["replayed"]
        assert captured["replayed"][-2:] == [True, True], captured["replayed"]
        if rank:
            assert "its guards differ from every verified step's" in captured["statuses"][at], captured["statuses"]
        else:  # its recorded call is its verified step again: it replays from the next call on
            assert captured["misses"][at].startswith("another process records this call"), captured["misses"]
            assert captured["statuses"][at] == "replaying", captured["statuses"]
    # the calls after the change: rank 1's guards are the verified ones again, so both replay at once
    assert runs[0][1]["replayed"] == runs[1][1]["replayed"]


def test_a_distributed_data_parallel_step_is_recorded_and_says_why():
    """DDP's reducer keeps its gradient buckets (device tensors) in C++ between steps; the step reads them, so a
    replay could not find them: every call is recorded on every rank, equal to lazy mode, and the status names
    DDP and what to use instead."""
    for lazy, captured in _run("ddp"):
        _assert_identical(lazy, captured)
        assert captured["replays"] == 0
        assert "the step runs DistributedDataParallel, whose gradient buckets" in captured["statuses"][-1]
        assert "lazyxla.optimizer_step(opt)" in captured["statuses"][-1]


def test_a_call_that_another_rank_does_not_make_raises_in_bounded_time():
    """Rank 0 calls the replayed step once more than rank 1: the call waits for rank 1's agreement, not in the
    program's collectives, and raises a named error after ``config.distributed_timeout_s`` (5 s here)."""
    first, second = lazyxla.spawn(W.one_call_more, nprocs=2, timeout_s=200)
    assert first["replays"] == second["replays"] == 2  # calls 4 and 5 replayed
    assert first["error"] is not None and "every process must call such a step the same number of times" in (
        first["error"].lower()
    ), first["error"]
    assert first["seconds"] < 60, first["seconds"]


def test_changed_replica_groups_record_again_and_equal_lazy_mode():
    """The step all-reduces its gradients over the replica groups in a list of its closure; changing that list in
    place (each rank alone from call 5 on) is a changed guard: both ranks record, then replay the new program."""
    at = 5
    for lazy, captured in _run("groups", asym_at=at):
        _assert_identical(lazy, captured)
        assert captured["replayed"][3:at] == [True] * (at - 3), captured["replayed"]
        assert "its guards differ from every verified step's" in captured["statuses"][at], captured["statuses"]
        assert captured["replayed"][at : at + 2] == [False, False], captured["replayed"]  # record, verify
        assert captured["replayed"][at + 2 :] == [True] * (STEPS - at - 2), captured["replayed"]
