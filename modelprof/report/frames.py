"""A DataFrame whose ``print`` shows every column and row: the summaries a Report returns
(``by_layer_type()``, ``by_module_type()``, ``by_operator()``) are small, and pandas' default
display would cut them to ``...`` at 80 characters or in a narrow terminal."""
from __future__ import annotations

import pandas as pd

__all__ = ["WholeFrame"]


class WholeFrame(pd.DataFrame):
    """A ``pandas.DataFrame`` in every respect but its ``repr``, which is ``to_string()``.

    Operations on it return plain DataFrames (``_constructor``), so the full display stays with
    the summary the Report returned and does not spread to frames derived from it."""

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return pd.DataFrame

    def __repr__(self) -> str:
        return self.to_string()
