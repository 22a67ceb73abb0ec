"""modelprof: per-layer cost (params, MACs, FLOPs, memory traffic) and measured latency of
PyTorch models, in one table."""
from __future__ import annotations

from modelprof.compare import Comparison, compare
from modelprof.errors import ModelProfError
from modelprof.counting.formulas import Cost, register_formula
from modelprof.models import load_model
from modelprof.errors import ModelProfWarning
from modelprof.profile import profile
from modelprof.report.report import Report
from modelprof.timing import (LatencyComparison, Measurement, Throughput, TimingOptions, measure_latencies, measure_latency, measure_throughput)

__version__ = "0.1.0"

__all__ = ["Comparison", "Cost", "LatencyComparison", "Measurement", "ModelProfError",
           "ModelProfWarning", "Report", "Throughput", "TimingOptions", "__version__", "compare",
           "load_model", "measure_latencies", "measure_latency", "measure_throughput", "profile",
           "register_formula"]
