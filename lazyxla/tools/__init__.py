"""Command-line tools: ``python -m lazyxla.tools.coverage``."""
