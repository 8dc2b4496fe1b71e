"""The encoding of values that processes of a run exchange through jax's coordination service.

Whatever another process put in the coordination service's key-value store is network data: anyone who
can reach the coordinator can write it. So it is never unpickled. A value is a JSON tree of plain data
with raw buffers after it, and decoding builds nothing but ``None``, ``bool``, ``int``, ``float``,
``complex``, ``str``, ``bytes``, lists, tuples, dicts, NumPy arrays and scalars, and CPU torch tensors
(with ``torch.Size`` and ``torch.dtype``). Anything else is a ``TypeError`` at the sender, and bytes not
in this encoding are a ``ValueError`` at the receiver.

Layout: ``MAGIC``, the header's length (8 bytes, little-endian), the header (UTF-8 JSON: ``{"value":
tree, "buffers": [length, ...]}``), then the buffers back to back. In the tree, JSON's ``null``, booleans,
numbers and strings stand for themselves; every other value is a one-key object naming its kind.

Example::

    from lazyxla.device import wire
    data = wire.encode({"loss": torch.tensor(0.25), "step": 3})
    assert wire.decode(data)["step"] == 3
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch

MAGIC = b"lazyxla-wire/1\n"

SUPPORTED = (
    "None, bool, int, float, complex, str, bytes, lists, tuples, dicts, NumPy arrays and scalars, torch "
    "tensors (sent as CPU tensors), torch.Size and torch.dtype"
)

# torch dtypes a tensor may have on the wire, by name (the quantized and sub-byte ones have no plain bytes)
_TORCH_DTYPES = {
    name: getattr(torch, name)
    for name in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
}  # fmt: skip
_NUMPY_KINDS = "biufcmMSU"  # NumPy dtypes with plain bytes: no objects, no structured records


def encode(value: Any, what: str = "value") -> bytes:
    """``value`` as bytes that :func:`decode` turns back into an equal value; ``what`` names it in errors.

    Example::

        data = wire.encode([1, 2.5, "a", np.arange(3)])
    """
    buffers: list[bytes] = []
    tree = _tree(value, buffers, what)
    header = json.dumps({"value": tree, "buffers": [len(b) for b in buffers]}, separators=(",", ":")).encode()
    return b"".join([MAGIC, len(header).to_bytes(8, "little"), header, *buffers])


def decode(data: bytes, source: str = "another process") -> Any:
    """The value :func:`encode` wrote into ``data``; ``ValueError`` for bytes it did not write.

    Example::

        value = wire.decode(wire.encode({"acc": 0.9}))
    """
    data = bytes(data)
    try:
        if not data.startswith(MAGIC):
            raise ValueError("it does not start with lazyxla's wire header")
        start = len(MAGIC) + 8
        size = int.from_bytes(data[len(MAGIC) : start], "little")
        header = json.loads(data[start : start + size].decode("utf-8"))
        if not isinstance(header, dict) or set(header) != {"value", "buffers"}:
            raise ValueError("its header is not {'value', 'buffers'}")
        lengths = header["buffers"]
        if not isinstance(lengths, list) or not all(type(n) is int and n >= 0 for n in lengths):
            raise ValueError("its buffer lengths are not a list of sizes")
        if start + size + sum(lengths) != len(data):
            raise ValueError(f"its buffers do not add up to its {len(data)} bytes")
        buffers, offset = [], start + size
        for n in lengths:
            buffers.append(data[offset : offset + n])
            offset += n
        return _value(header["value"], buffers)
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, UnicodeDecodeError) as e:
        raise ValueError(
            f"lazyxla: the data received from {source} is not a value in lazyxla's wire encoding ({e}); it was "
            "refused and nothing in it was run. Every process of a run must use the same lazyxla version, and "
            "nothing else may write lazyxla's keys in the coordination service."
        ) from None


# --- encoding ---------------------------------------------------------------------------------------


def _tree(value: Any, buffers: list[bytes], path: str) -> Any:
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"float": repr(value)}  # JSON has no nan/inf
    if type(value) is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": _buffer(buffers, bytes(value))}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": _torch_dtype_name(value, path)}
    if isinstance(value, (list, tuple)):  # subclasses (namedtuples, ...) arrive as plain lists and tuples
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [_tree(v, buffers, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):  # OrderedDict, defaultdict, ... arrive as plain dicts
        return {"dict": [[_tree(k, buffers, f"{path} key {k!r}"), _tree(v, buffers, f"{path}[{k!r}]")]
                         for k, v in value.items()]}  # fmt: skip
    if isinstance(value, torch.Tensor):
        return {"tensor": _tensor(value, buffers, path)}
    if isinstance(value, np.ndarray) and type(value) is np.ndarray:
        dtype = _numpy_dtype(value.dtype, path)
        return {"ndarray": [dtype, list(value.shape), _buffer(buffers, np.ascontiguousarray(value).tobytes())]}
    if isinstance(value, np.generic):
        return {"npscalar": [_numpy_dtype(value.dtype, path), _buffer(buffers, np.asarray(value).tobytes())]}
    raise TypeError(
        f"lazyxla cannot send {path} to the other processes: it is a {type(value).__module__}."
        f"{type(value).__qualname__}, and values exchanged between processes may hold only {SUPPORTED} "
        "(they are never pickled: the receiver would run whatever the bytes say). Convert it to one of "
        "those first (e.g. a dataclass with dataclasses.asdict, an object with a dict of its fields)."
    )


def _buffer(buffers: list[bytes], data: bytes) -> int:
    buffers.append(data)
    return len(buffers) - 1


def _torch_dtype_name(dtype: torch.dtype, path: str) -> str:
    name = str(dtype).removeprefix("torch.")
    if _TORCH_DTYPES.get(name) is not dtype:
        raise TypeError(f"lazyxla cannot send {path} to the other processes: dtype {dtype} has no plain bytes")
    return name


def _tensor(t: torch.Tensor, buffers: list[bytes], path: str) -> list:
    if t.layout != torch.strided:
        raise TypeError(f"lazyxla cannot send {path} to the other processes: a {t.layout} tensor; send t.to_dense()")
    name = _torch_dtype_name(t.dtype, path)
    flat = t.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes()
    return [name, list(t.shape), _buffer(buffers, raw)]


def _numpy_dtype(dtype: np.dtype, path: str) -> str:
    if dtype.kind not in _NUMPY_KINDS or dtype.hasobject or dtype.fields is not None:
        raise TypeError(
            f"lazyxla cannot send {path} to the other processes: NumPy dtype {dtype} holds Python objects or "
            "records; send plain numeric, bool or string arrays"
        )
    return dtype.str


# --- decoding ---------------------------------------------------------------------------------------


def _value(node: Any, buffers: list[bytes]) -> Any:
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is not dict or len(node) != 1:
        raise ValueError(f"unexpected node {type(node).__name__}")
    ((kind, body),) = node.items()
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ValueError(f"unknown kind {kind!r}")
    return decoder(body, buffers)


def _items(body: Any) -> list:
    if type(body) is not list:
        raise ValueError("a container's items are not a list")
    return body


def _pair(item: Any, buffers: list[bytes]) -> tuple:
    key, value = _fields(item, 2)
    return _value(key, buffers), _value(value, buffers)


def _float_text(text: Any) -> float:
    if type(text) is not str:
        raise ValueError("a float is not written as text")
    return float(text)


def _shape(shape: Any) -> tuple[int, ...]:
    if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"bad shape {shape!r}")
    return tuple(shape)


def _raw(buffers: list[bytes], index: Any, size: int) -> bytes:
    raw = _bytes(index, buffers)
    if len(raw) != size:
        raise ValueError(f"buffer {index} holds {len(raw)} bytes where {size} are due")
    return raw


def _fields(body: Any, n: int) -> list:
    if type(body) is not list or len(body) != n:
        raise ValueError(f"expected {n} fields, got {body!r:.80}")
    return body


def _complex(body: Any, buffers: list[bytes]) -> complex:
    real, imag = _fields(body, 2)
    return complex(_float_text(real), _float_text(imag))


def _bytes(index: Any, buffers: list[bytes]) -> bytes:
    if type(index) is not int or not 0 <= index < len(buffers):
        raise ValueError(f"bad buffer index {index!r}")
    return buffers[index]


def _ndarray(body: Any, buffers: list[bytes]) -> np.ndarray:
    dtype_str, shape, index = _fields(body, 3)
    dtype = _checked_numpy_dtype(dtype_str)
    shape = _shape(shape)
    raw = _raw(buffers, index, math.prod(shape) * dtype.itemsize)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _npscalar(body: Any, buffers: list[bytes]) -> np.generic:
    dtype_str, index = _fields(body, 2)
    dtype = _checked_numpy_dtype(dtype_str)
    return np.frombuffer(_raw(buffers, index, dtype.itemsize), dtype=dtype)[0]


def _checked_numpy_dtype(text: Any) -> np.dtype:
    if type(text) is not str:
        raise ValueError("a NumPy dtype is not a string")
    dtype = np.dtype(text)
    if dtype.kind not in _NUMPY_KINDS or dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"NumPy dtype {text!r} is not a plain one")
    return dtype


def _torch_tensor(body: Any, buffers: list[bytes]) -> torch.Tensor:
    name, shape, index = _fields(body, 3)
    dtype = _TORCH_DTYPES.get(name) if type(name) is str else None
    if dtype is None:
        raise ValueError(f"unknown torch dtype {name!r}")
    shape = _shape(shape)
    raw = _raw(buffers, index, math.prod(shape) * dtype.itemsize)
    if not raw:  # an empty tensor: a view of no bytes has no strides to reinterpret
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()).view(dtype).reshape(shape)


def _torch_dtype(name: Any, buffers: list[bytes]) -> torch.dtype:
    dtype = _TORCH_DTYPES.get(name) if type(name) is str else None
    if dtype is None:
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


_DECODERS = {
    "float": lambda body, buffers: _float_text(body),
    "complex": _complex,
    "bytes": _bytes,
    "size": lambda body, buffers: torch.Size(_shape(body)),
    "dtype": _torch_dtype,
    "list": lambda body, buffers: [_value(v, buffers) for v in _items(body)],
    "tuple": lambda body, buffers: tuple(_value(v, buffers) for v in _items(body)),
    "dict": lambda body, buffers: dict(_pair(item, buffers) for item in _items(body)),
    "ndarray": _ndarray,
    "npscalar": _npscalar,
    "tensor": _torch_tensor,
}
