"""The devices behind lazyxla: jax devices and transfers (``devices``), the run's processes (``processes``),
meshes and layouts (``meshes``), the encoding of values exchanged between processes (``wire``)."""
