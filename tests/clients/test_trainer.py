"""transformers ``Trainer``, unmodified, through the torch_xla layer: ``python -m lazyxla.run`` equals the CPU.

``scripts/hf_trainer.py`` is written for torch_xla and imports nothing from lazyxla. Under ``python -m
lazyxla.run`` transformers and accelerate find ``torch_xla`` and take their XLA code paths; with plain
``python`` the same script trains on the CPU. Both runs train a tiny random Llama with Trainer's defaults
(fused AdamW, pinned memory, ``max_grad_norm=1.0``, a linear schedule) plus gradient accumulation, evaluation
and checkpoints every 2 steps, then train again from ``checkpoint-2`` with ``resume_from_checkpoint``.

The rule: every logged loss, gradient norm, learning rate and evaluation loss, and every final parameter,
within 1e-4 (relative, and absolute for parameters) of the CPU run; the parameters must have moved by far
more than that, so the comparison means something. (Parameters need the absolute bound: AdamW divides each
update by the root of the squared gradient, so an element whose gradient is near zero carries the rounding
differences of the two runs into its update; the largest such difference here is 3.5e-5 on one replica and
4.1e-5 on two, while losses agree to 1e-7.) Two replicas (``CPU_NUM_DEVICES=2``: ``xmp.spawn``
starts two processes, each with half the batch) are compared with one CPU process over the same global
batch: accelerate gives replica ``r`` every other batch of the seeded shuffle, which together are the CPU
run's batches; the all-reduced mean gradient of two equal halves is the gradient of the whole batch.

The XLA path is checked, not assumed: ``is_torch_xla_available()``, ``DistributedType.XLA``, ``args.device``
and the parameters on lazyxla, accelerate's ``MpDeviceLoaderWrapper``, no op on the CPU (torch_xla's
``aten::`` counters), and the last step compiling no program. The scripts run in child processes (bounded by
a timeout; a timed-out child's process group is killed). On 2 cores shared with other work: about 15 s for
the CPU run, 30 s for one replica and 65 s for two.
"""

from __future__ import annotations

import pytest

from tests.clients.scripts import (
    RTOL,
    assert_params_close,
    assert_replicas_agree,
    assert_same_start_and_real_training,
    assert_xla_path,
    run_on_cpu,
    run_on_lazyxla,
)

LOGGED = ("loss", "grad_norm", "learning_rate", "eval_loss", "train_loss")


@pytest.fixture(scope="module")
def cpu(tmp_path_factory) -> dict:
    """The script on the CPU, one process, batch 4 (the global batch of every lazyxla run here)."""
    return run_on_cpu("hf_trainer.py", tmp_path_factory.mktemp("trainer") / "cpu")


def assert_path(result: dict, replicas: int) -> None:
    assert_xla_path(result)
    assert result["parallel_mode"] == "ParallelMode.TPU" and result["world_size"] == replicas
    assert result["optimizer"] == "AdamW" and result["fused"] is True  # Trainer's default, adamw_torch_fused
    assert len(result["compiles"]) == 4 and result["compiles"][3] == result["compiles"][2], result["compiles"]


def logged(history: list[dict]) -> dict[tuple, float]:
    return {(e["step"], k): e[k] for e in history for k in LOGGED if k in e}


def assert_logs_close(got: list[dict], want: list[dict]) -> None:
    got, want = logged(got), logged(want)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=RTOL), (key, got[key], value)


def assert_equals_cpu(result: dict, cpu: dict) -> None:
    assert_same_start_and_real_training(result, cpu)
    assert_logs_close(result["logs"], cpu["logs"])
    largest = assert_params_close(result["final"], cpu["final"])
    print(f"Trainer on {result['world_size']} replica(s): largest parameter difference from the CPU {largest:.1e}")
    assert_logs_close(result["resumed_logs"], cpu["resumed_logs"])
    assert_params_close(result["resumed"], cpu["final"])  # resuming from checkpoint-2 ends where training did


def test_cpu_run_resumes_to_the_same_weights(cpu):
    assert_params_close(cpu["resumed"], cpu["final"])


@pytest.mark.parametrize("replicas", [1, 2])
def test_trainer_equals_cpu_over_the_same_global_batch(cpu, tmp_path, replicas):
    results = run_on_lazyxla("hf_trainer.py", tmp_path / "xla", replicas)
    for result in results:
        assert_path(result, replicas)
        assert_equals_cpu(result, cpu)
    assert_replicas_agree(results, "final")
