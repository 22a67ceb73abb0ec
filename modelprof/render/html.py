"""Self-contained styled HTML tables for Jupyter (``Report._repr_html_``) and standalone pages.

:func:`html_table` gives a ``<div>`` with a scoped ``<style>`` and a ``<table>``: numbers
right-aligned in tabular figures, module names indented by depth, a bar behind each percentage
cell, footer rows in ``<tfoot>``; it scrolls sideways, and vertically only with ``max_height``.
:func:`html_page` wraps fragments in a complete document, :func:`html_notebook` puts a result's
text lines above them (what a notebook shows). Every cell, header and line is escaped.
"""

from __future__ import annotations

import hashlib
import html
import math
from typing import Any, Iterable, Sequence

from modelprof.render.formats import register_table
from modelprof.render.options import ViewOptions
from modelprof.render.views import Table, is_rough

__all__ = ["to_html", "html_notebook", "html_page", "html_table"]

_BAR_KINDS = frozenset({"percent", "ratio"})
_BAR_COLOUR = "rgba(66, 133, 244, 0.30)"

_STYLE = """\
#{id} {{ {box} overflow-x: auto; }}
#{id} table {{ border-collapse: collapse; font-size: 0.9em; font-variant-numeric: tabular-nums; }}
#{id} caption {{ caption-side: top; text-align: left; font-weight: bold; padding: 4px 0; }}
#{id} th, #{id} td {{ padding: 2px 10px; white-space: nowrap; text-align: left; }}
#{id} th.r, #{id} td.r {{ text-align: right; }}
#{id} thead th {{ position: sticky; top: 0; z-index: 1; border-bottom: 1px solid #888;
  background: var(--jp-layout-color0, var(--vscode-editor-background, #fff)); }}
#{id} tbody tr:hover {{ background: rgba(127, 127, 127, 0.12); }}
#{id} tfoot td {{ font-weight: bold; }}
#{id} tfoot tr:first-child td {{ border-top: 1px solid #888; }}"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="modelprof">
<title>{title}</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5em 2em;
  color: #222; background: #fff; }}
h1 {{ font-size: 1.3em; margin: 0 0 0.4em; }}
.modelprof-summary {{ margin: 0 0 1em; line-height: 1.45; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""


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


def _plain_cells(tag: str, row: Sequence[str], numeric: Sequence[bool]) -> str:
    """A header or footer row's cells, escaped, numbers right-aligned."""
    return "".join(
        f'<{tag} class="{"r" if n else "l"}">{html.escape(c)}</{tag}>' for c, n in zip(row, numeric)
    )


def html_table(table: Table, *, caption: str | None = None, max_height: str | None = None) -> str:
    """Lay out a prepared :class:`Table` as an HTML fragment; with ``max_height`` (a CSS length
    such as ``"36em"``) the rows scroll under a sticky header."""
    digest = hashlib.sha1(repr((table.headers, table.cells, table.footer, caption)).encode())
    tid = "modelprof-" + digest.hexdigest()[:10]
    numeric = table.numeric
    frame = table.frame
    depths = list(frame["depth"]) if "depth" in frame.columns else None
    box = f"max-height: {max_height}; overflow-y: auto;" if max_height else ""
    out = [
        f'<div class="modelprof" id="{html.escape(tid)}">',
        "<style>\n" + _STYLE.format(id=tid, box=box) + "\n</style>",
        "<table>",
    ]
    if caption is not None:
        out.append(f"<caption>{html.escape(caption)}</caption>")
    out += [f"<thead><tr>{_plain_cells('th', table.headers, numeric)}</tr></thead>", "<tbody>"]
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
            klass, title = "r" if numeric[i] else "l", ""
            if is_rough(table, r, name):  # greyed, and said on hover
                klass += " rough"
                style += " color: #999;" if style else "color: #999;"
                title = ' title="rough: no figure to quote (the caption says why)"'
            attr = (f' style="{style}"' if style else "") + title
            tds.append(f'<td class="{klass}"{attr}>{html.escape(cell)}</td>')
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</tbody>")
    if table.footer:
        rows = "".join(f"<tr>{_plain_cells('td', row, numeric)}</tr>" for row in table.footer)
        out.append(f"<tfoot>{rows}</tfoot>")
    out += ["</table>", "</div>"]
    return "\n".join(out) + "\n"


def html_page(body: str, *, title: str, summary: Iterable[str] = ()) -> str:
    """A complete HTML document (doctype, UTF-8, ``title`` and its ``<h1>``) around ``body``, the
    ``summary`` lines (escaped here) as a paragraph above it."""
    lines = [html.escape(line) for line in summary]
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if lines:
        parts.append('<p class="modelprof-summary">' + "<br>\n".join(lines) + "</p>")
    parts.append(body.rstrip("\n"))
    return _PAGE.format(title=html.escape(title), body="\n".join(parts))


def html_notebook(lines: Iterable[str], *tables: str) -> str:
    """What a notebook shows of a result (its ``_repr_html_``): its text ``lines`` (escaped
    here) as a paragraph, then ``tables``, fragments of :func:`html_table`."""
    text = "<br>".join(html.escape(line) for line in lines)
    return f"<div><p>{text}</p>" + "".join(tables) + "</div>"


def _layout(table: Table, view: ViewOptions, to_file: bool) -> str:
    page_title = view.title or view.caption or "modelprof report"
    # a page's heading is its title: a caption of the user's own stands above the table too
    own = view.caption if not view.standalone or view.caption != page_title else None
    fragment = html_table(table, caption=own, max_height=view.max_height)
    if not view.standalone:
        return fragment
    return html_page(fragment, title=page_title, summary=view.summary)


to_html = register_table(
    "html",
    _layout,
    suffix="html",
    aliases=("htm",),
    doc="A complete HTML page (doctype, charset, title, the summary, then the table, shown in "
    "full), or with ``standalone=False`` the fragment the notebook displays.",
    summary="""A styled HTML table of ``df`` with its footer rows: a fragment, or with
    ``standalone=True`` a page titled ``title`` (default: the caption) with the ``summary`` lines
    above the table. Returns the text, or writes ``path`` and returns it.""",
)
