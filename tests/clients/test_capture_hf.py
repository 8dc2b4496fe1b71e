"""Real clients, unmodified: a Hugging Face model's training loop, as Trainer runs it, under whole-step capture.

HF Trainer's defaults: ``AdamW(fused=True)``, ``get_linear_schedule_with_warmup`` stepped after every optimizer
step, and the loss accumulated on the device (``tr_loss += loss.detach()``). The loop is captured
(``lazyxla.compile(step, capture=True)``) and must replay its warm steps quietly, with exactly the numbers of the
same loop in lazy mode (which the architectures tier checks against CPU eager step by step), and close to CPU
eager's end points (AdamW's end points differ by float32 rounding noise, up to ~lr per element where a gradient
is noise: tests/clients/agreement.py; 1e-3 relative here).
"""

from __future__ import annotations

import pytest
import torch
import transformers as T

import lazyxla
from tests.clients.architectures import batch, build
from tests.util import captured_step

STEPS = 10


def _loop(name: str, device, captured, after_step=lambda: None):
    torch.manual_seed(0)
    model, _ = build(name)
    model = model.to(device)
    fused = device.type != "cpu"  # (CPU eager: torch's fused AdamW on the CPU is the same math, foreach here)
    # lazy mode (False) starts from the tensor learning rate that capture makes of the float under a scheduler
    lr = torch.tensor(1e-2, device=device) if captured is False else 1e-2
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=fused)
    scheduler = T.get_linear_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=STEPS)

    step = captured_step(lambda inputs: model(**inputs).loss, opt, captured)
    tr_loss = torch.zeros((), device=device)
    losses, lrs = [], []
    lazyxla.metrics.reset()
    for i in range(STEPS):
        inputs = {k: v.to(device) for k, v in batch("text", seed=10 + i).items()}
        loss = step(inputs)
        tr_loss += loss.detach()
        scheduler.step()
        lrs.append(float(scheduler.get_last_lr()[0]))
        after_step()
        if i % 4 == 3:  # Trainer logs every few steps: one host read
            losses.append(tr_loss.item())
    params = {k: v.detach().cpu() for k, v in model.named_parameters()}
    return losses, lrs, params, lazyxla.metrics.counters()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_trainer_loop_is_replayed_and_equals_lazy_mode(dev, name, monkeypatch):
    from lazyxla.lazy import capture

    calls, per_step = [], []
    real = capture._replace
    monkeypatch.setattr(capture, "_replace", lambda t, lt: (calls.append(1), real(t, lt)))
    lazy = _loop(name, dev, False)
    captured = _loop(name, dev, True, lambda: per_step.append(len(calls)))
    assert captured[3].get("capture_replays", 0) >= STEPS - 4, captured[3]
    # quiet replays: the accumulator, the scheduler's fill and the logging reads touch none of the tensors a
    # replay changes in place, so the last replays make no functionalization update
    new_calls = [b - a for a, b in zip(per_step, per_step[1:])]
    assert new_calls[-3:] == [0, 0, 0], new_calls
    assert captured[0] == lazy[0] and captured[1] == lazy[1]
    for k in lazy[2]:
        torch.testing.assert_close(captured[2][k], lazy[2][k], rtol=0, atol=0, msg=k)


def test_trainer_loop_matches_cpu_eager(dev):
    eager = _loop("gpt2", torch.device("cpu"), None)
    captured = _loop("gpt2", dev, True)
    torch.testing.assert_close(torch.tensor(captured[0]), torch.tensor(eager[0]), rtol=1e-4, atol=1e-5)
    assert captured[1] == pytest.approx(eager[1], rel=1e-6)
    for k in eager[2]:
        torch.testing.assert_close(captured[2][k], eager[2][k], rtol=1e-3, atol=1e-4, msg=k)
