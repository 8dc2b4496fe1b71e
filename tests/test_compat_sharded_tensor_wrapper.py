"""What ``xs.mark_sharding`` returns (torch_xla: the annotated tensor wrapped as an ``XLAShardedTensor``), that
wrapper's ``redistribute``/``sharding_spec``, and the replicated annotation ``MpDeviceLoader`` gives batch
tensors no sharding spec covers; gradients through the wrapper (autograd records on it, as in torch_xla). Each test
is one ``python -m lazyxla.run`` subprocess over 4 fake CPU devices; the values are compared with the same
computation in CPU eager, the sharding texts with the ones XLA writes for those layouts.
"""

from __future__ import annotations

from tests.util import run_torch_xla_script

# what both scripts start with: torch_xla in SPMD mode, the results collected in `out`
PROLOGUE = r"""
import json
import numpy as np
import torch
import lazyxla
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

xr.use_spmd()
dev = torch_xla.device()
spec_of = torch_xla._XLAC._get_xla_sharding_spec
out = {}
torch.manual_seed(0)
"""

SCRIPT = (
    PROLOGUE
    + r"""
import torch_xla.distributed.parallel_loader as pl
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

x_cpu, w_cpu = torch.randn(8, 16), torch.randn(16, 4)
row = xs.Mesh(np.arange(4), (4,))
square = xs.Mesh(np.arange(4), (2, 2))

# mark_sharding annotates in place and returns the tensor wrapped, recording the mesh shape and the spec
x = x_cpu.to(dev)
st = xs.mark_sharding(x, row, (0, None))
out["wrapper"] = [type(st).__name__, st.global_tensor is x, st.mesh_shape, list(st.partition_spec)]
out["placements"] = [repr(p) for p in st.placements]
out["texts"] = [st.sharding_spec, spec_of(x)]
again = xs.mark_sharding(st, square, (None, 1))                  # a wrapper is updated, not wrapped again
out["again"] = [again is st, list(st.partition_spec), [repr(p) for p in st.placements], st.sharding_spec]

# the wrapper used as a plain tensor: ops run on the wrapped tensor, in one program
w = w_cpu.to(dev)
before = lazyxla.metrics.counters()["compiles"]
y = torch.relu(st @ w).sum(dim=1)
out["plain_use"] = [type(y).__name__, (y.global_tensor.cpu() - torch.relu(x_cpu @ w_cpu).sum(dim=1)).abs().max().item()]
out["plain_compiles"] = lazyxla.metrics.counters()["compiles"] - before
# a wrapper whose layout leaves it whole on every device (split over a mesh axis of one device): PyTorch computes
# the op on the plain tensor and makes the result a wrapper (as_subclass), which wraps that result
whole = xs.mark_sharding(x_cpu.to(dev), xs.Mesh(np.arange(4), (1, 4)), (0, None))
z = whole @ w
out["whole_plain"] = [type(z).__name__, type(z.global_tensor).__name__, (z.cpu() - x_cpu @ w_cpu).abs().max().item()]
# load_local_shards_ raises torch_xla's RuntimeError: a part missing, a part of the wrong shape, a replicated tensor
errors = []
split = xs.mark_sharding(torch.arange(8.0).to(dev), row, (0,))
for shards in (split.local_shards[:-1], [xs.XLAShard(torch.zeros(3), s.indices, s.shard_device, s.replica_id)
                                         for s in split.local_shards]):
    try:
        split.load_local_shards_(shards)
    except RuntimeError as e:
        errors.append(type(e).__name__)
try:
    whole.load_local_shards_(whole.local_shards)
except RuntimeError as e:
    errors.append("replicated" if "Replicated" in str(e) else str(e))
out["load_errors"] = errors

# redistribute: over an xs.Mesh (as torch_xla's tests call it) and over a DTensor DeviceMesh
t = torch.arange(128.0).reshape(8, 16).to(dev)
st = xs.mark_sharding(t, square, (0, None))
moved = st.redistribute(square, [Replicate(), Shard(1)])
out["in_place"] = [moved.global_tensor is t, list(moved.partition_spec), spec_of(t)]
copy = st.redistribute(square, [Replicate(), Shard(0)], async_op=True)
torch_xla.sync()
out["async"] = [copy.global_tensor is t, list(copy.partition_spec), spec_of(copy.global_tensor),
                torch.equal(copy.global_tensor.cpu(), torch.arange(128.0).reshape(8, 16))]
rep = st.redistribute(DeviceMesh("xla", torch.arange(4)), [Replicate()])
out["device_mesh"] = [list(rep.partition_spec), spec_of(rep.global_tensor)]
errors = []
for bad in ([Shard(2), Replicate()], [Shard(0)], [Partial(), Replicate()]):
    try:
        st.redistribute(square, bad)
    except Exception as e:
        errors.append(type(e).__name__)
out["errors"] = errors

# mark_sharding_with_gradients gives a plain tensor (torch_xla's custom op result), gradients as in eager
a_cpu = torch.randn(8, 4, requires_grad=True)
a = a_cpu.detach().to(dev).requires_grad_()
h = xs.mark_sharding_with_gradients(a * 3, row, (0, None))
(h * h).sum().backward()
(a_cpu * 3).pow(2).sum().backward()
out["with_gradients"] = [type(h).__name__, (a.grad.cpu() - a_cpu.grad).abs().max().item()]

# MpDeviceLoader: a tensor no spec covers arrives annotated as replicated; .to(dev) leaves none
batches = [{"x": torch.randn(8, 16), "y": torch.arange(8)} for _ in range(2)]
loaded = list(pl.MpDeviceLoader(batches, dev, input_sharding=None))
out["loader"] = [[spec_of(b["x"]), spec_of(b["y"])] for b in loaded]
out["loader_values"] = all(torch.equal(b["x"].cpu(), c["x"]) and torch.equal(b["y"].cpu(), c["y"])
                           for b, c in zip(loaded, batches))
out["plain_to"] = spec_of(torch.zeros(2).to(dev))
print("RESULT " + json.dumps(out))
"""
)


def test_mark_sharding_returns_the_wrapper_and_loader_batches_are_replicated(tmp_path):
    out = run_torch_xla_script(SCRIPT, tmp_path, timeout=150, CPU_NUM_DEVICES="4")

    assert out["wrapper"] == ["XLAShardedTensor", True, [4], [0, None]]
    assert out["placements"] == ["Shard(dim=0)"]
    assert out["texts"] == ["{devices=[4,1]0,1,2,3}"] * 2
    assert out["again"] == [
        True,
        [None, 1],
        ["Replicate()", "Shard(dim=1)"],
        "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}",
    ]

    assert out["plain_use"][0] == "XLAShardedTensor" and out["plain_use"][1] <= 1e-5
    assert out["plain_compiles"] == 1
    assert out["whole_plain"][:2] == ["XLAShardedTensor", "Tensor"] and out["whole_plain"][2] <= 1e-5
    assert out["load_errors"] == ["RuntimeError", "RuntimeError", "replicated"]

    assert out["in_place"] == [True, [None, 1], "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"]
    assert out["async"] == [False, [1, None], "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}", True]
    assert out["device_mesh"] == [[None, None], "{replicated}"]
    assert out["errors"] == ["IndexError", "ValueError", "NotImplementedError"]

    assert out["with_gradients"][0] == "Tensor" and out["with_gradients"][1] <= 1e-5

    assert out["loader"] == [["{replicated}", "{replicated}"]] * 2
    assert out["loader_values"] is True
    assert out["plain_to"] == ""


GRAD_SCRIPT = (
    PROLOGUE
    + r"""
from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor
from torch_xla.distributed.spmd import XLAShardedTensor

x_cpu, w1_cpu, w2_cpu = torch.randn(2, 6, 8), torch.randn(16, 8), torch.randn(4, 16)
mesh = xs.Mesh(np.arange(4), (4,))


def loss_of(x, w1, w2):
    return (torch.relu(x @ w1.T) @ w2.T).pow(2).mean()


def train(x, w1, w2, after_step):
    # two micro-batches per step (the second backward adds to the first's .grad); w1 by hand, in place, and w2 by
    # SGD with momentum (on the device, its _foreach_ ops write to lists of wrappers)
    opt = torch.optim.SGD([w2], lr=0.1, momentum=0.9, foreach=True)
    for _ in range(3):
        for micro in x:
            loss_of(micro, w1, w2).backward()
        with torch.no_grad():
            w1 -= 0.1 * w1.grad
        opt.step()
        w1.grad = w2.grad = None
        after_step()


# wrappers that require grad: autograd records on them, each op computes on the wrapped (sharded) tensors
w1, w2 = XLAShardedTensor(w1_cpu.to(dev), requires_grad=True), XLAShardedTensor(w2_cpu.to(dev), requires_grad=True)
out["annotated"] = [xs.mark_sharding(w1, mesh, (0, None)) is w1, xs.mark_sharding(w2, mesh, (None, 0)) is w2]
x = XLAShardedTensor(x_cpu.to(dev))
loss = loss_of(x[0], w1, w2)
out["graph"] = [type(loss).__name__, loss.requires_grad]
out["graph"] += [loss.global_tensor.requires_grad, w1.global_tensor.requires_grad]
loss.backward()
grad_cpu = torch.autograd.grad(loss_of(x_cpu[0], w1_cpu.requires_grad_(), w2_cpu), w1_cpu)[0]
out["grad"] = [type(w1.grad).__name__, (w1.grad.global_tensor.cpu() - grad_cpu).abs().max().item()]
w1.grad = w2.grad = None
torch_xla.sync()
compiles = []
train(x, w1, w2, lambda: (torch_xla.sync(), compiles.append(lazyxla.metrics.counters()["compiles"])))
w1_cpu, w2_cpu = w1_cpu.detach().requires_grad_(), w2_cpu.detach().requires_grad_()
train(x_cpu, w1_cpu, w2_cpu, lambda: None)
out["trained"] = [(w.global_tensor.cpu() - c).abs().max().item() for w, c in ((w1, w1_cpu), (w2, w2_cpu))]
out["step_compiles"] = compiles[2] - compiles[1]
out["layouts"] = [w1.sharding_spec, w2.sharding_spec, w1.requires_grad, w1.grad]

# distribute_tensor of a parameter gives a wrapper that does not require grad (as torch_xla's): results carry
# no graph, so their host copy reads as numpy
lin = torch.nn.Linear(8, 16, bias=False)
lin_dev = torch.nn.Linear(8, 16, bias=False).to(dev)
lin_dev.load_state_dict(lin.state_dict())
wd = distribute_tensor(lin_dev.weight, DeviceMesh("xla", torch.arange(4)), [Shard(0)])
y = torch.relu(XLAShardedTensor(x_cpu[0].to(dev)) @ wd.T).cpu()
expected = torch.relu(x_cpu[0] @ lin.weight.T).detach().numpy()
out["numpy"] = [wd.requires_grad, y.requires_grad, type(y).__name__]
out["numpy"].append(float(np.abs(y.global_tensor.numpy() - expected).max()))

# writes to a wrapper and through its views reach the wrapped tensor, as on the CPU
b, b_cpu = XLAShardedTensor(torch.zeros(4, 6).to(dev)), torch.zeros(4, 6)
for t in (b, b_cpu):
    t.add_(1)
    t.view(2, 12)[0].mul_(3)
    t.t()[1].sub_(2)
out["writes"] = [type(b).__name__, torch.equal(b.global_tensor.cpu(), b_cpu)]

# a wrapper with a plain device tensor that requires grad: its gradient as in eager
p_cpu = torch.randn(6, 3, requires_grad=True)
p = p_cpu.detach().to(dev).requires_grad_()
(b @ p).sin().sum().backward()
(b_cpu @ p_cpu).sin().sum().backward()
out["plain_grad"] = [type(p.grad).__name__, (p.grad.cpu() - p_cpu.grad).abs().max().item()]
print("RESULT " + json.dumps(out))
"""
)


def test_gradients_flow_through_the_wrapper(tmp_path):
    out = run_torch_xla_script(GRAD_SCRIPT, tmp_path, timeout=150, CPU_NUM_DEVICES="4")

    # the graph is recorded on the wrappers; the wrapped tensors carry none
    assert out["graph"] == ["XLAShardedTensor", True, False, False]
    assert out["grad"][0] == "XLAShardedTensor" and out["grad"][1] <= 1e-5
    assert max(out["trained"]) <= 1e-5
    assert out["step_compiles"] == 0
    assert out["annotated"] == [True, True]
    assert out["layouts"] == ["{devices=[4,1]0,1,2,3}", "{devices=[1,4]0,1,2,3}", True, None]

    assert out["numpy"][:3] == [False, False, "XLAShardedTensor"] and out["numpy"][3] <= 1e-5
    assert out["writes"] == ["XLAShardedTensor", True]
    assert out["plain_grad"][0] == "Tensor" and out["plain_grad"][1] <= 1e-5
