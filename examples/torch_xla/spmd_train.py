"""SPMD training, written for torch_xla: a data x model parallel MLP by sharding annotations alone.

As torch_xla's SPMD guide writes it: ``xr.use_spmd()``, a ``xs.Mesh`` over every device with axes
``('data', 'model')``, ``xs.mark_sharding`` on the weights (the first layer split by rows over 'model',
the second by columns) and ``pl.MpDeviceLoader(..., input_sharding=xs.ShardingSpec(mesh, ('data', None)))``
for the batches; XLA's partitioner inserts the collectives. It imports only torch_xla:

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=4 python -m lazyxla.run examples/torch_xla/spmd_train.py --model-parallel 2

Each step prints ``loss step=S value=V``; the last line is ``final loss V``.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch.utils.data import DataLoader, TensorDataset


class MLP(nn.Module):
    def __init__(self, features=784, hidden=256, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def fake_data(samples, features=784, classes=10, seed=0):
    """Random inputs and labels, the same for a given seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    return TensorDataset(x, torch.randint(0, classes, (samples,), generator=g))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="global batch")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--model-parallel", type=int, default=1, help="size of the mesh's 'model' axis")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def _log(step, loss):
    print(f"loss step={step} value={loss.item()!r}", flush=True)


def main(flags):
    xr.use_spmd()
    torch.manual_seed(flags.seed)

    num_devices = xr.global_runtime_device_count()
    mesh_shape = (num_devices // flags.model_parallel, flags.model_parallel)
    device_ids = np.array(range(num_devices))
    mesh = xs.Mesh(device_ids, mesh_shape, ("data", "model"))
    xs.set_global_mesh(mesh)
    print(f"mesh {dict(mesh.shape())} over {num_devices} {xr.device_type()} devices", flush=True)

    device = xm.xla_device()
    model = MLP().to(device)
    xs.mark_sharding(model.fc1.weight, mesh, ("model", None))
    xs.mark_sharding(model.fc1.bias, mesh, ("model",))
    xs.mark_sharding(model.fc2.weight, mesh, (None, "model"))
    optimizer = optim.SGD(model.parameters(), lr=flags.lr, momentum=flags.momentum)
    loss_fn = nn.CrossEntropyLoss()

    loader = DataLoader(fake_data(flags.batch_size * flags.steps), batch_size=flags.batch_size, drop_last=True)
    train_loader = pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, ("data", None)))

    model.train()
    for step, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = loss_fn(model(data), target)
        loss.backward()
        optimizer.step()
        xm.add_step_closure(_log, args=(step, loss))
    torch_xla.sync()
    print(f"final loss {loss.item()!r}", flush=True)


if __name__ == "__main__":
    main(parse_args())
