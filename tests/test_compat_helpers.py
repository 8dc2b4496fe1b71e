"""torch_xla's helper modules: ``experimental.gradient_accumulation`` (one compiled loop, compared with the
per-micro-batch Python loop on the CPU), ``experimental.deprecation``, ``test.test_utils`` and
``xm.xla_replication_devices``. Everything runs in this process, on one device.
"""

from __future__ import annotations

import logging
import sys

import pytest
import torch

import lazyxla
import lazyxla.compat as compat


@pytest.fixture
def xla():
    """The compatibility layer installed in this process (removed again afterwards)."""
    assert compat.install()
    import torch_xla

    yield torch_xla
    compat.uninstall()


# --- experimental.gradient_accumulation ---------------------------------------------------------------


def _model() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def _reference(data, target, steps):
    """The same accumulation on the CPU, one micro-batch at a time: loss sum, gradients, the count."""
    model, total, seen = _model(), torch.tensor(0.0), torch.tensor(0)
    for i in range(steps):
        loss = torch.nn.functional.mse_loss(model(data[i]), target[i]) / steps
        loss.backward()
        total, seen = total + loss.detach(), seen + 1
    return total, [p.grad for p in model.parameters()], seen


def test_gradient_accumulation_equals_the_micro_batch_loop_in_one_compile(xla, dev):
    from torch_xla.experimental.gradient_accumulation import gradient_accumulation

    steps = 4
    data, target = torch.randn(steps, 6, 3), torch.randn(steps, 6, 2)
    want_loss, want_grads, want_seen = _reference(data, target, steps)
    model = _model().to(dev)

    def train_step(x, y, seen):
        return torch.nn.functional.mse_loss(model(x), y), seen + 1

    lazyxla.sync()
    lazyxla.metrics.reset()
    loss, seen = gradient_accumulation(train_step, (data.to(dev), target.to(dev)), model, torch.tensor(0, device=dev))
    lazyxla.sync()
    assert lazyxla.metrics.counters()["compiles"] == 1  # the loop is one program, not 4 unrolled steps
    torch.testing.assert_close(loss.cpu(), want_loss, rtol=1e-5, atol=1e-6)
    assert seen.item() == want_seen.item() == steps
    for got, want in zip(model.parameters(), want_grads):
        torch.testing.assert_close(got.grad.cpu(), want, rtol=1e-5, atol=1e-6)


def test_gradient_accumulation_adds_to_existing_gradients_and_draws_per_iteration(xla, dev):
    from torch_xla.experimental.gradient_accumulation import gradient_accumulation

    model = _model().to(dev)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    data, target = torch.randn(3, 4, 3), torch.randn(3, 4, 2)
    _, want_grads, _ = _reference(data, target, 3)

    def train_step(x, y, draws):  # one random number per iteration, written at that iteration's index
        noise = torch.rand(1, device=dev)
        return torch.nn.functional.mse_loss(model(x), y), torch.cat([draws[1:], noise])

    loss, draws = gradient_accumulation(train_step, (data.to(dev), target.to(dev)), model, torch.zeros(3, device=dev))
    for got, want in zip(model.parameters(), want_grads):
        torch.testing.assert_close(got.grad.cpu(), want + 1, rtol=1e-5, atol=1e-6)
    values = draws.cpu().tolist()
    assert len(set(values)) == 3 and all(0 < v < 1 for v in values)  # each iteration drew its own number


def test_gradient_accumulation_refuses_bad_inputs_and_impure_steps(xla, dev):
    from torch_xla.experimental.gradient_accumulation import gradient_accumulation

    model = _model().to(dev)
    with pytest.raises(ValueError, match="cannot be empty"):
        gradient_accumulation(lambda: None, [], model)
    with pytest.raises(ValueError, match="inconsistent first dimension"):
        gradient_accumulation(lambda *a: None, (torch.ones(2, 3, device=dev), torch.ones(3, 2, device=dev)), model)

    def in_place(x, count):
        count += 1
        return model(x).sum(), count

    with pytest.raises(AssertionError, match="in place"):
        gradient_accumulation(in_place, (torch.ones(2, 1, 3, device=dev),), model, torch.tensor(0, device=dev))


# --- experimental.deprecation -------------------------------------------------------------------------


def new_api(x):
    return x * 2


def test_deprecated_warns_once_naming_both_and_calls_the_new_function(xla, caplog):
    from torch_xla.experimental.deprecation import deprecated, mark_deprecated, register_deprecated

    this = sys.modules[__name__]
    old = deprecated(this, new_api, "old_api", extra_msg="Gone in 3.0.")
    with caplog.at_level(logging.WARNING):
        assert old(3) == 6 and old(4) == 8
    assert [r.getMessage() for r in caplog.records] == [
        f"{__name__}.old_api is deprecated. Use {__name__}.new_api instead. Gone in 3.0."
    ]
    caplog.clear()

    @mark_deprecated(new_api)
    def older(x):
        raise AssertionError("the deprecated body never runs")

    with caplog.at_level(logging.WARNING):
        assert older(5) == 10
    assert "older is deprecated" in caplog.records[0].getMessage()

    holder = type(sys)("holder")
    register_deprecated(holder, new_api)
    assert holder.new_api(1) == 2 and holder.new_api.__name__ == "new_api"


# --- test.test_utils ----------------------------------------------------------------------------------


class _Writer:
    """A SummaryWriter's interface, recording what it is given."""

    def __init__(self):
        self.scalars, self.closed = [], False

    def add_scalar(self, name, value, step):
        self.scalars.append((name, value, step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_test_utils_prints_updates_and_writes_summaries(xla, dev, capsys):
    import torch_xla.test.test_utils as test_utils

    test_utils.print_training_update(dev, 3, 0.123456, 10.0, 12.5, epoch=1)
    test_utils.print_test_update(dev, 97.5, epoch=2)
    lines = capsys.readouterr().out.splitlines()
    want = f"| Training Device={dev}/0 Epoch=1 Step=3 Loss=0.12346 Rate=10.00 GlobalRate=12.50 Time="
    assert lines[0].startswith(want)
    assert lines[1].startswith(f"| Test Device={dev}/0 Epoch=2 Accuracy=97.50 Time=")
    assert test_utils.get_summary_writer(None) is None
    test_utils.write_to_summary(None, 1, {"loss": 1.0})  # no writer: nothing to do

    torch.ones(2, device=dev).sum().item()  # something in the metrics report
    writer = _Writer()
    test_utils.write_to_summary(writer, 5, {"loss": 0.5}, write_xla_metrics=True)
    names = [name for name, _, _ in writer.scalars]
    assert writer.scalars[0] == ("loss", 0.5, 5) and names[-1] == "aten_ops_sum"
    assert any(n.startswith("CompileTime") for n in names)  # torch_xla's metric names, parsed from the report
    test_utils.close_summary_writer(writer)
    assert writer.closed


# --- xm.xla_replication_devices -----------------------------------------------------------------------


def test_xla_replication_devices_names_every_device_of_the_kind(xla, dev):
    import torch_xla.core.xla_model as xm

    assert xm.xla_replication_devices([dev]) == ["CPU:0"]
    assert xm.xla_replication_devices() == ["CPU:0"]
    with pytest.raises(RuntimeError, match="different device types"):
        xm.xla_replication_devices([torch.device("cpu")])
    with pytest.raises(RuntimeError, match="spans all 1"):
        xm.xla_replication_devices([dev, dev])
