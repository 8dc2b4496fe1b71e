"""Iterating a lazyxla tensor (``for row in t``, ``all(t)``, ``list(t)``): a bounded number of programs.

``Tensor.__iter__`` is ``iter(t.unbind(0))``: every piece exists at once. The first read of one computed all of
them as outputs of one program (XLA compiles that in time about quadratic in the output count: PyTorch's
``test_linspace`` never finished), and each further read copied one element to the host. A wide unbind's pieces
are selects of their base at a position that is a program input, never outputs of a sync; their host reads come
from one host copy of the base (``lazy/pieces.py``). Counted here by the metrics, never by timing.
"""

from __future__ import annotations

import pytest
import torch

import lazyxla
from lazyxla.lazy.pieces import WIDE


def _counts():
    c = lazyxla.metrics.counters()
    return {k: c[k] for k in ("compiles", "executions", "device_to_host")}


def _delta(before):
    return {k: v - before[k] for k, v in _counts().items()}


def test_all_of_a_large_pending_tensor_runs_a_bounded_number_of_programs(dev):
    n = 100_000
    y = torch.linspace(0, n - 1, n, device=dev, dtype=torch.float64)
    cond = y[:-1] < y[1:]  # test_linspace's check, pending
    before = _counts()
    assert all(cond)
    took = _delta(before)
    assert took["compiles"] <= 2 and took["executions"] <= 2, took
    assert took["device_to_host"] <= 2, took  # not one per element
    z = y[:1000].clone()
    z[500] = -1.0
    assert not all(z[:-1] < z[1:])


def test_a_loop_over_rows_is_one_program_for_every_row(dev):
    x_cpu = torch.randn(2 * WIDE, 5, generator=torch.Generator().manual_seed(0))
    x = x_cpu.to(dev)
    lazyxla.sync()
    before = _counts()
    sums = [(row * 2).sum().item() for row in x]
    took = _delta(before)
    assert took["compiles"] <= 2, took  # not one per row, nor one program with a row per output
    assert sums == pytest.approx([(row * 2).sum().item() for row in x_cpu], rel=1e-5)


def test_a_sync_keeps_the_pieces_views_and_outputs_none_of_them(dev):
    x = torch.arange(3 * WIDE, dtype=torch.float32, device=dev).reshape(WIDE, 3) * 2
    parts = list(x)
    report = lazyxla.sync()
    assert len(report.programs) == 1 and report.programs[0].new_bytes <= x.numel() * 4  # x, not also its rows
    expected = list(torch.arange(3 * WIDE, dtype=torch.float32).reshape(WIDE, 3) * 2)
    assert all(torch.equal(p.cpu(), e) for p, e in zip(parts, expected))


@pytest.mark.parametrize("rows", [3, WIDE + 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex64, torch.bool])
def test_pieces_are_views_with_the_cpus_values(dev, rows, dtype):
    base = torch.arange(rows * 4).reshape(rows, 4)
    base = (base % 3 == 0) if dtype is torch.bool else base.to(dtype)
    results = []
    for device in ("cpu", dev):
        t = base.to(device) + (False if dtype is torch.bool else 1)
        pieces = list(t)
        assert len(pieces) == rows and all(p.shape == (4,) and p.dtype == dtype for p in pieces)
        first = [p.cpu().clone() for p in pieces]  # (.cpu() of a CPU tensor is itself)
        pieces[1][2] = base[0, 0]  # a write through a piece shows in t
        t[rows - 1] = base[1]  # a write to t shows in its piece
        scalars = [bool(e) if dtype is torch.bool else e.item() for e in pieces[2]]
        results.append((first, t.cpu(), [p.cpu() for p in pieces], scalars))
    (cpu_first, cpu_t, cpu_after, cpu_scalars), (first, t, after, scalars) = results
    assert all(torch.equal(a, b) for a, b in zip(first + after, cpu_first + cpu_after))
    assert torch.equal(t, cpu_t) and scalars == cpu_scalars


def test_iterating_a_0d_tensor_raises_the_cpus_error(dev):
    with pytest.raises(TypeError) as cpu:
        iter(torch.tensor(1.0))
    with pytest.raises(TypeError) as ours:
        iter(torch.tensor(1.0, device=dev))
    assert str(ours.value) == str(cpu.value)
