"""``profile(..., what_helps=True)``: the forward timed eager, replayed from a CUDA graph and
compiled with ``mode="reduce-overhead"``, interleaved (``measure_latencies``) so the ratios to
eager carry paired intervals. A variant that cannot be built is left out with the reason. CUDA
only: on the CPU there is no launch cost for a graph to remove.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError, error_line
from modelprof.runtime.device import is_oom
from modelprof.runtime.execution import RunMode, completing, running
from modelprof.runtime.inputs import ModelInputs
from modelprof.timing.interleave import LatencyComparison, measure_latencies
from modelprof.timing.modes import graph_replay as _graphed  # the cuda_graph variant
from modelprof.timing.options import TimingOptions

__all__ = ["HELPS_BUDGET_S", "VARIANTS", "what_helps", "helps_note"]

#: seconds of interleaved sampling per variant
HELPS_BUDGET_S = 2.0


def _compiled(model: nn.Module, args: tuple, kwargs: dict) -> Callable[[], Any]:
    fn = completing(torch.compile(model, mode="reduce-overhead"))
    for _ in range(3):  # compiles, records its graphs
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    return lambda: fn(*args, **kwargs)


VARIANTS = ("cuda_graph", "compile")


def what_helps(
    model: nn.Module,
    mi: ModelInputs,
    mode: RunMode,
    opts: TimingOptions,
    variants: tuple[str, ...] = VARIANTS,
) -> tuple[LatencyComparison | None, list[str]]:
    """Eager against a CUDA graph and ``torch.compile`` (those of ``variants``), interleaved;
    and what was left out."""
    if mi.device.type != "cuda":
        raise ModelProfError(
            f"what_helps=True needs a CUDA device (the model runs on {mi.device}): it times the "
            "forward replayed from a CUDA graph and compiled, which remove launch cost"
        )
    args, kwargs = mi.args, mi.kwargs
    left_out: list[str] = []
    call = completing(model)  # each call ends when the collectives it started have
    with running(model, mode):

        def eager() -> Any:
            return call(*args, **kwargs)

        candidates: dict[str, Callable[[], Any]] = {"eager": eager}
        for name, build in (
            ("cuda_graph", lambda: _graphed(eager)),
            ("compile", lambda: _compiled(model, args, kwargs)),
        ):
            if name not in variants:
                continue
            try:
                candidates[name] = build()
            except Exception as e:  # noqa: BLE001 - the variant is left out, the reason said
                if is_oom(e):
                    raise
                left_out.append(f"{name}: {error_line(e, 160)}")
        if len(candidates) == 1:
            return None, left_out
        budget = min(opts.stop.budget_s, HELPS_BUDGET_S)
        # closures: the device said, so that CUDA events time them (not the host clock)
        result = measure_latencies(
            candidates,
            device=mi.device,
            batch_size=mi.batch_size,
            training=mode.training,
            no_grad=mode.no_grad,
            options=opts.replace(budget_s=budget, warn=False, latency_mode="latency"),
        )
        for m in result.measurements.values():
            if m.env.get("mode", {}).get("clock") != "cuda_event":
                raise ModelProfError(f"what_helps: {m.label} was not timed by CUDA events")
    return result, left_out


def helps_note(result: LatencyComparison | None, left_out: list[str]) -> str:
    """One sentence: each variant's latency over eager with its interval, and what was left out."""
    parts = []
    if result is not None:
        for name, (ratio, lo, hi) in result.ratios.items():
            if name == result.baseline:
                continue
            ci = f"95% CI {lo:.3f}-{hi:.3f}" if lo == lo and hi == hi else "no interval"
            parts.append(f"{name} {ratio:.3f}x eager ({ci})")
        parts[:0] = [f"what helps (interleaved, {result.rounds} rounds):"]
    if left_out:
        parts.append("left out: " + "; ".join(left_out))
    return " ".join(parts) if parts else "what helps: nothing could be measured"
