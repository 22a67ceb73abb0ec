"""LaTeX ``booktabs`` tables for papers, written directly (no pandas Styler, no jinja2).

``width`` (``"textwidth"``, ``"columnwidth"``) names the page target and ``fit`` how to meet it:
``"columns"`` drops the least important columns (never the first) until the estimated width
(Computer Modern glyph widths plus 5 %) fits :data:`NOMINAL_WIDTH_PT`; ``"scale"`` shrinks a
wider table with ``\\resizebox`` (``graphicx``), never enlarging one; ``"both"`` drops columns
until at most a 1.5x shrink is needed, then scales; ``None`` keeps the natural width.

Over :data:`LONG_ROWS` lines (``long=None``) a table is split into consecutive floats under one
number, the later ones "(continued)": unlike a ``longtable`` ("longtable not in 1-column mode")
they compile in two-column classes. ``long=True`` gives a ``longtable`` (one column only, never
scaled), ``long=False`` one float. The first lines are a comment naming the packages needed.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

from modelprof.errors import ModelProfError, ModelProfWarning, warn_user
from modelprof.render.formats import register_table
from modelprof.render.options import ViewOptions
from modelprof.render.views import (
    PAPER_COLUMNS,
    ROOT_LABEL,
    Table,
    check_priority,
    default_priority,
    is_rough,
    prepare_table,
)

__all__ = [
    "FITS",
    "FONT_SIZES",
    "LONG_ROWS",
    "NOMINAL_WIDTH_PT",
    "escape_latex",
    "estimate_width_pt",
    "latex_table",
    "to_latex",
]

_LATEX_SPECIALS = {ch: "\\" + ch for ch in "&%$#_{}"} | {
    "\\": r"\textbackslash{}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    "µ": r"\textmu{}",
    "×": r"$\times$",
}

FITS: tuple[str | None, ...] = ("columns", "scale", "both", None)
WIDTHS: tuple[str | None, ...] = ("textwidth", "columnwidth", None)
NOMINAL_WIDTH_PT: dict[str, float] = {"textwidth": 345.0, "columnwidth": 229.5}
"""The widths ``fit="columns"`` aims at: article class, 10 pt, one column / two columns."""
FONT_SIZES = {"normalsize": 10.0, "small": 9.0, "footnotesize": 8.0, "scriptsize": 7.0}
"""Font sizes (pt, in a 10 pt document) a table may be set in."""
LONG_ROWS = 40
"""Above this many rows (header and footer included) a table becomes a ``longtable``."""
_MAX_SHRINK = 1.5  # fit="both": drop columns until scaling by at most this much fits
_TABCOLSEP_PT = 6.0  # LaTeX's default \tabcolsep, on each side of every column
_SAFETY = 1.05
_UNIT_RE = re.compile(r"^(.+?) \(([^()]+)\)$")

# Computer Modern Roman glyph widths in thousandths of an em (cmr10.tfm), as "width:glyphs" (and
# the space); unknown glyphs count as an "m" so the estimate errs on the wide side.
_CMR_TABLE = """278:.,:;[]'!il 306:fj 333:- 361:I 389:()t 392:r 394:s 444:cez 472:? 500:0123456789/_*ago
514:J 528:kqvxy 556:bdhnpuS 576:µ 611:Z 625:L 653:F 681:EP 708:B 722:wCT 736:R 750:AHNUVXY 764:D
778:+=<>×&KOQ 785:G 833:%#m 917:M 1028:W"""
_CMR_WIDTHS: dict[str, int] = {" ": 333} | {
    glyph: int(width)
    for width, glyphs in (entry.split(":", 1) for entry in _CMR_TABLE.split())
    for glyph in glyphs
}


def escape_latex(text: str) -> str:
    """Escape the characters LaTeX treats specially: ``layer_1 & 50%`` -> ``layer\\_1 \\& 50\\%``."""
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)


# pdflatex's utf8 input sets Latin-1 and Latin Extended-A (T1 fonts); past that it stops with
# "Unicode character ... not set up for use with LaTeX"
_PDFLATEX_LAST = 0x17F


def _unset(text: str) -> list[str]:
    return [ch for ch in text if ord(ch) > _PDFLATEX_LAST and ch not in _LATEX_SPECIALS]


def _warn_unsettable(table: Table) -> list[str]:
    """Warn once about cells pdflatex cannot set; return the header comment that says so."""
    every = (c for row in (table.headers, *table.cells, *table.footer) for c in row)
    cells = list(dict.fromkeys(c for c in every if _unset(c)))  # in order, each once
    if not cells:
        return []
    chars = "".join(dict.fromkeys(ch for c in cells for ch in _unset(c)))
    more = f" and {len(cells) - 1} more" if len(cells) > 1 else ""
    warn_user(
        f"modelprof: the LaTeX table holds characters pdflatex cannot set ({chars[:20]!r}"
        f" in {cells[0]!r}{more}): compile it with xelatex or lualatex and a font that "
        "has them (e.g. xeCJK or luatexja for CJK)",
        ModelProfWarning,
    )
    return [
        f"% holds characters pdflatex cannot set ({chars[:20]}): compile with xelatex or "
        "lualatex and a font that has them"
    ]


def _text_width_pt(text: str, font_pt: float) -> float:
    return sum(_CMR_WIDTHS.get(ch, 833) for ch in text) * font_pt / 1000.0


def _label_span(row: Sequence[str]) -> int:
    """The columns a footer row's label spans: its own and the empty cells right of it."""
    return next((i for i in range(1, len(row)) if row[i] != ""), max(len(row), 1))


def _header_lines(table: Table) -> list[tuple[str, ...]]:
    """Headers on more lines for narrower columns: a unit under its name (``params`` over
    ``(M)``), a name of several words wider than its column's cells over two lines
    (``backward`` over ``latency median``)."""
    split = [_UNIT_RE.match(h) for h in table.headers]
    names = [m.group(1) if m else h for m, h in zip(split, table.headers)]
    units = tuple(f"({m.group(2)})" if m else "" for m in split)
    tops, bottoms = [], []
    for i, name in enumerate(names):
        widest = max(_text_width_pt(c, 1.0) for c in (units[i], *(r[i] for r in table.cells)))
        top, bottom = _two_lines(name) if _text_width_pt(name, 1.0) > widest else ("", name)
        tops.append(top)
        bottoms.append(bottom)
    lines = [tuple(tops)] if any(tops) else []
    return [*lines, tuple(bottoms), *([units] if any(units) else [])]


def _two_lines(name: str) -> tuple[str, str]:
    """``name``'s words over two lines, the wider as narrow as can be; one word stays on one:
    ``("", name)`` (each line is escaped apart, so any space is a place to break)."""
    words = name.split(" ")
    if len(words) < 2:
        return "", name
    cuts = [(" ".join(words[:k]), " ".join(words[k:])) for k in range(1, len(words))]
    return min(cuts, key=lambda c: max(_text_width_pt(c[0], 1.0), _text_width_pt(c[1], 1.0)))


def _column_widths_pt(table: Table, font_pt: float) -> list[float]:
    """Natural width of each column: its widest cell plus the column separation; a footer
    label wider than the columns it spans widens the last of them, as LaTeX does."""
    heads = _header_lines(table)
    # an indented module name is wider by its indentation (1 em = the font size)
    extra = [[0.0] * len(table.cells) for _ in table.columns]
    if any(indents := _indents(table)):
        extra[table.columns.index("module")] = [k * _INDENT_EM * font_pt for k in indents]
    widths = [
        max(
            [_text_width_pt(h[i], font_pt) for h in heads]
            + [_text_width_pt(r[i], font_pt) + extra[i][j] for j, r in enumerate(table.cells)]
            + [_text_width_pt(f[i], font_pt) for f in table.footer if i > 0 or not f[0]]
        )
        + 2 * _TABCOLSEP_PT
        for i in range(len(table.columns))
    ]
    for f in table.footer:
        span = _label_span(f)
        need = _text_width_pt(f[0], font_pt) + 2 * _TABCOLSEP_PT - sum(widths[:span])
        if need > 0:
            widths[span - 1] += need
    return widths


def estimate_width_pt(table: Table, font_size: str = "small") -> float:
    """The estimated natural width of ``table`` in points, set in ``font_size`` (5 % margin)."""
    return sum(_column_widths_pt(table, _font_pt(font_size))) * _SAFETY


def _font_pt(font_size: str) -> float:
    if font_size not in FONT_SIZES:
        raise ModelProfError(f"font_size={font_size!r} is not one of {list(FONT_SIZES)}")
    return FONT_SIZES[font_size]


def _drop_until_fits(
    table: Table, limit_pt: float, font_size: str, priority: Sequence[str]
) -> Table:
    """Drop columns until the estimate is within ``limit_pt``, never the first: the columns
    not in ``priority`` (most important first) go first, rightmost first; an interval's two
    bounds together, and with the median they bracket (a bound named keeps its partner and
    median; a median dropped takes its interval along). Then each dropped column that fits in
    the room left comes back, the most important first (a narrow one dropped before a wide one
    that had to go too)."""
    keep = list(range(len(table.columns)))
    rank = {name: i for i, name in enumerate(priority)}
    # what each column needs shown beside it: a bound its partner and the median it brackets
    needs = [
        {i} | {j for j, other in enumerate(table.columns) if other in _interval_of(name)}
        for i, name in enumerate(table.columns)
    ]
    # what goes with a column dropped (and as important as it): the columns that need it
    together = [{k for k, need in enumerate(needs) if i in need} for i in keep]
    # a stable sort: the unranked (rightmost first), then the ranked, least important first
    candidates = sorted(
        reversed(keep[1:]),
        key=lambda i: min(rank.get(table.columns[k], len(priority)) for k in together[i]),
        reverse=True,
    )
    widths = _column_widths_pt(table, _font_pt(font_size))

    def fits(columns: list[int]) -> bool:
        return sum(widths[j] for j in columns) * _SAFETY <= limit_pt

    for i in candidates:
        if fits(keep):
            break
        keep = [j for j in keep if j not in together[i]]
    for i in reversed(candidates):
        if i not in keep and fits(back := sorted({*keep, *needs[i]})):
            keep = back
    return _subset(table, keep)


def _interval_of(name: str) -> tuple[str, ...]:
    """A bound's partner and the median it brackets (``latency_ci_low_ms`` ->
    ``latency_ci_high_ms``, ``latency_median_ms`` or ``latency_ms``; ``ttft_ci_low_ms`` ->
    ``ttft_ms``); () for a column that is not an interval's bound."""
    for a, b in (("_ci_low", "_ci_high"), ("_ci_high", "_ci_low")):
        if a in name:
            return name.replace(a, b), name.replace(a, "_median"), name.replace(a, "")
    return ()


_DEFAULT_FONT, _SMALLER_FONT = "small", "footnotesize"

DEFAULT_PRIORITY: tuple[str, ...] = default_priority(
    """model module phase context batch_size type macs latency_ms params output_shape |
    calls flops"""
)
"""The columns ``fit`` keeps longest where the caller names none, a row's keys first."""


def _subset(table: Table, keep: Sequence[int]) -> Table:
    def pick(row: Sequence[str]) -> tuple[str, ...]:
        return tuple(row[i] for i in keep)

    # a footer row left with nothing but its label says nothing
    footer = tuple(pick(r) for r in table.footer if any(pick(r)[1:]))
    return dataclasses.replace(
        table,
        columns=pick(table.columns),
        headers=pick(table.headers),
        kinds=pick(table.kinds),
        cells=tuple(pick(r) for r in table.cells),
        footer=footer,
    )


_SHAPE_COLUMNS = frozenset({"input_shape", "output_shape", "input shape", "output shape"})
_SHAPE = re.compile(r"\b\d+(?:x\d+)+\b")  # 1x3x224x224; not resnext50_32x4d
_INDENT_EM = 0.8  # per level of the call tree below the table's shallowest row


def paper_shapes(text: str) -> str:
    """``1x3x224x224`` -> ``1×3×224×224``; a name such as ``resnext50_32x4d`` stays."""
    return _SHAPE.sub(lambda m: m.group(0).replace("x", "×"), text)


def _paper_cells(table: Table) -> Table:
    """The cells as a paper prints them: shapes with ``×``, the root named by its ``type``, a
    child shown under its parent named relative to it (``conv1`` under ``layer1.0``: full paths
    widen the column until the fit drops the shapes); an index (``layer1.0``) keeps its name."""
    frame = table.frame
    modules = list(map(str, frame["module"])) if "module" in frame.columns else []
    types = list(frame["type"]) if "type" in frame.columns else []
    at = table.columns.index("module") if "module" in table.columns else None
    parents = [a[-1] if a else "" for a in _ancestry(table)]  # the nearest shown ancestor
    cells = []
    for r, row in enumerate(table.cells):
        row = tuple(
            paper_shapes(c) if n in _SHAPE_COLUMNS else c for c, n in zip(row, table.columns)
        )
        if at is not None and r < len(modules):
            label = row[at]
            if modules[r] == "" and types and label == ROOT_LABEL:  # not "(root) #2"
                label = str(types[r])
            elif parents[r] and label.startswith(parents[r] + "."):
                rest = label[len(parents[r]) + 1 :]
                label = label if rest[:1].isdigit() else rest  # a bare "0" names nothing
            row = (*row[:at], label, *row[at + 1 :])
        cells.append(row)
    return dataclasses.replace(table, cells=tuple(cells))


def _ancestry(table: Table) -> list[list[str]]:
    """Per row, the rows shown above it that are its ancestors, outermost first; its length is
    the row's indentation, so a reader sees which rows are parts of another."""
    frame = table.frame
    if "module" not in table.columns or "module" not in frame.columns:
        return [[] for _ in table.cells]
    out: list[list[str]] = []
    above: list[str] = []  # the ancestors of the current row among the rows shown
    depths = frame["depth"] if "depth" in frame.columns else [None] * len(frame)
    for name, depth in zip(map(str, frame["module"]), depths):
        # a root starts a tree of its own (a generation's next phase), and so does a row at
        # the root's depth beside it (a training step's (loss) and (optimizer)); a recursive
        # call of the root (depth > 0) sits under the call that made it
        if depth == 0 or (name == "" and depth is None):
            above = []
        while above and not (above[-1] == "" or name.startswith(above[-1] + ".")):
            above.pop()
        out.append(list(above))
        above.append(name)
    return out


def _indents(table: Table) -> list[int]:
    return [len(a) for a in _ancestry(table)]


def _line(cells: Iterable[str]) -> str:
    return " & ".join(escape_latex(c) for c in cells) + r" \\"


def _row_line(table: Table, r: int, cells: Sequence[str], indent: int = 0) -> str:
    """A body row, its rough cells greyed (xcolor), its module name indented ``indent`` levels."""
    out = [
        f"\\textcolor{{gray}}{{{escape_latex(c)}}}" if is_rough(table, r, n) else escape_latex(c)
        for c, n in zip(cells, table.columns)
    ]
    if indent:
        at = table.columns.index("module")
        out[at] = f"\\hspace{{{indent * _INDENT_EM:g}em}}{out[at]}"
    return " & ".join(out) + r" \\"


def _footer_line(row: Sequence[str]) -> str:
    """A footer row whose label spans the empty cells right of it, not widening the first column."""
    span = _label_span(row)
    if span == 1:
        return _line(row)
    label = f"\\multicolumn{{{span}}}{{l}}{{{escape_latex(row[0])}}}"
    return " & ".join([label, *(escape_latex(c) for c in row[span:])]) + r" \\"


def latex_table(table: Table, view: ViewOptions | None = None, **options: Any) -> str:
    """Lay out a prepared :class:`Table` in a ``table`` float (``table*`` for
    ``width="textwidth"``: both columns of a two-column paper), a ``longtable``, or a bare
    ``tabular`` (``float_env=False``). ``caption`` is escaped; ``label`` is a key, refused where
    LaTeX would read a character specially."""
    view = ViewOptions.parse(view, **options)
    # no font named: \small, which may step down to keep columns; a font named stays
    chosen = view.font_size is not None
    view = view.replace(
        caption=None if view.caption is None else escape_latex(paper_shapes(view.caption)),
        label=_checked_label(view.label),
        font_size=view.font_size or _DEFAULT_FONT,
    )
    width, fit, long = view.width, view.fit, view.long
    if fit not in FITS:
        raise ModelProfError(f"fit={fit!r} is not one of {list(FITS)}")
    if width not in WIDTHS:
        raise ModelProfError(f"width={width!r} is not one of {list(WIDTHS)}")
    _font_pt(view.font_size)  # validates
    n_lines = len(table.cells) + len(table.footer) + 1
    split = long is None and view.float_env and n_lines > LONG_ROWS
    long = bool(long)
    if long and not view.float_env:
        raise ModelProfError(
            "long=True makes a longtable, which is its own environment; drop float_env=False"
        )
    if long and fit in ("scale", "both"):
        raise ModelProfError(
            f"fit={fit!r}: a longtable cannot be scaled; use fit='columns', "
            "fewer rows (depth=, top_k=) or long=False"
        )
    table = _paper_cells(table)
    before = table.columns
    table, view = _fitted(table, view, chosen)
    scale = width is not None and fit in ("scale", "both")
    head = [r"\toprule", *(_line(h) for h in _header_lines(table)), r"\midrule"]
    indents = _indents(table)
    body = [_row_line(table, i, r, indents[i]) for i, r in enumerate(table.cells)]
    grey = any(is_rough(table, i, n) for i in range(len(table.cells)) for n in table.columns)
    if table.footer:
        body += [r"\midrule", *(_footer_line(r) for r in table.footer)]
    used = {"booktabs": True, "longtable": long, "graphicx": scale, "xcolor": grey}
    packages = [name for name, needed in used.items() if needed]
    out = _comments(table, before, packages, view)
    out += _warn_unsettable(table)
    if long:
        return "\n".join(out + _longtable(table, head, body, view)) + "\n"
    parts = _split_body(table, body, LONG_ROWS - len(head)) if split else [body]
    return "\n".join(out + _floating(table, head, parts, view, scale)) + "\n"


def _fitted(table: Table, view: ViewOptions, chosen: bool) -> tuple[Table, ViewOptions]:
    """The table with the columns ``fit`` keeps (:func:`_drop_until_fits`), and the view with
    the font it chose: where that drops a column a paper keeps (``priority``'s
    :data:`PAPER_COLUMNS`: a report's or a comparison's alike), the default ``\\small`` steps
    down to ``\\footnotesize`` if that keeps more of those, and where what is left is still
    wider than the page (a long first column, which stays); a font the user ``chosen`` stays."""
    if view.width is None or view.fit not in ("columns", "both"):
        return table, view
    target = NOMINAL_WIDTH_PT[view.width] * (_MAX_SHRINK if view.fit == "both" else 1.0)
    priority = view.priority or DEFAULT_PRIORITY
    fitted = _drop_until_fits(table, target, view.font_size, priority)
    keep = [c for c in priority if c in PAPER_COLUMNS]
    lost = [c for c in keep if c in table.columns and c not in fitted.columns]
    wide = estimate_width_pt(fitted, view.font_size) > target
    if (lost or wide) and not chosen and view.font_size == _DEFAULT_FONT:
        smaller = _drop_until_fits(table, target, _SMALLER_FONT, priority)
        if wide or any(c in smaller.columns for c in lost):
            return smaller, view.replace(font_size=_SMALLER_FONT)
    return fitted, view


def latex_columns(df: Any, view: ViewOptions) -> tuple[str, ...]:
    """The columns of ``df`` a LaTeX table under ``view`` keeps once fitted to its width (for a
    caption that speaks only of what is shown)."""
    chosen = view.font_size is not None
    view = view.replace(font_size=view.font_size or _DEFAULT_FONT)
    table = _paper_cells(prepare_table(df, view=view, default_units="fixed"))
    return _fitted(table, view, chosen)[0].columns


def _comments(
    table: Table, before: Sequence[str], packages: Sequence[str], view: ViewOptions
) -> list[str]:
    """The comment lines above a table: packages needed, columns dropped, estimated width."""
    out = [f"% modelprof table: needs \\usepackage{{{','.join(packages)}}} in the preamble"]
    dropped = [c for c in before if c not in table.columns]
    if dropped:
        out.append(
            f"% dropped to fit \\{view.width} ({NOMINAL_WIDTH_PT[view.width]:g} pt in "
            f"\\{view.font_size}), in table order: {', '.join(dropped)}; to keep one, "
            "name it in priority=, or use fit='scale' or width=None"
        )
    n = len(table.columns)
    out.append(
        f"% estimated natural width {estimate_width_pt(table, view.font_size):.0f} pt in "
        f"\\{view.font_size} ({n} column{'s' if n != 1 else ''})"
    )
    return out


def _checked_label(label: str | None) -> str | None:
    """A ``\\label`` key as given (``\\ref`` matches it, so it cannot be escaped)."""
    bad = sorted(set(label or "") & set("\\&%$#{}~^"))
    if bad:
        raise ModelProfError(
            f"label={label!r} holds {''.join(bad)!r}, which LaTeX treats "
            "specially: use letters, digits and ':', '-', '_', '.'"
        )
    return label


def _longtable(table: Table, head: list[str], body: list[str], view: ViewOptions) -> list[str]:
    """A longtable that breaks across pages, its header repeated on each."""
    n, spec = len(table.columns), "".join("r" if n else "l" for n in table.numeric)
    caption, label = view.caption, view.label
    first = [*head, r"\endfirsthead"]
    if caption is not None:
        first.insert(
            0, f"\\caption{{{caption}}}" + (f"\\label{{{label}}}" if label else "") + r" \\"
        )
    elif label is not None:
        first.insert(0, f"\\label{{{label}}}" + r" \\")
    return [
        r"\begingroup",
        f"\\{view.font_size}",
        f"\\begin{{longtable}}{{{spec}}}",
        *first,
        f"\\multicolumn{{{n}}}{{l}}{{\\emph{{(continued)}}}} \\\\",
        *head,
        r"\endhead",
        r"\midrule",
        f"\\multicolumn{{{n}}}{{r}}{{\\emph{{continued on the next page}}}} \\\\",
        r"\endfoot",
        r"\bottomrule",
        r"\endlastfoot",
        *body,
        r"\end{longtable}",
        r"\endgroup",
    ]


def _floating(
    table: Table, head: list[str], parts: list[list[str]], view: ViewOptions, scale: bool
) -> list[str]:
    """A tabular, scaled when asked, bare or in floats: one per part of the body, the later
    ones "(continued)" under the same number."""
    spec = "".join("r" if n else "l" for n in table.numeric)
    scale_to = view.width if scale else None
    if not view.float_env:
        return [f"{{\\{view.font_size}", *_tabular(spec, head, parts[0], scale_to), "}"]
    env = "table*" if view.width == "textwidth" else "table"
    caption, label = view.caption, view.label
    out: list[str] = []
    for i, part in enumerate(parts):
        out += [
            f"\\begin{{{env}}}" + (f"[{view.position}]" if view.position else ""),
            r"\centering",
            f"\\{view.font_size}",
        ]
        if i == 0 and caption is not None:
            out.append(f"\\caption{{{caption}}}")
        elif caption is not None:  # the same number as the first part's
            out += [r"\addtocounter{table}{-1}", f"\\caption{{{caption} (continued)}}"]
        if i == 0 and label is not None:
            out.append(f"\\label{{{label}}}")
        if i > 0 and caption is None:
            part = [
                f"\\multicolumn{{{len(table.columns)}}}{{l}}{{\\emph{{(continued)}}}} \\\\",
                *part,
            ]
        out += _tabular(spec, head, part, scale_to)
        out.append(f"\\end{{{env}}}")
    return out


def _tabular(
    spec: str, head: Sequence[str], body: Sequence[str], scale_to: str | None
) -> list[str]:
    """A booktabs ``tabular``; with ``scale_to``, in a ``\\resizebox`` that only shrinks it."""
    tabular = [f"\\begin{{tabular}}{{{spec}}}", *head, *body, r"\bottomrule", r"\end{tabular}"]
    if scale_to is None:
        return tabular
    length = f"\\{scale_to}"
    # \width is the natural width inside \resizebox
    return [
        f"\\resizebox{{\\ifdim\\width>{length}{length}\\else\\width\\fi}}{{!}}{{%",
        *tabular[:-1],
        tabular[-1] + "}",
    ]


def _split_body(table: Table, body: Sequence[str], per_part: int) -> list[list[str]]:
    """The body lines in parts of at most ``per_part`` lines; the footer stays whole, last."""
    per_part = max(per_part, 5)
    n_footer = len(table.footer) + 1 if table.footer else 0
    rows, footer = list(body[: len(body) - n_footer]), list(body[len(body) - n_footer :])
    parts = [rows[i : i + per_part] for i in range(0, len(rows), per_part)] or [[]]
    if len(parts[-1]) + len(footer) > per_part:
        parts.append([])
    parts[-1] += footer
    return parts


to_latex = register_table(
    "latex",
    lambda table, view, to_file: latex_table(table, view),
    default_units="fixed",
    check=lambda df, view: check_priority(df, view.priority),
    suffix="tex",
    doc="A booktabs table for papers: one unit per column, named in the header; fitted to "
    '``width="textwidth"`` (or ``"columnwidth"``) by dropping the least important columns '
    '(``fit="columns"``), scaling (``"scale"``) or both; over 40 lines, continued floats that '
    "compile in one- and two-column classes (``long=True``: a ``longtable``). The caption "
    "defaults to the result's title (a report's: model, input, dtype, device); ``label=``.",
    summary="""A booktabs table of ``df`` with its footer rows, fitted to ``width``;
    ``units="fixed"`` by default (``params (M)``). ``priority`` names the columns ``fit`` keeps
    longest. Returns the text or writes ``path``.""",
)
