"""A DDP model's training steps run on the model itself (it cannot be copied): the step timer
keeps its parameters' values and puts them back, which moves their version counters. The
state guard of profile() took that for in-place writes it had no copy of and warned on every
rank ("the model changed module.0.weight, ... in place during the timed training steps"),
though nothing had changed. One process: a gloo group of one rank (DDP as under torchrun)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from helpers import WritesLate
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from modelprof import profile
from modelprof.errors import ModelProfWarning

QUICK = dict(repeat=3, warmup=1, roofline=False)


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def state_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ModelProfWarning)]


def test_ddp_steps_with_an_optimizer_give_the_model_back_without_a_warning(group, recwarn):
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile(model, inputs=torch.randn(4, 8), backward=True, optimizer="adamw", **QUICK)
    # AdamW moved every parameter in the timed steps, and the step timer put each back
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert not [m for m in state_warnings(recwarn) if "in place" in m]


def test_a_write_before_the_steps_is_still_named_and_only_it(group, recwarn):
    model = DistributedDataParallel(WritesLate(shift=1.0))
    profile(model, inputs=torch.randn(2, 4), backward=True, optimizer="sgd", **QUICK)
    # the weight, written first by the timed forward passes, cannot be put back; the bias,
    # which only the optimizer steps wrote (and the step timer put back), is not named
    messages = [m for m in state_warnings(recwarn) if "in place" in m]
    assert len(messages) == 1, messages
    assert "changed module.l.weight in place during the timed forward passes," in messages[0]
