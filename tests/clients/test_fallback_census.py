"""The fallback census over real models, in CI: no op falls back to the CPU, and the numbers are CPU eager's.

A sample of the zoo of ``lazyxla.tools.census_zoo`` (tiny random transformers and diffusers models, nothing
downloaded) runs one forward and backward on lazyxla and on CPU eager (``lazyxla.tools.fallback_census``): no op
may fall back, the losses agree within rtol 1e-4 and every parameter gradient within the rule of
tests/clients/agreement.py. The sample covers what tests/clients/test_architectures.py and test_diffusers.py do
not: batch-normed CNNs, depthwise and squeeze-excite blocks, a relative position bias, segmentation (a bilinear
upsample and a 2-d cross entropy), CTC, a sequence-to-sequence model with sinusoidal positions, a VAE and a
vector-quantized autoencoder. The whole zoo (timm too, where it imports) runs with ``make census``, and its last
table is in docs/ops.md.
"""

from __future__ import annotations

import pytest
import torch

from lazyxla.tools import census_zoo
from lazyxla.tools.fallback_census import _worst_gradient, census

pytest.importorskip("transformers", reason="transformers is not installed (requirements.txt pins it)")
pytest.importorskip("diffusers", reason="diffusers is not installed (requirements.txt pins it)")

SAMPLE = [
    "hf_resnet",
    "hf_mobilenet_v2",
    "hf_beit",
    "hf_segformer",
    "hf_wav2vec2_ctc",
    "hf_marian",
    "diffusers_vae",
    "diffusers_vq",
]


def test_the_gradient_rule_fails_for_an_error_of_a_tenth_of_a_percent():
    want = {"w": torch.tensor([1.0, -0.5, 1e-3]), "b": torch.tensor([0.0, 0.0])}
    exact = {k: v.double() for k, v in want.items()}  # no rounding noise
    assert _worst_gradient(dict(want), want, exact) == (True, "")
    off = {**want, "w": want["w"] * torch.tensor([1.001, 1.0, 1.0])}
    ok, worst = _worst_gradient(off, want, exact)
    assert not ok and worst.startswith("w.grad"), worst


def test_the_sample_is_in_the_zoo():
    assert set(SAMPLE) <= census_zoo.ZOO.keys()


@pytest.mark.parametrize("name", SAMPLE)
def test_no_fallback_and_eager_numbers(name, dev):
    row = census(name, dev)
    assert not row.error, row.line()
    assert not row.fallbacks, row.line()
    assert row.agrees, row.line()
