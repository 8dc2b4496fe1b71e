"""``torch_xla.test`` on lazyxla: ``test_utils``, the helpers torch_xla's tests and example scripts use.

Example::

    import torch_xla.test.test_utils as test_utils
    test_utils.print_training_update(device, step, loss, rate, global_rate)
"""
