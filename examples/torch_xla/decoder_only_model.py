"""A small decoder-only language model for the torch_xla-style examples (``eager_train.py``, ``fsdpv2_train.py``).

Plain PyTorch: token and position embeddings, pre-norm blocks of causal self-attention and an MLP, a linear head;
and fake token batches.
The scripts import it from their own folder, as torch_xla's examples import theirs.

Example::

    from decoder_only_model import DecoderOnly, fake_batches
    ids = fake_batches(1, batch=8)[0]         # (8, 17): inputs ids[:, :-1], targets ids[:, 1:]
    logits = DecoderOnly()(ids[:, :-1])       # (8, 16, 64)
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP, with residual connections."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)  # a key bias gets no gradient (softmax ignores a shift)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class DecoderOnly(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a linear head over the vocabulary."""

    def __init__(self, vocab=64, dim=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx, scale=1.0):
        t = idx.shape[1]
        x = (self.tok(idx) + self.pos(torch.arange(t, device=idx.device))) * scale
        return self.head(self.ln(self.blocks(x)))


def fake_batches(steps, batch, seq=16, vocab=64, seed=0):
    """Token ids and next-token targets, the same for a given seed."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq + 1), generator=g) for _ in range(steps)]
