"""One file of torch_xla's test suite under ``lazyxla.run``, with each test case's outcome recorded.

Started by ``python -m lazyxla.tools.torch_xla_suite`` (one process per file): ``python -m
lazyxla.tools.torch_xla_suite_child RECORD FILE [ARGS ...]``. Every unittest result (absltest's included:
its results derive from ``unittest.TestResult``) is appended to ``RECORD`` as one JSON line, ``{"id",
"outcome", "detail"}``, as soon as it is known, so a file that later crashes or runs past its time limit
still reports the cases it finished. Then the file runs exactly as ``python -m lazyxla.run FILE ARGS``
runs it.

Example::

    python -m lazyxla.tools.torch_xla_suite_child /tmp/out.jsonl $TORCH_XLA_SRC/test/test_metrics.py
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import unittest

from lazyxla import run

_record_path: list[str] = []


def _write(test, outcome: str, detail: str = "") -> None:
    """Append one case's outcome to the record file (opened per line: the file may crash at any time)."""
    if not _record_path or os.getpid() != _owner[0]:
        return  # a replica process re-running the script: only the process that runs the tests records
    entry = {"id": getattr(test, "id", lambda: str(test))(), "outcome": outcome, "detail": detail[-2000:]}
    with open(_record_path[0], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


_owner = [os.getpid()]


def _last_line(err) -> str:
    """The exception's type and message, and the innermost frame of the test's traceback."""
    kind, value, tb = err
    frames = traceback.extract_tb(tb)
    where = f" [{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}]" if frames else ""
    message = "".join(traceback.format_exception_only(kind, value)).strip()
    first = message.splitlines()[0] if message else kind.__name__
    return first[:400] + where


def _patch(result_cls) -> None:
    """Wrap ``result_cls``'s add* methods so that each records before doing what it did."""
    outcomes = {
        "addSuccess": ("passed", None),
        "addFailure": ("failed", 1),
        "addError": ("error", 1),
        "addSkip": ("skipped", 1),
        "addExpectedFailure": ("xfail", None),
        "addUnexpectedSuccess": ("xpass", None),
    }
    for name, (outcome, detail_at) in outcomes.items():
        original = getattr(result_cls, name)

        def method(self, test, *rest, _original=original, _outcome=outcome, _at=detail_at):
            detail = ""
            if _at is not None and rest:
                detail = rest[0] if isinstance(rest[0], str) else _last_line(rest[0])
            _write(test, _outcome, detail)
            return _original(self, test, *rest)

        setattr(result_cls, name, method)
    original_sub = result_cls.addSubTest

    def add_sub_test(self, test, subtest, err, _original=original_sub):
        if err is not None:  # a failing subtest fails its test; passing ones are not cases of their own
            failed = issubclass(err[0], test.failureException)
            _write(subtest, "failed" if failed else "error", _last_line(err))
        return _original(self, test, subtest, err)

    result_cls.addSubTest = add_sub_test


def main(argv: list[str] | None = None) -> None:
    """Record into ``argv[0]`` and run ``argv[1:]`` (a script and its arguments) under ``lazyxla.run``.

    Example::

        main(["/tmp/out.jsonl", "test/test_devices.py"])
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2:
        print("usage: python -m lazyxla.tools.torch_xla_suite_child RECORD FILE [ARGS ...]", file=sys.stderr)
        raise SystemExit(2)
    _record_path[:] = [argv[0]]
    _patch(unittest.TestResult)
    run.main(argv[1:])


if __name__ == "__main__":
    main()
