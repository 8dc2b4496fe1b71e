"""``lazyxla.dynamo``: the ``torch.compile`` backend ``"lazyxla"`` (implemented in ``lazyxla.frontend.dynamo``).

Importing lazyxla registers the backend; installed packages also name it in the ``torch_dynamo_backends``
entry-point group as ``lazyxla.dynamo:lazyxla_backend`` (pyproject.toml).

Example::

    step = torch.compile(model, backend="lazyxla")      # or backend=lazyxla.dynamo.lazyxla_backend
"""

from lazyxla.frontend.dynamo import CompiledGraph, allow_in_graph, lazyxla_backend, openxla_backend, register

__all__ = ["CompiledGraph", "allow_in_graph", "lazyxla_backend", "openxla_backend", "register"]
