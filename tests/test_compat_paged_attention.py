"""torch_xla's paged-attention kernels on lazyxla (``paged_attention``, ``multi_queries_paged_attention``,
``ragged_paged_attention`` and their ``torch.ops.xla`` ops) against references ported from torch_xla and jax: plain
PyTorch on the CPU looping over sequences. New lengths, page tables and sequence counts are program inputs: a
second call with other values compiles nothing and reads nothing on the host."""

from __future__ import annotations

import contextlib

import pytest
import torch

import lazyxla
import lazyxla.compat as compat
from lazyxla.compat.torch_xla.experimental import _paged_attention as pa

MASK = -0.7 * float(torch.finfo(torch.float32).max)
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    # the references compute logits, softmax and products in bfloat16; lazyxla in float32
    torch.bfloat16: {"rtol": 3e-2, "atol": 3e-2},
}


# ---- references, ported ----------------------------------------------------------------------------------------


def ragged_reference(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, k_scale, v_scale, *,
                     sm_scale=1.0, sliding_window=None, soft_cap=None, mask_value=MASK):  # fmt: skip
    """torch_xla's ``_ragged_paged_attention_nonkernel`` (with its runtime check), on the CPU."""
    max_num_batched_tokens, page_size = queries.shape[0], kv_pages.shape[1]
    max_num_seqs, pages_per_seq = page_indices.shape
    assert num_seqs[0] <= max_num_seqs and cu_q_lens[num_seqs[0]] <= max_num_batched_tokens
    assert pages_per_seq >= (torch.max(kv_lens) + page_size - 1) // page_size
    _, _, num_combined_kv_heads, head_dim = kv_pages.shape
    num_kv_heads = num_combined_kv_heads // 2
    num_query_per_kv = queries.shape[1] // num_kv_heads
    outputs = []
    for i in range(num_seqs[0]):
        q_start, q_end = cu_q_lens[i], cu_q_lens[i + 1]
        q_len, kv_len = q_end - q_start, kv_lens[i]
        assert q_len <= kv_len
        indices = page_indices[i]
        q = queries[q_start:q_end]
        k = kv_pages[indices, :, 0::2, :].reshape(-1, num_kv_heads, head_dim)[:kv_len]
        v = kv_pages[indices, :, 1::2, :].reshape(-1, num_kv_heads, head_dim)[:kv_len]
        if k_scale is not None:
            k = (k.to(torch.float32) * k_scale).to(q.dtype)
        if v_scale is not None:
            v = (v.to(torch.float32) * v_scale).to(q.dtype)
        k = torch.repeat_interleave(k, num_query_per_kv, dim=1)
        v = torch.repeat_interleave(v, num_query_per_kv, dim=1)
        attn = torch.einsum("qhd,khd->hqk", q, k)
        attn *= sm_scale
        empty_mask = torch.ones(q_len, kv_len)
        mask = torch.triu(empty_mask, diagonal=kv_len - q_len + 1).bool()
        if sliding_window is not None:
            mask |= torch.triu(empty_mask, diagonal=kv_len - (q_len + sliding_window) + 1).bool().logical_not()
        if soft_cap is not None:
            attn = soft_cap * torch.tanh(attn / soft_cap)
        attn.masked_fill_(mask, mask_value)
        attn = torch.softmax(attn, dim=-1).to(v.dtype)
        outputs.append(torch.einsum("hqk,khd->qhd", attn, v))
    return torch.cat(outputs, dim=0)


def multi_queries_reference(q, k_pages, v_pages, lengths, page_indices, effective_q_lens, attn_logits_soft_cap=None):
    """torch_xla's ``_multi_queries_paged_attention_nonkernel``, on the CPU."""
    batch_size, query_len, num_query_heads, head_size = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    num_query_per_kv = num_query_heads // num_kv_heads
    outputs = []
    for i in range(batch_size):
        kv_len = lengths[i]
        num_pages = (kv_len + page_size - 1) // page_size
        indices = page_indices[i, :num_pages]
        k = k_pages[:, indices].permute(1, 2, 0, 3).reshape(num_pages * page_size, num_kv_heads, head_size)[:kv_len]
        v = v_pages[:, indices].permute(1, 2, 0, 3).reshape(num_pages * page_size, num_kv_heads, head_size)[:kv_len]
        k = torch.repeat_interleave(k, num_query_per_kv, dim=1)
        v = torch.repeat_interleave(v, num_query_per_kv, dim=1)
        attn = torch.einsum("qhd,khd->hqk", q[i], k)
        if attn_logits_soft_cap is not None:
            attn = torch.tanh(attn / attn_logits_soft_cap) * attn_logits_soft_cap
        attn = attn.float()
        mask = torch.triu(torch.ones(query_len, kv_len), diagonal=kv_len - effective_q_lens[i] + 1).bool()
        attn.masked_fill_(mask, float("-inf"))
        attn = torch.softmax(attn, dim=-1).to(v.dtype)
        outputs.append(torch.einsum("hqk,khd->qhd", attn, v))
    return torch.stack(outputs, dim=0)


def paged_reference(q, k_pages, v_pages, lengths, page_indices, soft_cap=None):
    """jax's paged attention test reference (float32 logits, mask by length), one sequence at a time; a sequence of
    length 0 is left 0 (the kernel leaves it unspecified)."""
    batch, heads, dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    out = torch.zeros(batch, heads, dim)
    for b in range(batch):
        if lengths[b] == 0:
            continue
        k = k_pages[:, page_indices[b]].reshape(kv_heads, -1, dim)[:, : lengths[b]].float()
        v = v_pages[:, page_indices[b]].reshape(kv_heads, -1, dim)[:, : lengths[b]].float()
        k, v = (t.repeat_interleave(heads // kv_heads, dim=0) for t in (k, v))
        logits = torch.einsum("hd,htd->ht", q[b].float(), k)
        if soft_cap is not None:
            logits = soft_cap * torch.tanh(logits / soft_cap)
        out[b] = torch.einsum("ht,htd->hd", torch.softmax(logits, -1), v)
    return out


# ---- inputs --------------------------------------------------------------------------------------------------------

PAGE, PAGES_PER_SEQ, TOTAL_PAGES, DIM = 4, 4, 40, 16
# (q_len, kv_len): a lone token, a full page, a decode step on a partial page, a prefill of partial pages, a chunk
RAGGED = [(1, 1), (1, 4), (1, 7), (5, 5), (3, 13), (2, 16)]
RAGGED_OTHER = [(1, 2), (4, 9), (1, 12), (1, 3)]  # the next step: other lengths, fewer sequences


def _pages(seqs: int, seed: int) -> torch.Tensor:
    """Distinct random pages per sequence; slots past a sequence's length still name real pages."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(TOTAL_PAGES, generator=g)[: seqs * PAGES_PER_SEQ].reshape(seqs, -1).int()


def _ragged_inputs(pattern, dtype, kv_heads=2, q_heads=4, max_seqs=8, tokens=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(tokens, q_heads, DIM, generator=g) * DIM**-0.25).to(dtype)
    kv_pages = (torch.randn(TOTAL_PAGES, PAGE, 2 * kv_heads, DIM, generator=g) * DIM**-0.25).to(dtype)
    kv_lens = torch.zeros(max_seqs, dtype=torch.int32)
    kv_lens[: len(pattern)] = torch.tensor([kv for _, kv in pattern], dtype=torch.int32)
    cu = torch.zeros(max_seqs + 1, dtype=torch.int32)
    cu[1 : len(pattern) + 1] = torch.cumsum(torch.tensor([ql for ql, _ in pattern]), 0).int()
    cu[len(pattern) + 1 :] = cu[len(pattern)]
    page_indices = _pages(max_seqs, seed)
    return q, kv_pages, kv_lens, page_indices, cu, torch.tensor([len(pattern)], dtype=torch.int32)


def _on(dev, tensors):
    return [t.to(dev) for t in tensors]


# ---- ragged_paged_attention ----------------------------------------------------------------------------------------

RAGGED_CASES = {
    "plain": {},
    "sm_scale": {"sm_scale": 0.3},
    "soft_cap": {"soft_cap": 2.0, "sm_scale": 2.0},
    "sliding_window": {"sliding_window": 3},
    "mask_value": {"mask_value": -1e4, "sliding_window": 2},
    "kv_scales": {"k_scale": 0.5, "v_scale": 2.0},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(RAGGED_CASES))
@pytest.mark.parametrize("heads", [(2, 2), (2, 6)], ids=["mha", "gqa"])
def test_ragged_paged_attention_equals_torch_xla_nonkernel(dev, dtype, case, heads):
    kwargs = RAGGED_CASES[case]
    inputs = _ragged_inputs(RAGGED, dtype, *heads)
    ref_kwargs = {k: v for k, v in kwargs.items() if k not in ("k_scale", "v_scale")}
    want = ragged_reference(*inputs, kwargs.get("k_scale"), kwargs.get("v_scale"), **ref_kwargs)
    got = pa.ragged_paged_attention(*_on(dev, inputs), **kwargs).cpu()
    total = int(inputs[4][len(RAGGED)])
    assert got.shape == inputs[0].shape and got.dtype == dtype
    torch.testing.assert_close(got[:total], want, **TOL[dtype])
    assert torch.equal(got[total:], torch.zeros_like(got[total:]))  # padding tokens: zeros


def test_ragged_new_lengths_neither_sync_nor_compile(dev):
    first = _ragged_inputs(RAGGED, torch.float32)
    pa.ragged_paged_attention(*_on(dev, first), sm_scale=0.5, soft_cap=3.0).cpu()
    for pattern, seed in ((RAGGED_OTHER, 1), (RAGGED[:2], 2), (RAGGED[::-1], 3)):
        inputs = _ragged_inputs(pattern, torch.float32, seed=seed)
        moved = _on(dev, inputs)
        lazyxla.metrics.reset()
        out = pa.ragged_paged_attention(*moved, sm_scale=0.5, soft_cap=3.0, use_kernel=False)
        c = lazyxla.metrics.counters()
        assert (c["syncs"], c["device_to_host"], c["compiles"]) == (0, 0, 0), c  # recorded, not run
        got = out.cpu()
        assert lazyxla.metrics.counters()["compiles"] == 0, pattern
        total = int(inputs[4][len(pattern)])
        want = ragged_reference(*inputs, None, None, sm_scale=0.5, soft_cap=3.0)
        torch.testing.assert_close(got[:total], want, **TOL[torch.float32])
        assert not got[total:].any()


def test_ragged_gradients_equal_the_reference(dev):
    # not torch_xla's (its kernels have no backward): call_jax's jax.vjp through the scan
    inputs = list(_ragged_inputs(RAGGED, torch.float32))
    total = int(inputs[4][len(RAGGED)])
    weight = torch.linspace(-1, 1, total * inputs[0][0].numel()).reshape(total, *inputs[0].shape[1:])
    grads = []
    for where in (dev, "cpu"):
        q, kv = (t.to(where).requires_grad_() for t in inputs[:2])
        rest = [t.to(where) for t in inputs[2:]]
        if where == "cpu":
            out = ragged_reference(q, kv, *rest, None, None, sm_scale=0.5, sliding_window=4, soft_cap=2.0)
        else:
            out = pa.ragged_paged_attention(q, kv, *rest, sm_scale=0.5, sliding_window=4, soft_cap=2.0)[:total]
        (out * weight.to(where)).sum().backward()
        grads.append([q.grad.cpu(), kv.grad.cpu()])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_ragged_invalid_lengths_and_nan_pages_give_no_nan(dev):
    q, kv_pages, kv_lens, page_indices, cu, num_seqs = _ragged_inputs(RAGGED, torch.float32)
    unused = [p for p in range(TOTAL_PAGES) if p not in page_indices[: len(RAGGED)].flatten().tolist()]
    kv_pages[unused] = float("nan")  # uninitialized cache pages
    page_indices[0, 1:] = unused[0]  # slots past sequence 0's single key name a NaN page
    page_indices[len(RAGGED) :] = -7  # garbage rows past num_seqs
    want = ragged_reference(q, kv_pages, kv_lens, page_indices.clamp(min=0), cu, num_seqs, None, None)
    got = pa.ragged_paged_attention(*_on(dev, (q, kv_pages, kv_lens, page_indices, cu, num_seqs))).cpu()
    total = int(cu[len(RAGGED)])
    torch.testing.assert_close(got[:total], want, **TOL[torch.float32])
    assert not got.isnan().any()
    # q_len > kv_len (torch_xla's runtime check rejects it on the host): the early queries see no unmasked key,
    # and average the sequence's keys with equal weights instead of NaN; num_seqs past max_num_seqs is capped
    bad_lens = kv_lens.clone()
    bad_lens[3] = 2  # sequence 3 has 5 queries
    bad = pa.ragged_paged_attention(*_on(dev, (q, kv_pages, bad_lens, page_indices, cu, torch.tensor([99]).int())))
    bad = bad.cpu()
    assert not bad.isnan().any()
    start = int(cu[3])
    k, v = (kv_pages[page_indices[3, 0], :2, j::2].float() for j in (0, 1))  # sequence 3's two keys
    torch.testing.assert_close(bad[start], v.mean(0).repeat_interleave(2, 0), **TOL[torch.float32])
    # its last query (position 1) sees both keys as usual; the other sequences are untouched
    k, v = (t.repeat_interleave(2, 1) for t in (k, v))
    last = torch.einsum("hk,khd->hd", torch.einsum("hd,khd->hk", q[start + 4], k).softmax(-1), v)
    torch.testing.assert_close(bad[start + 4], last, **TOL[torch.float32])
    assert torch.equal(bad[:start], got[:start])


def test_ragged_validates_shapes(dev):
    q, kv_pages, kv_lens, page_indices, cu, num_seqs = _on(dev, _ragged_inputs(RAGGED, torch.float32))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        pa.ragged_paged_attention(q[:, :3], kv_pages, kv_lens, page_indices, cu, num_seqs)
    with pytest.raises(ValueError, match=r"cu_q_lens \[max_num_seqs \+ 1\]"):
        pa.ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu[:-1], num_seqs)
    with pytest.raises(ValueError, match="sliding_window must be positive"):
        pa.ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu, num_seqs, sliding_window=0)


# ---- multi_queries_paged_attention ---------------------------------------------------------------------------------


def _multi_inputs(dtype, kv_heads, q_heads, lengths, q_lens, query_len=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(len(lengths), query_len, q_heads, DIM, generator=g) * DIM**-0.25).to(dtype)
    k_pages, v_pages = (
        (torch.randn(kv_heads, TOTAL_PAGES, PAGE, DIM, generator=g) * DIM**-0.25).to(dtype) for _ in "kv"
    )
    lengths = torch.tensor(lengths, dtype=torch.int32)
    return q, k_pages, v_pages, lengths, _pages(len(lengths), seed), torch.tensor(q_lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("heads", [(2, 2), (1, 4)], ids=["mha", "gqa"])
@pytest.mark.parametrize("soft_cap", [None, 1.5])
def test_multi_queries_paged_attention_equals_torch_xla_nonkernel(dev, dtype, heads, soft_cap):
    inputs = _multi_inputs(dtype, *heads, lengths=[1, 4, 7, 13, 16], q_lens=[1, 2, 4, 3, 4])
    want = multi_queries_reference(*inputs, attn_logits_soft_cap=soft_cap)
    got = pa.multi_queries_paged_attention(*_on(dev, inputs), 2, 4, attn_logits_soft_cap=soft_cap).cpu()
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, **TOL[dtype])
    nonkernel = pa.multi_queries_paged_attention(*_on(dev, inputs), 2, 4, False, attn_logits_soft_cap=soft_cap)
    assert torch.equal(nonkernel.cpu(), got)  # use_kernel=False: the same numbers


def test_multi_queries_new_lengths_compile_nothing(dev):
    first = _multi_inputs(torch.float32, 1, 2, lengths=[4, 9, 2], q_lens=[4, 1, 2])
    pa.multi_queries_paged_attention(*_on(dev, first), 1, 4).cpu()
    inputs = _multi_inputs(torch.float32, 1, 2, lengths=[16, 1, 0], q_lens=[3, 1, 0], seed=5)
    moved = _on(dev, inputs)
    lazyxla.metrics.reset()
    got = pa.multi_queries_paged_attention(*moved, 1, 4)
    assert lazyxla.metrics.counters()["syncs"] == 0
    got = got.cpu()
    assert lazyxla.metrics.counters()["compiles"] == 0
    torch.testing.assert_close(got, multi_queries_reference(*inputs), **TOL[torch.float32])
    assert not got[2].any()  # a sequence of length 0: zeros


# ---- paged_attention -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("heads", [(2, 2), (2, 4), (1, 8)], ids=["mha", "gqa", "gqa8"])
@pytest.mark.parametrize("soft_cap", [None, 2.0])
def test_paged_attention_equals_jax_reference(dev, dtype, heads, soft_cap):
    kv_heads, q_heads = heads
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, q_heads, DIM, generator=g).to(dtype)
    k_pages, v_pages = (torch.randn(kv_heads, TOTAL_PAGES, PAGE, DIM, generator=g).to(dtype) for _ in "kv")
    lengths = torch.tensor([1, 4, 6, 0, 16], dtype=torch.int32)
    page_indices = _pages(5, 0)
    inputs = (q, k_pages, v_pages, lengths, page_indices)
    got = pa.paged_attention(*_on(dev, inputs), 2, attn_logits_soft_cap=soft_cap).cpu()
    # torch_xla's output dtype: float32 unless the query heads per kv head are a multiple of 8
    assert got.dtype == (dtype if (q_heads // kv_heads) % 8 == 0 else torch.float32)
    torch.testing.assert_close(got.float(), paged_reference(*inputs, soft_cap), **TOL[dtype])
    assert not got[3].any()  # length 0: zeros


def test_paged_attention_validates_as_jax_does(dev):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, DIM, generator=g)
    pages = torch.randn(1, TOTAL_PAGES, PAGE, DIM, generator=g)
    lengths, page_indices = torch.tensor([3, 1, 8], dtype=torch.int32), _pages(3, 0)
    args = _on(dev, (q, pages, pages, lengths, page_indices))
    with pytest.raises(ValueError, match="megacore_mode must be one of"):
        pa.paged_attention(*args, 2, megacore_mode="core")
    with pytest.raises(ValueError, match="number of KV heads must be even"):
        pa.paged_attention(*args, 2, megacore_mode="kv_head")
    with pytest.raises(ValueError, match="batch size must be even"):
        pa.paged_attention(*args, 2, megacore_mode="batch")
    with pytest.raises(ValueError, match="pages_per_compute_block must be divisible"):
        pa.paged_attention(*args, 3)
    with pytest.raises(ValueError, match="must be int32"):
        pa.paged_attention(*args[:3], args[3].long(), args[4], 2)
    even = _on(dev, (q[:2], pages, pages, lengths[:2], page_indices[:2]))
    want = pa.paged_attention(*even, 2).cpu()
    torch.testing.assert_close(pa.paged_attention(*even, 4, megacore_mode="batch").cpu(), want)


# ---- under the compatibility layer, and torch.ops.xla --------------------------------------------------------------


@pytest.fixture
def ck():
    """``torch_xla.experimental.custom_kernel`` with the compatibility layer installed (removed afterwards)."""
    assert compat.install()
    import torch_xla.experimental.custom_kernel as ck

    yield ck
    compat.uninstall()


def test_compat_names_and_torch_ops_xla(ck, dev):
    import torch_xla.core.xla_model as xm

    assert isinstance(xm.XLA_LIB, torch.library.Library)
    inputs = _ragged_inputs(RAGGED, torch.float32)
    total = int(inputs[4][len(RAGGED)])
    want = ragged_reference(*inputs, None, None, sm_scale=0.25, sliding_window=5)
    direct = ck.ragged_paged_attention(*_on(dev, inputs), sm_scale=0.25, sliding_window=5).cpu()
    torch.testing.assert_close(direct[:total], want, **TOL[torch.float32])
    # vLLM's call: the schema's arguments positionally, then by name
    op = torch.ops.xla.ragged_paged_attention(
        *_on(dev, inputs), 0.25, 5, None, None, None, None, True, None, None, None
    )
    assert op.device.type == dev.type
    assert torch.equal(op.cpu(), direct)
    named = torch.ops.xla.ragged_paged_attention(*_on(dev, inputs), sm_scale=0.25, sliding_window=5)
    assert torch.equal(named.cpu(), direct)
    m = _multi_inputs(torch.float32, 1, 2, lengths=[3, 9], q_lens=[2, 4])
    got = torch.ops.xla.multi_queries_paged_attention(*_on(dev, m), 1, 4, True)
    torch.testing.assert_close(got.cpu(), multi_queries_reference(*m), **TOL[torch.float32])
    p = (m[0][:, 0], *m[1:5])
    got = torch.ops.xla.paged_attention(*_on(dev, p), 2, None, 1.5)
    torch.testing.assert_close(got.cpu(), paged_reference(*p, 1.5), **TOL[torch.float32])
    # off the device (fake and meta tensors in torch.compile's tracing): torch_xla's empty_like(q)
    meta = [t.to("meta") for t in inputs]
    assert torch.ops.xla.ragged_paged_attention(*meta).shape == inputs[0].shape
    with pytest.warns(UserWarning, match="should only be applied to tensors on XLA device"):
        assert torch.ops.xla.paged_attention(*p, 2).shape == p[0].shape


def test_the_ops_survive_reinstalling_the_layer(dev):
    inputs = _ragged_inputs(RAGGED[:3], torch.float32)
    outs = []
    for _ in range(2):
        assert compat.install()
        import torch_xla.experimental.custom_kernel as ck

        outs.append(ck.ragged_paged_attention(*_on(dev, inputs)).cpu())
        compat.uninstall()
    outs.append(torch.ops.xla.ragged_paged_attention(*_on(dev, inputs)).cpu())
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_torch_ops_xla_under_torch_compile(dev):
    # AOTAutograd's functionalization meets the op on fake tensors: the graph must hold the op itself (run op by op
    # at call time, its call_jax node in the step's program), not the empty_like its shape kernel returns
    def attend(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
        out = torch.ops.xla.ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, 0.5)
        return out * 2

    compiled = torch.compile(attend, backend="lazyxla")
    for k, (pattern, seed) in enumerate(((RAGGED, 0), (RAGGED_OTHER, 1))):
        inputs = _ragged_inputs(pattern, torch.float32, seed=seed)
        moved = _on(dev, inputs)
        lazyxla.metrics.reset()
        with pytest.warns(UserWarning, match="op by op") if k == 0 else contextlib.nullcontext():
            got = compiled(*moved).cpu()
        if k:
            assert lazyxla.metrics.counters()["compiles"] == 0
        total = int(inputs[4][len(pattern)])
        want = 2 * ragged_reference(*inputs, None, None, sm_scale=0.5)
        torch.testing.assert_close(got[:total], want, **TOL[torch.float32])
