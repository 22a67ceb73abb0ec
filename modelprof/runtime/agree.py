"""Timing decisions agreed across ranks: under a process group every rank must run the same
passes the same number of times, or a rank waits forever in a collective the others never run.

Each decision taken on a rank's own clock becomes one small all-reduce: the next block is the
smallest any rank wants; sampling stops when any rank's budget is spent or all are precise.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime.group import communicates, current_group, group_up, one_voice

__all__ = [
    "ALONE",
    "Agreement",
    "agreed_timing",
    "agreeing",
    "agreement",
    "current_agreement",
    "decisions",
]


@dataclasses.dataclass
class Agreement:
    """Agrees decisions over ``group`` (the default group when None); counts the rounds."""

    group: Any = None
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    rounds: int = 0

    def least(self, values: list[int]) -> list[int]:
        """Each value's minimum over the ranks (one all-reduce)."""
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        try:
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        except Exception as e:  # noqa: BLE001 - a peer died or timed out: say so
            raise ModelProfError(
                f"the process group failed while the ranks agreed on a timing "
                f"decision (round {self.rounds + 1}): {type(e).__name__}: {e}. "
                "Did a rank exit, or call profile() without the others?"
            ) from e
        self.rounds += 1
        return [int(v) for v in t.tolist()]

    def size(self, k: int) -> int:
        """The smallest block any rank wants (the first block)."""
        return self.least([k])[0]

    def block(self, k: int, precise: bool, stop: bool) -> tuple[int, bool]:
        """(the next block's size, stop now) for all ranks, from this rank's wishes."""
        k_all, precise_all, not_stop_any = self.least([k, int(precise), int(not stop)])
        return k_all, bool(precise_all) or not not_stop_any

    def flags(self, precise: bool, stop: bool) -> tuple[bool, bool]:
        """(precise on every rank, stop on some rank), in one all-reduce."""
        precise_all, not_stop_all = self.least([int(precise), int(not stop)])
        return bool(precise_all), not not_stop_all

    def every(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank."""
        return bool(self.least([int(bool(flag))])[0])

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank."""
        return not self.every(not flag)

    def shared_rng(self, rng: np.random.Generator) -> np.random.Generator:
        """A generator that draws the same on every rank (the shuffled orders), seeded from
        ``rng`` with the smallest rank's seed."""
        return np.random.default_rng(self.least([int(rng.integers(0, 2**62))])[0])


class _Alone(Agreement):
    """The agreement of a process on its own: no collective runs."""

    def least(self, values: list[int]) -> list[int]:
        return [int(v) for v in values]

    def shared_rng(self, rng: np.random.Generator) -> np.random.Generator:
        return rng


#: decisions taken alone (no process group, or none whose ranks must run the same passes)
ALONE: Agreement = _Alone()


def agreement() -> Agreement | None:
    """An :class:`Agreement` over an active default group of several ranks, else None."""
    if not group_up() or dist.get_world_size() < 2:
        return None
    backend = str(dist.get_backend())
    if backend == "fake":
        return None  # a fake group moves nothing: there is nothing to agree with
    if backend == "nccl":
        return Agreement(device=torch.device("cuda", torch.cuda.current_device()))
    return Agreement()  # on the CPU


_CURRENT: contextvars.ContextVar[Agreement | None] = contextvars.ContextVar(
    "modelprof_agreement", default=None
)


def current_agreement() -> Agreement | None:
    """The agreement in force (set for a model whose passes run collectives), or None."""
    return _CURRENT.get()


def decisions() -> Agreement:
    """``current_agreement()``, else ``ALONE``."""
    return _CURRENT.get() or ALONE


@contextlib.contextmanager
def agreeing(agreement: Agreement | None) -> Iterator[None]:
    token = _CURRENT.set(agreement)
    try:
        yield
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def agreed_timing(models: Any) -> Iterator[None]:
    """Agree every timing decision across ranks when any of ``models`` communicates, around
    timing outside one ``profile()`` (an agreement in force is kept); warnings from one rank."""
    outer = current_agreement()
    active = (
        outer is None
        and current_group() is not None
        and any(communicates(m) for m in models if isinstance(m, nn.Module))
    )
    with agreeing(outer if outer is not None else agreement() if active else None), one_voice():
        yield
