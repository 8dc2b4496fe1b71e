"""``torch.distributed.checkpoint`` (DCP) of FSDP2 models and their AdamW state on lazyxla, against CPU eager.

SPMD mode (one process, fake CPU devices, DTensors holding global tensors: docs/architecture.md, "Distributed
checkpoint"): saved on 8 devices, loaded on 4 and into a plain CPU model; training continues as an uninterrupted
CPU run. A save killed part-way with ``AtomicFileSystemWriter`` leaves the previous checkpoint. Each case runs in fresh
processes (``lazyxla.spawn``), bounded in time.
"""

from __future__ import annotations

import copy

import dcp_workers as W  # tests/ is on sys.path (pytest puts it there); the children import it by name
import pytest
import torch

import lazyxla

pytest.importorskip("transformers", reason="the tiny Llama is transformers' LlamaForCausalLM")

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _close(got: dict, want: dict, **tol) -> float:
    """Assert two states (FQN -> tensor) hold the same keys and close values; their largest difference."""
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], msg=lambda m, k=k: f"{k}: {m}", **(tol or TOL))
    return max((got[k].double() - want[k].double()).abs().max().item() for k in want)


@pytest.fixture(scope="module")
def reference():
    """The tiny Llama trained 4 AdamW steps on the CPU: losses, and the state after steps 2 and 4."""
    model, batches = W.tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=W.LR, foreach=True)
    losses = W.train(model, opt, W.llama_loss, batches[:2])
    after2 = W.cpu_state(model, opt)
    losses += W.train(model, opt, W.llama_loss, batches[2:])
    return {"losses": losses, "after2": after2, "after4": W.cpu_state(model, opt)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dcp") / "step2")


@pytest.fixture(scope="module")
def saved(folder):
    (out,) = lazyxla.spawn(W.spmd_save, args=("llama", folder, 8), nprocs=1, cpu_devices=8, timeout_s=280)
    return out


@pytest.fixture(scope="module")
def resumed(saved, folder):
    (out,) = lazyxla.spawn(W.spmd_resume, args=("llama", folder, 4), nprocs=1, cpu_devices=4, timeout_s=280)
    return out


def test_spmd_save_writes_each_tensor_whole_once(saved):
    # DCP computed rank 0's chunk (1/8 of dim 0) for a global tensor holding all 8 parts
    assert saved["files"] == [".metadata", "__0_0.distcp"]
    for fqn, chunks in saved["chunks"].items():
        assert len(chunks) == 1, (fqn, chunks)
        (offsets, sizes), shape = chunks[0], tuple(saved["state"][fqn].shape)
        assert offsets == (0,) * len(shape) and sizes == shape, (fqn, chunks)


def test_saved_fsdp2_state_equals_cpu_after_two_steps(saved, reference):
    torch.testing.assert_close(torch.tensor(saved["losses"]), torch.tensor(reference["losses"][:2]), **TOL)
    _close(saved["state"], reference["after2"])


def test_fsdp2_on_four_devices_loads_the_eight_device_checkpoint_exactly(saved, resumed):
    assert _close(resumed["loaded"], saved["state"], rtol=0, atol=0) == 0.0
    assert all(resumed["sharded"].values()), resumed["sharded"]  # laid out Shard(0) over the 4 devices again


def test_training_resumed_on_four_devices_equals_an_uninterrupted_cpu_run(resumed, reference):
    torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(reference["losses"][2:]), **TOL)
    _close(resumed["final"], reference["after4"])


def test_a_plain_cpu_model_loads_the_spmd_checkpoint_and_trains_on(saved, folder, reference):
    model, opt, loaded = W.cpu_load("llama", folder)  # no process group in this process
    assert _close(loaded, saved["state"], rtol=0, atol=0) == 0.0
    _, batches = W.tiny_llama()
    losses = W.train(model, opt, W.llama_loss, batches[2:])
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference["losses"][2:]), **TOL)
    _close(W.cpu_state(model, opt), reference["after4"])


def test_dcp_to_torch_save_of_the_spmd_checkpoint(saved, folder, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(folder, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    for k, v in saved["state"].items():
        if k.startswith("model."):
            got = whole["model"][k.removeprefix("model.")]
        else:
            fqn, name = k.removeprefix("optim.state.").rsplit(".", 1)
            got = whole["optim"]["state"][fqn][name]
        torch.testing.assert_close(got, v, rtol=0, atol=0, msg=lambda m, k=k: f"{k}: {m}")


# --- a save killed part-way --------------------------------------------------------------------------------------


def _save_then_kill(folder: str, atomic: bool) -> dict:
    (first,) = lazyxla.spawn(W.spmd_save_with, args=(folder, atomic, False), nprocs=1, cpu_devices=8, timeout_s=280)
    with pytest.raises(lazyxla.SpawnError, match="rank 0 .*(signal|SIGKILL)"):
        lazyxla.spawn(W.spmd_save_with, args=(folder, atomic, True), nprocs=1, cpu_devices=8, timeout_s=280)
    return first["state"]


def test_a_save_killed_after_its_first_file_leaves_the_previous_checkpoint_whole(tmp_path):
    folder = str(tmp_path / "latest")
    previous = _save_then_kill(folder, atomic=True)
    _, _, loaded = W.cpu_load("mlp", folder)
    assert _close(loaded, previous, rtol=0, atol=0) == 0.0


def test_pytorchs_filesystem_writer_overwrites_the_previous_checkpoint_in_place(tmp_path):
    # why AtomicFileSystemWriter: the killed save replaced the data file the old .metadata still describes
    folder = str(tmp_path / "latest")
    previous = _save_then_kill(folder, atomic=False)
    _, _, loaded = W.cpu_load("mlp", folder)
    differing = [k for k in previous if not torch.equal(loaded[k], previous[k])]
    assert differing, "the killed save left every value of the previous checkpoint"


def test_atomic_writer_refuses_a_folder_written_in_place(tmp_path):
    import torch.distributed.checkpoint as dcp

    from lazyxla.parallel.atomic_checkpoint import AtomicFileSystemWriter

    state = {"w": torch.arange(4.0)}
    dcp.save(state, checkpoint_id=str(tmp_path / "plain"), no_dist=True)
    with pytest.raises(dcp.CheckpointException, match="is a folder, not the link"):
        dcp.save(copy.deepcopy(state), storage_writer=AtomicFileSystemWriter(tmp_path / "plain"), no_dist=True)
    # a new path: saved twice, loaded through the link, one version folder left
    for value in (1.0, 2.0):
        dcp.save({"w": torch.full((4,), value)}, storage_writer=AtomicFileSystemWriter(tmp_path / "a"), no_dist=True)
    got = {"w": torch.zeros(4)}
    dcp.load(got, checkpoint_id=str(tmp_path / "a"), no_dist=True)
    assert torch.equal(got["w"], torch.full((4,), 2.0))
    assert (tmp_path / "a").is_symlink() and len(list(tmp_path.glob("a.v-*"))) == 1


# --- fused and capturable AdamW, bf16 compute, int64 buffers and a Python int --------------------------------------


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("recipes") / "ckpt")
    (saved,) = lazyxla.spawn(W.spmd_recipes_save, args=(folder,), nprocs=1, cpu_devices=8, timeout_s=280)
    (resumed,) = lazyxla.spawn(W.spmd_recipes_resume, args=(folder,), nprocs=1, cpu_devices=4, timeout_s=280)
    return folder, saved, resumed


def _recipe_reference() -> tuple[list[float], dict, dict]:
    """Recipe "a"'s model trained 4 steps on the CPU (foreach AdamW: fused and capturable differ from it by
    rounding only): the last 2 losses, the state after steps 2 and 4."""
    model, batches = W.counted_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=W.LR, foreach=True)
    W.counted_train(model, opt, batches[:2])
    after2 = W.cpu_state(model, opt)
    losses = W.counted_train(model, opt, batches[2:])
    return losses, after2, W.cpu_state(model, opt)


def test_fused_and_capturable_adamw_with_dtensor_steps_save_and_resume_as_an_uninterrupted_run(recipes):
    _, saved, resumed = recipes
    for name in ("a", "b"):
        s, r = saved[name], resumed[name]
        assert s["step_types"] == ["DTensor"], (name, s["step_types"])  # replicated DTensor step counters
        assert s["param_dtypes"] == ["torch.float32"], name  # bf16 compute keeps fp32 sharded parameters
        assert _close(r["loaded"], s["saved"], rtol=0, atol=0) == 0.0, name  # loaded on 4 devices as saved on 8
        assert r["loaded"]["model.seen"].dtype == torch.int64 and r["loaded"]["model.seen"].item() == 2
        assert r["loaded"]["optim.state.0.weight.step"].item() == 2.0
        tol = TOL
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(s["losses"]), **tol)
        _close(r["final"], s["final"], **tol)
    losses, after2, after4 = _recipe_reference()
    _close(saved["a"]["saved"], after2)  # recipe "a" (fp32) against the CPU run
    torch.testing.assert_close(torch.tensor(resumed["a"]["losses"]), torch.tensor(losses), **TOL)
    _close(resumed["a"]["final"], after4)


def test_int64_buffers_and_a_python_int_round_trip(recipes):
    folder, saved, resumed = recipes
    assert resumed["epoch"] == 2  # a Python int in the app state
    for name in ("a", "b"):
        assert saved[name]["buffer_types"] == {"seen": "Tensor", "ids": "Tensor"}  # plain tensors, not DTensors
        for key, want in (("model.seen", torch.tensor(4)), ("model.ids", torch.arange(6) * 3)):
            got = resumed[name]["final"][key]
            assert got.dtype == torch.int64 and torch.equal(got, want), (name, key, got)
    # and into a plain CPU model (no process group): recipe "a"'s state as saved, its counter an int64 0-d tensor
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, _ = W.counted_mlp()
    W._perturb(model)
    opt = torch.optim.AdamW(model.parameters(), lr=W.LR, foreach=True)
    msd, osd = get_state_dict(model, opt)
    state = {"a": {"model": msd, "optim": osd}, "epoch": 0}
    dcp.load(state, checkpoint_id=folder, no_dist=True)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    assert state["epoch"] == 2
    assert _close(W.cpu_state(model, opt), saved["a"]["saved"], rtol=0, atol=0) == 0.0
    assert model.seen.dtype == torch.int64 and model.seen.item() == 2
