"""The lazyxla device: registration with PyTorch, jax device mapping, transfers."""
