"""Tiny random Hugging Face models, one per architecture, and a batch for each: nothing is downloaded.

Every model has hidden size 32 (ConvNeXt and Swin: stages of 16 and 32 channels) and 2 layers in each stack, and
dropout off everywhere (a config leaves it on by default in several families), so CPU eager and lazyxla compute
the same.

Example::

    model, batch = build("t5")          # a T5ForConditionalGeneration and {"input_ids", "labels"}
    loss = model(**batch).loss
"""

from __future__ import annotations

import torch
import transformers as T

V = 64  # vocabulary
_DECODER = {"vocab_size": V, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
_GQA = {**_DECODER, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32}
_ENCODER = {**_DECODER, "num_attention_heads": 4, "max_position_embeddings": 40}
_NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
_SEQ2SEQ = {"vocab_size": V, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "dropout": 0.0,
            "attention_dropout": 0.0, "activation_dropout": 0.0}  # fmt: skip
_VISION = {"image_size": 32, "patch_size": 8, "num_channels": 3, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 64}  # fmt: skip
CLASSES = 10
EOS = 1  # CLIP's text embedding is its last token's, the first EOS (token ids are 3 and up)

# name -> (the model, the kind of batch it trains on)
ARCHITECTURES = {
    # causal language models
    "gpt2": (
        lambda: T.GPT2LMHeadModel(
            T.GPT2Config(
                vocab_size=V,
                n_embd=32,
                n_layer=2,
                n_head=4,
                n_positions=32,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
        ),
        "text",
    ),
    "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(**_GQA)), "text"),
    "mistral": (lambda: T.MistralForCausalLM(T.MistralConfig(**_GQA)), "text"),
    "qwen2": (lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**_GQA)), "text"),
    "gemma": (lambda: T.GemmaForCausalLM(T.GemmaConfig(**_GQA, head_dim=8)), "text"),
    "phi": (
        lambda: T.PhiForCausalLM(
            T.PhiConfig(**_DECODER, num_attention_heads=4, max_position_embeddings=32, resid_pdrop=0.0, embd_pdrop=0.0)
        ),
        "text",
    ),
    "gpt_neox": (
        lambda: T.GPTNeoXForCausalLM(
            T.GPTNeoXConfig(**_DECODER, num_attention_heads=4, max_position_embeddings=32, hidden_dropout=0.0)
        ),
        "text",
    ),
    "opt": (
        lambda: T.OPTForCausalLM(
            T.OPTConfig(
                vocab_size=V,
                hidden_size=32,
                ffn_dim=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=32,
                word_embed_proj_dim=32,
                dropout=0.0,
                attention_dropout=0.0,
            )
        ),
        "text",
    ),
    "bloom": (
        lambda: T.BloomForCausalLM(
            T.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4, hidden_dropout=0.0, attention_dropout=0.0)
        ),
        "text",
    ),
    # encoders (masked language models)
    "bert": (lambda: T.BertForMaskedLM(T.BertConfig(**_ENCODER, **_NO_DROPOUT)), "text"),
    "roberta": (lambda: T.RobertaForMaskedLM(T.RobertaConfig(**_ENCODER, **_NO_DROPOUT)), "text"),
    "distilbert": (
        lambda: T.DistilBertForMaskedLM(
            T.DistilBertConfig(
                vocab_size=V,
                dim=32,
                hidden_dim=64,
                n_layers=2,
                n_heads=4,
                max_position_embeddings=32,
                dropout=0.0,
                attention_dropout=0.0,
            )
        ),
        "text",
    ),
    "deberta_v2": (
        lambda: T.DebertaV2ForMaskedLM(
            T.DebertaV2Config(
                **_ENCODER, **_NO_DROPOUT, relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"]
            )
        ),
        "text",
    ),
    "electra": (lambda: T.ElectraForMaskedLM(T.ElectraConfig(**_ENCODER, **_NO_DROPOUT, embedding_size=32)), "text"),
    # sequence to sequence (the decoder's inputs are the labels shifted right, by the model)
    "t5": (
        lambda: T.T5ForConditionalGeneration(
            T.T5Config(
                vocab_size=V,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                dropout_rate=0.0,
                decoder_start_token_id=0,
                pad_token_id=0,
            )
        ),
        "text",
    ),
    "bart": (lambda: T.BartForConditionalGeneration(T.BartConfig(**_SEQ2SEQ, max_position_embeddings=32)), "text"),
    # vision (image classification; CLIP: contrastive image-text loss)
    "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(**_VISION, **_NO_DROPOUT, num_labels=CLASSES)), "image"),
    "convnext": (
        lambda: T.ConvNextForImageClassification(
            T.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32, num_labels=CLASSES)
        ),
        "image",
    ),
    "swin": (
        lambda: T.SwinForImageClassification(
            T.SwinConfig(
                image_size=32,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 4],
                window_size=4,
                num_labels=CLASSES,
                drop_path_rate=0.0,
                **_NO_DROPOUT,
            )
        ),
        "image",
    ),
    "clip": (
        lambda: T.CLIPModel(
            T.CLIPConfig(
                text_config={**_ENCODER, "max_position_embeddings": 16, "attention_dropout": 0.0, "eos_token_id": EOS},
                vision_config={**_VISION, "attention_dropout": 0.0},
                projection_dim=16,
            )
        ),
        "image_text",
    ),
    # audio (speech recognition from log-mel features; keyword classification from the raw waveform)
    "whisper": (
        lambda: T.WhisperForConditionalGeneration(
            T.WhisperConfig(
                **_SEQ2SEQ,
                num_mel_bins=8,
                max_source_positions=16,
                max_target_positions=16,
                decoder_start_token_id=1,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
            )
        ),
        "audio",
    ),
    "wav2vec2": (
        lambda: T.Wav2Vec2ForSequenceClassification(
            T.Wav2Vec2Config(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                conv_dim=(16, 16),
                conv_stride=(5, 2),
                conv_kernel=(10, 3),
                num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=4,
                hidden_dropout=0.0,
                activation_dropout=0.0,
                attention_dropout=0.0,
                feat_proj_dropout=0.0,
                final_dropout=0.0,
                layerdrop=0.0,
                mask_time_prob=0.0,
                num_labels=CLASSES,
            )
        ),
        "waveform",
    ),
}


def batch(kind: str, seed: int = 1) -> dict:
    """A batch of 2 for a model of ``ARCHITECTURES``: token ids (8), 32x32 images, 8x32 log-mel features, or 400
    audio samples."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (2, 8), generator=g)
    if kind == "text":
        return {"input_ids": ids, "labels": torch.randint(3, V, (2, 8), generator=g)}
    images = torch.randn(2, 3, 32, 32, generator=g)
    if kind == "image":
        return {"pixel_values": images, "labels": torch.randint(0, CLASSES, (2,), generator=g)}
    if kind == "image_text":  # the text embedding comes from the EOS ending each text, which attends to all of it
        ids[:, -1] = EOS
        return {"input_ids": ids, "pixel_values": images, "return_loss": True}
    if kind == "waveform":
        return {
            "input_values": torch.randn(2, 400, generator=g),
            "labels": torch.randint(0, CLASSES, (2,), generator=g),
        }
    assert kind == "audio", kind
    return {"input_features": torch.randn(2, 8, 32, generator=g), "labels": ids[:, :6]}


def build(name: str) -> tuple[torch.nn.Module, dict]:
    """The model of architecture ``name`` (random weights, seeded) and its batch."""
    make, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    return make(), batch(kind)
