"""Hugging Face ``Trainer`` on lazyxla replays its training step (whole-step capture, ``config.capture``).

Example (unmodified user code, run with ``LAZYXLA_CAPTURE=1``)::

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)   # model on lazyxla
    trainer.train()      # from the third optimizer step on, each micro-batch's forward and backward is replayed

Why
---
A loop body between two ``mark_step()`` calls cannot be replayed: Python cannot skip its statements. But
``Trainer._inner_training_loop`` calls a natural step function per micro-batch, ``training_step(model, inputs,
num_items_in_batch)`` (the forward, the loss and ``accelerator.backward``), and that is nearly all of a step's
recorded ops (a tiny Llama: ~95%; the rest is gradient clipping and the fused optimizer's few nodes). With
``lazyxla.config.capture`` on, ``Trainer.training_step`` on a lazyxla model runs as a captured step
(``lazyxla.compile(fn, capture=True)``, lazy/capture.py): two recorded calls from the same state verify it, later
ones replay its program. With gradient accumulation the micro-batches start from different states (no gradients
after ``model.zero_grad()``, then accumulated ones): each is its own verified step.

What the step's Python reads beyond the arguments, the modules and the optimizer: numbers in the Trainer, its
``args``, its accelerator and the accelerator's gradient state (``current_gradient_accumulation_steps``,
``model_accepts_loss_kwargs``, ``args.n_gpu``, the accelerator's accumulation steps, ...). They are passed to the
captured step as an argument (``_numbers``), so a replay's guards compare them: a changed one records the call.
Counters the step does not read (``current_flos``, ``_globalstep_last_logged``, ...) are left out, or every call
would be recorded. ``num_items_in_batch`` is a device tensor when the batch is (an input of the program); a
Python number is guarded by value (a new value records). ``model.train()`` is called before the guards are taken
(the step's first statement): after an evaluation the model is in eval mode, and would otherwise miss.

When: ``lazyxla.config.capture`` on, the model's parameters on lazyxla, and the Trainer's own step code: a
subclass that overrides ``training_step``'s helpers (``compute_loss``, ``_prepare_inputs``, ...), or a
``compute_loss_func``, reads what these guards do not know, so its calls are recorded, and ``capture_status``
(``training_step_capture(trainer).capture_status``) says why. Anything the capture refuses (a CPU batch, a host
read inside the step) is recorded too, with its reason there.
"""

from __future__ import annotations

import weakref

import torch

from lazyxla.config import config
from lazyxla.frontend.generation import model_on_lazyxla
from lazyxla.lazy.regions import compile as lazyxla_compile
from lazyxla.lazy.step_world import NUMBERS
from lazyxla.observe import metrics
from lazyxla.util import after_import

_TRAINER = "transformers.trainer"
_ORIGINAL: dict = {}  # "training_step": transformers' own Trainer.training_step (before the patch)
_ATTR = "_lazyxla_training_step"  # a Trainer's captured step (``_TrainingStep``), kept on the Trainer
# Trainer methods that ``training_step`` runs: an override may read anything, so it is recorded
_STEP_METHODS = (
    "training_step",
    "compute_loss",
    "compute_loss_context_manager",
    "autocast_smart_context_manager",
    "_prepare_inputs",
    "_prepare_input",
    "_prepare_context_parallel_inputs",
)
# Trainer attributes that change every step and that ``training_step`` does not read (guarding them would
# record every call): the loop's counters and totals
_COUNTERS = frozenset(
    {"current_flos", "_globalstep_last_logged", "_total_loss_scalar", "_mixed_mesh_grads", "is_in_train"}
)


class _TrainingStep:
    """A Trainer's ``training_step``, captured (or, when the Trainer's configuration cannot be, recorded)."""

    def __init__(self, trainer, original) -> None:
        self.trainer = weakref.ref(trainer)  # (kept on the trainer: no cycle keeping it alive)
        self.original = original
        self.captured = lazyxla_compile(self._step, capture=True, name="Trainer.training_step")
        self.refused = _refusal(trainer)

    def _step(self, model, inputs, num_items_in_batch, numbers):
        """The Trainer's own step; ``numbers`` (``_numbers``) is there for the guards only."""
        return self.original(self.trainer(), model, inputs, num_items_in_batch)

    def __call__(self, model, inputs, num_items_in_batch):
        trainer = self.trainer()
        if self.refused:
            metrics.inc("capture_refusals")
            return self.original(trainer, model, inputs, num_items_in_batch)
        # (the step's own first statements: after an evaluation the model is in eval mode, and the guards would
        # differ from the verified step's)
        model.train()
        if hasattr(trainer.optimizer, "train") and callable(trainer.optimizer.train):
            trainer.optimizer.train()
        return self.captured(model, inputs, num_items_in_batch, _numbers(trainer))

    @property
    def capture_status(self) -> str:
        if self.refused:
            return f"recorded, not captured: {self.refused}"
        return self.captured.capture_status


def _refusal(trainer) -> str:
    """Why ``trainer``'s step cannot be captured ('' when it can)."""
    import transformers  # (loaded: the patch runs when transformers.trainer is imported)

    base = transformers.Trainer
    for name in _STEP_METHODS:
        if getattr(type(trainer), name, None) is not getattr(base, name, None):
            return (
                f"{type(trainer).__name__} overrides Trainer.{name}, whose Python may read numbers that capture does "
                "not guard; the Trainer's own step is captured"
            )
    if getattr(trainer, "compute_loss_func", None) is not None:
        return "a compute_loss_func reads numbers that capture does not guard; the Trainer's own loss is captured"
    return ""


def _numbers(trainer) -> tuple:
    """The numbers of the Trainer, its args, its accelerator and the accelerator's gradient state (by name and
    value), and those of its label smoother: what ``training_step``'s Python reads besides tensors."""
    accelerator = getattr(trainer, "accelerator", None)
    objects = (
        (trainer, _COUNTERS),
        (trainer.args, ()),
        (accelerator, ()),
        (getattr(accelerator, "gradient_state", None), ()),
        (getattr(trainer, "label_smoother", None), ()),
    )
    return tuple(tuple(_object_numbers(obj, skip)) for obj, skip in objects)


def _object_numbers(obj, skip) -> list:
    if obj is None:
        return []
    return [(k, v) for k, v in vars(obj).items() if type(v) in NUMBERS and k not in skip]


def training_step_capture(trainer) -> _TrainingStep:
    """``trainer``'s captured training step (made on first use, kept on the Trainer).

    Example::

        trainer.train()
        print(training_step_capture(trainer).capture_status)     # 'replaying'
    """
    step = trainer.__dict__.get(_ATTR)
    if step is None:
        step = _TrainingStep(trainer, _ORIGINAL["training_step"])
        trainer.__dict__[_ATTR] = step
    return step


def _patch(module) -> None:
    """Route ``Trainer.training_step`` to a captured step for lazyxla models while ``config.capture`` is on."""
    cls = module.Trainer
    if "training_step" in _ORIGINAL:
        return  # (patched already)
    original = _ORIGINAL["training_step"] = cls.training_step

    def training_step(self, model: torch.nn.Module, inputs, num_items_in_batch=None):
        if config.capture and model_on_lazyxla(model):
            return training_step_capture(self)(model, inputs, num_items_in_batch)
        return original(self, model, inputs, num_items_in_batch)

    training_step.__doc__ = original.__doc__
    cls.training_step = training_step


def install() -> None:
    """Patch transformers' Trainer now if it is loaded, else when it is (done when lazyxla is imported).

    Example::

        import lazyxla, transformers      # either order
    """
    after_import({_TRAINER: _patch})
