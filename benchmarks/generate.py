"""Generation benchmark: Hugging Face ``generate()`` on lazyxla against eager PyTorch on the CPU.

Usage: ``python -m benchmarks.generate [--quick] [--tokens N] [--json PATH] [--models gpt2,llama,t5]
[--caches static,dynamic] [--policies needed,all] [--modes greedy,beam]``

Each row runs in a fresh process (so its compile counts start from an empty cache; the persistent cache is
off): one model built from a random config (nothing is downloaded), one KV cache (``cache_implementation=
"static"`` or the default dynamic cache), one host-read policy (``lazyxla.config.host_read_computes``) and
one decoding mode. The process generates on the CPU (eager, a warm-up call then a timed one) and twice on
lazyxla (cold, then warm), with a logits processor that notes, once per token, the time and lazyxla's
counters. Per token it reports the compiles, the IR nodes executed and the milliseconds (a token's program
runs at the host read that decides whether to stop, after the processor's call). Method and results:
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
COUNTERS = ("compiles", "nodes_executed", "executions")


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
        dropout_rate=0.0, decoder_start_token_id=0, initializer_factor=20.0,
    )  # fmt: skip  (a larger initializer: the default one's random T5 repeats one token)
    return T.T5ForConditionalGeneration(cfg).eval()


def generate_kwargs(cache: str, mode: str, tokens: int) -> dict[str, Any]:
    """``generate()``'s arguments: greedy, sampling (top-k 1: the CPU's tokens are reproducible) or beam search."""
    kw: dict[str, Any] = {"max_new_tokens": tokens, "min_new_tokens": tokens, "pad_token_id": 0}
    kw.update({"greedy": {"do_sample": False}, "sample": {"do_sample": True, "top_k": 1}}.get(mode, {}))
    if mode == "beam":
        kw.update(num_beams=2, do_sample=False)
    if cache == "static":
        kw["cache_implementation"] = "static"
    return kw


class Probe(T.LogitsProcessor):
    """Notes the time and lazyxla's counters each time generation asks for the next token's scores (returns
    them unchanged: it records no op)."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, dict[str, int]]] = []

    def mark(self) -> None:
        c = lazyxla.metrics.counters()
        self.marks.append((time.perf_counter(), {k: c[k] for k in COUNTERS}))

    def __call__(self, input_ids, scores):
        self.mark()
        return scores


def timed_generate(model, prompt: torch.Tensor, kw: dict[str, Any]) -> dict[str, Any]:
    """One ``generate()`` call with a ``Probe``: its tokens (on the CPU), and per token (the prefill's first)
    the seconds and counter increments; ``setup`` is what ran before the first token's scores, ``read`` the
    output's final read."""
    probe = Probe()
    probe.mark()
    out = model.generate(prompt, logits_processor=T.LogitsProcessorList([probe]), **kw)
    probe.mark()
    tokens = out.cpu()
    probe.mark()
    marks = probe.marks

    def delta(a, b):
        return {"s": b[0] - a[0], **{k: b[1][k] - a[1][k] for k in COUNTERS}}

    per_token = [delta(a, b) for a, b in zip(marks[1:-2], marks[2:-1])]
    return {"tokens": tokens, "setup": delta(marks[0], marks[1]), "per_token": per_token, "read": delta(*marks[-2:])}


def run_row(model_name: str, cache: str, policy: str, mode: str, tokens: int, size: str) -> dict[str, Any]:
    """One row, in this process: CPU eager (warm-up, timed), then lazyxla cold and warm."""
    model = build(model_name, size)
    prompt = torch.randint(3, SIZES[size][3], (2, SIZES[size][4]), generator=torch.Generator().manual_seed(1))
    kw = generate_kwargs(cache, mode, tokens)
    timed_generate(model, prompt, kw)
    eager = timed_generate(model, prompt, kw)
    dev = lazyxla.device()
    model.to(dev)
    lazyxla.config.host_read_computes = policy
    lazyxla.metrics.reset()
    cold = timed_generate(model, prompt.to(dev), kw)
    warm = timed_generate(model, prompt.to(dev), kw)
    fallbacks = sorted(k for k in lazyxla.metrics.counters() if k.startswith("fallback."))
    equal = all(torch.equal(run["tokens"], eager["tokens"]) for run in (cold, warm))
    return {
        "model": model_name, "cache": cache, "policy": policy, "mode": mode, "tokens": tokens, "size": size,
        "equal_to_cpu": equal, "fallbacks": fallbacks,
        "eager": _drop_tokens(eager), "cold": _drop_tokens(cold), "warm": _drop_tokens(warm),
    }  # fmt: skip


def _drop_tokens(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k != "tokens"}


def _child(row: tuple[str, str, str, str], tokens: int, size: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.generate", "--row", ",".join(row), "--tokens", str(tokens), "--size", size]
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
    token (first decode token, last), the warm call's compiles, and median ms per decode token."""
    cold, warm, eager = r["cold"], r["warm"], r["eager"]
    per_token = [t["compiles"] for t in cold["per_token"]]
    nodes = [t["nodes_executed"] for t in cold["per_token"]]
    decode = slice(1, None)  # token 0 comes with the prefill
    lazy_ms = statistics.median(t["s"] for t in warm["per_token"][decode]) * 1e3
    eager_ms = statistics.median(t["s"] for t in eager["per_token"][decode]) * 1e3
    return {
        "setup_compiles": cold["setup"]["compiles"],
        "compiles_per_token": per_token,
        "compiles_after_token_3": sum(per_token[3:]),
        "read_compiles": cold["read"]["compiles"],
        "nodes_per_token": nodes,
        "warm_compiles": _total(warm, "compiles"),
        "cold_s": _total(cold, "s"),
        "lazyxla_ms_per_token": lazy_ms,
        "eager_ms_per_token": eager_ms,
        "ratio": R.ratio(lazy_ms, eager_ms),
    }  # fmt: skip


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
            f"{nodes[1] if len(nodes) > 1 else '-'}–{nodes[-1]}", str(s["warm_compiles"]), R.fmt(s["cold_s"]),
            R.fmt(s["lazyxla_ms_per_token"]), R.fmt(s["eager_ms_per_token"]), R.fmt(s["ratio"]),
            "yes" if r["equal_to_cpu"] and not r["fallbacks"] else "NO",
        ])  # fmt: skip
    tokens, size = rows[0]["tokens"], rows[0]["size"]
    return R.table(
        f"generate(): {tokens} new tokens, batch 2, {size} models {SIZES[size]} (hidden, layers, heads, vocab, prompt)",
        ["model cache mode", "reads compute", "setup", "compiles per token", "after tok 3", "final read",
         "nodes/token", "2nd call", "cold s", "ms/tok lazyxla", "ms/tok eager", "x eager", "= CPU"],
        lines,
        ["setup: compiles before the first token (generate's own checks of the prompt); compiles per token: at "
         "the host read after each token (token 0 with the prefill); final read: reading the output ids;",
         "nodes/token: IR nodes executed for the first decode token and the last; 2nd call: compiles of an "
         "identical second call; ms/tok: median per decode token, lazyxla's second (warm) call and eager's;",
         "= CPU: the same tokens as eager on the CPU and no CPU fallback"],
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny models, 6 tokens, static cache, greedy")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--size", choices=list(SIZES), default="small")
    p.add_argument("--models", default="gpt2,llama,t5")
    p.add_argument("--caches", default="static,dynamic")
    p.add_argument("--policies", default="needed,all")
    p.add_argument("--modes", default="greedy")
    p.add_argument("--json", default=os.path.join(ROOT, "build", "generate.json"))
    p.add_argument("--row", help=argparse.SUPPRESS)  # a child process: model,cache,policy,mode
    a = p.parse_args(argv)
    if a.row:
        print(MARKER + json.dumps(run_row(*a.row.split(","), a.tokens, a.size)), flush=True)
        return
    if a.quick:
        a.tokens, a.size, a.caches = 6, "tiny", "static"
    rows = []
    for model in a.models.split(","):
        for cache in a.caches.split(","):
            for mode in a.modes.split(","):
                for policy in a.policies.split(","):
                    print(f"[generate] {model} {cache} {mode} reads compute {policy}", file=sys.stderr, flush=True)
                    r = _child((model, cache, policy, mode), a.tokens, a.size)
                    r["summary"] = summarize(r)
                    rows.append(r)
    print(table(rows))
    cpu = platform.processor() or platform.machine()
    print(f"  machine: {cpu}, {os.cpu_count()} cores; torch {torch.__version__}, transformers {T.__version__}")
    R.write_json(a.json, {"rows": rows})


if __name__ == "__main__":
    main()
