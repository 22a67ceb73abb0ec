"""modelprof: per-layer cost (params, MACs, FLOPs, memory traffic) and measured latency of
PyTorch models, in one table."""
from __future__ import annotations

from .compare import Comparison, compare
from .errors import ModelProfError
from .formulas import Cost, register_formula
from .models import load_model
from .profile import ModelProfWarning, profile
from .report import Report
from .timing import (LatencyComparison, Measurement, Throughput, TimingOptions, measure_latencies,
                     measure_latency, measure_throughput)

__version__ = "0.1.0"

__all__ = ["Comparison", "Cost", "LatencyComparison", "Measurement", "ModelProfError",
           "ModelProfWarning", "Report", "Throughput", "TimingOptions", "__version__", "compare",
           "load_model", "measure_latencies", "measure_latency", "measure_throughput", "profile",
           "register_formula"]
