"""What every pass shares: the state guard, inputs, tensor walking, model placement, execution
contexts, hooks, device helpers, the environment record, progress bars and forward failures.

The lowest layer above ``errors``: nothing here imports counting, timing, step or report.
"""
