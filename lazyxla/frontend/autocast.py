"""Automatic mixed precision for lazyxla: ``torch.autocast("lazyxla", dtype=torch.bfloat16)``.

PyTorch's ``torch.autocast`` works by dispatch key: entering a region for a device type takes that type's
autocast key out of the thread's excluded set, so every op on a tensor of that device first reaches the
autocast key. PyTorch registers kernels there for CPU, CUDA and a few other devices in C++, but none for
PrivateUse1, so on lazyxla every op used to fail with "Could not run ... 'Autocastlazyxla' backend".

:func:`install` registers, at ``AutocastPrivateUse1``:

* a fallthrough for every op, so that ops on no list run unchanged;
* a Python kernel for each op of PyTorch's CUDA autocast lists (see the tables below). A kernel casts the
  eligible tensor arguments (floating point but not float64, on lazyxla) to the policy's dtype, then calls
  the op again with the autocast key excluded, exactly as PyTorch's C++ wrappers do. The casts are ordinary
  ``Tensor.to`` calls above autograd, so they are differentiable: gradients reach float32 parameters as
  float32, and lower-precision ops save their lower-precision inputs for backward.

lazyxla uses the CUDA lists rather than the CPU ones because an XLA device (GPU or TPU) computes matmuls and
convolutions in bfloat16/float16 natively; torch_xla's own autocast does the same. The CPU lists differ (e.g.
softmax and layer_norm are not on them, cat and stack promote there).

One difference from PyTorch's C++ wrappers: lazyxla does not keep a cache of the lower-precision copies of
float32 parameters; each use records its own convert, which XLA merges (CSE) within a compiled step.

Example::

    import torch, lazyxla
    x = torch.randn(8, 8, device="lazyxla")
    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        y = x @ x                   # bfloat16
        z = y.softmax(-1)           # float32
"""

from __future__ import annotations

import functools

import torch

from lazyxla import torch_private
from lazyxla.device import devices
from lazyxla.device.devices import on_device

KEY = "AutocastPrivateUse1"

aten = torch.ops.aten

# ---- the op lists ----
#
# They mirror what PyTorch registers at its CUDA autocast key (aten/src/ATen/autocast_mode.cpp, built from the
# AT_FORALL_* lists of ATen/autocast_mode.h) in every torch version lazyxla supports (2.13 and 2.14): an entry
# whose op the installed torch lacks is skipped. An op the installed torch autocasts on CUDA that these tables do
# not name (a newer torch) runs in float32, the choice that never loses precision: see `unlisted`. The test suite
# checks that lazyxla registers exactly the ops that have an AutocastCUDA kernel in the installed torch, and that
# the pinned torch has no unlisted op. Names are "op" (default overload) or "op.overload".

# Run in the autocast dtype (torch.get_autocast_dtype("lazyxla")): matmuls, convolutions, RNN cells, attention.
LOWER_PRECISION_FP = (
    "_convolution.deprecated",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
    # CUDA-only entries of the same policy (never reached on lazyxla, listed to mirror the CUDA table)
    "cudnn_convolution",
    "cudnn_convolution_transpose",
    "_cudnn_rnn",  # registered only by CUDA builds of torch (ATen/cudnn/AutocastRNN.cpp)
)

# Run in float32: ops whose range or accuracy suffers in 16 bits (exp/log family, norms, losses, upsampling).
FP32 = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "linalg_matrix_sqrth",  # since torch 2.14
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)

# Reductions with an optional ``dtype`` argument: when the first argument is eligible and no dtype was given,
# they compute (and return) float32; the inputs are not cast.
FP32_SET_OPT_DTYPE = (
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
)

# Overloads without a dtype argument, run as their dtype-taking sibling with dtype=float32 (when the first
# argument is eligible; otherwise with its own dtype).
FP32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}

# Ops of several floating inputs: run in the widest floating dtype among the eligible ones.
PROMOTE = (
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
)

# Refused inside an autocast region, as on CUDA.
BANNED = ("binary_cross_entropy",)

_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy (torch.nn.BCELoss) is refused inside a device autocast region: "
    "a lower-precision probability loses too much accuracy near 0 and 1. Feed the logits to "
    "torch.nn.functional.binary_cross_entropy_with_logits (torch.nn.BCEWithLogitsLoss) instead, which autocast "
    "runs in float32; or compute the loss outside the autocast region."
)

_EXCLUDE = torch_private.DispatchKeySet(torch_private.DispatchKey.AutocastPrivateUse1)
_exclude = torch_private.ExcludeDispatchKeyGuard  # per op: the kernels call the op again with their key excluded
# per op: True inside lazyxla's own kernels (e.g. a decomposition below functionalization): never cast there
_below_functionalization = torch_private.below_functionalization
_library = None


def _overload(name: str):
    op, _, overload = name.partition(".")
    return getattr(getattr(aten, op), overload or "default")


@functools.cache
def _cuda_autocast_ops() -> frozenset[str]:
    """The ops the installed torch registers at its CUDA autocast key, as the tables name them."""
    cuda = torch_private.registrations_for("AutocastCUDA")
    return frozenset(r.removeprefix("aten::") for r in cuda if r.startswith("aten::"))


def _listed() -> set[str]:
    names = (*LOWER_PRECISION_FP, *FP32, *FP32_SET_OPT_DTYPE, *FP32_APPEND_DTYPE, *PROMOTE, *BANNED)
    return {name.removesuffix(".default") for name in names}


def unlisted() -> tuple[str, ...]:
    """Ops that the installed torch autocasts on CUDA but lazyxla's tables do not name (empty on the torch
    versions lazyxla is tested with). lazyxla runs them in float32, the policy that never loses precision.

    Example::

        >>> autocast.unlisted()
        ()
    """
    return tuple(sorted(_cuda_autocast_ops() - _listed()))


def _eligible(x) -> bool:
    """A tensor autocast may cast: on lazyxla, floating point, not float64 (as PyTorch's ``is_eligible``)."""
    return isinstance(x, torch.Tensor) and on_device(x) and x.is_floating_point() and x.dtype is not torch.float64


def _cast(x, dtype: torch.dtype):
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.dtype is not dtype and _eligible(x) else x
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(e, dtype) for e in x)
    return x


def _cast_all(args, kwargs, dtype):
    return _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}


def _widest(x, current: torch.dtype, lower: torch.dtype) -> torch.dtype:
    """PyTorch's ``promote_type``: float32 wins over the autocast dtype; float64 tensors are ignored."""
    if isinstance(x, (list, tuple)):
        for e in x:
            current = _widest(e, current, lower)
        return current
    if not _eligible(x) or x.dtype is lower:
        return current
    # float32, or a 16-bit type other than the autocast one (PyTorch raises there; the common type is float32)
    return torch.float32


def _lower_precision_fp(op):
    def kernel(*args, **kwargs):
        with _exclude(_EXCLUDE):
            if not _below_functionalization():
                args, kwargs = _cast_all(args, kwargs, torch.get_autocast_dtype(devices.torch_name()))
            return op(*args, **kwargs)

    return kernel


def _fp32(op):
    def kernel(*args, **kwargs):
        with _exclude(_EXCLUDE):
            if not _below_functionalization():
                args, kwargs = _cast_all(args, kwargs, torch.float32)
            return op(*args, **kwargs)

    return kernel


def _fp32_set_opt_dtype(op):
    arguments = op._schema.arguments
    index = next(i for i, a in enumerate(arguments) if a.name == "dtype")

    def kernel(*args, **kwargs):
        with _exclude(_EXCLUDE):
            if args and _eligible(args[0]) and not _below_functionalization():
                if len(args) > index:
                    if args[index] is None:
                        args = (*args[:index], torch.float32, *args[index + 1 :])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)

    return kernel


def _fp32_append_dtype(op, redispatch):
    arguments = op._schema.arguments

    def kernel(*args, **kwargs):
        with _exclude(_EXCLUDE):
            bound = [args[i] if i < len(args) else kwargs.get(a.name, a.default_value) for i, a in enumerate(arguments)]
            if _below_functionalization():
                return op(*bound)
            dtype = torch.float32 if _eligible(bound[0]) else bound[0].dtype
            return redispatch(*bound, dtype=dtype)

    return kernel


def _promote(op):
    def kernel(*args, **kwargs):
        with _exclude(_EXCLUDE):
            if not _below_functionalization():
                lower = torch.get_autocast_dtype(devices.torch_name())
                dtype = _widest((args, tuple(kwargs.values())), lower, lower)
                args, kwargs = _cast_all(args, kwargs, dtype)
            return op(*args, **kwargs)

    return kernel


def _banned(*args, **kwargs):
    raise RuntimeError(_BANNED_MESSAGE)


def kernels() -> dict[str, object]:
    """The autocast kernel of each listed op, by ``"aten::op[.overload]"`` (what :func:`install` registers).

    Example::

        >>> sorted(lazyxla.autocast.kernels())[:2]
        ['aten::_convolution', 'aten::_convolution.deprecated']
    """
    table = {}
    for name in LOWER_PRECISION_FP:
        table[name] = _lower_precision_fp
    for name in (*FP32, *unlisted()):
        table[name] = _fp32
    for name in FP32_SET_OPT_DTYPE:
        table[name] = _fp32_set_opt_dtype
    for name, target in FP32_APPEND_DTYPE.items():
        table[name] = lambda op, target=target: _fp32_append_dtype(op, _overload(target))
    for name in PROMOTE:
        table[name] = _promote
    for name in BANNED:
        table[name] = lambda op: _banned
    # Only the ops the installed torch autocasts on CUDA: the tables also name ops of a newer torch, or of CUDA
    # builds only (both "follow the installed torch", as the test suite checks).
    table = {
        name: make(_overload(name))
        for name, make in table.items()
        if name.removesuffix(".default") in _cuda_autocast_ops()
    }
    return {"aten::" + name.removesuffix(".default"): fn for name, fn in table.items()}


def policy(op: str) -> str | None:
    """The autocast policy lazyxla applies to ``op`` (``"mm"``, ``"aten::softmax.int"``), or None for an op
    that runs unchanged: one of "lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype",
    "promote", "banned".

    Example::

        >>> autocast.policy("matmul"), autocast.policy("softmax.int"), autocast.policy("relu")
        ('lower_precision_fp', 'fp32_set_opt_dtype', None)
    """
    name = op.removeprefix("aten::").removesuffix(".default")
    for label, names in (
        ("lower_precision_fp", LOWER_PRECISION_FP),
        ("fp32", FP32),
        ("fp32_set_opt_dtype", FP32_SET_OPT_DTYPE),
        ("fp32_append_dtype", FP32_APPEND_DTYPE),
        ("promote", PROMOTE),
        ("banned", BANNED),
    ):
        if name in names:
            return label
    return "fp32" if name in unlisted() else None


def install() -> None:
    """Register the autocast fallthrough and kernels at ``AutocastPrivateUse1`` (idempotent; ``import lazyxla``
    calls it).

    Example::

        >>> autocast.install()
        >>> x = torch.randn(4, 4, device="lazyxla")
        >>> with torch.autocast("lazyxla", dtype=torch.bfloat16):
        ...     (x @ x).dtype
        torch.bfloat16
    """
    global _library
    if _library is not None:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, KEY)
    ops = torch.library.Library("aten", "IMPL")
    for name, fn in kernels().items():
        ops.impl(name.removeprefix("aten::"), fn, KEY)
    _library = (fallthrough, ops)
    if devices.torch_name() == "xla":
        # torch.autocast("xla") without a dtype: bfloat16, PyTorch's default for its own XLA device type (PrivateUse1's
        # is float16). PyTorch keeps the default per thread: this sets it for the thread that imported lazyxla.
        torch.set_autocast_dtype("xla", torch.bfloat16)


__all__ = ["BANNED", "FP32", "FP32_APPEND_DTYPE", "FP32_SET_OPT_DTYPE", "LOWER_PRECISION_FP", "PROMOTE"]
__all__ += ["install", "kernels", "policy"]
