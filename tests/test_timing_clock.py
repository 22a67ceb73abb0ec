"""Clocks: shapes of what they return, readings never shorter than the work, and (with fake CUDA
events and streams on CPU) that the event clock and the per-layer event stamps record on the
measured device's stream and synchronise after every sample (latency) or once per block (pipelined), and once per forward pass."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from modelprof.runtime.inputs import make_inputs
from modelprof.timing import runner as runner_mod
from modelprof.timing import time_layers
from modelprof.timing.calibration import spin, spin_model
from modelprof.timing.clock import CpuClock, CudaEventClock, HostSyncClock, clock_for

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


class FakeStream:
    def __init__(self, device: torch.device) -> None:
        self.device = device


class FakeEvent:
    """Stands in for torch.cuda.Event on CPU: record() reads the host clock and keeps the
    stream it was recorded on."""

    created = 0
    streams: list[FakeStream | None] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        FakeEvent.created += 1
        self.t: int | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        FakeEvent.streams.append(stream)
        self.t = time.perf_counter_ns()

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.t is not None and other.t is not None, "read before record"
        return (other.t - self.t) / 1e6


@pytest.fixture
def fake_cuda(monkeypatch):
    """Fake events, streams and synchronize; cuda:0 is the *current* device throughout, so a
    stream of any other device can only come from asking for the measured one."""
    syncs: list = []

    def current_stream(device=None):
        dev = torch.device("cuda", 0) if device is None else torch.device(device)
        return FakeStream(dev if dev.index is not None else torch.device("cuda", 0))

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    FakeEvent.created = 0
    FakeEvent.streams = []
    return syncs


def test_clock_for_picks_the_device_clock():
    assert isinstance(clock_for(torch.device("cpu")), CpuClock)
    assert isinstance(clock_for(torch.device("cuda")), CudaEventClock)
    assert isinstance(clock_for(torch.device("cuda"), "host"), HostSyncClock)
    assert isinstance(clock_for(torch.device("mps")), HostSyncClock)


@pytest.mark.parametrize(
    "clock", [CpuClock(torch.device("cpu")), HostSyncClock(torch.device("cpu"))]
)
def test_host_clocks_time_each_phase(clock):
    between = []
    # 100 samples: with both cores busy most samples are lengthened a little; the fastest of
    # many is the un-preempted one (20 samples once all read >= 3 % long under load)
    got = clock.time([lambda: spin(0.5), lambda: spin(1.0)], 100, between=lambda: between.append(1))
    assert got.shape == (100, 2)
    assert len(between) == 100  # once before every sample
    # a phase's clock reads bracket its whole spin, which ends only once the spin's own
    # deadline has passed: no reading is ever short (another job can only lengthen one)
    assert (got >= np.array([0.5, 1.0]) - 1e-6).all()
    # and an un-preempted sample reads the spin to within a few microseconds: the fastest
    # of 100 is within 3 % of it
    assert got.min(axis=0) == pytest.approx([0.5, 1.0], rel=0.03)


def test_between_runs_outside_the_timed_span():
    # a 2 ms "cache flush" between samples of a 0.5 ms spin: if it were timed, every reading
    # would be >= 2.5 ms. No reading is short of the spin, and the fastest is far from 2.5 ms
    # (the midpoint, 1.5 ms, leaves room for a loaded machine: preemption can lengthen even
    # the fastest of 20, so a tight bound on it would test the load, not the clock)
    got = CpuClock(torch.device("cpu")).time([lambda: spin(0.5)], 20, between=lambda: spin(2.0))
    assert (got >= 0.5 - 1e-6).all()
    assert got.min() < 1.5


def test_event_clock_latency_mode_syncs_after_every_sample(fake_cuda):
    # the latency mode (the default): each sample starts on an idle GPU, as the seed's loop
    # and MLPerf SingleStream do; one synchronize after each of the 7 samples
    clock = CudaEventClock(torch.device("cuda", 0))
    flushes = []
    got = clock.time([lambda: spin(0.5), lambda: spin(0.2)], 7, between=lambda: flushes.append(1))
    assert got.shape == (7, 2)
    assert fake_cuda == [torch.device("cuda", 0)] * 7
    assert FakeEvent.created == 7 * 3  # pre-allocated: (phases + 1) x n
    assert len(flushes) == 7
    assert (got[:, 0] >= 0.5 - 1e-6).all() and (got[:, 1] >= 0.2 - 1e-6).all()


def test_event_clock_pipelined_mode_syncs_once_per_block_and_divides_by_the_group(fake_cuda):
    clock = CudaEventClock(torch.device("cuda", 0))
    clock.group = 4  # four calls back to back per sample
    calls = []
    got = clock.time([lambda: (calls.append(1), spin(0.5))], 5)
    assert len(calls) == 5 * 4
    assert fake_cuda == [torch.device("cuda", 0)]  # one synchronize for the block
    assert FakeEvent.created == 5 * 2  # one event pair per sample
    # each sample is the span of 4 spins of 0.5 ms over 4: never below 0.5 ms
    assert (got >= 0.5 - 1e-6).all()


def test_event_clock_records_on_the_measured_devices_stream(fake_cuda):
    # cuda:0 is current, the clock measures cuda:1: every event goes on cuda:1's stream, and
    # each sample's synchronize waits for cuda:1
    dev = torch.device("cuda", 1)
    CudaEventClock(dev).time([lambda: None], 4)
    assert len(FakeEvent.streams) == 4 * 2
    assert {s.device for s in FakeEvent.streams} == {dev}
    assert fake_cuda == [dev] * 4
    FakeEvent.streams.clear()
    stamps = CudaEventClock(dev).stamps(4)  # the per-layer hooks' stamps
    for i in range(4):
        stamps.record(i)
    stamps.sync()
    assert [s.device for s in FakeEvent.streams] == [dev] * 4
    assert fake_cuda[-1] == dev


def test_layer_events_sync_once_per_forward_pass(fake_cuda, monkeypatch):
    monkeypatch.setattr(
        runner_mod, "clock_for", lambda device, mode="auto": CudaEventClock(torch.device("cuda", 0))
    )
    model = spin_model((0.5, 1.0))
    lt = time_layers(model, make_inputs(model, (4,)), warmup=0, repeat=6, memory_stats=False)
    # one synchronize per instrumented pass (6), none per layer; after each, its plain pass is
    # timed by the clock as a chunk of one: + 1 each (6) — both kinds synchronise once per pass
    assert lt.blocks[0] != lt.blocks[1]  # a first pass of unknown duration alone
    assert len(fake_cuda) == 6 + 6
    # stamps allocated once after discovery: 2 per call (3 calls) + 2 around the pass; each
    # plain chunk of one: 1 phase + 1 = 2 events, x 6 passes
    assert FakeEvent.created == (2 * 3 + 2) + 2 * 6
    raw = lt.raw_samples
    assert (raw[("0", 1)] >= 0.5 - 1e-6).all() and (raw[("1", 1)] >= 1.0 - 1e-6).all()
    assert (raw[("", 1)] >= raw[("0", 1)] + raw[("1", 1)]).all()  # the parent spans both
    # the empty-module chain is a host-side calibration, not run on CUDA: even 6 passes (below
    # the 10 that make the CPU fall back to it) measure the hooks' cost on the model
    assert lt.hook_cost.applied and lt.hook_cost.source == "model"
