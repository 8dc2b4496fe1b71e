"""``torch_xla.distributed.spmd.debugging``: the HLO sharding text of annotated tensors over 4 fake CPU devices
(``python -m lazyxla.run``, one subprocess) against the texts XLA writes for those layouts, and the tables
``visualize_sharding`` prints (in this process) against the expected drawings.
"""

from __future__ import annotations

import pytest

import lazyxla.compat as compat
from tests.util import run_torch_xla_script

SCRIPT = r"""
import json
import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.distributed.spmd.debugging import construct_v1_sharding_str

xr.use_spmd()
dev = torch_xla.device()
out = {}

def text(shape, mesh, spec):
    t = torch.zeros(shape).to(dev)
    xs.mark_sharding(t, mesh, spec)
    return construct_v1_sharding_str(t)

row = xs.Mesh(np.arange(4), (1, 4))
square = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
cube = xs.Mesh(np.arange(4), (1, 2, 2))
out["tiled"] = text((4, 8), row, (0, 1))
out["tiled_columns"] = text((8, 4), square, ("y", "x"))
out["replicated"] = text((4, 4), row, (None, None))
out["partial"] = text((4, 4), square, ("x", None))
out["partial_second"] = text((4, 4), square, (None, "x"))
out["tuple"] = text((16,), square, (("x", "y"),))
out["tuple_partial"] = text((16, 16), cube, ((0, 1), None))
out["transposed"] = text((16, 16), cube, (None, (2, 1)))
out["uneven"] = text((1, 128), row, (1, 0))                   # 1 row over 4 devices: padded, as torch_xla does
pending = torch.zeros(4, 8).to(dev) * 2                       # a computed value: a constraint in the graph
xs.mark_sharding(pending, square, ("x", "y"))
out["pending"] = torch_xla._XLAC._get_xla_sharding_spec(pending)
out["plain"] = torch_xla._XLAC._get_xla_sharding_spec(torch.zeros(2).to(dev))
print("RESULT " + json.dumps(out))
"""


def test_sharding_texts_are_xla_v1_texts_over_four_devices(tmp_path):
    out = run_torch_xla_script(SCRIPT, tmp_path, timeout=120, CPU_NUM_DEVICES="4")
    assert out == {
        "tiled": "{devices=[1,4]0,1,2,3}",
        # dimension 0 over 'y', dimension 1 over 'x': the tile grid walks the mesh transposed
        "tiled_columns": "{devices=[2,2]0,2,1,3}",
        "replicated": "{replicated}",
        # the mesh axis no dimension uses becomes a last tile dimension of replicas
        "partial": "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}",
        "partial_second": "{devices=[1,2,2]0,1,2,3 last_tile_dim_replicate}",
        "tuple": "{devices=[4]0,1,2,3}",
        "tuple_partial": "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}",
        "transposed": "{devices=[1,4]0,2,1,3}",
        "uneven": "{devices=[4,1]0,1,2,3}",
        "pending": "{devices=[2,2]0,1,2,3}",
        "plain": "",
    }


@pytest.fixture
def debugging():
    assert compat.install()
    import torch_xla.distributed.spmd.debugging as d

    yield d
    compat.uninstall()


def _drawn(debugging, capsys, sharding: str) -> list[str]:
    debugging.visualize_sharding(sharding, use_color=False, max_width=40)
    return capsys.readouterr().out.splitlines()


def test_visualize_sharding_draws_tiles_and_replicas(debugging, capsys, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    lines = _drawn(debugging, capsys, "{devices=[2,2]0,2,1,3}")
    assert lines == [
        "Visualizing {devices=[2,2]0,2,1,3} (showing up to the first two dimensions)",
        "┌───────┬───────┐",
        "│       │       │",
        "│ CPU 0 │ CPU 2 │",
        "│       │       │",
        "├───────┼───────┤",
        "│       │       │",
        "│ CPU 1 │ CPU 3 │",
        "│       │       │",
        "└───────┴───────┘",
    ]
    lines = _drawn(debugging, capsys, "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}")
    assert lines[1:] == [
        "┌────────────┐",
        "│            │",
        "│ CPU [0, 2] │",
        "│            │",
        "├────────────┤",
        "│            │",
        "│ CPU [1, 3] │",
        "│            │",
        "└────────────┘",
    ]
    lines = _drawn(debugging, capsys, "{replicated}")  # every device of the run (one here)
    assert lines[1:4] == ["┌─────────┐", "│         │", "│ CPU [0] │"]
    monkeypatch.setenv("PJRT_DEVICE", "TPU")  # the label is the PJRT device kind, as in torch_xla
    assert "│ TPU 0 │ TPU 1 │" in _drawn(debugging, capsys, "{devices=[1,2]0,1}")
    for bad in ("{devices=[2,2]0,1,2}", "{maximal device=0}"):
        with pytest.raises(ValueError, match="not organized as expected"):
            debugging.visualize_sharding(bad)
