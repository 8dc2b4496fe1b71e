"""Hugging Face training steps: host time per warm step of lazyxla's modes against eager PyTorch and torch_xla.

Usage: ``python -m benchmarks.hf [--quick] [--rounds N] [--warmup N] [--models gpt2,llama] [--json PATH]``
(also a section of ``make bench``). Each framework runs in a worker process of its own, one per model, and
the driver asks every worker for one step per round, in a rotating order: the machine's load hits all alike,
and no framework shares a process (and its caches, threads and lazy graph) with another. Frameworks:

- ``eager``: PyTorch on the CPU;
- ``lazyxla``: lazy mode (each op recorded, one program per step at ``lazyxla.sync()``);
- ``lazyxla captured``: the whole step under ``lazyxla.compile(step, capture=True)`` (warm steps replayed);
- ``lazyxla compiled``: the model under ``torch.compile(backend="lazyxla")``, the optimizer in lazy mode;
- ``torch_xla`` and ``torch_xla openxla``: torch_xla's lazy tensors and its Dynamo backend (model compiled,
  optimizer lazy), with ``PJRT_DEVICE=CPU``, when a venv holding torch_xla exists (``$TORCH_XLA_PEER_VENV``,
  default ``.venv-torch_xla``; ``make bench-torch_xla-venv`` builds it). torch_xla is a peer measured side by
  side, never a dependency: its workers run under that venv's python and import neither lazyxla nor jax.

Models: ``GPT2LMHeadModel`` and ``LlamaForCausalLM`` from tiny random configs (hidden 64, 4 layers; nothing is
downloaded), AdamW with PyTorch's defaults, the same parameters and batch in every framework (seeded on the CPU).
Per step the worker measures wall and thread CPU time until the step is handed to the device (``host``: the
recording and the sync's host work; eager: the whole step) and the wall time until the loss is read (``step``).
Ops per step: the aten ops the step dispatches, counted by one ``TorchDispatchMode`` in an extra step that is not
timed (the same counting on every framework), and for lazyxla also its own ``ops_recorded`` counter.

Example::

    results = run(quick=True)
    print(table(results))
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import report as R

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_VARIABLE = "TORCH_XLA_PEER_VENV"
LAZYXLA = ("lazyxla", "lazyxla captured", "lazyxla compiled")
TORCH_XLA = ("torch_xla", "torch_xla openxla")
FRAMEWORKS = ("eager", *LAZYXLA, *TORCH_XLA)
MODELS = ("gpt2", "llama")
# hidden, layers, heads, vocabulary, sequence, batch: tiny, so that the host's part dominates the step
SIZES = {"full": (64, 4, 4, 256, 32, 2), "quick": (16, 1, 2, 32, 8, 2)}
# A captured step replays from its third or fourth call; the XLA frameworks compile in their first two.
WARMUP = {"full": 6, "quick": 4}
ROUNDS = {"full": 20, "quick": 2}
READY = "HF-WORKER-READY"
FOREACH = {"default": None, "on": True, "off": False}  # AdamW's foreach argument


# ---- the worker: one framework and model in a process of its own ---------------------------------------------


def build(model: str, size: str):
    """``(net, ids)``: the model (``gpt2`` or ``llama``) from a random config, seeded, on the CPU, and one batch of
    token ids (the labels too: Hugging Face shifts them)."""
    # In the worker only: the driver and the torch_xla venv's worker import transformers, the driver does not.
    import torch
    import transformers as T

    hidden, layers, heads, vocab, seq, batch = SIZES[size]
    torch.manual_seed(0)
    if model == "gpt2":
        cfg = T.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=seq)
        cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0  # no dropout: every framework computes the same
        net = T.GPT2LMHeadModel(cfg)
    elif model == "llama":
        cfg = T.LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads // 2, max_position_embeddings=seq,
        )  # fmt: skip
        net = T.LlamaForCausalLM(cfg)
    else:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    return net.train(), ids


def _device_and_sync(framework: str):
    """The framework's device and its step boundary (the call that hands the recorded step to the device)."""
    # Only the framework's own package: the torch_xla venv has no lazyxla, lazyxla's has no torch_xla.
    import torch

    if framework == "eager":
        return torch.device("cpu"), lambda: None
    if framework in LAZYXLA:
        import lazyxla

        return lazyxla.device(), lazyxla.sync
    if framework in TORCH_XLA:
        import torch_xla
        import torch_xla.core.xla_model as xm

        return torch_xla.device(), xm.mark_step
    raise ValueError(f"unknown framework {framework!r}; choose from {', '.join(FRAMEWORKS)}")


def make_step(framework: str, model: str, size: str, foreach: str = "default"):
    """A warm-able training step: each call runs forward, backward, AdamW and ``zero_grad``, hands the step to the
    device, reads the loss, and returns ``{"host_ms", "cpu_ms", "step_ms", "loss"}`` (see the module's doc).
    ``foreach``: AdamW's ``foreach`` ('default': PyTorch's choice for the device, 'on' or 'off')."""
    import torch  # in the worker only (see build)

    net, ids = build(model, size)
    dev, sync = _device_and_sync(framework)
    net, ids = net.to(dev), ids.to(dev)
    # PyTorch's default picks the foreach kernels on lazyxla (a PrivateUse1 device) and a loop over the parameters
    # on torch_xla: the same math, a different number of ops.
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=FOREACH[foreach])
    forward = lambda x: net(input_ids=x, labels=x, use_cache=False).loss
    if framework in ("lazyxla compiled", "torch_xla openxla"):
        backend = "lazyxla" if framework.startswith("lazyxla") else "openxla"
        compiled = torch.compile(net, backend=backend)
        forward = lambda x: compiled(input_ids=x, labels=x, use_cache=False).loss

    def record(x):  # the batch is an argument: a captured step's inputs must be arguments or state it can find
        loss = forward(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    if framework == "lazyxla captured":  # the step syncs itself: recorded, or replayed once verified
        import lazyxla

        record, sync = lazyxla.compile(record, capture=True), lambda: None
    sync()

    def step() -> dict[str, float]:
        start, cpu = time.perf_counter(), time.thread_time()
        loss = record(ids)
        sync()
        host, cpu = time.perf_counter() - start, time.thread_time() - cpu
        value = loss.item()
        return {
            "host_ms": host * 1e3,
            "cpu_ms": cpu * 1e3,
            "step_ms": (time.perf_counter() - start) * 1e3,
            "loss": value,
        }

    return step


def count_ops(step) -> int:
    """The aten ops one call of ``step`` dispatches (after autograd and functionalization), counted by a
    ``TorchDispatchMode``: the same count on every framework."""
    # In the worker only (see build).
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return Count.n


def worker(framework: str, model: str, size: str, foreach: str = "default") -> None:
    """Serve the driver on stdin/stdout: ``step`` (one timed step), ``count`` (one step under the op counter), or
    ``quit``; each answer is one JSON line."""
    step = make_step(framework, model, size, foreach)
    recorded = None
    if framework in LAZYXLA:
        import lazyxla  # in the lazyxla worker only

        recorded = lambda: lazyxla.metrics.counters()["ops_recorded"]
    print(READY, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            return
        if command == "step":
            before = recorded() if recorded else None
            out = step()
            if recorded:
                out["ops_recorded"] = recorded() - before
        elif command == "count":
            out = {"ops": count_ops(step)}
        else:
            out = {"error": f"unknown command {command!r}"}
        print(json.dumps(out), flush=True)


# ---- the driver ---------------------------------------------------------------------------------------------


def torch_xla_python() -> tuple[str | None, str]:
    """The torch_xla venv's python (``$TORCH_XLA_PEER_VENV``, default ``<repo>/.venv-torch_xla``) and its versions,
    or None and why not (no venv, or torch_xla does not import there)."""
    venv = os.environ.get(VENV_VARIABLE) or os.path.join(ROOT, ".venv-torch_xla")
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        return None, f"torch_xla: skipped, no venv at {venv} (${VENV_VARIABLE}; make bench-torch_xla-venv builds it)"
    code = "import torch, torch_xla; print(f'torch_xla {torch_xla.__version__}, torch {torch.__version__}')"
    env = dict(os.environ, PJRT_DEVICE="CPU")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"torch_xla: skipped, it does not import in {venv}: {why}"
    return python, f"torch_xla: {proc.stdout.strip()} ({python}, PJRT_DEVICE=CPU)"


class Worker:
    """One worker process; ``ask(command)`` sends a line and returns the JSON answer."""

    def __init__(self, python: str, framework: str, model: str, size: str, foreach: str) -> None:
        # PYTHONPATH: this checkout (its benchmarks, and lazyxla for lazyxla's workers) and nothing else.
        env = dict(os.environ, PYTHONPATH=ROOT, LAZYXLA_PERSISTENT_CACHE="0", PJRT_DEVICE="CPU")
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as benchmarks.run: idle OpenMP workers sleep
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        cmd = [python, "-m", "benchmarks.hf", "--worker", framework, model, "--size", size, "--foreach", foreach]
        self.name = f"{model} {framework}"
        # stderr to a file: a pipe nobody reads would block a worker that warns a lot
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115  (open for the worker's life; close() closes it)
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True
        )

    def ready(self) -> None:
        """Wait until the worker has built its step."""
        self._expect(READY)

    def _expect(self, marker: str | None) -> str:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.stderr.seek(0)
                err = self.stderr.read()[-4000:]
                raise RuntimeError(f"worker {self.name} exited {self.proc.wait()} before answering:\n{err}")
            if marker is None and line.startswith("{") or marker is not None and line.strip() == marker:
                return line
            # anything else a library printed to stdout is skipped

    def ask(self, command: str) -> dict[str, Any]:
        """One command, its answer."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        out = json.loads(self._expect(None))
        if "error" in out:
            raise RuntimeError(f"worker {self.name}: {out['error']}")
        return out

    def close(self) -> None:
        """Ask the worker to quit and wait for it (killed if it does not)."""
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def _log(msg: str) -> None:
    print(f"[bench hf] {msg}", file=sys.stderr, flush=True)


def run_model(
    model: str, frameworks: dict[str, str], size: str, warmup: int, rounds: int, foreach: str = "default"
) -> dict[str, Any]:
    """Every framework of ``frameworks`` (name -> python) on ``model``: ``warmup`` steps each, ``rounds`` rounds of
    one timed step per framework (the order rotating by one each round), then one op-counting step each."""
    workers = {}
    try:
        _log(f"{model}: starting {', '.join(frameworks)}")
        for fw, python in frameworks.items():  # side by side: their imports and set-up are not measured
            workers[fw] = Worker(python, fw, model, size, foreach)
        for w in workers.values():
            w.ready()
        names = list(workers)
        first_loss = {fw: workers[fw].ask("step")["loss"] for fw in names}
        for _ in range(warmup - 1):
            for fw in names:
                workers[fw].ask("step")
        samples: dict[str, list[dict]] = {fw: [] for fw in names}
        for r in range(rounds):
            for fw in names[r % len(names) :] + names[: r % len(names)]:
                samples[fw].append(workers[fw].ask("step"))
        # Last: after a step under a TorchDispatchMode, a torch.compile'd model records every op in later steps too
        ops = {fw: workers[fw].ask("count")["ops"] for fw in names}
    finally:
        for w in workers.values():
            w.close()
    return {fw: _summarize(samples[fw], ops[fw], first_loss[fw]) for fw in names}


def _summarize(samples: list[dict], ops: int, first_loss: float) -> dict[str, Any]:
    med = lambda key: statistics.median(s[key] for s in samples)
    row = {
        "host_ms": med("host_ms"),
        "cpu_ms": med("cpu_ms"),
        "step_ms": med("step_ms"),
        "host_ms_range": [min(s["host_ms"] for s in samples), max(s["host_ms"] for s in samples)],
        "rounds": len(samples),
        "ops_per_step": ops,
        "us_per_op_wall": R.ratio(med("host_ms") * 1e3, ops),
        "us_per_op_cpu": R.ratio(med("cpu_ms") * 1e3, ops),
        "first_loss": first_loss,
        "last_loss": samples[-1]["loss"],
    }
    if "ops_recorded" in samples[-1]:
        row["ops_recorded"] = int(statistics.median(s["ops_recorded"] for s in samples))
    return row


def run(
    quick: bool = False,
    models: tuple[str, ...] = MODELS,
    rounds: int | None = None,
    warmup: int | None = None,
    torch_xla: bool = True,
    foreach: str = "default",
) -> dict[str, Any]:
    """Measure every model; torch_xla's rows when its venv exists and ``torch_xla`` is true (else a note why not)."""
    size = "quick" if quick else "full"
    frameworks = {fw: sys.executable for fw in ("eager", *LAZYXLA)}
    python, note = torch_xla_python() if torch_xla else (None, "torch_xla: not asked for")
    if python:
        frameworks.update({fw: python for fw in TORCH_XLA})
    _log(note)
    out: dict[str, Any] = {"size": dict(zip(("hidden", "layers", "heads", "vocab", "seq", "batch"), SIZES[size]))}
    out["torch_xla"], out["foreach"], out["models"] = note, foreach, {}
    for model in models:
        warm, n = warmup or WARMUP[size], rounds or ROUNDS[size]
        out["models"][model] = run_model(model, frameworks, size, warm, n, foreach)
    return out


def table(results: dict[str, Any]) -> str:
    """The table: per model and framework, host ms (wall, CPU), step ms, ops per step and µs per op."""
    rows = []
    for model, frameworks in results["models"].items():
        floor = frameworks.get("torch_xla", {}).get("host_ms")
        cpu_floor = frameworks.get("torch_xla", {}).get("cpu_ms")
        for fw, r in frameworks.items():
            rows.append([
                model, fw, R.fmt(r["host_ms"]), R.fmt_range(*r["host_ms_range"]), R.fmt(r["cpu_ms"]),
                R.fmt(R.ratio(r["host_ms"], floor)), R.fmt(R.ratio(r["cpu_ms"], cpu_floor)), R.fmt(r["step_ms"]),
                str(r["ops_per_step"]), str(r.get("ops_recorded", "-")), R.fmt(r["us_per_op_wall"], 1),
                R.fmt(r["us_per_op_cpu"], 1),
            ])  # fmt: skip
    s = results["size"]
    notes = [
        results["torch_xla"],
        "host: from the step's start until it is handed to the device (lazyxla.sync / xm.mark_step; eager: the whole "
        "step); CPU: the step thread's CPU time over the same span; step: until the loss is read. Medians.",
        "ops/step: aten ops dispatched in one step (a TorchDispatchMode, the same on every framework); recorded: "
        "lazyxla's ops_recorded counter; µs/op: host ms / ops.",
    ]
    title = (
        f"HF training step (AdamW foreach {results['foreach']}), hidden {s['hidden']}, {s['layers']} layers, "
        f"{s['heads']} heads, vocab {s['vocab']}, seq {s['seq']}, batch {s['batch']}; frameworks interleaved, "
        f"{results_rounds(results)} rounds"
    )
    header = ["model", "framework", "host ms", "min–max", "CPU ms", "x torch_xla", "CPU x torch_xla", "step ms"]
    header += ["ops/step", "recorded", "µs/op", "CPU µs/op"]
    return R.table(title, header, rows, notes)


def results_rounds(results: dict[str, Any]) -> int:
    """The rounds the table's medians were taken over."""
    return next(r["rounds"] for fws in results["models"].values() for r in fws.values())


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """Command line: run, print the table, write the JSON (or serve as a worker)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, few rounds: a smoke test, not a measurement")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--foreach", choices=list(FOREACH), default="default", help="AdamW's foreach (default: PyTorch's)")
    p.add_argument("--no-torch-xla", action="store_true", help="skip torch_xla even when its venv exists")
    p.add_argument("--json", default=os.path.join(ROOT, "build", "bench-hf.json"))
    p.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "MODEL"), help=argparse.SUPPRESS)
    p.add_argument("--size", choices=list(SIZES), default="full", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(*a.worker, a.size, a.foreach)
        return None
    models = tuple(a.models.split(","))
    results = run(a.quick, models, a.rounds, a.warmup, torch_xla=not a.no_torch_xla, foreach=a.foreach)
    R.write_json(a.json, results)
    print(table(results))
    return results


if __name__ == "__main__":
    main()
