"""Warm-up per shape (issue 37, point 4): each batch size warms up before its first timed
sample, each phase of a generation (prefill, a decode step) and each layer of it before its
per-layer passes, so the first point of a sweep is not special, and no point stands on fewer
runs than the sample floor. (The issue's TTFT of 558.8 ms at batch 1 against 25.7 ms at batch 4
stood on n = 1: the sample floor's failure, fixed with the floor; these tests pin the warm-up,
and fail with ``warmup=0``.)

No real time: a FAKE clock (``fake_clock``) that only the model's virtual spins advance. The
model costs ``COLD_MS`` the first time it sees a batch size (a first call's allocations and
kernel selection, made exact) and ``WARM_MS`` a sample after that, so a cold call inside the
timed samples shows as a sample above ``WARM_MS * batch``, exactly."""

from __future__ import annotations

import pytest
import torch
from fake_clock import install
from torch import nn

import modelprof

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")

COLD_MS = 500.0
WARM_MS = 1.0


class ColdPerShape(nn.Module):
    def __init__(self, clock) -> None:
        super().__init__()
        self.clock = clock
        self.seen: set[tuple[int, ...]] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = tuple(x.shape)
        self.clock.advance(WARM_MS * shape[0] if shape in self.seen else COLD_MS)
        self.seen.add(shape)
        return x


def test_each_batch_size_of_a_throughput_sweep_warms_up_before_its_samples(monkeypatch):
    clock = install(monkeypatch)
    model = ColdPerShape(clock)
    curve = modelprof.measure_throughput(
        model, (4,), max_batch=4, gain=0.0, repeat=12, warmup=None, budget_s=60.0
    )
    assert [p.batch_size for p in curve.points] == [1, 2, 4]
    for p in curve.points:
        samples = p.measurement.samples_ms
        # every timed sample is a warm one: exactly WARM_MS per sample of the batch
        assert samples.max() == pytest.approx(WARM_MS * p.batch_size), p.batch_size
        assert p.measurement.n >= 12  # the floor holds at every point, the first included


def test_measure_latency_at_a_new_batch_size_warms_that_shape(monkeypatch):
    clock = install(monkeypatch)
    model = ColdPerShape(clock)
    for batch in (1, 4, 1, 8):  # a shape seen before, and a new one after it
        m = modelprof.measure_latency(model, inputs=torch.zeros(batch, 4), repeat=12, warmup=None)
        assert m.samples_ms.max() == pytest.approx(WARM_MS * batch), batch
        assert m.n >= 12


def test_each_batch_size_of_a_generation_warms_up_before_its_samples(monkeypatch):
    # a step cold for its first 3 calls at each (batch, length) shape (a JIT's first calls):
    # the counted phases take one of them; the warm-up at each batch size must take the rest
    # before the first timed generation, at batch 1 (the first point) as at batch 4
    clock = install(monkeypatch)
    import modelprof.generation.timing as generation_timing

    monkeypatch.setattr(generation_timing, "time", clock.module())
    calls: dict[tuple[int, ...], int] = {}
    logits = torch.zeros(4, 8, 8)

    def step(tokens, cache):
        shape = tuple(tokens.shape)
        calls[shape] = calls.get(shape, 0) + 1
        clock.advance(COLD_MS if calls[shape] <= 3 else WARM_MS * shape[0])
        cached = 0 if cache is None else cache
        return logits[: shape[0], : shape[1]], cached + shape[1]

    report = modelprof.profile_generation(
        nn.Identity(),
        step=step,
        prompt_len=4,
        new_tokens=4,
        batch_size=[1, 4],
        repeat=12,
        warmup=None,
        layer_timing=False,
    )
    for b in (1, 4):
        t = report.timings[b]
        # every timed prefill and decode step is a warm one: WARM_MS per sequence of the batch
        assert t.ttft.samples_ms.max() == pytest.approx(WARM_MS * b), b
        assert t.tpot.samples_ms.max() == pytest.approx(WARM_MS * b), b
        assert t.ttft.n >= 12


class ColdFirstCalls(nn.Module):
    """Cold (``COLD_MS``) for its first 3 calls, ``WARM_MS`` after."""

    def __init__(self, clock) -> None:
        super().__init__()
        self.clock, self.calls = clock, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.clock.advance(COLD_MS if self.calls <= 3 else WARM_MS)
        return x


def test_identical_layers_read_the_same_in_the_per_layer_passes(monkeypatch):
    # the prefill plot gave layers.0 41 % and the identical layers.1 0.5 %: a cold
    # first layer charged to the per-layer rows. Both layers here are cold for their first 3
    # calls; after the warm-up both rows read WARM_MS, exactly
    clock = install(monkeypatch)
    model = nn.Sequential(ColdFirstCalls(clock), ColdFirstCalls(clock))
    report = modelprof.profile(model, (4,), repeat=12, warmup=None, roofline=False)
    df = report.to_dataframe().set_index("module")
    assert df.loc["0", "latency_ms"] == pytest.approx(WARM_MS)
    assert df.loc["1", "latency_ms"] == pytest.approx(WARM_MS)
    assert report.latency.samples_ms.max() == pytest.approx(2 * WARM_MS)


def test_identical_layers_read_the_same_in_each_generation_phase(monkeypatch):
    clock = install(monkeypatch)
    import modelprof.generation.timing as generation_timing

    monkeypatch.setattr(generation_timing, "time", clock.module())
    body = nn.Sequential(ColdFirstCalls(clock), ColdFirstCalls(clock))
    logits = torch.zeros(2, 8, 8)

    def step(tokens, cache):
        body(tokens)
        cached = 0 if cache is None else cache
        return logits[: tokens.shape[0], : tokens.shape[1]], cached + tokens.shape[1]

    report = modelprof.profile_generation(
        body, step=step, prompt_len=4, new_tokens=4, repeat=12, warmup=None
    )
    for phase in report.phases():
        name = f"{phase.name} at {phase.context}"
        df = phase.report.to_dataframe().set_index("module")
        # each layer of each phase (the prefill, a decode step at each context) reads WARM_MS
        assert df.loc["model.0", "latency_ms"] == pytest.approx(WARM_MS), name
        assert df.loc["model.1", "latency_ms"] == pytest.approx(WARM_MS), name
        # the leaf rows (2 x 1 ms) over the phase's plain passes (2 ms): coverage 1, a share
        # as profile() states it (it was the leaf sum in ms, 2.0)
        assert phase.report.coverage == pytest.approx(1.0), name
