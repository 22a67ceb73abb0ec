"""Clocks: shapes of what they return, and (with a fake CUDA event on CPU) that the event clock
and the per-layer event stamps synchronise once per chunk / once per forward pass."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from modelprof.inputs import make_inputs
from modelprof.timing import layers as layers_mod
from modelprof.timing import time_layers
from modelprof.timing.calibration import spin, spin_model
from modelprof.timing.clock import CpuClock, CudaEventClock, HostSyncClock, clock_for

ATTEMPTS = 3  # other jobs on a shared 2-core machine only ever lengthen a spin: retry afresh


class FakeEvent:
    """Stands in for torch.cuda.Event on CPU: record() reads the host clock."""

    created = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        FakeEvent.created += 1
        self.t: int | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter_ns()

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.t is not None and other.t is not None, "read before record"
        return (other.t - self.t) / 1e6


@pytest.fixture
def fake_cuda(monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    FakeEvent.created = 0
    return syncs


def test_clock_for_picks_the_device_clock():
    assert isinstance(clock_for(torch.device("cpu")), CpuClock)
    assert isinstance(clock_for(torch.device("cuda")), CudaEventClock)
    assert isinstance(clock_for(torch.device("cuda"), "host"), HostSyncClock)
    assert isinstance(clock_for(torch.device("mps")), HostSyncClock)


@pytest.mark.parametrize("clock", [CpuClock(torch.device("cpu")),
                                   HostSyncClock(torch.device("cpu"))])
def test_host_clocks_time_each_phase(clock):
    between = []
    for _ in range(ATTEMPTS):
        got = clock.time([lambda: spin(1.0), lambda: spin(2.0)], 5,
                         between=lambda: between.append(1))
        if np.allclose(np.median(got, axis=0), [1.0, 2.0], rtol=0.03):
            break
    assert got.shape == (5, 2)
    np.testing.assert_allclose(np.median(got, axis=0), [1.0, 2.0], rtol=0.03)
    assert len(between) % 5 == 0 and between                  # once before every sample


def test_event_clock_syncs_once_per_chunk(fake_cuda):
    clock = CudaEventClock(torch.device("cuda"))
    flushes = []
    got = clock.time([lambda: spin(1.0), lambda: spin(0.5)], 7, between=lambda: flushes.append(1))
    assert got.shape == (7, 2)
    assert len(fake_cuda) == 1                                # one synchronize for 7 samples
    assert FakeEvent.created == 7 * 3                         # pre-allocated: (phases + 1) x n
    assert len(flushes) == 7
    assert (got[:, 0] >= 1.0).all() and (got[:, 1] >= 0.5).all()


def test_layer_events_sync_once_per_forward_pass(fake_cuda, monkeypatch):
    monkeypatch.setattr(layers_mod, "clock_for",
                        lambda device, mode="auto": CudaEventClock(torch.device("cuda")))
    model = spin_model((1.0, 2.0))
    lt = time_layers(model, make_inputs(model, (4,)), warmup=0, repeat=6, memory_stats=False)
    assert len(fake_cuda) == 6                                # one per timed pass, none per layer
    # events allocated once after discovery: 2 per call (3 calls) + 2 around the pass
    assert FakeEvent.created == 2 * 3 + 2
    med = lt.median_ms()
    assert med[("0", 1)] >= 1.0 and med[("1", 1)] >= 2.0
    assert med[("", 1)] >= 3.0
