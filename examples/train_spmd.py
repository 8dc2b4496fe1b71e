"""2-D data x tensor parallel training of a GPT-style model with lazyxla's SPMD mode: annotations only.

The model is ordinary PyTorch. Annotating the weights is all it takes: attention's QKV and the MLP's
first layer are split by output features over the "model" axis (column-parallel), the attention
output projection and the MLP's second layer by input features (row-parallel), the batch over the
"data" axis. XLA's partitioner inserts the collectives; each device holds its share of the weights.

    python examples/train_spmd.py                  # 1 process x 8 fake CPU devices
    python examples/train_spmd.py --nprocs 2       # 2 processes x 4 fake CPU devices: one global mesh

On accelerators run one process per host (e.g. under torchrun) with ``--devices 0`` (use the real ones).
The last line is the final loss, the same for every layout.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

import lazyxla

VOCAB, SEQ, D, HEADS, LAYERS = 256, 32, 64, 4, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.proj = nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=1 / math.sqrt(D))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def shard_tensor_parallel(model: GPT, mesh: lazyxla.spmd.Mesh) -> None:
    """Megatron-style layout by annotation: column-parallel in, row-parallel out, over mesh axis 'model'."""
    mark = lazyxla.spmd.mark_sharding
    with torch.no_grad():
        for blk in model.blocks:
            mark(blk.qkv.weight, mesh, ("model", None))
            mark(blk.fc1.weight, mesh, ("model", None))
            mark(blk.fc1.bias, mesh, ("model",))
            mark(blk.proj.weight, mesh, (None, "model"))
            mark(blk.fc2.weight, mesh, (None, "model"))
        mark(model.head.weight, mesh, ("model", None))  # vocabulary-parallel output layer


def batches(steps: int, batch: int, rank: int, processes: int):
    """This process's share of each global batch (a synthetic next-token task with learnable structure)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (batch, 1), generator=g)
        seq = (start + torch.arange(SEQ + 1) * 7) % VOCAB  # the next token follows from the current one
        part = slice(rank * batch // processes, (rank + 1) * batch // processes)
        yield seq[part, :-1], seq[part, 1:]


def train(rank: int, args: argparse.Namespace) -> float:
    spmd = lazyxla.spmd
    spmd.enable()
    dev = lazyxla.device()
    mesh = spmd.mesh((args.data, -1), ("data", "model"))
    torch.manual_seed(0)
    model = GPT().to(dev)
    shard_tensor_parallel(model, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    processes = lazyxla.runtime.process_count()
    loader = lazyxla.DeviceLoader(
        batches(args.steps, args.batch, rank, processes), dev, input_sharding=(mesh, ("data", None))
    )
    losses = []
    for step, (x, y) in enumerate(loader, 1):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss)
        if step % args.log_every == 0:
            value = loss.item()  # every process reads: in a multi-process run all must run the same programs
            if lazyxla.runtime.is_master():
                print(f"step {step:4d} loss {value:.4f}", flush=True)
    if lazyxla.runtime.is_master():
        w = model.blocks[0].fc1.weight
        mesh_of, spec = spmd.get_sharding(w)
        print(f"blocks.0.fc1.weight {tuple(w.shape)} laid out as {spec} over {mesh_of}", flush=True)
    return losses[-1].item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nprocs", type=int, default=1, help="processes (on CPU each gets 8/nprocs fake devices)")
    parser.add_argument("--devices", type=int, default=8, help="fake CPU devices in all (0: use the real devices)")
    parser.add_argument("--data", type=int, default=2, help="size of the mesh's data axis (the rest is 'model')")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8, help="global batch size")
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    cpu = args.devices // args.nprocs if args.devices else None
    losses = lazyxla.spawn(train, args=(args,), nprocs=args.nprocs, cpu_devices=cpu)
    print(f"final loss {losses[0]:.6f}")


if __name__ == "__main__":
    main()
