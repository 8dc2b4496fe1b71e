"""What the PyTorch yardstick (``lazyxla.tools.pytorch_suite``) does not run, and how it names failure causes.

``LISTED``: PyTorch device-generic tests that check something an XLA device cannot show, each with its reason
(a pattern over the pytest node id, ``re.search``). They are deselected before a file runs and counted as
"listed", not as run. Keep this table honest and small: an entry is a true difference of a functional,
compiled device (data-dependent shapes, storage aliasing, sparse layouts, complex32), never a bug to fix.

``CAUSES``: labels for failures whose error names a known cause (first match wins, over the error text);
the others are grouped by their normalised error line (:func:`normalise`).

Example::

    listed_reason("test_torch.py::TestTorchDeviceTypeLAZYXLA::test_sparse_x_lazyxla")   # 'sparse layouts ...'
"""

from __future__ import annotations

import re

SPARSE = "sparse layouts (COO/CSR): lazyxla tensors are dense (XLA has no sparse buffers)"
COMPLEX32 = "complex32 (torch.chalf): XLA has no complex-half type"
STRIDES = (
    "strides of views and memory formats: an XLA buffer's layout is the compiler's, so a lazyxla tensor reports "
    "contiguous strides whatever view or memory format it is (torch_xla's too, or answers is_contiguous() True "
    "for every format); values, aliasing and copies follow the CPU"
)
CONJ_BITS = (
    "conjugate/negative bits: conj() is an op in lazyxla's functional graph, not a lazy bit on the tensor, so "
    "is_conj()/is_neg() of its views differ from the CPU's while their values are equal"
)
DLPACK = (
    "DLPack export: a lazyxla tensor's value is an XLA buffer that its functional graph replaces on every write, so "
    "another library cannot alias it; export raises BufferError and names tensor.cpu()"
)
QUANTIZED = "quantized tensors (torch.quint8/qint8/qint32): XLA buffers hold plain dtypes (torch_xla has none either)"
NESTED = "nested tensors (torch.nested): lazyxla tensors are dense arrays of one shape (XLA has no jagged buffers)"

RANDOM_STREAM = (
    "random streams: lazyxla draws from JAX's generator, not the CPU's Mersenne Twister, so a seeded statistical "
    "test sees other samples; its p-value bound (1.0 +- 0.1 from 1,000 samples) fails for some seeds on the CPU "
    "too (measured 6 of 30 seeds on the CPU, 3 of 30 on lazyxla)"
)
CPU_ONLY_MAP = (
    "Tensor.map_/map2_ (a Python callback per element) are CPU-only in PyTorch: CUDA raises the same TypeError, "
    "and the test returns early for CUDA tensors"
)
VERSION_GAP_STORAGE_TYPE = (
    "a gap between the 2023 test and torch 2.13: the test expects the CPU's storage classes (torch.FloatStorage) "
    "for every device but CUDA; torch 2.13 answers torch.<device>.FloatStorage for a PrivateUse1 device, as for "
    "CUDA, and lazyxla defines those classes"
)

# (pattern over the node id, reason)
LISTED: tuple[tuple[str, str], ...] = (
    (r"_sparse|sparse_|to_sparse|Sparse", SPARSE),
    (r"_complex32\b|_complex32_|chalf", COMPLEX32),
    (r"test_view_ops\.py::\w+::test_expand_lazyxla$|::test_memory_format_resize_(_|as_)lazyxla$", STRIDES),
    (r"::test_conj_imag_view_lazyxla_", CONJ_BITS),
    (r"::test_(alias|copy)_from_dlpack_lazyxla_", DLPACK),
    # a float16 tensor with a complex Python scalar promotes to complex32; the test itself skips its chalf part
    # on 'xla' ("chalf is not supported on XLA")
    (r"test_result_type_lazyxla_(float16_complex(64|128)|complex(64|128)_float16)\b", COMPLEX32),
    (r"test_complex_promotion_lazyxla\b", COMPLEX32),
    (r"test_flip_lazyxla_float32\b", QUANTIZED),  # its float32 run also flips quantize_per_tensor copies
    (r"test_TransformerEncoderLayer_empty_lazyxla\b", NESTED),  # the fast path on an empty nested tensor
    # asserts the output and its gradient keep channels_last (after the values matched)
    (
        r"test_upsamplingBiMode2d_.*_memory_format1_lazyxla|test_upsamplingTrilinear3d_align_corners_\w+_lazyxla",
        STRIDES,
    ),
    # test_copy_ copies from every dtype, complex32 included, into the parametrized one (it passes without it)
    (r"::test_copy__(lazyxla|privateuse1)", COMPLEX32),
    (r"::test_diff_noncontig_", STRIDES),  # its own comment: "All tensors appear contiguous on XLA"
    # asserts `not prob_dist.is_contiguous()` of its transposed input before sampling ("sanity check")
    (r"::test_multinomial_lazyxla_float32$", STRIDES),
    # each asserts is_contiguous(memory_format=channels_last) of a result (clone, *_like, .half(), a + b)
    (r"::test_memory_format_(factory_like_functions_preserve|propagation_rules|type_shortcuts)_lazyxla$", STRIDES),
    (r"::test_geometric_kstest_", RANDOM_STREAM),
    (r"::test_broadcast_fn_map2?_(lazyxla|privateuse1)", CPU_ONLY_MAP),
    # asserts x[:, :, :, 1][:, 1:1].stride() == (60, 20, 5)
    (r"test_indexing\.py::.*::test_empty_slice_", STRIDES),
    (r"::test_tensor_storage_type_lazyxla_", VERSION_GAP_STORAGE_TYPE),
    # loops over every dtype, complex32 last (every other dtype passes)
    (r"::test_(cat|fill)_all_dtypes_and_devices_lazyxla$|::test_tensor_factories_empty_lazyxla$", COMPLEX32),
)

PER_SHAPE = (
    "compiles a program per distinct shape: the test loops over hundreds of sizes, and an XLA device compiles each "
    "new shape once (~0.3 s on 2 cores; torch_xla too), so it takes minutes where the CPU takes seconds"
)

# (pattern over the node id, seconds, why): tests given longer than the run's per-test limit, each with its reason
SLOW: tuple[tuple[str, float, str], ...] = (
    # i = 1..511: tensors of length i and max(index)+1, ~1,100 programs (passed in 917 s on 2 loaded cores)
    (r"::test_index_put_accumulate_duplicate_indices_lazyxla$", 1200.0, PER_SHAPE),
    # 64 shape combinations x 8 (p, compute_mode): ~960 programs (passed in 592 s on 2 loaded cores)
    (r"::test_cdist_norm_batch_lazyxla$", 1200.0, PER_SHAPE),
    # 96 (layout, index dtype, include_self, dim) cases of random sizes, each building its expected value one device
    # index at a time (expected[idx[i]] *= src[i]): 60-180 s each on a quiet machine, near the default limit
    (r"::test_index_reduce_reduce_\w+_lazyxla_\w+$", 600.0, PER_SHAPE),
)


def time_limit(nodeid: str, default: float, table: tuple[tuple[str, float, str], ...] | None = None) -> float:
    """Seconds ``nodeid`` may run: its ``SLOW`` entry's, else ``default``.

    Example::

        time_limit("test_torch.py::TestTorchDeviceTypeLAZYXLA::test_cdist_norm_batch_lazyxla", 180.0)   # 1200.0
    """
    for pattern, seconds, _ in SLOW if table is None else table:
        if re.search(pattern, nodeid):
            return max(seconds, default)
    return default


# (pattern over the error text, label): the failure causes the summary names rather than quotes
CAUSES: tuple[tuple[str, str], ...] = ()


def listed_reason(nodeid: str, table: tuple[tuple[str, str], ...] = LISTED) -> str | None:
    """The reason ``nodeid`` is listed (not run), or None.

    Example::

        listed_reason("test_view_ops.py::TestViewOpsLAZYXLA::test_view_as_complex_lazyxla")   # None
    """
    for pattern, reason in table:
        if re.search(pattern, nodeid):
            return reason
    return None


_ERROR_LINE = re.compile(r"^E\s+(\S.*)$", re.M)


def error_line(msg: str) -> str:
    """The first ``E   `` line of a pytest failure text (the exception and its message), else its last line.

    Example::

        error_line("    def test_x():\\n>       f()\\nE   RuntimeError: bad\\nE   more")   # 'RuntimeError: bad'
    """
    m = _ERROR_LINE.search(msg)
    if m:
        return m.group(1).strip()
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


_NORMALISE = (
    (re.compile(r"0x[0-9a-fA-F]+"), "ADDR"),
    (re.compile(r"(lazyxla|cpu)_(float|int|uint|bool|complex|bfloat)\w*"), "DEV_DTYPE"),
    (re.compile(r"torch\.(float|int|uint|bool|complex|bfloat|half|double|long|short)\w*"), "torch.DTYPE"),
    (re.compile(r"\b(b?float|u?int|complex)\d+\b|\bbool\b"), "DTYPE"),
    (re.compile(r"'[^']{40,}'"), "'…'"),
    (re.compile(r"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?(?!-dim)"), "N"),  # "0-dim" stays: it is the cause
    (re.compile(r"lazyxla:N|cpu:N"), "DEV"),
    (re.compile(r"\[N(, N)*\]|\(N(, N)*,?\)"), "SHAPE"),
    (re.compile(r"\s+"), " "),
)


def normalise(msg: str) -> str:
    """A failure's cause as a short key: its error line (:func:`error_line`) as :func:`normalise_line` keys it.

    Example::

        normalise("E   IndexError: index 12 is out of bounds for size 10")   # 'IndexError: index N is out ...'
    """
    return normalise_line(error_line(msg))


def normalise_line(line: str) -> str:
    """An error line with numbers, addresses, shapes, devices and dtypes replaced, so that the same cause in
    many tests groups together; or the ``CAUSES`` label it matches.

    Example::

        normalise_line("RuntimeError: shape (2, 3) on lazyxla:0")   # 'RuntimeError: shape SHAPE on DEV'
    """
    for pattern, label in CAUSES:
        if re.search(pattern, line):
            return label
    for pattern, repl in _NORMALISE:
        line = pattern.sub(repl, line)
    return line.strip()[:200]
