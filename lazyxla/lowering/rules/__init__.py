"""Lowering rules, one module per op family; importing this package fills the rule table."""

from lazyxla.lowering.rules import (  # noqa: F401
    core,
    fft,
    indexing,
    linalg,
    nn,
    pointwise,
    random,
    reduction,
    sorting,
    view,
)
