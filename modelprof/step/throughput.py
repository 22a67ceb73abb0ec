"""Training steps per second: what ``measure_throughput`` times at each batch size when the
training step, not the forward, is asked for (``compare(backward=True, throughput=True)``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from modelprof.errors import ModelProfError
from modelprof.runtime.execution import RunMode
from modelprof.runtime.inputs import make_inputs
from modelprof.step.spec import StepSpec
from modelprof.step.timing import StepTimer
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import TimingOptions
from modelprof.timing.throughput import PointMeasure

__all__ = ["batch_rows", "step_measure"]


def step_measure(input_size: Any, spec: StepSpec, mode: RunMode) -> PointMeasure:
    """A point measure for ``measure_throughput(measure=)``: whole training steps (forward,
    loss, backward and, with an optimizer, its step; on a copy of the model, as
    ``profile(backward=True)`` times them) of random inputs of ``input_size`` at the point's
    batch size, a ``target``'s rows repeated to that batch (:func:`batch_rows`)."""

    def measure(
        model: Any, batch_size: int, device: torch.device, opts: TimingOptions
    ) -> Measurement:
        mi = make_inputs(model, input_size, batch_size=batch_size, device=device)
        at_batch = dataclasses.replace(spec, target=batch_rows(spec.target, batch_size))
        t_begin = time.perf_counter()
        with StepTimer(model, mi, at_batch, mode, options=opts) as timer:
            sampled = timer.sample(timer.sample_block, timer.warm(), "training step")
        return timer.measurements(sampled, t_begin)["step"]

    return measure


def batch_rows(target: Any, batch_size: int) -> Any:
    """``target``'s rows (its first dimension) repeated in turn to ``batch_size`` rows: a target
    given for one batch size, for another (None stays None)."""
    if target is None:
        return None
    if not isinstance(target, torch.Tensor) or target.dim() == 0:
        what = type(target).__name__ if not isinstance(target, torch.Tensor) else "a 0-d tensor"
        raise ModelProfError(
            f"target={what}: a throughput search repeats the target's rows to each batch size; "
            "pass one tensor whose first dimension is the batch"
        )
    rows = torch.arange(batch_size, device=target.device) % target.shape[0]
    return target.index_select(0, rows)
