"""Plain-text tables for ``repr`` and terminals (no optional dependency)."""

from __future__ import annotations

from typing import Sequence

from modelprof.errors import ModelProfError
from modelprof.render.formats import register_table
from modelprof.render.views import Table

__all__ = ["escape_control", "to_text", "text_table"]

_GAP = "  "

# C0 control characters and DEL, shown as escapes: a raw newline in a module name would split
# its row in two, a carriage return would overwrite it on a terminal
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}
_CONTROL.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def escape_control(cell: str) -> str:
    """``cell`` with control characters written as escapes (``"a\\nb"`` for a newline), so
    that one table row stays one line."""
    return cell.translate(_CONTROL)


def _line(cells: Sequence[str], widths: Sequence[int], numeric: Sequence[bool]) -> str:
    padded = (c.rjust(w) if right else c.ljust(w) for c, w, right in zip(cells, widths, numeric))
    return _GAP.join(padded).rstrip()


def text_table(table: Table, *, max_rows: int | None = None, title: str | None = None) -> str:
    """Lay out a prepared :class:`Table`: header, rule, rows, rule, footer; no trailing newline.
    Over ``max_rows`` it keeps its first and last rows around a ``... n more rows`` line."""
    if max_rows is not None and (isinstance(max_rows, bool) or max_rows < 2):
        raise ModelProfError(f"max_rows must be an integer >= 2 or None, got {max_rows!r}")
    rows: list[tuple[str, ...]] = [tuple(map(escape_control, r)) for r in table.cells]
    skipped = 0
    if max_rows is not None and len(rows) > max_rows:
        head_n = (max_rows + 1) // 2  # the other max_rows // 2 (>= 1) from the end
        skipped = len(rows) - max_rows
        rows = rows[:head_n] + rows[head_n + skipped :]
    headers = tuple(map(escape_control, table.headers))
    footer = [tuple(map(escape_control, r)) for r in table.footer]
    everything = [headers, *rows, *footer]
    widths = [max(len(r[i]) for r in everything) for i in range(len(table.headers))]
    numeric = table.numeric
    rule = _GAP.join("-" * w for w in widths)
    body = [_line(r, widths, numeric) for r in rows]
    if skipped:
        body.insert(head_n, f"... {skipped} more rows ...")
    out = [title] if title else []
    out += [_line(headers, widths, numeric), rule, *body]
    if footer:
        out += [rule, *(_line(r, widths, numeric) for r in footer)]
    return "\n".join(out)


to_text = register_table(
    "text",
    # no trailing newline in the text, one in a file
    lambda table, view, to_file: (
        text_table(table, max_rows=view.max_rows, title=view.title) + ("\n" if to_file else "")
    ),
    suffix="txt",
    doc="A plain-text table for terminals (the compact columns by default).",
    summary="""A plain-text table of ``df`` with a totals line, for ``repr`` and terminals.
    Returns the text (no trailing newline) or writes ``path`` (with one) and returns it.""",
)
