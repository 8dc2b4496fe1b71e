"""FSDPv2 (fully sharded data parallelism over SPMD), written for torch_xla (fake data).

As torch_xla's FSDPv2 guide writes it: ``xr.use_spmd()``, a mesh over every device with an axis named
``'fsdp'``, the model wrapped in ``SpmdFullyShardedDataParallel`` with each decoder block wrapped on its own
(an auto-wrap policy), and ``pl.MpDeviceLoader(..., input_sharding=xs.ShardingSpec(mesh, ('fsdp', None)))`` to
split each batch over the devices. Every device then holds ``1/N`` of the parameters and of AdamW's state; XLA
inserts the gathers and reduce-scatters. It imports only torch_xla:

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=8 python -m lazyxla.run examples/torch_xla/fsdpv2_train.py --steps 5

Each step prints ``loss step=S value=V``; the last line is ``final loss V``.
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from decoder_only_model import Block, DecoderOnly, fake_batches
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2


def block_policy(module, recurse, unwrapped_params):
    """Wrap each decoder block on its own (the protocol of torch_xla's ``transformer_auto_wrap_policy``)."""
    return recurse or isinstance(module, Block)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16, help="global batch (a multiple of the devices)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def _log(step, loss):
    print(f"loss step={step} value={loss.item()!r}", flush=True)


def train(flags):
    """Train with FSDPv2; returns the wrapped model, the optimizer and the per-step losses (device tensors)."""
    xr.use_spmd()
    num_devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.array(range(num_devices)), (num_devices, 1), ("fsdp", "model"))
    xs.set_global_mesh(mesh)

    torch.manual_seed(flags.seed)
    model = FSDPv2(DecoderOnly(), auto_wrap_policy=block_policy)  # the global mesh; moved to the device
    optimizer = torch.optim.AdamW(model.parameters(), lr=flags.lr, weight_decay=0.01)
    batches = [(ids[:, :-1], ids[:, 1:]) for ids in fake_batches(flags.steps, flags.batch_size)]
    device = torch_xla.device()
    loader = pl.MpDeviceLoader(batches, device, input_sharding=xs.ShardingSpec(mesh, ("fsdp", None)))

    losses = []
    for step, (inputs, targets) in enumerate(loader):
        optimizer.zero_grad()
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss)
        xm.add_step_closure(_log, args=(step, loss))
    torch_xla.sync()
    return model, optimizer, losses


def main(flags):
    _, _, losses = train(flags)
    print(f"final loss {losses[-1].item()!r}", flush=True)


if __name__ == "__main__":
    main(parse_args())
