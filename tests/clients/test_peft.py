"""PEFT, unmodified: a LoRA fine-tune of a tiny Llama trains on lazyxla as on CPU eager, and merges alike.

``get_peft_model`` wraps ``q_proj`` and ``v_proj`` with rank-4 adapters and freezes everything else; 4 AdamW steps
over the trainable parameters (as HF Trainer builds its optimizer) are checked against CPU eager by the rule of
tests/clients/agreement.py, the frozen base weights must come back bit-identical, and ``merge_and_unload()`` on
lazyxla must give the weights and logits that it gives on the CPU from the same adapters.
"""

from __future__ import annotations

import peft
import torch

import lazyxla
from tests.clients.agreement import TOL, train_like_eager
from tests.clients.architectures import build

STEPS = 4
TARGETS = ("q_proj", "v_proj")


def _adamw(params):
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-2, weight_decay=0.01)


def _loss(model, **batch):
    return model(**batch).loss


def _lora_llama():
    model, batch = build("llama")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(TARGETS), lora_dropout=0.0, task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config), batch


def test_lora_fine_tune_trains_like_eager_and_merges_alike(dev):
    model, batch = _lora_llama()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable), trainable
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}

    result = train_like_eager(model, batch, _loss, _adamw, dev, STEPS)

    assert result["compiles"][1:] == [result["compiles"][1]] * (STEPS - 1), result["compiles"]
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p.detach().cpu(), frozen[name]), f"{name}: a frozen weight changed"
    cpu = result["cpu_model"]  # the CPU copy holding the same trained adapters
    merged, cpu_merged = model.merge_and_unload(), cpu.merge_and_unload()
    cpu_weights = dict(cpu_merged.named_parameters())
    assert not any("lora_" in n for n in cpu_weights), "merge_and_unload left adapters"
    for name, w in merged.named_parameters():
        want = cpu_weights[name].detach()
        torch.testing.assert_close(w.detach().cpu(), want, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    base_q = frozen["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert not torch.equal(cpu_weights["model.layers.0.self_attn.q_proj.weight"].detach(), base_q), "merged nothing"
    logits = merged(input_ids=batch["input_ids"].to(dev)).logits
    torch.testing.assert_close(logits.detach().cpu(), cpu_merged(input_ids=batch["input_ids"]).logits.detach(), **TOL)
    assert not any(k.startswith("fallback.") for k in lazyxla.metrics.counters()), lazyxla.metrics.counters()
