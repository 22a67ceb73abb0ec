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

from modelprof.render.comparison import export_comparison
from modelprof.render.formats import Exports
from modelprof.report.plots import plot_cost_latency

__all__ = ["Comparison", "ComparisonRender"]


class ComparisonRender(Exports):
    """modelprof's exporters of a comparison: ``to_<format>`` for every registered format
    (:mod:`modelprof.render.formats`: ``to_markdown``, ``to_latex``, ``to_html``, ``to_text``
    humanised in the compact columns, ``columns="all"`` for every one; ``to_csv``, ``to_json``
    raw numbers that ``modelprof.render.read_csv``/``read_json`` read back), or
    ``export(format, path)``. Each takes the view options of a report's exporters
    (``columns``, ``top_k``, ``sort_by``, ``units``..., or ``view=ViewOptions(...)``)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._frame = frame

    def export(self, format: str, path: str | Path | None = None, **view: Any) -> str | Path:
        return export_comparison(self._frame, format, path, **view)


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

        return plot_cost_latency(self, cost, **kw)

    def _repr_html_(self) -> str:
        return str(self.render.export("html", standalone=False))
