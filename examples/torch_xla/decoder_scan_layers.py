"""A decoder-only language model whose layers run as ``scan_layers``, written for torch_xla (random tokens).

torch_xla's guide to ``scan_layers`` replaces ``for layer in self.layers: h = layer(h)`` with
``scan_layers(self.layers, h)``: the layers are traced once, so the program holds one layer, forward and
backward. This script imports only torch_xla, so it runs on lazyxla unmodified:

    python -m lazyxla.run examples/torch_xla/decoder_scan_layers.py --layers 8 --steps 5

Each step prints one line ``loss step=S value=V`` (V exact: Python's repr of the float), and the last line is
``final loss V``. ``--loop`` runs the layers as the plain Python loop instead.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla
from torch_xla.experimental.scan_layers import scan_layers


class DecoderLayer(nn.Module):
    """Pre-norm causal self-attention and a SiLU MLP, each with a residual connection."""

    def __init__(self, hidden, heads, intermediate):
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)

    def forward(self, h):
        b, t, d = h.shape
        q, k, v = self.qkv(self.attn_norm(h)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return h + self.down(F.silu(self.up(self.mlp_norm(h))))


class Decoder(nn.Module):
    def __init__(self, vocab, hidden, heads, intermediate, layers, use_scan=True):
        super().__init__()
        self.use_scan = use_scan
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(DecoderLayer(hidden, heads, intermediate) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        if self.use_scan:
            h = scan_layers(self.layers, h)
        else:
            for layer in self.layers:
                h = layer(h)
        return self.head(self.norm(h))


def make_model(flags, use_scan=True):
    torch.manual_seed(flags.seed)
    return Decoder(flags.vocab, flags.hidden, flags.heads, 4 * flags.hidden, flags.layers, use_scan)


def batches(flags):
    """``flags.steps`` batches of (input ids, next-token targets), the same for a given seed."""
    g = torch.Generator().manual_seed(flags.seed + 1)
    tokens = torch.randint(0, flags.vocab, (flags.steps, flags.batch_size, flags.seq + 1), generator=g)
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loop", action="store_true", help="run the layers as a Python loop")
    return parser.parse_args(argv)


def train(flags):
    device = torch_xla.device()
    model = make_model(flags, use_scan=not flags.loop).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=flags.lr)
    loss = None
    for step, (ids, targets) in enumerate(batches(flags)):
        loss = loss_fn(model(ids.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
        print(f"loss step={step} value={loss.item()!r}", flush=True)
    print(f"final loss {loss.item()!r}", flush=True)


if __name__ == "__main__":
    train(parse_args())
