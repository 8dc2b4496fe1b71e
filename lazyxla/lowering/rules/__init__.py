"""Lowering rules, one module per op family; importing this package fills the rule table."""

from lazyxla.lowering.rules import core  # noqa: F401
