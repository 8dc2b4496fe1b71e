"""Recompile explanations name the real cause: the data input whose length changed (not a parameter), a graph
that grows because a host read left work pending (with the line that left it), a baked Python value.

The texts are user-facing (``lazyxla.metrics.recompiles()`` and the ``lazyxla`` logger), so they are checked
whole.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
from lazyxla.lowering import cache

_HERE = os.path.abspath(__file__)


def _line(tag: str) -> str:
    """``this_file:line`` of the line holding ``# tag:<tag>``."""
    with open(_HERE) as f:
        for number, text in enumerate(f.read().splitlines(), 1):
            if text.rstrip().endswith(f"# tag:{tag}"):
                return f"{_HERE}:{number}"
    raise AssertionError(tag)


@pytest.fixture(autouse=True)
def _no_compiled_programs():
    """Compile counts are this test's own: programs other tests left in memory would be hits."""
    cache.clear()


@pytest.fixture
def explain():
    with lazyxla.config.override(explain_recompiles=True):
        yield


def _reasons() -> list[str]:
    return [r["reason"] for r in lazyxla.metrics.recompiles()]


class _TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(32, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))  # tag:embed
        return self.head(self.layer(x))


def _train(model, batches, dev=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for ids in batches:
        ids = ids.to(dev) if dev is not None else ids  # tag:batch
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()  # tag:opt-step
        opt.zero_grad()
        if dev is not None:
            lazyxla.sync()  # tag:train-sync
        losses.append(loss.detach())
    return [float(x) for x in losses]


def test_a_changing_sequence_length_is_named_on_the_data_input_not_a_parameter(dev, explain):
    torch.manual_seed(0)
    cpu_model = _TinyTransformer()
    model = _TinyTransformer()
    model.load_state_dict(cpu_model.state_dict())
    model.to(dev)
    batches = [torch.randint(0, 64, (4, n)) for n in (16, 16, 12, 16)]
    losses = _train(model, batches, dev)
    torch.testing.assert_close(losses, _train(cpu_model, batches), rtol=1e-4, atol=1e-5)
    assert lazyxla.metrics.counters()["compiles"] == 3  # steps 1 and 2, then length 12 (16 again: a cache hit)
    first, *lengths = _reasons()
    # step 2 is the first with AdamW's state: step 1 made it (zeros), step 2 reads it (its first foreach group, one
    # node for every parameter, takes AdamW's numbers where step 1's graph made the state)
    opt_step = re.escape(_line("opt-step"))
    assert re.fullmatch(
        rf"from op \d+ on the graph differs from the last one compiled here: it reads graph input \d+ \(a Python "
        rf"float\), first used by aten._foreach_\w+.Scalar \(recorded at {opt_step}\), where that one computed "
        rf"aten.zeros_like.default \(recorded at {opt_step}\)",
        first,
    ), first
    data = f"graph input 1 (data: copied from the CPU at {_line('batch')})"
    user = f"first used by aten.embedding.default (recorded at {_line('embed')})"
    assert lengths == [f"{data}: shape [4, 16] -> [4, 12] (dimension 1: 16 -> 12), {user}"]


_PENDING = (
    "A host read computes what it reads (and, in one process, the work the previous read at its line left pending); "
    "work recorded before it that it did not need stays pending into a later program: call lazyxla.sync() after the "
    "read (it computes every pending tensor), or read once the step's updates are recorded"
)


def _grows(ops: int, more: int, carried: int, read: str, left: str) -> str:
    """The explanation of a graph that grows by ``more`` ops, ``carried`` of them recorded before the read."""
    return (
        f"the graph grows from sync to sync ({ops} -> {ops + more} ops): it holds {carried} ops recorded before the "
        f"previous sync ({read}), which left them pending: {left}, with {carried - 1} ops they depend on. {_PENDING}"
    )


def _decode(h, w, head, emb, steps: int, sync_after_read: bool) -> list[int]:
    """Greedy decoding with a recurrent state: the state's update is recorded before the token is read."""
    tokens = []
    nxt = torch.zeros(1, dtype=torch.long).to(h.device)
    for _ in range(steps):
        logits = h @ head
        h = torch.tanh(h @ w + emb[nxt])  # tag:state
        nxt = logits.argmax(-1)
        tokens.append(nxt.item())  # tag:read
        if sync_after_read:
            lazyxla.sync()
    return tokens


def _weights():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=g) for s in ((1, 16), (16, 16), (16, 10), (10, 16))]


def test_a_graph_that_grows_with_work_a_host_read_left_pending_is_named_with_its_line(dev, explain):
    cpu = _weights()
    tokens = _decode(*[x.to(dev) for x in cpu], steps=4, sync_after_read=False)
    assert tokens == _decode(*cpu, steps=4, sync_after_read=False)
    # The first read's program, then one that also computes the state the first read left pending; from then on
    # each read computes the work the previous one left, so the graph stops growing (config.host_read_computes).
    assert lazyxla.metrics.counters()["compiles"] == 2
    read = f".item() at {_line('read')}"
    left = f"aten.tanh.default at {_line('state')}"
    assert _reasons() == [_grows(2, 4, 4, read, left)]
    assert {r["site"] for r in lazyxla.metrics.recompiles()} == {read}


def test_syncing_after_the_read_keeps_the_decoding_graph_fixed(dev, explain):
    cpu = _weights()
    tokens = _decode(*[x.to(dev) for x in cpu], steps=6, sync_after_read=True)
    assert tokens == _decode(*cpu, steps=6, sync_after_read=False)
    # the read's program and the update's, for every token; the first update keeps the caller's initial state
    assert lazyxla.metrics.counters()["compiles"] == 3
    pattern = (
        r"the same ops, shapes and constants, but this program gives the buffer of graph input 0 \(device data "
        r"\[1, 16\] float32 \(an output of graph [0-9a-f]{16}\)\), first used by aten.mm.default \(recorded at "
        rf"{re.escape(_line('state'))}\) to its outputs, where the last one compiled here kept it: a program may "
        r"reuse the buffers no live tensor holds after the sync, so a tensor kept alive in one step and not in "
        r"another \(or a caller's reference\) makes two programs"
    )
    (why,) = _reasons()
    assert re.fullmatch(pattern, why), why


def _generate(ids, emb, head, steps: int, sync_after_read: bool) -> torch.Tensor:
    """Greedy generation that appends each token to ``input_ids`` and reads it on the host."""
    for _ in range(steps):
        logits = emb[ids].sum(1) @ head  # tag:model
        nxt = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)  # tag:append
        if nxt.item() < 0:  # tag:stop
            break
        if sync_after_read:
            lazyxla.sync()
    return ids


def test_growing_input_ids_left_pending_by_a_host_read_per_token_are_named(dev, explain):
    _, _, head, emb = _weights()
    prompt = torch.tensor([[1, 2, 3, 4]])
    out = _generate(prompt.to(dev), emb.to(dev), head.to(dev), steps=4, sync_after_read=False)
    assert out.tolist() == _generate(prompt, emb, head, steps=4, sync_after_read=False).tolist()
    # Each read also computes the append the previous read left pending (config.host_read_computes), in a program
    # of its own: the graph no longer grows; what changes is the length of input_ids, and that is what is named.
    reasons = _reasons()
    assert not [r for r in reasons if "grows" in r], reasons
    assert reasons[0].startswith("from op 0 on the graph differs from the last one compiled here"), reasons
    pattern = (
        r"graph input 0 \(data: an output of graph [0-9a-f]{16}\): shape \[1, (\d+)\] -> \[1, (\d+)\] "
        rf"\(dimension 1: \1 -> \2\), first used by aten.cat.default \(recorded at {re.escape(_line('append'))}\)"
    )
    assert [re.fullmatch(pattern, r).groups() for r in reasons[1:]] == [("4", "5"), ("5", "6")], reasons


def test_growing_input_ids_synced_per_token_are_named_as_the_changing_data_input(dev, explain):
    _, _, head, emb = _weights()
    prompt = torch.tensor([[1, 2, 3, 4]])
    out = _generate(prompt.to(dev), emb.to(dev), head.to(dev), steps=4, sync_after_read=True)
    assert out.tolist() == _generate(prompt, emb, head, steps=4, sync_after_read=False).tolist()
    reasons = [r for r, site in zip(_reasons(), lazyxla.metrics.recompiles()) if _line("stop") in site["site"]]
    pattern = (
        r"graph input 1 \(data: an output of graph [0-9a-f]{16}\): shape \[1, (\d+)\] -> \[1, (\d+)\] "
        rf"\(dimension 1: \1 -> \2\), first used by aten.index.Tensor \(recorded at {re.escape(_line('model'))}\)"
    )
    assert [re.fullmatch(pattern, r).groups() for r in reasons] == [("4", "5"), ("5", "6"), ("6", "7")], reasons


def test_a_graph_without_the_pending_work_the_last_one_computed_names_that_work(dev, explain):
    x = torch.ones(4).to(dev)
    left = x * 3  # tag:leftover
    assert x.sum().item() == 4.0  # a read that does not need ``left``: it stays pending
    for _ in range(2):
        y = x + 1
        lazyxla.sync()  # tag:loop-sync
    assert left.tolist() == [3.0] * 4 and y.tolist() == [2.0] * 4
    assert lazyxla.metrics.recompiles() == [
        {
            "site": f"lazyxla.sync() at {_line('loop-sync')}",
            "reason": "at op 0 the last graph compiled here had 1 op and 1 input that this one does not (work left "
            f"pending before its sync): the first was aten.mul.Tensor (recorded at {_line('leftover')}); they were "
            f"recorded at {_line('leftover')}",
        }
    ]


def test_an_op_only_this_graph_has_is_named(dev, explain):
    x = torch.ones(4).to(dev)
    for relu in (False, True):
        y = x - 2
        if relu:
            y = y.relu()  # tag:branch
        y = y * 5
        lazyxla.sync()
    assert y.tolist() == [0.0] * 4
    (why,) = _reasons()
    assert why == (
        "at op 1 this graph has 1 op and 0 inputs that the last one compiled here did not have: the first is "
        f"aten.relu.default (recorded at {_line('branch')}); they were recorded at {_line('branch')}"
    )
