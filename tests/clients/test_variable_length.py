"""Variable-length batches through ``DeviceLoader(pad_to_buckets=...)`` and the compat ``MpDeviceLoader``.

Hugging Face models (tiny random configs) train on batches of varying sequence length, as a collator that pads to
the longest sequence of each batch produces them. On lazyxla the loader pads each batch on the host to a bucket;
on the CPU the same model trains on the unpadded batches. Padding carries attention mask 0 and labels -100, so
the losses and the parameters must agree (the rule of tests/test_training.py: rtol 1e-4, atol 1e-5), and the
loop compiles a fixed set of programs per bucket used, not per length.

Programs per shape: the training step, plus one per host read the model makes in its forward. transformers'
``masking_utils`` reads whether the padding mask is all ones to decide if it may skip the mask (a causal mask with
padding: 2 reads; a bidirectional one: 1), and each read is a small program of the mask's shape. Step 1, without
optimizer state yet, is one more program.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T

import lazyxla
import lazyxla.compat as compat

V = 64
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _ragged_batches(lengths, rows, seed, causal):
    """HF-collator-like batches: each padded (mask 0) to the longest of its rows, which differ in length."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, r in zip(lengths, rows):
        ids = torch.randint(3, V, (r, n), generator=g)
        lens = torch.randint(1, n + 1, (r,), generator=g)
        lens[0], lens[1] = n, 1  # the longest row sets the length; every batch has padding
        mask = (torch.arange(n)[None] < lens[:, None]).long()
        ids = ids * mask
        if causal:
            labels = ids.masked_fill(mask == 0, -100)
            out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
        else:
            labels = torch.randint(0, 3, (r,), generator=g)
            out.append(
                {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask, "labels": labels}
            )
    return out


def _train(model, device, loader):
    model = model.to(device)
    opt = _sgd(model.parameters())
    losses = []
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return model, [float(v) for v in losses]


def _assert_like_cpu(lazy, losses, ref, ref_losses):
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
    ref_params = dict(ref.named_parameters())
    for name, p in lazy.named_parameters():
        want = ref_params[name].detach()
        torch.testing.assert_close(p.detach().cpu(), want, **TOL, msg=lambda m, name=name: f"{name}: {m}")


def _reads_per_step(steps):
    reads = sum(s["count"] for s in lazyxla.metrics.syncs() if s["reason"] == ".item()")
    assert reads % steps == 0, lazyxla.metrics.syncs()
    return reads // steps


def test_causal_lm_compiles_per_bucket_and_trains_like_cpu_on_unpadded_batches(dev):
    lengths = [5, 11, 7, 14, 3, 9]  # 6 lengths; buckets 8 and 16 used, 32 not
    batches = _ragged_batches(lengths, [4] * len(lengths), seed=1, causal=True)
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    model = T.LlamaForCausalLM(config)
    ref, ref_losses = _train(copy.deepcopy(model), torch.device("cpu"), batches)
    loader = lazyxla.DeviceLoader(batches, dev, pad_to_buckets=(8, 16, 32))
    lazy, losses = _train(model, dev, loader)
    _assert_like_cpu(lazy, losses, ref, ref_losses)
    assert _reads_per_step(len(lengths)) == 0  # the mask's two reads per step read known values (lazy/known.py)
    # per shape: the step alone. The mask's two reads are at two lines, so the second does not compute the forward
    # recorded since the first (the left-over rule is per read site: lazy/graph.py); it did, 2 programs per shape
    per_shape = 1
    assert lazyxla.metrics.counters()["compiles"] == 2 * per_shape + 1  # 2 buckets (unpadded: 6 lengths)
    assert not any(k.startswith("fallback.") for k in lazyxla.metrics.counters())


@pytest.fixture
def pl():
    assert compat.install()
    import torch_xla.distributed.parallel_loader as parallel_loader  # installed by the line above

    yield parallel_loader
    compat.uninstall()


def test_mp_device_loader_pads_a_short_last_batch_and_trains_like_cpu(dev, pl):
    lengths = [5, 9, 7, 14, 3, 11]
    rows = [4] * 5 + [3]  # the last batch is short: padded with masked rows labelled -100
    batches = _ragged_batches(lengths, rows, seed=2, causal=False)
    torch.manual_seed(0)
    config = T.BertConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3,
    )  # fmt: skip
    model = T.BertForSequenceClassification(config)
    ref, ref_losses = _train(copy.deepcopy(model), torch.device("cpu"), batches)
    # work an earlier test's reads left pending is computed here, not counted as this loop's
    lazyxla.sync()
    before = lazyxla.metrics.counters()["compiles"]
    loader = pl.MpDeviceLoader(batches, dev, pad_to_buckets=lazyxla.Buckets((8, 16), batch_size=4))
    lazy, losses = _train(model, dev, loader)
    _assert_like_cpu(lazy, losses, ref, ref_losses)
    per_shape = 1 + _reads_per_step(len(lengths))  # the step and the mask read (1)
    assert lazyxla.metrics.counters()["compiles"] - before == 2 * per_shape + 1  # the short batch: none of its own


def test_an_added_attention_mask_keeps_a_bidirectional_model_exact():
    """A dict batch without ``attention_mask`` gets one, so BERT's real tokens do not attend to the padding."""
    torch.manual_seed(0)
    config = T.BertConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = T.BertModel(config).eval()
    batch = {"input_ids": torch.randint(3, V, (2, 5)), "token_type_ids": torch.zeros(2, 5, dtype=torch.long)}
    padded = lazyxla.Buckets((8,))(batch)
    assert padded["attention_mask"].tolist() == [[1] * 5 + [0] * 3] * 2
    with torch.no_grad():
        want = model(**batch).last_hidden_state
        got = model(**padded).last_hidden_state[:, :5]
        unmasked = model(**{k: v for k, v in padded.items() if k != "attention_mask"}).last_hidden_state[:, :5]
    torch.testing.assert_close(got, want, **TOL)
    assert not torch.allclose(unmasked, want, **TOL)  # without the mask the padding would change the result
