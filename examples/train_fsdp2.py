"""A torchtitan-style Llama trained with PyTorch's own FSDP2 (``fully_shard``), optionally with tensor parallel,
in either of lazyxla's execution models.

The model and the parallelism are PyTorch's: ``init_device_mesh``, ``parallelize_module`` with
``ColwiseParallel``/``RowwiseParallel``/``SequenceParallel``, ``fully_shard`` per block and at the root.

- SPMD mode (the default): one process drives every device after ``lazyxla.spmd.enable()``. A DTensor on a lazyxla
  mesh holds the global tensor laid out as its placements say, so FSDP2's all-gathers and reduce-scatters are
  layouts XLA's partitioner implements and the step is one partitioned program (docs/architecture.md, "DTensor in
  SPMD mode").
- One process per device (``torchrun``, or ``--nprocs N``: ``lazyxla.spawn``): ``init_process_group("lazyxla")``,
  each rank trains on its rows of the batch, and FSDP2's collectives are lazyxla's in-graph collectives
  (docs/architecture.md, "FSDP2 over replicas"). FSDP2 only (no ``--tp``).

docs/distributed.md compares the ways to scale.

    python examples/train_fsdp2.py                                # FSDP2 over 8 fake CPU devices, one process
    python examples/train_fsdp2.py --tp 4                         # 2-D: FSDP2 over "dp" (2) x TP over "tp" (4)
    torchrun --nproc-per-node 2 examples/train_fsdp2.py           # FSDP2 over 2 processes, one device each
    python examples/train_fsdp2.py --nprocs 2                     # the same, the processes started by lazyxla.spawn
    python examples/train_fsdp2.py --device cpu                   # the same model and steps in eager PyTorch

On accelerators pass ``--devices 0`` (the real ones). The last line is the final loss (of the whole batch): the
same, within float32 rounding, in every mode.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import lazyxla

VOCAB, SEQ, D, HEADS, LAYERS, HIDDEN = 128, 16, 64, 4, 2, 128


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(D, D, bias=False) for _ in range(3))
        self.wo = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # (-1 heads: under tensor parallel each projection is split over "tp", and the code is the same)
        q, k, v = (w(x).view(b, t, -1, D // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(D, HIDDEN, bias=False), nn.Linear(D, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(D), nn.RMSNorm(D)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.output = nn.RMSNorm(D), nn.Linear(D, VOCAB, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=1 / math.sqrt(D))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def tensor_parallel(model: Llama, mesh) -> None:
    """torchtitan's plan: q/k/v and w1/w3 column-parallel, wo and w2 row-parallel, norms sequence-parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    for block in model.layers:
        plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        }
        parallelize_module(block, mesh, plan)
    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )


def batches(steps: int, batch: int):
    """A synthetic next-token task with learnable structure (the next token follows from the current one)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (batch, 1), generator=g)
        seq = (start + torch.arange(SEQ + 1) * 7) % VOCAB
        yield seq[:, :-1], seq[:, 1:]


def _shard(model: Llama, dp) -> None:
    for block in model.layers:
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)


def train(rank: int, args: argparse.Namespace) -> float:
    """Build, shard and train (``args.mode``: "spmd", "replicas" or "cpu"); the final loss of the whole batch."""
    torch.manual_seed(0)
    model = Llama()
    world = 1
    if args.mode == "spmd":
        lazyxla.spmd.enable()
        n = lazyxla.spmd.device_count()
        if args.tp > 1:
            mesh = init_device_mesh("lazyxla", (n // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
            tensor_parallel(model.to(lazyxla.device()), mesh["tp"])
            dp = mesh["dp"]
        else:
            dp = init_device_mesh("lazyxla", (n,), mesh_dim_names=("dp",))
            model = model.to(lazyxla.device())
        _shard(model, dp)
    elif args.mode == "replicas":
        dist.init_process_group("lazyxla")  # (torchrun's variables, or lazyxla.spawn's)
        rank, world = dist.get_rank(), dist.get_world_size()
        model = model.to(lazyxla.device())
        _shard(model, init_device_mesh("lazyxla", (world,), mesh_dim_names=("dp",)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    dev = torch.device("cpu") if args.mode == "cpu" else lazyxla.device()
    shown = rank == 0 or args.mode != "replicas"
    loss = torch.zeros(())
    for step, (x, y) in enumerate(batches(args.steps, args.batch), 1):
        x, y = x.chunk(world)[rank], y.chunk(world)[rank]  # (one process per device: this rank's rows)
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to(dev)).flatten(0, 1), y.to(dev).flatten())
        loss.backward()
        opt.step()
        loss = loss.detach()
        if args.mode == "replicas":  # the whole batch's loss: the ranks' (each a mean over as many tokens) averaged
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        if args.mode != "cpu":
            lazyxla.sync()
        if step % args.log_every == 0 and shown:
            print(f"step {step:4d} loss {loss.item():.4f}", flush=True)
    if args.mode != "cpu" and shown:
        w = model.layers[0].feed_forward.w1.weight
        print(f"layers.0.feed_forward.w1.weight {type(w).__name__} {tuple(w.shape)} {w.placements}", flush=True)
    final = loss.item()
    if args.mode == "replicas":
        dist.destroy_process_group()
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("lazyxla", "cpu"), default="lazyxla")
    parser.add_argument("--devices", type=int, default=8, help="SPMD mode: fake CPU devices (0: the real devices)")
    parser.add_argument("--nprocs", type=int, default=0, help="one process per device: processes to spawn")
    parser.add_argument("--tp", type=int, default=1, help="SPMD mode: tensor-parallel size (1: FSDP2 only)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8, help="global batch size")
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args()
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
    args.mode = "cpu" if args.device == "cpu" else "replicas" if torchrun or args.nprocs else "spmd"
    if args.mode == "replicas" and args.tp > 1:
        parser.error("--tp runs in SPMD mode (one process); one process per device shards with FSDP2 only")
    if args.mode == "cpu":
        final = train(0, args)
    elif torchrun:
        final = train(int(os.environ["RANK"]), args)
        if int(os.environ["RANK"]):
            return
    elif args.mode == "replicas":
        final = lazyxla.spawn(train, args=(args,), nprocs=args.nprocs)[0]
    else:
        (final,) = lazyxla.spawn(train, args=(args,), nprocs=1, cpu_devices=args.devices or None)
    print(f"final loss {final:.6f}")


if __name__ == "__main__":
    main()
