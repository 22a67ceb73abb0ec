"""Collectives' own time lands in (communication) rows, forward and backward, on any
device (modelprof.timing.comm). One process: a fake process group of 2 (its collectives move
nothing, so their spans are ~0 here; the torchrun tests time real gloo collectives), and a clock
whose every stamp is one tick later than the last, so a collective's span is exactly 1 ms."""

from __future__ import annotations

import warnings

import dist_models as dm
import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from modelprof import profile
from modelprof.step.timing import _Instrumented
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
    for _ in range(2):  # the second pass reuses the buffers the first one grew
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
    class Waits(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Waits.seen.append(func)
            return func(*args, **(kwargs or {}))

    t, u = torch.ones(3), torch.zeros(2)
    with Waits():
        wait_for(torch.ops._c10d_functional.all_reduce.default, [t, u])
    assert Waits.seen == [torch.ops._c10d_functional.wait_tensor.default] * 2
    assert torch.equal(t, torch.ones(3))


class StubComm:
    """per_column_ms of one pass, given."""

    def __init__(self, ms):
        self.ms = np.asarray(ms, dtype=np.float64)

    def per_column_ms(self, n_columns):
        assert n_columns == self.ms.size
        return self.ms.copy()


def _instrumented(n_calls: int, comm: list[float], ddp: bool) -> _Instrumented:
    inst = _Instrumented.__new__(_Instrumented)
    inst.n_calls, inst.comm, inst.ddp, inst.comm_rows = n_calls, StubComm(comm), ddp, []
    return inst


# one backward pass of 3 calls (columns 0..2), the loss (column 3) and the final callbacks
# (column 4): stretches in node order with their column and ms
TAGS = np.array([3, 2, 2, 1, 0, 4])
D = np.array([0.5, 1.0, 2.0, 4.0, 0.25, 3.0])
# per column: 0 -> 0.25, 1 -> 4.0, 2 -> 3.0, loss -> 0.5, final -> 3.0


def test_split_of_a_backward_pass_without_ddp():
    # collectives stamped: 1.5 ms in call 2, 1.0 ms in the final callbacks (FSDP2's last
    # reduce-scatter), which belong to the root with the rest of the final stretch
    inst = _instrumented(3, [0.0, 0.0, 1.5, 0.0, 1.0], ddp=False)
    row = inst._split(TAGS, D)
    np.testing.assert_allclose(row, [0.25 + 3.0, 4.0, 3.0, 0.5])  # the final stretch: root's
    np.testing.assert_allclose(inst.comm_rows[0], [1.0, 0.0, 1.5, 0.0])
    assert row.sum() == pytest.approx(D.sum())  # nothing lost or doubled


def test_split_of_a_ddp_backward_pass_moves_the_buckets_to_the_root():
    # DDP: the bucket all-reduce stamped in call 1 (whose gradient filled it, 2.5 ms) moves to
    # the root with the reducer's final wait (the whole final stretch, 3.0 ms): the root's
    # communication is 2.5 + 3.0 = 5.5 ms; call 1 keeps 4.0 - 2.5 = 1.5 ms of compute
    inst = _instrumented(3, [0.0, 2.5, 0.0, 0.0, 0.0], ddp=True)
    row = inst._split(TAGS, D)
    np.testing.assert_allclose(row, [0.25 + 3.0 + 2.5, 1.5, 3.0, 0.5])
    np.testing.assert_allclose(inst.comm_rows[0], [5.5, 0.0, 0.0, 0.0])
    assert row.sum() == pytest.approx(D.sum())
    # the root's own (self) time is its column less its communication: 0.25 ms
    assert row[0] - inst.comm_rows[0][0] == pytest.approx(0.25)


def test_backward_collectives_get_their_own_rows_out_of_the_layer(fake_group):
    # tensor parallel MLP on a fake group of 2: each fc1's backward all-reduce (the input's
    # gradient of a column-parallel linear) is stamped in fc1's column of the instrumented
    # backward; its (communication) row shows those stamps and fc1's leaf row the rest
    warnings.simplefilter("ignore")
    r = profile(
        dm.tensor_parallel(),
        (dm.SEQ, dm.D),
        batch_size=2,
        backward=True,
        repeat=3,
        warmup=1,
        layer_extend_s=0,
        progress=False,
    )
    df = r.to_dataframe().set_index("module")
    t = r.training_step.timing
    assert t.comm_ms is not None and t.comm_ms.shape == t.calls_ms.shape
    records = {row.module: row.record for row in r.rows if row.kind == "module"}
    for layer in range(4):
        name = f"layers.{layer}.mlp.fc1"
        i = records[name]
        assert (t.comm_ms[:, i] > 0).all()  # an all-reduce in every instrumented pass
        comm_row = df.loc[f"{name}.(communication)"]
        assert comm_row.backward_latency_ms == pytest.approx(np.median(t.comm_ms[:, i]))
        assert df.loc[name].backward_latency_ms == pytest.approx(
            np.median(t.calls_ms[:, i] - t.comm_ms[:, i])
        )


class Sums(nn.Module):
    """A module whose forward all-reduces its input (gloo-style c10d op) — not a sharded model:
    modelprof has no reason to stamp it."""

    def forward(self, x):
        x = x * 2
        dist.all_reduce(x)
        return x


def test_a_model_that_does_not_communicate_is_not_stamped(fake_group):
    warnings.simplefilter("ignore")
    r = profile(
        nn.Sequential(nn.Linear(4, 4), Sums()),
        (4,),
        backward=True,
        repeat=3,
        warmup=1,
        layer_extend_s=0,
        progress=False,
    )
    assert r.training_step.timing.comm_ms is None


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available() or not dist.is_nccl_available(),
    reason="needs a CUDA device and NCCL",
)
def test_cuda_collectives_are_stamped_with_events(tmp_path):
    # one NCCL rank: the tensor-parallel MLP on cuda:0, timed with its backward; the stamps
    # are CUDA events on the current stream, read after each pass's one synchronize
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        warnings.simplefilter("ignore")
        r = profile(
            dm.tensor_parallel(device="cuda"),
            (dm.SEQ, dm.D),
            batch_size=2,
            device="cuda",
            backward=True,
            repeat=5,
            warmup=2,
            layer_extend_s=0,
            progress=False,
        )
        t = r.training_step.timing
        assert t.comm_ms is not None and t.comm_ms.shape == t.calls_ms.shape
        assert np.isfinite(t.comm_ms).all() and (t.comm_ms >= 0).all()
        assert (t.comm_ms <= t.calls_ms + 1e-9).all()  # a part of its call's stretch
    finally:
        dist.destroy_process_group()
