"""A forward's collectives end inside the call that started them: a tensor-parallel layer's
all-reduce (a functional collective) returns an ``AsyncCollectiveTensor`` before its data has
moved, so a pass that drops the output would stop its clock before the collective is done and
leave it unwaited (torch names each at exit: under torchrun a timed profile of a 2-rank TP MLP
left 187 per rank, the counting pass 1). One process: a fake process group of 2, whose works
torch still registers until they are waited for."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
from torch import nn

from modelprof import profile
from modelprof.runtime.compat import fake_store
from modelprof.runtime.inputs import make_inputs
from modelprof.step.spec import StepSpec
from modelprof.step.timing import StepTimer

QUICK = dict(repeat=3, warmup=1, roofline=False)


@pytest.fixture
def tp_mlp():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    dist.init_process_group("fake", store=fake_store(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        # fc2 row-wise: its partial sums all-reduced, the output an AsyncCollectiveTensor
        yield parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    finally:
        dist.destroy_process_group()


def unwaited() -> int:
    """The collectives started and not yet waited for (what torch counts at exit)."""
    gc.collect()
    return torch._C._distributed_c10d._get_work_registry_size()


@pytest.mark.parametrize("timing", [False, True])
def test_profile_leaves_no_collective_unwaited(tp_mlp, timing):
    # each forward of the MLP starts one all-reduce (fc2's); every one profile() starts, in the
    # counting pass and in each timed call, is waited for inside that call: 0 more left (before
    # the fix: 1, the counting pass's; timed, 10 with the clean and per-layer passes')
    before = unwaited()
    profile(tp_mlp, (16,), batch_size=4, **(QUICK if timing else dict(timing=False)))
    assert unwaited() == before


def test_the_training_steps_forward_phase_ends_with_its_all_reduce(tp_mlp):
    # the forward phase's output is complete when the phase ends (before, the loss's first
    # use waited for it, and the forward phase's time left the all-reduce to the loss's)
    inputs = make_inputs(tp_mlp, (16,), batch_size=4)
    with StepTimer(tp_mlp, inputs, StepSpec()) as timer:
        timer.step.forward()
        out = timer.step.out
        assert type(out).__name__ == "AsyncCollectiveTensor" and out.completed
        timer.step.out = None
