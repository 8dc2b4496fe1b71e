"""Attention on the lazyxla device: a timed step, and a check of each implementation against CPU eager.

``time``: one attention step (``F.scaled_dot_product_attention`` forward and backward, causal, then a sync and a
read of a gradient), warm; prints the median wall time of the steps, the programs compiled, and the host time
recording a step takes (before its sync). ``check``: for every case (causal, q_len != kv_len, bool and float
masks, rows masked whole, a scale, grouped-query heads, half precision) and every implementation the platform
has (``config.sdpa_implementation`` 'xla', and 'cudnn' on a CUDA GPU), the output and gradients against
PyTorch's CPU eager, and that the program names the implementation (``call @sdpa_cudnn``); exits 1 on a
mismatch. On a GPU, the cuDNN cases are the half-precision ones with a head dim cuDNN takes.

Example::

    python -m benchmarks.attention time --steps 30           # median ms per step, compiles, host ms
    python -m benchmarks.attention check                    # on a GPU: also 'cudnn'
    python -m benchmarks.attention check --dtypes bfloat16  # fewer programs (an XLA:GPU compile takes seconds)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.observe import metrics


def _inputs(b, n, t, s, h, dtype, seed=0, kv_heads=None):
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, n, t, h), (b, kv_heads or n, s, h), (b, kv_heads or n, s, h)]
    return [torch.randn(*shape, generator=g).to(dtype) for shape in shapes]


def time_step(steps: int, shape=(4, 8, 128, 64), dtype=torch.float32) -> dict:
    """Median wall ms of a warm causal attention step, its compiles, the host ms recording one, and the first
    step's ms (it compiles)."""
    dev = lazyxla.device()
    b, n, t, h = shape
    q, k, v = (x.to(dev).requires_grad_() for x in _inputs(b, n, t, t, h, dtype))
    walls, hosts = [], []
    for i in range(steps + 3):
        if i == 3:
            metrics.reset()
        start = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).float().square().sum().backward()
        recorded = time.perf_counter()
        lazyxla.sync()
        q.grad.view(-1)[0].item()
        q.grad = k.grad = v.grad = None
        walls.append(time.perf_counter() - start)
        hosts.append(recorded - start)
    compiles = metrics.counters().get("compiles", metrics.counters().get("compile", 0))
    return {
        "first_step_ms": 1e3 * walls[0],  # recording, lowering and compiling its program (no disk cache: see main)
        "median_ms": 1e3 * statistics.median(walls[3:]),
        "host_ms": 1e3 * statistics.median(hosts[3:]),
        "warm_compiles": compiles,
        "implementation": getattr(lazyxla.config, "sdpa_implementation", "(before the flag)"),
    }


CASES = {
    # name: (b, n, t, s, h, kwargs maker, kv_heads)
    "plain": (2, 4, 16, 16, 64, lambda t, s: {}, None),
    "causal": (2, 4, 16, 16, 64, lambda t, s: {"is_causal": True}, None),
    "causal_t<s": (2, 4, 8, 16, 64, lambda t, s: {"is_causal": True}, None),
    "causal_t>s": (2, 4, 16, 8, 64, lambda t, s: {"is_causal": True}, None),
    "bool_mask": (2, 4, 16, 16, 64, lambda t, s: {"attn_mask": torch.rand(t, s) > 0.3}, None),
    "float_mask_scale": (2, 4, 16, 16, 64, lambda t, s: {"attn_mask": torch.randn(2, 1, t, s), "scale": 0.3}, None),
    "padding_mask": (2, 4, 16, 16, 64, lambda t, s: {"attn_mask": torch.arange(s).expand(2, 1, 1, s) < 9}, None),
    "rows_masked_whole": (2, 4, 16, 16, 64, lambda t, s: {"attn_mask": torch.arange(t)[:, None] < 11}, None),
    "gqa": (2, 8, 16, 16, 64, lambda t, s: {"enable_gqa": True}, 2),
}


def _run(fn, q, k, v, kwargs, dev):
    leaves = [x.detach().to(dev).requires_grad_() for x in (q, k, v)]
    moved = {key: val.to(dev) if isinstance(val, torch.Tensor) else val for key, val in kwargs.items()}
    out = fn(*leaves, **moved)
    grad_out = torch.ones_like(out)
    out.backward(grad_out)
    return out.detach(), [x.grad for x in leaves]


def check(dtypes=(torch.float32, torch.bfloat16, torch.float16)) -> int:
    """Each case in each of ``dtypes`` under each implementation the platform has, against CPU eager; the
    failures' count."""
    impls = ["xla"] + (["cudnn"] if lazyxla.platform() == "gpu" else [])
    dev, failures = lazyxla.device(), 0
    for dtype in dtypes:
        tol = 2e-4 if dtype == torch.float32 else 3e-2
        for name, (b, n, t, s, h, make, kv_heads) in CASES.items():
            torch.manual_seed(0)
            q, k, v = _inputs(b, n, t, s, h, dtype, kv_heads=kv_heads)
            kwargs = make(t, s)
            kwargs = {key: val.to(dtype) if isinstance(val, torch.Tensor) and val.is_floating_point() else val
                      for key, val in kwargs.items()}  # fmt: skip
            want, want_grads = _run(F.scaled_dot_product_attention, *(x.float() for x in (q, k, v)),
                                    {key: val.float() if isinstance(val, torch.Tensor) and val.is_floating_point()
                                     else val for key, val in kwargs.items()}, "cpu")  # fmt: skip
            for impl in impls:
                with lazyxla.config.override(sdpa_implementation=impl):
                    try:
                        out, grads = _run(F.scaled_dot_product_attention, q, k, v, kwargs, dev)
                        text = lazyxla.debug.stablehlo_text([out, *grads])
                        results = [out.float().cpu(), *(g.float().cpu() for g in grads)]
                    except ValueError as e:  # 'cudnn' refusing a case it cannot take, at the call
                        print(f"{dtype} {name} {impl}: refused ({e})")
                        continue
                named = f"call @sdpa_{impl}" in text or "enable_gqa" in str(kwargs)
                close = all(
                    torch.allclose(got, ref, rtol=tol, atol=tol, equal_nan=True)
                    for got, ref in zip(results, [want, *want_grads])
                )
                pairs = zip(results, [want, *want_grads])
                worst = max(float((got - ref).abs().nan_to_num().max()) for got, ref in pairs)
                print(f"{dtype} {name} {impl}: {'ok' if close and named else 'MISMATCH'} (max |diff| {worst:.2e}"
                      f"{'' if named else ', the program does not name the implementation'})")  # fmt: skip
                failures += not (close and named)
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("time", "check"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dtype", default="float32", help="time: the inputs' dtype")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16", help="check: the dtypes to check")
    args = parser.parse_args(argv)
    if args.what == "time":
        lazyxla.config.persistent_cache = False  # the first step compiles: its time is the compile's
        print(time_step(args.steps, dtype=getattr(torch, args.dtype)))
        return 0
    failures = check(tuple(getattr(torch, name) for name in args.dtypes.split(",")))
    print(f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
