"""What every pass shares (state guard, inputs, tensors, placement, hooks, devices, environment,
progress, failures): the lowest layer above ``errors``, importing no counting, timing, step or
report.
"""
