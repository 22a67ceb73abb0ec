"""``profile``: static cost and measured time of a model, joined in one ``Report``."""
from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from modelprof.counting.counter import OpStats
from modelprof.runtime.env import collect_env
from modelprof.errors import ModelProfError
from modelprof.runtime.execution import to_channels_last
from modelprof.counting.formulas.registry import FormulaRegistry
from modelprof.runtime.inputs import ModelInputs, make_inputs, parse_dtype
from modelprof.runtime.placement import copy_model, moved_model
from modelprof.report.report import Report
from modelprof.runtime.guard import preserved_state
from modelprof.counting.forward import analyze
from modelprof.report.rows import Row, build_rows
from modelprof.timing.options import TimingOptions
from modelprof.errors import ModelProfWarning

__all__ = ["profile", "timing_runner"]


def profile(model: nn.Module, input_size: Any = None, *, inputs: Any = None,
            batch_size: int | None = None, device: torch.device | str | None = None,
            dtype: torch.dtype | str | None = None, timing: bool = True,
            training: bool | None = None, no_grad: bool | None = None, roofline: Any = None,
            registry: FormulaRegistry | None = None, options: TimingOptions | None = None,
            backward: bool = False, loss_fn: Any = None, target: Any = None,
            optimizer: Any = None, **timing_options: Any) -> Report:
    """Profile ``model`` on one input: one row per module call with shapes, params, MACs,
    FLOPs, MAdd and memory traffic, plus measured latency when ``timing`` is on.

    ``input_size`` excludes the batch (``(3, 224, 224)``); ``inputs=`` takes a tensor, a tuple
    of positional arguments or a dict of keyword arguments instead. ``device``/``dtype``
    default to the model's (``device="meta"`` analyses shapes alone, no memory or compute).
    The model runs in eval mode under ``torch.no_grad()`` unless ``training``/``no_grad`` say
    otherwise, and comes back exactly as it went in.

    ``roofline``: ``None`` (default) adds the roofline columns when timing, from a short
    measured probe of the device's peak FLOP/s and bandwidth; ``False`` skips it; a
    ``modelprof.timing.peaks.Peaks`` uses those peaks. Timing options (``options=TimingOptions(...)``
    or keywords: ``repeat``, ``warmup``, ``budget_s``, ``precision``, ``amp``, ``channels_last``,
    ``cuda_graph``, ``compile``...; see ``modelprof.timing.options``) are parsed once and apply to
    every pass: ``amp`` and ``channels_last`` to the counted forward too.

    ``backward=True`` profiles a training step (train mode unless ``training=False``, grad on):
    the loss (``loss_fn(output)`` or ``loss_fn(output, target)``; default the sum of the floating
    outputs), the backward — ``backward_macs``, ``backward_flops``, ``saved_bytes`` and the
    ``backward_latency_*`` columns, ``report.backward_latency`` — and, with ``optimizer=`` (a
    class, a factory ``lambda params: ...``, a name or an instance to copy the options of), the
    optimizer step as a row of its own. See ``modelprof.step.table``.
    """
    if not isinstance(model, nn.Module):
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module; "
                             "use measure_latency() to time any callable")
    if not isinstance(backward, bool):
        raise ModelProfError(f"backward={backward!r} must be True or False")
    if backward and no_grad is True:
        raise ModelProfError("no_grad=True contradicts backward=True (the backward needs grad)")
    training = backward if training is None else training
    no_grad = not backward if no_grad is None else no_grad
    for name, value in (("timing", timing), ("training", training), ("no_grad", no_grad)):
        if not isinstance(value, bool):
            raise ModelProfError(f"{name}={value!r} must be True or False")
    if registry is not None and not isinstance(registry, FormulaRegistry):
        raise ModelProfError(f"registry={registry!r} is not a modelprof FormulaRegistry")
    opts = TimingOptions.parse(options, **timing_options)
    step_spec = _step_spec(backward, loss_fn, target, optimizer, opts)
    dtype_requested = parse_dtype(dtype)
    # every parameter, buffer and attribute a pass changes is put back (modelprof/state.py);
    # inside a guard the caller holds, its view of the model is read again (it may be older)
    with preserved_state(model, rescan=True), contextlib.ExitStack() as rng_scope:
        mi = make_inputs(model, input_size, inputs=inputs, batch_size=batch_size, device=device,
                         dtype=dtype_requested)
        # the model's own random ops (train-mode dropout) in every pass, the static one
        # included, draw from forked generators: the user's random state comes back as it was
        rng_scope.enter_context(torch.random.fork_rng(
            devices=[mi.device] if mi.device.type == "cuda" else []))
        if timing:
            opts.check_device(mi.device)
        layout = torch.channels_last if opts.channels_last else None
        counted = _with_layout(mi, layout)
        step_cost = None
        if step_spec is not None:
            from modelprof.step.count import count_step
            static, step_cost = count_step(model, counted, step_spec, training=training,
                                           dtype_requested=dtype_requested, registry=registry,
                                           amp=opts.amp, memory_format=layout)
            static.unsupported.update(step_cost.unsupported)
            _merge_ops(static.by_op, step_cost.loss_by_op)
        else:
            static = analyze(model, counted, training=training, no_grad=no_grad,
                             dtype_requested=dtype_requested, registry=registry, amp=opts.amp,
                             memory_format=layout)
        if static.unsupported:
            ops = ", ".join(f"{k} ({v} call{'s' if v > 1 else ''})"
                            for k, v in sorted(static.unsupported.items()))
            warnings.warn(f"modelprof: {len(static.unsupported)} op type(s) have no formula and "
                          f"were counted as 0 FLOPs: {ops}. See Report.unsupported; add one with "
                          "modelprof.register_formula.", ModelProfWarning, stacklevel=2)
        rows = build_rows(static.records, step_cost.owning_calls if step_cost is not None else ())
        flags = {"training": training, "no_grad": no_grad,
                 **opts.flags(eval_mode=not training, no_grad=no_grad)}
        if step_spec is not None:
            flags.update(backward=True, loss=step_spec.loss_name, optimizer=step_spec.optimizer_name)
        latency = layers = overhead = coverage = peaks = training_step = None
        notes: list[str] = []
        if timing:
            latency, layers, notes = _measure(model, counted, dtype_requested, training,
                                              no_grad, opts)
            overhead, coverage = _join_timing(rows, static.records, latency, layers)
            _use_warm_peaks(rows, static.records, layers)
        if step_cost is not None:
            from modelprof.step.table import join_step
            step_timing = None
            if timing:
                from modelprof.step.timing import time_step
                step_timing = time_step(model, mi, step_spec, len(static.records),
                                        training=training, dtype=dtype_requested, options=opts)
            training_step = join_step(rows, static.records, step_cost, step_timing)
        env = collect_env(mi.device, opts.amp or mi.dtype, mi.batch_size, **flags)  # after timing
        if layers is not None and layers.hook_cost is not None:
            env["hook_cost"] = layers.hook_cost.to_dict()
        if roofline is not False and (timing or roofline not in (None, True)):
            peaks = _peaks(roofline, mi, env)
        return Report(rows, model_name=type(model).__name__, input_shape=mi.shapes(),
                      batch_size=mi.batch_size, device=str(mi.device),
                      dtype=str(mi.dtype).removeprefix("torch."), unsupported=static.unsupported,
                      by_op=static.by_op, model_params=static.model_params, env=env,
                      latency=latency, layer_timing=layers, instrumentation_overhead=overhead,
                      coverage=coverage, options={**flags, **opts.as_kwargs()}, peaks=peaks,
                      timing_notes=notes, training_step=training_step)


def _step_spec(backward: bool, loss_fn: Any, target: Any, optimizer: Any,
               opts: TimingOptions) -> Any:
    """The checked training-step options, or None with ``backward=False`` (then none is given)."""
    from modelprof.step.spec import StepSpec

    if not backward:
        given = [k for k, v in (("loss_fn", loss_fn), ("target", target),
                                ("optimizer", optimizer)) if v is not None]
        if given:
            raise ModelProfError(f"{', '.join(given)} given with backward=False; pass "
                                 "backward=True to profile a training step")
        return None
    if opts.end_to_end_only:
        raise ModelProfError(f"{opts.end_to_end_only[0]} is not supported with backward=True "
                             "(training steps are timed eagerly, inputs already on the device)")
    return StepSpec.parse(loss_fn=loss_fn, target=target, optimizer=optimizer)


def _merge_ops(into: dict[str, OpStats], more: dict[str, OpStats]) -> None:
    """Add the per-op counts ``more`` into ``into``."""
    for name, stats in more.items():
        mine = into.get(name)
        if mine is None:
            into[name] = mine = OpStats()
        mine.calls += stats.calls
        mine.macs += stats.macs
        mine.flops += stats.flops
        mine.madd += stats.madd


def _with_layout(mi: ModelInputs, layout: torch.memory_format | None) -> ModelInputs:
    """``mi`` with its 4-D tensors in ``layout`` (channels_last), or ``mi`` itself."""
    if layout is None:
        return mi
    return ModelInputs(to_channels_last(mi.args), to_channels_last(mi.kwargs), mi.device,
                       mi.dtype, mi.batch_size)


def _peaks(roofline: Any, mi: ModelInputs, env: dict[str, Any]):
    """The peaks for the roofline columns, and both the probe and the table in ``env``."""
    import dataclasses

    from modelprof.runtime.device import tf32_enabled
    from modelprof.timing.peaks import Peaks, conv_uses_other_precision, lookup_peaks, probe_peaks

    if isinstance(roofline, Peaks):
        peaks = roofline
    elif roofline in (None, True):
        peaks = probe_peaks(mi.device, mi.dtype)
    else:
        raise ModelProfError(f"roofline={roofline!r} must be None, True, False or a Peaks")
    name = str(mi.dtype).removeprefix("torch.")
    if name == "float32" and mi.device.type == "cuda" and tf32_enabled("matmul"):
        name = "tf32"
    table = lookup_peaks(str(env.get("device_name", "")), name,
                         conv_tf32=conv_uses_other_precision(mi.device, name))
    env["roofline_peaks"] = dataclasses.asdict(peaks)
    env["roofline_table_peaks"] = dataclasses.asdict(table) if table is not None else None
    return peaks


def timing_runner(model: nn.Module, mi: ModelInputs, dtype: torch.dtype | None, training: bool,
                  opts: TimingOptions) -> nn.Module:
    """What the timed passes call: the model itself, or a converted copy (device, dtype,
    channels_last), or in train mode a copy (train-mode passes update buffers)."""
    layout = torch.channels_last if opts.channels_last else None
    runner = moved_model(model, mi.device, dtype, memory_format=layout)
    if training:
        runner = copy_model(model, "time it in train mode") if runner is model else runner
        runner.train()
    return runner


def _measure(model: nn.Module, mi: ModelInputs, dtype: torch.dtype | None, training: bool,
             no_grad: bool, opts: TimingOptions) -> tuple[Any, Any, list[str]]:
    """The clean end-to-end measurement, then the separate instrumented per-layer passes, both
    under ``opts``; and the notes that say how the per-layer columns were measured."""
    from modelprof.timing import measure_latency, time_layers

    if mi.device.type == "meta":
        raise ModelProfError("device='meta' has no clock: pass timing=False to analyse shapes "
                             "alone, or a real device to time")
    runner = timing_runner(model, mi, dtype, training, opts)
    eager = getattr(runner, "_orig_mod", runner)   # a torch.compile'd module fires no hooks
    notes: list[str] = []
    hidden = list(opts.end_to_end_only)
    if eager is not runner:
        hidden.insert(0, "the model is torch.compile'd")
    if hidden:
        notes.append(f"per-layer times are of the eager model ({', '.join(hidden)} applies end "
                     "to end only: hooks cannot see inside it); the latency total is measured "
                     "with it, so coverage and overhead compare the two regimes")
    latency = measure_latency(runner, mi, eval_mode=not training, no_grad=no_grad, options=opts)
    layer_opts = opts.replace(compile=False, cuda_graph=False, transfer=False)
    layers = time_layers(eager, mi, eval_mode=not training, no_grad=no_grad, options=layer_opts)
    cost = layers.hook_cost
    if cost is not None and cost.applied:
        where = ("" if cost.source != "chain" else
                 f", measured on a chain of empty modules: {layers.n} passes of the model were "
                 "too few to measure it there")
        notes.append(f"per-layer times are corrected for the instrument's measured cost: "
                     f"{cost.per_call_ms * 1e3:.2f} us per hooked call{where} "
                     f"({cost.self_ms * 1e3:.2f} us of it inside the call's own span)")
    else:
        notes.append("per-layer times are as read (correct_overhead=False): they include the "
                     "instrument's own cost")
    if layers.undersampled:            # time_layers warned, naming n
        notes.append(f"the time budget allowed only {layers.n} per-layer pass"
                     f"{'es' if layers.n != 1 else ''} (min_samples={layers.min_samples}): "
                     "the per-layer medians rest on that many; raise budget_s")
    if layers.foreign_calls:
        # the static table ignores other threads' calls; the times cannot: they shared the device
        ran_elsewhere = (f"another thread called the model's modules {layers.foreign_calls} "
                         "times while its layers were timed: the latencies include that load")
        notes.append(ran_elsewhere)
        warnings.warn(f"modelprof: {ran_elsewhere}", ModelProfWarning, stacklevel=3)
    return latency, layers, notes


def _use_warm_peaks(rows: list[Row], records, layers) -> None:
    """Per-call allocator peaks from the warm memory pass (after timing) replace the cold ones of
    the static pass (which include autotuning and first-call workspace allocations)."""
    peaks = getattr(layers, "peak_memory_bytes", None)
    if not peaks:
        return
    for row in rows:
        value = peaks.get(records[row.record].key)
        if value is not None and not row.is_self:
            row.peak_memory_bytes = value


#: No clock modelprof reads resolves less than a nanosecond.
_RESOLUTION_MS = 1e-6


def _join_timing(rows: list[Row], records, latency, layers) -> tuple[float, float]:
    """Per-row median/std latency from the instrumented passes; a ``(self)`` row's time is its
    parent's minus its children's, pass by pass. Returns (overhead, coverage): instrumented over
    plain passes, and the leaf rows' sum over the plain pass (interleaved with the instrumented
    ones, so drift between the clean run and the per-layer passes does not enter)."""
    samples = layers.samples
    total = float(np.median(layers.corrected_passes_ms))
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
            # where the children were scaled to fit the parent (HookCost.correct), what is left
            # is rounding residue (~1e-16 ms), not a time: below any clock's resolution it is 0
            s = np.where(s >= _RESOLUTION_MS, s, 0.0)
        row.latency_ms = float(np.median(s))
        row.latency_std_ms = float(s.std(ddof=1)) if s.size > 1 else 0.0
        row.latency_pct = 100.0 * row.latency_ms / total if total > 0 else float("nan")
        if row.leaf:
            leaf_sum += row.latency_ms
    plain = layers.plain_ms
    reference = float(np.median(plain)) if plain is not None and plain.size else latency.median_ms
    return layers.overhead(latency), leaf_sum / reference
