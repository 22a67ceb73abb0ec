"""LaTeX ``booktabs`` tables for papers, written directly (no pandas Styler, no jinja2)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from modelprof.render._output import emit
from modelprof.render.views import Table, prepare_table

__all__ = ["to_latex", "latex_table", "escape_latex"]

_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "µ": r"\textmu{}",
    "×": r"$\times$",
}


def escape_latex(text: str) -> str:
    """Escape the characters LaTeX treats specially: ``layer_1 & 50%`` -> ``layer\\_1 \\& 50\\%``."""
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)


def latex_table(
    table: Table,
    *,
    caption: str | None = None,
    label: str | None = None,
    position: str | None = None,
    float_env: bool = True,
) -> str:
    """Lay out a prepared :class:`Table` as a booktabs ``tabular``, inside a ``table`` float unless
    ``float_env=False``. ``caption`` and ``label`` are inserted verbatim (they are LaTeX)."""
    spec = "".join("r" if n else "l" for n in table.numeric)

    def line(cells: Iterable[str]) -> str:
        return " & ".join(escape_latex(c) for c in cells) + r" \\"

    body = [
        f"\\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        line(table.headers),
        r"\midrule",
        *(line(r) for r in table.cells),
    ]
    if table.totals is not None:
        body += [r"\midrule", line(table.totals)]
    body += [r"\bottomrule", r"\end{tabular}"]

    out = [r"% requires \usepackage{booktabs}"]
    if float_env:
        out.append(r"\begin{table}" + (f"[{position}]" if position else ""))
        out.append(r"\centering")
        if caption is not None:
            out.append(f"\\caption{{{caption}}}")
        if label is not None:
            out.append(f"\\label{{{label}}}")
        out += body
        out.append(r"\end{table}")
    else:
        out += body
    return "\n".join(out) + "\n"


def to_latex(
    df: pd.DataFrame,
    totals: Mapping[str, Any] | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    caption: str | None = None,
    label: str | None = None,
    position: str | None = None,
    float_env: bool = True,
    units: str = "human",
    columns: Iterable[str] | None = None,
    depth: int | None = None,
    leaf_only: bool = False,
    top_k: int | None = None,
    sort_by: str | None = None,
    show_totals: bool = True,
) -> str | Path:
    """A booktabs table of ``df`` with a totals row. ``units="fixed"`` puts one unit per column in
    the header (``params (M)``), the usual layout in papers. Returns the text or writes ``path``."""
    table = prepare_table(
        df, totals, columns=columns, depth=depth, leaf_only=leaf_only, top_k=top_k,
        sort_by=sort_by, units=units, show_totals=show_totals,
    )
    text = latex_table(table, caption=caption, label=label, position=position, float_env=float_env)
    return emit(text, path)
