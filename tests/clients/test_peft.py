"""PEFT, unmodified: LoRA fine-tunes of a tiny Llama and a tiny GPT-2 train on lazyxla as on CPU eager, and merge alike.

``get_peft_model`` wraps the attention projections (Llama's ``q_proj`` and ``v_proj``; GPT-2's ``c_attn``, a
``Conv1D`` whose weight is stored transposed) with rank-4 adapters and freezes everything else; 4 AdamW steps
over the trainable parameters (as HF Trainer builds its optimizer) are checked against CPU eager by the rule of
tests/clients/agreement.py, the frozen base weights must come back bit-identical, and ``merge_and_unload()`` on
lazyxla must give the weights and logits that it gives on the CPU from the same adapters.
"""

from __future__ import annotations

import peft
import pytest
import torch

import lazyxla
from tests.clients.agreement import TOL, train_like_eager
from tests.clients.architectures import build

STEPS = 4
# architecture -> (the modules LoRA wraps, whether their weight is stored (in, out) as Conv1D's is)
LORA = {"llama": (["q_proj", "v_proj"], False), "gpt2": (["c_attn"], True)}


def _adamw(params):
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-2, weight_decay=0.01)


def _loss(model, **batch):
    return model(**batch).loss


def _lora(name: str):
    model, batch = build(name)
    targets, transposed = LORA[name]
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, fan_in_fan_out=transposed, task_type="CAUSAL_LM"
    )
    return peft.get_peft_model(model, config), batch


@pytest.mark.parametrize("name", list(LORA))
def test_lora_fine_tune_trains_like_eager_and_merges_alike(name, dev):
    model, batch = _lora(name)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable), trainable
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}

    result = train_like_eager(model, batch, _loss, _adamw, dev, STEPS)

    assert result["compiles"][1:] == [result["compiles"][1]] * (STEPS - 1), result["compiles"]
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p.detach().cpu(), frozen[n]), f"{n}: a frozen weight changed"
    cpu = result["cpu_model"]  # the CPU copy holding the same trained adapters
    merged, cpu_merged = model.merge_and_unload(), cpu.merge_and_unload()
    cpu_weights = {n: w.detach() for n, w in cpu_merged.named_parameters()}
    assert not any("lora_" in n for n in cpu_weights), "merge_and_unload left adapters"
    for n, w in merged.named_parameters():
        torch.testing.assert_close(w.detach().cpu(), cpu_weights[n], **TOL, msg=lambda m, n=n: f"{n}: {m}")
    wrapped = {n.removeprefix("base_model.model.").replace(".base_layer", ""): w for n, w in frozen.items()}
    bases = {n: w for n, w in wrapped.items() if n.endswith(tuple(f"{t}.weight" for t in LORA[name][0]))}
    assert bases and all(not torch.equal(cpu_weights[n], w) for n, w in bases.items()), "an adapter merged nothing"
    logits = merged(input_ids=batch["input_ids"].to(dev)).logits
    torch.testing.assert_close(logits.detach().cpu(), cpu_merged(input_ids=batch["input_ids"]).logits.detach(), **TOL)
    assert not any(k.startswith("fallback.") for k in lazyxla.metrics.counters()), lazyxla.metrics.counters()
