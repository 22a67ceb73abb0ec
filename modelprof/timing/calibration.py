"""Workloads of known duration, to check the timer against: a CPU busy-spin and, on CUDA,
``torch.cuda._sleep`` with its cycles-per-millisecond calibrated first. Used by the tests and by
``benchmarks/validate_timer.py``."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from modelprof.runtime import compat

__all__ = ["CudaSleep", "Spin", "calibrate_cuda_sleep", "spin", "spin_model", "sleep_model"]


def spin(ms: float) -> None:
    """Busy-wait ``ms`` milliseconds on the host (a sleep would hand the core away)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


class Spin(nn.Module):
    """Spins ``ms`` milliseconds on the CPU and returns its input."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spin(self.ms)
        return x

    def extra_repr(self) -> str:
        return f"ms={self.ms}"


def spin_model(ms: Sequence[float] = (2.0, 5.0, 10.0)) -> nn.Sequential:
    """``Sequential`` of ``Spin`` layers: end to end = sum(ms)."""
    return nn.Sequential(*(Spin(m) for m in ms))


def calibrate_cuda_sleep(
    device: torch.device | str = "cuda", cycles: int = 10_000_000, repeat: int = 5
) -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep``, timed with CUDA events
    (median of ``repeat`` runs of ``cycles`` cycles, after one warm-up)."""
    dev = torch.device(device)
    with torch.cuda.device(dev):
        compat.cuda_sleep(cycles)
        torch.cuda.synchronize()
        rates = []
        for _ in range(repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            compat.cuda_sleep(cycles)
            b.record()
            torch.cuda.synchronize()
            rates.append(cycles / a.elapsed_time(b))
    return sorted(rates)[len(rates) // 2]


class CudaSleep(nn.Module):
    """Keeps the GPU busy ``ms`` milliseconds (``torch.cuda._sleep`` of calibrated cycles)."""

    def __init__(self, ms: float, cycles_per_ms: float) -> None:
        super().__init__()
        self.ms = ms
        self.cycles = int(round(ms * cycles_per_ms))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compat.cuda_sleep(self.cycles)
        return x

    def extra_repr(self) -> str:
        return f"ms={self.ms}, cycles={self.cycles}"


def sleep_model(ms: Sequence[float], cycles_per_ms: float) -> nn.Sequential:
    """``Sequential`` of ``CudaSleep`` layers: end to end = sum(ms) of GPU time."""
    return nn.Sequential(*(CudaSleep(m, cycles_per_ms) for m in ms))
