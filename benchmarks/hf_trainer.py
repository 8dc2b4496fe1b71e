"""HF ``Trainer``, unmodified, through the torch_xla layer: host time per optimizer step with capture on and off.

Usage: ``python -m benchmarks.hf_trainer [--rounds N] [--steps N] [--json PATH]``. The driver runs one worker
under ``python -m lazyxla.run`` (transformers and accelerate take their XLA code paths, as
``tests/clients/test_trainer.py``), which trains a tiny random Llama (``benchmarks.hf``'s ``llama``, hidden 64,
4 layers) with ``Trainer``'s defaults (fused AdamW, ``max_grad_norm=1.0``, a linear schedule), gradient
accumulation over 2 micro-batches of 2, a loss logged every step, ``--steps`` optimizer steps per run. Runs
alternate between ``lazyxla.config.capture`` on and off in the same process (``--rounds`` of each, the order
swapped every round), so the machine's load hits both alike.

Per optimizer step (between two ``on_step_end`` callbacks: both micro-batches' forward and backward, clipping,
the optimizer, the scheduler, the next batches and the logged loss's read): wall and main-thread CPU ms, programs
run (``executions``), ops recorded, programs compiled, capture replays; and the wall ms spent inside
``Trainer.training_step``. Medians over the warm steps (the last ``steps - WARM``: a captured step is verified by
two recordings per micro-batch state, and the accumulating micro-batch once more after the first replays).

Example::

    python -m benchmarks.hf_trainer --rounds 3 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM = 8  # steps from which a run's steps count (capture replays every micro-batch from step ~6)
MARK = "HF-TRAINER-RESULT "
KEYS = ("wall_ms", "cpu_ms", "step_fn_ms", "programs", "ops", "compiles", "replays")


def _examples(n: int, vocab: int, seq: int, seed: int) -> list[dict]:
    import torch  # (in the worker only: the driver imports neither torch nor transformers)

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, seq), generator=g)
    return [{"input_ids": x, "labels": x.clone()} for x in ids]


def _run(steps: int, out: str) -> list[dict]:
    """One Trainer run of ``steps`` optimizer steps; per step the figures of the module's doc."""
    import transformers as T

    import lazyxla
    from benchmarks.hf import SIZES, build

    _, _, _, vocab, seq, batch = SIZES["full"]
    net, _ = build("llama", "full")
    inside = [0.0]  # wall seconds inside Trainer.training_step (the patched one: captured or recorded)
    patched = T.Trainer.training_step

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return patched(self, *args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - start

    class Clock(T.TrainerCallback):
        def __init__(self) -> None:
            self.marks = []

        def on_step_end(self, args, state, control, **kwargs):
            c = lazyxla.metrics.counters()
            self.marks.append(
                (
                    time.perf_counter(),
                    time.thread_time(),
                    inside[0],
                    c.get("executions", 0),
                    c.get("ops_recorded", 0),
                    c.get("compiles", 0),
                    c.get("capture_replays", 0),
                )
            )

    args = T.TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=2,
        learning_rate=5e-3,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    clock = Clock()
    trainer = T.Trainer(model=net, args=args, train_dataset=_examples(4 * steps, vocab, seq, 1), callbacks=[clock])
    T.Trainer.training_step = timed
    try:
        trainer.train()
    finally:
        T.Trainer.training_step = patched
    rows = []
    for a, b in zip(clock.marks, clock.marks[1:]):
        wall, cpu, fn, *counts = (y - x for x, y in zip(a, b))
        rows.append(dict(zip(KEYS, (wall * 1e3, cpu * 1e3, fn * 1e3, *counts))))
    return rows


def worker(rounds: int, steps: int, out: str) -> None:
    import transformers as T

    import lazyxla

    T.logging.set_verbosity_error()
    samples: dict[str, list[dict]] = {"on": [], "off": []}
    for r in range(rounds):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            lazyxla.config.capture = mode == "on"
            rows = _run(steps, out)
            samples[mode] += rows[WARM - 1 :]  # (row i: from step i + 1 to step i + 2)
    print(MARK + json.dumps(samples), flush=True)


def summarize(samples: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    return {mode: {k: statistics.median(row[k] for row in rows) for k in KEYS} for mode, rows in samples.items()}


def table(summary: dict[str, dict[str, float]]) -> str:
    on, off = summary["on"], summary["off"]
    lines = [
        "| HF Trainer, tiny Llama | wall ms / step | CPU ms / step | in training_step ms | programs / step | "
        "ops recorded / step | compiles / step | replays / step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in (("capture off (lazy mode)", off), ("capture on (`LAZYXLA_CAPTURE=1`)", on)):
        lines.append(
            f"| {name} | {s['wall_ms']:.1f} | {s['cpu_ms']:.1f} | {s['step_fn_ms']:.1f} | {s['programs']:g} | "
            f"{s['ops']:g} | {s['compiles']:g} | {s['replays']:g} |"
        )
    lines.append(
        f"| on / off | {on['wall_ms'] / off['wall_ms']:.2f} | {on['cpu_ms'] / off['cpu_ms']:.2f} | "
        f"{on['step_fn_ms'] / off['step_fn_ms']:.2f} | | | | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", default=os.path.join(ROOT, "build", "bench-hf-trainer.json"))
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.rounds, a.steps, a.worker)
        return {}
    if a.steps <= WARM:
        p.error(f"--steps must be more than {WARM} (the warm-up)")
    out = os.path.join(ROOT, "build", "bench-hf-trainer")
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.setdefault("LAZYXLA_PERSISTENT_CACHE", "0")
    cmd = [sys.executable, "-m", "lazyxla.run", os.path.abspath(__file__), "--rounds", str(a.rounds)]
    proc = subprocess.run([*cmd, "--steps", str(a.steps), "--worker", out], env=env, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(MARK)), None)
    if proc.returncode or line is None:
        raise SystemExit(f"the worker failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    summary = summarize(json.loads(line[len(MARK) :]))
    print(table(summary))
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
