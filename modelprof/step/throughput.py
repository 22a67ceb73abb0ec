"""Training steps per second: what ``measure_throughput`` times at each batch size when the
training step, not the forward, is asked for (``compare(backward=True, throughput=True)``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from modelprof.errors import ModelProfError
from modelprof.runtime.execution import RunMode
from modelprof.runtime.inputs import batch_inputs
from modelprof.step.count import trainable_check
from modelprof.step.spec import StepSpec, refuse_inference_mode
from modelprof.step.timing import StepTimer
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import TimingOptions
from modelprof.timing.throughput import HELD_BYTES, PointMeasure, SizedMeasure

__all__ = ["batch_rows", "step_measure"]


def step_measure(
    input_size: Any,
    spec: StepSpec | None = None,
    mode: RunMode = RunMode(training=True, no_grad=False),
    *,
    tokens: int | None = None,
) -> PointMeasure:
    """A point measure for ``measure_throughput(measure=)``: whole training steps (forward,
    loss, backward and, with an optimizer, its step; on a copy of the model, as
    ``profile(backward=True)`` times them) of random inputs of ``input_size`` at the point's
    batch size, a ``target``'s rows repeated to that batch (:func:`batch_rows`). ``spec``:
    ``StepSpec.parse(loss_fn=, target=, optimizer=)`` (default: the sum of the outputs, no
    optimizer); ``mode``: train mode unless ``RunMode(training=False)`` asks for eval;
    ``tokens`` (with ``input_size`` None): token ids of that length, as ``measure_throughput``'s.
    Pass ``measure_throughput`` the same size: it refuses another (its curve names the size)."""
    spec = StepSpec.parse() if spec is None else spec
    if input_size is not None and tokens is not None:
        raise ModelProfError("step_measure takes input_size or tokens=, not both")

    checked: list[bool] = []  # the first point checks the step as profile() would

    def measure(
        model: Any, batch_size: int, device: torch.device, opts: TimingOptions
    ) -> Measurement:
        mi = batch_inputs(model, input_size, tokens, batch_size, device)
        at_batch = dataclasses.replace(spec, target=batch_rows(spec.target, batch_size))
        at_batch = at_batch.for_inputs(mi.kwargs)
        if not checked:
            refuse_inference_mode("a training step's throughput search")
            trainable_check(model, (mi.args, mi.kwargs), at_batch.optimizer_name)
            at_batch.check_optimizer(model)
        t_begin = time.perf_counter()
        with StepTimer(model, mi, at_batch, mode, options=opts) as timer:
            if not checked:
                timer.guarded(lambda: _checked_loss(timer))
                checked.append(True)
            sampled = timer.sample(timer.sample_block, timer.warm(), "training step")
            held = timer.held_bytes()
        got = timer.measurements(sampled, t_begin)["step"]
        got.env[HELD_BYTES] = held  # not the step's: the search's peaks leave it out
        return got

    return SizedMeasure(measure, input_size, tokens)  # (measure_throughput checks the size)


def _checked_loss(timer: StepTimer) -> None:
    """One forward and its loss, checked (a ModelProfError naming what is wrong: an output
    with nothing to differentiate, a loss that is not a scalar) before any step is timed."""
    step = timer.step
    step.clear()
    step.forward()
    out, step.out = step.out, None
    step.spec.loss(out, step.target, timer.label)


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
