"""Results: the rows joined once from each pass's columns, ``Report``, the roofline join, layer
types and plots. Rendering to text formats lives in ``modelprof.render``."""

from __future__ import annotations

from modelprof.report.report import Report

__all__ = ["Report"]
