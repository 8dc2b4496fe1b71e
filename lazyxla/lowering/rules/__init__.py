"""Lowering rules, one module per op family; importing this package fills the rule table."""

from lazyxla.lowering.rules import (  # noqa: F401
    activation,
    attention,
    collective,
    compiled_graph,
    conv_pool,
    core,
    distance,
    embedding,
    fft,
    indexing,
    linalg,
    loss,
    norm,
    optim,
    pointwise,
    random,
    reduction,
    sampling,
    sorting,
    view,
)
