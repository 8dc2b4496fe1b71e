"""Real clients, unmodified: Hugging Face transformers architectures train on lazyxla as on eager PyTorch.

Each architecture of tests/clients/architectures.py (causal LMs, encoders, seq2seq, vision, audio) is built from
a tiny random config (nothing is downloaded) and trained 4 AdamW steps on lazyxla, checked against CPU eager
by the rule of tests/clients/agreement.py (losses, and each step's gradients, update, parameters and optimizer
state, within rtol 1e-4 / atol 1e-5); no op may fall back to the CPU and no program may compile after step 2.

The optimizer is HF Trainer's default, ``AdamW(fused=True)`` ("adamw_torch_fused" since torch 2.8); Llama and BERT
also train with torch's default ``AdamW`` (``_foreach_*`` ops, as a hand-written loop or accelerate builds it),
and Llama with SGD and momentum, whose end points (unlike AdamW's, see agreement.py) are compared directly with
an independent CPU run's. The fused step is one op for all parameters; the foreach step is a dozen ops per
parameter, whose programs take XLA about 1.5 times as long to compile, which is why the tier runs it on two
architectures rather than all (the tier: about 2 minutes on 2 cores).
"""

from __future__ import annotations

import copy

import pytest
import torch

import lazyxla
from tests.clients.agreement import TOL, train_like_eager
from tests.clients.architectures import ARCHITECTURES, build
from tests.util import train_steps

STEPS = 4


def _adamw(params):
    """HF Trainer's default optimizer ("adamw_torch_fused" since torch 2.8): one fused op for all parameters."""
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01, fused=True)


def _adamw_foreach(params):
    """torch's default AdamW, as a hand-written loop or accelerate builds it: ``_foreach_*`` ops, split per tensor."""
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _loss(model, **batch):
    return model(**batch).loss


def _assert_compiled_nothing_after_step_2(compiles: list[int]) -> None:
    assert compiles[1:] == [compiles[1]] * (STEPS - 1), compiles


def _assert_no_fallback() -> None:
    counters = lazyxla.metrics.counters()
    assert not any(k.startswith("fallback.") for k in counters), counters


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_architecture_trains_like_eager(name, dev):
    model, batch = build(name)
    result = train_like_eager(model, batch, _loss, _adamw, dev, STEPS)
    _assert_compiled_nothing_after_step_2(result["compiles"])
    _assert_no_fallback()


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_foreach_adamw_trains_like_eager(name, dev):
    model, batch = build(name)
    result = train_like_eager(model, batch, _loss, _adamw_foreach, dev, STEPS)
    _assert_compiled_nothing_after_step_2(result["compiles"])
    _assert_no_fallback()


def test_sgd_end_points_equal_eager(dev):
    model, batch = build("llama")
    ref, ref_losses = train_steps(copy.deepcopy(model), batch, _loss, _sgd, torch.device("cpu"), STEPS)
    compiles: list[int] = []
    lazy, losses = train_steps(
        model, batch, _loss, _sgd, dev, STEPS, on_step=lambda: compiles.append(lazyxla.metrics.counters()["compiles"])
    )
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
    ref_params = dict(ref.named_parameters())
    for pname, p in lazy.named_parameters():
        want = ref_params[pname].detach()
        torch.testing.assert_close(p.detach().cpu(), want, **TOL, msg=lambda m, pname=pname: f"{pname}: {m}")
    _assert_compiled_nothing_after_step_2(compiles)
    _assert_no_fallback()
