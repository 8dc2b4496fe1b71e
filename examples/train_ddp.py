"""Data-parallel training on lazyxla: one process per device, gradients averaged inside each step.

Run it either way (the same script):

    python examples/train_ddp.py --nprocs 2            # lazyxla.spawn starts the processes
    torchrun --nproc-per-node 2 examples/train_ddp.py  # torchrun starts them

Each replica reads its own shard of a synthetic classification set (DistributedSampler), batches reach
the device through lazyxla.DeviceLoader, lazyxla.optimizer_step averages the gradients across replicas,
the master shows progress and a checkpoint is written after every epoch (atomically; ``--resume`` goes
on from it). The last line is the final loss, averaged over the replicas.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import lazyxla


def _dataset(n: int = 2048, features: int = 32, classes: int = 4) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(classes, features, generator=g) * 0.15
    labels = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(centers[labels] + torch.randn(n, features, generator=g), labels)


def _progress(epoch: int, step: int, steps: int, loss: float, started: float) -> None:
    done = int(30 * step / steps)
    rate = step / max(time.perf_counter() - started, 1e-9)
    line = f"\repoch {epoch} [{'#' * done}{'.' * (30 - done)}] {step}/{steps} loss {loss:.4f} {rate:.1f} it/s"
    sys.stdout.write(line)
    sys.stdout.flush()


def train(index: int, args: argparse.Namespace) -> float:
    """One replica's training loop (``index`` is its rank); returns the final mean loss."""
    rt = lazyxla.runtime
    dev = lazyxla.device()
    torch.manual_seed(0)  # every replica starts from the same weights
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    first_epoch = 0
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    if args.resume and os.path.exists(checkpoint):
        state = lazyxla.load(checkpoint, device=dev)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first_epoch = state["epoch"] + 1
    data = _dataset()
    sampler = DistributedSampler(data, num_replicas=rt.world_size(), rank=rt.global_ordinal(), shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
    loss = torch.zeros((), device=dev)
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        started = time.perf_counter()
        for step, (x, y) in enumerate(lazyxla.DeviceLoader(loader, dev), 1):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            lazyxla.optimizer_step(opt)
            opt.zero_grad()
            if rt.is_master() and (step % 10 == 0 or step == len(loader)):
                _progress(epoch, step, len(loader), loss.item(), started)
        if rt.is_master():
            print()
        lazyxla.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, checkpoint)
    mean = lazyxla.all_reduce(lazyxla.ReduceOp.SUM, loss.detach(), scale=1.0 / rt.world_size())
    return mean.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nprocs", type=int, default=2, help="processes to spawn (ignored under torchrun)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="per-replica batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", default="runs/train_ddp", help="checkpoint folder")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ:  # started by torchrun
        loss = train(int(os.environ["RANK"]), args)
        if lazyxla.runtime.is_master():
            print(f"final loss {loss:.6f}")
    else:
        losses = lazyxla.spawn(train, args=(args,), nprocs=args.nprocs)
        print(f"final loss {losses[0]:.6f}")


if __name__ == "__main__":
    main()
