"""``torch_xla._XLAC`` on lazyxla: the bindings of torch_xla's C++ module that libraries and torch_xla's public
tests call: ``_xla_get_tensor_id``, ``_get_xla_sharding_spec``, ``_ensure_xla_coordinator_initialized``,
``_xla_get_auto_sharding``, ``_xla_set_mat_mul_precision``/``_xla_get_mat_mul_precision`` (over
``lazyxla.config.matmul_precision``), and the debugging ones: ``_get_xla_tensors_hlo`` (XLA's HLO text of the
pending program, ``lazyxla.debug.hlo_text``), ``_get_xla_tensors_text`` (lazyxla's IR text where torch_xla
prints its own IR), ``_get_graph_hash`` and ``_get_xla_tensor_debug_info``.

transformers' ``id_tensor_storage`` (``save_pretrained``'s search for tied weights) and peft's equivalent ask it
for a tensor whose ``device.type`` is ``"xla"``, because XLA tensors have no storage pointer. Every other name
of torch_xla's C++ module raises ``AttributeError``.

Example::

    import torch_xla
    a, b = w.detach(), w.detach()
    assert torch_xla._XLAC._xla_get_tensor_id(a) == torch_xla._XLAC._xla_get_tensor_id(b)
"""

from __future__ import annotations

import os

import torch

import lazyxla
import lazyxla.debug
from lazyxla import jax_private, torch_private
from lazyxla.compat._common import missing_attribute, platform_name
from lazyxla.compat.torch_xla.debug import metrics as met
from lazyxla.device import processes
from lazyxla.device.devices import on_device
from lazyxla.ir import Leaf
from lazyxla.lazy.tensor import unwrap


def _xla_get_tensor_id(tensor: torch.Tensor) -> int:
    """A number that identifies the device data ``tensor`` shares with its views (``detach()``, slices,
    transposes, a tied parameter's other names), the same for as long as that data lives; tensors that do not
    share it (a ``clone()`` included) get different numbers. It stands for the storage pointer device tensors do
    not have, which is what transformers uses it for.

    Example::

        torch_xla._XLAC._xla_get_tensor_id(model.lm_head.weight.detach())
    """
    if not isinstance(tensor, torch.Tensor) or not on_device(tensor):
        where = tensor.device if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise RuntimeError(f"torch_xla._XLAC._xla_get_tensor_id: expected a tensor on the XLA device, got {where}")
    return torch_private.storage_id(tensor)


def _get_xla_sharding_spec(tensor: torch.Tensor) -> str:
    """The HLO sharding text of ``tensor``'s SPMD annotation (``''`` without one), as torch_xla users read it to
    check a layout: ``torch_xla.distributed.spmd.debugging.construct_v1_sharding_str``.

    Example::

        xs.mark_sharding(t, mesh, ("data", None))
        print(torch_xla._XLAC._get_xla_sharding_spec(t))     # {devices=[4,1]0,1,2,3}
    """
    from lazyxla.compat.torch_xla.distributed.spmd import debugging  # loads rich: only when a sharding is asked for

    return debugging.construct_v1_sharding_str(tensor)


def _ensure_xla_coordinator_initialized(
    global_rank: int, world_size: int, master_addr: str, master_port: int | None = None
) -> None:
    """Check that the run's coordinator serves ``world_size`` processes with this one as ``global_rank``.

    lazyxla starts its coordinator (jax's distributed runtime) when the run starts (``python -m lazyxla.run``,
    ``xmp.spawn``, torchrun variables), so there is nothing left to start; a rank or size that differs from the
    run's raises ``RuntimeError``. (torch_xla's checkpoint tests and ``CheckpointManager`` call it.)

    Example::

        torch_xla._XLAC._ensure_xla_coordinator_initialized(global_rank=0, world_size=1, master_addr="localhost")
    """
    rank, size = processes.process_index(), processes.process_count()
    if (global_rank, world_size) != (rank, size):
        raise RuntimeError(
            f"_ensure_xla_coordinator_initialized(global_rank={global_rank}, world_size={world_size}): this run's "
            f"coordinator serves {size} process(es) and this one is rank {rank}"
        )


def _xla_get_auto_sharding() -> bool:
    """Whether auto-sharding mode is on (``torch_xla.runtime.use_spmd(auto=True)``, which says what it means in
    lazyxla).

    Example::

        xr.use_spmd(auto=True)
        assert torch_xla._XLAC._xla_get_auto_sharding()
    """
    return met.auto_sharding()


def _xla_set_mat_mul_precision(precision: str) -> None:
    """Set the precision of float32 matmuls: ``lazyxla.config.matmul_precision`` ('default', 'high', 'highest').

    Example::

        torch_xla._XLAC._xla_set_mat_mul_precision("highest")      # torch_xla's test_pallas.py does this
    """
    if precision not in ("default", "high", "highest"):
        raise ValueError(
            f"_xla_set_mat_mul_precision: precision must be 'default', 'high' or 'highest', got {precision!r}"
        )
    lazyxla.config.matmul_precision = precision


def _xla_get_mat_mul_precision() -> str:
    """The precision of float32 matmuls (``lazyxla.config.matmul_precision``).

    Example::

        torch_xla._XLAC._xla_get_mat_mul_precision()                # 'highest'
    """
    return lazyxla.config.matmul_precision


def _get_xla_tensors_hlo(tensors: list[torch.Tensor]) -> str:
    """XLA's HLO text (``HloModule ...``) of the program that would compute ``tensors``' pending values
    (``lazyxla.debug.hlo_text``): nothing runs, compiles or changes. A tensor already computed is a parameter the
    program returns, as in torch_xla. The instructions are jax's lowering of lazyxla's graph, so their names
    (``dot_general.1``, ``args_0_.1``) are not the ones torch_xla's builder gives (``%dot.3``, ``%p0.1``).

    Example::

        hlo = torch_xla._XLAC._get_xla_tensors_hlo([a @ b])
        assert " dot(" in hlo
    """
    return lazyxla.debug.hlo_text(_device_tensors(tensors, "_get_xla_tensors_hlo"))


def _get_xla_tensors_text(tensors: list[torch.Tensor]) -> str:
    """The graph that would compute ``tensors``, as text: lazyxla's IR (``lazyxla.debug.ir_text``), one node per
    line, where torch_xla prints its own IR (``IR {  %0 = f32[] prim::Constant() ...}``). The nodes are the aten
    ops lazyxla recorded (``aten.add.Tensor``); a tensor already computed is a ``data`` leaf.

    Example::

        assert "aten.add" in torch_xla._XLAC._get_xla_tensors_text([a + b])
    """
    return lazyxla.debug.ir_text(_device_tensors(tensors, "_get_xla_tensors_text"), computed=True)


def _get_graph_hash(tensors: list[torch.Tensor]) -> bytes:
    """Bytes naming the program that would compute ``tensors`` (``lazyxla.debug.graph_hash``): equal for graphs
    of the same operations on inputs of the same shapes, dtypes and layouts, whatever the values; different
    otherwise. As in torch_xla it also covers auto-sharding mode and ``XLA_AUTO_SPMD_MESH`` while that mode is
    on. 8 bytes (torch_xla's are 16); valid within one process.

    Example::

        h = torch_xla._XLAC._get_graph_hash([x + 1])
        assert h == torch_xla._XLAC._get_graph_hash([y + 1])     # y: x's shape and dtype, other values
    """
    h = lazyxla.debug.graph_hash(_device_tensors(tensors, "_get_graph_hash"))
    if met.auto_sharding():  # torch_xla's GetGraphHash mixes these in while the mode is on
        h = hash((h, True, os.environ.get("XLA_AUTO_SPMD_MESH", "")))
    return h.to_bytes(8, "little", signed=True)


def _get_xla_tensor_debug_info(tensor: torch.Tensor) -> str:
    """What lazyxla holds for ``tensor``, in torch_xla's layout: ``XLATensor {``, then ``TensorID``, ``Device``
    (``SPMD:0`` in SPMD mode, else ``CPU:0``...), ``XLA Shape`` (``f32[4,2]``), ``ShardingSpec``
    (``_get_xla_sharding_spec``, or None), ``IR`` (the pending op, ``xla::device_data`` for a computed tensor),
    ``XLAData`` (the device buffer: ``XLAShardedData`` with its ``OpSharding`` and ``NumShards`` in SPMD mode;
    None while pending) and ``Tensor on host`` (a small value lazyxla keeps on the host until a program needs
    it). ``"Not a XLATensor\\n"`` for a tensor not on the device, as torch_xla.

    Example::

        print(torch_xla._XLAC._get_xla_tensor_debug_info(t))
    """
    tensor = getattr(tensor, "global_tensor", tensor)
    if not isinstance(tensor, torch.Tensor) or not on_device(tensor):
        return "Not a XLATensor\n"
    node, index = unwrap(tensor)._value
    aval = node.avals[index]
    spec = _get_xla_sharding_spec(tensor)
    lines = [
        "XLATensor {",
        f"TensorID: {_xla_get_tensor_id(tensor)}",
        f"Device: {_device_name(node.device)}",
        f"XLA Shape: {_shape_text(aval)}",
        f"ShardingSpec: {spec or 'None'}",
        f"IR: {_ir_text(node, aval)}",
        _data_text(node, aval, spec).rstrip("\n"),
        "Tensor on host: "
        + (f"with size {list(aval.shape)}" if node.host is not None and node.resident is None else "None"),
        "}",
    ]
    return "\n".join(lines) + "\n"


def _device_tensors(tensors, binding: str) -> list[torch.Tensor]:
    tensors = [getattr(t, "global_tensor", t) for t in tensors]  # XLAShardedTensor wrappers: their global tensor
    for t in tensors:
        if not isinstance(t, torch.Tensor) or not on_device(t):
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise RuntimeError(f"torch_xla._XLAC.{binding}: expected tensors on the XLA device, got one on {where}")
    return tensors


def _device_name(index: int) -> str:
    return "SPMD:0" if lazyxla.spmd.is_enabled() else f"{platform_name()}:{index}"


def _shape_text(aval) -> str:
    return f"{_XLA_TYPES.get(aval.dtype, str(aval.dtype))}[{','.join(map(str, aval.shape))}]"


def _ir_text(node, aval) -> str:
    if node.op is Leaf.DATA:  # a computed tensor: torch_xla's IR value for device data
        return f"xla::device_data, xla_shape={_shape_text(aval)}, device={_device_name(node.device)}"
    if isinstance(node.op, Leaf):
        return f"{node.op.value}, xla_shape={_shape_text(aval)}"
    name = node.op.name() if hasattr(node.op, "name") else str(node.op)  # an OpOverload: 'aten::div.Tensor'
    return f"{name}, xla_shape={_shape_text(aval)}"


def _data_text(node, aval, spec: str) -> str:
    """torch_xla's text of the device data behind a tensor (its runtime's ``Data::ToString``)."""
    arr = node.resident if node.op is Leaf.DATA else None
    if arr is None:
        return "XLAData: None"
    head = f"  Data Device: {_device_name(node.device)}\n  Data Shape: {_shape_text(aval)}\n"
    if lazyxla.spmd.is_enabled():
        layout = spec or str(jax_private.hlo_sharding(arr.sharding, len(aval.shape)))
        return f"XLAShardedData: \n{head}  OpSharding: {layout}\n  NumShards: {len(arr.addressable_shards)}\n"
    return f"XLAData: \n{head}  Data Handle: {id(arr)}\n"


# torch dtypes as XLA's primitive types print (Shape::ToString)
_XLA_TYPES = {
    torch.bool: "pred", torch.uint8: "u8", torch.int8: "s8", torch.int16: "s16", torch.int32: "s32",
    torch.int64: "s64", torch.uint16: "u16", torch.uint32: "u32", torch.uint64: "u64", torch.float16: "f16",
    torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64", torch.complex64: "c64",
    torch.complex128: "c128", torch.float8_e4m3fn: "f8e4m3fn", torch.float8_e5m2: "f8e5m2",
}  # fmt: skip


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
