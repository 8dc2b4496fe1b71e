"""``torch_xla.experimental.xla_quantized_matmul`` on lazyxla: matmuls with int8 (or int4) weights.

torch_xla's math, exactly: the weight ``w`` holds integers, ``scaler`` (and an optional ``zero_point``) turn them
back into real numbers, per output channel or per block of input channels:

* per channel (``block_size=-1``): ``w [out, in]``, ``scaler``/``zero_point [out]``;
  ``out = (x @ w.T) * scaler - sum(x, -1) * zero_point``;
* blockwise (``block_size=b``): ``w [in / b, b, out]``, ``scaler``/``zero_point [in / b, out]``: each block of
  ``b`` input channels has its own scale;
* ``quantize_activation=True`` (per channel only): ``x`` is quantized too, symmetric int8 per row
  (``scale = max|x| / 127`` in x's dtype, ``x_int = round(x / scale)`` clamped to int8's range, as XLA's conversion
  saturates: in bfloat16 a row's largest value can round to 128), the matmul runs int8 x int8 into int32 and the
  result is multiplied by ``scale``;
* ``int4_weight=True``: the weight's values (in ``[-8, 7]``, in an int8 container) are cast to int4 (XLA's s4),
  as torch_xla does.

On a lazyxla tensor ``quantized_matmul_xla`` is one :func:`lazyxla.call_jax` node (an exact XLA formulation: the
integer matmul is XLA's s8 x s8 -> s32 dot). ``quantized_matmul`` is torch_xla's PyTorch formulation (what
``torch.ops.xla.quantized_matmul`` runs on the CPU), on any device. ``XlaQuantizedLinear`` uses the one that fits
its input's device. The results' dtype is torch's promotion of the operands' (a float32 ``scaler`` with bfloat16
activations gives float32), as in torch_xla.

Example::

    from torch_xla.experimental.xla_quantized_matmul import XlaQuantizedLinear, quantized_matmul_xla

    out = quantized_matmul_xla(x, w_int8, scaler)                              # x [..., in] on the lazyxla device
    layer = XlaQuantizedLinear(512, 1024, is_symmetric=True)
    layer.load_quantized_weight(w_int8, scaler)
    y = layer.to(dev)(x)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.experimental._custom_ops import register
from lazyxla.device.devices import DEVICE_NAMES

INT8_MAX = 2**7 - 1


# ---- shape checks (torch_xla's, raising ValueError with what to pass) ---------------------------------------------


def _check_per_channel(input_dim: int, output_dim: int, w, scaler, zero_point) -> None:
    if w.dtype != torch.int8:
        raise ValueError(f"quantized matmul: the weight must be torch.int8, got {w.dtype}")
    if w.dim() != 2 or tuple(w.shape) != (output_dim, input_dim):
        raise ValueError(
            f"quantized matmul (per channel): the weight must be [output_dim, input_dim] = [{output_dim}, "
            f"{input_dim}], got {list(w.shape)}"
        )
    for name, t in (("scaler", scaler), ("zero_point", zero_point)):
        if t is not None and (t.dim() != 1 or t.shape[0] != output_dim):
            raise ValueError(
                f"quantized matmul (per channel): {name} must be [out_channel] = [{output_dim}], got {list(t.shape)}"
            )


def _check_blockwise(input_dim: int, output_dim: int, block_size: int, w, scaler, zero_point) -> None:
    if w.dtype != torch.int8:
        raise ValueError(f"quantized matmul: the weight must be torch.int8, got {w.dtype}")
    if input_dim % block_size:
        raise ValueError(f"quantized matmul: input_dim {input_dim} is not a multiple of block_size {block_size}")
    blocks = input_dim // block_size
    if w.dim() != 3 or tuple(w.shape) != (blocks, block_size, output_dim):
        raise ValueError(
            f"quantized matmul (blockwise): the weight must be [input_dim / block_size, block_size, output_dim] = "
            f"[{blocks}, {block_size}, {output_dim}], got {list(w.shape)}"
        )
    for name, t in (("scaler", scaler), ("zero_point", zero_point)):
        if t is not None and tuple(t.shape) != (blocks, output_dim):
            raise ValueError(
                f"quantized matmul (blockwise): {name} must be [input_dim / block_size, output_dim] = "
                f"[{blocks}, {output_dim}], got {list(t.shape)}"
            )


def _check(x, w, scaler, zero_point, block_size: int, quantize_activation: bool) -> None:
    if block_size == -1:
        _check_per_channel(x.shape[-1], scaler.shape[0], w, scaler, zero_point)
        return
    if quantize_activation:
        raise ValueError("quantized matmul: blockwise quantization (block_size != -1) has no quantize_activation")
    _check_blockwise(x.shape[-1], w.shape[-1], block_size, w, scaler, zero_point)


# ---- the XLA formulation (JAX, one call_jax node) ------------------------------------------------------------------


def _quantize_rows(x):
    """torch_xla's ``_quantize_tensor`` in JAX: symmetric int8 per row, ``(x_int, scale)`` with ``scale`` in x's
    dtype (``max|x| / 127``, computed in that dtype, as torch_xla and its Pallas kernel do).

    Example::

        x_int, scale = _quantize_rows(jnp.array([[1.0, -2.0]]))     # [[64, -127]], [[2/127]]
    """
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / INT8_MAX
    return jnp.clip(jnp.round(x / scale), -INT8_MAX - 1, INT8_MAX).astype(jnp.int8), scale


def _xla_quantized_matmul(x, w, scaler, zero_point, *, block_size: int, int4_weight: bool, quantize_activation: bool):
    """The JAX function ``quantized_matmul_xla`` calls: torch_xla's ``quantized_matmul`` in ``jax.numpy``
    (dtypes promote as torch's do for these operands).

    Example::

        out = _xla_quantized_matmul(x, w, s, None, block_size=-1, int4_weight=False, quantize_activation=False)
    """
    if int4_weight:
        w = w.astype(jnp.int4)  # torch_xla's _xla_cast_int4: XLA's s4
    x_scale = None
    if block_size == -1:
        if quantize_activation:
            x, x_scale = _quantize_rows(x)
            out = jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.int32)
        else:
            out = jnp.einsum("...c,oc->...o", x, w.astype(x.dtype))
        out = out * scaler
    else:
        x = x.reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)
        out = jnp.einsum("scn,...sc->...sn", w.astype(x.dtype), x)
        out = jnp.einsum("sn,...sn->...n", scaler, out)
    if zero_point is not None:
        if block_size == -1:
            zp_out = jnp.einsum("...c,z->...z", x, zero_point)
        else:
            zp_out = jnp.matmul(x.sum(axis=-1), zero_point)
        out = out - zp_out
    if x_scale is not None:
        out = out * x_scale
    return out


def _on_lazyxla(t: torch.Tensor) -> bool:
    return t.device.type in DEVICE_NAMES


def quantized_matmul_xla(
    x: torch.Tensor,
    w: torch.Tensor,
    scaler: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    block_size: int = -1,
    int4_weight: bool = False,
    quantize_activation: bool = False,
) -> torch.Tensor:
    """torch_xla's quantized matmul on the lazyxla device: ``x [..., in]`` times the int8 weight ``w`` rescaled by
    ``scaler`` (and ``zero_point``), one :func:`lazyxla.call_jax` node. Shapes are the module's (per channel:
    ``w [out, in]``, ``scaler [out]``; blockwise: ``w [in / block_size, block_size, out]``, ``scaler
    [in / block_size, out]``). On CPU tensors it is :func:`quantized_matmul` (what torch_xla's op runs there).
    Differentiable in ``x`` (through ``jax.vjp``; zero through the activation's rounding).

    Example::

        out = quantized_matmul_xla(x, w_int8, scaler)                                  # per channel
        out = quantized_matmul_xla(x, w_int8, scaler, quantize_activation=True)       # int8 x int8 -> int32
        out = quantized_matmul_xla(x, w_blocks, scaler_blocks, block_size=32)         # blockwise
    """
    _check(x, w, scaler, zero_point, block_size, quantize_activation)
    if not _on_lazyxla(x):
        return quantized_matmul(x, w, scaler, zero_point, block_size, int4_weight, quantize_activation)
    return lazyxla.call_jax(
        _xla_quantized_matmul,
        x,
        w,
        scaler,
        zero_point,
        block_size=int(block_size),
        int4_weight=bool(int4_weight),
        quantize_activation=bool(quantize_activation),
    )


# ---- torch_xla's PyTorch formulation (its CompositeExplicitAutograd kernel) ----------------------------------------


def _quantize_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    max_val = torch.amax(torch.abs(x), dim=-1, keepdim=True)
    scale = max_val / INT8_MAX
    # clamped as XLA's conversion saturates on the device (torch's .to(int8) would wrap a bfloat16 row's 127.5 -> 128
    # to -128 on the CPU)
    return torch.round(x / scale).clamp(-INT8_MAX - 1, INT8_MAX).to(torch.int8), scale.to(x.dtype)


def quantized_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    scaler: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    block_size: int = -1,
    int4_weight: bool = False,
    quantize_activation: bool = False,
) -> torch.Tensor:
    """torch_xla's quantized matmul written in PyTorch ops (the kernel ``torch.ops.xla.quantized_matmul`` runs off
    an XLA device), on any device: the reference :func:`quantized_matmul_xla` equals. ``int4_weight`` changes
    nothing here (the values are already integers in ``[-8, 7]``).

    Example::

        out = quantized_matmul(x_cpu, w_int8, scaler)
    """
    _check(x, w, scaler, zero_point, block_size, quantize_activation)
    x_scale = None
    if block_size == -1:
        w = w.to(x.dtype)
        if quantize_activation:
            x, x_scale = _quantize_tensor(x)
            x, w = x.to(torch.int32), w.to(torch.int32)  # an int32 matmul (int8 would overflow)
        out = F.linear(x, w) * scaler
    else:
        x = x.reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)
        out = torch.einsum("scn,...sc->...sn", w.to(x.dtype), x)
        out = torch.einsum("sn,...sn->...n", scaler, out)
    if zero_point is not None:
        if block_size == -1:
            zp_out = torch.einsum("...c,z->...z", x, zero_point)
        else:
            zp_out = torch.matmul(x.sum(dim=-1), zero_point)
        out = out - zp_out
    if x_scale is not None:
        out = out * x_scale
    return out


class XlaQuantizedLinear(torch.nn.Module):
    """torch_xla's linear layer with an int8 (or int4) weight: buffers ``weight``, ``weight_scaler`` and, unless
    ``is_symmetric``, ``zero_point``; ``forward`` is :func:`quantized_matmul_xla` on the lazyxla device and
    :func:`quantized_matmul` elsewhere (as ``torch.ops.xla.quantized_matmul`` dispatches in torch_xla).

    Example::

        layer = XlaQuantizedLinear(5, 8, is_symmetric=True, quantize_activation=True)
        layer.load_quantized_weight(w_int8, scaler)          # [8, 5] int8, [8]
        y = layer.to(dev)(x.to(dev))
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        is_symmetric: bool = False,
        block_size: int = -1,
        int4_weight: bool = False,
        quantize_activation: bool = False,
    ):
        super().__init__()
        self.input_dim, self.output_dim = input_dim, output_dim
        self.is_symmetric, self.block_size = is_symmetric, block_size
        self.int4_weight, self.quantize_activation = int4_weight, quantize_activation
        self.register_buffer("weight", torch.zeros(output_dim, input_dim).to(torch.int8))
        self.register_buffer("weight_scaler", torch.zeros(output_dim))
        if not self.is_symmetric:
            self.register_buffer("zero_point", torch.zeros(output_dim))
        else:
            self.zero_point = None

    def load_quantized_weight(self, weight, weight_scaler, zero_point=None) -> None:
        """Set the quantized weight (per channel ``[out, in]``, blockwise ``[in / block_size, block_size, out]``),
        its scaler and zero point, checking their shapes.

        Example::

            layer.load_quantized_weight(w_int8, scaler, zero_point)
        """
        if self.block_size == -1:
            _check_per_channel(self.input_dim, self.output_dim, weight, weight_scaler, zero_point)
        else:
            _check_blockwise(self.input_dim, self.output_dim, self.block_size, weight, weight_scaler, zero_point)
        self.weight = weight
        self.weight_scaler = weight_scaler
        self.zero_point = zero_point

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quantized_matmul_xla(
            x,
            self.weight,
            self.weight_scaler,
            self.zero_point,
            block_size=self.block_size,
            int4_weight=self.int4_weight,
            quantize_activation=self.quantize_activation,
        )


def _quantized_matmul_op(x, w, scaler, zero_point=None, block_size=-1, int4_weight=False, quantize_activation=False):
    # the schema's optionals may come as None: torch_xla's defaults then
    return quantized_matmul_xla(
        x, w, scaler, zero_point, -1 if block_size is None else block_size, bool(int4_weight), bool(quantize_activation)
    )


def _quantized_matmul_shape(x, w, scaler, zero_point=None, block_size=-1, int4_weight=False, quantize_activation=False):
    # torch_xla's CompositeExplicitAutograd kernel is its PyTorch formulation: the real value off the device
    return quantized_matmul(
        x, w, scaler, zero_point, -1 if block_size is None else block_size, bool(int4_weight), bool(quantize_activation)
    )


# torch.ops.xla.quantized_matmul, which torch_xla registers when this module is imported (its schema, verbatim)
register(
    "quantized_matmul",
    "quantized_matmul(Tensor x, Tensor w, Tensor scale, Tensor? zero_point=None, int? block_size=-1,"
    " bool? int4_weight=False, bool? quantize_activation=False) -> Tensor",
    _quantized_matmul_op,
    _quantized_matmul_shape,
    probes=1,
)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
