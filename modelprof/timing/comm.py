"""Collectives' own time in the instrumented passes, for the ``(communication)`` rows.

A collective returns before its data has moved (gloo hands it to a thread, NCCL to its stream);
the wait comes later, often in the next layer. So in an instrumented pass :class:`CommStamps`
waits for each collective where it is issued, between two stamps of the pass's clock (on CUDA:
the time the compute stream stood waiting), and charges it to the call that issued it. The
per-layer passes thus give up the model's overlap of communication with compute, which the clean
runs keep. DDP's bucket all-reduces go through the dispatcher and are stamped too
(``modelprof.step.timing`` moves them to the root); what reaches no dispatched op is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from modelprof.counting.collectives import collective_kind, is_comm_bookkeeping
from modelprof.runtime import compat

__all__ = ["CommStamps", "wait_for"]

_CHUNK = 64  # collectives per stamp buffer (buffers are added as a pass needs them)


def wait_for(func: Any, out: Any) -> None:
    """Wait until collective ``func``, which returned ``out``, is done: ``Work.wait()`` on a c10d
    op's work, ``wait_tensor`` on a functional collective's outputs."""
    functional = func.name().startswith("_c10d_functional")
    stack = [out]
    while stack:
        o = stack.pop()
        if isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, torch.Tensor):
            if functional:
                compat.wait_functional_collective(o)
        elif hasattr(o, "wait"):
            o.wait()


class CommStamps(compat.TorchDispatchMode):
    """Two stamps from ``clock`` around each collective (waited for on the spot) and each wait or
    FSDP2 copy of one; ``column()`` says which call the time belongs to."""

    def __init__(self, clock: Any, column: Callable[[], int]) -> None:
        super().__init__()
        self.clock, self.column = clock, column
        self.buffers: list[Any] = []
        self.columns: list[int] = []

    def begin(self) -> None:
        """Before a pass: no collective stamped yet."""
        self.columns.clear()

    def _record(self, j: int) -> None:
        b, i = divmod(j, 2 * _CHUNK)
        if b == len(self.buffers):  # grows in the warm-up passes, then is reused
            self.buffers.append(self.clock.stamps(2 * _CHUNK))
        self.buffers[b].record(i)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = collective_kind(func)
        if kind is None and not is_comm_bookkeeping(func):
            return func(*args, **(kwargs or {}))
        j = 2 * len(self.columns)
        self._record(j)
        out = func(*args, **(kwargs or {}))
        if kind is not None:
            wait_for(func, out)
        self._record(j + 1)
        self.columns.append(self.column())
        return out

    def per_column_ms(self, n_columns: int) -> np.ndarray:
        """This pass's collectives' ms per column (read after the pass's synchronize)."""
        m = len(self.columns)
        if m == 0:
            return np.zeros(n_columns)
        ms = np.empty(m)
        for b in range((m + _CHUNK - 1) // _CHUNK):
            lo, hi = b * _CHUNK, min(m, (b + 1) * _CHUNK)
            starts = [2 * (j - lo) for j in range(lo, hi)]
            ms[lo:hi] = self.buffers[b].elapsed_ms(starts, [s + 1 for s in starts])
        return np.bincount(np.asarray(self.columns), weights=ms, minlength=n_columns)
