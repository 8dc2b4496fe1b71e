"""PyTorch Lightning on lazyxla's device without torch_xla: an ``Accelerator`` and a single-device ``Strategy``.

Example::

    import lazyxla.lightning
    trainer = lightning.pytorch.Trainer(strategy=lazyxla.lightning.Strategy(), max_epochs=1)
    trainer.fit(model, loader)          # the model, the batches and every step on lazyxla's device

Why a strategy and not only an accelerator: Lightning chooses a strategy from the accelerator it is given, and
for an accelerator it does not know it chooses ``SingleDeviceStrategy(device="cpu")``: the model would train on
the CPU. ``Strategy`` holds lazyxla's device and its ``Accelerator``; ``Accelerator.setup`` refuses a strategy
whose device is not lazyxla's (an error naming ``strategy=lazyxla.lightning.Strategy()``) instead of training
on the CPU in silence. ``Strategy.optimizer_step`` ends each training step with ``lazyxla.sync()`` (what
torch_xla's ``xm.optimizer_step``/``MpDeviceLoader`` do on Lightning's XLA path): without it a loop that reads
nothing records every step into one growing graph.

Under ``python -m lazyxla.run`` Lightning's own XLA path works instead (``accelerator="tpu"``, through the
torch_xla layer); this module is for scripts that do not use torch_xla.

Lightning is imported here at module level: this module is loaded only by ``import lazyxla.lightning`` (never
by ``import lazyxla``), so a process that does not ask for the integration does not pay Lightning's import.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY as _FABRIC_ACCELERATORS
from lightning.fabric.strategies import STRATEGY_REGISTRY as _FABRIC_STRATEGIES
from lightning.fabric.strategies import SingleDeviceStrategy as _FabricSingleDeviceStrategy
from lightning.pytorch.accelerators import Accelerator as _LightningAccelerator
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import SingleDeviceStrategy, StrategyRegistry

from lazyxla.device.devices import local_devices, torch_device, torch_name
from lazyxla.lazy.graph import sync

__all__ = ["Accelerator", "FabricStrategy", "Strategy"]

NAME = "lazyxla"
"""The name all are registered under: ``Trainer(accelerator="lazyxla", strategy="lazyxla")``,
``Fabric(strategy="lazyxla")``."""


def _one_device(devices: Any) -> int:
    """Lightning's ``devices`` argument, which for lazyxla must mean its one device per process."""
    if devices in ("auto", 1, "1", -1, "-1") or devices in ([0], (0,), "0,"):
        return 1
    raise ValueError(
        f"devices={devices!r}: lazyxla's Lightning integration drives one device per process (devices=1); "
        "for several processes run Lightning's XLA path under `python -m lazyxla.run` (accelerator='tpu', "
        "devices=N with CPU_NUM_DEVICES=N)"
    )


class Accelerator(_LightningAccelerator):
    """Lightning's accelerator for lazyxla's device (one device per process). Use it with :class:`Strategy`,
    which it comes with: ``Trainer(strategy=lazyxla.lightning.Strategy())``.

    Example::

        trainer = Trainer(strategy=lazyxla.lightning.Strategy(accelerator=lazyxla.lightning.Accelerator()))
    """

    def setup_device(self, device: torch.device) -> None:
        # Lightning calls this with its strategy's device before anything moves: refuse Lightning's CPU default
        if device.type != torch_name():
            raise ValueError(
                f"accelerator=lazyxla.lightning.Accelerator() got a strategy on {device}: Lightning does not "
                "know lazyxla's device and would train on the CPU; pass strategy=lazyxla.lightning.Strategy() "
                "to a Trainer, or strategy='lazyxla' (lazyxla.lightning.FabricStrategy()) to Fabric, instead "
                "(each brings this accelerator)"
            )

    def teardown(self) -> None:
        pass

    def get_device_stats(self, device) -> dict[str, Any]:
        return {}

    @staticmethod
    def parse_devices(devices: Any) -> int:
        return _one_device(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch_device(0)] if _one_device(devices) else []

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return len(local_devices()) > 0

    @staticmethod
    def name() -> str:
        return NAME

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register(NAME, cls, description=cls.__name__, override=True)


def _own_accelerator(accelerator, forms: str):
    """``accelerator`` if it is lazyxla's (or None). Lightning and Fabric build a strategy named by a string
    (``strategy="lazyxla"``) after choosing an accelerator themselves (the CPU's for ``"auto"``) and hand it over:
    refused, naming ``forms`` (what to pass instead), rather than training on the CPU in silence."""
    if accelerator is not None and not isinstance(accelerator, Accelerator):
        raise ValueError(f"lazyxla's strategy was given Lightning's {type(accelerator).__name__}: pass {forms}")
    return accelerator


class Strategy(SingleDeviceStrategy):
    """Lightning's single-device strategy on lazyxla's device (index 0), ending each optimizer step with a sync.

    Example::

        trainer = Trainer(strategy=lazyxla.lightning.Strategy(), max_steps=100)
        trainer.fit(model, loader)
        trainer.test(model, test_loader)
    """

    strategy_name = NAME

    def __init__(self, accelerator: Accelerator | None = None, **kwargs: Any) -> None:
        super().__init__(device=torch_device(0), accelerator=accelerator or Accelerator(), **kwargs)

    @property
    def accelerator(self):
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator) -> None:
        forms = "Trainer(accelerator='lazyxla', strategy='lazyxla') or Trainer(strategy=lazyxla.lightning.Strategy())"
        self._accelerator = _own_accelerator(accelerator, forms)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        sync()  # one program per training step (torch_xla's optimizer_step/MpDeviceLoader mark a step here)
        return output

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(NAME, cls, description=cls.__name__, override=True)


class FabricStrategy(_FabricSingleDeviceStrategy):
    """Lightning Fabric's single-device strategy on lazyxla's device (index 0), ending each optimizer step with
    a sync; registered as ``Fabric(strategy="lazyxla")``. (Fabric has its own strategy classes: a Trainer's
    :class:`Strategy` is not one.)

    Example::

        fabric = Fabric(strategy=lazyxla.lightning.FabricStrategy())  # or accelerator=strategy="lazyxla"
        model, optimizer = fabric.setup(model, optimizer)
        loader = fabric.setup_dataloaders(loader)
    """

    def __init__(self, accelerator: Accelerator | None = None, **kwargs: Any) -> None:
        super().__init__(device=torch_device(0), accelerator=accelerator or Accelerator(), **kwargs)

    @property
    def accelerator(self):
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator) -> None:
        forms = (
            "Fabric(accelerator='lazyxla', strategy='lazyxla') or Fabric(strategy=lazyxla.lightning.FabricStrategy())"
        )
        self._accelerator = _own_accelerator(accelerator, forms)

    def optimizer_step(self, optimizer, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, **kwargs)
        sync()  # one program per training step, as Strategy.optimizer_step
        return output

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(NAME, cls, description=cls.__name__, override=True)


Accelerator.register_accelerators(AcceleratorRegistry)
Strategy.register_strategies(StrategyRegistry)
# Fabric's registries are its own; its accelerator base class is the one Lightning's Accelerator extends
Accelerator.register_accelerators(_FABRIC_ACCELERATORS)
FabricStrategy.register_strategies(_FABRIC_STRATEGIES)
