"""Multi-process (data-parallel) MNIST training, written for torch_xla (fake MNIST-shaped data).

The layout of torch_xla's ``test_train_mp_mnist.py``: ``xmp.spawn(_mp_fn, args=(flags,))`` starts one
replica per device, each reads its shard through a ``DistributedSampler`` and ``pl.MpDeviceLoader``,
``xm.optimizer_step`` averages the gradients across replicas, ``xm.mesh_reduce`` averages the test
accuracy, ``xm.master_print`` reports it and ``xm.save`` writes a checkpoint. It imports only torch_xla:

    CPU_NUM_DEVICES=2 python -m lazyxla.run examples/torch_xla/mnist_xmp.py --steps 6

Each replica prints ``loss rank=R epoch=E step=S value=V`` per step; the master prints
``test_accuracy=A`` and ``final loss V`` (its last loss).
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class MNIST(nn.Module):
    """A convolutional MNIST network (no batch norm, no dropout: every replica computes the same function)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def fake_mnist(samples, seed):
    """Random 1x28x28 images and labels in 0..9, the same for a given seed."""
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(samples, 1, 28, 28, generator=g), torch.randint(0, 10, (samples,), generator=g))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16, help="per replica")
    parser.add_argument("--steps", type=int, default=6, help="batches per replica and epoch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01, help="scaled by the number of replicas")
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--test-samples", type=int, default=64)
    parser.add_argument("--num-cores", type=int, default=None, help="replicas (default: every device)")
    parser.add_argument("--ckpt", default="", help="write the final model here with xm.save")
    return parser.parse_args(argv)


def train_mnist(flags):
    torch.manual_seed(1)  # the same initial weights in every replica
    world, rank = xr.world_size(), xr.global_ordinal()
    train_dataset = fake_mnist(flags.batch_size * flags.steps * world, seed=0)
    test_dataset = fake_mnist(flags.test_samples, seed=1)
    train_sampler = DistributedSampler(train_dataset, num_replicas=world, rank=rank, shuffle=False)
    test_sampler = DistributedSampler(test_dataset, num_replicas=world, rank=rank, shuffle=False)
    train_loader = DataLoader(train_dataset, batch_size=flags.batch_size, sampler=train_sampler, drop_last=True)
    test_loader = DataLoader(test_dataset, batch_size=flags.batch_size, sampler=test_sampler)

    lr = flags.lr * world
    device = xm.xla_device()
    model = MNIST().to(device)
    optimizer = optim.SGD(model.parameters(), lr=lr, momentum=flags.momentum)
    loss_fn = nn.NLLLoss()
    tracker = xm.RateTracker()

    def train_loop_fn(loader, epoch):
        model.train()
        for step, (data, target) in enumerate(loader):
            optimizer.zero_grad()
            output = model(data)
            loss = loss_fn(output, target)
            loss.backward()
            xm.optimizer_step(optimizer)
            tracker.add(flags.batch_size)
            xm.add_step_closure(_train_update, args=(rank, epoch, step, loss))
        return loss

    def test_loop_fn(loader):
        total_samples, correct = 0, 0
        model.eval()
        for data, target in loader:
            output = model(data)
            pred = output.max(1, keepdim=True)[1]
            correct += pred.eq(target.view_as(pred)).sum()
            total_samples += data.size()[0]
        accuracy = 100.0 * correct.item() / total_samples
        return xm.mesh_reduce("test_accuracy", accuracy, np.mean)

    train_device_loader = pl.MpDeviceLoader(train_loader, device)
    test_device_loader = pl.MpDeviceLoader(test_loader, device)
    for epoch in range(flags.epochs):
        loss = train_loop_fn(train_device_loader, epoch)
        xm.master_print(f"epoch {epoch} done, {tracker.global_rate():.1f} samples/s per replica", flush=True)
    accuracy = test_loop_fn(test_device_loader)
    xm.master_print(f"test_accuracy={float(accuracy)!r}", flush=True)
    if flags.ckpt:
        xm.save(model.state_dict(), flags.ckpt)
    xm.master_print(f"final loss {loss.item()!r}", flush=True)
    return accuracy


def _train_update(rank, epoch, step, loss):
    print(f"loss rank={rank} epoch={epoch} step={step} value={loss.item()!r}", flush=True)


def _mp_fn(index, flags):
    torch.set_default_dtype(torch.float32)
    train_mnist(flags)


if __name__ == "__main__":
    FLAGS = parse_args()
    xmp.spawn(_mp_fn, args=(FLAGS,), nprocs=FLAGS.num_cores)
