"""GitHub Markdown (pipe) tables, laid out by ``tabulate``."""

from __future__ import annotations

import re

from modelprof.render.formats import needs_package, register_table
from modelprof.render.options import ViewOptions
from modelprof.render.text import escape_control
from modelprof.render.views import Table

__all__ = ["to_markdown", "markdown_table", "prose"]


def _escape(cell: str) -> str:
    # A pipe would end the cell, a newline the row; a module's or a model's name is text, never
    # markup ("*x*", "[a](b)", "<img ...>"): each such character escaped, a backslash first. A
    # lone "~" (a rough figure's mark) strikes nothing through: escaped only beside another
    return escape_control(_literal(cell, "|", tilde=cell.count("~") > 1))


def _literal(text: str, more: str = "", tilde: bool = True) -> str:
    """``text`` with every character Markdown could read as markup, an entity or raw HTML
    escaped (an underscore inside a word, as in ``latency_x``, is none in GitHub's Markdown and
    is left as it is; ``__init__``'s are escaped)."""
    marks = "\\`*[]<>&" + ("~" if tilde else "") + more
    text = "".join("\\" + c if c in marks else c for c in text)
    return re.sub(r"(?<![^\W_])_|_(?![^\W_])", r"\_", text)


def markdown_table(table: Table) -> str:
    """Lay out a prepared :class:`Table` as a pipe table (numbers right-aligned), no trailing
    newline."""
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


def _document(table: Table, view: ViewOptions, to_file: bool) -> str:
    """The caption in bold above the table (as LaTeX's and HTML's keep theirs: it says what a
    ``~`` marks; ``caption=None``: the bare table); ``standalone``, a document: the other
    ``summary`` lines (a report's totals and timing, a comparison's notes) listed below."""
    caption = prose(view.caption) if view.caption else ""
    head = f"**{caption}**\n\n" if caption else ""
    text = markdown_table(table) + "\n"
    if not view.standalone:
        return head + text
    notes = [prose(line) for line in view.summary if line != view.caption]
    tail = "".join(f"- {line}\n" for line in notes if line)
    return head + text + ("\n" + tail if tail else "")


def prose(line: str) -> str:
    """``line`` as literal Markdown text inside a paragraph or list item (:func:`_literal`),
    not opening a heading or a list."""
    line = _literal(escape_control(line.replace("\n", " ")).strip())
    return re.sub(
        r"^([#+-])|^(\d+)([.)])", lambda m: f"\\{m[1]}" if m[1] else f"{m[2]}\\{m[3]}", line
    )


to_markdown = register_table(
    "markdown",
    _document,
    suffix="md",
    needs="tabulate",
    doc="GitHub Markdown table, human units (``1.81 G``, ``3.06 MiB``), totals and end-to-end "
    'rows. The compact columns by default (``columns="all"`` for every one); a report or a '
    "comparison exports a document: its caption above the table, its summary or notes below.",
    summary="""A GitHub pipe table of ``df`` with a totals row, ending with a newline, the
    ``caption`` in bold above it; with ``standalone=True`` the other ``summary`` lines listed
    below. Returns the text, or writes ``path`` and returns it.""",
)
