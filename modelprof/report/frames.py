"""A DataFrame whose ``print`` shows every column and row: the summaries a Report returns
(``by_layer_type()``, ``by_module_type()``, ``by_operator()``) are small, and pandas' default
display would cut them to ``...`` at 80 characters or in a narrow terminal."""
from __future__ import annotations

import pandas as pd
from pandas.api.types import is_integer_dtype

from modelprof.render.units import format_bytes

__all__ = ["BytesFrame", "WholeFrame"]


class WholeFrame(pd.DataFrame):
    """A ``pandas.DataFrame`` in every respect but its ``repr``, which is ``to_string()``.

    Operations on it return plain DataFrames (``_constructor``), so the full display stays with
    the summary the Report returned and does not spread to frames derived from it."""

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return pd.DataFrame

    def __repr__(self) -> str:
        return self.to_string()


class BytesFrame(WholeFrame):
    """A :class:`WholeFrame` of byte counts whose ``repr`` shows its integer columns in human
    units (``131.42 GiB``); the values stay integers."""

    def __repr__(self) -> str:
        shown = pd.DataFrame(self).copy()
        for c in shown.columns:
            if is_integer_dtype(shown[c].dtype):
                shown[c] = shown[c].map(format_bytes)
        return shown.to_string()
