"""GitHub Markdown (pipe) tables, laid out by ``tabulate``."""

from __future__ import annotations

from modelprof.render.formats import needs_package, register_table
from modelprof.render.text import escape_control
from modelprof.render.views import Table

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
        raise needs_package("Markdown output", "tabulate") from e
    rows = [list(map(_escape, r)) for r in (*table.cells, *table.footer)]
    align = ["right" if n else "left" for n in table.numeric]
    return tabulate(
        rows,
        headers=[_escape(h) for h in table.headers],
        tablefmt="pipe",
        disable_numparse=True,
        colalign=align,
    )


to_markdown = register_table(
    "markdown",
    lambda table, view, to_file: markdown_table(table) + "\n",
    suffix="md",
    needs="tabulate",
    doc="GitHub Markdown table, human units (``1.81 G``, ``3.06 MiB``), totals and end-to-end "
    'rows. The compact columns by default (``columns="all"`` for every one).',
    summary="""A GitHub pipe table of ``df`` with a totals row, ending with a newline. Returns
    the text, or writes ``path`` and returns it.""",
)
