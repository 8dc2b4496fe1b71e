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

# (pattern over the node id, reason)
LISTED: tuple[tuple[str, str], ...] = (
    (r"_sparse|sparse_|to_sparse|Sparse", SPARSE),
    (r"_complex32\b|_complex32_|chalf", COMPLEX32),
    # loops over every dtype, complex32 last (every other dtype passes)
    (r"::test_(cat|fill)_all_dtypes_and_devices_lazyxla$|::test_tensor_factories_empty_lazyxla$", COMPLEX32),
)

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
