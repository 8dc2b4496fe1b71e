"""torch_xla's paged-attention kernels (``paged_attention``, ``multi_queries_paged_attention``,
``ragged_paged_attention``) as exact XLA formulations written in JAX, run through :func:`lazyxla.call_jax`.

The KV cache is a set of pages; each sequence reads its keys and values from the pages its row of
``page_indices`` names, up to its length. Lengths, page indices, ``cu_q_lens``, ``num_seqs`` and
``effective_q_lens`` change at every decoding step, so they are inputs of the program, never read on the host:
the masks and gathers are computed inside it, and new lengths neither sync nor compile.

One formulation serves the three kernels (``_attend``): queries grouped per sequence row ``[rows, queries, heads,
dim]``, each with the absolute position its causal mask ends at; a ``lax.scan`` over the page slots of the rows'
page tables gathers one page per row and step and folds it into a running softmax (float32 logits, maximum and
sum: the arithmetic of torch_xla's Pallas kernels, exact up to float32 rounding), so memory holds one page per row
at a time, not every sequence's keys.

What padding holds (torch_xla's kernels leave it unspecified): zeros. A query row with no key (a length of 0, a
ragged token past ``cu_q_lens[num_seqs]``) is 0; keys past a sequence's length are left out entirely (their
values are never multiplied, so uninitialized pages cannot leak NaN into real rows). A query whose every key is
masked by the causal or sliding-window mask (``q_len > kv_len``: invalid input, which torch_xla's runtime check
rejects on the host) averages the sequence's keys with equal weights, as the reference's ``mask_value`` fill does,
never NaN.

Also torch_xla's ``torch.ops.xla`` custom ops for the three kernels, on ``XLA_LIB`` (torch_xla.core.xla_model's):
their kernel for lazyxla's device is registered at the Functionalize key (a lazyxla tensor as the user holds it
is a functionalization wrapper, and the Python key below it would record the op as an unknown one), and
``CompositeExplicitAutograd`` returns ``empty_like(q)`` for shape inference (fake and meta tensors), as torch_xla's
does. Under ``torch.compile(backend="lazyxla")`` the graph keeps the op (AOTAutograd's functionalization passes it
below the Functionalize key on fake tensors) and lazyxla runs that graph op by op.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

import lazyxla
from lazyxla.compat.torch_xla.experimental._custom_ops import register, warn_off_device

DEFAULT_MASK_VALUE = -0.7 * float(torch.finfo(torch.float32).max)  # torch_xla's and jax's paged attention's
MEGACORE_MODES = ("kv_head", "batch", None)


# ---- the three kernels ---------------------------------------------------------------------------------------------


def paged_attention(
    q: torch.Tensor,  # [batch, num_q_heads, head_dim]
    k_pages: torch.Tensor,  # [num_kv_heads, total_num_pages, page_size, head_dim]
    v_pages: torch.Tensor,  # [num_kv_heads, total_num_pages, page_size, head_dim]
    lengths: torch.Tensor,  # i32[batch]
    page_indices: torch.Tensor,  # i32[batch, pages_per_sequence]
    pages_per_compute_block: int,
    megacore_mode: str | None = None,
    attn_logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Decode attention over a paged KV cache (jax's TPU ``paged_attention``): for each sequence ``b`` and query
    head ``h``, ``softmax(cap(q[b, h] . k[t]))`` over its keys ``t < lengths[b]`` times their values, where key
    ``t`` lives at slot ``t % page_size`` of page ``page_indices[b, t // page_size]`` of kv head
    ``h // (num_q_heads // num_kv_heads)`` (grouped-query attention). No ``sm_scale``: scale ``q`` first.

    ``cap(x) = soft_cap * tanh(x / soft_cap)`` when ``attn_logits_soft_cap`` is given. A sequence of length 0 gives
    zeros. As torch_xla, the result is float32 when ``num_q_heads // num_kv_heads`` is not a multiple of 8 (the
    kernel's launch dtype), else ``q``'s dtype. ``pages_per_compute_block`` and ``megacore_mode`` are validated as
    jax's kernel does and change nothing else (XLA plans the computation). ``lengths`` and ``page_indices`` are
    program inputs: new values neither sync nor compile.

    Example::

        out = paged_attention(q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block=4)
    """
    if megacore_mode not in MEGACORE_MODES:
        raise ValueError(f"megacore_mode must be one of ['kv_head', 'batch', None], got {megacore_mode!r}")
    if q.dim() != 3 or k_pages.dim() != 4:
        raise ValueError(
            f"paged_attention: q must be [batch, num_q_heads, head_dim] and k_pages/v_pages "
            f"[num_kv_heads, total_num_pages, page_size, head_dim]; got q {tuple(q.shape)}, k_pages "
            f"{tuple(k_pages.shape)}"
        )
    batch, heads, _ = q.shape
    kv_heads = k_pages.shape[0]
    _check_paged(q.unsqueeze(1), k_pages, v_pages, lengths, page_indices, "paged_attention")
    if page_indices.shape[1] % pages_per_compute_block != 0:
        raise ValueError(
            "pages_per_compute_block must be divisible by pages per sequence. Got "
            f"{pages_per_compute_block} and {page_indices.shape[1]}."
        )
    if lengths.dtype != torch.int32:
        raise ValueError(f"The dtype of `lengths` must be int32. Got {lengths.dtype}")
    if megacore_mode == "kv_head" and kv_heads % 2 != 0:
        raise ValueError("number of KV heads must be even when megacore_mode is 'kv_head'")
    if megacore_mode == "batch" and batch % 2 != 0:
        raise ValueError("batch size must be even when megacore_mode is 'batch'")
    if (heads // kv_heads) % 8 != 0:
        q = q.float()  # torch_xla launches the kernel on a float32 q then, and returns its float32 output
    cap = None if attn_logits_soft_cap is None else float(attn_logits_soft_cap)
    return lazyxla.call_jax(_paged, q, k_pages, v_pages, lengths, page_indices, soft_cap=cap)


def multi_queries_paged_attention(
    q: torch.Tensor,  # [batch, query_len, num_q_heads, head_dim]
    k_pages: torch.Tensor,  # [num_kv_heads, total_num_pages, page_size, head_dim]
    v_pages: torch.Tensor,  # [num_kv_heads, total_num_pages, page_size, head_dim]
    lengths: torch.Tensor,  # i32[batch]: each sequence's kv length
    page_indices: torch.Tensor,  # i32[batch, pages_per_sequence]
    effective_q_lens: torch.Tensor,  # i32[batch]: each sequence's number of real queries
    num_kv_pages_per_compute_block: int | None = None,
    num_queries_per_compute_block: int | None = None,
    use_kernel: bool = True,
    attn_logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Attention of ``query_len`` new tokens per sequence over a paged KV cache (torch_xla's
    ``multi_queries_paged_attention``): query ``i`` of sequence ``b`` sits at position
    ``lengths[b] - effective_q_lens[b] + i`` and attends causally to the keys at or before it (and before
    ``lengths[b]``). Returns ``[batch, query_len, num_q_heads, head_dim]`` in ``q``'s dtype.

    Grouped-query attention as :func:`paged_attention`; no ``sm_scale`` (scale ``q``); ``attn_logits_soft_cap``
    caps the logits. Queries past ``effective_q_lens[b]`` are computed like the reference's (they see every key
    below ``lengths[b]``); a sequence of length 0 gives zeros. ``use_kernel=False`` (torch_xla's loop over
    sequences, which reads the lengths on the host) gives the same numbers from the same program; the block sizes
    are accepted and not needed.

    Example::

        out = multi_queries_paged_attention(q, k_pages, v_pages, lengths, page_indices, effective_q_lens, 4, 8)
    """
    if q.dim() != 4 or k_pages.dim() != 4:
        raise ValueError(
            f"multi_queries_paged_attention: q must be [batch, query_len, num_q_heads, head_dim] and k_pages/v_pages"
            f" [num_kv_heads, total_num_pages, page_size, head_dim]; got q {tuple(q.shape)}, k_pages "
            f"{tuple(k_pages.shape)}"
        )
    _check_paged(q, k_pages, v_pages, lengths, page_indices, "multi_queries_paged_attention")
    if tuple(effective_q_lens.shape) != (q.shape[0],):
        raise ValueError(
            f"multi_queries_paged_attention: effective_q_lens must be [batch] = [{q.shape[0]}], got "
            f"{tuple(effective_q_lens.shape)}"
        )
    cap = None if attn_logits_soft_cap is None else float(attn_logits_soft_cap)
    return lazyxla.call_jax(_multi_queries, q, k_pages, v_pages, lengths, page_indices, effective_q_lens, soft_cap=cap)


def ragged_paged_attention(
    q: torch.Tensor,  # [max_num_batched_tokens, num_q_heads, head_dim]
    kv_pages: torch.Tensor,  # [total_num_pages, page_size, 2 * num_kv_heads, head_dim]: k, v interleaved
    kv_lens: torch.Tensor,  # i32[max_num_seqs]
    page_indices: torch.Tensor,  # i32[max_num_seqs, pages_per_seq]
    cu_q_lens: torch.Tensor,  # i32[max_num_seqs + 1]
    num_seqs: torch.Tensor,  # i32[1]
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    use_kernel: bool = True,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
) -> torch.Tensor:
    """vLLM's ragged paged attention (torch_xla's ``ragged_paged_attention``): the first ``num_seqs[0]``
    sequences' query tokens lie one after another in ``q`` (sequence ``s`` owns tokens
    ``cu_q_lens[s]:cu_q_lens[s + 1]``); token ``i`` of a sequence of ``q_len`` queries and ``kv_len`` keys sits at
    position ``kv_len - q_len + i`` and attends causally to the keys at or before it, and only to the last
    ``sliding_window`` of them when that is given. Logits are ``q . k * sm_scale``, capped by ``soft_cap``; masked
    logits become ``mask_value`` (default ``DEFAULT_MASK_VALUE``). Keys and values are interleaved in ``kv_pages``'
    head dimension (k at even, v at odd indices); ``k_scale``/``v_scale`` dequantize them
    (``(k.float() * k_scale).to(q.dtype)``). Grouped-query attention: ``num_q_heads`` a multiple of the kv heads.

    Returns ``q``'s shape and dtype; tokens past ``cu_q_lens[num_seqs[0]]`` (padding) are zeros. Every index tensor
    is a program input: new lengths, pages and sequence counts neither sync nor compile. torch_xla's host-side
    runtime check (``q_len <= kv_len``, enough pages, ``num_seqs <= max_num_seqs``) would read them on the host, so
    lazyxla checks only shapes and clamps in the program instead: ``num_seqs`` is capped at ``max_num_seqs``, keys
    past ``pages_per_seq * page_size`` do not exist, and a query with every key masked averages its sequence's keys
    with equal weights (never NaN). ``use_kernel=False`` gives the same numbers from the same program; the block
    sizes and ``vmem_limit_bytes`` are accepted and not needed.

    Example::

        out = ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale=d ** -0.5)
    """
    if q.dim() != 3 or kv_pages.dim() != 4 or kv_pages.shape[2] % 2 != 0 or q.shape[2] != kv_pages.shape[3]:
        raise ValueError(
            f"ragged_paged_attention: q must be [tokens, num_q_heads, head_dim] and kv_pages [total_num_pages, "
            f"page_size, 2 * num_kv_heads, head_dim] with the same head_dim; got q {tuple(q.shape)}, kv_pages "
            f"{tuple(kv_pages.shape)}"
        )
    if q.shape[1] % (kv_pages.shape[2] // 2) != 0:
        raise ValueError(
            f"ragged_paged_attention: num_q_heads ({q.shape[1]}) must be a multiple of num_kv_heads "
            f"({kv_pages.shape[2] // 2})"
        )
    seqs = kv_lens.shape[0] if kv_lens.dim() == 1 else -1
    if seqs < 1 or page_indices.dim() != 2 or page_indices.shape[0] != seqs or tuple(cu_q_lens.shape) != (seqs + 1,):
        raise ValueError(
            f"ragged_paged_attention: kv_lens must be [max_num_seqs], page_indices [max_num_seqs, pages_per_seq] and "
            f"cu_q_lens [max_num_seqs + 1]; got {tuple(kv_lens.shape)}, {tuple(page_indices.shape)}, "
            f"{tuple(cu_q_lens.shape)}"
        )
    if num_seqs.numel() != 1:
        raise ValueError(f"ragged_paged_attention: num_seqs must hold one count (i32[1]), got {tuple(num_seqs.shape)}")
    if sliding_window is not None and int(sliding_window) < 1:
        raise ValueError(f"ragged_paged_attention: sliding_window must be positive, got {sliding_window}")
    static = {
        "sm_scale": float(sm_scale),
        "sliding_window": None if sliding_window is None else int(sliding_window),
        "soft_cap": None if soft_cap is None else float(soft_cap),
        "mask_value": DEFAULT_MASK_VALUE if mask_value is None else float(mask_value),
        "k_scale": None if k_scale is None else float(k_scale),
        "v_scale": None if v_scale is None else float(v_scale),
    }
    return lazyxla.call_jax(_ragged, q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs.reshape(1), **static)


def _check_paged(q, k_pages, v_pages, lengths, page_indices, name: str) -> None:
    """The shape checks of jax's paged attention kernel, on q ``[batch, query_len, heads, dim]``."""
    batch, _, heads, dim = q.shape
    if tuple(k_pages.shape) != tuple(v_pages.shape):
        raise ValueError(
            f"k_pages and v_pages must have the same shape. Got {tuple(k_pages.shape)} and {tuple(v_pages.shape)}"
        )
    if heads % k_pages.shape[0] != 0:
        raise ValueError(
            f"Number of Q heads must be divisible by number of KV heads. Got {heads} and {k_pages.shape[0]}."
        )
    if k_pages.shape[3] != dim:
        raise ValueError(f"head_dim of Q must be the same as that of K/V. Got {dim} and {k_pages.shape[3]}.")
    if tuple(lengths.shape) != (batch,):
        raise ValueError(f"{name}: `lengths` and `q` must have the same batch size")
    if page_indices.dim() != 2 or page_indices.shape[0] != batch:
        raise ValueError(f"{name}: `page_indices` must be [batch, pages_per_sequence] with q's batch size")


# ---- JAX formulations ----------------------------------------------------------------------------------------------


def _paged(q, k_pages, v_pages, lengths, page_indices, *, soft_cap):
    lengths = lengths.astype(jnp.int32)
    rows = q[:, None]  # one query per sequence, at position length - 1: every key below the length
    out = _attend(
        rows, lengths, (lengths - 1)[:, None], page_indices, _split_pages(k_pages, v_pages),
        sm_scale=1.0, soft_cap=soft_cap, sliding_window=None, mask_value=DEFAULT_MASK_VALUE,
    )  # fmt: skip
    return out[:, 0]


def _multi_queries(q, k_pages, v_pages, lengths, page_indices, effective_q_lens, *, soft_cap):
    lengths = lengths.astype(jnp.int32)
    first = lengths - effective_q_lens.astype(jnp.int32)
    pos = first[:, None] + jnp.arange(q.shape[1], dtype=jnp.int32)[None, :]
    return _attend(
        q, lengths, pos, page_indices, _split_pages(k_pages, v_pages),
        sm_scale=1.0, soft_cap=soft_cap, sliding_window=None, mask_value=DEFAULT_MASK_VALUE,
    )  # fmt: skip


def _split_pages(k_pages, v_pages):
    """``fetch(ids)`` for separate k and v pages ``[kv_heads, total_pages, page_size, dim]``: one page per row,
    ``[rows, page_size, kv_heads, dim]`` each."""
    total = k_pages.shape[1]

    def fetch(ids):
        ids = jnp.clip(ids, 0, total - 1)
        return tuple(jnp.transpose(jnp.take(p, ids, axis=1), (1, 2, 0, 3)) for p in (k_pages, v_pages))

    return fetch


def _ragged(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **static):
    """Token-major: each query token is a row of its own, reading its sequence's page table."""
    tokens = q.shape[0]
    seqs = kv_lens.shape[0]
    cu = cu_q_lens.astype(jnp.int32)
    n = jnp.clip(num_seqs.astype(jnp.int32)[0], 0, seqs)
    t = jnp.arange(tokens, dtype=jnp.int32)
    live = jnp.arange(seqs, dtype=jnp.int32) < n
    # the sequence of token t: how many live sequences end at or before it (robust to garbage past num_seqs)
    seq = jnp.sum(live[None, :] & (cu[None, 1:] <= t[:, None]), axis=1, dtype=jnp.int32)
    valid = (t >= cu[0]) & (t < cu[n]) & (seq < n)
    seq = jnp.minimum(seq, seqs - 1)
    start, q_len = cu[seq], cu[seq + 1] - cu[seq]
    kv_len = jnp.where(valid, kv_lens.astype(jnp.int32)[seq], 0)
    pos = kv_len - q_len + (t - start)
    total = kv_pages.shape[0]
    k_scale, v_scale = static.pop("k_scale"), static.pop("v_scale")

    def fetch(ids):
        page = jnp.take(kv_pages, jnp.clip(ids, 0, total - 1), axis=0)  # [rows, page_size, 2 * kv_heads, dim]
        k, v = page[:, :, 0::2], page[:, :, 1::2]
        if k_scale is not None:
            k = (k.astype(jnp.float32) * k_scale).astype(q.dtype)
        if v_scale is not None:
            v = (v.astype(jnp.float32) * v_scale).astype(q.dtype)
        return k, v

    # a padding token has kv_len 0: no key exists for it, so its row is 0
    return _attend(q[:, None], kv_len, pos[:, None], page_indices[seq], fetch, **static)[:, 0]


def _attend(q, kv_len, pos, pages, fetch, *, sm_scale, soft_cap, sliding_window, mask_value):
    """Paged attention of rows of queries, folded page by page into a running softmax.

    q ``[rows, queries, q_heads, dim]``; kv_len ``[rows]``: keys ``0 <= j < kv_len`` exist, the rest are left
    out; pos ``[rows, queries]``: query ``i`` keeps keys ``j <= pos`` (and ``j > pos - sliding_window``), the
    other existing keys get ``mask_value``; pages ``[rows, pages_per_row]``: the page ids of each row's keys;
    ``fetch(ids [rows])`` -> k, v ``[rows, page_size, kv_heads, dim]``. Returns q's shape and dtype; a row with
    no existing key is 0.
    """
    f32 = jnp.float32
    rows, queries, heads, dim = q.shape
    k0, _ = jax.eval_shape(fetch, pages[:, 0])
    page_size, kv_heads = k0.shape[1], k0.shape[2]
    groups = heads // kv_heads
    qg = q.reshape(rows, queries, kv_heads, groups, dim)
    state = (
        jnp.full((rows, kv_heads, groups, queries), -jnp.inf, f32),  # running maximum
        jnp.zeros((rows, kv_heads, groups, queries), f32),  # running sum of exp
        jnp.zeros((rows, kv_heads, groups, queries, dim), f32),  # running weighted values
    )
    offsets = jnp.arange(page_size, dtype=jnp.int32)

    def step(carry, slot):
        m, l_sum, acc = carry
        k, v = fetch(jax.lax.dynamic_index_in_dim(pages, slot, axis=1, keepdims=False))
        s = jnp.einsum("rqkgd,rskd->rkgqs", qg, k, preferred_element_type=f32)
        if sm_scale != 1.0:
            s = s * sm_scale
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        key = slot * page_size + offsets  # [page_size]
        exists = key[None, :] < kv_len[:, None]  # [rows, page_size]
        keep = key[None, None, :] <= pos[:, :, None]  # [rows, queries, page_size]
        if sliding_window is not None:
            keep = keep & (key[None, None, :] > pos[:, :, None] - sliding_window)
        s = jnp.where(keep[:, None, None], s, f32(mask_value))
        s = jnp.where(exists[:, None, None, None], s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=-1))
        m_safe = jnp.where(m_new == -jnp.inf, f32(0), m_new)  # no key yet: exp(-inf - 0) = 0, not NaN
        p = jnp.exp(s - m_safe[..., None])
        alpha = jnp.exp(m - m_safe)
        v = jnp.where(exists[:, :, None, None], v.astype(f32), f32(0))  # a missing key's value never counts
        acc = alpha[..., None] * acc + jnp.einsum("rkgqs,rskd->rkgqd", p, v, preferred_element_type=f32)
        return (m_new, alpha * l_sum + p.sum(axis=-1), acc), None

    (_, l_sum, acc), _ = jax.lax.scan(step, state, jnp.arange(pages.shape[1], dtype=jnp.int32))
    out = jnp.where(l_sum[..., None] > 0, acc / jnp.where(l_sum > 0, l_sum, f32(1))[..., None], f32(0))
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(rows, queries, heads, dim).astype(q.dtype)


# ---- torch.ops.xla ---------------------------------------------------------------------------------------------------
# torch_xla's schemas, verbatim, registered by ``_custom_ops.register``: lazyxla tensors run the kernels above, other
# tensors (fake ones in torch.compile's tracing, meta, CPU) get ``empty_like(q)``, as torch_xla's give.

_PAGED_SCHEMA = (
    "paged_attention(Tensor q, Tensor k_pages, Tensor v_pages, Tensor lengths, Tensor page_indices,"
    " int pages_per_compute_block, str? megacore_mode=None, float? attn_logits_soft_cap=None) -> Tensor"
)
_MULTI_QUERIES_SCHEMA = (
    "multi_queries_paged_attention(Tensor q, Tensor k_pages, Tensor v_pages, Tensor lengths, Tensor page_indices,"
    " Tensor effective_q_lens, int num_kv_pages_per_compute_block, int num_queries_per_compute_block,"
    " bool use_kernel, float? attn_logits_soft_cap=None) -> Tensor"
)
_RAGGED_SCHEMA = (
    "ragged_paged_attention(Tensor q, Tensor kv_pages, Tensor kv_lens, Tensor page_indices, "
    "Tensor cu_q_lens, Tensor num_seqs, float sm_scale=1, int? sliding_window=None, "
    "float? soft_cap=None, float? mask_value=None, float? k_scale=None, float? v_scale=None, bool use_kernel=True,"
    "int? num_kv_pages_per_block=None, int? num_queries_per_block=None, int? vmem_limit_bytes=None) -> Tensor"
)
_RAGGED_ARGS = (
    "sm_scale", "sliding_window", "soft_cap", "mask_value", "k_scale", "v_scale", "use_kernel",
    "num_kv_pages_per_block", "num_queries_per_block", "vmem_limit_bytes",
)  # fmt: skip


def non_xla_ragged_paged_attention(q: torch.Tensor, kv: torch.Tensor, attention_type: str) -> torch.Tensor:
    """torch_xla's kernel off its device: ``empty_like(q)`` (the output's shape, for fake-tensor tracing), with a
    warning unless ``kv`` is a meta tensor.

    Example::

        non_xla_ragged_paged_attention(q_meta, kv_pages_meta, "paged").shape == q_meta.shape
    """
    warn_off_device(kv, f"{attention_type} attention")
    return torch.empty_like(q)


def paged_attention_xla(q, k_pages, v_pages, lengths, page_indices, *args) -> torch.Tensor:
    """``torch.ops.xla.paged_attention`` on lazyxla tensors: :func:`paged_attention`.

    Example::

        out = torch.ops.xla.paged_attention(q, k_pages, v_pages, lengths, page_indices, 4)
    """
    return paged_attention(q, k_pages, v_pages, lengths, page_indices, *args)


def paged_attention_non_xla(q, k_pages, *args) -> torch.Tensor:
    """``torch.ops.xla.paged_attention`` elsewhere: ``empty_like(q)`` (torch_xla's, for shape inference).

    Example::

        torch.ops.xla.paged_attention(*[t.to("meta") for t in (q, k_pages, v_pages, lengths, page_indices)], 4)
    """
    return non_xla_ragged_paged_attention(q, k_pages, "paged")


def multi_queries_paged_attention_xla(q, k_pages, v_pages, lengths, page_indices, effective_q_lens, *args):
    """``torch.ops.xla.multi_queries_paged_attention`` on lazyxla tensors: :func:`multi_queries_paged_attention`.

    Example::

        out = torch.ops.xla.multi_queries_paged_attention(q, k_pages, v_pages, lengths, pages, q_lens, 4, 8, True)
    """
    return multi_queries_paged_attention(q, k_pages, v_pages, lengths, page_indices, effective_q_lens, *args)


def multi_queries_paged_attention_non_xla(q, k_pages, *args) -> torch.Tensor:
    """``torch.ops.xla.multi_queries_paged_attention`` elsewhere: ``empty_like(q)`` (torch_xla's).

    Example::

        torch.ops.xla.multi_queries_paged_attention(q_meta, k_meta, v_meta, lens, pages, q_lens, 4, 8, True)
    """
    return non_xla_ragged_paged_attention(q, k_pages, "paged")


def ragged_paged_attention_xla(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *args, **kwargs):
    """``torch.ops.xla.ragged_paged_attention`` on lazyxla tensors (vLLM's TPU backend calls it):
    :func:`ragged_paged_attention`; the schema's optional arguments follow in its order.

    Example::

        out = torch.ops.xla.ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, 0.125)
    """
    return ragged_paged_attention(
        q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **dict(zip(_RAGGED_ARGS, args)), **kwargs
    )


def ragged_paged_attention_non_xla(q, kv_pages, *args, **kwargs) -> torch.Tensor:
    """``torch.ops.xla.ragged_paged_attention`` elsewhere: ``empty_like(q)`` (torch_xla's, for shape inference).

    Example::

        torch.ops.xla.ragged_paged_attention(q_meta, kv_meta, lens, pages, cu_q_lens, num_seqs).shape
    """
    return non_xla_ragged_paged_attention(q, kv_pages, "paged")


register("paged_attention", _PAGED_SCHEMA, paged_attention_xla, paged_attention_non_xla)
register("multi_queries_paged_attention", _MULTI_QUERIES_SCHEMA, multi_queries_paged_attention_xla,
         multi_queries_paged_attention_non_xla)  # fmt: skip
register("ragged_paged_attention", _RAGGED_SCHEMA, ragged_paged_attention_xla, ragged_paged_attention_non_xla)
