"""torch_xla's SPMD checkpointing and DTensor helpers on lazyxla: ``torch_xla.experimental.distributed_checkpoint``
(``SPMDSavePlanner``, ``SPMDLoadPlanner``, ``CheckpointManager``, ``prime_optimizer``), ``XLAShardedTensor``,
``torch_xla.distributed.spmd.api`` and ``apply_xla_patch_to_nn_linear``.

One script runs under ``python -m lazyxla.run`` on 4 fake CPU devices (a subprocess bounded by a timeout) and
prints what it measured as JSON; every value is compared with the CPU tensors it started from (checkpoint
round trips through other meshes and layouts, local shards against NumPy slices, the einsum linear against
``nn.Linear`` on CPU eager).
"""

from __future__ import annotations

import json

import pytest

from tests.util import run_python

SCRIPT = r"""
import json, os, sys, tempfile
import numpy as np, torch
import torch.distributed as dist
import torch.distributed.checkpoint as dist_cp
from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor
import lazyxla
import torch_xla
import torch_xla.runtime as xr
import torch_xla.distributed.spmd as xs
from torch_xla.distributed.spmd.api import convert_to_xla_mesh
from torch_xla.distributed.spmd.xla_sharding import apply_xla_patch_to_nn_linear, wrap_as_sharded_tensor
import torch_xla.experimental.distributed_checkpoint as xc
from torch_xla.experimental.distributed_checkpoint._helpers import _CpuShards, _sharded_cpu_state_dict

xr.use_spmd()
n = xr.global_runtime_device_count()
out = {"devices": n}
torch.manual_seed(0)


def model(mesh_shape, spec):
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).to("xla")
    xs.mark_sharding(m[0].weight, xs.Mesh(np.arange(n), mesh_shape), spec)
    return m


def cpu_state(m):
    return {k: v.cpu().clone() for k, v in m.state_dict().items()}


def diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def layout(t):
    got = lazyxla.spmd.get_sharding(t)
    return None if got is None else list(got[1])


# local shards: the parts of a split tensor are the slices of its value; loading them back changes the value
w = torch.arange(32.0).reshape(8, 4)
x = w.to("xla")
xs.mark_sharding(x, xs.Mesh(np.arange(n), (2, n // 2)), (0, 1))
xt = xs.wrap_if_sharded(x)
shards = xt.local_shards
out["shard_type"] = xt.sharding_type.name
out["shards_match"] = all(torch.equal(s.data, w[tuple(s.indices)]) for s in shards)
out["shard_indices"] = [[[sl.start, sl.stop] for sl in s.indices] for s in shards]
for s in shards:
    s.data.mul_(-1)
xt.load_local_shards_(shards)
out["loaded_negated"] = torch.equal(x.cpu(), -w)
out["layout_kept"] = layout(x)
out["replicated_wrapped"] = xs.wrap_if_sharded(torch.ones(4).to("xla")).__class__.__name__

# save split over one mesh, load into another layout (and into an unsplit model): values equal, layouts kept
with tempfile.TemporaryDirectory() as tmp:
    src = model((2, n // 2), (0, 1))
    want = cpu_state(src)
    writer = dist_cp.FileSystemWriter(tmp + "/a", per_thread_copy_ahead=0)  # see docs: lazyxla has no streams
    dist_cp.save(src.state_dict(), storage_writer=writer, planner=xc.SPMDSavePlanner())
    for name, (shape, spec) in {"transposed": ((n // 2, 2), (1, 0)), "columns": ((1, n), (None, 1))}.items():
        dst = model(shape, spec)
        before = layout(dst[0].weight)
        state = dst.state_dict()
        dist_cp.load(state, storage_reader=dist_cp.FileSystemReader(tmp + "/a"), planner=xc.SPMDLoadPlanner())
        out[name] = {"diff": diff(cpu_state(dst), want), "before": before, "after": layout(dst[0].weight)}
    plain = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).to("xla")
    state = plain.state_dict()
    dist_cp.load(state, storage_reader=dist_cp.FileSystemReader(tmp + "/a"), planner=xc.SPMDLoadPlanner())
    out["into_unsplit"] = diff(cpu_state(plain), want)
    cpu = _sharded_cpu_state_dict(src.state_dict())
    out["cpu_shards"] = isinstance(cpu["0.weight"], _CpuShards) and cpu["0.bias"].device.type == "cpu"
    writer = dist_cp.FileSystemWriter(tmp + "/b", per_thread_copy_ahead=0)
    dist_cp.save(cpu, storage_writer=writer, planner=xc.SPMDSavePlanner())
    dst = model((n, 1), (0, None))
    state = dst.state_dict()
    compiles = lazyxla.metrics.counters().get("compiles", 0)
    dist_cp.load(state, storage_reader=dist_cp.FileSystemReader(tmp + "/b"), planner=xc.SPMDLoadPlanner())
    out["from_cpu_shards"] = diff(cpu_state(dst), want)
    out["load_compiles"] = lazyxla.metrics.counters().get("compiles", 0) - compiles

# a 63-row weight split 4 ways, as torch_xla's test_padded_tensor: parts of 16 rows, the last one padded; saved and
# loaded into the transposed layout (127 columns split 4 ways)
with tempfile.TemporaryDirectory() as tmp:
    a, b = torch.nn.Linear(127, 63).to("xla"), torch.nn.Linear(127, 63).to("xla")
    row = xs.Mesh(np.arange(n), (n,))
    xs.mark_sharding(a.weight, row, (0, None))
    xs.mark_sharding(b.weight, row, (None, 0))
    parts = xs.wrap_if_sharded(a.weight).local_shards
    out["padded_parts"] = [[list(s.data.shape), list(s.unpadded_data.shape), s.indices[0].stop] for s in parts]
    out["padding"] = float(parts[-1].data[15:].abs().sum())
    out["unpadded_match"] = all(torch.equal(s.unpadded_data, a.weight.cpu()[tuple(s.indices)]) for s in parts)
    want = cpu_state(a)
    writer = dist_cp.FileSystemWriter(tmp, per_thread_copy_ahead=0)
    dist_cp.save(a.state_dict(), storage_writer=writer, planner=xc.SPMDSavePlanner())
    state = b.state_dict()
    dist_cp.load(state, storage_reader=dist_cp.FileSystemReader(tmp), planner=xc.SPMDLoadPlanner())
    out["padded_round_trip"] = diff(cpu_state(b), want)
    out["padded_layout"] = layout(b.weight)

# CheckpointManager: interval, max_to_keep, async saves, whole folders only, JSON records
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], world_size=1, rank=0)
with tempfile.TemporaryDirectory() as tmp:
    m = model((2, n // 2), (0, 1))
    want = cpu_state(m)
    mgr = xc.CheckpointManager(tmp, save_interval=10, max_to_keep=2, chkpt_on_preemption=False)
    out["saved"] = [mgr.save(s, m.state_dict()) for s in (0, 5, 10)]
    out["async"] = mgr.save_async(20, m.state_dict())
    mgr.join()
    out["steps"] = mgr.all_steps()
    out["folder"] = sorted(os.listdir(tmp))
    with open(os.path.join(tmp, "20", ".manager_metadata"), "rb") as f:
        out["record"] = sorted(json.loads(f.read()))
    os.makedirs(os.path.join(tmp, "99"))  # a folder without a record: ignored
    again = xc.CheckpointManager(tmp, save_interval=10, max_to_keep=2, chkpt_on_preemption=False)
    out["steps_again"] = again.all_steps()
    dst = model((n, 1), (0, None))
    state = dst.state_dict()
    again.restore(20, state)
    out["restored"] = diff(cpu_state(dst), want)
    opt = torch.optim.AdamW(dst.parameters())
    xc.prime_optimizer(opt)
    out["primed"] = sorted(opt.state[dst[0].weight])
dist.destroy_process_group()

# DTensor: distribute_tensor gives an XLAShardedTensor with placements; ops give auto-wrapped tensors
mesh = DeviceMesh("xla", torch.arange(n).reshape(2, n // 2), mesh_dim_names=("dp", "tp"))
value = torch.randn(8, 4)
dt = distribute_tensor(value, mesh, [Shard(0), Replicate()])
out["dtensor"] = {
    "type": type(dt).__name__,
    "placements": [repr(p) for p in dt.placements],
    "cached": dt._spec is dt._spec,
    "value": torch.equal(dt.global_tensor.cpu(), value),
    "layout": layout(dt.global_tensor),
    "sum": float((dt + dt).global_tensor.sum().cpu()),
}
try:
    (dt + dt)._spec
    out["auto_wrapped"] = "no error"
except ValueError as e:
    out["auto_wrapped"] = "mesh_shape must be specified" in str(e)
st = wrap_as_sharded_tensor(dt, mesh_shape=(n,), partition_spec=(None, 0))
out["rewrapped"] = [repr(p) for p in st.placements]
xla_mesh = convert_to_xla_mesh(mesh)
out["mesh"] = [list(xla_mesh.mesh_shape), list(xla_mesh.axis_names), xla_mesh.device_ids.tolist()]

# the einsum linear equals nn.Linear (CPU eager), values and gradients
lin = torch.nn.Linear(6, 3)
ref = torch.nn.Sequential(lin)
inp = torch.randn(2, 5, 6)
ref_out = ref(inp)
ref_out.square().sum().backward()
dev = apply_xla_patch_to_nn_linear(torch.nn.Sequential(torch.nn.Linear(6, 3)))
dev.load_state_dict(ref.state_dict())
dev = dev.to("xla")
got = dev(inp.to("xla"))
got.square().sum().backward()
out["linear"] = {
    "type": type(dev[0]).__name__,
    "out": float((got.cpu() - ref_out).abs().max()),
    "grad": float((dev[0].weight.grad.cpu() - lin.weight.grad).abs().max()),
    "bias_grad": float((dev[0].bias.grad.cpu() - lin.bias.grad).abs().max()),
}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dcp")
    script = folder / "dcp.py"
    script.write_text(SCRIPT)
    port = str(29700 + (hash(str(folder)) % 200))
    proc = run_python(["-m", "lazyxla.run", str(script), port], folder, timeout=240, CPU_NUM_DEVICES="4")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_local_shards_are_the_slices_and_load_back_in_place(measured):
    assert measured["devices"] == 4
    assert measured["shard_type"] == "TILED" and measured["shards_match"]
    assert measured["shard_indices"] == [[[0, 4], [0, 2]], [[0, 4], [2, 4]], [[4, 8], [0, 2]], [[4, 8], [2, 4]]]
    assert measured["loaded_negated"] and measured["layout_kept"] == ["axis0", "axis1"]
    assert measured["replicated_wrapped"] == "Tensor"  # a replicated tensor is not wrapped


@pytest.mark.parametrize("case", ["transposed", "columns"])
def test_checkpoint_loads_into_another_layout(measured, case):
    got = measured[case]
    assert got["diff"] == 0.0
    assert got["after"] == got["before"] and got["after"] is not None  # the target keeps its own layout


def test_checkpoint_loads_unsplit_and_from_host_shards(measured):
    assert measured["into_unsplit"] == 0.0
    assert measured["cpu_shards"] and measured["from_cpu_shards"] == 0.0
    assert measured["load_compiles"] == 0  # loading puts buffers on the devices: nothing to compile


def test_checkpoint_of_a_weight_split_unevenly_as_torch_xla_pads_it(measured):
    assert measured["padded_parts"] == [[[16, 127], [16, 127], 16 * (k + 1)] for k in range(3)] + [
        [[16, 127], [15, 127], 63]
    ]
    assert measured["padding"] == 0.0 and measured["unpadded_match"]
    assert measured["padded_round_trip"] == 0.0 and measured["padded_layout"] == [None, "axis0"]


def test_checkpoint_manager(measured):
    assert measured["saved"] == [True, False, True] and measured["async"] is True
    assert measured["steps"] == [10, 20]  # max_to_keep=2 dropped step 0
    assert measured["folder"] == ["10", "20"]  # no partial folders left behind
    assert measured["record"] == ["step", "ts"]  # a JSON record, not a pickle
    assert measured["steps_again"] == [10, 20]  # a folder without a record is ignored
    assert measured["restored"] == 0.0
    assert measured["primed"] == ["exp_avg", "exp_avg_sq", "step"]


def test_dtensor_view_of_sharded_tensors(measured):
    dt = measured["dtensor"]
    assert dt["type"] == "XLAShardedTensor" and dt["value"] and dt["cached"]
    assert dt["placements"] == ["Shard(dim=0)", "Replicate()"]
    assert dt["layout"] == ["dp", None]
    assert measured["auto_wrapped"] is True
    assert measured["rewrapped"] == ["Shard(dim=1)"]
    assert measured["mesh"] == [[2, 2], ["dp", "tp"], [0, 1, 2, 3]]


def test_einsum_linear_equals_nn_linear(measured):
    lin = measured["linear"]
    assert lin["type"] == "EinsumLinear"
    assert lin["out"] < 1e-5 and lin["grad"] < 1e-4 and lin["bias_grad"] < 1e-4
