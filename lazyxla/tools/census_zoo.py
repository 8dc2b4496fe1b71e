"""The model zoo of the fallback census (``lazyxla.tools.fallback_census``): tiny random models, nothing downloaded.

Every model is built from a seeded random init with dropout and stochastic depth off, so CPU eager and lazyxla
compute the same; each comes with a batch of 2 and its training loss (the model's own where it has one, else the
mean square of its output). Sources: transformers (vision, audio, sequence to sequence), diffusers (UNets, VAEs,
a DiT) and timm. A source that does not import makes its models :class:`Unavailable`; transformers and diffusers
are pinned in requirements.txt, timm is not (see ``_torchvision_importable``).

Example::

    model, batch, loss_of = build("hf_resnet")
    loss_of(model, **batch).backward()
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable

import torch

C = 10  # classes
V = 64  # vocabulary


class Unavailable(Exception):
    """The model's library does not import here."""


@dataclasses.dataclass(frozen=True)
class Entry:
    source: str  # the library, and the family in it
    make: Callable[[], torch.nn.Module]
    batch: Callable[[torch.Generator], dict]
    loss: Callable  # loss(model, **batch) -> a scalar tensor


def _own_loss(model, **batch):
    return model(**batch).loss


def _first_output(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return _first_output(out[0])
    for key in ("logits", "sample", "last_hidden_state", "pred_boxes"):
        if getattr(out, key, None) is not None:
            return getattr(out, key)
    return out[0]


def _mean_square(model, **batch):
    return _first_output(model(**batch)).float().square().mean()


def _mse_noise(model, noise, **batch):
    return torch.nn.functional.mse_loss(model(**batch).sample, noise)


def _classify(model, pixel_values, labels):
    return torch.nn.functional.cross_entropy(model(pixel_values), labels)


def _detection(model, **batch):
    out = model(**batch)
    return out.logits.square().mean() + out.pred_boxes.mean()


def _vae(model, sample):
    posterior = model.encode(sample).latent_dist
    recon = model.decode(posterior.mode()).sample
    return torch.nn.functional.mse_loss(recon, sample) + 1e-3 * posterior.kl().mean()


def _vq(model, sample):
    out = model(sample, return_dict=True)
    return torch.nn.functional.mse_loss(out.sample, sample) + out.commit_loss.mean()


# ---- batches ----


def _images(g, size=32, channels=3):
    return {"pixel_values": torch.randn(2, channels, size, size, generator=g)}


def _labeled(g, size=32):
    return {**_images(g, size), "labels": torch.randint(0, C, (2,), generator=g)}


def _labeled64(g):
    """64x64 images, for the deep ImageNet CNNs: at 32x32 their last batch norm normalizes 2 values (a 1x1 map of
    2 images), where float32 and float64 on the CPU already give losses that differ by 2x (timm's efficientnet_b0:
    5.41 against 2.74)."""
    return _labeled(g, 64)


def _segmentation(g):
    return {**_images(g), "labels": torch.randint(0, C, (2, 32, 32), generator=g)}


def _text2text(g):
    return {"input_ids": torch.randint(3, V, (2, 8), generator=g), "labels": torch.randint(3, V, (2, 6), generator=g)}


def _waveform(g):
    return {"input_values": torch.randn(2, 400, generator=g), "labels": torch.randint(0, C, (2,), generator=g)}


def _ctc(g):
    return {"input_values": torch.randn(2, 800, generator=g), "labels": torch.randint(1, V, (2, 5), generator=g)}


def _features(g, bins=8, frames=32):
    return {"input_features": torch.randn(2, bins, frames, generator=g)}


def _speech2text(g):
    return {
        "input_features": torch.randn(2, 32, 8, generator=g),
        "labels": torch.randint(3, V, (2, 6), generator=g),
    }


def _ast(g):
    return {"input_values": torch.randn(2, 32, 16, generator=g), "labels": torch.randint(0, C, (2,), generator=g)}


def _noisy(g, channels, size=16, **extra):
    return {
        "sample": torch.randn(2, channels, size, size, generator=g),
        "timestep": torch.tensor([10, 500]),
        "noise": torch.randn(2, channels, size, size, generator=g),
        **extra,
    }


def _dit_batch(g):
    batch = _noisy(g, 4, size=8, class_labels=torch.tensor([1, 3]))
    batch["hidden_states"] = batch.pop("sample")
    return batch


# ---- transformers ----

_VIT = {"image_size": 32, "patch_size": 8, "num_channels": 3, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0}  # fmt: skip
_S2S = {"vocab_size": V, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "dropout": 0.0,
        "attention_dropout": 0.0, "activation_dropout": 0.0, "max_position_embeddings": 32, "pad_token_id": 0,
        "decoder_start_token_id": 2, "bos_token_id": 2, "eos_token_id": 1}  # fmt: skip
_SPEECH = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
           "conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3), "num_conv_pos_embeddings": 16,
           "num_conv_pos_embedding_groups": 4, "hidden_dropout": 0.0, "activation_dropout": 0.0,
           "attention_dropout": 0.0, "feat_proj_dropout": 0.0, "final_dropout": 0.0, "layerdrop": 0.0,
           "mask_time_prob": 0.0}  # fmt: skip


def _hf(model: str, config: str, **kw) -> Callable[[], torch.nn.Module]:
    def make():
        T = _library("transformers")
        return getattr(T, model)(getattr(T, config)(**kw))

    return make


def _library(name: str):
    """The optional library ``name``, imported when a model of it is built (the zoo's libraries are optional:
    the census runs the models of those that import)."""
    _torchvision_importable()
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise Unavailable(f"unavailable: {name} does not import ({e})") from e


def _detr():
    T = _library("transformers")
    backbone = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], out_features=["stage2"])
    config = T.DetrConfig(
        use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5, num_labels=C, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0,
    )  # fmt: skip
    return T.DetrForObjectDetection(config)


# ---- diffusers ----


def _diffusers(cls: str, **kw) -> Callable[[], torch.nn.Module]:
    def make():
        return getattr(_library("diffusers"), cls)(**kw)

    return make


_UNET = {"sample_size": 16, "layers_per_block": 1, "block_out_channels": (8, 16), "norm_num_groups": 4}
_VAE = {"in_channels": 3, "out_channels": 3, "block_out_channels": (8, 16), "layers_per_block": 1,
        "norm_num_groups": 4, "latent_channels": 2, "sample_size": 16}  # fmt: skip


# ---- timm ----


def _timm(name: str, **kw) -> Callable[[], torch.nn.Module]:
    def make():
        # (stochastic depth off: timm's swin_tiny defaults to drop_path_rate=0.1)
        return _timm_module().create_model(name, pretrained=False, num_classes=C, drop_path_rate=0.0, **kw)

    return make


def _timm_module():
    return _library("timm")


def _torchvision_importable() -> None:
    """Make an installed torchvision import, before any library of the zoo imports it (timm always does;
    transformers and diffusers do when it is installed). torchvision 0.28 from PyPI, the release for torch 2.13, is
    a CUDA build: its ``_C.so`` needs ``libc10_cuda.so``, so beside torch's CPU wheel it does not load, and
    ``import torchvision`` then fails registering fake kernels for two of its C++ ops (``operator torchvision::nms
    does not exist``, torchvision/_meta_registrations.py). Then the two op schemas are declared here, without
    kernels (a call raises), and the import is tried again: no model of the zoo calls them. Hence timm is not
    pinned in requirements.txt (with that torchvision installed, transformers would fail to import its models
    elsewhere); ``make census`` installs both beside the project."""
    if _TORCHVISION_OPS or importlib.util.find_spec("torchvision") is None:
        return
    try:
        importlib.import_module("torchvision")
        return
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
    for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
        del sys.modules[name]  # the failed import's half-made modules
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):  # their schemas in torchvision/csrc/ops/nms.cpp and quantized/cpu/qnms_kernel.cpp
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_OPS.append(lib)
    importlib.import_module("torchvision")


_TORCHVISION_OPS: list = []  # the library object holding the declared schemas (they last as long as it does)


ZOO: dict[str, Entry] = {
    # transformers: vision (the families of timm, as transformers implements them)
    "hf_resnet": Entry(
        "transformers ResNet",
        _hf(
            "ResNetForImageClassification",
            "ResNetConfig",
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_regnet": Entry(
        "transformers RegNet",
        _hf(
            "RegNetForImageClassification",
            "RegNetConfig",
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            groups_width=8,
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_bit": Entry(
        "transformers BiT (weight-standardized convs)",
        _hf(
            "BitForImageClassification",
            "BitConfig",
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_groups=8,
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_efficientnet": Entry(
        "transformers EfficientNet",
        _hf(
            "EfficientNetForImageClassification",
            "EfficientNetConfig",
            image_size=32,
            width_coefficient=1.0,
            kernel_sizes=[3, 5],
            in_channels=[32, 16],
            out_channels=[16, 24],
            strides=[1, 2],
            num_block_repeats=[1, 1],
            expand_ratios=[1, 6],
            depthwise_padding=[],
            hidden_dim=1280,
            drop_connect_rate=0.0,
            dropout_rate=0.0,
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_mobilenet_v1": Entry(
        "transformers MobileNetV1",
        _hf(
            "MobileNetV1ForImageClassification",
            "MobileNetV1Config",
            depth_multiplier=0.25,
            image_size=32,
            classifier_dropout_prob=0.0,
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_mobilenet_v2": Entry(
        "transformers MobileNetV2",
        _hf(
            "MobileNetV2ForImageClassification",
            "MobileNetV2Config",
            depth_multiplier=0.25,
            image_size=32,
            classifier_dropout_prob=0.0,
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_mobilevit": Entry(
        "transformers MobileViT",
        _hf(
            "MobileViTForImageClassification",
            "MobileViTConfig",
            image_size=32,
            hidden_sizes=[16, 24, 32],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
            num_attention_heads=2,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            classifier_dropout_prob=0.0,
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_convnextv2": Entry(
        "transformers ConvNeXt V2",
        _hf(
            "ConvNextV2ForImageClassification",
            "ConvNextV2Config",
            num_stages=2,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_deit": Entry(
        "transformers DeiT", _hf("DeiTForImageClassification", "DeiTConfig", **_VIT, num_labels=C), _labeled, _own_loss
    ),
    "hf_beit": Entry(
        "transformers BEiT (relative position bias)",
        _hf("BeitForImageClassification", "BeitConfig", **_VIT, use_relative_position_bias=True, num_labels=C),
        _labeled,
        _own_loss,
    ),
    "hf_dinov2": Entry(
        "transformers DINOv2",
        _hf("Dinov2ForImageClassification", "Dinov2Config", **_VIT, num_labels=C),
        _labeled,
        _own_loss,
    ),
    "hf_swinv2": Entry(
        "transformers Swin V2",
        _hf(
            "Swinv2ForImageClassification",
            "Swinv2Config",
            image_size=32,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 4],
            window_size=4,
            drop_path_rate=0.0,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_poolformer": Entry(
        "transformers PoolFormer",
        _hf(
            "PoolFormerForImageClassification",
            "PoolFormerConfig",
            num_encoder_blocks=2,
            depths=[1, 1],
            hidden_sizes=[16, 32],
            patch_sizes=[7, 3],
            strides=[4, 2],
            padding=[2, 1],
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_segformer": Entry(
        "transformers SegFormer (segmentation)",
        _hf(
            "SegformerForSemanticSegmentation",
            "SegformerConfig",
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[16, 32],
            patch_sizes=[7, 3],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
            decoder_hidden_size=32,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            classifier_dropout_prob=0.0,
            drop_path_rate=0.0,
            num_labels=C,
        ),
        _segmentation,
        _own_loss,
    ),
    "hf_pvt": Entry(
        "transformers PVT",
        _hf(
            "PvtForImageClassification",
            "PvtConfig",
            image_size=32,
            num_encoder_blocks=2,
            depths=[1, 1],
            sequence_reduction_ratios=[2, 1],
            hidden_sizes=[16, 32],
            patch_sizes=[4, 2],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            drop_path_rate=0.0,
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_focalnet": Entry(
        "transformers FocalNet",
        _hf(
            "FocalNetForImageClassification",
            "FocalNetConfig",
            image_size=32,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1],
            focal_levels=[2, 2],
            focal_windows=[3, 3],
            hidden_dropout_prob=0.0,
            drop_path_rate=0.0,
            num_labels=C,
        ),
        _labeled,
        _own_loss,
    ),
    "hf_yolos": Entry(
        "transformers YOLOS (detection)",
        _hf(
            "YolosForObjectDetection",
            "YolosConfig",
            **{**_VIT, "image_size": [32, 32]},
            num_detection_tokens=5,
            num_labels=C,
        ),
        _images,
        _detection,
    ),
    "hf_detr": Entry("transformers DETR (ResNet backbone)", _detr, _images, _detection),
    "hf_siglip": Entry(
        "transformers SigLIP",
        _hf(
            "SiglipModel",
            "SiglipConfig",
            text_config={
                "vocab_size": V,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "max_position_embeddings": 8,
            },
            vision_config={**_VIT, "attention_dropout": 0.0},
        ),
        lambda g: {**_images(g), "input_ids": torch.randint(3, V, (2, 8), generator=g), "return_loss": True},
        _own_loss,
    ),
    # transformers: audio
    "hf_wav2vec2_ctc": Entry(
        "transformers Wav2Vec2 (CTC)",
        _hf("Wav2Vec2ForCTC", "Wav2Vec2Config", **_SPEECH, vocab_size=V, ctc_loss_reduction="mean"),
        _ctc,
        _own_loss,
    ),
    "hf_hubert": Entry(
        "transformers HuBERT",
        _hf("HubertForSequenceClassification", "HubertConfig", **_SPEECH, num_labels=C),
        _waveform,
        _own_loss,
    ),
    "hf_wavlm": Entry(
        "transformers WavLM (bucketed relative positions)",
        _hf(
            "WavLMForSequenceClassification",
            "WavLMConfig",
            **_SPEECH,
            num_buckets=16,
            max_bucket_distance=32,
            num_labels=C,
        ),
        _waveform,
        _own_loss,
    ),
    "hf_speech2text": Entry(
        "transformers Speech2Text",
        _hf(
            "Speech2TextForConditionalGeneration",
            "Speech2TextConfig",
            **_S2S,
            input_feat_per_channel=8,
            conv_channels=16,
            num_conv_layers=2,
            max_source_positions=32,
            max_target_positions=32,
        ),
        _speech2text,
        _own_loss,
    ),
    "hf_ast": Entry(
        "transformers Audio Spectrogram Transformer",
        _hf(
            "ASTForAudioClassification",
            "ASTConfig",
            **{k: v for k, v in _VIT.items() if k not in ("image_size", "num_channels")},
            num_mel_bins=16,
            max_length=32,
            frequency_stride=8,
            time_stride=8,
            num_labels=C,
        ),
        _ast,
        _own_loss,
    ),
    # transformers: sequence to sequence
    "hf_marian": Entry("transformers Marian", _hf("MarianMTModel", "MarianConfig", **_S2S), _text2text, _own_loss),
    "hf_pegasus": Entry(
        "transformers Pegasus", _hf("PegasusForConditionalGeneration", "PegasusConfig", **_S2S), _text2text, _own_loss
    ),
    "hf_mbart": Entry(
        "transformers mBART", _hf("MBartForConditionalGeneration", "MBartConfig", **_S2S), _text2text, _own_loss
    ),
    "hf_m2m100": Entry(
        "transformers M2M100", _hf("M2M100ForConditionalGeneration", "M2M100Config", **_S2S), _text2text, _own_loss
    ),
    "hf_longt5": Entry(
        "transformers LongT5 (local attention)",
        _hf(
            "LongT5ForConditionalGeneration",
            "LongT5Config",
            vocab_size=V,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            dropout_rate=0.0,
            local_radius=2,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
        _text2text,
        _own_loss,
    ),
    # diffusers
    "diffusers_unet2d": Entry(
        "diffusers UNet2DModel",
        _diffusers(
            "UNet2DModel",
            **_UNET,
            in_channels=3,
            out_channels=3,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=8,
        ),
        lambda g: _noisy(g, 3),
        _mse_noise,
    ),
    "diffusers_unet2d_condition": Entry(
        "diffusers UNet2DConditionModel",
        _diffusers(
            "UNet2DConditionModel",
            **_UNET,
            in_channels=4,
            out_channels=4,
            cross_attention_dim=12,
            attention_head_dim=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        ),
        lambda g: _noisy(g, 4, encoder_hidden_states=torch.randn(2, 5, 12, generator=g)),
        _mse_noise,
    ),
    "diffusers_vae": Entry(
        "diffusers AutoencoderKL",
        _diffusers(
            "AutoencoderKL",
            **_VAE,
            down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2,
        ),
        lambda g: {"sample": torch.randn(2, 3, 16, 16, generator=g)},
        _vae,
    ),
    "diffusers_vq": Entry(
        "diffusers VQModel",
        _diffusers(
            "VQModel",
            **_VAE,
            num_vq_embeddings=16,
            down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2,
        ),
        lambda g: {"sample": torch.randn(2, 3, 16, 16, generator=g)},
        _vq,
    ),
    "diffusers_dit": Entry(
        "diffusers DiTTransformer2DModel",
        _diffusers(
            "DiTTransformer2DModel",
            num_attention_heads=2,
            attention_head_dim=8,
            in_channels=4,
            out_channels=4,
            num_layers=2,
            sample_size=8,
            patch_size=2,
            num_embeds_ada_norm=1000,
        ),
        _dit_batch,
        _mse_noise,
    ),
    # timm (where it imports)
    "timm_resnet": Entry("timm resnet10t", _timm("resnet10t"), _labeled, _classify),
    "timm_efficientnet": Entry("timm efficientnet_b0", _timm("efficientnet_b0"), _labeled64, _classify),
    "timm_mobilenetv3": Entry("timm mobilenetv3_small_050", _timm("mobilenetv3_small_050"), _labeled64, _classify),
    "timm_convnext": Entry("timm convnext_atto", _timm("convnext_atto"), _labeled, _classify),
    "timm_regnet": Entry("timm regnetx_002", _timm("regnetx_002"), _labeled, _classify),
    "timm_vit": Entry(
        "timm vit_tiny_patch16_224",
        _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2),
        _labeled,
        _classify,
    ),
    "timm_deit": Entry(
        "timm deit_tiny_distilled_patch16_224",
        _timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2),
        _labeled,
        _classify,
    ),
    "timm_swin": Entry(
        "timm swin_tiny_patch4_window7_224",
        _timm(
            "swin_tiny_patch4_window7_224", img_size=32, window_size=4, depths=(1, 1), num_heads=(1, 2), embed_dim=16
        ),
        _labeled,
        _classify,
    ),
}


def build(name: str) -> tuple[torch.nn.Module, dict, Callable]:
    """Model ``name`` (seeded random weights, in training mode), its batch and its loss; :class:`Unavailable`
    where its library does not import."""
    entry = ZOO[name]
    torch.manual_seed(0)
    model = entry.make().train()
    batch = entry.batch(torch.Generator().manual_seed(1))
    return model, batch, entry.loss
