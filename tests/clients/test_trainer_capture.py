"""transformers ``Trainer``, unmodified, under ``LAZYXLA_CAPTURE=1``: its training step replays, and equals the CPU.

``scripts/hf_trainer.py`` (the script of ``test_trainer.py``: Trainer's defaults, gradient accumulation over 2
micro-batches, evaluation and checkpoints, then a run resumed from the first checkpoint) trains 10 optimizer steps
here, under ``python -m lazyxla.run`` with ``LAZYXLA_CAPTURE=1``. ``Trainer.training_step`` (the forward, the loss
and the backward of one micro-batch) is then a captured step (``lazyxla/frontend/trainer.py``): the micro-batch
that starts without gradients and the one that accumulates into them are two verified steps. The first needs two
recordings; the second is verified again once the first replays (its gradients are then the replay's results, no
longer autograd's views of a product: another step for capture). From step 6 on both replay, through the
evaluation and the checkpoint at step 5, and no program is compiled after the warm-up.

The rule is ``test_trainer.py``'s: every logged loss, gradient norm, learning rate and evaluation loss, and
every final parameter, within 1e-4 of the same script on the CPU (one process, batch 4).
"""

from __future__ import annotations

import pytest

from tests.clients.architectures import build
from tests.clients.scripts import assert_xla_path, run_script
from tests.clients.test_trainer import assert_equals_cpu

STEPS = 10
STEADY = 6  # the first step whose two micro-batches are both replayed


@pytest.fixture(scope="module")
def cpu(tmp_path_factory) -> dict:
    """The script on the CPU, one process, batch 4, ``STEPS`` steps."""
    (result,) = run_script("hf_trainer.py", tmp_path_factory.mktemp("trainer") / "cpu", 4, False, None, str(STEPS))
    assert not result["xla"]
    return result


def per_step(counts: list[int], before: int = 0) -> list[int]:
    return [b - a for a, b in zip([before, *counts], counts)]


def test_trainer_replays_its_training_step_and_equals_cpu(cpu, tmp_path):
    (result,) = run_script("hf_trainer.py", tmp_path / "xla", 4, True, None, str(STEPS), LAZYXLA_CAPTURE="1")
    assert_xla_path(result)
    assert_equals_cpu(result, cpu)
    replays = per_step(result["replays"])
    assert len(replays) == STEPS and replays[STEADY - 1 :] == [2] * (STEPS - STEADY + 1), replays
    assert sum(replays[: STEADY - 1]) >= 1, replays  # (the first micro-batch replays from step 4)
    compiles = result["compiles"]
    assert compiles[STEADY:] == [compiles[STEADY - 1]] * (STEPS - STEADY), compiles  # no program built once warm
    # the run resumed from checkpoint-5 (a new Trainer, the optimizer state loaded: its own captured step) learns
    # as the first did, and its last steps replay the first micro-batch
    resumed = per_step(result["resumed_replays"], result["replays"][-1])
    assert len(resumed) == STEPS // 2 and resumed[-2:] == [1, 1], resumed
    print(f"replays per step {replays}, resumed {resumed}; compiles {compiles}")


# ---- what the captured step guards, and what it refuses (no training: the Trainer objects alone) ------------


def _trainer(tmp_path, cls=None, **options):
    import transformers as T

    model, _ = build("llama")
    args = T.TrainingArguments(output_dir=str(tmp_path), report_to="none", gradient_accumulation_steps=2)
    return (cls or T.Trainer)(model=model, args=args, **options)


def test_a_trainer_whose_step_code_is_its_own_is_captured_and_others_are_recorded_saying_why(tmp_path):
    import transformers as T

    from lazyxla.frontend.trainer import training_step_capture

    class OwnLoss(T.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch) * 2

    assert training_step_capture(_trainer(tmp_path)).capture_status == "not called yet"
    status = training_step_capture(_trainer(tmp_path, OwnLoss)).capture_status
    assert status.startswith("recorded, not captured: OwnLoss overrides Trainer.compute_loss"), status
    status = training_step_capture(_trainer(tmp_path, compute_loss_func=lambda *a, **k: None)).capture_status
    assert status.startswith("recorded, not captured: a compute_loss_func"), status


def test_the_guards_hold_the_numbers_the_step_reads_and_not_the_loop_counters(tmp_path):
    from lazyxla.frontend.trainer import _numbers

    trainer = _trainer(tmp_path)
    numbers = _numbers(trainer)
    trainer.current_flos += 1e6  # the loop's counters change every step; the step reads none of them
    trainer._globalstep_last_logged = 3
    assert _numbers(trainer) == numbers
    trainer.current_gradient_accumulation_steps = 1  # the epoch's last, shorter accumulation: another loss scale
    assert _numbers(trainer) != numbers
    trainer.current_gradient_accumulation_steps = 2
    trainer.accelerator.gradient_accumulation_steps = 4  # accelerate's backward divides the loss by it
    assert _numbers(trainer) != numbers
