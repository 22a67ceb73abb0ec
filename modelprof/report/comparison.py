"""``Comparison``: what :func:`modelprof.compare` returns, a pandas DataFrame whose ``to_*`` are
pandas' own (raw numbers); modelprof's humanised exports are under :attr:`Comparison.render`, so
neither can be taken for the other."""

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
    (:mod:`modelprof.render.formats`; human ones in the compact columns unless ``columns=``),
    or ``export(format, path)``, with a report's view options (``columns``, ``top_k``,
    ``sort_by``, ``units``..., or ``view=ViewOptions(...)``)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._frame = frame

    def export(self, format: str, path: str | Path | None = None, **view: Any) -> str | Path:
        return export_comparison(self._frame, format, path, **view)


class Comparison(pd.DataFrame):
    """One row per model: totals, latency with its interval, ratios to the baseline (``*_x``);
    ``comparison.render.to_latex(...)`` and its siblings give modelprof's humanised tables."""

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
