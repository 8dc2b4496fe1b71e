"""What a host read computes: what it needs, and the values other pending tensors take from that work.

A host read (``.item()``, ``.cpu()``) computes only what it needs and the live tensors computed on the way.
Pending tensors that build on that work (a position advanced after use, a sequence grown by ``torch.cat``)
are cut there: their graphs start from its results (``lazy/cut.py``), so no read's program holds the steps
before it. Slices and indexes within one piece of a pending ``cat`` read that piece (``lazy/view_reads.py``), so a
program that needs the last token of a growing sequence does not take the sequence. With
``config.host_read_computes = "all"`` a read computes every pending tensor but concatenations.
"""

from __future__ import annotations

import pytest
import torch

import lazyxla
from lazyxla.lazy.session import session
from lazyxla.lazy.tensor import unwrap
from lazyxla.lowering import cache
from lazyxla.lowering.registry import RULES, Rule
from lazyxla.lowering.to_jax import LoweringError
from lazyxla.observe import metrics
from tests.util import check, integers, uniform


def _counters():
    c = lazyxla.metrics.counters()
    return c["compiles"], c["nodes_executed"]


def _decode_loop(device, steps: int = 8):
    """A generation loop in miniature: the last token of a growing sequence is embedded and written into a
    cache at a position that is advanced after use; the next token is read back to decide whether to stop.
    Returns the sequence and, per step, the compiles and IR nodes its read ran."""
    g = torch.Generator().manual_seed(0)
    emb, head = torch.randn(16, 8, generator=g).to(device), torch.randn(8, 16, generator=g).to(device)
    cache = torch.zeros(steps + 1, 8, device=device)
    pos = torch.zeros((), dtype=torch.long, device=device)
    ids = torch.tensor([[3, 5]], device=device)
    per_step = []
    for _ in range(steps):
        before = _counters()
        cache = cache.index_copy(0, pos.view(1), emb[ids[:, -1]])
        pos = pos + 1  # the next step's position: pending, and not what this step's read needs
        tok = (cache.sum(0, keepdim=True) @ head).argmax(-1)
        ids = torch.cat([ids, tok[:, None]], -1)
        assert not bool((ids[:, -1] == 99).all())  # the read: every step's next token
        per_step.append(tuple(a - b for a, b in zip(_counters(), before)))
    return ids.cpu(), per_step


@pytest.mark.parametrize("policy", ["needed", "all"])
def test_a_decode_loop_reads_without_growing_its_programs(dev, policy):
    """Each step's read runs the same program from step 3 on. Before, the position's ``+ 1`` and the sequence's
    ``cat`` stayed pending over the computed steps: each read's program held every earlier step (it grew by a
    step's nodes each time) and compiled anew."""
    want, _ = _decode_loop(torch.device("cpu"))
    with lazyxla.config.override(host_read_computes=policy):
        got, per_step = _decode_loop(dev)
    assert torch.equal(got, want)
    compiles, nodes = zip(*per_step)
    assert sum(compiles[3:]) == 0, per_step
    assert len(set(nodes[2:])) == 1, per_step  # the same work every step


def test_a_read_cuts_pending_tensors_at_what_it_computed(dev):
    x = uniform(4).to(dev)
    y = x * 2
    later = y + 1  # pending, built on y: not needed by the read of y.sum()
    assert y.sum().item() == pytest.approx(float((uniform(4) * 2).sum()), rel=1e-6)
    assert not unwrap(y).pending
    node, _ = unwrap(later)._value
    assert all(not m.inputs for m, _ in node.inputs)  # later's graph now starts from device data
    torch.testing.assert_close(later.cpu(), uniform(4) * 2 + 1)


def test_a_cut_keeps_random_draws(dev):
    """A pending random op over computed work is rebuilt on the results with its own key: the same draw."""
    x = uniform(64).to(dev)
    noisy = x + torch.rand(64, device=dev)
    x.sum().item()
    first = noisy.cpu()
    torch.testing.assert_close(noisy.cpu(), first)
    assert ((first - uniform(64)) >= 0).all() and ((first - uniform(64)) < 1).all()


def _broken(ctx, x):
    raise ValueError("deliberately broken rule")


@pytest.fixture
def broken_cos(monkeypatch):
    """``torch.cos`` fails to lower (its rule raises)."""
    monkeypatch.setitem(RULES, torch.ops.aten.cos.default, Rule(_broken))
    cache.clear()


def test_a_read_does_not_raise_for_a_broken_op_it_does_not_need(dev, broken_cos):
    x = torch.ones(3).to(dev) * 2
    bad = torch.cos(x)  # pending, built on x
    assert x.sum().item() == 6.0
    with pytest.raises(LoweringError, match="deliberately broken rule"):
        bad.cpu()
    del bad
    lazyxla.sync()


def _counter_loop(device, steps: int = 8):
    """A loop whose reads need none of its work: a counter on the device decides when to stop."""
    x = uniform(4).to(device)
    done = torch.zeros((), device=device)
    for step in range(steps):
        x = torch.sin(x) * 1.5
        done = done + 1
        assert done.item() == step + 1
    return x


def test_work_a_read_left_pending_is_computed_at_the_next_read(dev):
    """Each read also computes the work the previous read left pending (in a program of its own), so the loop's
    work does not pile up until something reads it: the final read runs the last step only. Before, it ran
    one program holding every step."""
    want = _counter_loop(torch.device("cpu"))
    got = _counter_loop(dev)
    compiles, nodes = _counters()
    got = got.cpu()
    torch.testing.assert_close(got, want)
    assert _counters()[1] - nodes <= 2  # sin and mul: the last step
    assert _counters()[0] - compiles <= 1


def _one_pass(device):
    """A pass that reads a mask it was given twice, at two lines, with its own work pending (as transformers reads
    the padding mask a few ops into a forward), and reads its result at the end."""
    mask = torch.tensor([[True, True, False]]).to(device)  # copied from the CPU: known values, read without a program
    x = uniform(4).to(device)
    if device.type != "cpu":
        lazyxla.sync()
    executions = metrics.count("executions")
    h = torch.sin(x) * 1.5  # pending through both reads
    first = bool(mask.all())
    second = bool(mask[:, :2].all())
    return (h * 2).sum().item(), (first, second), metrics.count("executions") - executions


def test_reads_at_two_lines_of_one_pass_leave_its_work_to_the_pass(dev):
    """The left-over rule is per read site: a read computes work that was pending at the previous read of *its*
    line, so two reads at different lines of one pass run nothing, and the pass is one program (before, the
    second read computed ``sin`` and ``mul`` in a program of their own)."""
    want, want_flags, _ = _one_pass(torch.device("cpu"))
    got, flags, programs = _one_pass(dev)
    assert flags == want_flags == (False, True)
    assert got == pytest.approx(want, rel=1e-6)
    assert programs == 1


def test_work_left_pending_that_fails_changes_nothing(dev, broken_cos):
    """A broken op left pending across reads does not make the reads fail: it raises where it is read."""
    x = torch.ones(3).to(dev)
    bad = torch.cos(x * 2)
    failures = metrics.count("left_over_failures")
    for i in range(3):
        assert (x + i).sum().item() == 3 * (1 + i)
    # the reads met the failure computing left-over work: counted and kept for debugging, not raised there
    assert metrics.count("left_over_failures") > failures
    assert "deliberately broken rule" in str(session.left_over_error)
    with pytest.raises(LoweringError, match="deliberately broken rule"):
        bad.cpu()
    del bad
    lazyxla.sync()


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("computes", ["needed", "all"])
def test_a_reads_policy(monkeypatch, processes, computes):
    """What a read computes besides its values, decided once per read: in a multi-process run nothing more."""
    from lazyxla.device import processes as processes_module
    from lazyxla.lazy.graph import ReadPolicy

    monkeypatch.setattr(processes_module, "process_count", lambda: processes)
    with lazyxla.config.override(host_read_computes=computes):
        host, runtime = ReadPolicy.of(host_read=True), ReadPolicy.of(host_read=False)
    alone = processes == 1
    assert host == ReadPolicy(
        everything=alone and computes == "all",
        donates=alone and computes == "all",
        cuts=alone,
        counts_epoch=alone,
        left_over=alone,
    )
    assert runtime == ReadPolicy(everything=False, donates=False, cuts=alone, counts_epoch=alone, left_over=False)


# ---- slices and indexes of a pending cat ----

CAT_READS = {
    "last": lambda c: c[:, -1:],
    "last_ellipsis": lambda c: c[..., -1:],
    "select_last": lambda c: c[:, -1],
    "first_piece": lambda c: c[:, :3],
    "inside_piece": lambda c: c[:, 1:2],
    "across_pieces": lambda c: c[:, 2:5],
    "past_the_end": lambda c: c[:, 4:100],
    "stepped": lambda c: c[:, ::2],
    "empty": lambda c: c[:, 5:5],
    "negative_dim": lambda c: c.select(-1, 0),
    "other_dim": lambda c: c[1:],
    "nested": lambda c: torch.cat([c, c[:, :1] * 2], -1)[:, -2:],
}


@pytest.mark.parametrize("name", list(CAT_READS))
def test_reads_of_a_pending_cat(name):
    a, b = uniform(2, 3), uniform(2, 2, seed=1)
    check(lambda a, b: CAT_READS[name](torch.cat([a * 1, b + 1], -1)), a, b)


def test_a_slice_of_a_promoting_cat_keeps_the_promoted_dtype():
    check(lambda a, b: torch.cat([a * 1, b + 1], 0)[-2:], integers(3), uniform(2))


@lazyxla.config.override(known_values_limit=0)  # token ids the device computed, not ones the host knows
def test_the_last_token_of_a_pending_cat_is_read_without_the_sequence(dev):
    ids = integers(2, 5, lo=0, hi=9).to(dev)
    tok = ids[:, :1] + 1
    seq = torch.cat([ids, tok], -1)
    node, _ = unwrap(seq[:, -1:])._value
    assert node is unwrap(tok)._value[0]
    assert seq[:, -1].tolist() == (integers(2, 5, lo=0, hi=9)[:, 0] + 1).tolist()


# ---- config.host_read_computes = "all" ----


def test_all_computes_every_pending_tensor_but_concatenations(dev):
    with lazyxla.config.override(host_read_computes="all"):
        x = uniform(4).to(dev)
        other = x * 3
        seq = torch.cat([x, other + 1])
        x.sum().item()
        assert not unwrap(other).pending
        assert unwrap(seq).pending  # its pieces were computed; the concatenation waits for a reader
        torch.testing.assert_close(seq.cpu(), torch.cat([uniform(4), uniform(4) * 3 + 1]))


def test_all_keeps_the_inputs_a_pending_cat_reads(dev):
    """A buffer no tensor holds but a pending cat reads is an input of the read's program: it is not donated."""
    with lazyxla.config.override(host_read_computes="all"):
        x = uniform(4).to(dev)
        seq = torch.cat([x, x * 2])
        total = (x * 5).sum()
        del x  # only seq's graph reads x's buffer now
        total.item()
        torch.testing.assert_close(seq.cpu(), torch.cat([uniform(4), uniform(4) * 2]))


def test_host_read_computes_rejects_unknown_values(dev):
    x = torch.ones(2).to(dev) + 1
    # refused where it is set (config's choices), not first at the read
    with pytest.raises(ValueError, match="needed"), lazyxla.config.override(host_read_computes="everything"):
        x.sum().item()
    assert lazyxla.config.host_read_computes == "needed" and x.sum().item() == 4.0
