"""A warning, once, when the pending graph keeps growing: a loop that never syncs.

Lazy mode computes nothing until a sync (``lazyxla.sync()``, torch_xla's ``xm.mark_step()``, a
``DeviceLoader``'s next batch) or a host read. A training loop with none of them records every step into
one graph: each step's program would hold all earlier steps, so it compiles ever more slowly, and the
tensors of every step stay alive. Nothing fails, the process only slows down and grows; this warning
says why, once the pending graph reaches ``config.warn_graph_nodes`` nodes.

Cost: the recorder (``meta._finish``, which counts every op in ``ops_recorded``) compares that count with
``next_check[0]``; nothing else happens per op. At that count :func:`check` walks the pending graph once
and sets the next count: where the graph, growing by at most one node per op, could first reach the
threshold. In a loop that syncs every step the walk meets one step's graph at most, once per
``warn_graph_nodes`` ops.

Example::

    for x, y in batches:                 # no sync: warns once the pending graph reaches 100,000 nodes
        loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()
"""

from __future__ import annotations

import math
import warnings

from lazyxla.config import config
from lazyxla.ir import Leaf
from lazyxla.lazy.session import session
from lazyxla.lazy.tensor import live_tensors
from lazyxla.lazy.views import reorders_data
from lazyxla.observe import diagnostics, metrics
from lazyxla.observe.metrics import _counters


def pending_nodes() -> int:
    """The nodes of the pending graph: every op node a live tensor's value still needs computed (a transpose or
    reshape of computed data is not: a sync leaves it pending, ``views.reorders_data``).

    Example::

        pending_nodes()       # 0 right after lazyxla.sync()
    """
    stack = [n for n in (t._value[0] for t in live_tensors()) if n.op.__class__ is not Leaf and not reorders_data(n)]
    seen = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend(m for m, _ in n.inputs if m.op.__class__ is not Leaf and id(m) not in seen)
    return len(seen)


def check(recorded: int) -> None:
    """Called by the recorder when ``recorded`` (``ops_recorded``) reaches ``session.next_growth_check``: warn if
    the pending graph has reached ``config.warn_graph_nodes`` nodes, else set the next count to look again."""
    limit = config.warn_graph_nodes
    size = session.growth_reached or pending_nodes()
    if size < limit:
        # the graph grows by one node per op at most, so it cannot reach the limit before limit - size more ops;
        # a floor of limit / 8 keeps a graph that stays just below the limit from being walked every few ops
        session.next_growth_check = recorded + max(limit - size, limit // 8, 1)
        return
    level = diagnostics.user_stacklevel()
    if level is None:  # warn at the next op a user's line records (the optimizer step after a backward)
        session.growth_reached, session.next_growth_check = size, recorded + 1
        return
    session.growth_reached, session.next_growth_check = 0, math.inf
    warnings.warn(
        f"lazyxla: the pending graph has reached {size} nodes (ops recorded and not yet computed): nothing has "
        "synced them, so the graph grows with every step and each step's program would hold all earlier "
        "steps (ever slower compiles, ever more memory). Sync once per step: call lazyxla.sync() "
        "(torch_xla: xm.mark_step()) after optimizer.step(), or iterate a lazyxla.DeviceLoader (torch_xla: "
        "pl.MpDeviceLoader), which syncs at every batch. lazyxla.config.warn_graph_nodes "
        "(LAZYXLA_WARN_GRAPH_NODES) sets this threshold (0: never warn).",
        UserWarning,
        stacklevel=level,  # the warning shows the user's line
    )


def _reset(limit: int) -> None:
    # config.watch: a new threshold counts from now (0 turns the check off)
    session.growth_reached = 0
    session.next_growth_check = _counters["ops_recorded"] + limit if limit > 0 else math.inf


config.watch("warn_graph_nodes", _reset)
metrics.on_reset_counters(lambda: _reset(config.warn_graph_nodes))  # ops_recorded restarts from 0
