"""Functions the SPMD DTensor tests run in fresh processes (one process, 8 fake CPU devices)."""

from __future__ import annotations

import torch

STEPS = 4


def _layout(dt) -> tuple | None:
    """The lazyxla partition spec of a DTensor's (global) local tensor, or of a plain tensor; None when
    replicated."""
    import lazyxla

    got = lazyxla.spmd.get_sharding(getattr(dt, "_local_tensor", dt))
    return None if got is None else tuple(got[1])


def _step(w1, w2, x, lr=0.1):
    """One SGD step of a two-layer MLP (column- then row-parallel); returns the loss."""
    loss = ((x @ w1).relu() @ w2).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        for w in (w1, w2):
            w.sub_(lr * w.grad)
            w.grad = None
    return loss


def basics(rank: int) -> dict:
    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    out: dict = {}
    torch.manual_seed(0)
    a, b = torch.randn(16, 8), torch.randn(8, 4)

    flat = init_device_mesh("lazyxla", (8,))
    out["flat_size"] = flat.size()
    da = distribute_tensor(a, flat, [Shard(0)])
    db = distribute_tensor(b, flat, [Replicate()])
    out["flat_layouts"] = (_layout(da), _layout(db))
    out["local_shape"] = tuple(da.to_local().shape)  # the global view: the local tensor is the whole tensor
    c = da @ db
    out["matmul"] = (c.placements, (c.full_tensor().cpu() - a @ b).abs().max().item())
    e = (da * 2 + 1).exp().sum()
    out["sum"] = (e.placements, e.full_tensor().cpu().item(), (a * 2 + 1).exp().sum().item())
    r = da.redistribute(flat, [Shard(1)])
    out["redistributed"] = (r.placements, _layout(r), (r.full_tensor().cpu() - a).abs().max().item())
    v = da.view(8, 16)  # a view's shape argument is the global shape
    out["view"] = (v.placements, tuple(v.shape), (v.full_tensor().cpu() - a.view(8, 16)).abs().max().item())

    mesh = init_device_mesh("lazyxla", (2, 4), mesh_dim_names=("dp", "tp"))
    out["mesh_shape"] = (tuple(mesh.shape), mesh.mesh_dim_names, mesh["tp"].size())
    x0, w10, w20 = torch.randn(16, 8), torch.randn(8, 32) / 3, torch.randn(32, 8) / 6
    x = distribute_tensor(x0, mesh, [Shard(0), Replicate()])
    w1 = distribute_tensor(w10.clone().requires_grad_(), mesh, [Replicate(), Shard(1)])
    w2 = distribute_tensor(w20.clone().requires_grad_(), mesh, [Replicate(), Shard(0)])
    out["layouts"] = {"x": _layout(x), "w1": _layout(w1), "w2": _layout(w2)}
    tp = distribute_tensor(w10, mesh["tp"], [Shard(1)])  # a sub-mesh: replicated over the other dimension
    out["submesh_layout"] = _layout(tp)

    loss = ((x @ w1).relu() @ w2).pow(2).mean()
    out["stablehlo"] = lazyxla.debug.stablehlo_text([loss._local_tensor])
    loss.backward()
    out["grad_placements"] = (w1.grad.placements, w2.grad.placements)
    out["grad_layouts"] = (_layout(w1.grad), _layout(w2.grad))
    cw1, cw2 = w10.clone().requires_grad_(), w20.clone().requires_grad_()
    ref = ((x0 @ cw1).relu() @ cw2).pow(2).mean()
    ref.backward()
    out["loss"] = (loss.full_tensor().cpu().item(), ref.item())
    out["grads"] = max(
        (w1.grad.full_tensor().cpu() - cw1.grad).abs().max().item(),
        (w2.grad.full_tensor().cpu() - cw2.grad).abs().max().item(),
    )
    w1.grad = w2.grad = None

    # a repeated step: one program per step, no compile after the second
    lazyxla.sync()
    losses, ref_losses, compiles = [], [], [lazyxla.metrics.counters()["compiles"]]
    cw1, cw2 = w10.clone().requires_grad_(), w20.clone().requires_grad_()
    for _ in range(STEPS):
        losses.append(_step(w1, w2, x).full_tensor())
        lazyxla.sync()
        compiles.append(lazyxla.metrics.counters()["compiles"])
        ref_losses.append(_step(cw1, cw2, x0).item())
    out["losses"] = [v.cpu().item() for v in losses]
    out["ref_losses"] = ref_losses
    out["compiles"] = compiles
    out["params"] = max(
        (w1.full_tensor().cpu() - cw1.detach()).abs().max().item(),
        (w2.full_tensor().cpu() - cw2.detach()).abs().max().item(),
    )
    out["param_layouts"] = (_layout(w1), _layout(w2))
    return out


def _tiny_llama():
    """A tiny random LlamaForCausalLM (nothing downloaded), on the CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _fsdp_step(model, opt, ids):
    """One AdamW step of a causal LM on ``ids``; returns the loss (not read)."""
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


class _MixedPrecisionReference:
    """CPU eager of FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32)``: fp32 parameters and
    AdamW, the forward and backward on a bf16 copy of them, gradients made fp32."""

    def __init__(self, model, lr: float) -> None:
        import copy

        self.master, self.low = model, copy.deepcopy(model).to(torch.bfloat16)
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)

    def step(self, ids) -> float:
        with torch.no_grad():
            for lo, hi in zip(self.low.parameters(), self.master.parameters()):
                lo.copy_(hi)
        loss = self.low(input_ids=ids, labels=ids).loss
        loss.backward()
        for lo, hi in zip(self.low.parameters(), self.master.parameters()):
            hi.grad, lo.grad = lo.grad.float(), None
        self.opt.step()
        self.opt.zero_grad()
        return loss.item()


def fsdp_llama(rank: int, reshard_after_forward: bool = True, mixed: bool = False) -> dict:
    """FSDP2 (``fully_shard`` per decoder layer and at the root) on a (8,) lazyxla mesh in SPMD mode: 4 AdamW
    (foreach) steps of a tiny Llama, against the same steps in CPU eager; parameter layouts, per-device parts,
    compiles and programs per step. ``mixed``: bf16 parameters in the step, fp32 gradient reduction."""
    import copy

    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ref = _tiny_llama()
    model = copy.deepcopy(ref).to(lazyxla.device())
    mesh = init_device_mesh("lazyxla", (8,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    kwargs["mp_policy"] = policy or MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    lr = 1e-3 if mixed else 1e-2
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    if mixed:
        ref_step = _MixedPrecisionReference(ref, lr).step
    else:
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr, foreach=True)
        ref_step = lambda ids: _fsdp_step(ref, ref_opt, ids).item()  # noqa: E731
    torch.manual_seed(1)
    batches = [torch.randint(0, 64, (8, 16)) for _ in range(STEPS)]

    out: dict = {}
    lazyxla.sync()
    losses, compiles, executions = [], [], []
    for ids in batches:
        before = lazyxla.metrics.counters()
        losses.append(_fsdp_step(model, opt, ids.to(lazyxla.device())))
        lazyxla.sync()
        after = lazyxla.metrics.counters()
        compiles.append(after["compiles"] - before["compiles"])
        executions.append(after["executions"] - before["executions"])
    ref_losses = [ref_step(ids) for ids in batches]
    out["losses"], out["ref_losses"] = [v.cpu().item() for v in losses], ref_losses
    out["compiles"], out["executions"] = compiles, executions
    names = [n for n, _ in ref.named_parameters()]
    params = dict(model.named_parameters())
    out["param_types"] = sorted({type(p).__name__ for p in params.values()})
    out["layouts"] = {n: _layout(params[n]) for n in names}
    out["placements"] = sorted({str(p.placements) for p in params.values()})
    ref_params = dict(ref.named_parameters())
    out["param_diffs"] = {n: (params[n].full_tensor().cpu() - ref_params[n].detach()).abs().max().item() for n in names}
    state = opt.state[params[names[0]]]
    out["exp_avg_layout"] = _layout(state["exp_avg"])
    # per device: the fraction of each parameter's elements its buffer holds
    shards = {n: lazyxla.spmd.local_shards(params[n]._local_tensor) for n in names}
    out["fractions"] = {n: sorted({s.data.numel() / params[n].numel() for s in parts}) for n, parts in shards.items()}
    out["shard_devices"] = sorted({len(parts) for parts in shards.values()})
    # the all-gather outputs between steps (FSDP frees them): held laid out as the parameter, not replicated
    groups = [m._get_fsdp_state()._fsdp_param_group for m in (*model.model.layers, model)]
    gathered = [o for g in groups for fp in g.fsdp_params for o in fp.all_gather_outputs]
    out["gathered"] = (
        len(gathered),
        sorted({s.data.numel() / o.numel() for o in gathered for s in lazyxla.spmd.local_shards(o)}),
        sorted({str(o.dtype) for o in gathered}),
    )
    return out


# --- tensor and sequence parallel (parallelize_module) ---------------------------------------------------------


def _rope_frequencies(head_dim: int, seqlen: int, theta: float = 10000.0) -> torch.Tensor:
    """torchtitan's ``precompute_freqs_cis``: complex rotations, one per position and frequency."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    return torch.polar(torch.ones(seqlen, head_dim // 2), torch.outer(torch.arange(seqlen), freqs).float())


def _rotate(x, freqs_cis):
    """torchtitan's ``apply_rotary_emb`` for one of q, k: pairs of features as complex numbers, rotated."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, pairs.shape[-1])
    return torch.view_as_real(pairs * freqs_cis).flatten(3).type_as(x)


class _Attention(torch.nn.Module):
    """torchtitan's attention: q/k/v/o projections, rotary embeddings (complex), causal SDPA. Heads are counted from
    the projection's width (``-1``), so the module runs on a rank's part of the heads as on all of them."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x, freqs_cis):
        bs, seqlen, _ = x.shape
        q, k, v = (w(x).view(bs, seqlen, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = _rotate(q, freqs_cis), _rotate(k, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class _FeedForward(torch.nn.Module):
    """torchtitan's SwiGLU MLP: ``w2(silu(w1(x)) * w3(x))``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = torch.nn.Linear(dim, hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, dim, bias=False)
        self.w3 = torch.nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class _Block(torch.nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = torch.nn.RMSNorm(dim), torch.nn.RMSNorm(dim)
        self.attention, self.feed_forward = _Attention(dim, n_heads), _FeedForward(dim, hidden)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class _Llama(torch.nn.Module):
    """A tiny torchtitan-style Llama: token embedding, decoder blocks (rotary embeddings from a complex buffer),
    final norm, output projection."""

    def __init__(self, vocab: int = 64, dim: int = 32, n_heads: int = 8, hidden: int = 64, layers: int = 2):
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(_Block(dim, n_heads, hidden) for _ in range(layers))
        self.norm, self.output = torch.nn.RMSNorm(dim), torch.nn.Linear(dim, vocab, bias=False)
        self.register_buffer("freqs_cis", _rope_frequencies(dim // n_heads, 32), persistent=True)

    checkpoint = False  # activation checkpointing by torch.utils.checkpoint.checkpoint around each block

    def forward(self, ids):
        from torch.utils.checkpoint import checkpoint

        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = (
                checkpoint(layer, h, self.freqs_cis, use_reentrant=False)
                if self.checkpoint
                else layer(h, self.freqs_cis)
            )
        return self.output(self.norm(h))


def _llama_loss(model, ids):
    logits = model(ids).float()  # (as torchtitan: the loss in fp32, bf16 logits included)
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _mlp_loss(model, x):
    return model(x).pow(2).mean()


def _tp_plan(kind: str) -> dict:
    """torchtitan's tensor-parallel plan: q/k/v and w1/w3 column-wise, o and w2 row-wise; with sequence parallel
    (``"llama"``) the norms hold sequence shards and each block's input is gathered (``PrepareModuleInput``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if kind == "mlp":
        return {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(2):
        p = f"layers.{i}."
        plan.update(
            {
                p + "attention_norm": SequenceParallel(),
                p + "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
                ),
                p + "attention.wq": ColwiseParallel(),
                p + "attention.wk": ColwiseParallel(),
                p + "attention.wv": ColwiseParallel(),
                p + "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                p + "ffn_norm": SequenceParallel(),
                p + "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                p + "feed_forward.w1": ColwiseParallel(),
                p + "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                p + "feed_forward.w3": ColwiseParallel(),
            }
        )
    return plan


def tensor_parallel(rank: int, kind: str) -> dict:
    """``parallelize_module`` over ``init_device_mesh("lazyxla", (8,))`` in SPMD mode: a SwiGLU MLP (``"mlp"``:
    column- and row-wise linears) or a tiny torchtitan-style Llama (``"llama"``: tensor and sequence parallel), 4
    AdamW (foreach) steps against the same steps in CPU eager; parameter placements and layouts, compiles and
    programs per step."""
    import copy

    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    if kind == "mlp":
        ref, loss_of = _FeedForward(32, 64), _mlp_loss
        batches = [torch.randn(4, 16, 32) for _ in range(STEPS)]
    else:
        ref, loss_of = _Llama(), _llama_loss
        batches = [torch.randint(0, 64, (4, 16)) for _ in range(STEPS)]
    model = copy.deepcopy(ref).to(lazyxla.device())
    mesh = init_device_mesh("lazyxla", (8,))
    parallelize_module(model, mesh, _tp_plan(kind))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=True)

    return _train_and_measure(model, opt, ref, ref_opt, loss_of, batches)


def _train_and_measure(model, opt, ref, ref_opt, loss_of, batches, to_device=None, seq_axis="dim0") -> dict:
    """Train ``model`` (lazyxla, parallelized) and ``ref`` (CPU eager) on ``batches`` (put on the device by
    ``to_device``); losses, compiles and programs per step, how many activations the first step's program holds
    split over the sequence on mesh axis ``seq_axis``, and each parameter's placements, layout, difference and
    per-device fraction."""
    import lazyxla

    to_device = to_device or (lambda batch: batch.to(lazyxla.device()))

    out: dict = {}
    lazyxla.sync()
    losses, ref_losses, compiles, executions = [], [], [], []
    for batch in batches:
        before = lazyxla.metrics.counters()
        loss = loss_of(model, to_device(batch))
        if not losses:  # activations laid out as the plan says: (batch, sequence / 8, features) under sequence parallel
            text = lazyxla.debug.stablehlo_text([loss])
            sequence = f'{{"{seq_axis}"}}, {{}}]'
            out["sequence_sharded"] = text.count("[{}, " + sequence) + text.count('[{"dp"}, ' + sequence)
            out["batch_sharded"] = text.count('[{"dp"}, {}]')
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
        lazyxla.sync()
        after = lazyxla.metrics.counters()
        compiles.append(after["compiles"] - before["compiles"])
        executions.append(after["executions"] - before["executions"])
        ref_loss = loss_of(ref, batch)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(ref_loss.item())
    out["loss_types"] = sorted({type(v).__name__ for v in losses})
    out["losses"], out["ref_losses"] = [v.cpu().item() for v in losses], ref_losses
    out["compiles"], out["executions"] = compiles, executions
    # a plain parameter beside DTensor ones (a plan that leaves it alone) is its own global tensor
    params = {n: getattr(p, "_local_tensor", p) for n, p in model.named_parameters()}
    dtensors, ref_params = dict(model.named_parameters()), dict(ref.named_parameters())
    out["placements"] = {n: str(getattr(p, "placements", None)) for n, p in dtensors.items()}
    out["layouts"] = {n: _layout(p) for n, p in params.items()}
    values = {n: p.detach().cpu() for n, p in params.items()}
    out["param_diffs"] = {n: (v - ref_params[n].detach()).abs().max().item() for n, v in values.items()}
    # tests/test_training.py's tolerance
    close = {n: torch.allclose(v, ref_params[n].detach(), rtol=1e-4, atol=1e-5) for n, v in values.items()}
    out["params_close"] = close
    # per device: the fraction of each parameter's elements its buffer holds, measured from the buffers
    out["fractions"] = {
        n: sorted({s.data.numel() / p.numel() for s in lazyxla.spmd.local_shards(p)}) for n, p in params.items()
    }
    return out


def from_local(rank: int) -> dict:
    """``DTensor.from_local`` of a user's tensor and ``to_local`` back in SPMD mode, differentiated, against CPU
    eager: the local tensor given is the global tensor, laid out as the placements say, and ``to_local()`` is a
    user's tensor holding the global value."""
    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("lazyxla", (8,))
    torch.manual_seed(0)
    a, b, c = torch.randn(16, 8), torch.randn(8, 16), torch.randn(16, 16)
    x = a.to(lazyxla.device()).requires_grad_()
    d = DTensor.from_local(x * 1, mesh, [Shard(0)])
    out: dict = {"layout": _layout(d), "placements": str(d.placements), "shape": tuple(d.shape)}
    y = d @ distribute_tensor(b, mesh, [Replicate()])
    local = y.to_local() * c.to(lazyxla.device())  # a user's tensor, mixed with another user's tensor
    out["local_type"], out["local_shape"] = type(local).__name__, tuple(local.shape)
    z = DTensor.from_local(local.sin(), mesh, [Shard(1)])
    out["z_layout"] = _layout(z)
    loss = z.sum()
    loss.backward()
    ref_x = a.clone().requires_grad_()
    ref = ((ref_x @ b) * c).sin().sum()
    ref.backward()
    out["loss"] = (loss.full_tensor().cpu().item(), ref.item())
    out["grad_type"] = type(x.grad).__name__
    out["grad"] = (x.grad.cpu() - ref_x.grad).abs().max().item()
    return out


def fsdp_tp(rank: int) -> dict:
    """2-D: ``init_device_mesh("lazyxla", (2, 4), mesh_dim_names=("dp", "tp"))``, tensor and sequence parallel on
    "tp" and FSDP2 (``fully_shard`` per block and at the root) on "dp", 4 AdamW (foreach) steps of the tiny
    torchtitan-style Llama against CPU eager; placements, layouts, per-device fractions, compiles, programs."""
    import copy

    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    ref = _Llama()
    batches = [torch.randint(0, 64, (4, 16)) for _ in range(STEPS)]
    model = copy.deepcopy(ref).to(lazyxla.device())
    mesh = init_device_mesh("lazyxla", (2, 4), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], _tp_plan("llama"))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=True)
    # data parallel: the global batch split over "dp", as the global view says (a rank's part is its rows)
    to_device = lambda batch: distribute_tensor(batch, mesh["dp"], [Shard(0)]).to_local()  # noqa: E731
    return _train_and_measure(model, opt, ref, ref_opt, _llama_loss, batches, to_device, seq_axis="tp")


def _hf_tp_plan(layers: int) -> dict:
    """The tensor-parallel plan of transformers' Llama (its ``base_model_tp_plan``, written as
    ``parallelize_module`` styles): q/k/v, gate/up column-wise, o and down row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[p + name] = ColwiseParallel()
        plan[p + "self_attn.o_proj"] = plan[p + "mlp.down_proj"] = RowwiseParallel()
    return plan


def hf_tensor_parallel(rank: int) -> dict:
    """transformers' tiny Llama (its own attention, real-valued rotary embeddings, grouped KV heads) with tensor
    parallel over the "tp" dimension of a (4, 2) mesh: 4 AdamW steps against CPU eager. The embeddings, norms and
    head stay plain tensors, so a foreach step mixes them with DTensors: the error is DTensor's own, as on CUDA,
    and per-tensor AdamW runs. A mesh over 2 of the 8 devices is refused with what to do instead."""
    import copy

    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    out: dict = {}
    try:  # a mesh over some of the devices: not a layout of one program
        parallelize_module(
            copy.deepcopy(_tiny_llama()).to(lazyxla.device()), init_device_mesh("lazyxla", (2,)), _hf_tp_plan(2)
        )
    except ValueError as e:
        out["small_mesh_error"] = str(e)
    ref = _tiny_llama()
    torch.manual_seed(1)
    batches = [torch.randint(0, 64, (4, 16)) for _ in range(STEPS)]
    model = copy.deepcopy(ref).to(lazyxla.device())
    parallelize_module(model, init_device_mesh("lazyxla", (4, 2), mesh_dim_names=("dp", "tp"))["tp"], _hf_tp_plan(2))
    loss_of = lambda m, ids: m(input_ids=ids, labels=ids).loss  # noqa: E731
    try:  # foreach over DTensor and plain parameters
        loss_of(model, batches[0].to(lazyxla.device())).backward()
        torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True).step()
    except RuntimeError as e:
        out["mixed_foreach_error"] = str(e)
    model.zero_grad(set_to_none=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
    out.update(_train_and_measure(model, opt, ref, ref_opt, loss_of, batches, seq_axis="tp"))
    return out


def random_ops(rank: int) -> dict:
    """Random ops on DTensors in SPMD mode (dropout, ``init.trunc_normal_`` as torchtitan initializes weights, a
    factory under a TP module's dropout): each against the same op on the plain global tensor under the same seed,
    which is what DTensor's offset tracker gives on CUDA (shards of one draw, replicas equal)."""
    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dev = lazyxla.device()
    mesh = init_device_mesh("lazyxla", (2, 4), mesh_dim_names=("dp", "tp"))
    out: dict = {}

    def draws(make):  # dropout, truncated-normal init, then a plain draw: the generator's advance shows in it
        torch.manual_seed(7)
        dropped = torch.nn.functional.dropout(make(torch.ones(16, 8, device=dev)), 0.5)
        weight = torch.nn.init.trunc_normal_(make(torch.empty(16, 8, device=dev)), std=0.02)
        full = [getattr(t, "full_tensor", lambda t=t: t)().cpu() for t in (dropped, weight)]
        return full + [torch.rand(4, device=dev).cpu()]

    plain = draws(lambda t: t)
    out["kept"], out["rows"] = (plain[0] != 0).float().mean().item(), len({tuple(r.tolist()) for r in plain[1]})
    for name, placements in {"shard": [Shard(0), Shard(1)], "replicate": [Replicate(), Replicate()]}.items():
        got = draws(lambda t, p=placements: distribute_tensor(t, mesh, p))
        out[name] = [bool((a == b).all()) for a, b in zip(got, plain)]
    # without DTensor: a new tensor annotated over two mesh axes, then dropout (its mask's layout is XLA's choice,
    # which jax must name on a mesh with both axes)
    two_d = lazyxla.spmd.Mesh(list(range(8)), (2, 4), ("a", "b"))
    got = draws(lambda t: lazyxla.spmd.mark_sharding(t, two_d, ("a", "b")))
    out["annotated"] = [bool((a == b).all()) for a, b in zip(got, plain)]
    return out


def fsdp_captured(rank: int, steps: int = 5) -> dict:
    """The same FSDP2 Llama step in lazy mode and under ``lazyxla.compile(capture=True)``: capture refuses a step
    over DTensors by name and records it, with lazy mode's losses."""
    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 64, (8, 16), generator=g) for _ in range(steps)]
    out = {}
    for captured in (False, True):
        model = _tiny_llama().to(lazyxla.device())
        mesh = init_device_mesh("lazyxla", (8,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        step = lazyxla.compile(lambda ids, model=model, opt=opt: _fsdp_step(model, opt, ids), capture=captured)
        losses = [step(ids.to(lazyxla.device())).item() for ids in batches]
        out["captured" if captured else "lazy"] = losses
        if captured:
            out["status"] = step.capture_status
            out["capturable"] = [group.get("capturable", False) for group in opt.param_groups]
    return out


# --- FSDP2 training recipes: activation checkpointing, gradient accumulation, AdamW variants, clipping -----------

RECIPES = {
    # checkpoint_wrapper on each block before fully_shard, fused AdamW, 3 micro-batches with
    # set_requires_gradient_sync(False) on all but the last, zero_grad() first, clip_grad_norm_
    "wrapper_fused_sync": dict(
        checkpoint="wrapper", mixed=False, optimizer="fused", micro=3, sync=True, zero_first=True, clip=0.5
    ),
    # torch.utils.checkpoint.checkpoint(block, x) in the forward, the user's AdamW(capturable=True), plain
    # accumulation over 2 micro-batches, zero_grad() last
    "function_capturable_plain": dict(
        checkpoint="function", mixed=False, optimizer="capturable", micro=2, sync=False, zero_first=False, clip=None
    ),
    # bf16 parameters in the step with fp32 gradient reduction, plain accumulation over 4 micro-batches, foreach
    # AdamW, clip_grad_norm_, zero_grad() first
    "mixed_foreach_plain": dict(
        checkpoint=None, mixed=True, optimizer="foreach", micro=4, sync=False, zero_first=True, clip=1.0
    ),
}


def _recipe_step(model, opt, batch, recipe, to_device, sync_model=None, low=None):
    """One optimizer step over ``recipe["micro"]`` micro-batches of ``batch``; returns (summed loss, grad norm).
    ``sync_model``: FSDP's root, told to reduce only on the last micro-batch (``recipe["sync"]``). ``low``: the
    CPU reference of mixed precision (a bf16 copy whose gradients are added in fp32 into ``model``'s)."""
    if recipe["zero_first"]:
        opt.zero_grad()
    micro, total = recipe["micro"], 0.0
    if low is not None:
        with torch.no_grad():
            for lo, hi in zip(low.parameters(), model.parameters()):
                lo.copy_(hi)
    for i, part in enumerate(batch.chunk(micro)):
        if sync_model is not None and recipe["sync"]:
            sync_model.set_requires_gradient_sync(i == micro - 1)
        loss = _llama_loss(low if low is not None else model, to_device(part)) / micro
        loss.backward()
        total = total + loss.detach().float()
        if low is not None:  # FSDP casts each micro-batch's bf16 gradient to fp32 before adding it up
            for lo, hi in zip(low.parameters(), model.parameters()):
                hi.grad = lo.grad.float() if hi.grad is None else hi.grad + lo.grad.float()
                lo.grad = None
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["clip"]) if recipe["clip"] else None
    opt.step()
    if not recipe["zero_first"]:
        opt.zero_grad()
    return total, norm


def _fractions(tensors: dict) -> dict:
    """Per device: the fraction of each DTensor's elements its device buffer holds (measured from the buffers)."""
    import lazyxla

    return {
        n: sorted({s.data.numel() / t.numel() for s in lazyxla.spmd.local_shards(t._local_tensor)})
        for n, t in tensors.items()
    }


def fsdp_recipe(rank: int, name: str) -> dict:
    """FSDP2 (``fully_shard`` per block and at the root) over ``init_device_mesh("lazyxla", (8,))`` in SPMD mode,
    trained 4 steps by ``RECIPES[name]`` on the tiny torchtitan-style Llama (int64 token ids), against the same
    recipe in CPU eager; losses, gradient norms, parameter differences, programs and compiles per step, block
    forwards run (checkpointing runs each twice), per-device fractions of parameters, gradients and AdamW state."""
    import copy

    import lazyxla

    lazyxla.spmd.enable()
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    recipe = RECIPES[name]
    torch.manual_seed(0)
    ref = _Llama()
    model = copy.deepcopy(ref).to(lazyxla.device())
    forwards = [0]  # the blocks' forwards run (checkpointing runs each again in backward)
    for layer in model.layers:
        layer.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    if recipe["checkpoint"] == "wrapper":  # (the reference too: the wrapper is in the parameters' names)
        for m in (model, ref):
            for i, layer in enumerate(m.layers):
                m.layers[i] = checkpoint_wrapper(layer)
    mesh = init_device_mesh("lazyxla", (8,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if recipe["mixed"] else None
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy or MixedPrecisionPolicy())
    fully_shard(model, mesh=mesh, mp_policy=policy or MixedPrecisionPolicy())
    # (AdamW moves an element by about lr whatever its gradient's size: at 1e-2 one element of a weight whose
    # gradient is near 0 ends 4e-5 from the CPU's, with or without these recipes)
    lr, kind = 1e-3, recipe["optimizer"]
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=lr,
        foreach=kind != "fused" or None,
        fused=kind == "fused" or None,
        capturable=kind == "capturable",
    )
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr, foreach=True)
    low = copy.deepcopy(ref).to(torch.bfloat16) if recipe["mixed"] else None
    model.checkpoint = ref.checkpoint = recipe["checkpoint"] == "function"
    torch.manual_seed(1)
    batches = [torch.randint(0, 64, (8, 16)) for _ in range(STEPS)]

    out: dict = {"ids_dtype": str(batches[0].dtype)}
    lazyxla.sync()
    losses, norms, compiles, executions = [], [], [], []
    ref_losses, ref_norms = [], []
    for batch in batches:
        before = lazyxla.metrics.counters()
        loss, norm = _recipe_step(model, opt, batch, recipe, lambda b: b.to(lazyxla.device()), sync_model=model)
        losses.append(loss)
        norms.append(norm)
        lazyxla.sync()
        after = lazyxla.metrics.counters()
        compiles.append(after["compiles"] - before["compiles"])
        executions.append(after["executions"] - before["executions"])
        loss, norm = _recipe_step(ref, ref_opt, batch, recipe, lambda b: b, low=low)
        ref_losses.append(loss.item())
        ref_norms.append(None if norm is None else norm.item())
    out["losses"], out["ref_losses"] = [v.cpu().item() for v in losses], ref_losses
    out["norm_types"] = sorted({type(n).__name__ for n in norms})
    out["norms"] = [None if n is None else n.full_tensor().cpu().item() for n in norms]
    out["ref_norms"] = ref_norms
    out["compiles"], out["executions"] = compiles, executions
    out["forwards"] = forwards[0]
    params, ref_params = dict(model.named_parameters()), dict(ref.named_parameters())
    names = list(ref_params)
    out["fsdp_names"] = sorted(params) == sorted(ref_params)  # (checkpoint_wrapper keeps the parameter names)
    values = {n: params[n].full_tensor().cpu() for n in names}
    out["param_diffs"] = {n: (values[n] - ref_params[n].detach()).abs().max().item() for n in names}
    out["params_close"] = {n: torch.allclose(values[n], ref_params[n].detach(), rtol=1e-4, atol=1e-5) for n in names}
    out["param_dtypes"] = sorted({str(p.dtype) for p in params.values()})
    out["fractions"] = {"params": _fractions({n: params[n] for n in names})}
    if recipe["zero_first"]:  # the last step's gradients are still held
        grads = {n: params[n].grad for n in names}
        out["grad_types"] = sorted({type(g).__name__ for g in grads.values()})
        out["grad_dtypes"] = sorted({str(g.dtype) for g in grads.values()})
        out["fractions"]["grads"] = _fractions(grads)
    state = [opt.state[params[n]] for n in names]
    for key in ("exp_avg", "exp_avg_sq"):
        out["fractions"][key] = _fractions({n: s[key] for n, s in zip(names, state)})
    out["steps"] = sorted({(type(s["step"]).__name__, str(getattr(s["step"], "placements", None))) for s in state})
    out["step_values"] = sorted(
        {float(s["step"].full_tensor().cpu() if hasattr(s["step"], "full_tensor") else s["step"]) for s in state}
    )
    return out
