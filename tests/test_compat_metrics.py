"""What moves between the host and the devices, measured where it moves: every copy timed (``transfer_to_device``,
``transfer_from_device``), its bytes one sample of ``bytes_to_device`` / ``bytes_from_device``, every device buffer
made counted (``device_buffers``); and the same under torch_xla's names (``TransferToDeviceTime``, ``OutboundData``,
``InboundData``, ``CreateDataHandles``, ``CreateCompileHandles``), which torch_xla's ``metrics_compare_utils``
reads from ``met.metrics_report()``.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

import lazyxla
import lazyxla.compat as compat
from tests.util import run_torch_xla_script


@pytest.fixture
def xla():
    assert compat.install()
    import torch_xla

    yield torch_xla
    compat.uninstall()


def test_each_copy_is_timed_sized_and_its_buffers_counted(dev):
    host = torch.randn(3, 4)
    x = host.to(dev)  # one copy to the device: 48 bytes, one buffer
    sizes, counters = lazyxla.metrics.sizes(), lazyxla.metrics.counters()
    assert sizes["bytes_to_device"]["count"] == 1 and sizes["bytes_to_device"]["total_bytes"] == 48
    assert counters["device_buffers"] == 1 and lazyxla.metrics.timers()["transfer_to_device"]["count"] == 1
    y = (x * 2.5).cpu()  # the program takes its Python float as a packed input, which jax copies with the call
    torch.testing.assert_close(y, host * 2.5)
    sizes, counters = lazyxla.metrics.sizes(), lazyxla.metrics.counters()
    assert lazyxla.metrics.samples("bytes_to_device") == [48, 8]  # the tensor, then the float64 scalar
    assert lazyxla.metrics.samples("bytes_from_device") == [48]
    assert counters["device_buffers"] == 1 + 1 + 1  # the tensor, the scalar, the program's one result
    timers = lazyxla.metrics.timers()  # the scalar's copy is part of the call (one device): not timed apart
    assert timers["transfer_to_device"]["count"] == 1 and timers["transfer_from_device"]["count"] == 1
    assert timers["transfer"]["count"] == 2
    assert "bytes_to_device" in lazyxla.metrics.report()
    lazyxla.metrics.reset()
    assert lazyxla.metrics.sizes() == {} and lazyxla.metrics.samples("bytes_to_device") == []


def test_a_program_without_host_inputs_copies_nothing_to_the_device(dev):
    x = torch.ones(4, 4).to(dev)
    lazyxla.metrics.reset()
    (x @ x).sum().item()
    assert "bytes_to_device" not in lazyxla.metrics.sizes()  # no packed scalars, no RNG keys: no copy
    assert lazyxla.metrics.samples("bytes_from_device") == [4]
    assert lazyxla.metrics.counters()["device_buffers"] == 1


def test_copies_in_eager_mode_time_as_copies_not_as_eager_programs(dev):
    lazyxla.eager_mode(True)
    try:
        t = torch.rand(2, 3, device=dev)  # one program, whose RNG key goes with the call
        t.cpu()  # a copy from the device: timed under its own name in eager mode too
    finally:
        lazyxla.eager_mode(False)
    timers = lazyxla.metrics.timers()
    assert timers["transfer_from_device"]["count"] == 1 and "eager_transfer_from_device" not in timers
    assert "transfer_to_device" not in timers  # the key's copy is part of the call: counted, not timed apart
    assert timers["eager_execute"]["count"] == 1 and lazyxla.metrics.samples("bytes_to_device") == [8]
    assert ((t.cpu() >= 0) & (t.cpu() < 1)).all()


def test_torch_xla_runtime_metrics_name_the_real_events(xla, dev):
    import torch_xla.debug.metrics as met
    import torch_xla.debug.metrics_compare_utils as mcu

    met.clear_all()
    assert met.metrics_report() == ""
    value = torch.rand(3, 3, device=dev).cpu()  # a program (its RNG key goes with the call), its result copied out
    assert value.shape == (3, 3) and ((value >= 0) & (value < 1)).all()
    counters = lazyxla.metrics.counters()
    assert met.counter_value("CreateCompileHandles") == counters["compiles"] == 1
    assert met.counter_value("CreateDataHandles") == counters["device_buffers"] == 2  # the key, the result
    assert met.metric_data("OutboundData")[:2] == (1, 8)  # bytes, not nanoseconds
    assert met.metric_data("InboundData")[:2] == (1, 36)
    # the key's copy is part of the program call (not timed apart: a separate copy costs ~50 us per sync)
    assert met.metric_data("TransferToDeviceTime") is None and met.metric_data("TransferFromDeviceTime")[0] == 1
    report = met.metrics_report()
    assert "Metric: InboundData\n  TotalSamples: 1\n  Accumulator: 36.00B\n" in report
    names = {key.split("__")[0] for key in mcu.get_data_points_from_metrics_reports([report])}
    runtime = {"CompileTime", "ExecuteTime", "TransferFromDeviceTime"}
    assert runtime | {"CreateCompileHandles", "CreateDataHandles", "InboundData", "OutboundData"} <= names
    points = mcu.parse_metrics_report(report)
    assert points["CompileTime__TotalSamples"] == 1 and points["CompileTime__Percentile_99_sec"] > 0
    assert points["OutboundData__Accumulator_mb"] == pytest.approx(8e-6)
    torch.rand(3, 3, device=dev).cpu()  # the same program again: served from the cache, nothing compiled
    assert met.counter_value("CreateCompileHandles") == 1 and met.counter_value("CreateDataHandles") == 4
    met.clear_metrics()
    assert met.metric_data("OutboundData") is None and met.counter_value("CreateDataHandles") == 4


def test_sizes_in_torch_xla_notation(xla):
    from lazyxla.compat.torch_xla.debug.metrics import _bytes

    assert [_bytes(n) for n in (0, 36, 1024, 1536, 3 * 1024**3)] == ["0.00B", "36.00B", "1.00KB", "1.50KB", "3.00GB"]


SPMD_SCRIPT = textwrap.dedent(
    """
    import json
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    n = xr.global_runtime_device_count()
    host = torch.arange(32.0).reshape(4, 8)
    met.clear_all()
    x = host.to("xla")                 # replicated: a full copy on every device
    after_copy = list(met.metric_data("OutboundData")[:2]), met.counter_value("CreateDataHandles")
    xs.mark_sharding(x, xs.Mesh(np.arange(n), (1, n)), (0, 1))   # re-laid out on the devices: no copy
    after_shard = list(met.metric_data("OutboundData")[:2])
    same = bool((x.cpu() == host).all())
    inbound = list(met.metric_data("InboundData")[:2])
    print("RESULT " + json.dumps({"n": n, "after_copy": after_copy, "after_shard": after_shard,
                                  "inbound": inbound, "same": same}))
    """
)


def test_spmd_copies_count_the_bytes_every_device_receives(tmp_path):
    out = run_torch_xla_script(SPMD_SCRIPT, tmp_path, timeout=240, CPU_NUM_DEVICES="4")
    assert out["n"] == 4 and out["same"]
    assert out["after_copy"] == [[1, 4 * 32 * 4], 4]  # 128 bytes to each of 4 devices, one buffer on each
    assert out["after_shard"] == [1, 4 * 32 * 4]
    assert out["inbound"] == [1, 32 * 4]  # the host gets the tensor once
