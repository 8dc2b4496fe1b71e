"""TRL's ``SFTTrainer``, unmodified, through the torch_xla layer: ``python -m lazyxla.run`` equals the CPU, and
the programs it runs per step are the ones its host reads ask for.

``scripts/trl_sft.py`` is written for torch_xla and imports nothing from lazyxla: a tiny random Llama fine-tuned
on 16 short texts of different lengths (a word-level tokenizer built from their words; nothing is downloaded),
6 steps of batch 4 with ``SFTConfig``'s defaults (gradient checkpointing included) but float32, plus the two
settings docs/performance.md ("TRL's SFTTrainer") recommends: ``pad_to_multiple_of=16``, so that every batch pads
to one length and the step compiles once (by default each batch pads to its longest text and each new length
compiles new programs: 16 compiles in 8 steps instead of 11), and ``logging_steps=3`` (Trainer's logging costs
3 programs per logged step).

The rule: every logged loss, gradient norm, learning rate, entropy, token accuracy and token count within 1e-4
(relative) of the CPU run, and every final parameter within 1e-4; the XLA path checked (``xla:0``, accelerate's
``MpDeviceLoaderWrapper``, no op on the CPU). Programs per step, exactly: 11 on a step that does not log, 14 on
one that does; nothing compiles after step 4. Of the 11, one is the forward and one the backward with the
optimizer; the other 9 are a few nodes each, forced by the libraries (measured with ``lazyxla.metrics.syncs()``):
accelerate's ``gather_for_metrics`` on XLA calls ``xm.mark_step()`` after each gather (4 gathers per micro-batch
in ``SFTTrainer.compute_loss``: the first one runs the forward), TRL reads its entropy, token accuracy and token
count metrics with 5 ``.item()``/``bool`` reads per micro-batch, and the second of its two reads at one line also
computes, in a program of its own, the sum the first left pending (lazyxla's left-over rule, per read site: 12
programs before it was, when transformers' two reads of the padding mask also cut the forward after the
embedding). About 15 s for the CPU run and 40 s for lazyxla's on 2 cores.
"""

from __future__ import annotations

import pytest

from tests.clients.scripts import (
    RTOL,
    assert_params_close,
    assert_same_start_and_real_training,
    run_script,
)

pytest.importorskip("trl", reason="trl is not installed (requirements.txt pins it)")

STEPS = 6
SETTINGS = ("pad_to_multiple_of=16", "logging_steps=3")
LOGGED = ("loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "num_tokens", "train_loss")
PROGRAMS = {"quiet": 11, "logging": 14}  # per optimizer step, with SETTINGS (see the module docstring)


def _sft(folder, on_lazyxla: bool) -> dict:
    (result,) = run_script("trl_sft.py", folder, 4, on_lazyxla, None, str(STEPS), *SETTINGS)
    return result


@pytest.fixture(scope="module")
def cpu(tmp_path_factory) -> dict:
    result = _sft(tmp_path_factory.mktemp("trl") / "cpu", on_lazyxla=False)
    assert not result["xla"] and result["distributed_type"] == "DistributedType.NO"
    return result


def _logged(history: list[dict]) -> dict[tuple, float]:
    return {(e["step"], k): e[k] for e in history for k in LOGGED if k in e}


def test_sft_trainer_equals_cpu_in_the_programs_its_host_reads_ask_for(cpu, tmp_path):
    result = _sft(tmp_path / "xla", on_lazyxla=True)

    assert result["xla"] and result["distributed_type"] == "DistributedType.XLA"
    assert result["device"] == result["param_device"] == "xla:0"
    assert result["train_loader"] == "MpDeviceLoaderWrapper"
    assert result["cpu_ops"] == [], f"ops ran on the CPU: {result['cpu_ops']}"
    assert result["gradient_checkpointing"] and cpu["gradient_checkpointing"]  # SFTConfig's default, on both

    got, want = _logged(result["logs"]), _logged(cpu["logs"])
    assert got.keys() == want.keys() and {s for s, _ in want} == {3, 6}
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=RTOL), (key, got[key], value)
    assert_same_start_and_real_training(result, cpu)
    largest = assert_params_close(result["final"], cpu["final"])

    counts = result["counts"]
    executed = [c["ExecuteComputation"] for c in counts]
    per_step = [b - a for a, b in zip([0, *executed], executed)]
    print(f"SFTTrainer: programs per step {per_step}; largest parameter difference from the CPU {largest:.1e}")
    for step, programs in enumerate(per_step[1:], start=2):
        # the counts are taken at ``on_step_end``, before the step logs: step 3's logging falls in step 4's count
        want_programs = PROGRAMS["logging" if step % 3 == 1 else "quiet"]
        assert programs == want_programs, f"step {step}: {programs} programs, not {want_programs}: {per_step}"
    compiled = [c["UncachedCompile"] for c in counts]
    assert compiled[3:] == [compiled[3]] * (STEPS - 3), compiled  # one padded length: nothing new after step 4
