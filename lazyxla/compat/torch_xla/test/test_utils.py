"""``torch_xla.test.test_utils`` on lazyxla: what torch_xla's tests and example scripts use to report progress.

``print_training_update`` / ``print_test_update`` print one ``|``-prefixed line (``Device=xla:0/<ordinal>``,
step, loss, rates, time); ``get_summary_writer`` / ``write_to_summary`` / ``close_summary_writer`` drive a
TensorBoard ``SummaryWriter`` (``tensorboardX``, optional), ``write_xla_metrics=True`` adding every metric of
``torch_xla.debug.metrics``; ``mp_test`` runs a test method in a child process and asserts it exits with 0.

Example::

    import torch_xla.test.test_utils as test_utils
    writer = test_utils.get_summary_writer(logdir)          # None without a logdir
    test_utils.print_training_update(device, step, loss.item(), rate, global_rate, epoch=1)
    test_utils.write_to_summary(writer, step, {"loss": loss.item()}, write_xla_metrics=True)
    test_utils.close_summary_writer(writer)
"""

from __future__ import annotations

import functools
import multiprocessing
import time
import unittest
from datetime import datetime

from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla import runtime as xr
from lazyxla.compat.torch_xla.debug import metrics as met
from lazyxla.compat.torch_xla.debug import metrics_compare_utils as mcu


def mp_test(func):
    """Run the wrapped ``unittest.TestCase`` method in a separate process (a fresh device state); the test
    fails unless that process exits with 0. Returns the exit code.

    Example::

        class MyTest(unittest.TestCase):
            @test_utils.mp_test
            def test_fresh_process(self):
                ...
    """

    @functools.wraps(func)
    def run_in_child(*args, **kwargs):
        child = multiprocessing.Process(target=func, args=args, kwargs=kwargs)
        child.start()
        child.join()
        if args and isinstance(args[0], unittest.TestCase):
            args[0].assertEqual(child.exitcode, 0)
        return child.exitcode

    return run_in_child


def _device_spec(device) -> str:
    ordinal = xr.global_ordinal()
    return str(device) if ordinal < 0 else f"{device}/{ordinal}"


def write_to_summary(summary_writer, global_step=None, dict_to_write=None, write_xla_metrics: bool = False) -> None:
    """Write ``dict_to_write``'s scalars to a TensorBoard ``SummaryWriter`` (nothing when it is None); with
    ``write_xla_metrics`` also every metric of the metrics report, and ``aten_ops_sum`` (the sum of the
    ``aten::`` counters: operations that ran on the CPU).

    Example::

        test_utils.write_to_summary(writer, step, {"loss": 0.5}, write_xla_metrics=True)
    """
    if summary_writer is None:
        return
    for name, value in (dict_to_write or {}).items():
        summary_writer.add_scalar(name, value, global_step)
    if write_xla_metrics:
        aten_ops_sum = 0
        for name, value in mcu.parse_metrics_report(met.metrics_report()).items():
            if name.startswith("aten::"):
                aten_ops_sum += value
            summary_writer.add_scalar(name, value, global_step)
        summary_writer.add_scalar("aten_ops_sum", aten_ops_sum, global_step)


def close_summary_writer(summary_writer) -> None:
    """Flush and close ``summary_writer`` (nothing when it is None).

    Example::

        test_utils.close_summary_writer(writer)
    """
    if summary_writer is not None:
        summary_writer.flush()
        summary_writer.close()


def get_summary_writer(logdir):
    """A ``tensorboardX.SummaryWriter`` logging to ``logdir`` (with a ``TensorboardStartTimestamp`` scalar), or
    None when ``logdir`` is empty.

    Example::

        writer = test_utils.get_summary_writer("/tmp/logs")
    """
    if not logdir:
        return None
    from tensorboardX import SummaryWriter  # optional dependency, needed only when logging

    writer = SummaryWriter(log_dir=logdir)
    write_to_summary(writer, 0, dict_to_write={"TensorboardStartTimestamp": time.time()})
    return writer


def now(format: str = "%H:%M:%S") -> str:  # noqa: A002 (torch_xla's parameter name)
    """The wall-clock time as text.

    Example::

        print(test_utils.now())        # '14:03:59'
    """
    return datetime.now().strftime(format)


def _print_update(fields: list) -> None:
    print("|", " ".join(f for f in fields if f), flush=True)


def print_training_update(device, step, loss, rate, global_rate, epoch=None, summary_writer=None) -> None:
    """Print ``| Training Device=xla:0/0 Epoch=1 Step=10 Loss=0.12345 Rate=1.00 GlobalRate=1.00 Time=...``
    (the epoch only when given); rates also go to ``summary_writer``.

    Example::

        test_utils.print_training_update(device, step, loss.item(), tracker.rate(), tracker.global_rate())
    """
    _print_update(
        [
            "Training",
            f"Device={_device_spec(device)}",
            f"Epoch={epoch}" if epoch is not None else None,
            f"Step={step}",
            f"Loss={loss:.5f}",
            f"Rate={rate:.2f}",
            f"GlobalRate={global_rate:.2f}",
            f"Time={now()}",
        ]
    )
    if summary_writer:
        write_to_summary(summary_writer, dict_to_write={"examples/sec": rate, "average_examples/sec": global_rate})


def print_test_update(device, accuracy, epoch=None, step=None) -> None:
    """Print ``| Test Device=xla:0/0 Step=.. Epoch=.. Accuracy=97.50 Time=...`` (fields given as None left out).

    Example::

        test_utils.print_test_update(device, 97.5, epoch=1)
    """
    _print_update(
        [
            "Test",
            f"Device={_device_spec(device)}",
            f"Step={step}" if step is not None else None,
            f"Epoch={epoch}" if epoch is not None else None,
            f"Accuracy={accuracy:.2f}" if accuracy is not None else None,
            f"Time={now()}",
        ]
    )


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
