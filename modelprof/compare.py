"""Several architectures side by side: one row per model with its totals, its timing and its
ratios to a baseline, all measured with one shared device, dtype and batch size.

The result is a pandas DataFrame (numeric, units in the column names); its notebook view and the
``modelprof.render`` exporters humanise the numbers, ``modelprof.report.plots.plot_compare`` draws them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

import modelprof.columns as registry
from modelprof.errors import (
    ModelProfError,
    ModelProfWarning,
    check_callback,
    check_int,
    nearest_keywords,
    warn_user,
)
from modelprof.models import load_model
from modelprof.profile import META_NOTE, PROFILE_KEYWORDS, profile
from modelprof.report.comparison import (
    Comparison,
    every_model_failed,
    note_failed,
    warn_failed,
)
from modelprof.report.report import display_name
from modelprof.report.rows import ADDITIVE, STEP_ADDITIVE, totals_of
from modelprof.runtime.agree import agreed_timing
from modelprof.runtime.compiled import eager_module
from modelprof.runtime.execution import RunMode, random_kept
from modelprof.runtime.guard import preserved_state
from modelprof.runtime.inputs import (
    inputs_in_size_place,
    make_inputs,
    parse_device,
    parse_input_size,
    reads_token_ids,
    token_inputs,
)
from modelprof.runtime.names import unique_name
from modelprof.runtime.progress import progress_bar
from modelprof.runtime.snapshot import Snapshot, snapshot_of
from modelprof.runtime.tensors import iter_tensors, shape_str
from modelprof.step.spec import StepSpec, loss_module, refuse_eager_only, refuse_inference_mode
from modelprof.step.throughput import step_measure
from modelprof.step.timing import StepTimer, compare_steps
from modelprof.timing import measure_throughput
from modelprof.timing.agreement import RatioAgreement, judge_ratio
from modelprof.timing.interleave import (
    Candidate,
    cpu_work_columns,
    cpu_work_note,
    disagreeing,
    floor_notes,
    interval_columns,
    loaded_latency_notes,
    measure_interleaved,
    rough_flags,
    round_ratio,
    shaken_attrs,
    tied_ranks,
    unranked_note,
)
from modelprof.timing.latency import resolve_call, timing_runner
from modelprof.timing.measurement import load_note, quieter_machine
from modelprof.timing.options import (
    OPTION_NAMES,
    TimingOptions,
    check_option_names,
    keyword_names,
    warn_unused_without_timing,
)
from modelprof.timing.peaks import refuse_idle_amp
from modelprof.timing.stats import RATIO_ESTIMATOR
from modelprof.timing.throughput import POINT_DEFAULTS, check_search_bounds

__all__ = ["Comparison", "compare", "unique_name"]

# a model's counted totals, without the trainable/frozen split of its parameters; a training
# comparison's whole step (_training_totals)
_TOTAL_COLUMNS = (
    *(c for c in ADDITIVE + STEP_ADDITIVE if c not in ("trainable_params", "frozen_params")),
    "step_flops",
)
# ratio column -> the column it divides by the baseline's value
_RATIOS = {
    "params_x": "params",
    "macs_x": "macs",
    "flops_x": "flops",
    "output_bytes_x": "output_bytes",
    "latency_x": "latency_median_ms",
    "backward_flops_x": "backward_flops",
    "step_flops_x": "step_flops",
    "throughput_x": "throughput_samples_per_s",
}
#: the ratios of timed columns, not stated where a model is undersampled (no interval)
_TIMED_RATIOS = tuple(
    f"{r}{end}" for r in ("latency_x", "cpu_work_x") for end in ("", "_ci_low", "_ci_high")
)


def compare(
    models: Mapping[str, nn.Module | str] | Sequence[nn.Module | str],
    input_size: Any = None,
    *,
    baseline: str | None = None,
    inputs: Any = None,
    tokens: int | None = None,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    timing: bool = True,
    throughput: bool = False,
    throughput_options: TimingOptions | Mapping[str, Any] | None = None,
    on_step: Callable[[str], None] | None = None,
    **profile_options: Any,
) -> Comparison:
    """Profile every model the same way; return one row per model (index: its name).

    ``models`` maps names to modules, or lists modules (named by class) or specs such as
    ``"resnet18"`` (built by :func:`modelprof.models.load_model`, named by the spec); an
    ``ExportedProgram`` is counted as :func:`modelprof.profile` counts it and timed as its
    ``module()`` (what running it means).
    ``input_size`` (batch excluded) is one shape for all, a mapping ``name -> shape``, or
    ``None``: each spec then runs at its own evaluation size (inception_v3 at 299), recorded in
    ``input_shape``; tensors there are the inputs, as in :func:`modelprof.profile`
    (``compare(models, x)``). ``inputs`` is one set of inputs for all, or a mapping ``name ->
    inputs`` (a dict whose keys name no model, nor nearly, is one set of keyword inputs);
    ``tokens=N`` feeds token ids of length N (:func:`modelprof.token_inputs`, at ``batch_size``)
    to each model that reads them (``main_input_name == "input_ids"``, else an ``nn.Embedding``),
    as the command line's ``--tokens``. A model's own entry in either mapping comes first, then
    ``tokens``, the shared inputs or size, a spec's own size; a key naming no model, or a model
    left with no input, is refused naming it. So a vision and a text model share one table:
    ``compare({"resnet18": r, "bert": b}, {"resnet18": (3, 224, 224)}, tokens=128)``. Each
    row is its model at its own input (``input_shape``: ``1x128, 1x128 (int64)`` for ids and
    mask); where they differ a note says that its ``fps`` and samples/s count its own samples
    (an image, a sequence) and each ratio sets its run beside the baseline's at the baseline's
    input. ``baseline`` (default: the first model) is the row the ``*_x`` ratios
    divide by: ``macs_x = macs / baseline macs``.

    Columns: the report totals (``params, macs, flops, madd, output_bytes, read_bytes,
    write_bytes``); ``device`` and ``dtype`` (``float32 under bfloat16 autocast``) where the
    models' differ (the caption names them where all agree); with ``timing``,
    ``latency_median_ms`` with its 95 % interval (``latency_ci_low_ms``,
    ``latency_ci_high_ms``; NaN from a single block), ``latency_p90_ms,
    latency_std_ms, fps, latency_stable`` (None where it cannot be judged), ``latency_n``,
    ``latency_rough`` (its wall clock no figure to quote: loaded or too few runs, as a
    report's end-to-end row is judged; marked ``~``, ``attrs["unquotable"]`` says why); on
    the CPU ``cpu_work_median_ms`` with its interval, ``cpu_work_x`` with its interval,
    ``wall_over_cpu`` and ``loaded`` (``Measurement.loaded``); ``rank`` (1 = fastest, by
    ``attrs["ranked_by"]``); with ``throughput``
    ``throughput_samples_per_s, throughput_batch_size`` and
    ``throughput_samples_per_s_rough`` (its best point loaded or slower than a bigger batch,
    ``attrs["rough_throughput"]``; ``throughput_x_rough`` a ratio with such a side)
    (``measure_throughput``; with
    ``backward=True`` whole training steps per second, a ``target``'s rows repeated to each
    batch size; ``throughput_options``: a ``TimingOptions`` for every batch size, or a dict of
    timing options and the search bounds ``max_batch``/``gain``/``patience``; a search whose
    model fails to run leaves them NaN, its error in a note); then the ratios. With
    ``backward=True`` the counts are the model's forward alone (the report's ``(loss)`` and
    ``(optimizer)`` rows left out), ``backward_macs, backward_flops, saved_bytes`` its
    backward's (the loss's included) and ``step_flops`` (``step_flops_x``) the whole step's,
    ``totals["flops"] + totals["backward_flops"]`` of its report; the latency columns, ``fps`` and ``rank`` time the forward alone, the
    ``backward_latency_*`` and ``step_latency_*`` columns (a paired ``step_latency_x``) and
    ``step_rank`` (by ``attrs["step_ranked_by"]``) the training step (a note says so), each
    median flagged as the forward's is (``backward_latency_rough``, ``step_latency_rough``,
    ``optimizer_latency_rough``: its own runs loaded or too few; ``~``,
    ``attrs["unquotable_step"]`` says why); on the
    CPU ``backward_cpu_work_*`` its backward's CPU work, which a note tells to read where the
    machine was loaded (``attrs["backward_by"] == "cpu_work"``). Whole numbers (the counts,
    ``rank``) are int64, nullable Int64 where a row has none (a failed or an unranked model:
    ``<NA>``), ``latency_n`` Int64 always; its ``error`` is NaN where the model ran.

    The models are timed *interleaved*: after each one's warm-up, rounds take one block of
    every model in a shuffled order, so drift of the machine reaches all alike. ``latency_x``
    is the ratio of medians (ratios rank as the medians do), with a paired interval from the
    per-round ratios of block medians (``latency_x_ci_low``/``_high``; ``attrs["ratio_estimator"]``
    in words). ``rank`` follows the CPU work (``attrs["ranked_by"] == "cpu_work"``, why in
    ``attrs["ranked_by_why"]`` and ``attrs["notes"]``) where it is one thread's
    (``Measurement.cpu_holds``) on a loaded CPU (``Measurement.loaded``), or where a
    ``latency_x`` disagrees with its rounds while every ``cpu_work_x`` agrees; CPU work equals
    latency only for a single-threaded model on an idle core. A ratio
    of medians outside its rounds' interval and further than ``AGREEMENT_TOLERANCE`` from their
    centre (``timing.agreement.judge_ratio``) is flagged in ``latency_x_rough``
    (``cpu_work_x_rough``, ``backward_latency_x_rough``, ...), a note and a
    ``TimingDisagreementWarning``; where the table ranks by it, no model is ranked
    (``attrs["ratios_disagree"]``). ``budget_s`` is per model. ``attrs["env"]``: the
    environment, ``attrs["baseline"]``: the baseline's name. Other keywords are timing options
    (``modelprof.timing.options``) or go to :func:`modelprof.profile`. ``on_step`` is called
    with a line as each model is profiled and when the interleaved timing ends.
    """
    _refuse_unbuilt(profile_options, device, throughput)
    if check_callback("on_step", on_step) is None:
        on_step = _say_nothing
    named, programs = _name_models(models)
    if not timing and not throughput:
        warn_unused_without_timing(profile_options)
    run = _Run(batch_size, device, dtype, profile_options, programs)
    sizes = _input_sizes(named, input_size, inputs, tokens, run)
    if baseline is None:
        baseline = next(iter(named))
    elif baseline not in named:
        raise ModelProfError(f"baseline={baseline!r} is not one of the models: {list(named)}")
    if run.backward:
        refuse_inference_mode("compare()")
    search = _throughput_search(throughput_options, run) if throughput else None
    rows: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}  # a model that failed: its error, in its row
    bar = progress_bar(
        len(named) + (1 if timing else 0), enabled=run.opts.progress, desc="compare", unit="model"
    )
    held = contextlib.ExitStack()
    try:
        # under torchrun: the ranks agree every timing decision (sharded models), one speaks
        held.enter_context(agreed_timing(list(named.values())))
        run.passed = _hold(held, named, run)
        for name, model in named.items():
            bar.set_description(name)
            try:
                rows[name] = run.add(name, model, sizes[name], timing, search)
            except ModelProfError as e:
                run.forget(name)
                failed[name] = str(e)
            bar.update(1)
            said = "failed" if name in failed else "profiled"
            on_step(f"{name}: {said} ({len(rows) + len(failed)} of {len(named)})")
        timing = run.meta_untimed(rows, failed, timing)
        baseline = _standing(baseline, rows, failed)
        if timing:
            bar.set_description("interleaved timing")
            baseline = run.time(rows, baseline, bar, failed)
            bar.update(1)
            on_step(f"interleaved timing of {len(rows)} models done")
    finally:
        try:
            held.close()  # the models, inputs, target and loss module put back
        finally:
            bar.close()
    table = {n: rows[n] if n in rows else {"error": failed[n]} for n in named}
    if run.opts.warn:  # a row alone is easy to miss
        warn_failed(failed)
    df = _table(table, baseline, run.env_of(baseline), run.timing_attrs, failed)
    for column, by_name in reversed(run.own_columns().items()):  # after its input: device, dtype
        df.insert(1, column, [by_name.get(str(name)) for name in df.index])
    if df["input_shape"].nunique() > 1:  # said where its ratios are read
        run.notes.append(_OWN_INPUTS_NOTE)
    if run.notes:
        df.attrs["notes"] = [*df.attrs.get("notes", ()), *run.notes]
    if run.backward:  # timed or not, its counts are the step's: the caption says which
        df.attrs["training_counts"] = "optimizer" if run.profile_options.get("optimizer") else True
    return df


_COMPARE_KEYWORDS = keyword_names(compare)


def _refuse_unbuilt(profile_options: Mapping[str, Any], device: Any, throughput: bool) -> None:
    """What every model would refuse alike, once before any spec is built: a misspelt keyword
    (:func:`_check_names`), a throughput search on meta (it times real runs)."""
    _check_names(profile_options)
    if throughput and (d := parse_device(device)) is not None and d.type == "meta":
        raise ModelProfError(
            "device='meta' has no clock: throughput=True times real runs at each batch size; "
            "pass a real device to search, or drop throughput=True to compare costs alone"
        )


def _check_names(profile_options: Mapping[str, Any]) -> None:
    """A misspelt keyword, once before any model runs (not per model, each failing): the
    nearest among compare's names and profile's; a throughput search bound, where it goes."""
    bounds = [k for k in _SEARCH_KEYS if k in profile_options]
    if bounds:
        raise ModelProfError(
            f"{bounds[0]}= bounds the throughput search: pass throughput_options="
            f"{{{bounds[0]!r}: {profile_options[bounds[0]]!r}}} with throughput=True"
        )
    check_option_names(
        {k: v for k, v in profile_options.items() if k not in PROFILE_KEYWORDS},
        own=[*_COMPARE_KEYWORDS, *PROFILE_KEYWORDS],
    )


def _say_nothing(line: str) -> None:
    """``on_step`` when none is given."""


def _standing(baseline: str, rows: dict[str, Any], failed: dict[str, str]) -> str:
    """The baseline among the models that ran: the one asked for, else (it failed) the first
    that ran; a ModelProfError naming every failure when none did."""
    if not rows:
        raise every_model_failed(failed)
    return baseline if baseline in rows else next(iter(rows))


class _Run:
    """What every model of a comparison shares: inputs, options, the grad/eval switches, and
    what the interleaved timing will call."""

    def __init__(
        self,
        batch_size: int | None,
        device: Any,
        dtype: Any,
        profile_options: dict[str, Any],
        programs: Mapping[str, Any] = {},
    ) -> None:
        timing_keys = set(OPTION_NAMES) & set(profile_options)
        self.opts = TimingOptions.parse(**{k: profile_options.pop(k) for k in timing_keys})
        backward = profile_options.get("backward", False)
        # (device and dtype: each model's inputs', as profile() makes them)
        self.mode = RunMode.parse(
            backward=backward,
            training=profile_options.get("training"),
            no_grad=profile_options.get("no_grad"),
            amp=self.opts.amp,
            dtype=dtype,
        )
        self.backward = backward is True
        # what every model would refuse alike, once before any runs (not "every model failed")
        if self.mode.dtype is not None:  # a dtype asked for: amp on float64 whatever the model
            refuse_idle_amp(self.mode.dtype, self.mode.amp)
        if self.backward:
            refuse_eager_only(self.opts)
        self.batch_size, self.device, self.dtype = batch_size, device, dtype
        self.inputs: dict[str, Any] = {}  # each model's inputs (None: made from its size)
        self.tokens: dict[str, int] = {}  # the length of a model's token ids (tokens=)
        self.profile_options = profile_options
        self.candidates: list[Candidate] = []
        self.steps: dict[str, Any] = {}
        self.env: dict[str, Any] = {}
        # each model's device and dtype ("float32 under bfloat16 autocast"), by column
        self.own: dict[str, dict[str, str]] = {"device": {}, "dtype": {}}
        self.passed: Snapshot | None = None  # the inputs and target as they went in
        self.timing_attrs: dict[str, Any] = {}
        self.notes: list[str] = []  # the table's own: a throughput search's, by model
        self.programs = programs  # an ExportedProgram by name: counted as profile counts it
        self.on_meta: list[str] = []  # the models counted on meta while timing was asked for

    def meta_untimed(self, rows: dict[str, Any], failed: dict[str, str], timing: bool) -> bool:
        """Whether to time: not where every model that ran is on meta (counted, one note, as
        ``profile`` counts on meta); where some are on a real device, each model on meta
        fails, as it cannot be timed beside them."""
        if not timing or not self.on_meta:
            return timing
        if len(self.on_meta) == len(rows):
            self.notes.append(META_NOTE)
            return False
        for name in self.on_meta:
            failed[name] = (
                "device='meta' has no clock: pass timing=False to compare costs alone, or a "
                "real device to time"
            )
            del rows[name]
        return timing

    def add(
        self,
        name: str,
        model: nn.Module,
        size: Any,
        timing: bool,
        search: tuple[TimingOptions, dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """Count ``model`` (profile without timing) and prepare its timing: its row so far."""
        report = profile(
            self.programs.get(name, model),  # (a program's layers; timed: its module())
            size,
            inputs=self.inputs[name],
            batch_size=self.batch_size,
            device=self.device,
            dtype=self.dtype,
            timing=False,
            options=self.opts,
            **self.profile_options,
        )
        totals = _training_totals(report) if self.backward else report.totals
        totals = {c: totals[c] for c in _TOTAL_COLUMNS if c in totals}
        row = {"input_shape": _input_shape(size, self.inputs[name], self.batch_size), **totals}
        self.own["dtype"][name] = report._dtype_words()  # as its report's caption says them
        self.own["device"][name] = report.device
        if search is not None:  # before this model's timers, whose copies would take memory
            row.update(_throughput_row(name, model, size, self, *search))
        if timing and report.device == "meta":  # no clock: counted only, if all are (meta_untimed)
            self.on_meta.append(name)
        elif timing:
            self.candidates.append(_candidate(name, model, size, self))
            if self.backward:  # its training step's timer: profile(backward=True)'s clean passes
                mi = self.candidates[-1].inputs
                spec = _step_spec(self).for_inputs(mi.kwargs)
                timer = StepTimer(model, mi, spec, self.mode, options=self.opts, label=name)
                self.steps[name] = timer
        self.env = self.env or dict(report.env)
        return row

    def env_of(self, baseline: str) -> dict[str, Any]:
        """The table's environment: the timed baseline's (else the first model's), with its
        ``dtype_words``, its report's (``env["dtype"]`` is the autocast dtype under amp); less
        the device or the dtype where the models' differ (each row's own in its column)."""
        words = self.own["dtype"].get(baseline)
        env = {**self.env, "dtype_words": words} if words else dict(self.env)
        for column in self.own_columns():
            for key in (column, f"{column}_words", f"{column}_name"):
                env.pop(key, None)
        return env

    def own_columns(self) -> dict[str, dict[str, str]]:
        """Each model's device or dtype, by name, where the models' differ: a column of the
        table's (the caption names one only where all agree)."""
        return {c: by_name for c, by_name in self.own.items() if len(set(by_name.values())) > 1}

    def forget(self, name: str) -> None:
        """Drop what was prepared to time ``name`` (it failed)."""
        self.candidates = [c for c in self.candidates if c.name != name]
        self.steps.pop(name, None)

    def time(
        self, rows: dict[str, dict[str, Any]], baseline: str, bar: Any, failed: dict[str, str]
    ) -> str:
        """Every model's latency, interleaved, and (backward=True) its training step; a model
        whose timed call fails leaves ``rows`` for ``failed`` and the others are timed again.
        Returns the baseline (the first model left when the one asked for failed)."""
        while True:  # a failing latency or training step: drop it, time the others again
            try:
                result = measure_interleaved(
                    self.candidates, self.opts, baseline=baseline, mode=self.mode
                )
                checks = result.ratio_checks()
                for name in rows:
                    rows[name].update(_latency_columns(result, name, checks))
                step_attrs: dict[str, Any] = {"notes": []}
                if self.steps:
                    bar.set_description("interleaved training steps")
                    found = _step_columns(rows, self.steps, baseline, self.opts, step_attrs)
                    for name, step_checks in found.items():
                        checks.setdefault(name, []).extend(step_checks)
                break
            except ModelProfError as e:
                name = getattr(e, "candidate", None)
                if name not in rows:
                    raise
                failed[name] = str(e)
                del rows[name]
                self.forget(name)
                baseline = _standing(baseline, rows, failed)  # none left: names every failure
        self.env = dict(result.measurements[baseline].env) or self.env
        if self.steps:  # what of a training comparison is the forward's
            self.notes.insert(0, _FORWARD_NOTE)
        self.timing_attrs = _timing_attrs(result, checks, self.opts.warn)
        self.timing_attrs["notes"] += step_attrs.pop("notes")
        self.timing_attrs.update(step_attrs)
        return baseline


def _training_totals(report: Any) -> dict[str, int]:
    """A training report's totals as a comparison shows them: the forward columns (MACs, FLOPs,
    MAdd, bytes) the model's forward alone, as an inference comparison's, without the
    ``(loss)`` and ``(optimizer)`` rows, whose sum with them named no quantity a paper quotes;
    ``step_flops`` the whole step (forward, loss, backward, optimizer: ``totals["flops"] +
    totals["backward_flops"]``)."""
    forward = totals_of([r for r in report.rows if r.kind not in ("loss", "optimizer")], True)
    step = report.totals["flops"] + report.totals["backward_flops"]
    return {**report.totals, **{c: forward[c] for c in ADDITIVE}, "step_flops": step}


def _table(
    rows: dict[str, dict[str, Any]],
    baseline: str,
    env: dict[str, Any],
    timing_attrs: dict[str, Any],
    failed: dict[str, str] | None = None,
) -> Comparison:
    """The comparison frame: one row per model, then the ratios to the baseline; a model that
    failed keeps its row, with its error in ``error`` (and a note)."""
    # in the order given (pandas 3.0.6's from_dict puts a row with other keys last)
    df = Comparison(pd.DataFrame.from_dict(rows, orient="index").reindex(list(rows)))
    df.index.name = "model"
    base = df.loc[baseline]
    for ratio, column in _RATIOS.items():  # latency_x is measured: paired, interleaved
        if column in df.columns and ratio not in df.columns:
            df[ratio] = df[column] / base[column] if base[column] else math.nan
    flag = "throughput_samples_per_s_rough"
    if flag in df.columns:  # a ratio with a rough side is rough; the caption says whose
        rough = df[flag].eq(True)  # (no ratio, no flag, for a model that failed)
        df["throughput_x_rough"] = (rough | bool(rough[baseline])).where(df[flag].notna())
        if rough.any():
            df.attrs["rough_throughput"] = [str(n) for n in df.index[rough]]
    _keep_types(df, rows)
    if "latency_n" in df.columns:  # whole numbers, <NA> for a model that failed
        df["latency_n"] = df["latency_n"].astype("Int64")
    if timing_attrs:  # 1 the fastest, ties where the rounds cannot order two; none unranked
        ranks = timing_attrs.get("ranks") or {}
        df["rank"] = registry.whole_column([ranks.get(name) for name in df.index])
    if "step_latency_median_ms" in df.columns:  # a training comparison: its steps' own ranks
        steps = df["step_rank"] if "step_rank" in df.columns else pd.Series(index=df.index)
        df["step_rank"] = pd.array([None if pd.isna(r) else int(r) for r in steps], "Int64")
    if timing_attrs.get("unranked"):  # too few runs to order them: no timed ratio either
        for column in set(_TIMED_RATIOS) & set(df.columns):
            df[column] = math.nan
    df.attrs["env"] = env
    df.attrs["baseline"] = baseline
    df.attrs.update({k: v for k, v in timing_attrs.items() if k != "ranks"})
    if failed:
        note_failed(df.attrs, failed)
    return df


def _keep_types(df: pd.DataFrame, rows: Mapping[str, Mapping[str, Any]]) -> None:
    """Declared whole numbers stay whole (and exact) beside a missing one (a failed model's):
    Int64 with <NA>, where pandas made them float64; flags (declared, and a ratio's
    ``latency_x_rough``) True, False and None (not NaN), as a CSV reads them back. (After the
    ratios: those are floats.)"""
    for column in df.columns:
        declared = registry.column(column)
        if not df[column].isna().any():
            continue
        if declared is not None and declared.dtype == "int64":
            df[column] = registry.whole_column([rows[n].get(column) for n in df.index])
        elif declared.dtype == "bool" if declared else str(column).endswith("_rough"):
            df[column] = pd.Series(registry.flag_column(df[column]), index=df.index)


#: measure_throughput's own search bounds, the rest of throughput_options being timing options
_SEARCH_KEYS = ("max_batch", "gain", "patience")
#: the comparison's timing options its throughput points keep unless set
_CARRIED = ("progress", "amp", "channels_last", "warn", "compile", "clock")


def _throughput_search(options: Any, run: _Run) -> tuple[TimingOptions, dict]:
    """The points' ``TimingOptions`` and the search bounds. ``options``: a ``TimingOptions``
    (used as it is), or a mapping of search bounds and timing options (parsed into one, over
    ``measure_throughput``'s per-point defaults); the comparison's modes (amp, channels_last,
    progress) carry over unless set. Refuses a model given inputs (not sizes or tokens)."""
    fed = [n for n, x in run.inputs.items() if x is not None and n not in run.tokens]
    if fed:
        raise ModelProfError(
            f"throughput=True needs input_size or tokens=, not inputs= (given to {fed[0]!r}): "
            "it makes the inputs of each batch size"
        )
    opts = run.opts
    if isinstance(options, TimingOptions):
        return options, {}
    if options is not None and not isinstance(options, Mapping):
        raise ModelProfError(
            f"throughput_options={options!r} must be a TimingOptions or a "
            "dict of timing options and max_batch/gain/patience"
        )
    options = dict(options or {})
    search = {k: options.pop(k) for k in _SEARCH_KEYS if k in options}
    check_search_bounds(**search)  # here, not as each model's failed search
    check_option_names(options, own=_SEARCH_KEYS)  # max_btach: did you mean max_batch?
    carried = {k: getattr(opts, k) for k in _CARRIED}
    return TimingOptions.parse(**{**POINT_DEFAULTS, **carried, **options}), search


def _timing_attrs(
    result: Any, checks: dict[str, list[RatioAgreement]], warn: bool = True
) -> dict[str, Any]:
    """What a comparison's table says about its timing: the ratio estimator, what it ranks by
    and, on a loaded CPU, why it ranks by CPU work; a ratio that disagrees with its rounds; the
    ranks (``ranks``, for ``_table``; none where too few runs or that disagreement withhold
    them)."""
    out: dict[str, Any] = {
        "ranked_by": result.ranked_by,
        "ratio_estimator": RATIO_ESTIMATOR,
        "notes": [f"latency_x: {RATIO_ESTIMATOR}"],
    }
    out["notes"] += floor_notes(result.measurements.values())
    unquotable = {n: why for n, m in result.measurements.items() if (why := _no_figure(m))}
    if unquotable:  # for the caption: which latencies are marked ~, and why
        out["unquotable"] = unquotable
    unranked = unranked_note(
        {name: m.n for name, m in result.measurements.items() if m.undersampled}
    )
    if unranked:
        out["unranked"] = unranked
        out["notes"].append(unranked)
    elif result.ranked_by == "cpu_work" and result.loaded:
        out["ranked_by_why"] = "the machine was loaded"
        out["notes"].append(cpu_work_note(result.measurements.values()))
    elif result.ranked_by == "cpu_work":
        out["ranked_by_why"] = "the wall-clock ratios moved between rounds, the CPU work's did not"
        why = (
            "latency_x disagrees with its per-round ratios while cpu_work_x agrees with its "
            "own: the machine's pace moved between rounds, the models' work did not"
        )
        out["notes"].append(cpu_work_note(result.measurements.values(), why))
    else:
        out["notes"] += loaded_latency_notes(result.measurements.values())
    # for the caption: a paper table says so too
    measured = {name: [m] for name, m in result.measurements.items()}
    out.update(shaken_attrs(measured, loaded=not unranked and result.ranked_by != "cpu_work"))
    ranking = "cpu_work_x" if result.ranked_by == "cpu_work" else "latency_x"
    disagreeing(checks, ranking, ranking, out, out["notes"], warn)
    if not (unranked or "ratios_disagree" in out):
        on_cpu = result.ranked_by == "cpu_work"
        figures = {n: m.cpu if on_cpu else m for n, m in result.measurements.items()}
        # loaded: the other work slows one model's work more than another's, so the wall
        # clock must not contradict the CPU work's order either (backward_under_load.py)
        wall = result.measurements if on_cpu and result.loaded else None
        out["ranks"], tied = tied_ranks(figures, wall)
        out["notes"] += [tied] if tied else []
        if tied:
            out["tied"] = tied
    return out


def _name_models(models: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``{name: module}``, building specs (a spec's entry carries its default input size),
    and ``{name: ExportedProgram}``: a program's entry is its ``module()``, what running it
    means (and what is timed); profile counts the program itself, by its layers."""
    if isinstance(models, Mapping):
        items = [(str(k), v) for k, v in models.items()]
    elif isinstance(models, Sequence) and not isinstance(models, (str, bytes)):
        items = [(None, v) for v in models]
    else:
        raise ModelProfError(
            f"models of type {type(models).__name__} must be a dict "
            "{name: module} or a list of modules or model names"
        )
    if not items:
        raise ModelProfError("models is empty; pass at least one model")
    named: dict[str, Any] = {}
    programs: dict[str, Any] = {}
    for name, value in items:
        program = value if isinstance(value, torch.export.ExportedProgram) else None
        if program is not None:
            name, value = name or type(program).__name__, program.module()
        if isinstance(value, str):
            module, spec_name, default = load_model(value)
            entry: Any = (module, default)
            name = name or spec_name
        elif isinstance(value, nn.Module):
            entry, eager = value, eager_module(value)  # torch.compile(m): named by m
            name = name or display_name(
                type(eager).__name__, sum(p.numel() for p in eager.parameters())
            )
        else:
            raise ModelProfError(
                f"model {name or value!r} of type {type(value).__name__} is "
                "neither a torch.nn.Module, a torch.export.ExportedProgram nor a model name"
            )
        name = unique_name(name, named)
        named[name] = entry
        if program is not None:
            programs[name] = program
    return named, programs


def _input_sizes(
    named: dict[str, Any], input_size: Any, inputs: Any, tokens: int | None, run: _Run
) -> dict[str, Any]:
    """Each model's input size, None where it is fed inputs (``run.inputs[name]``: the shared
    ``inputs``, its own from an ``inputs`` keyed by the models' names, or, with ``tokens``,
    token ids for a model that reads them, its length in ``run.tokens``); tensors given as
    ``input_size`` are the inputs (``compare(models, x)``, but not a dict keyed by the
    models' names: their sizes). A model's own entry comes first, then tokens, the shared
    inputs or size, a spec's own size. Unwraps ``named``'s specs."""
    by_model = isinstance(input_size, Mapping) and bool(input_size) and set(input_size) <= {*named}
    if not by_model:
        input_size, inputs = inputs_in_size_place(input_size, inputs)
    if isinstance(input_size, Mapping) and not by_model:  # sizes by name, a name no model's
        _refuse_unknown("input_size", input_size, named)
    # by model where a key names one, or every key nearly does (a misspelt name; a dict of
    # others, src and tgt beside a model src2: keyword inputs for all)
    names = [str(k) for k in inputs] if isinstance(inputs, Mapping) else []
    near = names and all(nearest_keywords([n], list(named)) for n in names)
    own = inputs if set(names) & {*named} or near else {}
    _refuse_unknown("inputs", own, named)
    sizes, shared = (input_size, None) if by_model else ({}, input_size)
    inputs = None if own else inputs
    if shared is not None and inputs is not None:
        raise ModelProfError("pass input_size or inputs=, not both")
    if both := [n for n in own if sizes.get(n) is not None]:
        raise ModelProfError(f"model {both[0]!r} is given both an input_size and inputs=")
    tokens = None if tokens is None else check_int("tokens", tokens)
    out: dict[str, Any] = {}
    for name, entry in list(named.items()):
        default = None
        if isinstance(entry, tuple):
            named[name], default = entry
        size, fed = sizes.get(name), own.get(name)
        if size is None and fed is None and tokens is not None and reads_token_ids(named[name]):
            fed, run.tokens[name] = _token_ids(name, named[name], tokens, run), tokens
        if size is None and fed is None:
            fed, size = (
                inputs,
                None if inputs is not None else default if shared is None else shared,
            )
        if size is None and fed is None:
            also = f"; tokens={tokens} feeds only the models that read token ids" if tokens else ""
            raise ModelProfError(
                f"model {name!r} needs an input size: pass input_size= (e.g. (3, 224, 224)), "
                f"a dict of them, inputs= or a dict of them, or tokens=N (token ids){also}"
            )
        out[name], run.inputs[name] = (None, fed) if fed is not None else (size, None)
    return out


def _refuse_unknown(what: str, given: Mapping[str, Any], named: Mapping[str, Any]) -> None:
    """Refuse a key of ``what`` (a dict by model) naming no model, with the nearest name."""
    unknown = sorted(map(str, set(given) - {*named}))
    if unknown:
        raise ModelProfError(
            f"{what} names {unknown}, not among the models {list(named)}"
            + nearest_keywords(unknown, list(named), mark="")
        )


def _token_ids(name: str, model: nn.Module, tokens: int, run: _Run) -> Any:
    """``tokens`` ids (and mask) for ``model`` at the comparison's batch, on its device."""
    try:
        return token_inputs(model, tokens, run.batch_size or 1, device=run.device)
    except ModelProfError as e:
        raise ModelProfError(f"model {name!r}: {e}") from e


def _hold(held: contextlib.ExitStack, named: Mapping[str, Any], run: _Run) -> Snapshot:
    """Put back, when ``held`` closes, every model (``profile`` restores its own passes; the
    interleaved timing runs the models again) and what is passed beside them: the loss module,
    and a snapshot of the inputs and the target, which is returned; and the random state
    (every pass's draws: train-mode dropout, a forward's own, the made inputs)."""
    profile_options = run.profile_options
    held.enter_context(random_kept(run.device))
    for model in named.values():
        held.enter_context(preserved_state(model))
    held.enter_context(preserved_state(loss_module(profile_options.get("loss_fn"))))
    return held.enter_context(snapshot_of(*run.inputs.values(), profile_options.get("target")))


def _candidate(name: str, model: nn.Module, size: Any, run: _Run) -> Candidate:
    """What the interleaved timing calls for one model, prepared like ``profile``'s clean run;
    every pass sees its inputs (its own, or shared) as they went in: ``run.passed`` puts
    back what a pass changed, before the next."""
    mi = make_inputs(
        model,
        size,
        inputs=run.inputs[name],
        batch_size=run.batch_size,
        device=run.device,
        dtype=run.mode.dtype,
    )
    runner = timing_runner(model, mi, run.mode.on(mi.device), run.opts)
    run.passed.add(mi.args, mi.kwargs)
    target, mi = resolve_call(runner, mi, channels_last=run.opts.channels_last)
    run.passed.add(mi.args, mi.kwargs)  # channels_last copies, where made
    mi.reset = run.passed.reset
    return Candidate(name, model, target, mi)


def _step_spec(run: _Run) -> StepSpec:
    o = run.profile_options
    return StepSpec.parse(
        loss_fn=o.get("loss_fn"), target=o.get("target"), optimizer=o.get("optimizer")
    )


def _step_columns(
    rows: dict[str, dict[str, Any]],
    steps: dict[str, Any],
    baseline: str,
    opts: TimingOptions,
    attrs: dict[str, Any],
) -> dict[str, list[RatioAgreement]]:
    """Backward (and optimizer) medians of every model's training step, timed interleaved, and
    the paired backward and whole-step ratios to the baseline with their intervals
    (``backward_latency_x``, ``step_latency_x``); on the CPU the backward's CPU work and its
    ratio beside them (``backward_cpu_work_*``); each ratio flagged where it
    disagrees with its per-round ratios (``*_rough``); a budget extended to hold the sample
    floor and a loaded machine (:func:`_backward_load`) noted in ``attrs``. Returns those
    checks."""
    order = [baseline] + [n for n in steps if n != baseline]
    got, ratios = compare_steps([steps[n] for n in order], opts)
    base, base_step, checks = got[0]["backward"], got[0]["step"], {}
    on_cpu = all(m["backward"].cpu is not None for m in got)
    held = on_cpu and all(m["backward"].cpu_holds for m in got)  # one thread's: worth judging
    for name, m, ratio in zip(order, got, ratios):
        b, step, row = m["backward"], m["step"], rows[name]
        stated = math.isfinite(ratio[0])  # not undersampled: judged against its rounds
        own = name == baseline or not stated  # (1, 1, 1), or NaN as the backward's ratio
        row.update(interval_columns("backward_latency", b))
        row["backward_latency_rough"] = bool(_no_figure(b))  # as the forward's latency_rough
        row.update(interval_columns("backward_latency_x", ratio))
        if on_cpu:
            row.update(interval_columns("backward_cpu_work", b.cpu))
            row.update(
                interval_columns("backward_cpu_work_x", _paired(b.cpu, base.cpu, own, ratio))
            )
        if "optimizer" in m:
            row["optimizer_latency_median_ms"] = m["optimizer"].median_ms
            row["optimizer_latency_rough"] = bool(_no_figure(m["optimizer"]))
        row["step_latency_median_ms"] = step.median_ms
        row["step_latency_rough"] = bool(_no_figure(step))
        for phase in ("backward", "optimizer", "step"):  # for the caption: which, and why
            if phase in m and (why := _no_figure(m[phase])):
                attrs.setdefault("unquotable_step", {})[f"{name}'s {phase}"] = why
        row.update(interval_columns("step_latency_x", _paired(step, base_step, own, ratio)))
        if name != baseline and stated:
            checks[name] = [
                judge_ratio("backward_latency_x", name, baseline, b, base),
                judge_ratio("step_latency_x", name, baseline, step, base_step),
            ]
            if held:
                cpu_check = judge_ratio("backward_cpu_work_x", name, baseline, b.cpu, base.cpu)
                checks[name].append(cpu_check)
        flagged = ("backward_latency_x", "backward_cpu_work_x", "step_latency_x")
        rough_flags(checks.get(name, ()), row, flagged)
    backwards = [m["backward"] for m in got]
    attrs["notes"] += [f"the training steps: {n}" for n in floor_notes(backwards)]
    _backward_load(backwards, attrs)
    _step_ranks(rows, {name: m["step"] for name, m in zip(order, got)}, attrs)
    return checks


def _step_ranks(
    rows: dict[str, dict[str, Any]], steps: dict[str, Any], attrs: dict[str, Any]
) -> None:
    """``step_rank``: each model's rank by its whole training step, as ``rank`` by the forward
    (:func:`tied_ranks`; on a loaded CPU where every step's work is one thread's, by its CPU
    work, the wall clock not ordering them the other way); none where a step is undersampled
    or a ``step_latency_x`` disagrees with its rounds, said in a note."""
    if any(m.undersampled for m in steps.values()):
        attrs["notes"].append("step_rank: not ranked, too few training steps for an interval")
        return
    rough = [name for name in steps if rows[name].get("step_latency_x_rough")]
    if rough:
        attrs["notes"].append(
            f"step_rank: not ranked, step_latency_x of {', '.join(rough)} disagrees with its "
            "per-round ratios"
        )
        return
    by_cpu = any(m.loaded for m in steps.values()) and all(m.cpu_holds for m in steps.values())
    figures = {name: m.cpu if by_cpu else m for name, m in steps.items()}
    ranks, tied = tied_ranks(figures, steps if by_cpu else None)
    for name, rank in ranks.items():
        rows[name]["step_rank"] = rank
    attrs["step_ranked_by"] = "cpu_work" if by_cpu else "latency"
    if by_cpu:
        attrs["notes"].append(
            "step_rank: by each whole training step's CPU work (one thread's), the machine "
            "being loaded"
        )
    if tied:
        attrs["step_tied"] = f"step_rank: {tied}"
        attrs["notes"].append(attrs["step_tied"])


def _paired(figure: Any, base: Any, own: bool, ratio: tuple) -> tuple[float, float, float]:
    """``figure``'s paired ratio to the baseline's ``base`` (:func:`round_ratio`), or where it
    is ``own`` (the baseline's, or an undersampled one) the backward's ``ratio`` as it is."""
    return ratio if own else round_ratio(figure, base, figure.confidence)


def _backward_load(backwards: list[Any], attrs: dict[str, Any]) -> None:
    """Where the training steps ran on a loaded machine: a note on which backward ratio it
    moved, and ``attrs["backward_by"] = "cpu_work"`` where the CPU work is one thread's
    (``Measurement.cpu_holds``), which waiting for a core does not stretch (the readable table
    shows it; how far the other work still moves it: benchmarks/backward_under_load.py)."""
    if not any(m.loaded for m in backwards):
        return
    moved = f"the training steps ran on a loaded machine ({load_note(backwards)}): "
    if all(m.cpu_holds for m in backwards):
        attrs["backward_by"] = "cpu_work"
        attrs["notes"].append(
            f"{moved}backward_latency_x moved with the load; backward_cpu_work_x, the ratio of "
            "one thread's CPU work, is not stretched by waiting for a core, but the other work "
            "can still slow one model's work more than another's (shared caches), which its "
            "interval does not cover: time again on a quieter machine to be sure of either"
        )
    else:
        attrs["notes"].append(
            f"{moved}backward_latency_x moved with the load, and so does the CPU work of "
            f"several threads; {quieter_machine(backwards)}"
        )


def _latency_columns(
    result: Any, name: str, checks: dict[str, list[RatioAgreement]]
) -> dict[str, Any]:
    """A model's latency statistics from the interleaved run, with its ratio of medians and
    paired interval; on the CPU its CPU work beside them; each ratio's flag (``*_x_rough``:
    it disagrees with its per-round ratios)."""
    m = result.measurements[name]
    out = {
        **interval_columns("latency", m),
        "latency_p90_ms": m.p90_ms,
        "latency_std_ms": m.std_ms,
        "fps": m.fps,
        "latency_stable": m.stable,
        **interval_columns("latency_x", result.ratios[name]),
        "latency_n": m.n,
        "latency_rough": bool(_no_figure(m)),
        **cpu_work_columns(result, name),
    }
    rough_flags(checks.get(name, ()), out, ("latency_x", "cpu_work_x"))
    return out


def _no_figure(m: Any) -> str | None:
    """Why a model's wall-clock median is no figure to quote, as a report's end-to-end row
    judges its clean runs (``Report.latency_unquotable``): read on a loaded machine, or from too
    few runs; None when it is one (``latency_rough``, said in the caption)."""
    why = ["the machine was loaded"] if m.loaded else []
    why += [f"too few runs, n={m.n}"] if m.undersampled else []
    return "; ".join(why) or None


def _input_shape(size: Any, inputs: Any, batch_size: int | None) -> str:
    """``1x3x224x224`` (batch first); several inputs comma-separated."""
    if size is None:  # token ids said as such: 1x8, 1x8 (int64)
        return shape_str(
            inputs, dtypes=any(not t.is_floating_point() for t in iter_tensors(inputs))
        )
    b = 1 if batch_size is None else batch_size
    return ", ".join("x".join(str(d) for d in (b, *s)) for s in parse_input_size(size))


#: what a table of models fed different inputs compares
_OWN_INPUTS_NOTE = (
    "the models ran different inputs (input_shape): each row is its model at its own input "
    "(fps and samples/s count its own samples: an image, a sequence of token ids), and each "
    "*_x ratio sets that run beside the baseline's at the baseline's input, not the two "
    "architectures at one input"
)
#: what of a compare(backward=True) table the forward alone times
_FORWARD_NOTE = (
    "latency_median_ms, fps, latency_x and rank: the forward pass alone, in the training "
    "step's mode; backward_*, step_latency_* and step_rank: the training step; macs, flops, "
    "madd and the bytes (and their ratios): the model's forward alone; step_flops (and "
    "step_flops_x): the whole step, forward, loss, backward and optimizer"
)
#: what a compare(backward=True) throughput column holds
_STEPS_NOTE = (
    "throughput_samples_per_s: whole training steps per second (forward, loss, backward and "
    "the optimizer's step where one is given)"
)


def _throughput_row(
    name: str,
    model: nn.Module,
    size: Any,
    run: _Run,
    opts: TimingOptions,
    search: dict[str, Any],
) -> dict[str, Any]:
    try:  # measure_throughput as the comparison asks it: its device, dtype and modes
        curve = measure_throughput(
            model,
            size,
            tokens=run.tokens.get(name),  # (a model fed token ids: sequences of that length)
            device=run.device,
            dtype=run.dtype,
            training=run.mode.training,
            no_grad=run.mode.no_grad,
            options=opts.replace(warn=False),  # said here, naming the model
            # backward=True: whole training steps per second, as the step columns time them
            measure=(
                step_measure(size, _step_spec(run), run.mode, tokens=run.tokens.get(name))
                if run.backward
                else None
            ),
            **search,
        )
    except ModelProfError as e:  # the counted row stands (a train-mode BatchNorm at batch 1)
        if not isinstance(e.__cause__, Exception) or isinstance(e.__cause__, ModelProfError):
            raise  # not the model's own run failing: the caller's option, target or device
        run.notes.append(f"{name} throughput: not measured: {e}")
        if opts.warn:
            warn_user(f"modelprof: {run.notes[-1]}", ModelProfWarning)
        return {
            "throughput_samples_per_s": math.nan,
            "throughput_batch_size": math.nan,
            "throughput_samples_per_s_rough": False,
        }
    for note, kind in curve.timing_warnings:
        run.notes.append(f"{name} throughput: {note}")
        if opts.warn:
            warn_user(f"modelprof: {run.notes[-1]}", kind)
    if run.backward and _STEPS_NOTE not in run.notes:  # said once, first
        run.notes.insert(0, _STEPS_NOTE)
    if curve.stop_reason == "max_batch" and curve.best.batch_size == curve.points[-1].batch_size:
        # the best may lie past the cap (throughput_options={"max_batch": ...})
        run.notes.append(f"{name} throughput: {curve.stop_explanation}")
    best = curve.best
    # the best point as the curve marks it: loaded, or slower than a bigger batch
    rough = curve.to_dataframe().set_index("batch_size").at[best.batch_size, "latency_rough"]
    return {
        "throughput_samples_per_s": best.samples_per_s,
        "throughput_batch_size": best.batch_size,
        "throughput_samples_per_s_rough": bool(rough),
    }
