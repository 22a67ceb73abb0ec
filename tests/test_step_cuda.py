"""The training step on CUDA: a backward that queues a known-length ``torch.cuda._sleep`` reads
it back in its layer (CUDA events in the node hooks, one synchronize per pass), and the step's
allocator peak. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.timing.calibration import calibrate_cuda_sleep

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning"),
]

SLEEP_MS = 4.0


class SleepBackward(torch.autograd.Function):
    cycles = 0

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        torch.cuda._sleep(SleepBackward.cycles)
        return grad


class SleepLayer(nn.Module):
    def forward(self, x):
        return SleepBackward.apply(x)


def test_sleeping_backward_reads_back_in_its_layer():
    SleepBackward.cycles = int(SLEEP_MS * calibrate_cuda_sleep("cuda"))
    model = nn.Sequential(nn.Linear(4, 4), SleepLayer(), nn.Linear(4, 4)).cuda()
    report = profile(
        model, (4,), backward=True, optimizer=torch.optim.SGD, warmup_s=0.1, roofline=False
    )
    df = report.to_dataframe().set_index(["module", "call"])
    # the GPU sleeps 4 ms in the layer's backward; the events around its node read it
    assert df.loc[("1", 1), "backward_latency_ms"] == pytest.approx(SLEEP_MS, rel=0.02)
    # the whole backward holds the sleep, and each step starts on an idle GPU (the latency
    # mode: a synchronize after every step), so it also holds the host's start of the backward
    # until the sleep is launched: the H200 read 4.478 ms (the engine's start and the last
    # Linear's backward launches, ~0.5 ms); one-stream pipelining had hidden it (4.0 +- 10 %)
    assert SLEEP_MS * 0.99 <= report.backward_latency.median_ms <= SLEEP_MS + 1.0
    timing = report.training_step.timing
    assert timing.peak_memory_bytes is not None and timing.peak_memory_bytes > 0
    assert timing.env["mode"]["clock"] == "cuda_event"
