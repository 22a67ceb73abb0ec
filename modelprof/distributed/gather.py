"""Every rank's table at rank 0: one DataFrame with a ``rank`` column."""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch.distributed as dist

from modelprof.errors import ModelProfError
from modelprof.runtime.group import group_up

__all__ = ["gather_reports"]


def gather_reports(
    report: Any, dst: int = 0, group: Any = None, **frame_options: Any
) -> pd.DataFrame | None:
    """Gather ``report.to_dataframe(**frame_options)`` of every rank (a collective) to rank
    ``dst``: the frames stacked under a ``rank`` column on ``dst``, None on the others.
    ``attrs["ranks"]``: each rank's environment; ``attrs["step_latency_ms"]`` (timed): the
    slowest rank's median, the group's step time (of the whole training step where the
    reports timed one, ``backward=True``; else of the forward).
    """
    if not group_up():
        raise ModelProfError(
            "gather_reports() needs an initialised process group "
            "(torch.distributed.init_process_group); none is active"
        )
    rank = dist.get_rank(group)
    frame = report.to_dataframe(**frame_options)
    step = getattr(getattr(report, "training_step", None), "timing", None)
    latency = step.step if step is not None else getattr(report, "latency", None)
    mine = {
        "rank": dist.get_rank(),
        "frame": frame,
        "env": dict(getattr(report, "env", {}) or {}),
        "latency_ms": None if latency is None else float(latency.median_ms),
    }
    world = dist.get_world_size(group)
    if not 0 <= dst < world:
        raise ModelProfError(f"dst={dst!r} is not a rank of the group (world size {world})")
    got: list[Any] | None = [None] * world if rank == dst else None
    dist.gather_object(mine, got, dst=dst, group=group)
    if got is None:
        return None
    frames = []
    for part in sorted(got, key=lambda p: p["rank"]):
        df = part["frame"].copy()
        df.insert(0, "rank", part["rank"])
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    out.attrs["ranks"] = {p["rank"]: p["env"] for p in got}
    times = [p["latency_ms"] for p in got if p["latency_ms"] is not None]
    if times:
        out.attrs["step_latency_ms"] = max(times)
    return out
