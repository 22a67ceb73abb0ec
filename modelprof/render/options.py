"""``ViewOptions``: every exporter's options in one frozen object, parsed once at the boundary.
Selection, units and footer apply to every format; the rest to one (:data:`FORMAT_OPTIONS`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from modelprof.errors import ModelProfError, check_flag, is_int, nearest_keywords

__all__ = ["FORMAT_OPTIONS", "UNITS", "ViewOptions", "check_count", "check_read_by"]

#: the options each format reads beside the shared ones (a raw format writes numbers as they
#: are: no units)
FORMAT_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "latex": tuple(
        "caption label position float_env width fit long font_size priority units".split()
    ),
    "html": ("caption", "max_height", "standalone", "title", "summary", "units"),
    "markdown": ("caption", "standalone", "summary", "units"),
    "text": ("title", "max_rows", "units"),
    "json": ("indent",),
    "csv": (),
}
_STYLES = ("modelprof", "torchstat")
#: how numbers are written: ``1.82 G``, one unit per column header, or as they are
UNITS: tuple[str, ...] = ("human", "fixed", "raw")
_GROUPS = ("layer_type", "module_type")


def check_read_by(format: str, given: Iterable[str]) -> None:
    """Refuse keywords ``given`` to ``format`` that only other formats read: ``to_csv(caption=
    ...)`` would drop the caption in silence. A format registered elsewhere reads what it
    reads: not checked."""
    if format not in FORMAT_OPTIONS:
        return
    unread = sorted(k for k in given if k in _SPECIFIC and k not in FORMAT_OPTIONS[format])
    if unread:
        said = "; ".join(
            f"{k}= is read by {', '.join(f for f, o in FORMAT_OPTIONS.items() if k in o)}"
            for k in unread
        )
        raise ModelProfError(f"{format} does not read {', '.join(unread)}: {said}")


#: the options some format reads and others do not
_SPECIFIC = {o for opts in FORMAT_OPTIONS.values() for o in opts}


@dataclasses.dataclass(frozen=True)
class ViewOptions:
    """How a table is shown.

    ``style``: the modelprof view or torchstat's; ``group_by``: ``"layer_type"`` or
    ``"module_type"`` sums of the leaf rows; ``columns``: names, or ``"all"``/``"compact"``;
    ``depth``: the tree collapsed to modules at depth <= k; ``leaf_only``; ``top_k`` rows by
    ``sort_by``; ``units``: ``"human"`` (``1.82 G``), ``"fixed"`` (one unit per column header,
    the default in LaTeX) or ``"raw"``; ``show_totals``: the total and end-to-end footer rows.
    The format-specific options are listed in :data:`FORMAT_OPTIONS`.
    """

    style: str = "modelprof"
    group_by: str | None = None
    columns: tuple[str, ...] | str | None = None
    depth: int | None = None
    leaf_only: bool = False
    top_k: int | None = None
    sort_by: str | None = None
    units: str | None = None  # None: the format's own default
    show_totals: bool = True
    # LaTeX
    caption: str | None = None
    label: str | None = None
    position: str | None = None
    float_env: bool = True
    width: str | None = "textwidth"
    fit: str | None = "columns"
    long: bool | None = None
    font_size: str | None = None  # None: \small, stepping down to \footnotesize to keep columns
    priority: tuple[str, ...] = ()
    # HTML
    max_height: str | None = None
    standalone: bool | None = None  # None: the caller's default (a report's page, a bare table)
    title: str | None = None
    summary: tuple[str, ...] = ()
    # text
    max_rows: int | None = None
    # JSON
    indent: int | None = 2

    @classmethod
    def parse(cls, view: ViewOptions | None = None, **options: Any) -> ViewOptions:
        """``view`` (or the defaults) with ``options`` applied and checked."""
        if view is not None and not isinstance(view, ViewOptions):
            raise ModelProfError(f"view={view!r} is not a ViewOptions")
        for key in ("columns", "priority", "summary"):
            value = options.get(key)
            if value is not None and not isinstance(value, str) and isinstance(value, Iterable):
                options[key] = tuple(value)
        return dataclasses.replace(view or cls(), **options)  # checked in __new__, __post_init__

    def __new__(cls, *args: Any, **options: Any) -> ViewOptions:
        """Refuse names that are no view option (``ViewOptions(depht=1)``) with the nearest one
        for a misspelling, not a bare TypeError."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            near = nearest_keywords(unknown, names)
            raise ModelProfError(f"unknown view option(s) {unknown}{near}; valid: {sorted(names)}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        """Checked once, when made (``ViewOptions(...)``, ``parse`` or ``replace``)."""
        if self.style not in _STYLES:
            raise ModelProfError(f"style={self.style!r} is not one of {list(_STYLES)}")
        if self.group_by is not None and self.group_by not in _GROUPS:
            raise ModelProfError(f"group_by={self.group_by!r} is not one of {list(_GROUPS)}")
        for name in ("leaf_only", "show_totals", "float_env"):
            check_flag(name, getattr(self, name))
        for name in ("standalone", "long"):  # None: the caller's default (the table's length)
            if getattr(self, name) is not None:  # set: said so (long="false" is no False)
                check_flag(name, getattr(self, name))
        pos = self.position
        if pos is not None and not (
            isinstance(pos, str) and set(pos) <= set("htbp!") and set(pos) & set("htbp")
        ):
            raise ModelProfError(
                f"position={pos!r} is not a LaTeX float placement: letters of 'htbp', with '!' "
                "if you like (such as 't' or '!htbp'; 'H' needs the float package and a table "
                "that is not table*: float_env=False gives a bare tabular to place yourself)"
            )
        for name, least in (("depth", 0), ("top_k", 1), ("max_rows", 1), ("indent", 0)):
            check_count(name, getattr(self, name), least)
        if self.units is not None:
            _check_units(self.units)
        for name in ("caption", "label", "title"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ModelProfError(f"{name}={value!r} must be a string or None")
        if self.max_height is not None and not (
            isinstance(self.max_height, str) and _CSS_VALUE.fullmatch(self.max_height)
        ):  # (written into the page's style as given: nothing that ends the value)
            raise ModelProfError(
                f"max_height={self.max_height!r} must be a CSS length such as '30em', "
                "'400px', '80vh' or 'calc(100vh - 10em)'"
            )
        given = self.priority
        # one name, a list, or None (the caller's default); an iterator is read once, here
        priority = (given,) if isinstance(given, str) else () if given is None else given
        priority = tuple(priority) if isinstance(priority, Iterable) else None
        if priority is None or not all(isinstance(c, str) for c in priority):
            raise ModelProfError(f"priority={given!r} must be a list of column names")
        object.__setattr__(self, "priority", priority)  # (frozen)
        if isinstance(self.columns, tuple) and not self.columns:
            raise ModelProfError("columns=[] names no column: name some, or 'all' or 'compact'")

    def replace(self, **options: Any) -> ViewOptions:
        """A copy with ``options`` changed and checked."""
        return ViewOptions.parse(self, **options)

    def with_defaults(self, given: Iterable[str] = (), **defaults: Any) -> ViewOptions:
        """A caller's defaults in the fields left at ViewOptions' own and not named in
        ``given`` (the keywords passed, which win even at that value: ``caption=None``). A
        ViewOptions cannot tell a field set to its default from one left alone: there the
        caller's default applies, so insist on a default value as a keyword."""
        taken = {*given, *self.changed()}
        update = {k: v for k, v in defaults.items() if k not in taken}
        return self.replace(**update) if update else self

    def changed(self) -> tuple[str, ...]:
        """The fields set away from ViewOptions' own defaults."""
        unset = ViewOptions()
        fields = dataclasses.fields(self)
        return tuple(f.name for f in fields if getattr(self, f.name) != getattr(unset, f.name))

    def fit_for(self, columns: Any, given: Iterable[str] = ()) -> ViewOptions:
        """Columns named one by one or ``"all"`` (not ``"compact"``) are kept and the LaTeX table
        scaled, unless ``fit`` is set or the table is a longtable (which cannot scale)."""
        named = columns is not None and not (isinstance(columns, str) and columns == "compact")
        return self.with_defaults(given, fit="scale") if named and not self.long else self

    @property
    def selection(self) -> dict[str, Any]:
        """The row selection, as :func:`modelprof.render.views.select_rows` takes it."""
        return {k: getattr(self, k) for k in ("depth", "leaf_only", "top_k", "sort_by")}

    def selects_rows(self) -> bool:
        return self.leaf_only or any(v is not None for v in (self.depth, self.top_k, self.sort_by))

    def units_or(self, default: str) -> str:
        """The units asked for, else the format's ``default``; refused unless one of UNITS."""
        return _check_units(default if self.units is None else self.units)


#: a CSS value that stays one: no character that ends it, its rule or the style element
_CSS_VALUE = re.compile(r"[^;{}<>\"'\\]+")


def _check_units(units: Any) -> str:
    if units not in UNITS:
        raise ModelProfError(f"units must be one of {list(UNITS)}, got {units!r}")
    return units


def check_count(name: str, value: Any, least: int) -> None:
    """Refuse ``name=value`` unless it is None or an integer (numpy's included, ``True`` not)
    of at least ``least`` (0 or 1)."""
    if value is not None and not (is_int(value) and value >= least):
        what = "non-negative" if least == 0 else "positive"
        raise ModelProfError(f"{name} must be a {what} integer, got {value!r}")
