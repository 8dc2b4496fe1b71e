"""Positions that change from step to step are program inputs (``lazy/positions.py``); reads through pending
slices and reshapes take only what they read (``lazy/view_reads.py``).

A loop that selects, slices or writes at a Python int position that changes after every host read compiles the
first position's program and one that takes the position as an input, then nothing, and computes what CPU eager
computes; positions one step takes again in every step (a qkv split) stay constants. Each loop runs against
PyTorch on the CPU with the same code.
"""

from __future__ import annotations

import pytest
import torch

import lazyxla
from lazyxla import debug


def _compiles() -> int:
    return lazyxla.metrics.counters()["compiles"]


def _per_step(fn, steps) -> list[int]:
    """Compiles of each ``fn(step)`` call (each ends with a host read)."""
    counts = []
    for step in steps:
        before = _compiles()
        fn(step)
        counts.append(_compiles() - before)
    return counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_select_and_slice_at_a_changing_position_compile_twice_then_never(dtype, dev):
    x = (torch.arange(7 * 9) * 3 - 50).view(7, 9).to(dtype)
    xd = x.to(dev)

    def values(t, i):
        got = (t[i] * 2, t[:, i : i + 3] + 1, t[i - 7], t.narrow(1, i, 2).sum(1))  # i - 7: a negative index
        return torch.cat([g.flatten() for g in got])

    def step(i):
        got, want = values(xd, i).cpu(), values(x, i)  # one host read
        assert torch.equal(got, want) and got.dtype == want.dtype

    with lazyxla.config.override(known_values_limit=0):  # int64: computed on the device, not the host
        counts = _per_step(step, range(6))
    assert counts == [1, 1, 0, 0, 0, 0], counts  # the first positions' program, then the positions' one


def test_writes_at_a_changing_position_compile_twice_then_never(dev):
    def run(device, counts=None):
        seq = torch.zeros(3, 10, device=device)
        ids = torch.full((3, 10), -1, dtype=torch.int64, device=device)
        for i in range(8):
            before = _compiles()
            seq[:, i] = seq[:, i - 1] * 0.5 + i  # select_scatter at i, select at i - 1
            seq[:, i + 1 : i + 3] += 1.0  # slice_scatter of a fixed size
            ids[:, i] = (seq[:, i] * 10).long()  # an int64 write of another dtype's values
            torch.stack([seq.sum(), ids.sum().float()]).tolist()  # one host read of both
            if counts is not None:
                counts.append(_compiles() - before)
        return seq.cpu(), ids.cpu()

    counts: list = []
    want = run("cpu")
    with lazyxla.config.override(known_values_limit=0):
        got = run(dev, counts)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)
    # step 1 reads seq[:, 0], a position step 0 took, as a constant beside the new ones, inputs now: a program of
    # its own; from step 2 on every position is an input
    assert counts == [1, 1, 1] + [0] * 5, counts


def test_out_of_range_positions_raise_pytorchs_error_at_the_call(dev):
    x = torch.randn(6, 5)
    xd = x.to(dev)
    for i in range(3):  # the select and slice keys vary: their positions are inputs now
        xd[i].sum().item()
        xd[:, i : i + 2].sum().item()
    for bad in (6, -7, 100):
        with pytest.raises(IndexError) as cpu:
            x[bad]
        with pytest.raises(IndexError) as ours:
            xd[bad]
        assert str(ours.value) == str(cpu.value)
        with pytest.raises(IndexError, match="out of range"):
            xd.select(0, bad)
    for start in (4, 5):  # past the end: PyTorch's narrow error; slicing clamps as PyTorch does
        with pytest.raises(RuntimeError, match="exceeds dimension size"):
            xd.narrow(1, start, 2)
        assert torch.equal(xd[:, start : start + 2].cpu(), x[:, start : start + 2])
    with pytest.raises(RuntimeError) as cpu:
        x[:, 3] = torch.zeros(7)
    with pytest.raises(RuntimeError) as ours:
        xd[:, 3] = torch.zeros(7, device=dev)  # a write of the wrong size
    assert str(cpu.value) in str(ours.value)


def test_autograd_through_select_and_slice_at_changing_positions(dev):
    w = torch.randn(8, 6, requires_grad=True)
    wd = w.detach().to(dev).requires_grad_()

    def grads(t, i):
        loss = (t[i] * t[i + 1 : i + 3].sum(0)).sum() + t[:, i].pow(2).sum()
        return torch.autograd.grad(loss, t)[0]

    def step(i):
        torch.testing.assert_close(grads(wd, i).cpu(), grads(w, i))

    counts = _per_step(step, range(5))
    assert counts[2:] == [0, 0, 0] and sum(counts) <= 2, counts


def test_a_position_of_the_first_step_keeps_its_program(dev):
    """The positions a call took in its first step stay constants (a second identical loop then runs the first
    loop's programs): a loop that comes back to them runs the first step's program again."""
    x = torch.randn(4, 5).to(dev)
    counts = _per_step(lambda i: x[i].sum().item(), [0, 1, 2, 0, 1, 2])
    assert counts == [1, 1, 0, 0, 0, 0], counts


def test_a_second_identical_loop_compiles_nothing(dev):
    x = torch.randn(5, 6).to(dev)

    def loop():
        return [float((x[i] * x[:, i : i + 2].sum()).sum()) for i in range(4)]

    first = loop()
    before = _compiles()
    assert loop() == first
    assert _compiles() == before


def test_positions_one_step_takes_again_stay_constants(dev):
    """A training step slicing a fused projection (q, k, v) and rotary halves: the same positions every step, so the
    program keeps them as constants (no lazyxla.dynamic_* op), is the same with positions as inputs turned off,
    and step 3 compiles nothing."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(16, 48).to(dev)
    opt = torch.optim.SGD(proj.parameters(), lr=0.1)
    x = torch.randn(4, 16).to(dev)

    def step(flag: bool) -> tuple[str, int]:
        with lazyxla.config.override(dynamic_positions=flag):
            before = _compiles()
            h = proj(x)
            q, k, v = h[:, :16], h[:, 16:32], h[:, 32:]
            half = torch.cat([-q[:, 8:], q[:, :8]], 1)
            loss = ((half * k).sum(1) * v[:, 0] + v.select(1, 5)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            text = debug.ir_text([loss, *proj.parameters()])
            loss.item()
            lazyxla.sync()
            return text, _compiles() - before

    runs = [step(True) for _ in range(3)]
    assert "lazyxla.dynamic" not in runs[0][0] and runs[2][1] == 0, [c for _, c in runs]
    assert step(False)[0] == runs[2][0]  # the same program text without dynamic positions


def test_reads_through_a_growing_slice_take_only_what_they_read(dev):
    """Beam search's pattern: ``running[:, :, :n].reshape(-1, n)`` kept alive, its last column read by the step's
    work, a write at ``n``. The growing prefix is never computed (host reads leave a view of device data pending),
    so the step's program does not change with ``n``."""

    def run(device, counts=None):
        running = torch.zeros(2, 3, 12, device=device)
        running[:, :, :4] = torch.arange(24.0, device=device).view(2, 3, 4)
        prefix = None
        for n in range(4, 11):
            before = _compiles()
            prefix = running[:, :, :n].reshape(6, n)  # kept alive, as beam search keeps it
            last = prefix[:, -1:]  # read through the reshape and the slice
            new = (last * 0.5 + prefix[:, -1].view(6, 1)).view(2, 3)  # a select too
            running[:, :, n] = new
            assert float(new.sum()) == float(new.sum())  # a host read: computes the step's work
            running.sum().item()  # another read, which leaves the prefix pending
            if counts is not None:
                counts.append(_compiles() - before)
        return running.cpu(), prefix.cpu()

    counts: list = []
    want = run("cpu")
    got = run(dev, counts)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert counts[2:] == [0] * 5, counts


# How a loop keeps its growing prefix: running's shape, the prefix of length n, and whether the step reads through it.
PREFIXES = {
    "unsqueeze": ((6, 12), lambda r, n: r[:, :n].unsqueeze(0), True),
    "squeeze_dim": ((6, 1, 12), lambda r, n: r[:, :, :n].squeeze(1), True),
    "squeeze_all": ((6, 1, 12), lambda r, n: r[:, :, :n].squeeze(), True),
    "squeeze_all_kept_only": ((6, 1, 12), lambda r, n: r[:, :, :n].squeeze(), False),
}


@pytest.mark.parametrize("form", list(PREFIXES))
def test_reads_through_squeezes_of_a_growing_slice_take_only_what_they_read(dev, form):
    """As above, with the prefix squeezed or unsqueezed (``lazy/views.py``: reshapes all). Before one table of
    views, reads did not pass through ``unsqueeze``/``squeeze`` and host reads computed a pending ``squeeze()`` of
    device data: a program of a new shape every step. ``kept_only``: the step reads ``running`` itself."""
    shape, view, through = PREFIXES[form]

    def run(device, counts=None):
        running = torch.zeros(shape, device=device)
        running[..., :4] = torch.arange(24.0, device=device).view(*shape[:-1], 4)
        prefix = None
        for n in range(4, 11):
            before = _compiles()
            prefix = view(running, n)  # kept alive
            source = prefix if through else running[..., :n]
            new = source[..., -1:] * 0.5 + source[..., -1].unsqueeze(-1)  # a slice and a select from the end
            running[..., n] = new.reshape(running[..., n].shape)
            assert float(new.sum()) == float(new.sum())  # a host read: computes the step's work
            running.sum().item()  # another read, which leaves the prefix pending
            if counts is not None:
                counts.append(_compiles() - before)
        return running.cpu(), prefix.cpu()

    counts: list = []
    want = run("cpu")
    got = run(dev, counts)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert counts[2:] == [0] * 5, counts


def test_a_known_value_written_at_changing_positions_compiles_nothing(dev):
    ids = torch.zeros(2, 8, dtype=torch.int64).to(dev)  # small integers the host knows (lazy/known.py)
    before = _compiles()
    for i in range(8):
        ids[:, i] = i * 3
        assert ids[:, : i + 1].tolist() == [[3 * j for j in range(i + 1)]] * 2
    assert _compiles() == before


def test_turned_off_each_position_compiles_a_program(dev):
    x = torch.randn(6, 4).to(dev)
    with lazyxla.config.override(dynamic_positions=False):
        counts = _per_step(lambda i: x[i].sum().item(), range(4))
    assert counts == [1, 1, 1, 1]
