"""PyTorch's own device-generic tests as lazyxla's yardstick: a crash-isolating runner with a CPU twin.

A developer tool (``make test-pytorch``). It runs PyTorch's test files from ``../shared/pytorch-tests`` (or
``$PYTORCH_TESTS``; their ``conftest.py`` makes torch generate the ``<Class>PRIVATEUSE1`` / ``<Class>LAZYXLA``
variants and logs each test phase as a JSON line), one pytest process per file, and:

- **isolates crashes**: when the process dies from a signal (or exits without pytest's summary), the test that
  was running is recorded as ``crashed`` with the signal, and the rest of the file runs again in a new process
  without the tests already done; a test running past ``--test-timeout`` is killed the same way (``timeout``);
  each file has a time bound and the whole run a budget; every child runs in its own process group and the
  group is killed when it ends; ``pytorch_suite_reasons.SLOW`` gives named tests (a loop over hundreds of shapes,
  each compiled once) a longer limit, each with its reason;
- **runs the CPU twin** (``PTS_DEVICE=cpu``) of every test that did not pass on lazyxla, so that a test failing
  on CPU too counts as a version gap between the 2023 test files and torch 2.13, not as lazyxla's failure;
- **skips the listed tests** (``pytorch_suite_reasons.LISTED``: true differences of an XLA device, each with a
  reason), deselected before the run;
- writes ``build/pytorch_suite.json`` (every test's outcome and error) and, with ``--update-doc``, the per-file
  table and the failure causes into ``docs/testing.md``.

Pass rate = passed / (run, less the tests that fail on CPU too). Sampling (``PTS_SAMPLE=N``: every N-th test
pytest collects) keeps the huge files within the time bound; ``SAMPLE`` holds the defaults.

Usage::

    python -m lazyxla.tools.pytorch_suite --update-doc               # every file (~1.5 h on 2 cores)
    python -m lazyxla.tools.pytorch_suite -k test_view_ops --sample 1  # one file, unsampled
    python -m lazyxla.tools.pytorch_suite -k test_torch --match 'storage|serializ'   # a slice (PTS_MATCH)
    python -m lazyxla.tools.pytorch_suite --doc-only                 # the doc from build/pytorch_suite.json

``PYTORCH_SUITE_PATH`` (folders joined with ``os.pathsep``) is added to the children's ``PYTHONPATH``: the
files import ``hypothesis`` and ``expecttest``, which ``make test-pytorch`` installs into
``build/pytorch-tests-deps``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lazyxla.tools import pytorch_suite_reasons as reasons
from lazyxla.tools.torch_xla_api import write_section
from lazyxla.tools.torch_xla_suite import kill_group
from lazyxla.util import atomic_write

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "build" / "pytorch_suite.json"
DOC = ROOT / "docs" / "testing.md"
BEGIN, END = "<!-- pytorch-suite:begin -->", "<!-- pytorch-suite:end -->"
DEFAULT_TESTS = ROOT.parent / "shared" / "pytorch-tests"

# The files, in run order, and their default sampling (every N-th collected test; 1: all). Chosen so that a full
# run takes about 1.5 hours on 2 cores (a lazyxla test takes ~1-4 s there: most of it compiling; SLOW ones minutes).
SAMPLE = {
    "test_serialization.py": 1,
    "test_view_ops.py": 2,
    "test_indexing.py": 1,
    "test_shape_ops.py": 1,
    "test_tensor_creation_ops.py": 3,
    "test_type_promotion.py": 3,
    "test_torch.py": 3,
    "test_nn.py": 3,
    "test_autograd.py": 2,
}
# outcomes: passed, xfail (expected failure: counted as passed), failed, crashed, timeout, skipped (by the test
# itself), not run (the file's time bound or the budget ran out)
NOT_PASSED = ("failed", "crashed", "timeout")


@dataclasses.dataclass
class Limits:
    """Time bounds in seconds: one test, one file (each device's run), the whole run."""

    test: float = 180.0
    file: float = 3600.0
    budget: float = 9000.0  # 87 min on 2 loaded cores left 118 tests unrun; the SLOW tests can add 40 min
    deadline: float = dataclasses.field(default=float("inf"), repr=False)  # monotonic time the budget ends


def cpu_twin(nodeid: str) -> str:
    """The CPU test of a lazyxla node id: class suffix ``PRIVATEUSE1``/``LAZYXLA`` -> ``CPU``, ``_lazyxla`` ->
    ``_cpu`` in the test's name.

    Example::

        cpu_twin("test_torch.py::TestTorchDeviceTypeLAZYXLA::test_abs_lazyxla_float32")
        # 'test_torch.py::TestTorchDeviceTypeCPU::test_abs_cpu_float32'
    """
    path, cls, name = nodeid.split("::", 2)
    cls = re.sub(r"(PRIVATEUSE1|LAZYXLA)$", "CPU", cls)
    name = re.sub(r"_lazyxla(?=_|$|\[)", "_cpu", name)
    return f"{path}::{cls}::{name}"


def _env(device: str, log: Path, skip: Path | None, only: Path | None, sample: int, match: str | None) -> dict:
    env = dict(os.environ)
    extra = [p for p in os.environ.get("PYTORCH_SUITE_PATH", "").split(os.pathsep) if p]
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *extra, *inherited])
    for name in ("PTS_SKIP", "PTS_ONLY", "PTS_MATCH", "PTS_SAMPLE"):
        env.pop(name, None)
    env.update(PTS_DEVICE=device, PTS_LOG=str(log), PTS_SAMPLE=str(sample), PYTHONUNBUFFERED="1")
    # the tests' folder may be read-only (CI lays shared/ without write bits): no .pyc, no pytest cache, and
    # hypothesis keeps its examples in a temporary folder
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(log.parent / "hypothesis")
    env.setdefault("LAZYXLA_PERSISTENT_CACHE", "0")  # every run compiles what it runs
    if skip:
        env["PTS_SKIP"] = str(skip)
    if only:
        env["PTS_ONLY"] = str(only)
    if match:
        env["PTS_MATCH"] = match
    return env


def _pytest(file: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", ".", *extra, file]


def _read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a process killed while writing it
            pass
    return out


def collect(tests: Path, file: str, device: str, sample: int, match: str | None, tmp: Path) -> list[str]:
    """The node ids pytest collects from ``file`` for ``device`` (after the conftest's sampling and ``match``).

    Example::

        collect(DEFAULT_TESTS, "test_view_ops.py", "lazyxla", 2, None, Path("/tmp"))
    """
    env = _env(device, tmp / "collect.jsonl", None, None, sample, match)
    out = subprocess.run(
        _pytest(file, "--collect-only"), cwd=tests, env=env, capture_output=True, text=True, timeout=600
    )
    ids = [ln.strip() for ln in out.stdout.splitlines() if "::" in ln and not ln.startswith(" ")]
    if not ids and out.returncode not in (0, 5):
        raise RuntimeError(
            f"collecting {file} failed (exit {out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-2000:]}"
        )
    return ids


def _outcomes(records: list[dict]) -> tuple[dict[str, dict], str | None, float]:
    """Per node id, its outcome and error from the log; the last test started and not finished; its start."""
    results: dict[str, dict] = {}
    current, started = None, 0.0
    for r in records:
        if r.get("event") == "start":
            current, started = r["nodeid"], r["t"]
            continue
        if r.get("event") != "report":
            continue
        nid = r["nodeid"]
        res = results.setdefault(nid, {"outcome": "passed", "msg": ""})
        if r["outcome"] == "failed":
            res.update(outcome="failed", msg=res["msg"] or r["msg"])
        elif r["outcome"] == "skipped" and res["outcome"] == "passed":
            res.update(outcome="xfail" if r.get("xfail") else "skipped", msg=r["msg"][-500:])
        if (r["when"] == "call" or r["outcome"] != "passed") and r["when"] != "teardown" and nid == current:
            current = None  # the test finished (its teardown may still fail: a later report)
    return results, current, started


def _watch(proc: subprocess.Popen, log: Path, limits: Limits, file_end: float) -> tuple[int | None, str]:
    """Wait for ``proc``; kill its group when a test runs past the per-test limit or time is up.
    Returns (exit code or None when killed, why it was killed)."""
    while True:
        try:
            return proc.wait(timeout=1.0), ""
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now > min(file_end, limits.deadline):
            kill_group(proc)
            return None, "time"
        _, current, started = _outcomes(_read_log(log))
        if current is not None and time.time() - started > reasons.time_limit(current, limits.test):
            kill_group(proc)
            return None, "test"


def run_device(
    tests: Path, file: str, device: str, ids: list[str], limits: Limits, sample: int, match: str | None, tmp: Path
) -> dict[str, dict]:
    """Run ``ids`` of ``file`` on ``device``, restarting after each crash or hang without the tests done.
    Returns each id's result: ``outcome``, ``msg`` and, for a crash, ``signal``.

    Example::

        run_device(DEFAULT_TESTS, "test_view_ops.py", "lazyxla", ids, Limits(), 2, None, Path("/tmp"))
    """
    todo = set(ids)
    results: dict[str, dict] = {}
    only = tmp / f"{device}.only"
    only.write_text("\n".join(ids) + "\n")
    file_end = time.monotonic() + limits.file
    attempt = 0
    while todo - results.keys():
        attempt += 1
        log, skip = tmp / f"{device}.{attempt}.jsonl", tmp / f"{device}.{attempt}.skip"
        skip.write_text("\n".join(results) + "\n")
        env = _env(device, log, skip, only, sample, match)
        with open(tmp / f"{device}.{attempt}.out", "wb") as out:
            proc = subprocess.Popen(
                _pytest(file), cwd=tests, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc, killed = _watch(proc, log, limits, file_end)
            finally:
                kill_group(proc)
        records = _read_log(log)
        done, current, _ = _outcomes(records)
        results.update({k: v for k, v in done.items() if k in todo})
        tail = (tmp / f"{device}.{attempt}.out").read_text(errors="replace")[-3000:]
        if killed == "time":
            break
        abnormal = rc is None or rc < 0 or rc not in (0, 1, 5)
        if current is None and abnormal:
            # it died after a test's last report (in its teardown): that test is the culprit
            current = _last_started(records)
        if current is not None and current in todo and (abnormal or killed):
            results[current] = _stopped(rc, killed, reasons.time_limit(current, limits.test), tail)
            continue
        if abnormal:
            # it stopped outside any test (collection, session start): the rest cannot run
            for nid in todo - results.keys():
                results[nid] = {"outcome": "not run", "msg": f"pytest stopped (exit {rc}) outside a test:\n{tail}"}
        break
    left = "the file's time bound or the run's budget ran out" if killed == "time" else "pytest did not collect it"
    for nid in todo - results.keys():
        results[nid] = {"outcome": "not run" if killed == "time" else "not collected", "msg": left}
    return results


def _last_started(records: list[dict]) -> str | None:
    starts = [r["nodeid"] for r in records if r.get("event") == "start"]
    return starts[-1] if starts else None


def _stopped(rc: int | None, killed: str, limit: float, tail: str) -> dict:
    """The result of the test that was running when its process ended (``limit``: its seconds)."""
    if killed == "test":
        return {"outcome": "timeout", "msg": f"ran past the time limit of {limit:.0f} s (killed)"}
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name
        return {"outcome": "crashed", "signal": name, "msg": f"the process died from {name}\n{tail[-1500:]}"}
    return {"outcome": "crashed", "signal": f"exit {rc}", "msg": f"the process exited ({rc}) inside the test\n{tail}"}


def run_file(tests: Path, file: str, sample: int, match: str | None, limits: Limits, table=reasons.LISTED) -> dict:
    """One file's row: its tests on lazyxla (listed ones deselected), then the CPU twins of those that did not
    pass. Each test: ``outcome``, ``msg`` (short), ``cpu`` (the twin's outcome, when run), ``reason`` (listed).

    Example::

        row = run_file(DEFAULT_TESTS, "test_view_ops.py", 2, None, Limits())
    """
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pytorch_suite.") as name:
        tmp = Path(name)
        try:
            ids = collect(tests, file, "lazyxla", sample, match, tmp)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            return {"file": file, "sample": sample, "seconds": 0.0, "error": str(e)[-3000:], "tests": {}}
        tests_out: dict[str, dict] = {}
        to_run = []
        for nid in ids:
            why = reasons.listed_reason(nid, table)
            if why:
                tests_out[nid] = {"outcome": "listed", "reason": why}
            else:
                to_run.append(nid)
        for nid, res in run_device(tests, file, "lazyxla", to_run, limits, sample, match, tmp).items():
            tests_out[nid] = _short(res)
        failing = {cpu_twin(n): n for n, r in tests_out.items() if r["outcome"] in NOT_PASSED}
        if failing:
            twin_ids = list(failing)
            twin = run_device(tests, file, "cpu", twin_ids, limits, 1, None, tmp)
            for cid, res in twin.items():
                tests_out[failing[cid]]["cpu"] = res["outcome"]
                if res["outcome"] not in ("passed", "xfail"):
                    tests_out[failing[cid]]["cpu_msg"] = reasons.error_line(res.get("msg", ""))[:300]
    return {"file": file, "sample": sample, "seconds": round(time.monotonic() - start, 1), "tests": tests_out}


def _short(res: dict) -> dict:
    out = {"outcome": res["outcome"]}
    if res["outcome"] in NOT_PASSED or res["outcome"] == "not run":
        out["msg"] = res.get("msg", "")[-2500:]
        out["error"] = reasons.error_line(res.get("msg", ""))[:500]
    if "signal" in res:
        out["signal"] = res["signal"]
        out["cause"] = f"the process died ({res['signal']})"
    elif res["outcome"] == "timeout":
        out["cause"] = "ran past the per-test time limit"
    return out


def gap(test: dict) -> bool:
    """Whether a lazyxla failure fails on CPU too (a version gap). A twin that pytest did not collect (the
    test exists for lazyxla's dtypes only) does not count as a gap."""
    return test["outcome"] in NOT_PASSED and test.get("cpu") in ("failed", "crashed", "timeout", "skipped")


def file_counts(row: dict) -> dict:
    """A row's figures: run, passed, failed, crashed, timeout, skipped, listed, not run, gap, and ``rate``
    (passed over run less gaps).

    Example::

        file_counts(row)["rate"]
    """
    c = collections.Counter()
    for t in row["tests"].values():
        c[t["outcome"]] += 1
        c["gap"] += gap(t)
    run = sum(c[k] for k in ("passed", "xfail", *NOT_PASSED))
    passed = c["passed"] + c["xfail"]
    counted = run - c["gap"]
    return {
        "run": run,
        "passed": passed,
        "failed": c["failed"],
        "crashed": c["crashed"],
        "timeout": c["timeout"],
        "skipped": c["skipped"],
        "listed": c["listed"],
        "not run": c["not run"],
        "gap": c["gap"],
        "rate": passed / counted if counted else 1.0,
    }


def causes(rows: list[dict], top: int = 25) -> list[tuple[str, int, str]]:
    """The failure causes over ``rows`` (failures that pass on CPU), most frequent first: (cause, count, one
    test it fails).

    Example::

        causes(json.loads(RESULTS.read_text())["files"])[:5]
    """
    counts: collections.Counter = collections.Counter()
    example: dict[str, str] = {}
    for row in rows:
        for nid, t in row["tests"].items():
            if t["outcome"] in NOT_PASSED and not gap(t):
                key = t.get("cause") or reasons.normalise_line(t.get("error", ""))
                counts[key] += 1
                example.setdefault(key, nid.split("::")[-1])
    return [(k, n, example[k]) for k, n in counts.most_common(top)]


def markdown(data: dict) -> str:
    """The doc section's body: when and where, totals, one row per file, crashes, the top causes.

    Example::

        print(markdown(json.loads(RESULTS.read_text())))
    """
    rows = data["files"]
    total = collections.Counter()
    lines = [
        f"Last run: {data['finished']}, commit `{data['commit']}`, torch {data['torch']}, {data['machine']}, "
        f"{data['seconds'] / 60:.0f} min. Tests from `{data['tests']}`.",
        "",
        "| file | sample | run | passed | failed | crashed | timeout | not passing on CPU either | skipped | listed "
        "| pass rate |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        c = file_counts(row)
        total.update({k: v for k, v in c.items() if k != "rate"})
        err = " (collection failed)" if row.get("error") else ""
        lines.append(
            f"| `{row['file']}`{err} | 1/{row['sample']} | {c['run']} | {c['passed']} | {c['failed']} | "
            f"{c['crashed']} | {c['timeout']} | {c['gap']} | {c['skipped']} | {c['listed']} | {c['rate']:.1%} |"
        )
    counted = total["run"] - total["gap"]
    rate = total["passed"] / counted if counted else 1.0
    lines.append(
        f"| **all** | | {total['run']} | {total['passed']} | {total['failed']} | {total['crashed']} | "
        f"{total['timeout']} | {total['gap']} | {total['skipped']} | {total['listed']} | **{rate:.1%}** |"
    )
    if total["not run"]:
        lines += ["", f"{total['not run']} tests were not run (a file's time bound or the budget ran out)."]
    crashed = [(nid, t) for row in rows for nid, t in row["tests"].items() if t["outcome"] in ("crashed", "timeout")]
    if crashed:
        lines += ["", "Crashes and hangs (the test is recorded, and the rest of its file runs in a new process):", ""]
        lines += [f"- `{nid}`: {t.get('signal', t['outcome'])}" for nid, t in crashed]
    found = causes(rows)
    if not found:
        return "\n".join([*lines, "", "Failure causes: none (every failure fails on CPU too)."])
    lines += [
        "",
        "Failure causes (failures that pass on CPU, grouped by their normalised error):",
        "",
        "| cause | tests | e.g. |",
        "| --- | ---: | --- |",
    ]
    lines += [f"| {_cell(k)} | {n} | `{ex}` |" for k, n, ex in found]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def update_doc(data: dict, doc: Path = DOC) -> None:
    """Replace the text between the suite's markers in ``doc`` with :func:`markdown`.

    Example::

        update_doc(json.loads(RESULTS.read_text()))
    """
    write_section(doc, BEGIN, END, markdown(data))


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def _machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores{' ' + model if model else ''} ({platform.machine()})"


def reclassify(data: dict) -> None:
    """Recompute the saved failures' error lines, so that today's ``CAUSES`` and normalisation group them
    (after editing ``pytorch_suite_reasons``, no re-run needed).

    Example::

        data = json.loads(RESULTS.read_text()); reclassify(data); update_doc(data)
    """
    for row in data["files"]:
        for t in row["tests"].values():
            if t["outcome"] == "failed":
                t["error"] = reasons.error_line(t.get("msg", ""))[:500]
                t.pop("cause", None)


def _merge(previous: dict | None, rows: list[dict]) -> list[dict]:
    """This run's rows replace the previous results' rows of the same files; the others stay."""
    if previous is None:
        return rows
    new = {r["file"]: r for r in rows}
    merged = [new.pop(r["file"], r) for r in previous["files"]]
    return merged + list(new.values())


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module's docstring).

    Example::

        main(["-k", "test_view_ops", "--update-doc"])
    """
    parser = argparse.ArgumentParser(prog="python -m lazyxla.tools.pytorch_suite", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tests",
        default=os.environ.get("PYTORCH_TESTS", str(DEFAULT_TESTS)),
        help="the folder of PyTorch's test files ($PYTORCH_TESTS, else ../shared/pytorch-tests)",
    )
    parser.add_argument("-k", action="append", dest="keys", help="run only files whose name contains this")
    parser.add_argument("--sample", type=int, help="every N-th test of every file (default: SAMPLE per file)")
    parser.add_argument("--match", help="only node ids matching this regex (PTS_MATCH)")
    parser.add_argument("--test-timeout", type=float, default=Limits.test, help="seconds one test may take")
    parser.add_argument("--file-timeout", type=float, default=Limits.file, help="seconds one file may take")
    parser.add_argument("--budget", type=float, default=Limits.budget, help="seconds the whole run may take")
    parser.add_argument("--update-doc", action="store_true", help=f"write the results into {DOC.name}")
    parser.add_argument("--doc-only", action="store_true", help="rewrite the doc from the saved results")
    args = parser.parse_args(argv)
    # a terminated run still ends its pytest process group (``run_device``'s ``finally``), as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else None
    if args.doc_only:
        if previous is None:
            parser.error(f"no saved results: {RESULTS} is missing")
        reclassify(previous)
        atomic_write(RESULTS, json.dumps(previous, indent=1).encode())
        update_doc(previous)
        return
    tests = Path(args.tests).resolve()
    if not (tests / "conftest.py").is_file():
        parser.error(f"{tests} holds no conftest.py: set PYTORCH_TESTS (or --tests) to the pytorch-tests folder")
    files = [f for f in SAMPLE if (tests / f).exists() and (not args.keys or any(k in f for k in args.keys))]
    limits = Limits(args.test_timeout, args.file_timeout, args.budget)
    limits.deadline = time.monotonic() + limits.budget
    start = time.monotonic()
    rows = []
    for i, file in enumerate(files, 1):
        row = run_file(tests, file, args.sample or SAMPLE[file], args.match, limits)
        rows.append(row)
        c = file_counts(row)
        print(
            f"[{i}/{len(files)}] {file}: {c['passed']}/{c['run']} passed, {c['crashed']} crashed, "
            f"{c['gap']} fail on CPU too ({c['rate']:.1%}) in {row['seconds']:.0f}s",
            flush=True,
        )
    data = {
        "finished": time.strftime("%Y-%m-%d"),
        "commit": _commit(),
        "torch": _torch_version(),
        "machine": _machine(),
        "tests": f"…/{tests.parent.name}/{tests.name}",  # not this machine's absolute path
        "match": args.match,
        "seconds": round(time.monotonic() - start, 1),
        "files": _merge(previous if args.keys else None, rows),
    }
    if args.keys and previous:
        data["seconds"] = sum(r["seconds"] for r in data["files"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(RESULTS, json.dumps(data, indent=1).encode())
    print(markdown(data))
    if args.update_doc:
        update_doc(data)


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    main()
