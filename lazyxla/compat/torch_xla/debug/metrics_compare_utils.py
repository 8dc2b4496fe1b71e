"""``torch_xla.debug.metrics_compare_utils``: turn metrics reports into numbers and flag changes.

A report is the text of ``met.metrics_report()`` (torch_xla's layout: ``Metric:`` blocks with
``TotalSamples``, ``Accumulator`` and ``Percentiles``, and ``Counter:`` blocks with ``Value``).
:func:`parse_metrics_report` reads one into ``{"<name>__<field>[_<unit>]": number}``: durations become
seconds (unit ``sec``: ``01m29s615ms`` is 89.615), sizes megabytes (unit ``mb``: ``1.54MB``), plain numbers
stay unitless; counters give ``<name>__Value``. :func:`get_data_points_from_metrics_reports` lines up many
reports (None where a report lacks a key) and :func:`compare_metrics` checks a new report against their mean
and standard deviation with a Python expression per key (``v``, ``v_mean``, ``v_stddev``), reporting each
key that fails and every new ``aten::`` counter (an op that started running on the CPU).

Example::

    import torch_xla.debug.metrics_compare_utils as mcu
    history = mcu.get_data_points_from_metrics_reports([report_1, report_2, report_3])
    print(mcu.compare_metrics(history, met.metrics_report()))     # '' when nothing regressed
"""

from __future__ import annotations

import collections
import re

import numpy as np

from lazyxla.compat._common import missing_attribute

__all__ = ["compare_metrics", "get_data_points_from_metrics_reports", "parse_metrics_report"]

_PERCENTILES = (1, 5, 10, 20, 50, 80, 90, 95, 99)
_METRIC = re.compile(
    r"Metric: (?P<name>\S+)\s+TotalSamples: (?P<TotalSamples>\d+)\s+Accumulator: (?P<Accumulator>\S+)[^P]+"
    r"Percentiles: " + "; ".join(rf"{p}%=(?P<Percentile_{p}>\S+?)" for p in _PERCENTILES) + r"(?=\s|$)"
)
# The metrics server's reports list fewer percentiles; its 25% is filed under Percentile_20, as torch_xla does.
_SERVER_METRIC = re.compile(
    r"Metric: (?P<name>\S+)\s+TotalSamples: (?P<TotalSamples>\d+)\s+Accumulator: (?P<Accumulator>\S+)[^P]+"
    r"Percentiles: 25%=(?P<Percentile_20>\S+?); "
    + "; ".join(rf"{p}%=(?P<Percentile_{p}>\S+?)" for p in (50, 80, 90, 95, 99))
    + r"(?=\s|$)"
)
_COUNTER = re.compile(r"Counter: (\S+)\s+Value: (\d+)")
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?(?:([\d.]+)us)?$")
_SECONDS_PER = (86400.0, 3600.0, 60.0, 1.0, 1e-3, 1e-6)
_SIZE = re.compile(r"(?:([\d.]+)PB)?(?:([\d.]+)TB)?(?:([\d.]+)GB)?(?:([\d.]+)MB)?(?:([\d.]+)KB)?(?:([\d.]+)B)?$")
_MB_PER = (1e9, 1e6, 1e3, 1.0, 1e-3, 1e-6)


def _weighted(match, weights) -> float | None:
    """The sum of the match's groups times their weights, or None when no group matched."""
    if match is None or not any(match.groups()):
        return None
    return sum(float(g) * w for g, w in zip(match.groups(), weights) if g is not None)


def _number(text: str) -> tuple[float, str]:
    """A report value as ``(number, unit)``: unit '' (plain), 'sec' (a duration) or 'mb' (a size)."""
    try:
        return float(text), ""
    except ValueError:
        pass
    seconds = _weighted(_DURATION.match(text), _SECONDS_PER)
    if seconds is not None:
        return seconds, "sec"
    megabytes = _weighted(_SIZE.match(text.upper()), _MB_PER)
    if megabytes is not None:
        return megabytes, "mb"
    raise ValueError(f"Unknown metric_str format: {text}")


def parse_metrics_report(report: str, dehumanize: bool = True) -> dict:
    """``{key: number}`` for every metric field and counter in ``report`` (see the module's docstring);
    with ``dehumanize=False`` each value is ``(number, text as written)``.

    Example::

        mcu.parse_metrics_report(met.metrics_report())["CompileTime__Accumulator_sec"]
    """
    points: dict = {}
    for pattern in (_METRIC, _SERVER_METRIC):
        for match in pattern.finditer(report):
            fields = match.groupdict()
            name = fields.pop("name")
            for field, text in fields.items():
                value, unit = _number(text)
                key = f"{name}__{field}" + (f"_{unit}" if unit else "")
                points[key] = value if dehumanize else (value, text)
    for name, value in _COUNTER.findall(report):
        points[f"{name}__Value"] = int(value)
    return points


def get_data_points_from_metrics_reports(metrics_reports: list[str]) -> dict:
    """``{key: [value in report 0, value in report 1, ...]}`` over ``metrics_reports`` (None where a report
    lacks the key), in the reports' order.

    Example::

        points = mcu.get_data_points_from_metrics_reports([r1, r2])
        points["CompileTime__TotalSamples"]        # [3.0, None] if r2 compiled nothing
    """
    points: dict = collections.defaultdict(lambda: [None] * len(metrics_reports))
    for i, report in enumerate(metrics_reports):
        for key, value in parse_metrics_report(report).items():
            points[key][i] = value
    return points


def _aggregates(data_points: dict) -> dict:
    out = {}
    for key, values in data_points.items():
        present = [v for v in values if v is not None]
        if present:
            out[key] = {"mean": np.mean(present), "stddev": np.std(present)}
    return out


def compare_metrics(data_points: dict, metrics_report: str, config: dict | None = None) -> str:
    """One line per key of ``metrics_report`` whose value fails its check against ``data_points``, and one
    per ``aten::`` counter that ``data_points`` never had; '' when all is as before.

    The check is the Python expression ``config['<key>_expression']``, else ``config['base_expression']``
    (default ``'v <= v_mean + (v_stddev * 2.0)'``), over ``v``, ``v_mean`` and ``v_stddev``. The expressions
    are evaluated as Python code: pass only your own.

    Example::

        mcu.compare_metrics(history, report, config={"base_expression": "v <= v_mean * 1.1"})
    """
    config = config or {"base_expression": "v <= v_mean + (v_stddev * 2.0)"}
    stats = _aggregates(data_points)
    lines = []
    for key, value in sorted(parse_metrics_report(metrics_report).items()):
        if key not in stats:
            if key.startswith("aten::"):
                lines.append(f"Found new aten counter: {key}: {value}\n")
            continue
        mean, stddev = stats[key]["mean"], stats[key]["stddev"]
        expression = config.get(f"{key}_expression") or config["base_expression"]
        if not eval(expression, {"__builtins__": {}}, {"v": value, "v_mean": mean, "v_stddev": stddev}):
            lines.append(
                f"{key} failed its expression check. Expression: {expression}.  Mean: {mean}.  "
                f"Stddev: {stddev}.  Actual Value: {value}\n"
            )
    return "".join(lines)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
