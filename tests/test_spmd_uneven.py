"""SPMD layouts whose mesh axes do not divide a dimension, split as XLA and torch_xla split them: parts of
``ceil(size / parts)``, the last ones short. Fresh processes with 8 fake CPU devices: one process with 8, and two
with 4 each forming one global mesh (their parts are reloaded across the processes).
"""

from __future__ import annotations

import pytest

import lazyxla
from tests import spmd_uneven_workers as W


@pytest.mark.parametrize("nprocs,cpu_devices", [pytest.param(1, 8, id="1x8"), pytest.param(2, 4, id="2x4")])
def test_a_dimension_split_unevenly_is_padded_as_xla_pads_it(nprocs, cpu_devices):
    runs = lazyxla.spawn(W.uneven_layouts, nprocs=nprocs, cpu_devices=cpu_devices, timeout_s=200)
    local = 8 // nprocs
    for rank, out in enumerate(runs):
        assert out["spec"] == ("x", None) and out["annotated"]
        assert out["buffer_rows"] == [W.ROWS] * local  # the even layout the buffer keeps: rows whole
        # 63 rows in parts of 8: device k holds rows 8k .. 8k + 8, the last one 56 .. 63, padded to 8
        want = [(8 * k, min(8 * k + 8, W.ROWS)) for k in range(8)]
        assert out["rows"] == want[rank * local : (rank + 1) * local]
        assert out["padded"] == [[8, W.COLS]] * local and out["parts_equal"]
        assert out["constraint"] and out["sum_equal"]
        assert out["again_equal"] and out["again_compiles"] == 0
        assert out["pending_spec"] == (("data", "model"), None) and out["pending_equal"]
        assert out["loaded_equal"] and out["loaded_spec"] == ("x", None)
        one = [(0, 1)] + [(1, 1)] * 7
        assert out["one_rows"] == one[rank * local : (rank + 1) * local] and out["one_sum"] == 4.0 * W.COLS
        assert out["cleared"] is None
