"""A Lightning Fabric script as a torch_xla user writes it (imports nothing from lazyxla or torch_xla).

``python fabric_train.py OUT ACCELERATOR [OPTIMIZER]``: seeds, builds a tiny model, and trains it 4 steps
(fixed data, batch 4; SGD with momentum or Adam) through Fabric: ``setup``, ``setup_dataloaders``,
``backward`` and the optimizer's step; then evaluates once under ``torch.no_grad``. Saves ``OUT/result_0.pt``:
the losses of every step, the evaluation's outputs, the initial and final parameters, and which of Fabric's
classes ran (strategy, precision, accelerator) with the parameters' and batches' device. ``ACCELERATOR`` is
Fabric's (``cpu``, ``tpu``, ``auto``), or ``lazyxla``: ``strategy=lazyxla.lightning.FabricStrategy()`` (the
integration without torch_xla), ``lazyxla-names``: ``accelerator="lazyxla", strategy="lazyxla"`` (the names
``import lazyxla.lightning`` registers), ``lazyxla-strategy-name-only`` (which must refuse).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset


def _placement(name: str) -> dict:
    if name.startswith("lazyxla"):
        import lazyxla.lightning  # only in these modes: the others import nothing of lazyxla's

        if name == "lazyxla-names":
            return {"accelerator": "lazyxla", "strategy": "lazyxla"}  # the names import lazyxla.lightning registers
        if name == "lazyxla-strategy-name-only":
            return {"strategy": "lazyxla"}  # Fabric would give it the CPU's accelerator: must refuse
        return {"strategy": lazyxla.lightning.FabricStrategy()}
    return {"accelerator": name}


def main(out: Path, accelerator: str, optimizer_name: str) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    if optimizer_name == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    fabric = Fabric(**_placement(accelerator), devices=1)
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False))
    losses, seen = [], {}
    for data, target in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.detach())
        seen = {"param_device": str(next(model.parameters()).device), "batch_device": str(data.device)}
    with torch.no_grad():
        evaluated = model(fabric.to_device(x)).softmax(-1)
    result = {
        "initial": initial,
        "final": {k: v.detach().to("cpu") for k, v in model.state_dict().items()},
        "losses": torch.stack([v.to("cpu") for v in losses]),
        "evaluated": evaluated.to("cpu"),
        "strategy": type(fabric.strategy).__name__,
        "precision": type(fabric.strategy.precision).__name__,
        "accelerator": type(fabric.accelerator).__name__,
        "device": str(fabric.device),
        **seen,
    }
    torch.save(result, out / "result_0.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "sgd")
