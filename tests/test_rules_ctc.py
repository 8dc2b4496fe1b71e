"""The CTC loss against CPU eager (rules/ctc.py), forward and backward, with nothing run on the CPU (strict mode):
targets padded (2-d) or concatenated (1-d), lengths as tensors or int lists, every reduction, repeated labels,
empty targets, sequences shorter than the batch's frames, ``blank`` not 0, infeasible alignments with and without
``zero_infinity``, float64; and a batch of other lengths reuses the program."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from tests.util import to_dev

TOL = dict(rtol=1e-4, atol=1e-5)
T, N, C = 12, 3, 6


@pytest.fixture(autouse=True)
def _strict():
    with lazyxla.config.override(strict=True):
        yield
    assert not [k for k in lazyxla.metrics.counters() if k.startswith("fallback.")]


def _batch(target_lengths, input_lengths, padded: bool, blank: int = 0, width: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = [c for c in range(C) if c != blank]
    rows = torch.tensor(labels)[torch.randint(0, len(labels), (N, width), generator=g)]
    rows[0, 1] = rows[0, 0]  # a repeated label: the alignment needs a blank between them
    tl = torch.tensor(target_lengths)
    targets = rows if padded else torch.cat([rows[i, : tl[i]] for i in range(N)])
    logits = torch.randn(T, N, C, generator=g, dtype=torch.float64).float()
    return logits, targets, torch.tensor(input_lengths), tl


def _compare(logits, targets, il, tl, as_lists=False, dtype=torch.float32, **kw):
    """F.ctc_loss of log_softmax(logits) on lazyxla and on the CPU: loss and gradient by the logits."""

    def run(x, targets, input_lengths, target_lengths):
        loss = F.ctc_loss(x.log_softmax(2), targets, input_lengths, target_lengths, **kw)
        (grad,) = torch.autograd.grad(loss.sum(), x)
        return loss, grad

    x = logits.to(dtype)
    want = run(x.clone().requires_grad_(), targets, il, tl)
    lengths = (il.tolist(), tl.tolist()) if as_lists else (to_dev(il), to_dev(tl))
    got = run(to_dev(x).requires_grad_(), to_dev(targets), *lengths)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, **TOL, equal_nan=True)


@pytest.mark.parametrize(
    "reduction,padded,as_lists",
    [("mean", True, False), ("mean", False, False), ("none", False, True), ("sum", True, True)],
    ids=["mean-padded-tensors", "mean-concatenated-tensors", "none-concatenated-lists", "sum-padded-lists"],
)
def test_ctc_loss(reduction, padded, as_lists):
    # lengths 3 (with a repeat), 0 (all blank) and 5; inputs of 12, 7 and 10 frames
    batch = _batch([3, 0, 5], [12, 7, 10], padded)
    _compare(*batch, as_lists=as_lists, reduction=reduction)


def test_blank_not_zero_and_float64():
    batch = _batch([2, 4, 1], [9, 12, 3], padded=True, blank=C - 1)
    _compare(*batch, blank=C - 1, reduction="sum", dtype=torch.float64)


@pytest.mark.parametrize("zero_infinity", [True, False])
def test_infeasible_alignment(zero_infinity):
    # sequence 1 has 5 labels with a repeat (6 frames needed) in 4 frames: an infinite loss
    batch = _batch([3, 5, 2], [12, 4, 10], padded=False)
    _compare(*batch, zero_infinity=zero_infinity, reduction="none")


def test_the_lengths_do_not_recompile():
    # tensor lengths are values of the program, not constants: a batch of other lengths reuses it
    _compare(*_batch([3, 1, 5], [12, 7, 10], padded=True), reduction="mean")
    compiles = lazyxla.metrics.counters()["compiles"]
    _compare(*_batch([2, 4, 6], [11, 12, 8], padded=True, seed=1), reduction="mean")
    assert lazyxla.metrics.counters()["compiles"] == compiles


def test_private_op_with_list_lengths_has_pytorch_shapes():
    # int-list lengths: log_alpha is PyTorch's (batch, frames, 2 * max target length + 1)
    logits, targets, il, tl = _batch([3, 0, 5], [12, 7, 10], padded=True)
    lp = logits.log_softmax(2)
    want = torch.ops.aten._ctc_loss(lp, targets, il.tolist(), tl.tolist(), 0, False)
    got = torch.ops.aten._ctc_loss(to_dev(lp), to_dev(targets), il.tolist(), tl.tolist(), 0, False)
    assert got[1].shape == want[1].shape == (N, T, 11)
    torch.testing.assert_close(got[0].cpu(), want[0], **TOL)
