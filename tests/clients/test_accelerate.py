"""accelerate's ``Accelerator``, unmodified, through the torch_xla layer: ``python -m lazyxla.run`` equals the CPU.

``scripts/hf_accelerate.py`` is written for torch_xla and imports nothing from lazyxla: under ``python -m
lazyxla.run`` accelerate finds ``torch_xla`` and takes its XLA code paths (``xm.set_replication``,
``xm._fetch_gradients`` + ``xm.all_reduce`` of the gradients in ``clip_grad_norm_`` and the optimizer step,
``xm.all_gather`` in ``gather``/``gather_for_metrics``, ``xm._maybe_convert_to_cpu`` in ``save_state``,
``MpDeviceLoader``); with plain ``python`` it trains on the CPU. Each run trains a tiny random Llama one epoch
with ``prepare``, ``backward``, ``clip_grad_norm_`` and ``gather``, saves its state after 4 batches,
evaluates with ``gather_for_metrics``, loads the saved state back and trains over the last 4 batches again.

The rule: every loss and gradient norm within 1e-4 (relative), every parameter (after training, after
``load_state``, after the resumed training) within 1e-4 (relative and absolute) of the CPU run, equal
predictions; the loaded parameters are exactly the saved ones. Two replicas (``CPU_NUM_DEVICES=2``) each take
half of the CPU run's batch (accelerate gives replica ``r`` every other batch of the seeded order): the mean
of their gathered losses is the CPU loss, the gathered predictions are the CPU's. The XLA path is checked:
``DistributedType.XLA``, the device, accelerate's ``MpDeviceLoaderWrapper``, no op on the CPU, nothing
compiled after the second step. The largest parameter difference from the CPU is 2.2e-5 (AdamW: see
test_trainer.py). On 2 cores shared with other work: about 15 s for the CPU run, 25 s for one replica and
60 s for two.
"""

from __future__ import annotations

import pytest
import torch

from tests.clients.scripts import (
    RTOL,
    assert_params_close,
    assert_replicas_agree,
    assert_same_start_and_real_training,
    assert_xla_path,
    run_on_cpu,
    run_on_lazyxla,
)


@pytest.fixture(scope="module")
def cpu(tmp_path_factory) -> dict:
    """The script on the CPU, one process, batch 4 (the global batch of every lazyxla run here)."""
    return run_on_cpu("hf_accelerate.py", tmp_path_factory.mktemp("accelerate") / "cpu")


def assert_path(result: dict, replicas: int) -> None:
    assert_xla_path(result)
    assert result["num_processes"] == replicas
    compiles = result["first"]["compiles"]
    assert len(compiles) == 8 and set(compiles[1:]) == {compiles[1]}, f"compiled after step 2: {compiles}"
    resumed = result["resumed"]["compiles"]
    assert len(resumed) == 4 and set(resumed) == {resumed[0]}, f"the resumed steps compiled: {resumed}"


def assert_record_close(got: dict, want: dict) -> None:
    """Losses (the mean of what the replicas gathered) and gradient norms, step by step."""
    assert len(got["losses"]) == len(want["losses"])
    for step, (g, w) in enumerate(zip(got["losses"], want["losses"])):
        assert g.mean().item() == pytest.approx(w.item(), rel=RTOL), (step, g, w)
    assert got["norms"] == pytest.approx(want["norms"], rel=RTOL)


def assert_equals_cpu(result: dict, cpu: dict) -> None:
    assert_same_start_and_real_training(result, cpu)
    assert_record_close(result["first"], cpu["first"])
    assert_params_close(result["first"]["saved"], cpu["first"]["saved"])
    largest = assert_params_close(result["final"], cpu["final"])
    print(f"accelerate on {result['num_processes']} replica(s): largest parameter difference from CPU {largest:.1e}")
    assert torch.equal(result["predictions"], cpu["predictions"])
    for name, value in result["first"]["saved"].items():  # load_state gave back exactly what save_state saved
        assert torch.equal(result["loaded"][name], value), name
    assert_record_close(result["resumed"], cpu["resumed"])
    assert_params_close(result["resumed_final"], cpu["resumed_final"])


@pytest.mark.parametrize("replicas", [1, 2])
def test_accelerate_equals_cpu_over_the_same_global_batch(cpu, tmp_path, replicas):
    results = run_on_lazyxla("hf_accelerate.py", tmp_path / "xla", replicas)
    for result in results:
        assert_path(result, replicas)
        assert_equals_cpu(result, cpu)
    assert_replicas_agree(results, "resumed_final")
