"""Lowering rules, one module per op family; importing this package fills the rule table."""

from lazyxla.lowering.rules import (  # noqa: F401
    attention,
    collective,
    compiled_graph,
    core,
    fft,
    indexing,
    linalg,
    loss,
    nn,
    optim,
    pointwise,
    random,
    reduction,
    sorting,
    view,
)
