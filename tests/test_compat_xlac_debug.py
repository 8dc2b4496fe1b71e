"""torch_xla's debugging bindings on lazyxla (``torch_xla._XLAC._get_xla_tensors_hlo``, ``_get_xla_tensors_text``,
``_get_graph_hash``, ``_get_xla_tensor_debug_info``, ``_get_xla_sharding_spec`` of a program's output): what they
say of a small pending computation, that asking runs nothing (lazyxla's counters), and that the values computed
afterwards still match the CPU's. Each script runs under ``python -m lazyxla.run`` in its own process: one on one
device, one in SPMD mode over 4 fake CPU devices.
"""

from __future__ import annotations

from tests.util import run_torch_xla_script

ONE_DEVICE = r"""
import json
import torch
import torch_xla
import lazyxla

X = torch_xla._XLAC
dev = torch_xla.device()
ca, cb = torch.randn(4, 3), torch.randn(3, 2)
a, b = ca.to(dev), cb.to(dev)
lazyxla.sync()
counters = dict(lazyxla.metrics.counters())
c = a @ b + 1
out = {
    "hlo": X._get_xla_tensors_hlo([c]),
    "hlo_computed": X._get_xla_tensors_hlo([a]),
    "text": X._get_xla_tensors_text([c]),
    "info_pending": X._get_xla_tensor_debug_info(c),
    "info_computed": X._get_xla_tensor_debug_info(a),
    "info_cpu": X._get_xla_tensor_debug_info(ca),
}
h = X._get_graph_hash([c])
out["hash_is_bytes"] = isinstance(h, bytes)
out["hash_same_graph_other_values"] = h == X._get_graph_hash([torch.randn(4, 3).to(dev) @ b + 1])
out["hash_twice"] = h == X._get_graph_hash([c])
out["hash_other_shape"] = h == X._get_graph_hash([torch.randn(4, 5).to(dev) @ torch.randn(5, 2).to(dev) + 1])
out["hash_other_op"] = h == X._get_graph_hash([a @ b - 1])
after = dict(lazyxla.metrics.counters())
out["ran"] = {k: after.get(k, 0) - counters.get(k, 0) for k in ("executions", "syncs", "compiles")}
out["value_ok"] = torch.allclose(c.cpu(), ca @ cb + 1, atol=1e-5)
print("RESULT " + json.dumps(out))
"""


def test_debug_bindings_describe_the_pending_program_and_run_nothing(tmp_path):
    out = run_torch_xla_script(ONE_DEVICE, tmp_path, timeout=180)
    assert out["ran"] == {"executions": 0, "syncs": 0, "compiles": 0}
    assert out["value_ok"]
    hlo = out["hlo"]
    assert hlo.startswith("HloModule ")
    assert " dot(" in hlo and " add(" in hlo
    assert "f32[4,3]{1,0} parameter(" in hlo and "f32[3,2]{1,0} parameter(" in hlo
    assert "->f32[4,2]{1,0}" in hlo  # the program's result: c
    # a computed tensor: a parameter the program returns, nothing else
    assert "f32[4,3]{1,0} parameter(0)" in out["hlo_computed"]
    assert " dot(" not in out["hlo_computed"] and "->f32[4,3]{1,0}" in out["hlo_computed"]
    assert "aten.mm" in out["text"] and "aten.add" in out["text"]
    assert out["hash_is_bytes"] and out["hash_twice"] and out["hash_same_graph_other_values"]
    assert not out["hash_other_shape"] and not out["hash_other_op"]
    pending = out["info_pending"].splitlines()
    assert pending[0] == "XLATensor {" and pending[-1] == "}"
    assert "Device: CPU:0" in pending and "XLA Shape: f32[4,2]" in pending and "ShardingSpec: None" in pending
    assert "IR: aten::add.Tensor, xla_shape=f32[4,2]" in pending
    assert "XLAData: None" in pending and "Tensor on host: None" in pending
    computed = out["info_computed"]
    assert "IR: xla::device_data, xla_shape=f32[4,3], device=CPU:0" in computed
    assert "XLAData: \n  Data Device: CPU:0\n  Data Shape: f32[4,3]\n  Data Handle: " in computed
    assert out["info_cpu"] == "Not a XLATensor\n"


SPMD = r"""
import json
import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
import lazyxla

X = torch_xla._XLAC
xr.use_spmd()
dev = torch_xla.device()
mesh = xs.Mesh(np.arange(4), (2, 2))
ct = torch.randn(4, 8)
t = ct.to(dev)
xs.mark_sharding(t, mesh, (0, 1))
plain = torch.randn(8, 8).to(dev)
out = {"plain_spec": X._get_xla_sharding_spec(plain)}
u = t * 2
out["hlo"] = X._get_xla_tensors_hlo([u])
out["info_sharded"] = X._get_xla_tensor_debug_info(t)
out["hash_sharded"] = X._get_graph_hash([t * 2]) == X._get_graph_hash([torch.randn(4, 8).to(dev) * 2])
r = plain @ plain
lazyxla.sync()
out["output_spec"] = X._get_xla_sharding_spec(r)
out["output_info"] = X._get_xla_tensor_debug_info(r)
out["value_ok"] = torch.allclose(u.cpu(), ct * 2)
print("RESULT " + json.dumps(out))
"""


def test_spmd_texts_carry_layouts_and_outputs_read_replicated(tmp_path):
    out = run_torch_xla_script(SPMD, tmp_path, timeout=180, CPU_NUM_DEVICES="4")
    assert out["value_ok"]
    # the annotated input is a parameter in its layout (XLA's text for a 2 x 2 tiling over devices 0..3)
    assert "f32[4,8]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}" in out["hlo"] or (
        "f32[4,8]{1,0} parameter(0), sharding={devices=[2,2]0,1,2,3}" in out["hlo"]
    ), out["hlo"]
    info = out["info_sharded"]
    assert "Device: SPMD:0" in info and "ShardingSpec: {devices=[2,2]0,1,2,3}" in info
    assert "XLAShardedData: \n  Data Device: SPMD:0\n  Data Shape: f32[4,8]\n" in info
    assert "  OpSharding: {devices=[2,2]0,1,2,3}\n  NumShards: 4\n" in info
    # the sharded input's layout is part of the program: a replicated input of the same shape is another one
    assert not out["hash_sharded"]
    # torch_xla: a copy from the host has no sharding spec; a program's output has the layout XLA chose
    assert out["plain_spec"] == ""
    assert out["output_spec"] == "{replicated}"
    assert "ShardingSpec: {replicated}" in out["output_info"] and "OpSharding: {replicated}" in out["output_info"]
