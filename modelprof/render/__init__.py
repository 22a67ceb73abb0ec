"""Presentation layer: human units, table views and the exporters (Markdown, LaTeX, HTML, text,
JSON, CSV). The DataFrame stays numeric; only these functions turn numbers into text."""

from __future__ import annotations

from modelprof.render.csvio import read_csv, to_csv
from modelprof.render.html import to_html
from modelprof.render.jsonio import read_json, to_json
from modelprof.render.latex import escape_latex, to_latex
from modelprof.render.markdown import to_markdown
from modelprof.render.text import to_text
from modelprof.render.units import (
    format_bytes,
    format_count,
    format_percent,
    format_rate,
    format_time_ms,
)
from modelprof.render.views import (
    COMPACT_COLUMNS,
    Table,
    compact_columns,
    prepare_table,
    select_columns,
    select_rows,
)

__all__ = [
    "COMPACT_COLUMNS",
    "Table",
    "compact_columns",
    "escape_latex",
    "format_bytes",
    "format_count",
    "format_percent",
    "format_rate",
    "format_time_ms",
    "prepare_table",
    "read_csv",
    "read_json",
    "select_columns",
    "select_rows",
    "to_csv",
    "to_html",
    "to_json",
    "to_latex",
    "to_markdown",
    "to_text",
]
