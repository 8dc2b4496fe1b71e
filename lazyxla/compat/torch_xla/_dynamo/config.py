"""``torch_xla._dynamo.config``: the bridge's settings torch_xla scripts set.

``skip_input_data_check`` is accepted and has no effect: lazyxla's compiled graphs take pending inputs as well
as computed ones (a pending input becomes part of the same program).

Example::

    import torch_xla._dynamo.config as dynamo_config
    dynamo_config.skip_input_data_check = True
"""

skip_input_data_check = False
