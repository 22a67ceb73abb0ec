"""Reading tensor *values* in a formula, only where they exist.

A few costs depend on values, not shapes: the group offsets of a grouped matmul, the sequence
offsets of a variable-length attention batch. On the meta device, under fake tensors or while
tracing there are no values; a formula then falls back to a bound and says so (``Cost.note``).
"""

from __future__ import annotations

import torch

from modelprof.runtime import compat

__all__ = ["has_values", "offsets_to_lengths"]


def has_values(t: torch.Tensor) -> bool:
    """Whether ``t`` holds readable values (not meta, fake, functional or a tracing proxy)."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return False
    return type(t) in (torch.Tensor, torch.nn.Parameter) or not compat.is_fake(t)


def offsets_to_lengths(offsets: torch.Tensor) -> list[int]:
    """``[0, 3, 7, 12]`` -> ``[3, 4, 5]``: the lengths of the segments that cumulative offsets
    delimit (the caller checks ``has_values`` first)."""
    return [int(v) for v in offsets.detach().reshape(-1).diff().tolist()]
