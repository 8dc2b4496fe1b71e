"""diffusers, unmodified: tiny ``UNet2DModel`` and ``UNet2DConditionModel`` denoising steps train on lazyxla as on
CPU eager, with nothing run on the CPU.

A UNet's decoder upsamples with ``F.interpolate(scale_factor=2.0, mode="nearest")``, whose backward
(``upsample_nearest2d_backward``) had no rule: each step ran it on the CPU, splitting the step into two programs.
Strict mode makes any op that falls back raise; 3 AdamW steps of the noise-prediction loss are checked against
CPU eager by the rule of tests/clients/agreement.py.
"""

from __future__ import annotations

import pytest
import torch

import lazyxla
from tests.clients.agreement import train_like_eager

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed (requirements.txt pins it)")

STEPS = 3


def _unet2d():
    return diffusers.UNet2DModel(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        attention_head_dim=8,
    ), {}


def _unet2d_condition():
    model = diffusers.UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=12,
        norm_num_groups=4,
        attention_head_dim=4,
    )
    g = torch.Generator().manual_seed(2)
    return model, {"encoder_hidden_states": torch.randn(2, 5, 12, generator=g)}


MODELS = {"unet2d": _unet2d, "unet2d_condition": _unet2d_condition}


def _loss(model, sample, timestep, noise, **extra):
    return torch.nn.functional.mse_loss(model(sample, timestep, **extra).sample, noise)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


@pytest.mark.parametrize("name", list(MODELS))
def test_unet_denoising_step_trains_like_eager_with_no_fallback(name, dev):
    torch.manual_seed(0)
    model, extra = MODELS[name]()
    channels = model.config.in_channels
    g = torch.Generator().manual_seed(1)
    batch = {
        "sample": torch.randn(2, channels, 16, 16, generator=g),
        "timestep": torch.tensor([10, 500]),
        "noise": torch.randn(2, channels, 16, 16, generator=g),
        **extra,
    }
    with lazyxla.config.override(strict=True):  # a fallback raises
        result = train_like_eager(model, batch, _loss, _adamw, dev, STEPS)
    assert not [k for k in lazyxla.metrics.counters() if k.startswith("fallback.")]
    assert result["compiles"][-1] == result["compiles"][-2], result["compiles"]  # the steady step compiles once
