"""``Report``: the result of ``profile`` — per-call rows, totals, timing and environment, with
views (DataFrames in two styles, per-operator counts) and exporters."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
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
                 coverage: float | None = None, options: dict[str, Any] | None = None) -> None:
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
        self.totals = totals_of(self.rows)

    @property
    def timed(self) -> bool:
        return self.latency is not None

    # -- views ----------------------------------------------------------------------------------
    def to_dataframe(self, style: str = "modelprof") -> pd.DataFrame:
        """One row per module call (``modelprof``) or torchstat's leaf table (``torchstat``)."""
        style = _check_style(style)
        if style == "torchstat":
            return torchstat_frame(self.rows, self.timed)
        return modelprof_frame(self.rows, self.timed)

    def by_operator(self) -> pd.DataFrame:
        """Per aten op: calls, macs, flops, madd, and whether a formula counted it."""
        names = sorted(self._by_op, key=lambda k: (-self._by_op[k].flops, k))
        return pd.DataFrame({
            "op": [f"aten.{n}" for n in names],
            "calls": [self._by_op[n].calls for n in names],
            "macs": [self._by_op[n].macs for n in names],
            "flops": [self._by_op[n].flops for n in names],
            "madd": [self._by_op[n].madd for n in names],
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
    def to_csv(self, path: str | Path | None = None, *, style: str = "modelprof") -> str | Path:
        """CSV of the table with raw numbers (no units); returns the text or writes ``path``."""
        text = self.to_dataframe(style).to_csv(index=False)
        return _write(text, path)

    def to_markdown(self, path: str | Path | None = None, *, style: str = "modelprof") -> str | Path:
        """GitHub Markdown table with human units (``1.82 G``, ``3.06 MiB``) and a totals line."""
        from .render.markdown import to_markdown
        style = _check_style(style)
        return to_markdown(self.to_dataframe(style),
                           self.totals if style == "modelprof" else None, path=path)

    def _display_frame(self, style: str) -> pd.DataFrame:
        return self.to_dataframe(style)

    # -- display --------------------------------------------------------------------------------
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
            lines.append(f"latency median {self.latency.median_ms:.3f} ms, "
                         f"{self.latency.fps:.1f} samples/s")
        if self.unsupported:
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.unsupported.items()))
            lines.append(f"ops with no formula (counted as 0 FLOPs): {ops}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<modelprof.Report {self.summary()}>"


def _check_style(style: str) -> str:
    if style not in _STYLES:
        raise ModelProfError(f"style={style!r} is not one of {_STYLES}")
    return style


def _write(text: str, path: str | Path | None) -> str | Path:
    if path is None:
        return text
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def _nan_to_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else x
