"""Generation benchmark: Hugging Face ``generate()`` on lazyxla against eager PyTorch on the CPU.

Usage: ``python -m benchmarks.generate [--quick] [--tokens N] [--json PATH] [--models gpt2,llama,t5]
[--caches static,dynamic] [--policies needed,all] [--modes greedy,beam]``

Each row runs in a fresh process (so its compile counts start from an empty cache; the persistent cache is
off): one model built from a random config (nothing is downloaded), one KV cache (``cache_implementation=
"static"`` or the default dynamic cache), one host-read policy (``lazyxla.config.host_read_computes``) and
one decoding mode. The process generates with the same weights on the CPU (a warm-up call) and on lazyxla (a
cold call), then ``--rounds`` rounds of one eager call, one warm lazyxla call that records every token
(``lazyxla.config.capture_generate`` off) and one that replays the decode step (on: the default,
``lazyxla/frontend/generation.py``), interleaved so that the machine's load hits all alike; a probe notes, each
time the decoding loop asks whether to go on, the time, the process's CPU time and lazyxla's counters. Per token
it reports the compiles, the IR nodes executed and the milliseconds of wall and CPU time (a token's program runs
at the host read that decides whether to stop, before the next mark). Method and results:
``docs/performance.md`` (generation).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as benchmarks.run: idle OpenMP workers sleep

import torch  # noqa: E402  (after the OpenMP setting)
import transformers as T  # noqa: E402

import lazyxla  # noqa: E402
from benchmarks import report as R  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "GENERATE-RESULT "
SIZES = {  # hidden size, layers, heads, vocabulary, prompt length
    "tiny": (32, 2, 4, 64, 5),
    "small": (128, 4, 4, 512, 8),
}
MODEL_NAMES = ("gpt2", "llama", "t5")
COUNTERS = ("compiles", "nodes_executed", "executions", "capture_replays", "ops_recorded")


def build(model: str, size: str) -> torch.nn.Module:
    """A causal LM (``gpt2``, ``llama``) or seq2seq model (``t5``) from a random config, in eval mode."""
    hidden, layers, heads, vocab, _ = SIZES[size]
    torch.manual_seed(0)
    if model == "gpt2":
        cfg = T.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=256)
        return T.GPT2LMHeadModel(cfg).eval()
    if model == "llama":
        cfg = T.LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads // 2, max_position_embeddings=256,
        )  # fmt: skip
        return T.LlamaForCausalLM(cfg).eval()
    cfg = T.T5Config(
        vocab_size=vocab, d_model=hidden, d_kv=hidden // heads, d_ff=2 * hidden, num_layers=layers, num_heads=heads,
        dropout_rate=0.0, decoder_start_token_id=0, initializer_factor=3.0,  # the default: one token repeated
    )  # fmt: skip
    return T.T5ForConditionalGeneration(cfg).eval()


MODES = {  # generate()'s arguments per decoding mode
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True, "top_k": 1},  # top-k 1: the device RNG's draws give the CPU's tokens
    "beam": {"num_beams": 2, "do_sample": False},
    "greedy_no_eos": {"do_sample": False},  # without an end-of-sequence token (run_row drops the model's)
}


def generate_kwargs(cache: str, mode: str, tokens: int) -> dict[str, Any]:
    """``generate()``'s arguments: ``tokens`` new tokens (no fewer), the decoding mode's, the cache's."""
    kw: dict[str, Any] = {"max_new_tokens": tokens, "min_new_tokens": tokens, "pad_token_id": 0, **MODES[mode]}
    if cache == "static":
        kw["cache_implementation"] = "static"
    return kw


class Probe:
    """Notes the time and lazyxla's counters each time generation's loop asks whether to go on (the model's
    ``_has_unfinished_sequences``, wrapped on the instance for one call: before each token and after the last), so a
    token's own work and its host read fall between two marks. (Not a logits processor: a captured decode token,
    ``lazyxla/frontend/generation_token.py``, runs a processor only when it records.)"""

    def __init__(self) -> None:
        self.marks: list[tuple[float, dict[str, int]]] = []

    def mark(self) -> None:
        c = lazyxla.metrics.counters()
        self.marks.append((time.perf_counter(), time.process_time(), {k: c.get(k, 0) for k in COUNTERS}))

    def generate(self, model, *args, **kw):
        ask = model._has_unfinished_sequences

        def asked(*a, **k):
            self.mark()
            return ask(*a, **k)

        model._has_unfinished_sequences = asked
        try:
            return model.generate(*args, **kw)
        finally:
            del model._has_unfinished_sequences


def timed_generate(model, prompt: torch.Tensor, kw: dict[str, Any]) -> dict[str, Any]:
    """One ``generate()`` call with a ``Probe``: its tokens (on the CPU), and per token (the prefill's first)
    the seconds and counter increments; ``setup`` is what ran before the loop, ``read`` the output's final read."""
    probe = Probe()
    probe.mark()
    out = probe.generate(model, prompt, **kw)
    probe.mark()
    tokens = out.cpu()
    probe.mark()
    marks = probe.marks

    def delta(a, b):
        return {"s": b[0] - a[0], "cpu_s": b[1] - a[1], **{k: b[2][k] - a[2][k] for k in COUNTERS}}

    # marks: start, one per loop test (N tokens + the last test), end of generate(), after the read
    per_token = [delta(a, b) for a, b in zip(marks[1:-3], marks[2:-2])]
    return {"tokens": tokens, "setup": delta(marks[0], marks[1]), "per_token": per_token, "read": delta(*marks[-2:])}


def run_row(model_name: str, cache: str, policy: str, mode: str, tokens: int, size: str, rounds: int) -> dict:
    """One row, in this process: an eager warm-up call, lazyxla's cold call (replaying the decode step) and a
    recording one, then ``rounds`` rounds of one eager, one warm recording and one warm replaying lazyxla call
    each (interleaved, so that the machine's load hits all alike)."""
    model = build(model_name, size)
    if mode == "greedy_no_eos":  # the per-token read then needs none of the token's work
        model.generation_config.eos_token_id = None
    prompt = torch.randint(3, SIZES[size][3], (2, SIZES[size][4]), generator=torch.Generator().manual_seed(1))
    kw = generate_kwargs(cache, mode, tokens)
    cpu_model = build(model_name, size)
    cpu_model.generation_config = model.generation_config
    timed_generate(cpu_model, prompt, kw)
    dev = lazyxla.device()
    model.to(dev)
    lazyxla.config.host_read_computes = policy
    lazyxla.metrics.reset()
    cold = timed_generate(model, prompt.to(dev), kw)
    with lazyxla.config.override(capture_generate=False):  # (its first call compiles its own decode programs)
        recorded_cold = timed_generate(model, prompt.to(dev), kw)
    eager, warm, recorded = [], [], []
    for _ in range(rounds):
        eager.append(timed_generate(cpu_model, prompt, kw))
        with lazyxla.config.override(capture_generate=False):
            recorded.append(timed_generate(model, prompt.to(dev), kw))
        warm.append(timed_generate(model, prompt.to(dev), kw))
    fallbacks = sorted(k for k in lazyxla.metrics.counters() if k.startswith("fallback."))
    runs = (cold, recorded_cold, *warm, *recorded)
    equal = all(torch.equal(run["tokens"], eager[0]["tokens"]) for run in runs)
    return {
        "model": model_name, "cache": cache, "policy": policy, "mode": mode, "tokens": tokens, "size": size,
        "equal_to_cpu": equal, "fallbacks": fallbacks, "cold": _drop_tokens(cold),
        "eager": [_drop_tokens(r) for r in eager], "warm": [_drop_tokens(r) for r in warm],
        "recorded": [_drop_tokens(r) for r in recorded],
    }  # fmt: skip


def _drop_tokens(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k != "tokens"}


def _child(row: tuple[str, str, str, str], tokens: int, size: str, rounds: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.generate", "--row", ",".join(row), "--tokens", str(tokens)]
    cmd += ["--size", size, "--rounds", str(rounds)]
    env = dict(os.environ, LAZYXLA_PERSISTENT_CACHE="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    """The table's numbers for one row: compiles (setup, per token, after token 3, final read), nodes per
    token, the warm calls' compiles, and median ms per decode token (wall and CPU time) of the replaying, the
    recording and the eager calls."""
    cold, warm, eager, recorded = r["cold"], r["warm"], r["eager"], r.get("recorded", [])
    per_token = [t["compiles"] for t in cold["per_token"]]
    nodes = [t["nodes_executed"] for t in cold["per_token"]]
    lazy_ms, eager_ms = _decode_ms(warm), _decode_ms(eager)
    return {
        "setup_compiles": cold["setup"]["compiles"],
        "compiles_per_token": per_token,
        "compiles_after_token_3": sum(per_token[3:]),
        "read_compiles": cold["read"]["compiles"],
        "nodes_per_token": nodes,
        "warm_compiles": sum(_total(run, "compiles") for run in warm),
        "cold_s": _total(cold, "s"),
        "lazyxla_ms_per_token": lazy_ms,
        "eager_ms_per_token": eager_ms,
        "ratio": R.ratio(lazy_ms, eager_ms),
        "recorded_ms_per_token": _decode_ms(recorded) if recorded else None,
        "lazyxla_cpu_ms_per_token": _decode_ms(warm, "cpu_s"),
        "recorded_cpu_ms_per_token": _decode_ms(recorded, "cpu_s") if recorded else None,
        "eager_cpu_ms_per_token": _decode_ms(eager, "cpu_s"),
        "ops_per_token": _decode_median(warm, "ops_recorded"),
        "programs_per_token": _decode_median(warm, "executions"),
        "replayed_tokens": sum(t["capture_replays"] for run in warm for t in run["per_token"][1:]),
        "decode_tokens": sum(len(run["per_token"]) - 1 for run in warm),
    }  # fmt: skip


def _decode_ms(runs: list[dict[str, Any]], key: str = "s") -> float:
    """Median milliseconds per decode token over ``runs`` (token 0 comes with the prefill: not counted), of wall
    time (``s``) or the process's CPU time (``cpu_s``)."""
    return statistics.median(t[key] for run in runs for t in run["per_token"][1:]) * 1e3


def _decode_median(runs: list[dict[str, Any]], key: str) -> float:
    """Median of counter ``key`` per decode token over ``runs`` (the warm calls)."""
    return statistics.median(t.get(key, 0) for run in runs for t in run["per_token"][1:])


def _total(run: dict[str, Any], key: str) -> float:
    """``key`` summed over a whole call: before the first token, every token, and the output's read."""
    return run["setup"][key] + sum(t[key] for t in run["per_token"]) + run["read"][key]


def _shown(xs: list[int], first: int = 6) -> str:
    return "[" + ", ".join(map(str, xs[:first])) + (", ..." if len(xs) > first else "") + "]"


def table(rows: list[dict[str, Any]]) -> str:
    """The generation table: one line per row."""
    lines = []
    for r in rows:
        s = r["summary"]
        nodes = s["nodes_per_token"]
        lines.append([
            f"{r['model']} {r['cache']} {r['mode']}", r["policy"], str(s["setup_compiles"]),
            _shown(s["compiles_per_token"]), str(s["compiles_after_token_3"]), str(s["read_compiles"]),
            f"{min(nodes[1:], default=0)}–{max(nodes[1:], default=0)}", str(s["warm_compiles"]), R.fmt(s["cold_s"]),
            f"{s['replayed_tokens']}/{s['decode_tokens']}", R.fmt(s["ops_per_token"]),
            R.fmt(s["programs_per_token"]), R.fmt(s["lazyxla_ms_per_token"]),
            R.fmt(s["recorded_ms_per_token"]), R.fmt(s["eager_ms_per_token"]), R.fmt(s["ratio"]),
            R.fmt(s["lazyxla_cpu_ms_per_token"]), R.fmt(s["recorded_cpu_ms_per_token"]),
            R.fmt(s["eager_cpu_ms_per_token"]),
            "yes" if r["equal_to_cpu"] and not r["fallbacks"] else "NO",
        ])  # fmt: skip
    tokens, size = rows[0]["tokens"], rows[0]["size"]
    return R.table(
        f"generate(): {tokens} new tokens, batch 2, {size} models {SIZES[size]} (hidden, layers, heads, vocab, prompt)",
        ["model cache mode", "reads compute", "setup", "compiles per token", "after tok 3", "final read",
         "nodes/token", "2nd call", "cold s", "replayed", "ops/tok", "progs/tok", "ms/tok replay", "ms/tok record",
         "ms/tok eager", "x eager", "cpu ms replay", "cpu ms record", "cpu ms eager", "= CPU"],
        lines,
        ["setup: compiles before the first token (generate's own checks of the prompt); compiles per token: at "
         "the host read after each token (token 0 with the prefill); final read: reading the output ids;",
         "nodes/token: IR nodes executed per decode token, least and most (a replayed forward's not counted); "
         "2nd call: compiles of an identical second call; replayed: decode tokens whose forward was replayed, of "
         "the warm calls'; ops/tok, progs/tok: ops recorded and programs run per warm replaying decode token "
         "(median); ms/tok: median wall ms per decode token over the warm lazyxla calls (replaying the "
         "decode step; recording every token, capture_generate off) and the eager ones; x eager: replay / eager;",
         "cpu ms: the same medians of the process's CPU time (all its threads);",
         "= CPU: the same tokens as eager on the CPU and no CPU fallback"],
    )  # fmt: skip


def run(quick: bool = False) -> list[dict[str, Any]]:
    """``make bench``'s generation section: each tiny model with a static cache, greedy and sampling, host reads
    computing what they need, 16 new tokens and 2 interleaved rounds (``quick``: GPT-2 greedy, 6 tokens, 1 round).

    Example::

        print(table(run(quick=True)))
    """
    if quick:
        models, modes, tokens, rounds = ("gpt2",), ("greedy",), 6, 1
    else:
        models, modes, tokens, rounds = MODEL_NAMES, ("greedy", "sample"), 16, 2
    rows = []
    for model in models:
        for mode in modes:
            print(f"[generate] {model} static {mode}", file=sys.stderr, flush=True)
            r = _child((model, "static", "needed", mode), tokens, "tiny", rounds)
            r["summary"] = summarize(r)
            rows.append(r)
    return rows


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny models, 6 tokens, static cache, greedy")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--size", choices=list(SIZES), default="small")
    p.add_argument("--models", default=",".join(MODEL_NAMES))
    p.add_argument("--caches", default="static,dynamic")
    p.add_argument("--policies", default="needed,all")
    p.add_argument("--modes", default="greedy", help=f"of {', '.join(MODES)}")
    p.add_argument("--rounds", type=int, default=3, help="timed calls per framework, interleaved")
    p.add_argument("--json", default=os.path.join(ROOT, "build", "generate.json"))
    p.add_argument("--row", help=argparse.SUPPRESS)  # a child process: model,cache,policy,mode
    a = p.parse_args(argv)
    if a.row:
        print(MARKER + json.dumps(run_row(*a.row.split(","), a.tokens, a.size, a.rounds)), flush=True)
        return
    if a.quick:
        a.tokens, a.size, a.caches, a.rounds = 6, "tiny", "static", 1
    rows = []
    for model in a.models.split(","):
        for cache in a.caches.split(","):
            for mode in a.modes.split(","):
                for policy in a.policies.split(","):
                    print(f"[generate] {model} {cache} {mode} reads compute {policy}", file=sys.stderr, flush=True)
                    r = _child((model, cache, policy, mode), a.tokens, a.size, a.rounds)
                    r["summary"] = summarize(r)
                    rows.append(r)
    print(table(rows))
    print(f"  machine: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}, transformers {T.__version__}")
    R.write_json(a.json, {"rows": rows})


if __name__ == "__main__":
    main()
