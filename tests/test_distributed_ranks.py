"""Sharded models under torchrun: 2 gloo ranks on one host, started and stopped by the test (a
deadlock fails on the timeout instead of hanging). tests/dist_worker.py is what each rank runs;
the figures are derived in tests/test_distributed_fake.py and tests/dist_models.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
MODEL_BYTES = 3_159_552 * 4  # 12,638,208


def run_ranks(
    scenario: str, tmp: Path, timeout: float, writers: tuple[int, ...] = (0, 1), **env: str
) -> list[dict | None]:
    """Run ``scenario`` on 2 ranks; each rank's JSON, None for a rank that wrote none. One of
    ``writers`` that wrote none fails the test with torchrun's stderr (the rank's error)."""
    torchrun = shutil.which("torchrun")
    cmd = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]) + [
        "--standalone",
        "--nproc_per_node=2",
        f"--log-dir={tmp / 'torchelastic'}",  # not a torchelastic_* folder left in /tmp
        str(HERE / "dist_worker.py"),
        scenario,
        str(tmp),
    ]
    environ = {
        **os.environ,
        **env,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(cmd, env=environ, timeout=timeout, capture_output=True, text=True)
    out = []
    for rank in (0, 1):
        f = tmp / f"{scenario}.{rank}.json"
        out.append(json.loads(f.read_text()) if f.exists() else None)
    missing = [rank for rank in writers if out[rank] is None]
    assert not missing, (
        f"rank {missing} wrote no result (torchrun exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    )
    return out


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    return run_ranks("count", tmp_path_factory.mktemp("count"), timeout=240)


def kinds(result: dict) -> dict:
    return result["collectives"]


def test_same_figures_under_torchrun(counted):
    for rank, r in enumerate(counted):
        assert r["ddp"]["env"] == {
            **r["ddp"]["env"],
            "rank": rank,
            "world_size": 2,
            "backend": "gloo",
        }
        # DDP: the gradient all-reduce, one bucket of the whole model per step
        ddp = kinds(r["ddp"])["backward/all_reduce"]
        assert ddp["calls"] == 1 and ddp["comm_bytes"] == MODEL_BYTES
        # FSDP2: gathered forward (whole model out, half in), re-gathered backward (the 4
        # blocks: 12,636,160 B), reduce-scattered 12,638,208 B in and 6,319,104 B out
        f = kinds(r["fsdp"])
        assert f["forward/all_gather"]["comm_bytes"] == MODEL_BYTES
        assert f["forward/all_gather"]["in_bytes"] == 6_319_104
        assert f["backward/all_gather"]["comm_bytes"] == 12_636_160
        rs = f["backward/reduce_scatter"]
        assert (rs["in_bytes"], rs["out_bytes"]) == (MODEL_BYTES, 6_319_104)
        assert r["fsdp"]["totals"]["params"] == 1_579_776
        # tensor parallel MLP
        t = r["tp"]["totals"]
        assert (t["macs"], t["params"]) == (285_212_672, 2_108_928)
        assert kinds(r["tp"])["forward/all_reduce"]["comm_bytes"] == 524_288
        assert kinds(r["tp"])["backward/all_reduce"]["comm_bytes"] == 524_288
        # the global view is the unsharded model (3,159,552 params, 419,430,400 MACs)
        for name in ("ddp", "fsdp", "tp"):
            g = r[name + "_global"]["totals"]
            assert (g["params"], g["macs"]) == (3_159_552, 419_430_400), name


def test_fsdp2_trains_straight_after_profile(counted):
    for r in counted:
        for backward in (False, True):
            step = r[f"fsdp_trains_after_backward={backward}"]
            assert step == {"loss_finite": True, "same_parameters": True, "updated": True}


def test_gather_reports_to_rank_0(counted):
    gathered, elsewhere = counted[0]["gathered"], counted[1]["gathered"]
    assert elsewhere is None
    assert gathered["ranks"] == [0, 1]
    assert gathered["macs_by_rank"] == {"0": 285_212_672, "1": 285_212_672}


@pytest.mark.parametrize("slow_rank", [None, "1"])
def test_backward_timing_runs_agree(tmp_path, slow_rank):
    env = {} if slow_rank is None else {"SLOW_RANK": slow_rank}
    r0, r1 = run_ranks("timing", tmp_path, timeout=300, **env)
    for name in ("ddp_cnn", "tp"):
        # every rank ran the same collectives, the same number of times
        assert r0[name]["collective_ops"] == r1[name]["collective_ops"], name
        assert r0[name]["backward_ms"] > 0 and r0[name]["comm_rows"] >= 1
        # both ranks time on this host's 2 cores at once: the report says what that means
        assert r0[name]["shared_host_note"] and r1[name]["shared_host_note"]
    assert r0["ddp_cnn"]["collective_ops"]["c10d.allreduce_.default"] > 0
    for r in (r0, r1):
        # the collectives' own time, in (communication) rows: DDP's gradient all-reduce on the
        # root's, each TP fc1's backward all-reduce (its input's gradient) on fc1's
        assert r["ddp_cnn"]["comm_latency"]["(communication)"]["backward_latency_ms"] > 0
        for layer in range(4):
            row = r["tp"]["comm_latency"][f"layers.{layer}.mlp.fc1.(communication)"]
            assert row["backward_latency_ms"] > 0
    if slow_rank == "1":
        # rank 1 sleeps 3 ms after each forward, so rank 0 waits for it in the gradient
        # all-reduce: that wait is rank 0's communication, longer than rank 1's own
        ddp = [
            r["ddp_cnn"]["comm_latency"]["(communication)"]["backward_latency_ms"] for r in (r0, r1)
        ]
        assert ddp[0] > ddp[1], ddp
    # one voice: rank 0 warns (every pass is undersampled on purpose), rank 1 stays silent
    assert r0["tp"]["warnings"] > 0 and r1["tp"]["warnings"] == 0
    # compare(): the same rounds, blocks, steps and searched batch sizes on both ranks (every
    # pass runs collectives, so equal counts mean equal passes), the same best batch (the one
    # whose slowest rank is fastest), one voice
    c0, c1 = r0["compare"], r1["compare"]
    assert c0["collective_ops"] == c1["collective_ops"]
    assert c0["latency_n"] == c1["latency_n"]
    assert c0["throughput_batch_size"] == c1["throughput_batch_size"]
    assert c0["warnings"] > 0 and c1["warnings"] == 0


def test_bad_runs_raise_modelprof_error(tmp_path):
    r0, _ = run_ranks("errors", tmp_path, timeout=180, writers=(0,))
    assert "rank 0 but only 1 of 2 ranks joined" in r0["rank0_only"]
    # rank 1 exits inside its forward: rank 0 stops with the module it was in and the cause
    assert "layers.2" in r0["peer_died"] and "RuntimeError" in r0["peer_died"]


def test_group_utilization_under_torchrun(tmp_path):
    out = run_ranks("utilization", tmp_path, timeout=240)
    assert out[0]["group"] == out[1]["group"]  # every rank gets the group's table
    g = out[0]["group"]
    assert g["rank"] == [0, 1, -1]
    # rank r runs a 64 x 64 Linear at batch 8 (r + 1): 2 x 8 (r + 1) x 64 x 64 FLOPs
    assert g["model_flops"] == [65_536.0, 131_072.0, 196_608.0]
    assert g["time_ms"][2] == max(g["time_ms"][:2])  # the group waits for its slowest rank
    # all ranks' FLOPs / (slowest time x 2 ranks x 1e9 FLOP/s)
    assert g["mfu"][2] == pytest.approx(196_608 / (g["time_ms"][2] * 1e-3 * 2 * 1e9))
    for rank in (0, 1):
        assert g["mfu"][rank] == pytest.approx(out[rank]["mfu"])


def test_the_gathered_step_time_is_the_training_steps(tmp_path):
    # a newcomer's DDP step (backward=True) read attrs["step_latency_ms"] 0.040 ms, the
    # forward's median, where the step took 1.342 ms: the step's is the group's step time
    import torch.distributed as dist
    from torch import nn

    from modelprof import profile
    from modelprof.distributed.gather import gather_reports

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        quick = dict(repeat=3, warmup=1, roofline=False)
        step = profile(model, (16,), backward=True, **quick)
        forward = profile(model, (16,), **quick)
        step_ms = step.training_step.timing.step.median_ms
        assert gather_reports(step).attrs["step_latency_ms"] == step_ms
        assert gather_reports(forward).attrs["step_latency_ms"] == forward.latency.median_ms
    finally:
        dist.destroy_process_group()
