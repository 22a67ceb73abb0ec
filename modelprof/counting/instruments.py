"""Instruments: what is read per module call while the counted forward runs.

An :class:`Instrument` declares its columns (``modelprof.columns.Column`` with ``reading``
``"own"`` or ``"inclusive"``) and the counting pass's :class:`~modelprof.counting.scope.Tracker`
calls its ``enter`` before each module call and ``exit`` after it, which gives the call's
readings by column. The table rule (``counting.tree``) makes them rows, and from the column
registry they reach the frame, ``Report.totals``, every view, exporter and the CSV read-back.

    class ModuleCalls(Instrument):
        columns = (Column("module_calls", "module calls", "int", "calls", counted=True,
                          additive=True, reading="own"),)

        def exit(self, token, module, output):
            return {"module_calls": 1}

    with instrumented(ModuleCalls):
        report = modelprof.profile(model, (3, 224, 224))

A fresh instance serves each counted forward; a call that raises gives no reading.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import modelprof.columns as registry

__all__ = ["Instrument", "active", "instrumented"]


class Instrument:
    """Read per module call (override ``enter`` and ``exit``); see the module doc."""

    #: the columns this instrument fills, each with ``reading`` "own" or "inclusive"
    columns: tuple[registry.Column, ...] = ()

    def enter(self, module: Any, args: tuple, kwargs: dict) -> Any:
        """Before a call runs; what it returns comes back to ``exit`` (a start stamp)."""
        return None

    def exit(self, token: Any, module: Any, output: Any) -> dict[str, Any]:
        """After a call returned: its readings, by column name."""
        return {}


_ACTIVE: list[type[Instrument]] = []


@contextlib.contextmanager
def instrumented(*kinds: type[Instrument]) -> Iterator[None]:
    """The instruments ``kinds`` read every counted forward of the ``with`` block. Their columns
    are declared for good: the reports made in the block show them when rendered later."""
    for kind in kinds:
        if not (isinstance(kind, type) and issubclass(kind, Instrument)):
            raise TypeError(f"{kind!r} is not an Instrument subclass")
        for c in kind.columns:
            if c.reading not in ("own", "inclusive"):
                raise ValueError(
                    f"column {c.name!r} of {kind.__name__} needs reading= own/inclusive"
                )
    registry.declare(*(c for kind in kinds for c in kind.columns))
    _ACTIVE.extend(kinds)
    try:
        yield
    finally:
        for kind in kinds:
            _ACTIVE.remove(kind)


def active() -> list[Instrument]:
    """A fresh instance of each active instrument, for one counted forward."""
    return [kind() for kind in _ACTIVE]
