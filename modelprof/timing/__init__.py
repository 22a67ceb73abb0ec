"""The dynamic half of modelprof: end-to-end and per-layer latency, and throughput.

The options are parsed once (``options``); the recipe (warm-up, blocks, adaptive stop) lives in
``sampler``, its statistics in ``stats``, the clocks in ``clock``, the modes (compile, CUDA graphs,
cold cache) in ``modes``, interleaved comparisons in ``interleave``.
"""

from __future__ import annotations

from modelprof.errors import DriftWarning, FewSamplesWarning, NoisyMeasurementWarning
from modelprof.timing.interleave import LatencyComparison, measure_latencies
from modelprof.timing.latency import measure_latency
from modelprof.timing.layers import HookCost, LayerTiming, MemoryStats, time_layers
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import TimingOptions
from modelprof.timing.throughput import Throughput, ThroughputPoint, measure_throughput

__all__ = [
    "DriftWarning",
    "FewSamplesWarning",
    "HookCost",
    "LatencyComparison",
    "LayerTiming",
    "Measurement",
    "MemoryStats",
    "NoisyMeasurementWarning",
    "Throughput",
    "ThroughputPoint",
    "TimingOptions",
    "measure_latencies",
    "measure_latency",
    "measure_throughput",
    "time_layers",
]
