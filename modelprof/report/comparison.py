"""``Comparison``: what :func:`modelprof.compare` returns, a pandas DataFrame whose ``to_*`` are
pandas' own (raw numbers); modelprof's humanised exports are under :attr:`Comparison.render`, so
neither can be taken for the other."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from modelprof.errors import ModelProfError, ModelProfWarning, warn_user
from modelprof.render.comparison import export_comparison, failed_note
from modelprof.render.formats import Exports
from modelprof.report.plots import plot_cost_latency

__all__ = ["Comparison", "ComparisonRender", "every_model_failed", "note_failed"]


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
    ``comparison.render.to_latex(...)`` and its siblings give modelprof's humanised tables.
    A frame pandas derives from it (sorted, filtered, some rows or columns, a copy) is a
    ``Comparison`` too, its ``attrs`` (baseline, notes) kept: its ``render`` shows what it
    holds."""

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return Comparison

    @property
    def render(self) -> ComparisonRender:
        """modelprof's humanised exporters of this table."""
        return ComparisonRender(self)

    def plot_cost_latency(self, cost: str = "macs", **kw: Any) -> Any:
        """Cost against measured latency, one point per model with its 95 % interval
        (:func:`modelprof.report.plots.plot_cost_latency`); ``plot`` stays pandas'."""
        return plot_cost_latency(self, cost, **kw)

    def _repr_html_(self) -> str | None:
        """modelprof's table; pandas' own where a frame derived from this one is no table
        modelprof renders (two columns of one name, MultiIndex columns)."""
        try:
            return str(self.render.export("html", standalone=False))
        except ModelProfError:
            return super()._repr_html_()


def note_failed(attrs: dict[str, Any], failed: Mapping[str, str], *first: str) -> None:
    """``attrs["failed"]`` and, after the notes ``first``, a note per model that failed (a
    comparison keeps its row, with its error in ``error``)."""
    attrs["failed"] = dict(failed)
    attrs["notes"] = [
        *(attrs.get("notes") or ()),
        *first,
        *map(failed_note, failed),
    ]


def warn_failed(failed: Mapping[str, str]) -> None:
    """A warning per model that failed: its row alone is easy to miss."""
    for name, error in failed.items():
        warn_user(f"modelprof: {name} failed and is not compared: {error}", ModelProfWarning)


def every_model_failed(failed: Mapping[str, str]) -> ModelProfError:
    """The error of a comparison no model of which ran: each one's, without the ``candidate
    'name': `` its row's error starts with where the interleaved timing said it."""
    error = ModelProfError(
        "every model failed: "
        + "; ".join(
            f"model {n!r}: {e.removeprefix(f'candidate {n!r}: ')}" for n, e in failed.items()
        )
    )
    error.model_failed = True  # the command line's exit status 1, as where some model ran
    return error
