"""ZeRO-1 (``ZeroRedundancyOptimizer``) training of a tiny GPT, written for torch_xla.

The layout of torch_xla's ``test_train_mp_mnist_zero1.py``: ``xmp.spawn`` starts one replica per device; the model
is replicated, the optimizer (AdamW) is a ``ZeroRedundancyOptimizer``, which keeps 1/N of the optimizer state
per replica, reduce-scatters the gradients, clips them by their global norm, steps its slice and all-gathers
the parameters. Halfway, every replica saves the model and the optimizer state (with its master weights), builds
a new model and optimizer, loads both and trains on. It imports only torch_xla:

    CPU_NUM_DEVICES=2 python -m lazyxla.run examples/torch_xla/zero1_gpt.py --ckpt-dir /tmp/zero1_gpt

The master saves the trained model as ``zero1_final.pth``. Printed per replica: ``loss rank=R step=S value=V
grad_norm=G compiles=C fallbacks=F`` per step; ``memory rank=R params=P
master_weights=M optimizer_state=O full_optimizer_state=FO device_bytes=B``; and ``collectives rank=R ...``, the
results of ``xm.reduce_scatter`` and ``xm.all_gather`` into ``output=`` tensors (which take the results' data).
"""

import argparse
import os

import torch
import torch.nn.functional as F
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
from fsdp_gpt import cpu_fallbacks
from tiny_gpt import TinyGPT, device_bytes, token_dataset
from torch.utils.data import DataLoader, DistributedSampler
from torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=4, help="per replica")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--resume-at", type=int, default=2, help="save and reload after this many steps")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-norm", type=float, default=0.5)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def make_optimizer(model, flags, lr):
    return ZeroRedundancyOptimizer(
        model.parameters(),
        torch.optim.AdamW,
        lr=lr,
        max_norm=flags.max_norm,
        save_master_weights=True,
        pin_layout=False,
    )


def resume(flags, model, optimizer, device):
    """Save the model and this replica's optimizer state, then continue with new objects loaded from them."""
    path = os.path.join(flags.ckpt_dir, f"zero1_rank-{xr.global_ordinal()}.pth")
    xm.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path, master_only=False)
    state = torch.load(path)
    torch.manual_seed(flags.seed + 1)  # other initial weights: the checkpoint must replace them
    model = TinyGPT().to(device)
    model.load_state_dict(state["model"])
    optimizer = make_optimizer(model, flags, lr=flags.lr * 10)  # the saved learning rate must replace this one
    optimizer.load_state_dict(state["optimizer"])
    return model, optimizer


def train(flags, device):
    torch.manual_seed(flags.seed)  # the same initial weights in every replica
    world, rank = xr.world_size(), xr.global_ordinal()
    model = TinyGPT().to(device)
    optimizer = make_optimizer(model, flags, lr=flags.lr)
    data = token_dataset(flags.batch_size * flags.steps * world, seed=0)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = pl.MpDeviceLoader(DataLoader(data, batch_size=flags.batch_size, sampler=sampler, drop_last=True), device)
    for step, (tokens, targets) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()  # not xm.optimizer_step: the optimizer reduces the gradients itself
        xm.add_step_closure(_report_step, args=(rank, step, loss, optimizer.grad_norm))
        if step + 1 == flags.resume_at:
            xm.mark_step()
            model, optimizer = resume(flags, model, optimizer, device)
    report_memory(model, optimizer)
    xm.save(model.state_dict(), os.path.join(flags.ckpt_dir, "zero1_final.pth"))  # the master writes it


def report_memory(model, optimizer):
    xm.mark_step()
    params = sum(p.numel() for p in model.parameters())
    masters = [p for group in optimizer.base_optimizer.param_groups for p in group["params"]]
    state = [t for s in optimizer.base_optimizer.state.values() for t in s.values() if t.dim() > 0]  # not step
    print(
        f"memory rank={xr.global_ordinal()} params={params} master_weights={sum(p.numel() for p in masters)} "
        f"optimizer_state={sum(t.numel() for t in state)} full_optimizer_state={2 * params} "
        f"device_bytes={device_bytes()}",
        flush=True,
    )


def check_output_collectives(device):
    """``output=``: a reduce-scatter into a tensor shaped like the input leaves it shaped like the shard."""
    world, rank = xr.world_size(), xr.global_ordinal()
    x = (torch.arange(4.0 * world).reshape(2 * world, 2) + 100 * rank).to(device)
    out = torch.zeros_like(x)
    returned = xm.reduce_scatter(xm.REDUCE_SUM, x, 1.0, 0, world, output=out)
    outs = [torch.zeros(1, device=device), torch.zeros(1, device=device)]
    gathered = xm.all_gather([x[:1], x[1:2] * 2], dim=0, output=outs, pin_layout=False)
    xm.mark_step()
    print(
        f"collectives rank={rank} same={returned is out and gathered is outs} "
        f"reduce_scatter={out.cpu().tolist()} all_gather={[o.cpu().tolist() for o in outs]}",
        flush=True,
    )


def _report_step(rank, step, loss, grad_norm):
    print(
        f"loss rank={rank} step={step} value={loss.item()!r} grad_norm={grad_norm.item()!r} "
        f"compiles={met.counter_value('UncachedCompile') or 0} fallbacks={cpu_fallbacks()}",
        flush=True,
    )


def _mp_fn(index, flags):
    device = xm.xla_device()
    train(flags, device)
    check_output_collectives(device)


if __name__ == "__main__":
    FLAGS = parse_args()
    os.makedirs(FLAGS.ckpt_dir, exist_ok=True)  # before the replicas start: each writes its optimizer state there
    xmp.spawn(_mp_fn, args=(FLAGS,))
