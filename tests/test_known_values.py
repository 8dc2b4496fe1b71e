"""Known values (lazy/known.py): small integer and bool tensors whose values the host has.

Ops on them are computed by PyTorch's CPU kernels (so they equal eager PyTorch, errors included), their host
reads compile and sync nothing, and programs take them as inputs, so a value that changes does not recompile.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import lazyxla
from lazyxla.lazy.known import host_value
from lazyxla.lazy.tensor import unwrap


def _counts():
    c = lazyxla.metrics.counters()
    return c["compiles"], c.get("syncs", 0), c.get("ops_folded", 0)


def _known(t) -> bool:
    return host_value(unwrap(t)) is not None


@pytest.fixture
def fresh(dev):
    lazyxla.sync()
    lazyxla.metrics.reset()
    return dev


def test_reads_of_host_built_integers_compile_nothing(fresh):
    dev = fresh
    eos = torch.tensor([2, 5], device=dev)
    pad = torch.tensor(0, device=dev)
    ids = torch.tensor([[3, 4, 2], [0, 6, 7]]).to(dev)
    mask = ids.ne(0).long()
    assert not torch.isin(eos, pad).any()
    assert not (eos < 0).any().item()
    assert (mask[:, -1] == 0).sum().item() == 0
    assert mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    assert torch.equal(mask.cumsum(-1).cpu(), torch.tensor([[1, 2, 3], [0, 1, 2]]))
    compiles, syncs, folded = _counts()
    assert (compiles, syncs) == (0, 0)
    assert folded >= 8


def test_a_changing_known_value_is_a_program_input(fresh):
    """A decoding step indexes a float cache with a position the host advances each step: one program."""
    dev = fresh
    cache = torch.arange(24.0).reshape(6, 4)
    pos = torch.arange(3, device=dev)[-1:]
    d_cache = cache.to(dev)
    lazyxla.metrics.reset()
    for step in range(3):
        pos = pos + 1  # 3, 4, 5: computed on the host
        done = torch.full((1,), step == 2, device=dev)  # generate's max-length flag: False, False, True
        row = d_cache.index_select(0, pos) * 2 + done.float()
        assert torch.equal(row.cpu(), cache[3 + step : 4 + step] * 2 + (step == 2))
    assert lazyxla.metrics.counters()["compiles"] == 1
    assert _known(pos) and _known(done)


INT_OPS = {
    "add": lambda a, b: a + b,
    "mul_scalar": lambda a, b: a * 3 - 7,
    "floor_divide": lambda a, b: torch.div(a, b.clamp(min=1), rounding_mode="floor"),
    "remainder": lambda a, b: torch.remainder(a, b.clamp(min=1)),
    "bitwise": lambda a, b: (a & b) | (a ^ 5),
    "shift": lambda a, b: a << 2,
    "compare": lambda a, b: (a >= b) & ~(a == 3),
    "where": lambda a, b: torch.where(a > b, a, b),
    "cumsum": lambda a, b: a.cumsum(0),
    "sort": lambda a, b: a.sort(descending=True).values,
    "argmax": lambda a, b: a.argmax(),
    "topk": lambda a, b: a.topk(2).indices,
    "index": lambda a, b: a[b.clamp(0, 4)],
    "scatter": lambda a, b: torch.zeros(5, dtype=torch.long, device=a.device).index_add(0, b.clamp(0, 4), a),
    "cat_flip": lambda a, b: torch.cat([a, b]).flip(0)[1:4],
    "nonzero": lambda a, b: (a > 2).nonzero(),
    "unique": lambda a, b: torch.unique(a),
    "isin": lambda a, b: torch.isin(a, b),
    "int32": lambda a, b: a.int() * 2,
    "bool_sum": lambda a, b: (a > b).sum(),
    "overflow": lambda a, b: (a + 2**62) * 4,
}


@pytest.mark.parametrize("name", sorted(INT_OPS))
def test_integer_ops_on_known_values_equal_eager(name, fresh):
    dev = fresh
    a, b = torch.tensor([3, -1, 7, 2, 3]), torch.tensor([1, 4, 0, 2, 9])
    want = INT_OPS[name](a, b)
    got = INT_OPS[name](a.to(dev), b.to(dev))
    assert _known(got), "an integer op on known values is computed on the host"
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    assert _counts()[:2] == (0, 0)


def test_an_in_place_update_keeps_the_value_known_and_right(fresh):
    dev = fresh
    src = torch.tensor([1, 2, 3])
    t = src.to(dev)
    src[0] = 100  # the host's copy is the device's value, not the caller's tensor
    t[1] = 20
    t.add_(1)
    assert _known(t) and t.tolist() == [2, 21, 4]
    assert _counts()[0] == 0


def test_errors_are_eager_pytorchs_at_the_users_line(fresh):
    dev = fresh
    t = torch.tensor([1, 2, 3], device=dev)
    with pytest.raises(IndexError, match="out of bounds"):
        t[torch.tensor([5], device=dev)].tolist()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.div(t, torch.zeros(3, dtype=torch.long, device=dev), rounding_mode="floor")


def test_what_is_never_known(fresh):
    """Floats are the device's arithmetic; random draws are the device's stream; large tensors stay on the
    device; and the limit 0 turns it all off. Their values are still right."""
    dev = fresh
    f = torch.arange(3.0, device=dev) * 2
    r = torch.randint(0, 10, (4,), device=dev)
    big = torch.arange(5000, device=dev)
    grown = torch.tensor([1, 2], device=dev).repeat(3000)
    assert not any(_known(t) for t in (f, r, big, grown))
    assert torch.equal(f.cpu(), torch.arange(3.0) * 2) and torch.equal(grown.cpu(), torch.tensor([1, 2]).repeat(3000))
    assert ((r >= 0) & (r < 10)).all()
    with lazyxla.config.override(known_values_limit=0):
        off = torch.tensor([1, 2], device=dev) + 1
        assert not _known(off) and off.tolist() == [2, 3]


def test_a_known_read_still_computes_the_work_the_previous_read_left(fresh):
    """Generation without an end-of-sequence token reads only known flags; each read must still compute what
    the previous one left pending, or the whole loop piles up into one program (lazy/graph.py)."""
    dev = fresh
    w = torch.randn(8, 8).to(dev)
    x = torch.randn(1, 8).to(dev)
    flag = torch.tensor([True], device=dev)
    executed = []
    for _ in range(6):
        x = torch.tanh(x @ w)
        assert bool(flag.all())
        executed.append(lazyxla.metrics.counters()["nodes_executed"])
    steps = [b - a for a, b in zip(executed, executed[1:])]
    assert all(0 < s <= steps[1] for s in steps[1:]), steps  # each read computes one step: nothing piles up


def test_an_exported_program_computes_from_its_integer_inputs(fresh):
    """``lazyxla.export`` records with nothing computed on the host: integer example inputs stay inputs."""
    exported = lazyxla.export(lambda ids: (ids + 1) * torch.tensor(2, device=ids.device), (torch.tensor([1, 2, 3]),))
    with jax.enable_x64(True):
        got = exported.call(np.array([10, 20, 30]))
    assert np.asarray(got).tolist() == [22, 42, 62]
