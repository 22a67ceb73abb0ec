"""Self-contained styled HTML tables for Jupyter (``Report._repr_html_``) and compare results.

One ``<div>`` holding a scoped ``<style>`` and a ``<table>``: sticky header inside a scrolling box,
numbers right-aligned in tabular figures, module names indented by depth, a bar behind each
percentage cell (latency share, efficiency) whose CSS width is the value, totals in ``<tfoot>``.
Every cell and header is HTML-escaped.
"""
from __future__ import annotations

import hashlib
import html
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from modelprof.render._output import emit
from modelprof.render.views import Table, prepare_table

__all__ = ["to_html", "html_table"]

_BAR_KINDS = frozenset({"percent", "ratio"})
_BAR_COLOUR = "rgba(66, 133, 244, 0.30)"

_STYLE = """\
#{id} {{ max-height: {max_height}; overflow: auto; }}
#{id} table {{ border-collapse: collapse; font-size: 0.9em; font-variant-numeric: tabular-nums; }}
#{id} caption {{ caption-side: top; text-align: left; font-weight: bold; padding: 4px 0; }}
#{id} th, #{id} td {{ padding: 2px 10px; white-space: nowrap; text-align: left; }}
#{id} th.r, #{id} td.r {{ text-align: right; }}
#{id} thead th {{ position: sticky; top: 0; z-index: 1; border-bottom: 1px solid #888;
  background: var(--jp-layout-color0, var(--vscode-editor-background, #fff)); }}
#{id} tbody tr:hover {{ background: rgba(127, 127, 127, 0.12); }}
#{id} tfoot td {{ font-weight: bold; border-top: 1px solid #888; }}"""


def _bar_width(kind: str, value: Any) -> float | None:
    """Bar width in percent of the cell, clamped to [0, 100]; None for a missing value."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(v):
        return None
    if kind == "ratio":
        v *= 100.0
    return min(max(v, 0.0), 100.0)


def _table_id(table: Table, caption: str | None) -> str:
    digest = hashlib.sha1(repr((table.headers, table.cells, table.totals, caption)).encode())
    return "modelprof-" + digest.hexdigest()[:10]


def html_table(
    table: Table, *, caption: str | None = None, max_height: str = "36em", table_id: str | None = None
) -> str:
    """Lay out a prepared :class:`Table` as a styled, self-contained HTML fragment."""
    tid = table_id or _table_id(table, caption)
    numeric = table.numeric
    frame = table.frame
    depths = list(frame["depth"]) if "depth" in frame.columns else None

    def cls(i: int) -> str:
        return "r" if numeric[i] else "l"

    out = [f'<div class="modelprof" id="{html.escape(tid)}">']
    out.append("<style>\n" + _STYLE.format(id=tid, max_height=max_height) + "\n</style>")
    out.append("<table>")
    if caption is not None:
        out.append(f"<caption>{html.escape(caption)}</caption>")
    out.append(
        "<thead><tr>"
        + "".join(f'<th class="{cls(i)}">{html.escape(h)}</th>' for i, h in enumerate(table.headers))
        + "</tr></thead>"
    )
    out.append("<tbody>")
    for r, cells in enumerate(table.cells):
        tds = []
        for i, (name, kind, cell) in enumerate(zip(table.columns, table.kinds, cells)):
            style = ""
            if kind in _BAR_KINDS and table.units != "raw":
                width = _bar_width(kind, frame[name].iloc[r])
                if width is not None:
                    style = (
                        f"background: linear-gradient(90deg, {_BAR_COLOUR} {width:.2f}%, "
                        f"transparent {width:.2f}%);"
                    )
            elif name in ("module", "module name") and depths is not None:
                style = f"padding-left: {0.6 + 1.2 * int(depths[r]):.1f}em;"
            attr = f' style="{style}"' if style else ""
            tds.append(f'<td class="{cls(i)}"{attr}>{html.escape(cell)}</td>')
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</tbody>")
    if table.totals is not None:
        out.append(
            "<tfoot><tr>"
            + "".join(f'<td class="{cls(i)}">{html.escape(c)}</td>' for i, c in enumerate(table.totals))
            + "</tr></tfoot>"
        )
    out.append("</table>")
    out.append("</div>")
    return "\n".join(out) + "\n"


def to_html(
    df: pd.DataFrame,
    totals: Mapping[str, Any] | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    caption: str | None = None,
    max_height: str = "36em",
    units: str = "human",
    columns: Iterable[str] | None = None,
    depth: int | None = None,
    leaf_only: bool = False,
    top_k: int | None = None,
    sort_by: str | None = None,
    show_totals: bool = True,
) -> str | Path:
    """A styled HTML table of ``df`` with a totals row, for notebooks (``_repr_html_``) and files.
    Returns the fragment, or writes ``path`` and returns it."""
    table = prepare_table(
        df, totals, columns=columns, depth=depth, leaf_only=leaf_only, top_k=top_k,
        sort_by=sort_by, units=units, show_totals=show_totals,
    )
    return emit(html_table(table, caption=caption, max_height=max_height), path)
