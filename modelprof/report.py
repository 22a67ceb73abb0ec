"""``Report``: the result of ``profile`` — per-call rows, totals, timing and environment, with
views (DataFrames in two styles, per-operator counts) and exporters."""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .counter import OpStats
from .errors import ModelProfError
from .table import Row, modelprof_frame, torchstat_frame, totals_of

__all__ = ["Report"]

_STYLES = ("modelprof", "torchstat")


class Report:
    """Static cost and measured time of one model on one input, one row per module call.

    ``totals`` sums the leaf rows (each shared parameter once); ``unsupported`` maps ops that
    have no formula to their call counts; ``latency`` is the clean end-to-end measurement
    (``None`` with ``timing=False``).
    """

    def __init__(self, rows: Sequence[Row], *, model_name: str, input_shape: str,
                 batch_size: int, device: str, dtype: str,
                 unsupported: Mapping[str, int], by_op: Mapping[str, OpStats],
                 model_params: int, env: dict[str, Any] | None = None,
                 latency: Any = None, layer_timing: Any = None,
                 instrumentation_overhead: float | None = None,
                 coverage: float | None = None, options: dict[str, Any] | None = None,
                 peaks: Any = None, timing_notes: Sequence[str] = (),
                 training_step: Any = None) -> None:
        self.rows = list(rows)
        self.model_name = model_name
        self.input_shape = input_shape
        self.batch_size = batch_size
        self.device = device
        self.dtype = dtype
        self.unsupported = dict(unsupported)
        self._by_op = dict(by_op)
        self.model_params = model_params
        self.env = dict(env or {})
        self.latency = latency
        self.layer_timing = layer_timing
        self.instrumentation_overhead = instrumentation_overhead
        self.coverage = coverage
        self.options = dict(options or {})
        self.peaks = peaks
        #: how the timing columns were measured where that is not the plain recipe
        self.timing_notes = list(timing_notes)
        self.training_step = training_step  # modelprof.step_table.TrainingStep (backward=True)
        self.totals = totals_of(self.rows)

    @property
    def timed(self) -> bool:
        return self.latency is not None

    @property
    def backward_latency(self) -> Any:
        """The clean end-to-end backward ``Measurement`` (``backward=True`` and timed), else None."""
        return None if self.training_step is None else self.training_step.backward_latency

    # -- views ----------------------------------------------------------------------------------
    def to_dataframe(self, style: str = "modelprof") -> pd.DataFrame:
        """One row per module call (``modelprof``) or torchstat's leaf table (``torchstat``).

        With measured peaks (``profile(..., roofline=True)``, the default when timing) the
        modelprof view carries the roofline columns: achieved_gflops, achieved_gbps, intensity,
        roofline_ms, bound, efficiency.
        """
        style = _check_style(style)
        if style == "torchstat":
            return torchstat_frame(self.rows, self.timed)
        df = modelprof_frame(self.rows, self.timed)
        if self.peaks is not None:
            from .roofline import add_roofline
            df = add_roofline(df, self.peaks)
        return df

    def by_operator(self, direction: str = "forward") -> pd.DataFrame:
        """Per aten op: calls, macs, flops, madd, and whether a formula counted it; of the
        forward (the loss's included), or with ``direction="backward"`` of the backward."""
        if direction not in ("forward", "backward"):
            raise ModelProfError(f"direction={direction!r} must be 'forward' or 'backward'")
        if direction == "backward" and self.training_step is None:
            raise ModelProfError("by_operator(direction='backward') needs "
                                 "profile(..., backward=True)")
        by_op = self._by_op if direction == "forward" else self.training_step.cost.by_op
        names = sorted(by_op, key=lambda k: (-by_op[k].flops, k))
        return pd.DataFrame({
            "op": [f"aten.{n}" for n in names],
            "calls": [by_op[n].calls for n in names],
            "macs": [by_op[n].macs for n in names],
            "flops": [by_op[n].flops for n in names],
            "madd": [by_op[n].madd for n in names],
            "supported": [f"aten.{n}" not in self.unsupported for n in names],
        }).astype({"calls": "int64", "macs": "int64", "flops": "int64", "madd": "int64"})

    def by_module_type(self) -> pd.DataFrame:
        """Leaf rows grouped by module type: calls and the additive columns."""
        df = self.to_dataframe()
        leaves = df[df["leaf"]]
        cols = ["params", "macs", "flops", "madd", "read_bytes", "write_bytes"]
        out = leaves.groupby("type", sort=False)[cols].sum()
        out.insert(0, "calls", leaves.groupby("type", sort=False).size())
        return out.sort_values("flops", ascending=False)

    # -- exporters ------------------------------------------------------------------------------
    # Every table exporter takes the same view options: style, columns, depth (collapse to
    # modules at depth <= k), leaf_only, top_k and sort_by.
    def _table(self, style: str) -> tuple[pd.DataFrame, dict[str, Any] | None]:
        style = _check_style(style)
        df = self.to_dataframe(style)
        if style == "torchstat":  # carries its own total row
            return df, None
        totals: dict[str, Any] = dict(self.totals)
        if self.latency is not None:
            totals["latency_ms"] = self.latency.median_ms
        if self.backward_latency is not None:
            totals["backward_latency_ms"] = self.backward_latency.median_ms
        return df, totals

    def to_csv(self, path: str | Path | None = None, *, style: str = "modelprof",
               **view: Any) -> str | Path:
        """CSV with raw numbers (no units), read back exactly by ``modelprof.render.read_csv``."""
        from .render.csvio import to_csv
        return to_csv(self._table(style)[0], path=path, **view)

    def to_markdown(self, path: str | Path | None = None, *, style: str = "modelprof",
                    **view: Any) -> str | Path:
        """GitHub Markdown table, human units (``1.81 G``, ``3.06 MiB``), totals row."""
        from .render.markdown import to_markdown
        return to_markdown(*self._table(style), path=path, **view)

    def to_latex(self, path: str | Path | None = None, *, style: str = "modelprof",
                 units: str = "fixed", **view: Any) -> str | Path:
        """A booktabs table for papers: one unit per column, named in the header."""
        from .render.latex import to_latex
        from .render.views import compact_columns
        df, totals = self._table(style)
        if style == "modelprof":
            view.setdefault("columns", compact_columns(df))
        return to_latex(df, totals, path=path, units=units, **view)

    def to_html(self, path: str | Path | None = None, *, style: str = "modelprof",
                **view: Any) -> str | Path:
        """A styled HTML table (the notebook display), human units and latency-share bars."""
        from .render.html import to_html
        view.setdefault("caption", self._title())
        return to_html(*self._table(style), path=path, **view)

    def to_json(self, path: str | Path | None = None, *, style: str = "modelprof",
                **view: Any) -> str | Path:
        """The table, totals and environment as JSON, read back by ``modelprof.render.read_json``."""
        from .render.jsonio import to_json
        df, _ = self._table(style)
        env = {**self.env, "latency": self.latency.to_dict(samples=True)
               if self.latency is not None else None,
               "instrumentation_overhead": self.instrumentation_overhead,
               "coverage": self.coverage, "unsupported": self.unsupported,
               "timing_notes": self.timing_notes,
               "training_step": self.training_step.to_dict()
               if self.training_step is not None else None}
        return to_json(df, self.totals, env, path=path, **view)

    def to_text(self, *, style: str = "modelprof", max_rows: int | None = None,
                **view: Any) -> str:
        """A plain-text table for terminals."""
        from .render.text import to_text
        from .render.views import compact_columns
        df, totals = self._table(style)
        if style == "modelprof":
            view.setdefault("columns", compact_columns(df))
        return str(to_text(df, totals, title=self._title(), max_rows=max_rows, **view))

    # -- plots ----------------------------------------------------------------------------------
    def plot_latency(self, top_k: int = 20, **kw: Any):
        """Bar chart of the slowest leaf calls (needs ``timing=True``)."""
        from .plots import plot_latency
        if not self.timed:
            raise ModelProfError("plot_latency needs a timed report: profile(..., timing=True)")
        return plot_latency(self.to_dataframe(), top_k, **kw)

    def plot_flops(self, top_k: int = 20, **kw: Any):
        """Bar chart of the leaf calls with the most FLOPs."""
        from .plots import plot_flops
        return plot_flops(self.to_dataframe(), top_k, **kw)

    def plot_roofline(self, peaks: Any = None, **kw: Any):
        """Each leaf call as a point under the device's roofline (measured peaks by default)."""
        from .plots import plot_roofline
        peaks = peaks or self.peaks
        if peaks is None:
            from .roofline import probe_peaks
            peaks = probe_peaks(self.device if self.device != "meta" else "cpu", self.dtype)
        return plot_roofline(self.to_dataframe(), peaks, **kw)

    # -- display --------------------------------------------------------------------------------
    def _title(self) -> str:
        return (f"{self.model_name}, input {self.input_shape}, {self.dtype} on "
                f"{self.env.get('device_name', self.device)}")

    def summary(self) -> str:
        t = self.totals
        lines = [f"{self.model_name} on input {self.input_shape} ({self.dtype}, {self.device}, "
                 f"batch {self.batch_size})",
                 f"params {t['params']:,}  MACs {t['macs']:,}  FLOPs {t['flops']:,}  "
                 f"read {t['read_bytes']:,} B  write {t['write_bytes']:,} B"]
        if self.model_params != t["params"]:
            lines.append(f"({self.model_params - t['params']:,} of the model's "
                         f"{self.model_params:,} parameters were not used by this forward)")
        if self.latency is not None:
            lines.append(f"latency median {self.latency.median_ms:.3f} ms "
                         f"(p90 {self.latency.p90_ms:.3f}, n={self.latency.n}), "
                         f"{self.latency.fps:.1f} samples/s; per-layer instrumentation "
                         f"overhead x{self.instrumentation_overhead:.3f}, leaf coverage "
                         f"{100 * self.coverage:.1f}%")
            lines.extend(f"note: {n}" for n in self.timing_notes)
        if self.training_step is not None:
            lines.append(self.training_step.summary())
        if self.unsupported:
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.unsupported.items()))
            lines.append(f"ops with no formula (counted as 0 FLOPs): {ops}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary() + "\n" + self.to_text(max_rows=60)

    def _repr_html_(self) -> str:
        from .render.views import compact_columns
        df, totals = self._table("modelprof")
        from .render.html import to_html
        summary = "<br>".join(html.escape(line) for line in self.summary().splitlines())
        return f"<div><p>{summary}</p>" + str(to_html(df, totals, columns=compact_columns(df),
                                                     caption=self._title())) + "</div>"


def _check_style(style: str) -> str:
    if style not in _STYLES:
        raise ModelProfError(f"style={style!r} is not one of {_STYLES}")
    return style

