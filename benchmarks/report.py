"""Summaries, tables and the JSON file of a benchmark run."""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from collections.abc import Sequence
from typing import Any


def summary(seconds: Sequence[float], scale: float = 1e3, unit: str = "ms") -> dict[str, float]:
    """Median, min and max of ``seconds`` in ``unit`` (``scale`` per second), and the sample count."""
    xs = [t * scale for t in seconds]
    return {f"median_{unit}": statistics.median(xs), f"min_{unit}": min(xs), f"max_{unit}": max(xs), "samples": len(xs)}


def ratio(value: float | None, floor: float | None) -> float | None:
    """``value / floor`` or None when either is missing or the floor is not positive."""
    if value is None or floor is None or not floor > 0:
        return None
    return value / floor


def fmt(x: Any, digits: int = 2) -> str:
    """A table cell: numbers with ``digits`` decimals, None as '-'."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}" if math.isfinite(x) else str(x)
    return str(x)


def fmt_range(lo: float | None, hi: float | None, digits: int = 2) -> str:
    """'lo–hi' for a min–max cell."""
    if lo is None or hi is None:
        return "-"
    return f"{lo:.{digits}f}–{hi:.{digits}f}"


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = ()) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned; notes below it."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))
    )
    out = [title, line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    out += [f"  {n}" for n in notes]
    return "\n".join(out)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, then ``os.replace``.

    Non-finite floats (a NaN loss) become null, so the file stays strict JSON.
    """
    data = _finite(data)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".bench-", suffix=".json.tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
