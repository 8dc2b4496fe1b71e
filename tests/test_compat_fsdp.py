"""torch_xla's sharded data parallelism on lazyxla: FSDP v1 (``XlaFullyShardedDataParallel``) and ZeRO-1
(``ZeroRedundancyOptimizer``), and the ``output=`` of ``xm.reduce_scatter`` / ``xm.all_gather``.

Two scripts of ``examples/torch_xla`` run in two replicas each (``xmp.spawn`` under ``python -m lazyxla.run``, in
a subprocess bounded by a timeout whose whole process group is killed on expiry). Every replica's loss and the
global gradient norm of every step are compared with one CPU-eager process training the same model with AdamW
on the global batch; the checkpoints they write are compared with the eager model; what each replica holds is
measured (its parameter shards, optimizer state and every buffer alive on its device) against the unsharded
model. The other tests check the layer in this process, as one replica (shards are then whole, but every code
path runs): naming, policies, state dicts and consolidation, checkpointing, ``no_sync``, errors.
"""

from __future__ import annotations

import copy
import functools
import gc
import importlib.util
import inspect
import math
import re
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

import lazyxla
import lazyxla.compat as compat
from lazyxla.compat.torch_xla.core import xla_model as xm
from lazyxla.compat.torch_xla.distributed import fsdp as xfsdp
from lazyxla.compat.torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
from lazyxla.compat.torch_xla.distributed.fsdp import checkpoint_module, consolidate_sharded_state_dicts, wrap
from lazyxla.compat.torch_xla.distributed.fsdp.consolidate_sharded_ckpts import main as consolidate_main
from lazyxla.compat.torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel import TrainingState
from lazyxla.compat.torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer
from tests.util import ROOT, run_python

EXAMPLES = ROOT / "examples" / "torch_xla"
WORLD = 2
STEPS, BATCH, LR, MAX_NORM = 4, 4, 1e-3, 0.5  # passed to both scripts explicitly
SCRIPT_ARGS = ["--steps", str(STEPS), "--batch-size", str(BATCH), "--lr", str(LR), "--max-norm", str(MAX_NORM)]
RTOL = 1e-5  # losses and gradient norms: relative difference from CPU eager
# Parameters after 4 AdamW steps: an element whose gradient is near zero or ill-conditioned (attention's key
# projection) moves by up to lr per step whatever its gradient's last bits, so end points are compared to 1/20
# of a step. A plain single-process lazyxla run differs from CPU eager by 2e-5 on this model too.
PARAM_ATOL = LR / 20
FLOAT = r"([-+]?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|nan|inf))"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_torch_xla_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpt = _load("tiny_gpt")  # the model and data of both scripts (plain PyTorch)


def _loss(model, tokens, targets):
    return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


def _eager(max_norm: float):
    """CPU eager, one process: each replica's loss at the current weights, AdamW on their mean (what averaging
    the replicas' gradients computes), the global gradient norm (clipped to ``max_norm``)."""
    torch.manual_seed(1)
    model = gpt.TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    data = gpt.token_dataset(BATCH * STEPS * WORLD, seed=0)
    batches = [
        list(DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, WORLD, r, shuffle=False)))
        for r in range(WORLD)
    ]
    records = {}
    for step in range(STEPS):
        opt.zero_grad()
        losses = [_loss(model, *batches[r][step]) for r in range(WORLD)]
        (sum(losses) / WORLD).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        for r, loss in enumerate(losses):
            records[(r, step)] = (loss.item(), norm.item())
    return model, records


def _held_out_loss(model) -> float:
    with torch.no_grad():
        return _loss(model, *gpt.token_dataset(8, seed=1)[:]).item()


def _run(script: str, tmp_path, *extra: str) -> tuple[str, Path]:
    """The script's stdout, and its checkpoint folder: one that does not exist yet (the script creates it)."""
    ckpt_dir = tmp_path / "ckpt" / script.removesuffix(".py")
    args = ["-m", "lazyxla.run", str(EXAMPLES / script), "--ckpt-dir", str(ckpt_dir), *SCRIPT_ARGS, *extra]
    proc = run_python(args, tmp_path, timeout=600, CPU_NUM_DEVICES=str(WORLD))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout, ckpt_dir


def _steps(stdout: str, prefix: str) -> dict:
    """``{(rank, step): (loss, grad_norm, compiles, fallbacks)}`` of the per-step records (replicas share the
    pipe: a record may start on another's line)."""
    pattern = prefix + rf"rank=(\d+) step=(\d+) value={FLOAT} grad_norm={FLOAT} compiles=(\d+) fallbacks=(\d+)"
    out = {}
    for m in re.finditer(pattern, stdout):
        key = (int(m[1]), int(m[2]))
        assert key not in out, f"{prefix}{key} printed twice"
        out[key] = (float(m[3]), float(m[4]), int(m[5]), int(m[6]))
    return out


def _fields(stdout: str, record: str) -> list[dict]:
    """Every ``record k=v ...`` of integer fields (and a word-valued config) as a dict."""
    found = []
    for m in re.finditer(rf"{record} ((?:\w+=(?:\d+|[a-z]+) ?)+)", stdout):
        found.append({k: (v if k == "config" else int(v)) for k, v in re.findall(r"(\w+)=(\w+)", m[1])})
    return found


def _check_steps(got: dict, want: dict, steady_from: int = 1) -> float:
    """Losses and gradient norms within RTOL of eager; nothing compiled after step ``steady_from`` and nothing
    ran on the CPU. Returns the largest relative difference."""
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    worst = 0.0
    for key, (loss, norm) in want.items():
        g_loss, g_norm, _, fallbacks = got[key]
        worst = max(worst, abs(g_loss - loss) / abs(loss), abs(g_norm - norm) / abs(norm))
        assert fallbacks == 0, f"ops ran on the CPU at {key}"
    assert worst < RTOL, (got, want)
    for rank in range(WORLD):
        assert got[(rank, STEPS - 1)][2] == got[(rank, steady_from)][2], f"compiles after step {steady_from}"
    return worst


def _param_diff(state: dict, model: nn.Module) -> float:
    fresh = copy.deepcopy(model)
    fresh.load_state_dict(state)  # strict: every name of the tied model is there
    return max((fresh.state_dict()[k] - v).abs().max().item() for k, v in model.state_dict().items())


# --- two replicas --------------------------------------------------------------------------------------------

FSDP_CONFIGS = ("transformer", "size", "nested")


def test_fsdp_script_shards_parameters_and_trains_like_one_process(tmp_path):
    # (the script's "replicated" baseline, plain data parallelism, is left out: its device bytes are in the docs)
    stdout, ckpt_dir = _run("fsdp_gpt.py", tmp_path, "--configs", ",".join(FSDP_CONFIGS))
    eager = {MAX_NORM: _eager(MAX_NORM), math.inf: _eager(math.inf)}
    memory = {(m["config"], m["rank"]): m for m in _fields(stdout, "memory")}
    full = sum(p.numel() for p in gpt.TinyGPT().parameters())
    report = []
    for config in FSDP_CONFIGS:
        model, want = eager[MAX_NORM if config == "transformer" else math.inf]
        worst_loss = _check_steps(_steps(stdout, rf"loss config={config} "), want)
        for rank in range(WORLD):
            m = memory[(config, rank)]
            # a replica holds its shards only: half of the parameters (and of AdamW's state), padding aside
            assert m["full_params"] == full and m["params"] <= 0.52 * full, m
            assert m["optimizer_state"] == 2 * m["params"], m
            # every buffer alive on the device: the shards, their gradients and AdamW's two moments (4 x 1/2 of
            # the model) and next to nothing else: no full parameter survives a step
            assert m["device_bytes"] <= 1.03 * 4 * 4 * m["params"], m
        state = torch.load(ckpt_dir / f"{config}_consolidated.pth")["model"]
        diff = _param_diff(state, model)
        assert diff < PARAM_ATOL, (config, diff)
        pattern = rf"consolidated config={config} rank=\d+ loss={FLOAT} fsdp_loss={FLOAT}"
        losses = [(float(m[1]), float(m[2])) for m in re.finditer(pattern, stdout)]
        assert len(losses) == WORLD
        held_out = _held_out_loss(model)
        for consolidated, sharded in losses:
            assert consolidated == pytest.approx(sharded, rel=1e-6) == pytest.approx(held_out, rel=RTOL)
        for rank in range(WORLD):
            shard = torch.load(ckpt_dir / f"{config}_rank-{rank:08d}-of-{WORLD:08d}.pth")
            assert (shard["shard_metadata"]["rank"], shard["shard_metadata"]["world_size"]) == (rank, WORLD)
        m = memory[(config, 0)]
        report.append(
            f"{config}: params {m['params'] / full:.4f} of the model, device bytes {m['device_bytes']} "
            f"({m['device_bytes'] / (16 * full):.3f} of params+grads+AdamW replicated), losses {worst_loss:.1e}, "
            f"params {diff:.1e}"
        )
    print("\n".join(report))


def test_zero1_script_shards_optimizer_state_and_trains_like_one_process(tmp_path):
    stdout, ckpt_dir = _run("zero1_gpt.py", tmp_path)
    model, want = _eager(MAX_NORM)
    # the step after the reload compiles again (the loaded state is new device data); the next one does not
    worst = _check_steps(_steps(stdout, "loss "), want, steady_from=STEPS - 2)
    for m in _fields(stdout, "memory"):
        # the model is replicated; the optimizer keeps 1/2 of each parameter (its master copy) and its state
        assert m["master_weights"] * WORLD == m["params"]
        assert m["optimizer_state"] * WORLD == m["full_optimizer_state"]
        # params and their gradients (replicated), master weights and AdamW's state (1/2): 3.5 params
        assert m["device_bytes"] <= 1.02 * 4 * (2 + 3 / WORLD) * m["params"], m
    diff = _param_diff(torch.load(ckpt_dir / "zero1_final.pth"), model)
    assert diff < PARAM_ATOL, diff
    for rank in range(WORLD):  # reduce_scatter / all_gather into output= tensors
        x = [torch.arange(4.0 * WORLD).reshape(2 * WORLD, 2) + 100 * r for r in range(WORLD)]
        shard = sum(x)[2 * rank : 2 * rank + 2].tolist()
        gathered = [torch.cat([t[:1] for t in x]).tolist(), torch.cat([t[1:2] * 2 for t in x]).tolist()]
        line = f"collectives rank={rank} same=True reduce_scatter={shard} all_gather={gathered}"
        assert line in stdout, stdout
    m = _fields(stdout, "memory")[0]
    print(
        f"zero1: optimizer state {m['optimizer_state'] / m['full_optimizer_state']:.3f} of AdamW's, device bytes "
        f"{m['device_bytes']} ({m['device_bytes'] / (16 * m['params']):.3f} of params+grads+AdamW replicated), "
        f"losses {worst:.1e}, params {diff:.1e}"
    )


# --- one replica, in this process ----------------------------------------------------------------------------


def test_torch_xla_names_resolve_to_the_layer():
    assert compat.install()
    try:
        import torch_xla.distributed.fsdp as fsdp  # the layer must be installed first (the fixture-free way)
        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer as Zero
        from torch_xla.utils.checkpoint import checkpoint

        assert fsdp.XlaFullyShardedDataParallel is FSDP and fsdp.checkpoint_module is checkpoint_module
        assert transformer_auto_wrap_policy is wrap.transformer_auto_wrap_policy and Zero is ZeroRedundancyOptimizer
        assert checkpoint.__module__ == "lazyxla.compat.torch_xla.utils.checkpoint"
    finally:
        compat.uninstall()


SIGNATURES = {
    FSDP.__init__: (
        "module reshard_after_forward flatten_parameters execute_sharding_on_init optimization_barrier_in_forward "
        "optimization_barrier_in_backward sync_on_finalization disable_reshard_on_root compute_dtype buffer_dtype "
        "fp32_reduce_scatter sharding_groups sharding_rank sharding_world_size shard_param_on_dim_0 "
        "pin_layout_in_collective_ops reduce_scatter_bucket_size_mb coalesce_all_gather_ops auto_wrap_policy "
        "auto_wrapper_callable param_init_fn _shard_size_multiple _use_xla_patched_linear _debug_dummy_forward_pass "
        "_debug_msg _debug_print _debug_dummy_all_gather_op _debug_dummy_all_reduce_op "
        "_debug_dummy_reduce_scatter_op _debug_dummy_optimization_barrier_op"
    ),
    FSDP.clip_grad_norm_: "max_norm norm_type groups",
    ZeroRedundancyOptimizer.__init__: (
        "params optimizer_class optimizer_dtype grad_clipping max_norm pin_layout sharding_groups grad_norm_groups "
        "lazy_init bucket_cap_mb_all_gather bucket_cap_mb_reduce_scatter use_grad_acc_hook save_master_weights "
        "higher_cc_precision defaults"
    ),
    wrap.size_based_auto_wrap_policy: "module recurse unwrapped_params min_num_params force_leaf_modules "
    "exclude_wrap_modules",
    wrap.transformer_auto_wrap_policy: "module recurse unwrapped_params transformer_layer_cls",
    wrap.recursive_wrap: "module auto_wrap_policy wrapper_cls ignored_modules ignored_params only_wrap_children kwargs",
    xfsdp.consolidate_sharded_model_checkpoints: "ckpt_prefix ckpt_suffix save_path save_model",
    xfsdp.consolidate_sharded_state_dicts: "state_dict_list shard_metadata",
}


@pytest.mark.parametrize("fn", list(SIGNATURES), ids=lambda f: f.__qualname__)
def test_signatures_take_torch_xla_argument_names(fn):
    assert [p for p in inspect.signature(fn).parameters if p != "self"] == SIGNATURES[fn].split()


def _small_gpt():
    """TinyGPT with one layer: the in-process tests compile less."""
    return gpt.TinyGPT(depth=1)


def _transformer_fsdp(**options):
    policy = functools.partial(wrap.transformer_auto_wrap_policy, transformer_layer_cls={gpt.DecoderLayer})
    return FSDP(_small_gpt(), auto_wrap_policy=policy, **options)


def test_units_names_placeholders_and_consolidation(dev, tmp_path):
    torch.manual_seed(0)
    original = _small_gpt()
    torch.manual_seed(0)
    model = _transformer_fsdp()
    units = [m for m in model.modules() if isinstance(m, FSDP)]
    assert len(units) == 2 and all(isinstance(layer, FSDP) for layer in model.module.module.layers)
    assert all("_fsdp_shard_FSDP_SHARD_SEPARATOR_" in n for n, _ in model.named_parameters())
    assert all(p.device == dev for p in model.parameters())
    head = model.module.module.head
    assert head.weight.numel() == 1  # freed: the placeholder until the unit gathers
    model(gpt.token_dataset(2, seed=0)[:][0].to(dev)).sum().backward()
    assert head.weight.numel() == 1 and all(u.training_state == TrainingState.IDLE for u in units)
    names = dict(model.get_original_names_and_sharded_parameters())
    assert set(names) == {n for n, _ in original.named_parameters()}  # the tied head is embed.weight's name
    meta = model.get_shard_metadata()
    assert (meta["rank"], meta["world_size"]) == (0, 1) and meta["shared_info"] == {"embed.weight": ["head.weight"]}
    assert set(meta["shard_info"]) == {"", "_fsdp_wrapped_module.layers.0"}
    # consolidation is independent of training: compare with the initial weights, saved before any step
    lazyxla.sync()
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    full = consolidate_sharded_state_dicts([state], meta)
    restored = _small_gpt()
    restored.load_state_dict(full)  # strict, tied names included
    for name, value in original.state_dict().items():
        assert torch.equal(restored.state_dict()[name], value), name
    torch.save({"model": state, "shard_metadata": meta}, tmp_path / "ckpt_rank-0.pth")
    consolidate_main(["--ckpt_prefix", str(tmp_path / "ckpt"), "--ckpt_suffix", "_rank-*.pth"])
    saved = torch.load(tmp_path / "ckpt_consolidated.pth")["model"]
    assert saved.keys() == full.keys() and all(torch.equal(saved[k], full[k]) for k in full)


def _side_by_side(model, opt, dev, steps: int, clip=None):
    """Train ``model`` (built after ``torch.manual_seed(1)``) with ``opt`` on the device, and the small GPT with
    AdamW in CPU eager, on the same batches; each step's loss and gradient norm must agree (the norm ``clip()`` returns
    before the step, else the optimizer's ``grad_norm``). Returns the eager model and the compiles after each step."""
    torch.manual_seed(1)
    eager = _small_gpt()
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=LR)
    data = gpt.token_dataset(4 * steps, seed=0)
    compiles = []
    for step in range(steps):
        tokens, targets = data[4 * step : 4 * step + 4]
        loss = _loss(model, tokens.to(dev), targets.to(dev))
        loss.backward()
        norm = clip() if clip else None
        opt.step()
        opt.zero_grad()
        xm.mark_step()
        norm = norm if clip else opt.grad_norm
        compiles.append(lazyxla.metrics.counters()["compiles"])
        eager_loss = _loss(eager, tokens, targets)
        eager_loss.backward()
        eager_norm = torch.nn.utils.clip_grad_norm_(eager.parameters(), MAX_NORM)
        eager_opt.step()
        eager_opt.zero_grad()
        assert loss.item() == pytest.approx(eager_loss.item(), rel=RTOL)
        assert norm.item() == pytest.approx(eager_norm.item(), rel=RTOL)
    return eager, compiles


def test_one_replica_trains_like_eager(dev):
    """Flattened units, each layer checkpointed, gradients clipped (two replicas: test_fsdp_script_...)."""
    torch.manual_seed(1)
    checkpointed = lambda m, *a, **k: FSDP(checkpoint_module(m), *a, **k)  # noqa: E731
    model = _transformer_fsdp(flatten_parameters=True, auto_wrapper_callable=checkpointed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    eager, compiles = _side_by_side(model, opt, dev, 3, clip=lambda: model.clip_grad_norm_(MAX_NORM))
    assert compiles[2] == compiles[1], compiles  # the third step compiled nothing
    lazyxla.sync()
    full = consolidate_sharded_state_dicts([model.state_dict()], model.get_shard_metadata())
    assert _param_diff({k: v.cpu() for k, v in full.items()}, eager) < PARAM_ATOL


def test_no_sync_keeps_full_gradients_until_the_next_synchronized_backward(dev):
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    model = FSDP(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), FSDP(nn.Linear(8, 3))))
    model.load_state_dict({k: v for k, v in zip(model.state_dict(), _sharded_like(model, eager))})
    x1, x2 = torch.randn(4, 6), torch.randn(4, 6)
    with model.no_sync():
        model(x1.to(dev)).square().sum().backward()
    assert all(p.grad is None for p in model.parameters())  # nothing reduce-scattered yet
    model(x2.to(dev)).square().sum().backward()
    for x in (x1, x2):
        eager(x).square().sum().backward()
    shards = model.state_dict(keep_vars=True)  # the parameters under their state-dict names
    grads = consolidate_sharded_state_dicts([{n: p.grad.cpu() for n, p in shards.items()}], model.get_shard_metadata())
    for name, p in eager.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-6)


def _sharded_like(model: FSDP, eager: nn.Module) -> list[torch.Tensor]:
    """``eager``'s parameters as ``model``'s (one-replica) shards: flattened and padded like them."""
    named = dict(eager.named_parameters())
    out = []
    for name, shard in model.get_original_names_and_sharded_parameters():
        flat = named[name].detach().flatten()
        out.append(F.pad(flat, [0, shard.numel() - flat.numel()]))
    return out


def test_checkpoint_module_recomputes_the_forward_in_backward(dev):
    calls = []

    class Counted(nn.Linear):
        def forward(self, x):
            calls.append(1)
            return super().forward(x)

    torch.manual_seed(0)
    plain = FSDP(nn.Sequential(nn.Linear(4, 4), FSDP(Counted(4, 4))))
    torch.manual_seed(0)
    checkpointed = FSDP(nn.Sequential(nn.Linear(4, 4), FSDP(checkpoint_module(Counted(4, 4)))))
    x = torch.randn(3, 4)
    grads = []
    for model in (plain, checkpointed):
        calls.clear()
        model(x.to(dev)).sum().backward()
        grads.append([p.grad.cpu() for p in model.parameters()])
        assert len(calls) == (1 if model is plain else 2)  # checkpointed: the forward runs again in backward
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    calls.clear()
    with torch.no_grad():
        checkpointed(x.to(dev))
    assert len(calls) == 1


def test_unused_submodule_and_always_wrap_policy(dev):
    """torch_xla's test_fsdp_auto_wrap: a unit whose output does not reach the loss must not break backward."""

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 4), nn.Linear(16, 4)

        def forward(self, x):
            return self.fc1(x), self.fc2(x)

    model = FSDP(TwoHeads(), auto_wrap_policy=wrap.always_wrap_policy)
    assert isinstance(model.module.module.fc1, FSDP) and isinstance(model.module.module.fc2, FSDP)
    hid1, _ = model(torch.zeros(16, 16, device=dev))
    hid1.sum().backward()
    xm.mark_step()
    fc1, fc2 = model.module.module.fc1, model.module.module.fc2
    assert all(p.grad is not None for p in fc1.parameters()) and all(p.grad is None for p in fc2.parameters())
    assert not fc1.has_full_params and not fc2.has_full_params  # every unit gave its full parameters back


def test_size_based_policy_keeps_attention_whole_and_never_wraps_module_lists():
    assert nn.MultiheadAttention in wrap.size_based_auto_wrap_policy.FORCE_LEAF_MODULES
    policy = functools.partial(wrap.size_based_auto_wrap_policy, min_num_params=10_000)
    model = FSDP(gpt.TinyGPT(), auto_wrap_policy=policy)
    wrapped = {type(m.module.module).__name__ for m in model.modules() if isinstance(m, FSDP) and m is not model}
    # the feed-forward Linears, then each layer's remainder: its attention (16k parameters) is a "force leaf" that
    # the search does not enter, and, as in torch_xla's recursive_wrap, is then not wrapped on its own either
    assert wrapped == {"DecoderLayer", "Linear"}
    lam = functools.partial(wrap.lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, nn.LayerNorm))
    model = FSDP(gpt.TinyGPT(), auto_wrap_policy=lam)
    assert sum(isinstance(m, FSDP) for m in model.modules()) == 1 + 5  # 2 norms per layer, the final one


def test_a_dropped_model_is_freed_by_reference_counting(dev):
    """No reference cycle: lazyxla freezes the garbage collector at the first sync, so a model in a cycle would
    never be freed."""
    model = _transformer_fsdp(flatten_parameters=True)
    opt = torch.optim.AdamW(model.parameters())
    tokens, targets = gpt.token_dataset(2, seed=0)[:]
    _loss(model, tokens.to(dev), targets.to(dev)).backward()
    opt.step()
    _loss(model, tokens.to(dev), targets.to(dev))  # a forward whose backward never comes
    xm.mark_step()
    alive = weakref.ref(model)
    gc.disable()
    try:
        del model, opt
        assert alive() is None
    finally:
        gc.enable()


class _Scaled(nn.Module):
    """A linear layer followed by a buffer (cast to the buffer dtype under FSDP)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        return self.fc(x) * self.scale


def test_mixed_precision_computes_in_bf16_and_keeps_fp32_shards(dev):
    torch.manual_seed(0)
    eager = nn.Sequential(_Scaled(), nn.GELU(), nn.Linear(8, 2))
    model = FSDP(nn.Sequential(_Scaled(), nn.GELU(), nn.Linear(8, 2)), compute_dtype=torch.bfloat16)
    state = dict(zip(model.state_dict(), _sharded_like(model, eager)))
    model.load_state_dict({**model.state_dict(), **state})
    x = torch.randn(5, 8)
    out = model(x.to(dev))
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and model.module.module[0].scale.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    torch.testing.assert_close(out.float().cpu(), eager(x), rtol=2e-2, atol=2e-2)
    # consolidation gives the buffer back its own dtype, under the unwrapped model's name
    lazyxla.sync()
    full = consolidate_sharded_state_dicts([model.state_dict()], model.get_shard_metadata())
    assert full["0.scale"].dtype == torch.float32 and set(full) == set(eager.state_dict())


def test_wrong_uses_raise_as_torch_xla_does():
    with pytest.raises(RuntimeError, match="forward"):
        FSDP(nn.ModuleList([nn.Linear(2, 2)]))
    with pytest.raises(RuntimeError, match="already wrapped"):
        FSDP(FSDP(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="NOT be FullyShardedDataParallel"):
        FSDP(nn.Sequential(FSDP(nn.Linear(2, 2))), auto_wrap_policy=wrap.always_wrap_policy)
    with pytest.raises(TypeError, match="fp32"):
        FSDP(nn.Linear(2, 2).half())
    with pytest.raises(ValueError, match="compute_dtype"):
        FSDP(nn.Linear(2, 2), compute_dtype=torch.int32)
    with pytest.raises(ValueError, match="sharding_rank"):
        FSDP(nn.Linear(2, 2), sharding_groups=[[0]])
    with pytest.raises(NotImplementedError, match="_debug_dummy_all_gather_op"):
        FSDP(nn.Linear(2, 2), _debug_dummy_all_gather_op=True)
    inner = FSDP(nn.Linear(2, 2))
    outer = FSDP(nn.Sequential(inner))
    outer(torch.zeros(1, 2, device=lazyxla.device()))
    with pytest.raises(AssertionError, match="root"):
        inner.clip_grad_norm_(1.0)


def test_collective_outputs_take_the_results_data(dev):
    x = torch.arange(6.0).reshape(2, 3).to(dev)
    out = torch.zeros(7, device=dev)  # any shape: the result replaces the data, as in torch_xla
    assert xm.reduce_scatter(xm.REDUCE_SUM, x, 0.5, 0, 1, output=out) is out
    assert out.shape == (2, 3) and torch.equal(out.cpu(), x.cpu() / 2)
    outs = [torch.zeros(1, device=dev), torch.zeros(1, device=dev)]
    assert xm.all_gather([x, 2 * x], output=outs, pin_layout=False) is outs
    assert torch.equal(outs[1].cpu(), 2 * x.cpu())
    with pytest.raises(ValueError, match="length"):
        xm.all_gather([x, x], output=[out], pin_layout=False)
    with pytest.raises(TypeError, match="list of Tensors"):
        xm.reduce_scatter(xm.REDUCE_SUM, [x], 1.0, 0, 1, output=out)
    with pytest.raises(TypeError, match="on the device"):
        xm.all_gather(x, output=torch.zeros(2, 3))


def test_zero1_in_one_replica_trains_like_eager_and_reloads(dev, tmp_path):
    torch.manual_seed(1)
    model = _small_gpt().to(dev)
    opt = ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.AdamW, lr=LR, max_norm=MAX_NORM, save_master_weights=True
    )
    eager, _ = _side_by_side(model, opt, dev, 2)
    assert _param_diff({k: v.cpu() for k, v in model.state_dict().items()}, eager) < PARAM_ATOL
    state = xm._maybe_convert_to_cpu(opt.state_dict())
    assert {"base_state", "shape_info", "sharded_master_weights"} <= set(state)
    # torch_xla's test_zero1_load: another model and optimizer (other weights, other lr) take the saved state
    other = _small_gpt().to(dev)
    reloaded = ZeroRedundancyOptimizer(other.parameters(), torch.optim.AdamW, lr=0.5, max_norm=MAX_NORM)
    reloaded.load_state_dict(state)
    again = xm._maybe_convert_to_cpu(reloaded.state_dict())
    assert again["param_groups"] == state["param_groups"] and again["shape_info"] == state["shape_info"]
    for index, entry in state["base_state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(again["base_state"][index][key], value, rtol=0, atol=0)
    for (name, p), q in zip(model.named_parameters(), other.parameters()):  # the master weights, gathered
        assert torch.equal(p.cpu(), q.cpu()), name


def test_zero1_accumulation_hook_and_lazy_init(dev):
    torch.manual_seed(0)
    eager = nn.Linear(5, 3)
    model = nn.Linear(5, 3).to(dev)
    model.load_state_dict(eager.state_dict())
    opt = ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.SGD, lr=0.1, grad_clipping=False, use_grad_acc_hook=True, lazy_init=True
    )
    with pytest.raises(AssertionError, match="init_zero"):
        opt.step()
    opt.sharding_groups = [[0]]
    opt.init_zero()
    with pytest.raises(AssertionError, match="already inited"):
        opt.sharding_groups = [[0]]
    x1, x2 = torch.randn(2, 5), torch.randn(2, 5)
    for x in (x1, x2):
        model(x.to(dev)).sum().backward()
        eager(x).sum().backward()
    assert model.weight.grad is None  # moved into main_grad by the hook
    opt.step()
    torch.optim.SGD(eager.parameters(), lr=0.1).step()
    torch.testing.assert_close(model.weight.cpu(), eager.weight.detach(), rtol=1e-6, atol=1e-6)
