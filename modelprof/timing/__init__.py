"""The dynamic half of modelprof: end-to-end and per-layer latency, and throughput.

The recipe (warm-up, adaptive stop) lives in ``sampler``, the clocks in ``clock``, the modes
(AMP, channels_last, compile, CUDA graphs, cold cache) in ``modes``.
"""
from __future__ import annotations

from .latency import measure_latency
from .layers import LayerTiming, MemoryStats, time_layers
from .measurement import Measurement, NoisyMeasurementWarning
from .throughput import Throughput, ThroughputPoint, measure_throughput

__all__ = [
    "LayerTiming",
    "Measurement",
    "MemoryStats",
    "NoisyMeasurementWarning",
    "Throughput",
    "ThroughputPoint",
    "measure_latency",
    "measure_throughput",
    "time_layers",
]
