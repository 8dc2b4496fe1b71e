"""Fully sharded data parallel (FSDP v1) training of a tiny GPT, written for torch_xla.

The layout of torch_xla's ``test_train_mp_mnist_fsdp_with_ckpt.py``: ``xmp.spawn`` starts one replica per device,
each wraps the model with ``XlaFullyShardedDataParallel`` (so it holds 1/N of the parameters), reads its part of
the data through a ``DistributedSampler`` and ``pl.MpDeviceLoader``, steps the optimizer with ``optimizer.step()``
(the gradients are already reduce-scattered), saves its shards with ``model.get_shard_metadata()``, and the master
consolidates the checkpoint, which every replica then loads into the plain model. It imports only torch_xla:

    CPU_NUM_DEVICES=2 python -m lazyxla.run examples/torch_xla/fsdp_gpt.py --ckpt-dir /tmp/fsdp_gpt

Each configuration (``--configs``) trains the same initial model on the same data:

* ``transformer``: ``transformer_auto_wrap_policy`` (one unit per decoder layer), each layer with gradient
  checkpointing (``checkpoint_module`` through ``auto_wrapper_callable``), flattened parameters, gradients clipped
  with ``model.clip_grad_norm_``;
* ``size``: ``size_based_auto_wrap_policy`` (a unit per feed-forward ``Linear`` and per decoder layer, whose
  attention stays whole: a "force leaf"), parameters sharded along dim 0 (``shard_param_on_dim_0``);
* ``nested``: layers wrapped by hand, default options, two micro-batches per step accumulated under
  ``model.no_sync()``;
* ``replicated``: no FSDP, the usual data parallelism (``xm.reduce_gradients``): the baseline of the memory report.

Printed per replica: ``loss config=C rank=R step=S value=V grad_norm=G compiles=N fallbacks=F`` per step (the
programs compiled so far, the ops that ran on the CPU), then ``memory config=C rank=R
params=P full_params=F optimizer_state=O full_optimizer_state=FO device_bytes=B`` (what the replica holds after
training: its parameter shards and optimizer state against the unsharded model's, and every buffer alive on its
device), and ``consolidated config=C rank=R loss=L fsdp_loss=L2`` (the held-out loss of the consolidated
checkpoint loaded into the plain model, and of the FSDP model).
"""

import argparse
import functools
import gc
import os

import torch
import torch.nn.functional as F
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
from tiny_gpt import DecoderLayer, TinyGPT, device_bytes, token_dataset
from torch.utils.data import DataLoader, DistributedSampler
from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
from torch_xla.distributed.fsdp import checkpoint_module, consolidate_sharded_model_checkpoints
from torch_xla.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

CONFIGS = ("transformer", "size", "nested", "replicated")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {CONFIGS}")
    parser.add_argument("--batch-size", type=int, default=4, help="per replica")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-norm", type=float, default=0.5, help="gradient clipping of 'transformer'")
    parser.add_argument("--min-num-params", type=int, default=10_000, help="of 'size'")
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def build(config, flags):
    """TinyGPT wrapped for ``config``; the unwrapped model's parameter count."""
    model = TinyGPT()
    full_params = sum(p.numel() for p in model.parameters())
    if config == "transformer":
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
        checkpointed = lambda m, *args, **kwargs: FSDP(checkpoint_module(m), *args, **kwargs)  # noqa: E731
        model = FSDP(model, auto_wrap_policy=policy, auto_wrapper_callable=checkpointed, flatten_parameters=True)
    elif config == "size":
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=flags.min_num_params)
        model = FSDP(model, auto_wrap_policy=policy, shard_param_on_dim_0=True)
    elif config == "nested":
        for i, layer in enumerate(model.layers):
            model.layers[i] = FSDP(layer)
        model = FSDP(model)
    return model, full_params


def loss_of(model, tokens, targets):
    return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


def train(flags, config, device):
    torch.manual_seed(flags.seed)  # the same initial weights in every replica
    world, rank = xr.world_size(), xr.global_ordinal()
    model, full_params = build(config, flags)
    if config == "replicated":
        model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=flags.lr)
    data = token_dataset(flags.batch_size * flags.steps * world, seed=0)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = pl.MpDeviceLoader(DataLoader(data, batch_size=flags.batch_size, sampler=sampler, drop_last=True), device)
    max_norm = flags.max_norm if config == "transformer" else float("inf")  # inf: only measures the norm
    for step, (tokens, targets) in enumerate(loader):
        optimizer.zero_grad()
        if config == "nested":  # two micro-batches, one reduce-scatter
            half = flags.batch_size // 2
            with model.no_sync():
                first = loss_of(model, tokens[:half], targets[:half]) / 2
                first.backward()
            second = loss_of(model, tokens[half:], targets[half:]) / 2
            second.backward()
            loss = first.detach() + second.detach()
        else:
            loss = loss_of(model, tokens, targets)
            loss.backward()
        if config == "replicated":
            xm.reduce_gradients(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        else:
            grad_norm = model.clip_grad_norm_(max_norm)
        optimizer.step()  # not xm.optimizer_step: FSDP has reduce-scattered the gradients
        xm.add_step_closure(_report_step, args=(config, rank, step, loss, grad_norm))
    report_memory(config, model, optimizer, full_params)
    if config != "replicated":
        check_consolidation(flags, config, model, optimizer, device)


def report_memory(config, model, optimizer, full_params):
    xm.mark_step()
    gc.collect()
    state = [t for s in optimizer.state.values() for t in s.values() if t.dim() > 0]  # not AdamW's step count
    print(
        f"memory config={config} rank={xr.global_ordinal()} params={sum(p.numel() for p in model.parameters())} "
        f"full_params={full_params} optimizer_state={sum(t.numel() for t in state)} "
        f"full_optimizer_state={2 * full_params} device_bytes={device_bytes()}",
        flush=True,
    )


def check_consolidation(flags, config, model, optimizer, device):
    """Save the shards, consolidate them on the master, load the result into the plain model everywhere."""
    rank, world = xr.global_ordinal(), xr.world_size()
    prefix = os.path.join(flags.ckpt_dir, config)
    ckpt = {
        "model": model.state_dict(),
        "shard_metadata": model.get_shard_metadata(),
        "optimizer": optimizer.state_dict(),
    }
    xm.save(ckpt, f"{prefix}_rank-{rank:08d}-of-{world:08d}.pth", master_only=False)
    xm.rendezvous(f"{config} saved")
    if xm.is_master_ordinal(local=False):
        consolidate_sharded_model_checkpoints(ckpt_prefix=prefix, ckpt_suffix="_rank-*-of-*.pth")
    xm.rendezvous(f"{config} consolidated")
    plain = TinyGPT().to(device)
    plain.load_state_dict(torch.load(f"{prefix}_consolidated.pth")["model"])
    tokens, targets = token_dataset(8, seed=1)[:]
    tokens, targets = tokens.to(device), targets.to(device)
    with torch.no_grad():
        consolidated, sharded = loss_of(plain, tokens, targets), loss_of(model.eval(), tokens, targets)
    xm.mark_step()
    print(
        f"consolidated config={config} rank={rank} loss={consolidated.item()!r} fsdp_loss={sharded.item()!r}",
        flush=True,
    )


def _report_step(config, rank, step, loss, grad_norm):
    print(
        f"loss config={config} rank={rank} step={step} value={loss.item()!r} grad_norm={grad_norm.item()!r} "
        f"compiles={met.counter_value('UncachedCompile') or 0} fallbacks={cpu_fallbacks()}",
        flush=True,
    )


def cpu_fallbacks():
    """How many ops ran on the CPU instead of the device (torch_xla counts them as aten::<op>; a host read,
    aten::_local_scalar_dense, is counted there too but is not one)."""
    names = [n for n in met.counter_names() if n.startswith("aten::") and n != "aten::_local_scalar_dense"]
    return sum(met.counter_value(n) for n in names)


def _mp_fn(index, flags):
    device = xm.xla_device()
    for config in flags.configs.split(","):
        train(flags, config, device)
        gc.collect()


if __name__ == "__main__":
    FLAGS = parse_args()
    os.makedirs(FLAGS.ckpt_dir, exist_ok=True)  # before the replicas start: each writes its shards there
    xmp.spawn(_mp_fn, args=(FLAGS,))
