"""``Comparison``: what :func:`modelprof.compare` returns.

A pandas DataFrame, one row per model, that behaves as pandas documents: its ``to_csv``,
``to_json``, ``to_latex``, ``to_html`` and ``to_markdown`` are pandas' own, on the raw numbers.
modelprof's humanised exports (``11.69 M``, ``3.10 ms``, ``0.0312×``, the environment as the
caption, the compact columns unless ``columns=``) are under :attr:`Comparison.render`, so neither
can be taken for the other. The notebook display is the humanised table.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["Comparison", "ComparisonRender"]


class ComparisonRender:
    """modelprof's exporters of a comparison (:mod:`modelprof.render.comparison`): humanised
    Markdown, LaTeX, HTML and text in the compact columns (``columns="all"`` for every one),
    and CSV/JSON with raw numbers that ``modelprof.render.read_csv``/``read_json`` read back.
    Each takes the view options of a report's exporters (``columns``, ``top_k``, ``sort_by``,
    ``units``..., or ``view=ViewOptions(...)``)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._frame = frame

    def to_markdown(self, path: str | Path | None = None, **view: Any) -> str | Path:
        from modelprof.render.comparison import comparison_to_markdown
        return comparison_to_markdown(self._frame, path, **view)

    def to_latex(self, path: str | Path | None = None, **view: Any) -> str | Path:
        from modelprof.render.comparison import comparison_to_latex
        return comparison_to_latex(self._frame, path, **view)

    def to_html(self, path: str | Path | None = None, **view: Any) -> str | Path:
        from modelprof.render.comparison import comparison_to_html
        return comparison_to_html(self._frame, path, **view)

    def to_text(self, **view: Any) -> str:
        from modelprof.render.comparison import comparison_to_text
        return comparison_to_text(self._frame, **view)

    def to_csv(self, path: str | Path | None = None, **view: Any) -> str | Path:
        from modelprof.render.comparison import comparison_to_csv
        return comparison_to_csv(self._frame, path, **view)

    def to_json(self, path: str | Path | None = None, **view: Any) -> str | Path:
        from modelprof.render.comparison import comparison_to_json
        return comparison_to_json(self._frame, path, **view)


class Comparison(pd.DataFrame):
    """One row per model: totals, latency with its interval, ratios to the baseline (``*_x``).

    Every pandas method is pandas' own (a derived frame is a plain ``DataFrame``, ``attrs``
    kept); ``comparison.render.to_latex(...)`` and its siblings give modelprof's humanised
    tables.
    """

    @property
    def render(self) -> ComparisonRender:
        """modelprof's humanised exporters of this table."""
        return ComparisonRender(self)

    def plot_cost_latency(self, cost: str = "macs", **kw: Any) -> Any:
        """Cost against measured latency, one point per model with its 95 % interval
        (:func:`modelprof.report.plots.plot_cost_latency`); ``plot`` stays pandas'."""
        from modelprof.report.plots import plot_cost_latency
        return plot_cost_latency(self, cost, **kw)

    def _repr_html_(self) -> str:
        from modelprof.render.comparison import comparison_to_html
        return str(comparison_to_html(self, standalone=False))
