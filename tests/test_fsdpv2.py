"""FSDPv2 (``torch_xla.experimental.spmd_fully_sharded_data_parallel``) over lazyxla's SPMD.

The torch_xla-style script ``examples/torch_xla/fsdpv2_train.py`` trains a small GPT with AdamW on 8 fake CPU
devices (a fresh process: SPMD mode is per process) under the compatibility layer; it must equal single-device
CPU eager, and each device must hold 1/8 of every parameter and of AdamW's state (read from the shards of the
device buffers). The same process checks torch_xla's FSDPv2 behaviours: errors, the global mesh, output sharding,
auto-wrapping, ``extra_data_axis``.
"""

from __future__ import annotations

import lazyxla
from tests import fsdpv2_workers as W

DEVICES = 8
STEPS = 4


def test_fsdpv2_script_trains_a_gpt_sharded_one_eighth_per_device():
    (run,) = lazyxla.spawn(W.train_and_measure, args=(STEPS,), nprocs=1, cpu_devices=DEVICES, timeout_s=280)
    assert run["devices"] == DEVICES
    for got, want in zip(run["losses"], run["ref_losses"], strict=True):
        assert abs(got - want) <= 1e-5 * abs(want), (run["losses"], run["ref_losses"])
    assert run["diff"] <= 1e-5, run["diff"]  # parameters after the last step vs CPU eager (rtol 1e-5, atol 1e-5)
    assert run["state_diff"] <= 1e-5, run["state_diff"]  # AdamW's moments too
    # step 1 and step 2 (AdamW's state appears) compile one program each; nothing after
    assert run["compiles"] == [1, 2, 2, 2], run["compiles"]

    # every parameter is split over 'fsdp' (here every one has a dimension 8 divides), and AdamW's moments too
    assert all("fsdp" in spec for spec in run["specs"].values()), run["specs"]
    for name, fractions in {**run["param_fractions"], **run["state_fractions"]}.items():
        assert fractions == [1 / DEVICES] * DEVICES, (name, fractions)
    for held, total in ((run["param_devices"], run["param_bytes"]), (run["state_devices"], run["state_bytes"])):
        assert sorted(held) == list(range(DEVICES)) and set(held.values()) == {total // DEVICES}, (held, total)
    assert run["wrapped"] == ["SpmdFullyShardedDataParallel"] * 2  # the auto-wrap policy wrapped each block

    api = run["api"]
    assert api["no_mesh"] == "ValueError: No mesh is provided and no global mesh is set. Please provide a mesh."
    assert api["no_fsdp_axis"] == "ValueError: The mesh must have an axis named 'fsdp'."
    assert api["bad_extra_axis"] == "ValueError: The provided ddp axis is not in the mesh."
    assert api["module_list"].startswith("RuntimeError: The module wrapped by FSDP *must define a `forward`")
    assert api["twice"].startswith("RuntimeError: Cannot wrap a module that is already wrapped with FSDP")
    assert api["wrapped_inside"].startswith("ValueError: Expected 0 to NOT be SpmdFullyShardedDataParallel")
    assert api["global_mesh"] and api["device"] == "lazyxla:0"  # a CPU model is moved to the device
    # Linear(128, 64): weight on its largest dimension, bias; Linear(64, 3): weight on dim 1, a bias of 3 that
    # 8 does not divide stays replicated (torch_xla would pad it)
    assert api["layer_specs"] == [(None, "fsdp"), ("fsdp",), (None, "fsdp"), None]
    assert api["output_spec"] == ("fsdp", None)  # the output's batch dimension
    assert api["getitem"] == "Linear" and api["getattr"]
    assert api["custom_shard_output"] == [((16, 3), True)]
    assert api["tuple_warning"] and api["tuple_spec"] == ("fsdp", None)  # a tuple: its first element
    assert api["auto_wrapped"] == ["SpmdFullyShardedDataParallel", "ReLU", "SpmdFullyShardedDataParallel"]
    assert api["callable_wrapped"] == ["Linear", "ReLU", "Linear"]  # auto_wrapper_callable decides
    assert api["extra_axis_output_spec"] == (("data", "fsdp"), None)
    assert api["extra_axis_param_spec"] == (None, "fsdp")  # parameters: 'fsdp' only, replicated over 'data'
