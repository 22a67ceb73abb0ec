"""The per-layer timeline as a Chrome / Perfetto trace (Trace Event Format).

One process per direction (``forward``, ``backward``), one thread per instrumented pass, each
module call a complete event (``"ph": "X"``) nested in its parent's, its costs as ``args``. Times
are microseconds from the pass's start, the raw stamps (hooks included, not the table's corrected
times). In the backward, autograd runs node by node: a slice is a run of consecutive nodes of one
call, and slices do not nest.
"""

from __future__ import annotations

import html as _html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from modelprof.errors import ModelProfError
from modelprof.render._output import emit

__all__ = ["PassTimeline", "trace_document", "trace_html", "validate_trace", "write_trace"]

_COST_ARGS = tuple(
    "macs flops read_bytes write_bytes params backward_macs backward_flops saved_bytes".split()
)


class PassTimeline:
    """The slices of one instrumented pass: ``(name, start_ms, duration_ms, depth, args)``."""

    def __init__(self, label: str, duration_ms: float) -> None:
        self.label = label
        self.duration_ms = float(duration_ms)
        self.slices: list[tuple[str, float, float, dict[str, Any]]] = []

    def add(self, name: str, start_ms: float, duration_ms: float, args: Mapping[str, Any]) -> None:
        self.slices.append((name, float(start_ms), float(duration_ms), dict(args)))


def _us(ms: float) -> float:
    return round(ms * 1000.0, 3)  # microseconds, to the nanosecond


def _event(ph: str, name: str, pid: int, tid: int, **fields: Any) -> dict[str, Any]:
    """One trace event: metadata (``"M"``) or a complete slice (``"X"``)."""
    return {"ph": ph, "name": name, "pid": pid, "tid": tid, **fields}


def trace_document(
    processes: Mapping[str, Sequence[PassTimeline]], metadata: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The trace as a JSON-ready dict: one process per key of ``processes``, one thread per
    pass, a pass slice around its calls."""
    events: list[dict[str, Any]] = []
    for pid, (process, passes) in enumerate(processes.items(), start=1):
        events += [
            _event("M", "process_name", pid, 0, args={"name": process}),
            _event("M", "process_sort_index", pid, 0, args={"sort_index": pid}),
        ]
        for tid, timeline in enumerate(passes, start=1):
            duration = timeline.duration_ms
            whole = {"ts": 0.0, "dur": _us(duration), "args": {"duration_ms": duration}}
            events += [
                _event("M", "thread_name", pid, tid, args={"name": timeline.label}),
                _event("X", timeline.label, pid, tid, cat="pass", **whole),
            ]
            for name, start, dur, args in timeline.slices:
                ts = _us(start)
                length = round(_us(start + dur) - ts, 3)
                events.append(
                    _event("X", name, pid, tid, cat=process, ts=ts, dur=length, args=args)
                )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(metadata or {})}


def write_trace(doc: Mapping[str, Any], path: str | os.PathLike[str] | None) -> str | Path:
    """The trace as JSON text, or written to ``path``."""
    return emit(json.dumps(doc, indent=None, separators=(",", ":")), path)


def validate_trace(
    doc: Mapping[str, Any] | str | os.PathLike[str], nested: Sequence[int] | None = None
) -> int:
    """Check ``doc`` (the trace, or the path of its file) as the viewers read it: complete events
    with ``name``, ``ts``, ``dur`` >= 0, ``pid`` and ``tid``; on each track of a process in
    ``nested`` (pids; default all), slices that nest or do not overlap. Returns the number of
    slices; raises on the first bad event."""
    if isinstance(doc, (str, os.PathLike)):
        try:
            doc = json.loads(Path(doc).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelProfError(f"trace: {str(doc)!r} cannot be read as JSON: {e}") from e
    events = doc.get("traceEvents") if isinstance(doc, Mapping) else None
    if not isinstance(events, list):
        raise ModelProfError(
            f"trace: no 'traceEvents' list in the {type(doc).__name__} given (a trace document "
            "or its file's path)"
        )
    tracks: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    for e in events:
        if not isinstance(e, Mapping) or "ph" not in e:
            raise ModelProfError(f"trace: event without 'ph': {e!r}")
        if e["ph"] != "X":
            continue
        missing = [k for k in ("name", "ts", "dur", "pid", "tid") if k not in e]
        if missing:
            raise ModelProfError(f"trace: complete event {e.get('name')!r} lacks {missing}")
        if not (np.isfinite(e["ts"]) and np.isfinite(e["dur"]) and e["dur"] >= 0):
            raise ModelProfError(f"trace: event {e['name']!r} has ts={e['ts']}, dur={e['dur']}")
        tracks.setdefault((e["pid"], e["tid"]), []).append(
            (float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e["name"]))
        )
    eps = 1e-6
    for (pid, tid), slices in tracks.items():
        if nested is not None and pid not in nested:
            continue
        open_: list[tuple[float, float, str]] = []
        for start, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while open_ and start >= open_[-1][1] - eps:
                open_.pop()
            if open_ and end > open_[-1][1] + eps:
                raise ModelProfError(
                    f"trace: on pid {pid} tid {tid}, {name!r} "
                    f"[{start}, {end}] crosses the end of {open_[-1][2]!r} "
                    f"[{open_[-1][0]}, {open_[-1][1]}]"
                )
            open_.append((start, end, name))
    return sum(map(len, tracks.values()))


def cost_args(row: Any) -> dict[str, Any]:
    """A row's costs for a slice's ``args`` (none without a row)."""
    if row is None:
        return {}
    costs = {k: int(v) for k in _COST_ARGS if (v := getattr(row, k, None)) is not None}
    return {"module": row.module or "(root)", "type": row.type, "call": row.call, **costs}


def trace_html(
    doc: Mapping[str, Any],
    path: str | os.PathLike[str] | None = None,
    *,
    width_px: int = 1400,
    title: str = "modelprof trace",
) -> str | Path:
    """A self-contained HTML view of a trace (no script, no network) for where Perfetto cannot
    be reached: a band per track, slices stacked by nesting depth, arguments in a tooltip."""
    validate_trace(doc)
    events = doc["traceEvents"]
    names = {
        (e["pid"], e.get("tid", 0)): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] in ("thread_name", "process_name")
    }
    tracks: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    span = max((e["ts"] + e["dur"] for e in events if e["ph"] == "X"), default=1.0) or 1.0
    scale = (width_px - 20) / span
    parts, top = [], 10
    for (pid, tid), slices in sorted(tracks.items()):
        label = f"{names.get((pid, 0), pid)} / {names.get((pid, tid), tid)}"
        parts.append(f'<div class="label" style="top:{top}px">{_html.escape(str(label))}</div>')
        top += 18
        stack: list[float] = []
        depth_max = 0
        for e in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
            while stack and e["ts"] >= stack[-1] - 1e-6:
                stack.pop()
            depth = len(stack)
            stack.append(e["ts"] + e["dur"])
            depth_max = max(depth_max, depth)
            left, w = 10 + e["ts"] * scale, max(e["dur"] * scale, 1.0)
            tip = _html.escape(
                f"{e['name']}: {e['dur'] / 1000:.3f} ms " + json.dumps(e.get("args", {}))
            )
            hue = sum(map(ord, str(e.get("args", {}).get("type", e["name"])))) * 47 % 360
            text = _html.escape(e["name"]) if w > 6 * len(e["name"]) else ""
            parts.append(
                f'<div class="s" title="{tip}" style="left:{left:.1f}px;'
                f"top:{top + depth * 16}px;width:{w:.1f}px;"
                f'background:hsl({hue},55%,72%)">{text}</div>'
            )
        top += (depth_max + 1) * 16 + 14
    scale_ms = span / 1000
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{_html.escape(title)}</title>
<style>body{{font:12px sans-serif;margin:0}} h1{{font-size:15px;margin:8px 10px}}
.area{{position:relative;height:{top + 10}px}} .label{{position:absolute;left:10px;font-weight:bold}}
.s{{position:absolute;height:14px;overflow:hidden;white-space:nowrap;font-size:10px;
border:1px solid #555;box-sizing:border-box;padding-left:2px}}</style></head><body>
<h1>{_html.escape(title)} &mdash; full width = {scale_ms:.1f} ms</h1>
<div class="area">{"".join(parts)}</div></body></html>"""
    return emit(page, path)
