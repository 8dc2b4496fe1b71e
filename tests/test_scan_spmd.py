"""torch_xla's ``scan_layers`` in SPMD mode under ``python -m lazyxla.run`` (4 fake CPU devices, one subprocess): the
layers run as one loop (the device is named ``'xla'`` there), and the gradients of the scanned weights take the
weights' 2-D layout, as torch_xla's scan constrains them (``test/scan/test_scan_spmd.py``'s 2-D case), with values
equal to CPU eager.
"""

from __future__ import annotations

from tests.util import run_torch_xla_script

SCRIPT = r"""
import json
import numpy as np
import torch
import torch.nn as nn
import torch_xla
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr
from torch_xla.distributed.spmd import Mesh, mark_sharding, mark_sharding_with_gradients
from torch_xla.experimental.scan_layers import scan_layers

xr.use_spmd()
mesh = Mesh(np.arange(4), (2, 2), ("fsdp", "tensor"))
SPEC = ("fsdp", None, "tensor")


def mark(h):  # the activations' layout (and their gradients'), on the device; the CPU reference has none
    return mark_sharding_with_gradients(h, mesh, SPEC) if h.device.type == "xla" else h


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32, bias=False)
        self.down = nn.Linear(32, 16, bias=False)

    def forward(self, h):
        h = mark(torch.sin(self.up(mark(h))))
        return mark(self.down(h))


torch.manual_seed(0)
blocks = nn.Sequential(*[Block() for _ in range(3)])
x = torch.randn(3, 5, 16)  # 3 rows over the 2 "fsdp" devices: padded, as in torch_xla
ref = x.clone().requires_grad_()
for b in blocks:
    ref = b(ref)
ref.sum().backward()
want = [b.up.weight.grad.clone() for b in blocks]

dev_blocks = nn.Sequential(*[Block() for _ in range(3)])
dev_blocks.load_state_dict(blocks.state_dict())
dev_blocks = dev_blocks.to("xla")
for b in dev_blocks:
    mark_sharding(b.up.weight, mesh, ("tensor", "fsdp"))
    mark_sharding(b.down.weight, mesh, ("fsdp", "tensor"))
out = scan_layers(dev_blocks, mark(x.to("xla")))
out.sum().backward()
torch_xla.sync()
grads = [b.up.weight.grad for b in dev_blocks]
print("RESULT " + json.dumps({
    "loops": met.counter_value("scan_calls") or 0,
    "specs": [torch_xla._XLAC._get_xla_sharding_spec(g) for g in grads],
    "diff": max(float((g.cpu() - w).abs().max()) for g, w in zip(grads, want)),
}))
"""


def test_scanned_weights_gradients_keep_the_weights_2d_layout(tmp_path):
    out = run_torch_xla_script(SCRIPT, tmp_path, timeout=180, CPU_NUM_DEVICES="4")
    assert out["loops"] == 2  # the forward loop and the backward loop (not 3 unrolled layers)
    # the weights' ("tensor", "fsdp") tiling; XLA's propagation alone gives "{devices=[2,1,2]0,2,1,3
    # last_tile_dim_replicate}" (split over "tensor" only)
    assert out["specs"] == ["{devices=[2,2]0,2,1,3}"] * 3
    assert out["diff"] < 1e-5
