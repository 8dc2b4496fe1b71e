"""sentence-transformers, unmodified: ``encode()`` under its own ``torch.inference_mode()`` and a contrastive
fine-tuning step on lazyxla give what they give on the CPU.

A tiny random BERT (2 layers, hidden 32) and a WordPiece tokenizer built from the test sentences' words are saved to
a temporary directory and loaded as a ``SentenceTransformer`` of ``Transformer`` and mean ``Pooling`` modules:
nothing is downloaded. ``encode`` decorates itself with ``torch.inference_mode()``, so every tensor of the
evaluation is an inference tensor (issue 30 found ``encode`` failing there before the tensor-contract fixes: issue
"PyTorch's whole tensor contract on the device", point 5). The sentences have different lengths and are encoded
two at a time, so each batch pads to its own length, and ``encode`` sorts them by length and restores their order.

Compared with the same model's CPU ``encode`` (``TOL``, the rule of tests/clients/agreement.py): the sentence
embeddings in each output form (NumPy, one tensor, normalized or not), the per-token embeddings (whose padding
``encode`` strips with an ``.item()`` per token), ``similarity``, and two SGD steps of
``MultipleNegativesRankingLoss`` by the step-by-step rule, after which both models encode alike again. Measured
2026-11-29: largest embedding difference 4.8e-7 (6.0e-8 normalized), loss difference 6.0e-7; about 30 s on 2
cores.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import lazyxla
from tests.clients.agreement import TOL, train_like_eager

st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed (requirements.txt)")
modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")
losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")

SENTENCES = [
    "the cat sat on the mat",
    "a dog runs",
    "big red house",
    "the small blue car runs fast on the mat and the big dog sat",
    "tree",
    "a cat and a dog of the house",  # six sentences at batch size 2: three programs, one per padded length
]
WORDS = sorted({w for s in SENTENCES for w in s.split()})  # the vocabulary: every word is a token
HIDDEN = 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tiny random BERT and its tokenizer, saved as a Hugging Face model directory."""
    path = tmp_path_factory.mktemp("tiny_bert")
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(path / "vocab.txt"))
    config = transformers.BertConfig(
        vocab_size=len(WORDS) + 5,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,  # the fine-tuning step compares with the CPU: no random masks
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _load(model_dir: str, device) -> st.SentenceTransformer:
    return st.SentenceTransformer(
        modules=[modules.Transformer(model_dir), modules.Pooling(HIDDEN, "mean")], device=str(device)
    )


@pytest.fixture
def models(model_dir, dev):
    """The same model on the CPU and on lazyxla."""
    return _load(model_dir, "cpu"), _load(model_dir, dev)


def _close(got, want) -> float:
    got, want = torch.as_tensor(got).cpu(), torch.as_tensor(want)
    torch.testing.assert_close(got, want, **TOL)
    return (got - want).abs().max().item()


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_encode_under_inference_mode_equals_cpu(models, dev, as_tensor, normalize):
    cpu, lazy = models
    kwargs = {"batch_size": 2, "convert_to_tensor": as_tensor, "normalize_embeddings": normalize}
    want = cpu.encode(SENTENCES, **kwargs)
    got = lazy.encode(SENTENCES, **kwargs)
    if as_tensor:  # one tensor on the model's device, made under inference mode as on the CPU
        assert got.device == dev and got.is_inference() and want.is_inference()
    else:
        assert isinstance(got, np.ndarray) and got.shape == (len(SENTENCES), HIDDEN)
    largest = _close(got, want)
    print(f"encode(convert_to_tensor={as_tensor}, normalize_embeddings={normalize}): largest difference {largest:.1e}")
    if normalize:
        torch.testing.assert_close(torch.as_tensor(got).cpu().norm(dim=1), torch.ones(len(SENTENCES)))
    compiles = lazyxla.metrics.counters()["compiles"]
    lazy.encode(SENTENCES, **kwargs)  # the same padded lengths: every program is cached
    assert lazyxla.metrics.counters()["compiles"] == compiles


def test_similarity_and_token_embeddings_equal_cpu(models, dev):
    cpu, lazy = models
    want = cpu.encode(SENTENCES, convert_to_tensor=True)
    got = lazy.encode(SENTENCES, convert_to_tensor=True)
    scores = lazy.similarity(got, got)
    assert scores.device == dev
    _close(scores, cpu.similarity(want, want))
    # each sentence's tokens without padding: ``encode`` finds the last real token by reading the mask per token
    want_tokens = cpu.encode(SENTENCES, output_value="token_embeddings", batch_size=2)
    got_tokens = lazy.encode(SENTENCES, output_value="token_embeddings", batch_size=2)
    assert [t.shape for t in got_tokens] == [t.shape for t in want_tokens]
    for g, w in zip(got_tokens, want_tokens):
        assert g.device == dev
        _close(g, w)


def _pair_batch(model) -> dict:
    """Anchors and positives, tokenized as the loss receives them (each column padded to its own length)."""
    anchors, positives = SENTENCES[:3], SENTENCES[3:]
    batch = {}
    for column, texts in (("anchor", anchors), ("positive", positives)):
        features = model.preprocess(texts)
        batch.update({f"{column}.{k}": v for k, v in features.items()})
    return batch


def _ranking_loss(model, **batch):
    columns = [{k.split(".")[1]: v for k, v in batch.items() if k.startswith(f"{c}.")} for c in ("anchor", "positive")]
    return losses.MultipleNegativesRankingLoss(model)(columns, None)


def test_fine_tuning_step_trains_like_eager_and_encodes_alike(model_dir, dev):
    model = _load(model_dir, "cpu")
    batch = _pair_batch(model)
    assert batch["anchor.input_ids"].shape[1] != batch["positive.input_ids"].shape[1]

    # plain SGD: the second step is the first step's program (AdamW's state would compile a second one, ~20 s here)
    result = train_like_eager(model, batch, _ranking_loss, lambda p: torch.optim.SGD(p, lr=0.02), dev, steps=2)

    assert result["compiles"][1] == result["compiles"][0], result["compiles"]  # step 2 compiled nothing
    print(f"MultipleNegativesRankingLoss, 2 SGD steps: largest loss difference {result['loss_diff']:.1e}")
    trained = result["cpu_model"]  # the CPU copy holding the lazyxla run's trained weights
    _close(model.encode(SENTENCES, convert_to_tensor=True), trained.encode(SENTENCES, convert_to_tensor=True))
