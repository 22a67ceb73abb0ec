"""Device time charged to the module call that launched it: a pure function of profiler events.

The field's rule (Kineto, HTA, Nsight's NVTX projection): each GPU activity carries a correlation
id naming the CPU op that launched it, and is charged to the innermost module range open around
that launch (on the CPU, the outermost ops themselves, by where they start). Per pass, for call
``i`` of ``n`` (index ``n``: launched inside the pass, outside every call):

- ``busy[i]``: the device time of its activities, each stretch where streams overlap shared
  equally among the activities running in it (so busy times add up to the device's busy union);
- ``idle[i]``: the gaps of the device timeline that end with an activity of ``i`` (HTA's "host
  wait"); busy + idle over every call add up to the pass's device span;
- ``launches[i]``: the activities charged to ``i``.

The profiler's objects are read in one place (:func:`modelprof.timing.kernels.read_pass`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

__all__ = ["Activity", "PassReading", "Span", "attribute", "innermost", "outermost"]


@dataclasses.dataclass(frozen=True)
class Span:
    """A module call's range on the host: its call index, start and end (ns), thread."""

    call: int
    start_ns: int
    end_ns: int
    thread: int = 0


@dataclasses.dataclass(frozen=True)
class Activity:
    """Device work: when it ran (``start_ns``..``end_ns`` on ``stream``) and where its launch
    was made (``launch_ns`` on host thread ``thread``)."""

    start_ns: int
    end_ns: int
    launch_ns: int
    thread: int = 0
    stream: int = 0
    kind: str = "kernel"
    #: run by the backward of the forward op launched at ``launch_ns``
    backward: bool = False


@dataclasses.dataclass
class PassReading:
    """One pass, attributed: arrays of ``n + 1`` (the last: outside every call), in ms."""

    busy_ms: np.ndarray
    idle_ms: np.ndarray
    launches: np.ndarray
    span_ms: float
    #: each activity's call (``n``: outside) and duration (ms), in the order the device started
    #: them (ties: launch order)
    owners: list[int] = dataclasses.field(default_factory=list)
    durations_ms: list[float] = dataclasses.field(default_factory=list)

    @property
    def outside_ms(self) -> float:
        return float(self.busy_ms[-1])


def innermost(spans: Sequence[Span], points: Sequence[tuple[int, int]]) -> list[int]:
    """For each ``(time_ns, thread)``, the call of the innermost span open there (start and end
    included), or -1. Spans of one thread nest (module calls do); two starting together nest by
    length, the shorter inside."""
    out = [-1] * len(points)
    by_thread: dict[int, list[tuple[int, int, int, int]]] = {}
    # (time, order, ...): opens sort before the points at the same time, closes after them
    for s in spans:
        by_thread.setdefault(s.thread, []).append((s.start_ns, 0, -s.end_ns, s.call))
        by_thread.setdefault(s.thread, []).append((s.end_ns, 2, 0, s.call))
    for j, (t, thread) in enumerate(points):
        by_thread.setdefault(thread, []).append((t, 1, 0, j))
    for items in by_thread.values():
        items.sort()
        stack: list[int] = []
        for _, order, _, ident in items:
            if order == 0:
                stack.append(ident)
            elif order == 2:
                for k in range(len(stack) - 1, -1, -1):  # nested: the last one open
                    if stack[k] == ident:
                        del stack[k]
                        break
            elif stack:
                out[ident] = stack[-1]
    return out


def outermost(intervals: Sequence[tuple[int, int]]) -> list[int]:
    """Indices of the intervals (start, end) that no other one contains (one thread's CPU ops:
    the ops a module ran, not the ops those ops ran inside them); ties: the longer is outer."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1]))
    out, end = [], None
    for i in order:
        s, e = intervals[i]
        if end is None or s >= end or e > end:  # after the last outer one, or overlapping it
            out.append(i)
            end = e
    return sorted(out)


def attribute(n: int, spans: Sequence[Span], activities: Sequence[Activity]) -> PassReading:
    """Charge ``activities`` to the calls of ``spans`` (module call ranges of one pass)."""
    busy, idle = np.zeros(n + 1), np.zeros(n + 1)
    owner = innermost(spans, [(a.launch_ns, a.thread) for a in activities])
    owner = [n if o < 0 else o for o in owner]
    launches = np.bincount(owner, minlength=n + 1)
    # the sweep: ends before starts at one instant; work of no length (a 0 ns memset) is a
    # launch, not swept (its end would sort before its start and leave it running)
    timed = [i for i, a in enumerate(activities) if a.end_ns > a.start_ns]
    if not timed:  # (no activity at all too)
        return PassReading(busy, idle, launches, 0.0, *_in_order(activities, owner))
    marks = sorted(
        [(activities[i].end_ns, 0, i) for i in timed]
        + [(activities[i].start_ns, 1, i) for i in timed]
    )
    starting: dict[int, int] = {}  # at each start time, the activity launched first
    for i in timed:
        a = activities[i]
        j = starting.get(a.start_ns)
        if j is None or a.launch_ns < activities[j].launch_ns:
            starting[a.start_ns] = i
    running: set[int] = set()
    last_t = marks[0][0]
    last_busy_end: int | None = None
    for t, kind, i in marks:
        if running and t > last_t:
            share = (t - last_t) / len(running) / 1e6
            for r in running:
                busy[owner[r]] += share
        if kind == 1:
            if not running and last_busy_end is not None and t > last_busy_end:
                # the device waited for this launch (of several starting at t, the first)
                idle[owner[starting[t]]] += (t - last_busy_end) / 1e6
            running.add(i)
        else:
            running.discard(i)
            if not running:
                last_busy_end = t
        last_t = t
    span = (max(a.end_ns for a in activities) - min(a.start_ns for a in activities)) / 1e6
    return PassReading(busy, idle, launches, span, *_in_order(activities, owner))


def _in_order(activities: Sequence[Activity], owner: list[int]) -> tuple[list[int], list[float]]:
    """Each activity's call and duration (ms), in the order the device started them."""
    order = sorted(
        range(len(activities)), key=lambda i: (activities[i].start_ns, activities[i].launch_ns)
    )
    durations = [(activities[i].end_ns - activities[i].start_ns) / 1e6 for i in order]
    return [owner[i] for i in order], durations
