"""One rank of the torchrun tests (tests/test_distributed_ranks.py): ``python dist_worker.py
SCENARIO OUT_DIR`` under ``torchrun --nproc_per_node=2``; writes ``OUT_DIR/SCENARIO.RANK.json``.
Each scenario records what the test asserts: totals, collectives by kind, the number of
collectives each rank ran (a dispatch mode around everything), errors as text."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_models as dm  # noqa: E402

from modelprof import compare, profile  # noqa: E402
from modelprof.counting.collectives import collective_kind  # noqa: E402
from modelprof.distributed.gather import gather_reports  # noqa: E402
from modelprof.errors import ModelProfError  # noqa: E402

SHAPE = (dm.SEQ, dm.D)
# min_samples beyond what 0.3 s allows: every timed pass warns (undersampled) where it may speak
# undersampled on purpose (min_samples out of reach), and not extended past the budget
FAST = dict(
    budget_s=0.3, warmup=None, warmup_s=0.05, min_samples=1000, min_blocks=2, floor_extend_s=0
)


class CountCollectives(TorchDispatchMode):
    """Every collective this rank runs, by op (outermost: it sees what profile() runs too)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if collective_kind(func) is not None:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def summary(report) -> dict:
    df = report.collectives()
    kinds = {
        f"{p}/{k}": g[["calls", "in_bytes", "out_bytes", "comm_bytes", "traffic_bytes"]]
        .sum()
        .astype(int)
        .to_dict()
        for (p, k), g in df.groupby(["phase", "kind"])
    }
    return {
        "totals": {k: int(v) for k, v in report.totals.items()},
        "collectives": kinds,
        "env": {k: report.env.get(k) for k in ("rank", "world_size", "backend", "host")},
    }


def train_step(model) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = model(torch.randn(dm.BATCH, *SHAPE)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss.detach())


def scenario_count(out: dict) -> None:
    torch.manual_seed(0)
    for name, build in (("ddp", dm.ddp), ("fsdp", dm.fsdp), ("tp", dm.tensor_parallel)):
        model = build()
        out[name] = summary(profile(model, SHAPE, batch_size=dm.BATCH, timing=False, backward=True))
        out[name + "_global"] = summary(
            profile(model, SHAPE, batch_size=dm.BATCH, timing=False, backward=True, view="global")
        )
    # FSDP2 trains normally straight after profile(), forward-only and backward
    for backward in (False, True):
        model = dm.fsdp()
        params = list(model.parameters())
        qkv = model.layers[0].attn.qkv.weight  # its gradient is never 0 here
        first = qkv._local_tensor.clone()
        profile(model, SHAPE, batch_size=dm.BATCH, timing=False, backward=backward)
        loss = train_step(model)
        out[f"fsdp_trains_after_backward={backward}"] = {
            "loss_finite": bool(torch.isfinite(torch.tensor(loss))),
            "same_parameters": all(a is b for a, b in zip(params, model.parameters())),
            "updated": not torch.equal(first, qkv._local_tensor),
        }
    report = profile(dm.tensor_parallel(), SHAPE, batch_size=dm.BATCH, timing=False)
    gathered = gather_reports(report)
    out["gathered"] = (
        None
        if gathered is None
        else {
            "ranks": sorted(set(gathered["rank"])),
            "rows": len(gathered),
            "macs_by_rank": gathered[gathered.depth == 0]
            .set_index("rank")["macs"]
            .astype(int)
            .to_dict(),
        }
    )


def scenario_timing(out: dict) -> None:
    torch.manual_seed(dist.get_rank())
    slow = os.environ.get("SLOW_RANK")
    for name, build, shape in (
        ("ddp_cnn", lambda: dm.ddp(dm.small_cnn()), (3, 16, 16)),
        ("tp", dm.tensor_parallel, SHAPE),
    ):
        model = build()
        if slow is not None and int(slow) == dist.get_rank():
            model.register_forward_hook(lambda *a: time.sleep(0.003))
        with CountCollectives() as seen, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = profile(model, shape, batch_size=2, backward=True, **FAST)
        df = report.to_dataframe()
        comm = df[df.type == "(communication)"]
        out[name] = {
            "collective_ops": dict(seen.ops),
            "warnings": len(caught),
            "backward_ms": report.backward_latency.median_ms,
            "comm_rows": len(comm),
            "shared_host_note": any("ranks timed on this host" in n for n in report.timing_notes),
            "comm_latency": comm.set_index("module")[["latency_ms", "backward_latency_ms"]]
            .fillna(-1.0)
            .to_dict("index"),
        }
    # compare(): interleaved rounds, training steps and the throughput search, agreed too
    models = {"tp_a": dm.tensor_parallel(), "tp_b": dm.tensor_parallel()}
    if slow is not None and int(slow) == dist.get_rank():
        models["tp_b"].register_forward_hook(lambda *a: time.sleep(0.003))
    with CountCollectives() as seen, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = compare(
            models,
            SHAPE,
            batch_size=2,
            backward=True,
            throughput=True,
            throughput_options={"max_batch": 8, "budget_s": 0.1},
            **FAST,
        )
    out["compare"] = {
        "collective_ops": dict(seen.ops),
        "warnings": len(caught),
        "latency_n": table["latency_n"].astype(int).tolist(),
        "throughput_batch_size": table["throughput_batch_size"].astype(int).tolist(),
    }


def scenario_utilization(out: dict) -> None:
    from torch import nn

    from modelprof.report.utilization import group_utilization
    from modelprof.timing.peaks import Peaks

    rank = dist.get_rank()
    torch.manual_seed(rank)
    report = profile(
        nn.Linear(64, 64), (64,), batch_size=8 * (rank + 1), roofline=Peaks(1e9, 1e9), **FAST
    )
    u = report.utilization()
    out["mfu"] = u.mfu
    out["group"] = group_utilization(u).to_dict("list")


def scenario_errors(out: dict) -> None:
    rank = dist.get_rank()
    os.environ["MODELPROF_JOIN_TIMEOUT_S"] = "3"
    model = dm.tensor_parallel()
    if rank == 0:  # rank 1 never calls profile()
        try:
            profile(model, SHAPE, batch_size=dm.BATCH, timing=False)
        except ModelProfError as e:
            out["rank0_only"] = str(e)
    dist.barrier()
    # a rank that dies mid-profile: rank 1 exits inside its forward
    if rank == 1:
        model.layers[2].register_forward_pre_hook(lambda *a: os._exit(0))
    try:
        profile(model, SHAPE, batch_size=dm.BATCH, timing=False)
    except ModelProfError as e:
        out["peer_died"] = str(e)


def main() -> None:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    out: dict = {}
    try:
        globals()[f"scenario_{scenario}"](out)
    finally:
        with open(os.path.join(out_dir, f"{scenario}.{dist.get_rank()}.json"), "w") as f:
            json.dump(out, f, default=str)
    if scenario != "errors":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
