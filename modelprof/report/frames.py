"""The summary frames a user prints (``by_layer_type()``, ``memory_estimate()``...):
``pandas.DataFrame``s whose numbers stay numeric, shown whole and in human units (``1.82 G``,
``58.0 MiB``) by their ``repr`` and ``_repr_html_``, where pandas' display would cut them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd

from modelprof.render.html import to_html
from modelprof.render.text import to_text

__all__ = ["WholeFrame", "shown"]

_UNITS = "modelprof_units"  # attrs key: column -> unit suffix for display ("_bytes")
_CAPTION = "modelprof_caption"  # attrs key: a line shown above the table
_MARKS = "modelprof_marks"  # attrs key: flags shown as the marks (~) they set, not as columns


class WholeFrame(pd.DataFrame):
    """A ``pandas.DataFrame`` in every respect but its display: every row and column, in human
    units (``shown`` makes one). Frames derived from it are plain DataFrames."""

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return pd.DataFrame

    def _display(self) -> tuple[pd.DataFrame, str | None, list[str] | None]:
        """A plain copy whose column names carry their units (``inference`` as
        ``inference_bytes``: shown as "inference" in bytes), the caption, and the columns to
        show (None: all): not the flags that mark their cells ``~`` (they stay in the copy,
        which the marks are read from)."""
        units = self.attrs.get(_UNITS) or {}
        frame = pd.DataFrame(self).rename(columns={c: f"{c}{s}" for c, s in units.items()})
        frame.attrs = {}
        marks = set(self.attrs.get(_MARKS) or ()) & set(frame.columns)
        columns = [c for c in frame.columns if c not in marks] if marks else None
        return frame, self.attrs.get(_CAPTION), columns

    def __repr__(self) -> str:
        frame, caption, columns = self._display()
        if frame.empty:
            return (caption + "\n" if caption else "") + "(no rows)"
        return str(to_text(frame, show_totals=False, title=caption, columns=columns))

    def _repr_html_(self) -> str:
        frame, caption, columns = self._display()
        return str(
            to_html(frame, standalone=False, show_totals=False, caption=caption, columns=columns)
        )


def shown(
    df: pd.DataFrame,
    *,
    units: Mapping[str, str] | None = None,
    caption: str | None = None,
    marks: Iterable[str] = (),
) -> WholeFrame:
    """``df`` as a :class:`WholeFrame`; ``units`` gives a column whose name says no unit its
    unit suffix (``{"inference": "_bytes"}``), ``caption`` a line shown above it, ``marks``
    the flag columns (``latency_rough``) its display says by the cells they mark (``~``)
    rather than as columns: the frame keeps them, as its files do."""
    out = WholeFrame(df)
    if units:
        out.attrs[_UNITS] = dict(units)
    if caption:
        out.attrs[_CAPTION] = caption
    if marks:
        out.attrs[_MARKS] = list(marks)
    return out
