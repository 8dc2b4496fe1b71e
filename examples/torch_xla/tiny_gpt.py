"""The tiny GPT and token data that ``fsdp_gpt.py`` and ``zero1_gpt.py`` train (CPU-sized on purpose), and how
they measure what a replica's device holds.

A pre-norm decoder: token embedding tied to the output projection (GPT-2's tie), a learned position table held
directly by the model, ``nn.MultiheadAttention`` layers without biases (a key bias gets no gradient signal
through the softmax) and GELU feed-forward layers.

Example::

    from tiny_gpt import TinyGPT, token_dataset
    model = TinyGPT()
    tokens, targets = token_dataset(8, seed=0)[:2]
    loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
"""

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset


class DecoderLayer(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, bias=False, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, causal):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=96, width=64, heads=4, depth=2, context=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(context, width) * 0.02)
        self.layers = nn.ModuleList(DecoderLayer(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's scale: N(0, 1) would give huge tied logits

    def forward(self, tokens):
        length = tokens.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu(1)  # True: masked
        x = self.embed(tokens) + self.position[:length]
        for layer in self.layers:
            x = layer(x, causal)
        return self.head(self.norm(x))


def token_dataset(samples, seed, vocab=96, context=32):
    """``samples`` random sequences: inputs and their next tokens, the same for a given seed."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab, (samples, context + 1), generator=g)
    return TensorDataset(seq[:, :-1], seq[:, 1:])


def device_bytes():
    """Bytes of every buffer alive on this replica's device (lazyxla runs on jax; -1 elsewhere)."""
    try:
        import jax  # lazyxla's runtime: the one way to list what the device holds
    except ImportError:
        return -1
    return sum(a.nbytes for a in jax.live_arrays())
