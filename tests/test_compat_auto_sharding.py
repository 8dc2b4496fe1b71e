"""torch_xla's auto-sharding entry points under lazyxla (``xs.xla_distribute_module(..., auto_policy)``,
``xr.use_spmd(auto=True)``): lazyxla's fixed policy stands for XLA's auto-sharding pass (which jax cannot run).

A torch_xla-style script in a fresh process with 4 CPU devices trains a model distributed with ``auto_policy`` and
the same model unsharded on the CPU: the losses and parameters agree, each parameter's layout is split over the 4
devices on its first dimension they divide (1/4 of it per device), and the mode's flag and counter read as torch_xla's.
"""

from __future__ import annotations

import pytest

from tests.util import run_torch_xla_script

SCRIPT = r"""
import copy, json
import torch
from torch import nn
from torch.distributed.tensor import DeviceMesh, distribute_module
import torch_xla
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr
from torch_xla.distributed.spmd import auto_policy

torch.manual_seed(0)
ref = nn.Sequential(nn.Linear(32, 12), nn.ReLU(), nn.Linear(12, 6))   # 12 and 6: dimension 0 split or not
model = copy.deepcopy(ref)
n = xr.global_runtime_device_count()
flag_before = torch_xla._XLAC._xla_get_auto_sharding()
sharded = distribute_module(model, DeviceMesh("xla", list(range(n))), auto_policy)
opt, ref_opt = torch.optim.SGD(sharded.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
losses = []
for _ in range(4):
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 6, (16,), generator=g)
    loss = nn.functional.cross_entropy(sharded(x.to("xla")), y.to("xla"))
    loss.backward(); opt.step(); opt.zero_grad(); torch_xla.sync()
    ref_loss = nn.functional.cross_entropy(ref(x), y)
    ref_loss.backward(); ref_opt.step(); ref_opt.zero_grad()
    losses.append([loss.item(), ref_loss.item()])
params = {k: (v.detach().cpu() - dict(ref.named_parameters())[k].detach()).abs().max().item()
          for k, v in sharded.named_parameters()}
specs = {k: torch_xla._XLAC._get_xla_sharding_spec(v) for k, v in sharded.named_parameters()}
print("RESULT " + json.dumps({
    "devices": n, "flag_before": flag_before, "flag": torch_xla._XLAC._xla_get_auto_sharding(),
    "env": __import__("os").environ.get("XLA_AUTO_SPMD"), "losses": losses, "param_diff": params, "specs": specs,
    "auto_compiles": met.counter_value("CompileWithAutoSharding"), "spmd": xr.is_spmd(),
}))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_torch_xla_script(SCRIPT, tmp_path_factory.mktemp("auto"), timeout=300, CPU_NUM_DEVICES="4")


def test_auto_policy_trains_like_the_unsharded_model(run):
    assert run["devices"] == 4 and run["spmd"]
    for got, want in run["losses"]:
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert max(run["param_diff"].values()) < 1e-5


def test_auto_policy_splits_each_parameter_on_its_first_divisible_dimension(run):
    assert run["specs"] == {
        "0.weight": "{devices=[4,1]0,1,2,3}",  # (12, 32): dimension 0
        "0.bias": "{devices=[4]0,1,2,3}",
        "2.weight": "{devices=[1,4]0,1,2,3}",  # (6, 12): 6 does not divide by 4, 12 does
        "2.bias": "{replicated}",  # (6,): nothing to split
    }


def test_auto_sharding_mode_reads_as_in_torch_xla(run):
    assert run["flag_before"] is False and run["flag"] is True and run["env"] == "1"
    assert 1 <= run["auto_compiles"] <= 3  # the step programs compiled in the mode (torch_xla's test: up to 3)
