"""``Buckets``: pad variable-length batches on the host to a few fixed shapes, so a loop compiles once per shape.

A lazyxla step compiles once per distinct set of input shapes. A language-model loop whose batches are padded to
the longest sequence in the batch (Hugging Face's ``DataCollatorWithPadding``) sees a new length almost every step
and compiles almost every step. ``Buckets`` pads each batch further, on the host and before the transfer, to the
smallest of a few lengths that holds it: the loop compiles once per bucket it uses. Padded positions carry an
attention mask of 0 and a label of -100 (the ``ignore_index`` of PyTorch's and Hugging Face's losses), so the loss
and the gradients are those of the unpadded batch.

Example::

    loader = lazyxla.DeviceLoader(train_dataloader, dev, pad_to_buckets=(64, 128, 256))
    # or, with every option:
    buckets = lazyxla.Buckets((64, 128, 256), pad_values={"input_ids": tokenizer.pad_token_id}, batch_size=32)
    loader = lazyxla.DeviceLoader(train_dataloader, dev, pad_to_buckets=buckets)
"""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lazyxla.util import warn_once

# Padding values of Hugging Face batch keys: what its tokenizers and collators pad them with. Any other tensor is
# padded with 0 unless ``pad_values`` says otherwise.
CONTINUE = "continue"  # position ids: padded positions go on counting (last + 1, last + 2, ...)
DEFAULT_PAD_VALUES: dict[str, Any] = {
    "labels": -100,
    "label": -100,
    "attention_mask": 0,
    "decoder_attention_mask": 0,
    "token_type_ids": 0,
    "special_tokens_mask": 1,
    "position_ids": CONTINUE,
}
# Which tensor of a dict batch gives the sequence length, in order of preference; else the first tensor that has
# the padded dimension.
_LENGTH_KEYS = ("input_ids", "inputs_embeds", "attention_mask", "labels")


class Buckets:
    """Pads a batch (a tensor, a tuple/list or a dict of tensors, as a DataLoader yields) to a fixed shape.

    The sequence length of a batch is the size along ``dim`` (default 1: batch-first ``[batch, seq, ...]``) of
    its ``input_ids`` (dict batches; else ``inputs_embeds``, ``attention_mask``, ``labels``), or of its first
    tensor that has that dimension. Every tensor of the batch whose size along ``dim`` equals that length is padded
    at the end to the bucket: the smallest of ``lengths`` that holds the batch, or with ``multiple_of`` the next
    multiple. Other tensors (sequence-classification labels ``[batch]``, image features, a decoder side of another
    length) are left as they are. Padding at the end keeps every real token at its position.

    Padding values: ``pad_values`` is one number for every tensor, a dict by key (dict batches; it updates
    ``DEFAULT_PAD_VALUES``: ``labels`` -100, ``attention_mask`` 0, ``token_type_ids`` 0, ``special_tokens_mask``
    1, ``position_ids`` go on counting; any other key 0), or a sequence by position (tuple batches; ``None``: 0).
    Set the ``input_ids`` value to your tokenizer's ``pad_token_id`` to get exactly the collator's batches (with
    the mask at 0 it does not change the result).

    ``add_attention_mask`` (default True): a dict batch with ``input_ids`` and no ``attention_mask`` gets one (1 on
    the batch's tokens, 0 on the padding), so that a bidirectional model does not attend to the padding.

    ``batch_size``: a batch with fewer rows (the last one of an epoch) gets padding rows up to ``batch_size``: every
    token masked, every label -100. Losses that ignore -100 (cross-entropy, Hugging Face's model losses) are then
    those of the short batch; for other losses (regression, a mean over rows) drop the short batch instead
    (``DataLoader(..., drop_last=True)``).

    A batch longer than the largest bucket raises ``ValueError`` naming its length and the buckets. A ``Buckets``
    is a plain host-side function of a batch: it can also run in a ``collate_fn``.

    Example::

        buckets = lazyxla.Buckets((64, 128, 256), pad_values={"input_ids": tokenizer.pad_token_id})
        buckets({"input_ids": ids, "attention_mask": mask, "labels": labels})   # each [8, 100] -> [8, 128]
        lazyxla.Buckets(multiple_of=64)                                           # 100 -> 128, 300 -> 320
        lazyxla.Buckets((128,), batch_size=32)(batch_of_5_rows)                   # [5, 90] -> [32, 128]
    """

    def __init__(
        self,
        lengths: Sequence[int] | None = None,
        *,
        multiple_of: int | None = None,
        dim: int = 1,
        pad_values: float | Mapping[str, Any] | Sequence[Any] | None = None,
        batch_size: int | None = None,
        add_attention_mask: bool = True,
    ) -> None:
        if (lengths is None) == (multiple_of is None):
            raise ValueError("lazyxla.Buckets: give bucket lengths, e.g. Buckets((64, 128, 256)), or multiple_of=64")
        self.lengths = _check_lengths(lengths) if lengths is not None else None
        self.multiple_of = _positive("multiple_of", multiple_of) if multiple_of is not None else None
        if dim == 0:
            raise ValueError("lazyxla.Buckets: dim 0 is the batch dimension; pad the batch with batch_size=")
        self.dim = dim
        self.batch_size = _positive("batch_size", batch_size) if batch_size is not None else None
        self.pad_values = _check_pad_values(pad_values)  # a number, a dict by key or a tuple by position
        self.add_attention_mask = add_attention_mask

    def __repr__(self) -> str:
        size = self.lengths if self.lengths is not None else f"multiple_of={self.multiple_of}"
        return f"Buckets({size}, dim={self.dim}, batch_size={self.batch_size})"

    def length_for(self, n: int) -> int:
        """The padded length of a sequence of length ``n``: the bucket that holds it.

        Example::

            Buckets((64, 128)).length_for(70)      # 128
            Buckets(multiple_of=64).length_for(70)  # 128
        """
        return self._length(n, "")

    def _length(self, n: int, where: str) -> int:
        if self.multiple_of is not None:
            return -(-n // self.multiple_of) * self.multiple_of
        i = bisect.bisect_left(self.lengths, n)
        if i == len(self.lengths):
            largest = self.lengths[-1]
            raise ValueError(
                f"lazyxla.Buckets: a batch has sequence length {n}{where}, longer than the largest bucket {largest} of "
                f"{self.lengths}. Add a bucket of at least {n}, truncate the data to {largest} (a tokenizer's "
                f"truncation=True, max_length={largest}), or pad to a multiple instead: "
                f"Buckets(multiple_of={self.lengths[0]})"
            )
        return self.lengths[i]

    def __call__(self, batch: Any) -> Any:
        """``batch`` with its sequence tensors padded to their bucket (and its rows to ``batch_size``)."""
        if self.add_attention_mask:
            batch = self._with_attention_mask(batch)
        ref, where = _reference(batch, self.dim)
        n = ref.shape[self.dim] if ref is not None else None
        length = self._length(n, where) if ref is not None else None
        rows = ref.shape[0] if ref is not None else _row_count(batch)
        if self.batch_size is not None and rows is not None and rows > self.batch_size:
            raise ValueError(f"lazyxla.Buckets: a batch has {rows} rows, more than batch_size={self.batch_size}")
        return self._pad(batch, None, n, length, rows, 0)

    def _with_attention_mask(self, batch: Any) -> Any:
        if not isinstance(batch, Mapping) or "attention_mask" in batch:
            return batch
        ids = batch.get("input_ids")
        if not isinstance(ids, torch.Tensor) or _axis(ids, self.dim) is None:
            return batch
        mask = torch.ones(ids.shape[: _axis(ids, self.dim) + 1], dtype=torch.long, device=ids.device)
        return _rebuild(batch, [*batch.items(), ("attention_mask", mask)])

    def _pad(self, obj: Any, name: Any, n: int | None, length: int | None, rows: int | None, depth: int) -> Any:
        """``obj`` padded: ``name`` is the key (or top-level position) that chooses the padding value."""
        if isinstance(obj, torch.Tensor):
            return self._pad_tensor(obj, name, n, length, rows)
        if isinstance(obj, Mapping):
            items = [(k, self._pad(v, k, n, length, rows, depth + 1)) for k, v in obj.items()]
            return _rebuild(obj, items)
        if isinstance(obj, (list, tuple)):
            fields = getattr(obj, "_fields", None)  # a namedtuple's field names choose values as dict keys do
            names = fields if fields else (range(len(obj)) if depth == 0 else [name] * len(obj))
            items = [self._pad(v, k, n, length, rows, depth + 1) for k, v in zip(names, obj)]
            return type(obj)(*items) if fields else (type(obj)(items) if type(obj) in (list, tuple) else items)
        return obj

    def _pad_tensor(self, t: torch.Tensor, name: Any, n: int | None, length: int | None, rows: int | None):
        value = self._value(name)
        axis = _axis(t, self.dim)
        padded = t
        if axis is not None and t.shape[axis] == n and length > n:
            padded = _pad_along(padded, axis, length - n, value)
        if self.batch_size is not None and t.ndim > 0 and t.shape[0] == rows < self.batch_size:
            padded = _pad_rows(padded, self.batch_size - rows, value, axis)
        if padded is not t and t.device.type != "cpu":
            warn_once(
                "buckets:device",
                f"lazyxla.Buckets: padding a tensor already on {t.device}: each length then compiles a padding "
                "program; pad on the host, before the transfer (DeviceLoader(..., pad_to_buckets=...) does)",
            )
        return padded

    def _value(self, name: Any) -> Any:
        values = self.pad_values
        if isinstance(values, tuple):
            if isinstance(name, int) and name < len(values) and values[name] is not None:
                return values[name]
        elif isinstance(values, Mapping):
            if name in values:
                return values[name]
        else:  # one number for every tensor
            return values
        return DEFAULT_PAD_VALUES.get(name, 0) if isinstance(name, str) else 0


def as_buckets(spec: Buckets | Sequence[int] | None) -> Buckets | None:
    """The ``Buckets`` a loader's ``pad_to_buckets=`` argument names: a ``Buckets``, bucket lengths, or None."""
    if spec is None or isinstance(spec, Buckets):
        return spec
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        return Buckets(spec)
    raise TypeError(
        f"pad_to_buckets takes bucket lengths such as (64, 128, 256) or a lazyxla.Buckets, got {spec!r} "
        "(one fixed length: (512,); multiples: lazyxla.Buckets(multiple_of=64))"
    )


def _positive(what: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"lazyxla.Buckets: {what} must be a positive int, got {n!r}")
    return n


def _check_lengths(lengths: Sequence[int]) -> tuple[int, ...]:
    if isinstance(lengths, (int, str)) or not isinstance(lengths, Sequence) or not lengths:
        raise ValueError(f"lazyxla.Buckets: bucket lengths must be a non-empty sequence of ints, got {lengths!r}")
    return tuple(sorted({_positive("a bucket length", n) for n in lengths}))


def _check_pad_values(values: Any) -> Any:
    if values is None:
        return {}
    if isinstance(values, Mapping):
        checked = {k: _check_value(v) for k, v in values.items()}
    elif isinstance(values, Sequence) and not isinstance(values, str):
        checked = tuple(None if v is None else _check_value(v) for v in values)
    else:
        checked = _check_value(values)
    return checked


def _check_value(value: Any) -> Any:
    if isinstance(value, numbers.Real) or (isinstance(value, str) and value == CONTINUE):
        return value
    raise TypeError(f"lazyxla.Buckets: a padding value is a number (or {CONTINUE!r} for positions), got {value!r}")


def _axis(t: torch.Tensor, dim: int) -> int | None:
    """``dim`` of ``t`` as a non-negative axis, or None where ``t`` has no such axis besides its batch axis 0."""
    axis = dim + t.ndim if dim < 0 else dim
    return axis if 0 < axis < t.ndim else None


def _reference(batch: Any, dim: int) -> tuple[torch.Tensor | None, str]:
    """The tensor whose size along ``dim`` is the batch's sequence length, and its name for messages."""
    if isinstance(batch, Mapping):
        for key in _LENGTH_KEYS:
            t = batch.get(key)
            if isinstance(t, torch.Tensor) and _axis(t, dim) is not None:
                return t, f" ({key!r} along dim {dim})"
    for t in _tensors(batch):
        if _axis(t, dim) is not None:
            return t, f" (its first tensor along dim {dim})"
    return None, ""


def _row_count(batch: Any) -> int | None:
    return next((t.shape[0] for t in _tensors(batch) if t.ndim > 0), None)


def _tensors(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _rebuild(mapping: Mapping, items: list) -> Mapping:
    try:  # the batch's own type: a dict, an OrderedDict, Hugging Face's BatchEncoding
        return type(mapping)(items)
    except TypeError:  # a dict subclass with another constructor (defaultdict, ...)
        return dict(items)


def _pad_along(t: torch.Tensor, axis: int, extra: int, value: Any) -> torch.Tensor:
    shape = list(t.shape)
    shape[axis] = extra
    if isinstance(value, str):  # CONTINUE
        if t.shape[axis] == 0:
            raise ValueError("lazyxla.Buckets: cannot continue counting the positions of an empty sequence")
        step_shape = [1] * t.ndim
        step_shape[axis] = extra
        steps = torch.arange(1, extra + 1, dtype=t.dtype, device=t.device).reshape(step_shape)
        return torch.cat([t, t.narrow(axis, t.shape[axis] - 1, 1) + steps], dim=axis)
    return torch.cat([t, t.new_full(shape, value)], dim=axis)


def _pad_rows(t: torch.Tensor, extra: int, value: Any, axis: int | None) -> torch.Tensor:
    shape = (extra, *t.shape[1:])
    if isinstance(value, str):  # CONTINUE: the positions of an unpadded row: 0, 1, 2, ... along the sequence axis
        if axis is None:
            return torch.cat([t, t.new_zeros(shape)])
        step_shape = [1] * t.ndim
        step_shape[axis] = t.shape[axis]
        positions = torch.arange(t.shape[axis], dtype=t.dtype, device=t.device).reshape(step_shape)
        return torch.cat([t, positions.expand(shape)])
    return torch.cat([t, t.new_full(shape, value)])
