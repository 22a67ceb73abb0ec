"""Reading tensor *values* in a formula, only where they exist.

A few costs depend on values, not shapes: the group offsets of a grouped matmul, the sequence
offsets of a variable-length attention batch. On the meta device, under fake tensors or while
tracing there are no values; a formula then falls back to a bound and says so (``Cost.note``).
Where a CPU forward is counted on meta (``counting.meta_route``), ``values_asked`` says whether
any formula wanted values there: the real pass is counted instead.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from modelprof.runtime import compat

__all__ = ["has_values", "offsets_to_lengths", "values_asked"]

_ASKED = threading.local()   # .meta: a list while ``values_asked`` is active in this thread


@contextlib.contextmanager
def values_asked() -> Iterator[list[torch.Tensor]]:
    """Yields a list to which ``has_values`` adds each meta tensor it is asked about within the
    block (in this thread)."""
    before = getattr(_ASKED, "meta", None)
    _ASKED.meta = asked = []
    try:
        yield asked
    finally:
        _ASKED.meta = before


def has_values(t: torch.Tensor) -> bool:
    """Whether ``t`` holds readable values (not meta, fake, functional or a tracing proxy)."""
    if not isinstance(t, torch.Tensor):
        return False
    if t.device.type == "meta":
        asked = getattr(_ASKED, "meta", None)
        if asked is not None:
            asked.append(t)
        return False
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return True
    return not compat.is_fake(t)


def offsets_to_lengths(offsets: torch.Tensor) -> list[int]:
    """``[0, 3, 7, 12]`` -> ``[3, 4, 5]``: the lengths of the segments that cumulative offsets
    delimit (the caller checks ``has_values`` first)."""
    return [int(v) for v in offsets.detach().reshape(-1).diff().tolist()]
