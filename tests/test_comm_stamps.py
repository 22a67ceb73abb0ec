"""Issue 18: collectives' own time lands in (communication) rows, forward and backward, on any
device (modelprof.timing.comm). One process: a fake process group of 2 (its collectives move
nothing, so their spans are ~0 here; the torchrun tests time real gloo collectives), and a clock
whose every stamp is one tick later than the last, so a collective's span is exactly 1 ms."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import dist_models as dm
from modelprof import profile
from modelprof.timing.clock import StampBuffer
from modelprof.timing.comm import CommStamps, wait_for


class TickStamps(StampBuffer):
    def __init__(self, size: int, ticks: list[int]) -> None:
        self.ns, self.ticks = [0] * size, ticks

    def record(self, i: int) -> None:
        self.ticks[0] += 1
        self.ns[i] = self.ticks[0] * 1_000_000

    def elapsed_ms(self, starts, ends) -> np.ndarray:
        return np.array([(self.ns[e] - self.ns[s]) / 1e6 for s, e in zip(starts, ends)])


class TickClock:
    """Every stamp, whichever buffer holds it, one tick (1 ms) after the previous one."""

    def __init__(self) -> None:
        self.ticks = [0]

    def stamps(self, size: int) -> StampBuffer:
        return TickStamps(size, self.ticks)


@pytest.fixture
def fake_group():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_each_collective_is_charged_to_its_column(fake_group):
    # 70 all-reduces (more than one 64-collective stamp buffer): collective j in column j % 3,
    # each span one tick = 1 ms -> column c holds the number of j < 70 with j % 3 == c:
    # 24, 23, 23 ms; the column 3 (outside every call) none
    column = [0]
    stamps = CommStamps(TickClock(), lambda: column[0])
    x = torch.ones(4)
    for _ in range(2):            # the second pass reuses the buffers the first one grew
        stamps.begin()
        with stamps:
            for j in range(70):
                column[0] = j % 3
                dist.all_reduce(x)
        np.testing.assert_array_equal(stamps.per_column_ms(4), [24.0, 23.0, 23.0, 0.0])
    assert len(stamps.buffers) == 2


def test_a_collective_is_waited_for_where_it_is_issued():
    class Work:
        waited = 0

        def wait(self):
            Work.waited += 1
            return True
    # a c10d op returns (tensors, work): the work is waited for
    wait_for(torch.ops.c10d.allreduce_.default, ([torch.ones(2)], Work()))
    assert Work.waited == 1
    # a functional collective returns tensors: wait_tensor on each (a done one passes through)
    t = torch.ones(3)
    wait_for(torch.ops._c10d_functional.all_reduce.default, t)
    assert torch.equal(t, torch.ones(3))


def test_backward_collectives_get_their_own_rows_out_of_the_layer(fake_group):
    # tensor parallel MLP on a fake group of 2: each fc1's backward all-reduce (the input's
    # gradient of a column-parallel linear) is stamped in fc1's column of the instrumented
    # backward; its (communication) row shows those stamps and fc1's leaf row the rest
    warnings.simplefilter("ignore")
    r = profile(dm.tensor_parallel(), (dm.SEQ, dm.D), batch_size=2, backward=True, repeat=3,
                warmup=1, layer_extend_s=0, progress=False)
    df = r.to_dataframe().set_index("module")
    t = r.training_step.timing
    assert t.comm_ms is not None and t.comm_ms.shape == t.calls_ms.shape
    records = {row.module: row.record for row in r.rows if row.kind == "module"}
    for layer in range(4):
        name = f"layers.{layer}.mlp.fc1"
        i = records[name]
        assert (t.comm_ms[:, i] > 0).all()        # an all-reduce in every instrumented pass
        comm_row = df.loc[f"{name}.(communication)"]
        assert comm_row.backward_latency_ms == pytest.approx(np.median(t.comm_ms[:, i]))
        assert df.loc[name].backward_latency_ms == pytest.approx(
            np.median(t.calls_ms[:, i] - t.comm_ms[:, i]))


class Sums(nn.Module):
    """A module whose forward all-reduces its input (gloo-style c10d op) — not a sharded model:
    modelprof has no reason to stamp it."""

    def forward(self, x):
        x = x * 2
        dist.all_reduce(x)
        return x


def test_a_model_that_does_not_communicate_is_not_stamped(fake_group):
    warnings.simplefilter("ignore")
    r = profile(nn.Sequential(nn.Linear(4, 4), Sums()), (4,), backward=True, repeat=3,
                warmup=1, layer_extend_s=0, progress=False)
    assert r.training_step.timing.comm_ms is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(),
                    reason="needs a CUDA device and NCCL")
def test_cuda_collectives_are_stamped_with_events(tmp_path):
    # one NCCL rank: the tensor-parallel MLP on cuda:0, timed with its backward; the stamps
    # are CUDA events on the current stream, read after each pass's one synchronize
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        torch.cuda.set_device(0)
        warnings.simplefilter("ignore")
        r = profile(dm.tensor_parallel(device="cuda"), (dm.SEQ, dm.D), batch_size=2,
                    device="cuda", backward=True, repeat=5, warmup=2, layer_extend_s=0,
                    progress=False)
        t = r.training_step.timing
        assert t.comm_ms is not None and t.comm_ms.shape == t.calls_ms.shape
        assert np.isfinite(t.comm_ms).all() and (t.comm_ms >= 0).all()
        assert (t.comm_ms <= t.calls_ms + 1e-9).all()   # a part of its call's stretch
    finally:
        dist.destroy_process_group()
