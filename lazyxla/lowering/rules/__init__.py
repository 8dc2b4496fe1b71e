"""Lowering rules, one module per op family; importing this package fills the rule table."""

from lazyxla.lowering.rules import (  # noqa: F401
    activation,
    attention,
    collective,
    compiled_graph,
    conv_pool,
    core,
    ctc,
    distance,
    embedding,
    fft,
    foreach,
    indexing,
    jax_call,
    linalg,
    loss,
    norm,
    optim,
    pointwise,
    random,
    reduction,
    resample,
    rnn,
    sampling,
    scan,
    sorting,
    view,
)

foreach.register()  # after every other module: a foreach op is grouped when its element op has a rule
