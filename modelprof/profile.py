"""``profile``: static cost and measured time of a model, joined in one ``Report``."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections import Counter
from typing import Any

import torch
from torch import nn

from modelprof.counting.counter import OpStats
from modelprof.counting.formulas.registry import FormulaRegistry
from modelprof.counting.forward import analyze
from modelprof.distributed.session import contention_note, group_env, sharded_session
from modelprof.errors import (
    ModelProfError,
    ModelProfWarning,
    TimingDisagreementWarning,
    check_flag,
    warn_user,
)
from modelprof.render.views import ROUGH_MARK
from modelprof.report.memory import MemoryFacts, memory_facts
from modelprof.report.report import Counts, Report, RunInfo, TimingResult
from modelprof.report.rows import build_rows, join_rows, row_keys
from modelprof.runtime.compiled import compiled_words, eager_module, eager_view
from modelprof.runtime.device import tf32_enabled
from modelprof.runtime.env import collect_env, oversubscribed_note
from modelprof.runtime.execution import (
    RunMode,
    dispatch_modes_restored,
    random_kept,
    to_channels_last,
)
from modelprof.runtime.exported import check_recorded, exported_layers, is_flat_export, runnable
from modelprof.runtime.group import is_speaker, local_device
from modelprof.runtime.guard import preserved_state
from modelprof.runtime.inputs import ModelInputs, make_inputs, parse_input_size, refuses_call
from modelprof.runtime.snapshot import snapshot_of
from modelprof.runtime.tensors import brief, holds_tensors, iter_tensors, tensor_bytes
from modelprof.step.count import count_step
from modelprof.step.spec import (
    StepSpec,
    loss_module,
    refuse_eager_only,
    refuse_inference_mode,
    refuse_scripted,
)
from modelprof.step.table import step_columns
from modelprof.step.timing import time_step
from modelprof.timing import measure_latency, time_layers
from modelprof.timing.agreement import identical_spread, judge_agreement, judge_backward
from modelprof.timing.columns import layer_columns
from modelprof.timing.helps import helps_note
from modelprof.timing.helps import what_helps as time_what_helps
from modelprof.timing.kernels import KernelTiming, kernel_note, time_kernels
from modelprof.timing.latency import timing_runner
from modelprof.timing.layers import MIN_COST_PASSES
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import (
    TimingOptions,
    check_option_names,
    keyword_names,
    warn_unused_without_timing,
)
from modelprof.timing.peaks import (
    Peaks,
    conv_uses_other_precision,
    lookup_peaks,
    peak_dtype,
    probe_peaks,
    refuse_idle_amp,
)

__all__ = ["profile"]


def profile(
    model: nn.Module,
    input_size: Any = None,
    *,
    inputs: Any = None,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    timing: bool = True,
    training: bool | None = None,
    no_grad: bool | None = None,
    roofline: Any = None,
    registry: FormulaRegistry | None = None,
    options: TimingOptions | None = None,
    backward: bool = False,
    loss_fn: Any = None,
    target: Any = None,
    optimizer: Any = None,
    view: str = "rank",
    what_helps: bool = False,
    **timing_options: Any,
) -> Report:
    """Profile ``model`` on one input: one row per module call with shapes, params, MACs,
    FLOPs, MAdd and memory traffic, plus measured latency when ``timing`` is on.

    ``input_size`` excludes the batch (``(3, 224, 224)``); ``inputs=`` instead takes a tensor, a
    tuple of positional arguments, a dict of keyword arguments or ``(args, kwargs)`` (an
    ``ExportedProgram`` is profiled by its layers). ``device``/``dtype`` default to the model's
    (``device="meta"``: shapes alone). The model runs in eval mode under ``torch.no_grad()``
    unless ``training``/``no_grad`` say otherwise, and comes back exactly as it went in.

    ``roofline``: ``None`` adds the roofline columns when timing, from a short probe of the
    device's peaks; ``False`` skips them; a ``Peaks`` is used as given. Timing options
    (``options=TimingOptions(...)`` or keywords: ``repeat``, ``budget_s``, ``amp``,
    ``channels_last``, ``compile``...) apply to every pass, ``amp`` and ``channels_last`` to the
    counted forward too.

    ``backward=True`` profiles a training step (train mode unless ``training=False``): the loss
    (``loss_fn(output)`` or ``loss_fn(output, target)``; default the sum of the floating
    outputs), the backward (``backward_*`` and ``saved_bytes`` columns,
    ``report.backward_latency``) and, with ``optimizer=`` (a class, a factory
    ``lambda params: ...``, a name or an instance to copy the options of), the optimizer step
    as a row of its own.

    ``what_helps=True`` (CUDA) times a CUDA-graph replay and ``mode="reduce-overhead"``
    compile interleaved with eager; the ratios go to the notes and ``report.what_helps``.

    Under a process group (docs/distributed.md) every rank calls ``profile``; the table is this
    rank's (``view="rank"``: local shards) or the whole model's (``view="global"``), collectives
    in ``comm_*`` columns and ``(communication)`` rows; ``device="cuda"`` is
    ``cuda:LOCAL_RANK`` under torchrun.
    """
    # the clean runs time what was passed (a program: its flat module()), whatever the
    # per-layer passes run: an exported program unflattened into its layers, one row each
    clean = runnable(model) if timing else None
    program, model = model, exported_layers(model)
    spec = _parse(model, timing, registry, options, timing_options, what_helps)
    mode = RunMode.parse(  # how every pass runs the model, parsed once here
        backward=backward,
        training=training,
        no_grad=no_grad,
        amp=spec.opts.amp,
        channels_last=spec.opts.channels_last,
        dtype=dtype,
    )
    spec = dataclasses.replace(
        spec, mode=mode, step=_step_spec(backward, loss_fn, target, optimizer, spec.opts)
    )
    # every parameter, buffer and attribute a pass changes is put back (runtime/guard.py);
    # inside a guard the caller holds, its view of the model is read again (it may be older)
    with (
        dispatch_modes_restored(),
        preserved_state(model, rescan=True) as guard,
        preserved_state(None if clean is model else clean),  # a program's module(): its own
        contextlib.ExitStack() as rng_scope,
        sharded_session(model, view),  # the view, the agreed timing: read by the passes
    ):
        # a loss module comes back as the model does, the inputs and target by a snapshot
        rng_scope.enter_context(preserved_state(loss_module(loss_fn)))
        passed = rng_scope.enter_context(snapshot_of(inputs, target))
        mi = make_inputs(
            model,
            input_size,
            inputs=inputs,
            batch_size=batch_size,
            device=local_device(device),
            dtype=mode.dtype,
        )
        check_recorded(program, mi.args, mi.kwargs)  # before it runs: its guards name no input
        passed.add(mi.args, mi.kwargs)  # moved or made copies: each pass sees them as made
        if is_flat_export(model):  # ExportedProgram.module(): re-exported with its layers
            model = exported_layers(model, (mi.args, mi.kwargs))
            guard = rng_scope.enter_context(preserved_state(model, rescan=True))
        # the model's random ops (train-mode dropout) draw from forked generators in every pass
        rng_scope.enter_context(random_kept(mi.device))
        spec, meta_notes = _on(spec, mi, model)
        spec.check_device(mi.device)
        with _batch_hint(input_size, mi, model, inputs):
            static, step_cost = _count(model, mi, spec)
        meta_notes += _caught_note(static.caught) + _ungraded_note(step_cost)
        # the passes that follow see the inputs as the first one did (None: it changed none)
        mi.reset = passed.between_passes()
        rows = build_rows(static.records, step_cost.owning_calls if step_cost is not None else ())
        rows, timed, training_step = _timed_passes(
            model, model if clean is None else clean, mi, spec, rows, static, step_cost, guard
        )
        timed = _noted(
            timed, meta_notes, contention_note(model, mi.device) if spec.timing else None
        )
        run, timed = _run_info(model, mi, spec, timed, roofline)
        facts = _memory_facts(model, mi, spec, static, step_cost)
        counts = Counts(static.unsupported, static.by_op, static.model_params, facts, static.caught)
        return Report(rows, run, counts, timed, training_step)


def _memory_facts(
    model: nn.Module, mi: ModelInputs, spec: _Spec, static: Any, step_cost: Any
) -> MemoryFacts:
    """The report's memory facts; with a training step, what each record saved (the saved row
    leaves out the model's inputs, as the activations do) and the parameters it gave no
    gradient (the gradients row leaves them out, as the optimizer does)."""
    saved = None if step_cost is None else step_cost.saved_bytes
    return memory_facts(
        model,
        tensor_bytes((mi.args, mi.kwargs)),
        static.records,
        spec.mode.dtype,
        saved=saved,
        ungraded=set() if step_cost is None else set(step_cost.ungraded.values()),
    )


def _timed_passes(
    model: nn.Module,
    clean: nn.Module,
    mi: ModelInputs,
    spec: _Spec,
    rows: list,
    static: Any,
    step_cost: Any,
    guard: Any,
) -> tuple[list, Any, Any]:
    """The timed forwards and training steps: the rows with their columns joined, the timing
    result and the training step (``None`` without ``backward=True``). ``clean``: what the
    clean end-to-end runs time (``model`` but for an exported program's flat graph)."""
    if spec.timing:  # a write the guard cannot put back is named with its pass
        guard.begin("the timed forward passes")
    records = static.records
    timed, columns = _time(model, clean, mi, spec, rows, records)
    step_rows: list = []
    training_step = None
    if step_cost is not None:  # its columns, its (loss)/(optimizer) rows, the TrainingStep
        step_timing = None
        if spec.timing:
            guard.begin("the timed training steps")
            step_timing = time_step(
                model, mi, spec.step, len(records), spec.mode, options=spec.opts
            )
        keys = [(r, s) for r, s, _ in row_keys(rows)]
        step_cols, step_rows, training_step = step_columns(keys, records, step_cost, step_timing)
        columns.append(step_cols)
        if step_timing is not None:
            regimes = _regimes(model, spec.opts)
            timed.notes.extend(_compiled_step_note(model))
            if clean is not model:  # its layers: the per-layer backward passes need them
                timed.notes.append(_UNFLATTENED_STEP_NOTE)
            training_step.agreement = _judge_backward(step_timing, timed.notes, spec.opts, regimes)
    return join_rows(rows, columns, step_rows), timed, training_step


def _run_info(
    model: nn.Module, mi: ModelInputs, spec: _Spec, timed: Any, roofline: Any
) -> tuple[RunInfo, Any]:
    """The run as the report records it, and the timing result with the roofline's peaks."""
    env = collect_env(mi.device, spec.opts.amp or mi.dtype, mi.batch_size, **spec.flags)
    env.update(group_env())
    clock = (getattr(timed.latency, "env", None) or {}).get("mode", {}).get("clock")
    if clock is not None:  # the clock the runs read (clock="cpu": which CPU clock)
        env["mode"] = {"clock": clock, **env.get("mode", {})}
    layers = timed.layer_timing
    if layers is not None and layers.hook_cost is not None:
        env["hook_cost"] = layers.hook_cost.to_dict()
    if roofline is not False and (spec.timing or roofline not in (None, True)):
        timed = dataclasses.replace(timed, peaks=_peaks(roofline, mi, env, spec.opts.amp))
    run = RunInfo(
        type(eager_module(model)).__name__,  # torch.compile(m): m's class, not OptimizedModule
        mi.shapes(),
        mi.batch_size,
        str(mi.device),
        str(mi.dtype).removeprefix("torch."),
        env,
        {**spec.flags, **spec.opts.as_kwargs()},
    )
    return run, timed


def _on(spec: _Spec, mi: ModelInputs, model: nn.Module) -> tuple[_Spec, list[str]]:
    """``spec`` on the inputs' device (its training step's loss for them: ``labels`` make it
    the model's own), and the inputs' and the mode's notes; on meta nothing can be timed."""
    refuse_idle_amp(mi.dtype, spec.mode.amp)
    step = spec.step.for_inputs(mi.kwargs) if spec.step is not None else None
    spec = dataclasses.replace(spec, mode=spec.mode.on(mi.device), step=step)
    notes = list(mi.notes) + _held_in_eval(model, spec.mode.training)
    crowded = oversubscribed_note() if spec.timing and mi.device.type == "cpu" else None
    if spec.timing and mi.device.type == "cpu" and (spec.mode.amp or mi.dtype) == torch.float16:
        notes.append(_CPU_FLOAT16_NOTE)
    if not spec.timing or mi.device.type != "meta":
        return spec, notes + ([crowded] if crowded else [])
    return dataclasses.replace(spec, timing=False), [*notes, META_NOTE]


#: timing asked for on meta: what a report (and a comparison, by compare()) counts instead
META_NOTE = (
    "device='meta': counted from shapes alone, not timed (meta tensors have no "
    "values and run no kernels); pass a real device to time"
)


_CPU_FLOAT16_NOTE = (
    "float16 timed on the CPU: most CPUs have no float16 arithmetic, so torch runs slow "
    "fallback kernels (often many times float32's time); these times say nothing of float16 "
    "on a GPU: time it on the device it is meant for, or use float32 or bfloat16 here"
)


def _held_in_eval(model: nn.Module, training: bool) -> list[str]:
    """A note where train mode overrides submodules the model held in eval mode under a parent
    in train mode (frozen batch norms, a dropout switched off): the run uses batch statistics
    and dropout there. Its own ``train()`` that keeps them (as detection backbones do) holds."""
    if not training or not model.training:  # (before the walk: a static pass is in eval)
        return []
    if any(type(m).train is not nn.Module.train for m in model.modules()):
        return []  # it decides for itself
    held = [
        name
        for name, m in model.named_modules()
        if name and not m.training and model.get_submodule(name.rpartition(".")[0]).training
    ]
    if not held:
        return []
    more = f" and {len(held) - 3} more" if len(held) > 3 else ""
    return [
        f"train mode (training=True) was set on modules the model held in eval mode: "
        f"{', '.join(held[:3])}{more}, so their batch norms used batch statistics and their "
        "dropout was on; to keep them in eval mode, override the model's train() to leave them "
        "(it is called for every pass), or pass training=False for eval mode throughout"
    ]


def _too_many_dims(error: str, ranks: list[int]) -> bool:
    """Whether a forward's ``error`` reads as given more dimensions than it takes: a tensor of
    more than the most it names (conv2d's "Expected 3D (unbatched) or 4D (batched) input"), or
    a word of dimensions where it names none. A channel count or an image size that does not
    fit is no batch's doing, nor a size an exported program fixed (its guard's "Expected input
    at *args[0].shape[0] to be equal to 1 ... dynamic_shapes"); on meta (``fit``) a feature or
    channel count reads "a and b must have same reduction dim", "Invalid channel dimensions"."""
    if re.search(r"\.shape\[\d+\] to be equal to|reduction dim|channel dim", error):
        return False
    named = [int(n) for n in re.findall(r"\b(\d)D\b", error)]
    if named:
        return max(ranks, default=0) > max(named)
    return "dim" in error.lower()


def _one_list_for_many(error: ModelProfError, model: Any, mi: ModelInputs) -> bool:
    """The forward, given one list, wanted more positional arguments (a newcomer's
    ``profile(model, [x, y])`` for ``forward(x, y)``): its signature refuses the call, not code
    inside it."""
    if not (len(mi.args) == 1 and type(mi.args[0]) is list):
        return False
    if not isinstance(error.__cause__, TypeError):
        return False
    return refuses_call(model, *mi.args, **mi.kwargs)


def _read_unbatched(error: ModelProfError, mi: ModelInputs) -> bool:
    """A convolution took inputs made from a size one dimension short for an unbatched input:
    its message names the input it saw with a batch of 1 added in front ("expected
    input[1, 1, 3, 64] to have 3 channels" for a made 1x3x64)."""
    said = re.search(r"expected input\[1, ([\d, ]+)\] to have \d+ channels", str(error))
    if said is None or not getattr(error, "in_forward", False):
        return False
    seen = tuple(int(d) for d in said[1].split(", "))
    return any(tuple(t.shape) == seen for t in iter_tensors(mi.args))


def _one_short(error: ModelProfError, given: Any) -> bool:
    """A forward ``given`` tensors (not made from a size) refused them one dimension short
    (BatchNorm2d's "expected 4D input (got 3D input)"), as an unbatched sample is."""
    if given is None or not holds_tensors(given) or not getattr(error, "in_forward", False):
        return False
    said = re.search(r"expected (\d)D input \(got (\d)D input\)", str(error))
    if said is None or int(said[2]) != int(said[1]) - 1:
        return False
    return int(said[2]) in {t.dim() for t in iter_tensors(given)}  # a tensor as given


@contextlib.contextmanager
def _batch_hint(input_size: Any, mi: ModelInputs, model: Any, inputs: Any = None):
    """A forward failure on inputs made from ``input_size`` hints that it excludes the batch.
    Not a failure elsewhere (the loss, the optimizer), nor a ``TypeError`` (a forward called
    with the wrong arguments: no batch dimension fixes that); one list given where the forward's
    signature wants more arguments hints that a tuple holds them (:func:`_one_list_for_many`)."""
    try:
        yield
    except ModelProfError as e:
        if _one_list_for_many(e, model, mi):
            raise ModelProfError(
                f"{e}\nhint: a list is one argument (a detection model's list of images); "
                "pass positional arguments as a tuple: inputs=(x, y)"
            ) from e.__cause__
        if _one_short(e, input_size if inputs is None else inputs):
            raise ModelProfError(
                f"{e}\nhint: tensors given are used as they are, batch included: a single "
                "sample needs its batch dimension (x.unsqueeze(0), or x[None])"
            ) from e.__cause__
        shapes = (
            parse_input_size(input_size)
            if input_size is not None and not holds_tensors(input_size)
            else []
        )
        if shapes and _read_unbatched(e, mi):
            short = ModelProfError(
                f"{e}\nhint: input_size holds every dimension but the batch: "
                f"{brief(input_size)} gave the model {mi.shapes()}, which the convolution read "
                "as one unbatched input (a dimension short): pass every dimension but the "
                "batch (an image's (channels, height, width), e.g. (3, 224, 224))"
            )
            short.unbatched = mi.shapes()  # the command line words it for --input-size
            raise short from e.__cause__
        if (
            not any(len(s) >= 2 for s in shapes)
            or not getattr(e, "in_forward", False)
            or isinstance(e.__cause__, (ModelProfError, TypeError))
            or not _too_many_dims(str(e), [t.dim() for t in iter_tensors(mi.args)])
        ):
            raise
        drop = ", ".join(str(tuple(s[1:])) for s in shapes)
        hinted = ModelProfError(
            f"{e}\nhint: input_size excludes the batch dimension: {brief(input_size)} gave the "
            f"model {mi.shapes()}; if its first dimension is the batch, pass {drop} (and "
            f"batch_size={shapes[0][0]})"
        )
        hinted.batch_hint = shapes  # the command line words it for --input-size
        raise hinted from e.__cause__


@dataclasses.dataclass(frozen=True)
class _Spec:
    """profile()'s switches, checked once."""

    timing: bool
    registry: FormulaRegistry | None
    opts: TimingOptions
    mode: RunMode = RunMode()
    step: Any = None  # StepSpec, or None without backward
    what_helps: bool = False  # on CUDA: eager vs CUDA graph vs compile, interleaved

    def check_device(self, device: torch.device) -> None:
        """Refuse options the device cannot run (``what_helps``: a timed run on CUDA)."""
        if self.timing:
            self.opts.check_device(device)
        if self.what_helps and (device.type != "cuda" or not self.timing):
            raise ModelProfError(
                f"what_helps=True needs a timed run on a CUDA device (device {device}, "
                f"timing={self.timing}): it times the forward replayed from a CUDA graph and "
                "compiled against eager"
            )

    @property
    def flags(self) -> dict[str, Any]:
        """The switches as the report's run info and env name them."""
        mode = self.mode
        flags = {
            "training": mode.training,
            "no_grad": mode.no_grad,
            **self.opts.flags(eval_mode=not mode.training, no_grad=mode.no_grad),
        }
        if self.step is not None:
            flags.update(
                backward=True, loss=self.step.loss_name, optimizer=self.step.optimizer_name
            )
        return flags


#: profile()'s own keywords, for the nearest-name hint of a misspelt one (compare's too)
PROFILE_KEYWORDS = keyword_names(profile)


def _parse(
    model: Any, timing: Any, registry: Any, options: Any, timing_options: dict, what_helps: Any
) -> _Spec:
    if isinstance(model, str):  # compare() and the command line take names; profile a module
        raise ModelProfError(
            f"model={model!r} is a name, not a torch.nn.Module: build it first "
            f"(modelprof.models.load_model({model!r})[0] builds a name compare() and the "
            "command line take)"
        )
    if not isinstance(model, nn.Module):
        raise ModelProfError(
            f"model={type(model).__name__} is not a torch.nn.Module; "
            "use measure_latency() to time any callable"
        )
    check_flag("timing", timing)
    if registry is not None and not isinstance(registry, FormulaRegistry):
        raise ModelProfError(f"registry={registry!r} is not a modelprof FormulaRegistry")
    check_option_names(timing_options, own=PROFILE_KEYWORDS)
    opts = TimingOptions.parse(options, **timing_options)
    if not timing:
        warn_unused_without_timing(timing_options)
    if opts.progress and not is_speaker():  # one voice: rank 0's progress bars only
        opts = opts.replace(progress=False)
    return _Spec(timing, registry, opts, what_helps=check_flag("what_helps", what_helps))


def _count(model: nn.Module, mi: ModelInputs, spec: _Spec) -> tuple:
    """The counted forward and, with ``backward=True``, step: (static, step cost)."""
    counted = mi  # (channels_last: its 4-D tensors in that layout)
    if spec.mode.memory_format is not None:
        counted = dataclasses.replace(
            mi, args=to_channels_last(mi.args), kwargs=to_channels_last(mi.kwargs)
        )
    step_cost = None
    if spec.step is not None:
        refuse_scripted(model)  # before anything of the step runs
        static, step_cost = count_step(model, counted, spec.step, spec.mode, spec.registry)
        static.unsupported.update(step_cost.unsupported)
        _merge_ops(static.by_op, step_cost.loss_by_op)
    else:
        static = analyze(model, counted, spec.mode, spec.registry)
    if static.unsupported:
        ops = ", ".join(
            f"{k} ({v} call{'s' if v > 1 else ''})" for k, v in sorted(static.unsupported.items())
        )
        warn_user(
            f"modelprof: {len(static.unsupported)} op type(s) have no formula and "
            f"were counted as 0 FLOPs: {ops}. See Report.unsupported; add one with "
            "modelprof.register_formula.",
            ModelProfWarning,
        )
    outside = list(
        dict.fromkeys(f"{r.name or '(root)'} ({r.type})" for r in static.records if r.outside)
    )
    if outside:
        many = len(outside) > 1
        warn_user(
            f"modelprof: module{'s' * many} {', '.join(outside)} ran no op modelprof counts "
            "and returned a tensor that is none of its inputs, parameters or buffers (nor a view "
            "of them): work done outside torch (numpy, a C extension) is not counted (MACs and "
            "FLOPs read 0 there)",
            ModelProfWarning,
        )
    return static, step_cost


def _time(
    model: nn.Module, clean: nn.Module, mi: ModelInputs, spec: _Spec, rows: list, records: Any
) -> tuple[TimingResult, list]:
    """The timed passes and the per-layer columns they give (none without timing): the
    per-layer passes of ``model``, the clean runs of ``clean``."""
    if not spec.timing:
        return TimingResult(), []
    latency, layers, notes = _measure(model, clean, mi, spec.mode, spec.opts)
    pipelined = _pipelined(clean, mi, spec.mode, spec.opts)
    helps = None
    if spec.what_helps:
        helps, left_out = time_what_helps(
            timing_runner(clean, mi, spec.mode, spec.opts), mi, spec.mode, spec.opts
        )
        notes.append(helps_note(helps, left_out))
    columns, overhead, leaf_sum = layer_columns(row_keys(rows), records, latency, layers)
    coverage = leaf_sum / latency.median_ms if latency.median_ms > 0 else float("nan")
    agreement = None
    if not (isinstance(layers, KernelTiming) and layers.gpu):
        # (kernel time on a GPU is not wall time: its busy share is in the notes instead)
        total = float(layers.corrected.median_ms)
        spread = identical_spread(rows, [c.get("latency_ms") for c in columns], total)
        regimes = _regimes(clean, spec.opts, flat=clean is not model)
        # the (root) row's median: the per-layer figure the check may say to quote
        root = next((c for r, c in zip(rows, columns) if r.module == "" and r.depth == 0), {})
        agreement = judge_agreement(
            latency,
            layers.corrected,
            leaf_sum,
            regimes=regimes,
            identical=spread,
            root_ms=root.get("latency_ms"),
        )
        _say_disagreement(agreement, notes, warn=spec.opts.warn)
    timed = TimingResult(
        latency, layers, overhead, coverage, None, notes, agreement, pipelined, helps
    )
    return timed, [columns]


#: the longest the pipelined measurement beside the latency may sample (s)
PIPELINED_BUDGET_S = 2.0


def _pipelined(model: nn.Module, mi: ModelInputs, mode: RunMode, opts: TimingOptions) -> Any:
    """On CUDA (without transfers), the time per call of a full stream beside the latency;
    None elsewhere (on the CPU it is the latency)."""
    if mi.device.type != "cuda" or opts.transfer or opts.latency_mode == "pipelined":
        return None
    if mi.reset is not None or opts.cold_cache:  # something must run between its calls
        return None
    budget = min(opts.stop.budget_s, PIPELINED_BUDGET_S)
    return measure_latency(
        timing_runner(model, mi, mode, opts),
        mi,
        training=mode.training,
        no_grad=mode.no_grad,
        options=opts.replace(latency_mode="pipelined", budget_s=budget, warn=False),
    )


def _regimes(model: nn.Module, opts: TimingOptions, flat: bool = False) -> str:
    """The modes the clean runs use and the per-layer passes cannot (empty when none);
    ``flat``: the clean runs time an exported program's flat graph, the passes its layers."""
    hidden = list(opts.end_to_end_only)
    if compiled_words(model) is not None:
        hidden.insert(0, "torch.compile")
    if flat:
        hidden.insert(0, _FLAT_GRAPH)
    return ", ".join(hidden)


def _compiled_step_note(model: nn.Module) -> list[str]:
    """Of a compiled model's training step: the clean steps ran it compiled, the rows eager."""
    words = compiled_words(model)
    if words is None:
        return []
    return [
        f"per-layer backward times are of the eager model ({words}: the clean training steps "
        "run its compiled forward and backward, which hooks cannot see inside); the step's "
        "phase medians are the compiled model's"
    ]


def _say_disagreement(agreement: Any, notes: list[str], warn: bool) -> None:
    """A disagreement (of the per-layer window with the clean runs, or with itself) as a note
    and, with ``warn``, a warning naming the figure to quote."""
    if not agreement.agree:
        notes.append(agreement.note())
        if warn:
            warn_user(f"modelprof: {agreement.note()}", TimingDisagreementWarning)


def _judge_backward(timing: Any, notes: list[str], opts: Any, regimes: str = "") -> Any:
    """Whether the instrumented backward passes (the rows' backward times, their stamps' cost
    taken off where it was) agree with the clean backward; when not, a note and (``warn``) a
    warning, as the forward's window check; where the per-node stamps explain the difference,
    the note alone. The stamps' cost, taken off or not, is said in a note. ``regimes``: the
    modes only the clean steps run in (a ``torch.compile``'d model's)."""
    cost = timing.stamp_cost
    corrected = cost is not None and cost.applied
    if cost is not None:
        notes.append(_stamp_note(cost, timing.nodes, off=not opts.correct_overhead))
    plain = Measurement(timing.plain_ms) if timing.plain_ms is not None else None
    agreement = judge_backward(
        timing.backward, timing.passes, timing.nodes, corrected, timing.rows_ms, plain, regimes
    )
    _say_disagreement(agreement, notes, warn=opts.warn and agreement.alarming)
    return agreement


def _stamp_note(cost: Any, nodes: int, off: bool) -> str:
    """The backward rows' correction for their stamps (or why there is none: ``off``, asked
    not to correct), in words."""
    if not cost.applied:
        why = "correct_overhead=False" if off else "it lies within the pass pairs' noise"
        return (
            f"per-layer backward times include their stamps: the stamps' measured cost, "
            f"{cost.per_call_ms * 1e3:.2f} us per stamp on each of {nodes} autograd nodes, "
            f"was not taken off ({why}); read the rows by their backward latency share"
        )
    bound = (
        ", at most the cheapest stretch between two stamps (the pass pairs read more: an "
        "instrumented pass waited longer, as under load)"
        if cost.capped
        else ""
    )
    return (
        f"per-layer backward times are corrected for the stamps' measured cost: "
        f"{cost.per_call_ms * 1e3:.2f} us per stamp on each of {nodes} autograd nodes (each "
        f"instrumented backward against a plain one beside it){bound}"
    )


def _caught_note(caught: tuple[str, ...]) -> list[str]:
    """On meta, ops that raised and that the forward caught: one warning and a note."""
    if not caught:
        return []
    note = (
        f"on device='meta', {len(caught)} op(s) raised and the model's forward caught them "
        f"({caught[0]}{'; ...' if len(caught) > 1 else ''}): it took another branch than a real "
        "device takes, so these counts may differ from the CPU's; count on device='cpu' for "
        "the branch that runs"
    )
    warn_user(f"modelprof: {note}", ModelProfWarning)
    return [note]


def _ungraded_note(step_cost: Any) -> list[str]:
    """A training step's trainable parameters its backward gave no gradient, named."""
    names = () if step_cost is None else tuple(step_cost.ungraded)
    if not names:
        return []
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return [
        f"{len(names)} trainable parameter(s) got no gradient in the step ({shown}): the loss "
        "does not reach them (a module the forward did not use, a detached branch, a reentrant "
        "checkpoint whose inputs need no grad), so the optimizer is counted without them"
    ]


def _noted(timed: Any, before: list[str], after: str | None) -> Any:
    """``timed`` with notes ``before`` its own and ``after`` them (where there are any)."""
    if not before and after is None:
        return timed
    return dataclasses.replace(
        timed, notes=[*before, *timed.notes, *([after] if after is not None else [])]
    )


def _step_spec(
    backward: bool, loss_fn: Any, target: Any, optimizer: Any, opts: TimingOptions
) -> Any:
    """The checked training-step options, or None with ``backward=False``."""
    if not backward:
        given = [
            k
            for k, v in (("loss_fn", loss_fn), ("target", target), ("optimizer", optimizer))
            if v is not None
        ]
        if given:
            raise ModelProfError(
                f"{', '.join(given)} given with backward=False; pass "
                "backward=True to profile a training step"
            )
        return None
    refuse_eager_only(opts)
    refuse_inference_mode("profile()")
    return StepSpec.parse(loss_fn=loss_fn, target=target, optimizer=optimizer)


def _merge_ops(into: dict[str, OpStats], more: dict[str, OpStats]) -> None:
    for name, stats in more.items():
        mine = into.setdefault(name, OpStats())
        for total in ("calls", "macs", "flops", "madd"):
            setattr(mine, total, getattr(mine, total) + getattr(stats, total))
        if stats.notes:  # the loss's inexact calls count as the model's do
            mine.notes = (mine.notes or Counter()) + stats.notes


def _peaks(roofline: Any, mi: ModelInputs, env: dict[str, Any], amp: Any = None):
    """The peaks for the roofline columns, and both the probe and the table in ``env``: of the
    dtype the matmuls ran in (``peak_dtype``: ``amp``'s under autocast, else the inputs')."""
    if isinstance(roofline, Peaks):
        peaks = roofline
    elif roofline in (None, True):
        peaks = probe_peaks(mi.device, peak_dtype(mi.dtype, amp))
    else:
        raise ModelProfError(f"roofline={roofline!r} must be None, True, False or a Peaks")
    tf32 = mi.device.type == "cuda" and tf32_enabled("matmul")
    name = peak_dtype(mi.dtype, amp, tf32=tf32)
    try:
        table = lookup_peaks(
            str(env.get("device_name", "")),
            name,
            conv_tf32=conv_uses_other_precision(mi.device, name),
        )
    except ModelProfError:  # a name torch reports that fits several variants: none assumed
        table = None
    env["roofline_peaks"] = dataclasses.asdict(peaks)
    env["roofline_table_peaks"] = dataclasses.asdict(table) if table is not None else None
    return peaks


def _measure(
    model: nn.Module, clean: nn.Module, mi: ModelInputs, mode: RunMode, opts: TimingOptions
) -> tuple[Any, Any, list[str]]:
    """The clean end-to-end measurement (of ``clean``), the instrumented per-layer passes (of
    ``model``), and the notes on how the per-layer columns were measured."""
    runner = timing_runner(clean, mi, mode, opts)
    notes: list[str] = []
    hidden = list(opts.end_to_end_only)
    compiled = compiled_words(runner)  # a compiled model fires no hooks inside its graph
    if compiled is not None:
        hidden.insert(0, compiled)
    if hidden:
        notes.append(
            f"per-layer times are of the eager model ({', '.join(hidden)} applies end "
            "to end only: hooks cannot see inside it); the latency total is measured "
            "with it, so coverage and overhead compare the two regimes"
        )
    layered = runner
    if clean is not model:  # an exported program's flat graph: its layers are ``model``'s
        layered = timing_runner(model, mi, mode, opts)
        notes.insert(0, _UNFLATTENED_NOTE)
    latency = measure_latency(
        runner, mi, training=mode.training, no_grad=mode.no_grad, options=opts
    )
    layer_opts = opts.replace(
        compile=False, cuda_graph=False, transfer=False, latency_mode="latency"
    )
    instrument = time_kernels if opts.layer_instrument(mi.device) == "kernels" else time_layers
    with eager_view(layered) as eager:
        layers = instrument(
            eager, mi, training=mode.training, no_grad=mode.no_grad, options=layer_opts
        )
    if instrument is time_kernels:
        notes.append(kernel_note(layers, latency))
        return latency, layers, notes
    notes.append(_hook_cost_note(layers))
    if layers.extended_s > 0:
        notes.append(
            f"the per-layer passes were extended by {layers.extended_s:.3g} s (at most "
            f"layer_extend_s={opts.layer_extend_s:g} s) after the time budget stopped "
            f"them below min_samples={layers.min_samples}; they rest on {layers.n}"
        )
    if layers.undersampled:  # time_layers warned, naming n
        notes.append(
            f"the time budget allowed only {layers.n} per-layer pass"
            f"{'es' if layers.n != 1 else ''} (min_samples={layers.min_samples}"
            f"{', after extending' if layers.extended_s > 0 else ''}): the per-layer "
            f"medians rest on that many and are marked rough ({ROUGH_MARK}, greyed) in "
            "every view; raise budget_s or layer_extend_s"
        )
    return latency, layers, notes


#: how the clean runs of an exported program's flat graph differ from its per-layer passes
_FLAT_GRAPH = "the exported program's flat graph"
_UNFLATTENED_NOTE = (
    "the per-layer passes ran the exported program unflattened (torch.export.unflatten: one "
    "module per layer, which can run slower than the flat graph); the clean end-to-end runs "
    "(latency, throughput) timed the flat graph as passed (an ExportedProgram's module()), "
    "so the per-layer rows and their sum may differ from the end-to-end latency"
)
_UNFLATTENED_STEP_NOTE = (
    "the timed training steps (the step's phases and the backward rows) ran the exported "
    "program unflattened, as the per-layer passes did, not the flat graph passed: the step's "
    "forward phase may differ from the forward latency of the flat graph"
)


def _hook_cost_note(layers: Any) -> str:
    """What the per-layer rows were corrected by, and where that cost was measured."""
    cost = layers.hook_cost
    if cost is None or not cost.applied:
        return (
            "per-layer times are as read (correct_overhead=False): they include the "
            "instrument's own cost"
        )
    where = ""
    if cost.source == "chain":
        why = (
            f"{layers.n} passes of the model were too few to measure it there"
            if layers.n < MIN_COST_PASSES
            else "the model's passes read nothing, and a hooked call costs no less in a model"
        )
        where = f", measured on a chain of empty modules: {why}"
        if cost.capped:
            where += "; at most what the passes' time outside the spans holds (the chain read more)"
    elif cost.capped:
        where = (
            ", at most what the passes' time outside the leaves' spans (and the cheapest "
            "parent's outside its children's) holds and a hooked call's cost on a chain of "
            "empty modules inside a span (the pass pairs read more: an instrumented pass "
            "waited longer inside its ops, as under load)"
        )
    return (
        f"per-layer times are corrected for the instrument's measured cost: "
        f"{cost.per_call_ms * 1e3:.2f} us per hooked call{where} "
        f"({cost.self_ms * 1e3:.2f} us of it inside the call's own span)"
    )
