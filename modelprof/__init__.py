"""modelprof: per-layer cost (params, MACs, FLOPs, memory traffic) and measured latency of
PyTorch models, in one table. The names a user needs; the rest is in the subpackages.
"""

from __future__ import annotations

from modelprof.compare import compare
from modelprof.counting.formulas import Cost, register_formula
from modelprof.distributed.gather import gather_reports
from modelprof.errors import (
    DriftWarning,
    FewSamplesWarning,
    GpuClockWarning,
    LoadedMachineWarning,
    ModelProfError,
    ModelProfWarning,
    NoisyMeasurementWarning,
    SamplingPastBudgetWarning,
    TimingDisagreementWarning,
)
from modelprof.fit import fit
from modelprof.generation import GenerationReport, compare_generation, profile_generation
from modelprof.profile import profile
from modelprof.profile_sharded import profile_sharded
from modelprof.render.options import ViewOptions
from modelprof.report.comparison import Comparison
from modelprof.report.report import Report
from modelprof.runtime.inputs import token_inputs
from modelprof.sweep import sweep
from modelprof.timing import (
    Measurement,
    TimingOptions,
    measure_latencies,
    measure_latency,
    measure_throughput,
)
from modelprof.timing.peaks import Peaks, lookup_peaks, probe_peaks

__version__ = "0.1.0"

__all__ = [
    "Comparison",
    "Cost",
    "DriftWarning",
    "FewSamplesWarning",
    "GpuClockWarning",
    "GenerationReport",
    "Measurement",
    "ModelProfError",
    "ModelProfWarning",
    "LoadedMachineWarning",
    "NoisyMeasurementWarning",
    "SamplingPastBudgetWarning",
    "Peaks",
    "Report",
    "TimingDisagreementWarning",
    "TimingOptions",
    "ViewOptions",
    "__version__",
    "compare",
    "compare_generation",
    "fit",
    "gather_reports",
    "lookup_peaks",
    "measure_latencies",
    "measure_latency",
    "measure_throughput",
    "probe_peaks",
    "profile",
    "profile_generation",
    "profile_sharded",
    "register_formula",
    "sweep",
    "token_inputs",
]
