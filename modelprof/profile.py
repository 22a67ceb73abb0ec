"""``profile``: static cost and measured time of a model, joined in one ``Report``."""
from __future__ import annotations

import copy
import inspect
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from .counter import OpStats
from .errors import ModelProfError
from .formulas.registry import FormulaRegistry
from .inputs import ModelInputs, make_inputs, moved_model, parse_dtype
from .report import Report
from .static import analyze
from .table import Row, build_rows

__all__ = ["ModelProfWarning", "profile"]


class ModelProfWarning(UserWarning):
    """Something the numbers do not cover (ops with no formula), said once per profile."""


def profile(model: nn.Module, input_size: Any = None, *, inputs: Any = None,
            batch_size: int | None = None, device: torch.device | str | None = None,
            dtype: torch.dtype | str | None = None, timing: bool = True,
            training: bool | None = None, no_grad: bool | None = None, roofline: Any = None,
            registry: FormulaRegistry | None = None, backward: bool = False,
            loss_fn: Any = None, target: Any = None, optimizer: Any = None,
            **timing_options: Any) -> Report:
    """Profile ``model`` on one input: one row per module call with shapes, params, MACs,
    FLOPs, MAdd and memory traffic, plus measured latency when ``timing`` is on.

    ``input_size`` excludes the batch (``(3, 224, 224)``); ``inputs=`` takes a tensor, a tuple
    of positional arguments or a dict of keyword arguments instead. ``device``/``dtype``
    default to the model's (``device="meta"`` analyses shapes alone, no memory or compute).
    The model runs in eval mode under ``torch.no_grad()`` unless ``training``/``no_grad`` say
    otherwise, and comes back exactly as it went in.

    ``roofline``: ``None`` (default) adds the roofline columns when timing, from a short
    measured probe of the device's peak FLOP/s and bandwidth; ``False`` skips it; a
    ``modelprof.roofline.Peaks`` uses those peaks. ``timing_options`` go to the timer
    (``repeat``, ``warmup``, ``budget_s``, ``precision``, ``amp``, ``cuda_graph``, ...; see
    ``measure_latency``).

    ``backward=True`` profiles a training step (train mode unless ``training=False``, grad on):
    the loss (``loss_fn(output)`` or ``loss_fn(output, target)``; default the sum of the floating
    outputs), the backward — ``backward_macs``, ``backward_flops``, ``saved_bytes`` and the
    ``backward_latency_*`` columns, ``report.backward_latency`` — and, with ``optimizer=`` (a
    class, a factory ``lambda params: ...``, a name or an instance to copy the options of), the
    optimizer step as a row of its own. See ``modelprof.step_table``.
    """
    if not isinstance(model, nn.Module):
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module; "
                             "use measure_latency() to time any callable")
    if not isinstance(backward, bool):
        raise ModelProfError(f"backward={backward!r} must be True or False")
    step_spec = _step_spec(backward, loss_fn, target, optimizer, no_grad, timing_options)
    training = backward if training is None else training
    no_grad = not backward if no_grad is None else no_grad
    for name, value in (("timing", timing), ("training", training), ("no_grad", no_grad)):
        if not isinstance(value, bool):
            raise ModelProfError(f"{name}={value!r} must be True or False")
    if registry is not None and not isinstance(registry, FormulaRegistry):
        raise ModelProfError(f"registry={registry!r} is not a modelprof FormulaRegistry")
    _check_timing_options(timing_options)
    dtype_requested = parse_dtype(dtype)
    mi = make_inputs(model, input_size, inputs=inputs, batch_size=batch_size, device=device,
                     dtype=dtype_requested)
    step_cost = None
    if step_spec is not None:
        from .backward import count_step
        from .timing.modes import parse_amp
        static, step_cost = count_step(model, mi, step_spec, training=training,
                                       dtype_requested=dtype_requested, registry=registry,
                                       amp=parse_amp(timing_options.get("amp")))
        static.unsupported.update(step_cost.unsupported)
        _merge_ops(static.by_op, step_cost.loss_by_op)
    else:
        static = analyze(model, mi, training=training, no_grad=no_grad,
                         dtype_requested=dtype_requested, registry=registry)
    if static.unsupported:
        ops = ", ".join(f"{k} ({v} call{'s' if v > 1 else ''})"
                        for k, v in sorted(static.unsupported.items()))
        warnings.warn(f"modelprof: {len(static.unsupported)} op type(s) have no formula and "
                      f"were counted as 0 FLOPs: {ops}. See Report.unsupported; add one with "
                      "modelprof.register_formula.", ModelProfWarning, stacklevel=2)
    rows = build_rows(static.records, step_cost.owning_calls if step_cost is not None else ())
    from .env import collect_env
    flags = {"training": training, "no_grad": no_grad, **timing_options}
    if step_spec is not None:
        flags.update(backward=True, loss=step_spec.loss_name, optimizer=step_spec.optimizer_name)
    env = collect_env(mi.device, mi.dtype, mi.batch_size, **flags)
    latency = layers = overhead = coverage = peaks = training_step = None
    if timing:
        with torch.random.fork_rng(devices=[mi.device] if mi.device.type == "cuda" else []):
            latency, layers = _measure(model, mi, dtype_requested, training, no_grad,
                                       timing_options)
        overhead, coverage = _join_timing(rows, static.records, latency, layers)
    if step_cost is not None:
        from .step_table import join_step
        step_timing = None
        if timing:
            from .timing.backward import time_step
            step_timing = time_step(model, mi, step_spec, len(static.records), training=training,
                                    dtype=dtype_requested, **_step_timer_options(timing_options))
        training_step = join_step(rows, static.records, step_cost, step_timing)
    if roofline is not False and (timing or roofline not in (None, True)):
        peaks = _peaks(roofline, mi, env)
    return Report(rows, model_name=type(model).__name__, input_shape=mi.shapes(),
                  batch_size=mi.batch_size, device=str(mi.device),
                  dtype=str(mi.dtype).removeprefix("torch."), unsupported=static.unsupported,
                  by_op=static.by_op, model_params=static.model_params, env=env,
                  latency=latency, layer_timing=layers, instrumentation_overhead=overhead,
                  coverage=coverage, options=flags, peaks=peaks, training_step=training_step)


_NO_STEP_OPTIONS = ("transfer", "cuda_graph", "compile", "compile_kwargs", "pin_memory")


def _step_spec(backward: bool, loss_fn: Any, target: Any, optimizer: Any, no_grad: Any,
               options: dict[str, Any]):
    """The checked training-step options, or None with ``backward=False`` (then none is given)."""
    from .step import StepSpec

    if not backward:
        given = [k for k, v in (("loss_fn", loss_fn), ("target", target),
                                ("optimizer", optimizer)) if v is not None]
        if given:
            raise ModelProfError(f"{', '.join(given)} given with backward=False; pass "
                                 "backward=True to profile a training step")
        return None
    if no_grad is True:
        raise ModelProfError("no_grad=True contradicts backward=True (the backward needs grad)")
    bad = [k for k in _NO_STEP_OPTIONS if options.get(k) not in (None, False)]
    if bad:
        raise ModelProfError(f"{bad[0]}={options[bad[0]]!r} is not supported with backward=True "
                             "(training steps are timed eagerly, inputs already on the device)")
    return StepSpec.parse(loss_fn=loss_fn, target=target, optimizer=optimizer)


_STEP_TIMER_OPTIONS = ("warmup", "warmup_s", "repeat", "precision", "budget_s", "min_samples",
                       "max_samples", "clock", "channels_last", "cold_cache")


def _step_timer_options(options: dict[str, Any]) -> dict[str, Any]:
    """The timing options that apply to a training step (the others were refused or do not
    apply), with ``amp`` parsed."""
    from .timing.modes import parse_amp

    picked = {k: v for k, v in options.items() if k in _STEP_TIMER_OPTIONS}
    picked["amp"] = parse_amp(options.get("amp"))
    return picked


def _merge_ops(into: dict[str, OpStats], more: dict[str, OpStats]) -> None:
    for name, stats in more.items():
        mine = into.get(name)
        if mine is None:
            into[name] = mine = OpStats()
        mine.calls += stats.calls
        mine.macs += stats.macs
        mine.flops += stats.flops
        mine.madd += stats.madd


def _peaks(roofline: Any, mi: ModelInputs, env: dict[str, Any]):
    """The peaks for the roofline columns, and both the probe and the table in ``env``."""
    import dataclasses

    from .roofline import Peaks, lookup_peaks, probe_peaks

    if isinstance(roofline, Peaks):
        peaks = roofline
    elif roofline in (None, True):
        peaks = probe_peaks(mi.device, mi.dtype)
    else:
        raise ModelProfError(f"roofline={roofline!r} must be None, True, False or a Peaks")
    table = lookup_peaks(str(env.get("device_name", "")), mi.dtype)
    env["roofline_peaks"] = dataclasses.asdict(peaks)
    env["roofline_table_peaks"] = dataclasses.asdict(table) if table is not None else None
    return peaks


def _measure(model: nn.Module, mi: ModelInputs, dtype: torch.dtype | None, training: bool,
             no_grad: bool, options: dict[str, Any]):
    """The clean end-to-end measurement, then the separate instrumented per-layer passes."""
    from .timing import measure_latency, time_layers

    if mi.device.type == "meta":
        raise ModelProfError("device='meta' has no clock: pass timing=False to analyse shapes "
                             "alone, or a real device to time")
    runner = moved_model(model, mi.device, dtype)
    if training:  # train-mode passes update buffers: time a copy, in train mode
        runner = copy.deepcopy(model) if runner is model else runner
        runner.train()
    call_inputs = mi.kwargs if mi.kwargs else mi.args
    latency = measure_latency(runner, call_inputs, batch_size=mi.batch_size,
                              eval_mode=not training, no_grad=no_grad, **options)
    layer_keys = set(inspect.signature(time_layers).parameters)
    layer_opts = {k: v for k, v in options.items() if k in layer_keys}
    layers = time_layers(runner, mi, eval_mode=not training, no_grad=no_grad, **layer_opts)
    return latency, layers


def _check_timing_options(options: dict[str, Any]) -> None:
    """Misspelt options fail loudly, also with timing=False (where they would do nothing)."""
    from .timing import measure_latency

    known = set(inspect.signature(measure_latency).parameters) - {
        "fn_or_model", "inputs", "input_size", "batch_size", "device", "dtype", "eval_mode",
        "no_grad"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ModelProfError(f"unknown option(s) {unknown}; profile() takes the timing options "
                             f"{sorted(known)}")


def _join_timing(rows: list[Row], records, latency, layers) -> tuple[float, float]:
    """Per-row median/std latency from the instrumented passes; a ``(self)`` row's time is its
    parent's minus its children's, pass by pass. Returns (overhead, coverage)."""
    samples = layers.samples
    total = float(np.median(layers.passes_ms))
    leaf_sum = 0.0
    for row in rows:
        record = records[row.record]
        s = samples.get(record.key)
        if s is None:
            continue
        if row.is_self:  # new arrays: the parent's samples stay as they are
            for c in record.children:
                child = samples.get(records[c].key)
                if child is not None:
                    s = s - child
            s = np.clip(s, 0.0, None)
        row.latency_ms = float(np.median(s))
        row.latency_std_ms = float(s.std(ddof=1)) if s.size > 1 else 0.0
        row.latency_pct = 100.0 * row.latency_ms / total if total > 0 else float("nan")
        if row.leaf:
            leaf_sum += row.latency_ms
    return layers.overhead(latency), leaf_sum / latency.median_ms
