"""Sharded models' counts in closed form from one process: a fake process group of 2, the model
and its parallel plan built as under torchrun (tests/dist_models.py derives the model's figures).

fp32: 3,159,552 params * 4 B = 12,638,208 B, the whole model's parameter (and gradient) bytes.
"""

from __future__ import annotations

import socket

import dist_models as dm
import pytest
import torch
import torch.distributed as dist

from modelprof import profile
from modelprof.distributed.session import contention_note, group_env
from modelprof.errors import ModelProfError, ModelProfWarning
from modelprof.profile_sharded import profile_sharded

PARAMS = 3_159_552  # 4 * 789,760 + 512 (tests/dist_models.py)
MACS = 419_430_400  # 4 * 104,857,600
MODEL_BYTES = PARAMS * 4  # 12,638,208
SHAPE = (dm.SEQ, dm.D)  # local batch 2 x 64 tokens of d=256


def sharded(build, **kw):
    return profile_sharded(build, SHAPE, batch_size=dm.BATCH, world_size=2, rank=1, **kw)


def by_kind(report, phase):
    df = report.collectives()
    df = df[df.phase == phase]
    return {
        k: g[["calls", "in_bytes", "out_bytes", "comm_bytes", "traffic_bytes"]].sum().to_dict()
        for k, g in df.groupby("kind")
    }


@pytest.fixture(scope="module")
def plain():
    return profile(dm.Transformer(), SHAPE, batch_size=dm.BATCH, timing=False, backward=True)


def test_unsharded_model_has_the_closed_form_counts(plain):
    assert plain.totals["params"] == PARAMS and plain.totals["macs"] == MACS


def test_ddp_gradient_all_reduce():
    r = sharded(dm.ddp, backward=True, device="cpu")  # DDP broadcasts real values when built
    bwd = by_kind(r, "backward")
    # one bucket (12,638,208 B < DDP's 25 MiB cap) all-reduced per step: the whole model
    assert bwd["all_reduce"]["calls"] == 1 and bwd["all_reduce"]["comm_bytes"] == MODEL_BYTES
    # ring all-reduce, n=2: 2 * (2-1)/2 * 12,638,208 = 12,638,208 B each way
    assert bwd["all_reduce"]["traffic_bytes"] == MODEL_BYTES
    assert r.totals["params"] == PARAMS and r.totals["comm_calls"] == 0  # nothing forward
    assert r.env["world_size"] == 2 and r.env["rank"] == 1 and r.env["backend"] == "fake"
    # the root's (communication) row names the backward's kind and group; the forward ran none
    comm = r.to_dataframe().set_index("module").loc["(communication)"]
    assert comm["comm_kind"] == "" and comm["backward_comm_kind"] == "all_reduce"
    assert comm["backward_comm_group_size"] == 2


def test_fsdp2_gathers_and_reduce_scatters(plain):
    r = sharded(dm.fsdp, backward=True)
    fwd, bwd = by_kind(r, "forward"), by_kind(r, "backward")
    # forward: one all-gather per fully_shard group (4 blocks + the root's own norm), output =
    # the whole model, input = this rank's half
    assert fwd["all_gather"]["calls"] == 5
    assert fwd["all_gather"]["comm_bytes"] == fwd["all_gather"]["out_bytes"] == MODEL_BYTES
    assert fwd["all_gather"]["in_bytes"] == MODEL_BYTES // 2 == 6_319_104
    # backward: the 4 blocks are gathered again (resharded after forward; the root is not):
    # 4 * 789,760 * 4 B = 12,636,160 B; gradients reduce-scattered, 12,638,208 in, half out
    assert bwd["all_gather"]["calls"] == 4 and bwd["all_gather"]["comm_bytes"] == 12_636_160
    rs = bwd["reduce_scatter"]
    assert rs["calls"] == 5 and rs["in_bytes"] == MODEL_BYTES and rs["out_bytes"] == 6_319_104
    # (n-1)/n * size: 12,638,208 / 2 per rank each way
    assert rs["traffic_bytes"] == 6_319_104
    assert r.totals["params"] == PARAMS // 2 == 1_579_776
    # the whole model's row names both kinds its backward ran
    root = r.to_dataframe().iloc[0]
    assert root["comm_kind"] == "all_gather"
    assert set(root["backward_comm_kind"].split("+")) == {"all_gather", "reduce_scatter"}
    # compute is not sharded by FSDP: every other column equals the unsharded model's
    for k in ("macs", "flops", "read_bytes", "write_bytes", "backward_macs", "backward_flops"):
        assert r.totals[k] == plain.totals[k], k


def test_fsdp_built_on_meta_shards_on_the_cpu_where_the_machine_has_a_gpu(monkeypatch):
    # with a GPU present fully_shard without a mesh takes cuda:0 (FSDP asks the machine's
    # accelerator) while the parameters are materialised on the CPU: "Unhandled FakeTensor
    # Device Propagation for fsdp.all_gather_copy_in.default, found two different devices
    # cpu, cuda:0". Here the CPU machine says it has a GPU (a CUDA mesh cannot be built on it)
    want = sharded(dm.fsdp, backward=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    if hasattr(torch._C, "_get_accelerator"):  # torch 2.11-2.14 ask this one
        monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    r = sharded(dm.fsdp, backward=True)
    assert r.totals["params"] == PARAMS // 2 == want.totals["params"]  # 1,579,776
    assert r.collectives().equals(want.collectives())
    assert r.totals == want.totals
    # what the machine says is put back after the build
    assert torch.cuda.is_available() and (
        not hasattr(torch._C, "_get_accelerator") or torch._C._get_accelerator().type == "cuda"
    )


def test_tensor_parallel_mlp_per_rank():
    r = sharded(dm.tensor_parallel, backward=True)
    # per block: qkv+proj 33,554,432 + attention 4,194,304 + half the MLP 33,554,432
    assert r.totals["macs"] == 4 * (33_554_432 + 4_194_304 + 33_554_432) == 285_212_672
    # the MLP's shards: fc1 256*512 + 512, fc2 512*256 + 256 (bias replicated) = 262,912 of
    # 525,568 per block: 3,159,552 - 4 * 262,656
    assert r.totals["params"] == PARAMS - 4 * (525_568 - 262_912) == 2_108_928
    fc1 = r.to_dataframe().set_index("module").loc["layers.0.mlp.fc1"]
    assert fc1["output_shape"] == "2x64x512"  # this rank's columns of 1024
    # fc2's partial sums all-reduced forward, fc1's input gradient backward: 2*64*256*4 B per
    # block = 131,072; 4 blocks = 524,288 B each way
    fwd, bwd = by_kind(r, "forward"), by_kind(r, "backward")
    assert fwd["all_reduce"]["calls"] == 4 and fwd["all_reduce"]["comm_bytes"] == 524_288
    assert bwd["all_reduce"]["calls"] == 4 and bwd["all_reduce"]["comm_bytes"] == 524_288
    # the row of the MLP that ran it carries it, in a (communication) row
    assert (
        r.to_dataframe().set_index("module").loc["layers.0.mlp.(communication)", "comm_bytes"]
        == 131_072
    )


def _parallel_mlp():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    return parallelize_module(dm.MLP(), init_device_mesh("cpu", (2,)), plan)


def test_a_training_step_has_backward_comm_columns_where_its_backward_ran_no_collective():
    # the MLP alone: its input needs no gradient, so no all-reduce of one runs backward; the
    # columns are there all the same (zeros), as under DDP and FSDP2
    r = sharded(_parallel_mlp, backward=True)
    comm = r.to_dataframe().set_index("module").loc["(communication)"]
    # fc2's partial sums all-reduced forward: 2*64*256*4 B = 131,072
    assert comm["comm_kind"] == "all_reduce" and comm["comm_bytes"] == 131_072
    assert comm["backward_comm_calls"] == 0 and comm["backward_comm_kind"] == ""
    assert r.totals["backward_comm_bytes"] == r.totals["backward_comm_traffic_bytes"] == 0


@pytest.mark.parametrize("build", [lambda: dm.tensor_parallel(local_output=False), dm.fsdp])
def test_global_view_equals_the_unsharded_model(build, plain):
    r = sharded(build, backward=True, view="global")
    for k in ("params", "macs", "flops", "backward_macs", "backward_flops"):
        assert r.totals[k] == plain.totals[k], k
    assert r.env["distributed_view"] == "global"


def test_global_view_of_local_activations(plain):
    # the default plan hands fc1's output to GELU as a plain local tensor: that op is counted
    # on this rank's half in either view, 4 blocks * 2*64*512 = 262,144 FLOPs fewer; the
    # contractions and parameters are the unsharded model's
    r = sharded(dm.tensor_parallel, view="global", backward=True)
    assert r.totals["params"] == PARAMS and r.totals["macs"] == MACS
    assert plain.totals["flops"] - r.totals["flops"] == 4 * 2 * 64 * 512


def test_one_process_speaks_whatever_rank_it_plays():
    # rank 1 of a fake group is this one process: its warnings are not silenced (an op with
    # no formula and no decomposition, a QR decomposition, is named once)
    class WithQR(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.linalg.qr(self.fc(x))[0]

    with pytest.warns(ModelProfWarning, match="qr"):
        profile_sharded(lambda: dm.ddp(WithQR()), (8, 8), world_size=2, rank=1, device="cpu")


def test_bad_input_names_it():
    with pytest.raises(ModelProfError, match="world_size=0"):
        profile_sharded(dm.Transformer, SHAPE, world_size=0)
    with pytest.raises(ModelProfError, match="rank=2"):
        profile_sharded(dm.Transformer, SHAPE, world_size=2, rank=2)
    with pytest.raises(ModelProfError, match="view='local'"):
        sharded(dm.tensor_parallel, view="local")

    def wrong_plan():  # a plan naming a module the model does not have
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

        m = dm.Transformer()
        parallelize_module(
            m,
            init_device_mesh("cpu", (dist.get_world_size(),)),
            {"layers.0.mlp.fc3": ColwiseParallel()},
        )
        return m

    with pytest.raises(ModelProfError, match="fc3"):
        sharded(wrong_plan)
    assert not torch.distributed.is_initialized()  # the fake group is gone again


def test_a_shared_cpu_is_noted_for_a_communicating_model_and_the_env_names_the_rank(monkeypatch):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    cpu, plain = torch.device("cpu"), torch.nn.Linear(4, 4)
    assert contention_note(plain, cpu) is None and group_env() == {}  # no process group
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        ddp = dm.ddp(torch.nn.Linear(4, 4))
        assert contention_note(ddp, cpu).startswith("2 ranks timed on this host's CPU at once")
        assert contention_note(plain, cpu) is None  # it runs no collective: no one waits
        assert contention_note(ddp, torch.device("cuda")) is None  # each rank its own GPU
        assert group_env() == {
            "rank": 1,
            "world_size": 2,
            "backend": "fake",
            "host": socket.gethostname(),
            "local_rank": None,
            "distributed_view": "rank",  # the default view outside a session
        }
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        assert contention_note(ddp, cpu) is None  # the only rank on this host
    finally:
        dist.destroy_process_group()
