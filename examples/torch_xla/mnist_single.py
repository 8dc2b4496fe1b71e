"""Single-device MNIST training, written for torch_xla (fake MNIST-shaped data).

A torch_xla script as its documentation writes it: ``xm.xla_device()``, ``pl.MpDeviceLoader`` (which
marks the step at every batch), ``xm.optimizer_step`` and a step closure for logging. It imports only
torch_xla, so it runs on lazyxla unmodified:

    python -m lazyxla.run examples/torch_xla/mnist_single.py --steps 8

Each step prints one line ``loss epoch=E step=S value=V`` (V exact: Python's repr of the float), and the
last line is ``final loss V``.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
from torch.utils.data import DataLoader, TensorDataset


class MNIST(nn.Module):
    """torch_xla's MNIST example network: two convolutions with batch norm, two linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.bn1 = nn.BatchNorm2d(10)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.bn2 = nn.BatchNorm2d(20)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = self.bn1(x)
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = self.bn2(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def fake_mnist(samples, seed=0):
    """Random 1x28x28 images and labels in 0..9, the same for a given seed."""
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(samples, 1, 28, 28, generator=g), torch.randint(0, 10, (samples,), generator=g))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--metrics", action="store_true", help="print torch_xla's short metrics report at the end")
    return parser.parse_args(argv)


def _log(epoch, step, loss):
    print(f"loss epoch={epoch} step={step} value={loss.item()!r}", flush=True)


def train(flags):
    torch.manual_seed(flags.seed)
    device = xm.xla_device()
    model = MNIST().to(device)
    optimizer = optim.SGD(model.parameters(), lr=flags.lr, momentum=flags.momentum)
    loss_fn = nn.NLLLoss()
    dataset = fake_mnist(flags.batch_size * flags.steps)
    train_loader = DataLoader(dataset, batch_size=flags.batch_size, shuffle=False, drop_last=True)
    train_device_loader = pl.MpDeviceLoader(train_loader, device)

    model.train()
    loss = None
    for epoch in range(flags.epochs):
        for step, (data, target) in enumerate(train_device_loader):
            optimizer.zero_grad()
            output = model(data)
            loss = loss_fn(output, target)
            loss.backward()
            xm.optimizer_step(optimizer)
            xm.add_step_closure(_log, args=(epoch, step, loss))
    torch_xla.sync()
    print(f"final loss {loss.item()!r}", flush=True)
    if flags.metrics:
        print(met.short_metrics_report(), end="", flush=True)


if __name__ == "__main__":
    train(parse_args())
