"""aten -> jax lowering rules, graph -> jax function, the compile cache."""

from lazyxla.lowering import rules  # noqa: F401  (fills the rule table)
