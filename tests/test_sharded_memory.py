"""The memory of a sharded model, per rank and globally (docs/distributed.md): what
``memory_estimate()`` itemises and what each layer saves for the backward, from one process
with a fake process group.

FSDP2: the README's model, 8 x Linear(1024, 1024) each ``fully_shard``-ed, on 8 ranks, batch 16.
A layer has 1024*1024 + 1024 = 1,049,600 parameters, the model 8,396,800; a rank holds an eighth:
1,049,600 (fp32: 4,198,400 B). Tensor parallel: Linear(256, 1024), GELU, Linear(1024, 256),
``fc1`` column-wise and ``fc2`` row-wise, input 8 x 64 x 256.
"""

from __future__ import annotations

import pytest
from torch import nn

from modelprof import profile
from modelprof.profile_sharded import profile_sharded

RANK_PARAMS = 1_049_600  # 8,396,800 / 8 ranks
LAYER_INPUT = 16 * 1024 * 4  # 65,536 B: a layer's input, batch 16 x 1024 fp32


def _linears() -> nn.Module:
    return nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(8)))


def _fsdp() -> nn.Module:
    from modelprof.runtime.compat import fully_shard

    model = _linears()
    for layer in model:
        fully_shard(layer)
    return fully_shard(model)


def _fsdp_report(**kw):
    return profile_sharded(_fsdp, (1024,), batch_size=16, world_size=8, rank=0, **kw)


@pytest.fixture(scope="module")
def plain():
    return profile(_linears(), (1024,), batch_size=16, timing=False, backward=True)


def _step(estimate, component):
    return int(estimate.loc[component, "training_step"])


def test_fsdp2_memory_estimate_is_this_ranks_shard():
    r = _fsdp_report(backward=True)
    est = r.memory_estimate()
    assert r.totals["params"] == RANK_PARAMS
    # this rank's shards: 1,049,600 * 4 B = 4,198,400 B of parameters and as many of
    # gradients (the whole model's 33,587,200 B before)
    assert _step(est, "parameters") == _step(est, "gradients") == RANK_PARAMS * 4 == 4_198_400
    # Adam's m and v of the shards, 2 * 4,198,400, and a 4-byte step per tensor: 16 * 4 B
    assert _step(est, "optimizer state") == 2 * 4_198_400 + 16 * 4 == 8_396_864
    # the 8 layers' inputs, 8 * 65,536 B (no gathered weight: 29,884,416 B before), less the
    # first's, the model's input (its own row): 7 * 65,536 B
    assert _step(est, "saved for backward") == 7 * LAYER_INPUT == 458_752


def test_fsdp2_saves_each_layers_input_not_its_gathered_weight(plain):
    r = _fsdp_report(backward=True)
    saved = r.to_dataframe().set_index("module")["saved_bytes"]
    # every layer keeps its input, 16 * 1024 * 4 = 65,536 B; layers 1-7 also kept weight.t(),
    # a view of FSDP2's gathered (unsharded) parameter, 1024 * 1024 * 4 = 4,194,304 B more
    assert [int(saved[str(i)]) for i in range(8)] == [LAYER_INPUT] * 8
    # as the unsharded model, whose parameters are not activations either
    per_layer = plain.to_dataframe().set_index("module")["saved_bytes"]
    assert [int(per_layer[str(i)]) for i in range(8)] == [LAYER_INPUT] * 8


def test_fsdp2_global_view_memory_is_the_unsharded_models(plain):
    est = _fsdp_report(backward=True, view="global").memory_estimate()
    # the whole model: 8,396,800 * 4 B = 33,587,200 B of parameters, 2x that of Adam state
    # + 16 * 4 B; saved 8 * 65,536 B: every row equal to the plain model's
    assert _step(est, "parameters") == 8_396_800 * 4 == 33_587_200
    assert _step(est, "optimizer state") == 2 * 33_587_200 + 16 * 4
    assert est.equals(plain.memory_estimate())


@pytest.mark.parametrize(
    "optimizer, states, flops_per_element",
    [("adam", 2, 13), ("adagrad", 1, None)],  # Adam by formula, Adagrad counted op by op
)
def test_a_profiled_optimizers_state_is_this_ranks(optimizer, states, flops_per_element):
    r = _fsdp_report(backward=True, optimizer=optimizer)
    opt = r.training_step.cost.optimizer
    # it steps this rank's shards: 1,049,600 elements, not 8,396,800; its state per element
    # (Adam's m and v, Adagrad's sum) of 4 B, and a 4-byte step per tensor, 16 * 4 B
    assert opt.elements == RANK_PARAMS
    assert opt.state_bytes == states * RANK_PARAMS * 4 + 16 * 4
    assert _step(r.memory_estimate(), "optimizer state") == opt.state_bytes
    if flops_per_element:  # Adam's formula: 13 FLOPs an element (counting/formulas/optim.py)
        assert opt.flops == flops_per_element * RANK_PARAMS == 13_644_800
    whole = _fsdp_report(backward=True, optimizer=optimizer, view="global")
    # the global view: the whole model's 8,396,800 elements
    assert whole.training_step.cost.optimizer.state_bytes == states * 8_396_800 * 4 + 16 * 4


def _mlp() -> nn.Module:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(256, 1024))
    model.add_module("act", nn.GELU())
    model.add_module("fc2", nn.Linear(1024, 256))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


@pytest.mark.parametrize("ws", [2, 4])
def test_tensor_parallel_saves_and_holds_this_ranks_shard(ws):
    def run(view):
        return profile_sharded(
            _mlp, (64, 256), batch_size=8, world_size=ws, rank=0, backward=True, view=view
        )

    r, whole = run("rank"), run("global")
    saved = r.to_dataframe().set_index("module")["saved_bytes"]
    # fc1 keeps its replicated input, 8*64*256*4 = 524,288 B; GELU its input and fc2 its input,
    # both this rank's 1024/ws columns: 8*64*1024/ws*4 = 1,048,576 B (ws 2), 524,288 B (ws 4)
    # (fc2 was 2,097,152 B at every ws before: the DTensor's global size)
    assert int(saved["fc1"]) == 8 * 64 * 256 * 4 == 524_288
    assert int(saved["act"]) == int(saved["fc2"]) == 8 * 64 * 1024 // ws * 4
    # globally fc2's input is the whole 8*64*1024*4 = 2,097,152 B (GELU runs on the local
    # tensor the plan hands it: local in either view)
    global_saved = whole.to_dataframe().set_index("module")["saved_bytes"]
    assert int(global_saved["fc2"]) == 8 * 64 * 1024 * 4 == 2_097_152
    assert int(global_saved["act"]) == 8 * 64 * 1024 // ws * 4
    # parameters held: fc1's 1024/ws rows (256 each, and their biases), fc2's 1024/ws columns
    # of 256 rows and its whole (replicated) bias of 256; fp32
    held = (1024 // ws * 256 + 1024 // ws + 256 * 1024 // ws + 256) * 4
    est = r.memory_estimate()
    assert _step(est, "parameters") == _step(est, "gradients") == held == r.totals["params"] * 4
    # the whole MLP globally: 525,568 parameters * 4 B
    assert _step(whole.memory_estimate(), "parameters") == 525_568 * 4 == 2_102_272
