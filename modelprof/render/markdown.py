"""GitHub Markdown (pipe) tables, laid out by ``tabulate``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from modelprof.errors import ModelProfError
from modelprof.render._output import emit
from modelprof.render.formats import register_format
from modelprof.render.options import ViewOptions
from modelprof.render.text import escape_control
from modelprof.render.views import Table, prepare_table

__all__ = ["to_markdown", "markdown_table"]


def _escape(cell: str) -> str:
    # A pipe would end the cell, a newline the row; "<" and ">" are escaped so that a name such
    # as "<img onerror=...>" is never raw HTML, and a backslash first, or "\\<" un-escapes it.
    cell = escape_control(cell.replace("\\", "\\\\"))
    return cell.replace("|", "\\|").replace("<", "\\<").replace(">", "\\>")


def markdown_table(table: Table) -> str:
    """Lay out a prepared :class:`Table` as a pipe table (numbers right-aligned), no trailing newline."""
    try:
        from tabulate import tabulate
    except ImportError as e:  # pragma: no cover - exercised only without the extra installed
        raise ModelProfError(
            "Markdown output needs tabulate: pip install tabulate (in a clone of modelprof: "
            "pip install -e '.[all]')"
        ) from e
    rows = [list(map(_escape, r)) for r in (*table.cells, *table.footer)]
    align = ["right" if n else "left" for n in table.numeric]
    return tabulate(
        rows,
        headers=[_escape(h) for h in table.headers],
        tablefmt="pipe",
        disable_numparse=True,
        colalign=align,
    )


@register_format(
    "markdown",
    suffix="md",
    human=True,
    needs="tabulate",
    doc="GitHub Markdown table, human units (``1.81 G``, ``3.06 MiB``), totals and end-to-end "
    'rows. The compact columns by default (``columns="all"`` for every one).',
)
def to_markdown(
    df: pd.DataFrame,
    totals: Mapping[str, Any] | None = None,
    *,
    end_to_end: Mapping[str, Any] | None = None,
    env: Mapping[str, Any] | None = None,
    path: str | os.PathLike[str] | None = None,
    view: ViewOptions | None = None,
    **options: Any,
) -> str | Path:
    """A GitHub pipe table of ``df`` with a totals row, ending with a newline. Returns the text,
    or writes ``path`` and returns it."""
    table = prepare_table(df, totals, end_to_end=end_to_end, view=view, **options)
    return emit(markdown_table(table) + "\n", path)
