"""``Report``: the result of ``profile`` — per-call rows, totals, timing and environment, with
views (DataFrames in two styles, per-operator counts) and exporters."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from modelprof.counting.collectives import collectives_frame
from modelprof.counting.scope import NOT_CALLED
from modelprof.errors import (
    ModelProfError,
    ModelProfWarning,
    check_int,
    keywords_named,
    warn_user,
)
from modelprof.render._output import emit
from modelprof.render.csvio import read_csv
from modelprof.render.formats import Exports, get_format, is_figure_format
from modelprof.render.html import html_notebook
from modelprof.render.jsonio import read_json
from modelprof.render.options import ViewOptions, check_read_by
from modelprof.render.trace import PassTimeline, cost_args, trace_document, write_trace
from modelprof.render.units import format_bytes, format_count, format_rate
from modelprof.render.views import (
    call_label,
    compact_columns,
    default_priority,
    require_columns,
    select_rows,
)
from modelprof.report.diff import diff_frames
from modelprof.report.frames import shown
from modelprof.report.layer_types import LAYER_TYPES, layer_type
from modelprof.report.memory import estimate_memory
from modelprof.report.plots import plot_flops, plot_latency, plot_roofline, save_figure
from modelprof.report.roofline import (
    PROOF_COLUMN,
    add_roofline,
    own_rows,
    run_peaks,
    scattered,
    with_read_times,
)
from modelprof.report.rows import (
    COUNTED,
    Row,
    count_column,
    modelprof_frame,
    subtree_leaves,
    torchstat_frame,
    totals_of,
)
from modelprof.report.utilization import (
    UNPROBED,
    Convention,
    Utilization,
    recompute_notes,
    report_amp,
    report_peak_dtype,
    resolve_peaks,
    utilization,
)
from modelprof.timing.measurement import unquotable

__all__ = ["Counts", "Report", "RunInfo", "TimingResult"]

# the columns a LaTeX table drops last when it must lose some to fit, most important first (a
# paper's table keeps the shapes before FLOPs, about 2 x MACs)
_LATEX_PRIORITY = default_priority(
    "module layer_type type params macs latency_ms output_shape | calls flops latency_pct "
    "output_bytes read_bytes write_bytes"
)
#: the per-layer rough flags: a human table shows them as its cells' marks (~), not as columns
_ROUGH_FLAGS = ("latency_rough", "backward_latency_rough")
#: how to get a table ``Report.diff`` can read
_READ_BACK = " (a table from to_dataframe(), or read back by modelprof.render.read_csv)"
#: a training step's: its backward's time kept beside the forward's
_STEP_PRIORITY = (
    *_LATEX_PRIORITY[:6],
    *default_priority("backward_latency_ms"),
    *_LATEX_PRIORITY[6:],
)


def _read_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """The table a ``to_csv`` or ``to_json`` file holds (by its suffix)."""
    if str(path).lower().endswith(".json"):
        return read_json(path)[0]
    if str(path).lower().endswith(".csv"):
        return read_csv(path)
    raise ModelProfError(f"diff({str(path)!r}): a .csv or .json file written by to_csv/to_json")


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What was profiled, where and how."""

    model_name: str
    input_shape: str
    batch_size: int
    device: str
    dtype: str
    env: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Counts:
    """The static pass's totals beside its rows: ops with no formula, per-op counts, and the
    model's parameter count."""

    unsupported: Mapping[str, int]
    by_op: Mapping[str, Any]
    model_params: int
    memory: Any = None  # modelprof.report.memory.MemoryFacts, for memory_estimate()
    caught_on_meta: tuple[str, ...] = ()  # see Report.caught_on_meta


@dataclasses.dataclass(frozen=True)
class TimingResult:
    """The timed passes (all None without timing): the clean end-to-end ``Measurement``, the
    per-layer ``LayerTiming``, instrumented/plain overhead, leaf coverage (against the clean
    median), peaks, notes, and whether the two windows agree."""

    latency: Any = None
    layer_timing: Any = None
    instrumentation_overhead: float | None = None
    coverage: float | None = None
    peaks: Any = None
    notes: Sequence[str] = ()
    agreement: Any = None  # modelprof.timing.agreement.TimingAgreement
    #: CUDA, ``latency_mode="pipelined"``: the same model timed back to back (a full stream)
    pipelined: Any = None
    what_helps: Any = None  # what_helps=True: eager, CUDA graph, compiled (LatencyComparison)


#: why a timed report has no peaks (as utilization() says it)
_UNPROBED = f"it was timed without the roofline's probe {UNPROBED}"


class Report(Exports):
    """Static cost and measured time of one model on one input, one row per module call.

    ``totals`` sums the leaf rows (each shared parameter once); ``unsupported`` maps ops that
    have no formula to their call counts; ``latency`` is the clean end-to-end measurement
    (``None`` with ``timing=False``). :meth:`export` writes the table in any registered format,
    and ``to_<format>`` (``to_csv``, ``to_markdown``, ... and any format registered later) is
    that format's export."""

    def __init__(
        self,
        rows: Sequence[Row],
        run: RunInfo,
        counts: Counts,
        timing: TimingResult | None = None,
        training_step: Any = None,
    ) -> None:
        timing = TimingResult() if timing is None else timing
        self.rows = list(rows)
        self.model_name = run.model_name
        self.input_shape = run.input_shape
        self.batch_size = run.batch_size
        self.device = run.device
        self.dtype = run.dtype
        self.env = dict(run.env)
        self.options = dict(run.options)
        self.unsupported = dict(counts.unsupported)
        self._by_op = dict(counts.by_op)
        self.model_params = counts.model_params
        self.latency = timing.latency
        self.layer_timing = timing.layer_timing
        self.instrumentation_overhead = timing.instrumentation_overhead
        self.coverage = timing.coverage
        self.peaks = timing.peaks
        #: how the timing columns were measured where that is not the plain recipe
        self.timing_notes = list(timing.notes)
        self.pipelined = timing.pipelined
        self.what_helps = timing.what_helps
        self.training_step = training_step  # modelprof.step.table.TrainingStep (backward=True)
        self.timing_agreement = timing.agreement  # per-layer window against the clean runs
        self.totals = totals_of(self.rows, training_step is not None)
        self.memory = counts.memory  # modelprof.report.memory.MemoryFacts (None: not known)
        #: on meta, ops that raised and that the forward caught: its counts may be of another
        #: branch than a real device's (empty elsewhere)
        self.caught_on_meta = tuple(counts.caught_on_meta)

    @property
    def timed(self) -> bool:
        return self.latency is not None

    @property
    def backward_latency(self) -> Any:
        """The clean end-to-end backward ``Measurement`` (``backward=True`` and timed), else None."""
        return None if self.training_step is None else self.training_step.backward_latency

    # -- views ----------------------------------------------------------------------------------
    def to_dataframe(self, style: str = "modelprof") -> pd.DataFrame:
        """One row per module call (``modelprof``) or torchstat's leaf table (``torchstat``).
        With peaks the modelprof view carries the roofline columns and, timed, ``mfu``, ``mbu``
        (``hfu`` for a training step) in :meth:`utilization`'s default convention; timed, also
        ``latency_passes`` and ``latency_rough`` (:attr:`layers_rough`, or a row read short:
        :func:`_short_own_rows`); a timed training step's ``backward_latency_rough``
        (its instrumented backward disagrees with the clean one: ``training_step.agreement``).
        The end-to-end latency (the clean run's) is no row: :attr:`latency`."""
        style = ViewOptions.parse(style=style).style
        if style == "torchstat":
            return self._torchstat_frame(None)
        step = self.training_step is not None
        df = modelprof_frame(self.rows, self.timed, step)
        if self.timed:  # each row's span as read, rough marks: what proves a roof (dropped below)
            df = with_read_times(df, self)
        if self.peaks is not None:
            df = add_roofline(df, self.peaks)
            if self.timed:  # mfu, mbu (and hfu for a training step), default convention
                rows, _ = utilization(self, Convention(peaks=run_peaks(self)), self._by_op)
                for name in ("mfu", "hfu", "mbu") if step else ("mfu", "mbu"):
                    df[name] = rows[name].to_numpy()
                    if f"{name}_rough" in rows.columns:  # against a loaded probe's peak
                        df[f"{name}_rough"] = rows[f"{name}_rough"].to_numpy()
        lt = self.layer_timing
        if lt is not None and "latency_ms" in df.columns:
            timed_rows = df["latency_ms"].notna()
            df = df.drop(columns="latency_rough", errors="ignore")  # (with_read_times'), last
            df["latency_passes"] = np.where(timed_rows, lt.n, 0).astype("int64")
            df["latency_rough"] = timed_rows & (self.layers_rough | _short_own_rows(df))
        backward = self.backward_agreement
        if backward is not None and "backward_latency_ms" in df.columns:
            # (the optimizer's row has no backward: its NaN is never rough)
            timed = df["backward_latency_ms"].notna()
            # (as the forward's: two regimes, a torch.compile'd model's, make no row rough)
            df["backward_latency_rough"] = timed & (
                not backward.agree and not backward.between_regimes
            )
        return df.drop(columns=PROOF_COLUMN, errors="ignore")

    @property
    def backward_agreement(self) -> Any:
        """A timed training step's instrumented backward against its clean backward
        (``modelprof.timing.agreement.TimingAgreement``); None otherwise."""
        return getattr(self.training_step, "agreement", None)

    @property
    def layers_rough(self) -> bool:
        """The per-layer rows rest on a single pass or fewer than ``min_samples`` (a budget
        stopped them early), or disagree with the clean runs or among themselves
        (``timing_agreement``): rough, marked in every view."""
        return self._rough_reason() is not None

    @keywords_named
    def diff(
        self,
        other: Report | pd.DataFrame | str | os.PathLike[str],
        columns: Sequence[str] | None = None,
        names: Any = ("a", "b"),
        prefixes: Any = ("", ""),
    ) -> pd.DataFrame:
        """This report (``a``) beside ``other`` (``b``: a Report, a table saved earlier and
        read back by ``modelprof.render.read_csv`` or ``read_json(...)[0]``, or the path of
        such a ``.csv`` or ``.json`` file) layer by layer,
        rows matched by module and call: each of ``columns`` (default: the counts, forward and
        backward, and the latencies both sides timed) twice and their ratio b / a, ``in``
        saying where a row exists only on one side, a timing column's rough flag where either
        side's is set; ``prefixes``: what each side's module names start with that the other's
        do not (a wrapper's ``"module."``, ``torch.compile``'s ``"_orig_mod."``), dropped before
        matching; where the two share fewer than half their layers, a warning and
        ``attrs["notes"]`` (naming the prefixes that would match more). Counts compare exactly;
        per-layer times taken in two runs carry whatever the machine did between them
        (``compare()`` interleaves whole models to cancel that drift)."""
        if isinstance(other, (str, os.PathLike)):  # a run saved earlier, read back here
            other = _read_table(other)
        reports = [self, other]
        if isinstance(other, pd.DataFrame):  # a run saved earlier, read back
            require_columns(other, ("module", "call", "type"), "diff()", _READ_BACK)
        elif isinstance(other, Report):
            other = other.to_dataframe()
        else:
            said = "; read_json gives (table, totals, env): pass its [0]"
            raise ModelProfError(
                f"diff() takes another Report, its table read back or that file's path, got "
                f"{type(other).__name__}" + (said if isinstance(other, tuple) else "")
            )
        out = diff_frames(self.to_dataframe(), other, columns, names, prefixes)
        if "latency_ms_ratio" in out.columns:  # a ratio of rough times is no figure to quote
            for name, report in zip(names, reports):
                why = report._rough_reason() if isinstance(report, Report) else None
                if why is not None:
                    note = f"diff(): the per-layer times of {name!r} are rough ({why})"
                    note += ": so are their ratios"
                    out.attrs["notes"] = [*out.attrs.get("notes", []), note]
                    warn_user(f"modelprof: {note}", ModelProfWarning)
        return out

    def by_operator(self, direction: str = "forward") -> pd.DataFrame:
        """Per op (``aten.convolution.default``): calls, macs, flops, madd, whether a formula
        counted it, and how many calls were counted inexactly (see ``notes``); of the forward
        (the loss's included), or with ``direction="backward"`` of the backward."""
        if direction not in ("forward", "backward"):
            raise ModelProfError(f"direction={direction!r} must be 'forward' or 'backward'")
        if direction == "backward" and self.training_step is None:
            raise ModelProfError(
                "by_operator(direction='backward') needs profile(..., backward=True)"
            )
        cost = self.training_step.cost if direction == "backward" else None
        by_op = self._by_op if cost is None else cost.by_op
        unsupported = self.unsupported if cost is None else cost.unsupported
        names = sorted(by_op, key=lambda k: (-by_op[k].flops, k))
        return shown(
            pd.DataFrame(
                {
                    "op": names,
                    **{
                        c: count_column([getattr(by_op[n], c) for n in names])
                        for c in ("calls", "macs", "flops", "madd")
                    },
                    "supported": [n not in unsupported for n in names],
                    "inexact_calls": [sum((by_op[n].notes or {}).values()) for n in names],
                }
            ).astype({"inexact_calls": "int64"})
        )

    def memory_estimate(self, optimizer_states: int | None = None) -> pd.DataFrame:
        """Estimated memory in bytes for inference and for a training step, per component
        (:mod:`modelprof.report.memory`). ``optimizer_states``: state tensors per trainable
        parameter when the profile ran no optimizer (2 for Adam, the default; 1 for SGD with
        momentum, 0 for plain SGD); with a profiled optimizer its own state is used, and
        passing one is an error."""
        if self.memory is None:
            raise ModelProfError("this report carries no memory facts (made by profile())")
        step = self.training_step
        saved = None if step is None else int(self.totals.get("saved_bytes", 0))
        opt = None if step is None else step.cost.optimizer
        state = None if opt is None else opt.state_bytes
        if state is not None and optimizer_states is not None:
            raise ModelProfError(
                f"optimizer_states={optimizer_states!r} is for a profile that ran no optimizer; "
                f"this one profiled {opt.name}, whose state ({state:,} B) the estimate uses: "
                "profile with another optimizer= to estimate its state"
            )
        return shown(
            estimate_memory(
                self.memory,
                saved_bytes=saved,
                optimizer_states=2 if optimizer_states is None else optimizer_states,
                optimizer_state_bytes=state,
            ),
            units={"inference": "_bytes", "training_step": "_bytes"},
        )

    def utilization(
        self,
        peak: Any = None,
        *,
        flops: str = "2macs",
        causal: str = "counted",
        decode: bool = False,
    ) -> Any:
        """MFU, HFU and MBU per row, per phase and for the whole call
        (:class:`modelprof.report.utilization.Utilization`; the conventions in that module).

        ``peak``: ``"datasheet"`` (the table's dense figure for this device and dtype),
        ``"probe"`` (this report's probed peaks), a device name, a ``Peaks``, or None (the
        datasheet where the device is in the table, else the probe). ``flops``: ``"2macs"``
        (2 x MACs of contractions) or ``"flops"`` (every counted FLOP). ``causal``:
        ``"counted"`` or ``"half"`` (a causal model's attention contractions halved; not for a
        ``decode`` step)."""
        chosen, known = resolve_peaks(peak, self)
        convention = Convention(flops=flops, causal=causal, peaks=chosen, amp=report_amp(self))
        rows, phases = utilization(self, convention, self._by_op, decode=decode)
        by_peak = {}
        for name, p in known.items():
            _, other = utilization(
                self, dataclasses.replace(convention, peaks=p), self._by_op, decode=decode
            )
            by_peak[name] = float(other["mfu"].iloc[-1])
        return Utilization(convention, rows, phases, by_peak, recompute_notes(self))

    def collectives(self) -> pd.DataFrame:
        """One row per (communication row, phase, collective kind, group size): calls, bytes
        in and out, payload (``comm_bytes``) and implied traffic; empty without any
        (conventions: ``modelprof.counting.collectives``)."""
        return shown(collectives_frame(self.rows))

    @property
    def notes(self) -> dict[str, dict[str, int]]:
        """Ops whose count is not exact, with why and for how many calls (a grouped matmul on
        meta, whose group offsets have no values, is counted at its upper bound)."""
        return {n: dict(s.notes) for n, s in sorted(self._by_op.items()) if s.notes}

    def by_module_type(self) -> pd.DataFrame:
        """The leaf rows summed per module class, with the columns of :meth:`by_layer_type`
        (index ``type``). A ``(self)`` row carries its parent's class; :meth:`by_layer_type`
        types it by what it does instead."""
        return self._by_leaf_group(operator.attrgetter("type"), "type")

    def by_layer_type(self) -> pd.DataFrame:
        """The leaf rows summed per kind of layer (``conv``, ``linear``, ``attention``, ``norm``,
        ... see :mod:`modelprof.report.layer_types`), so the sums equal :attr:`totals`.

        Columns: ``calls`` (leaf calls), the additive costs, ``macs_pct`` and ``flops_pct``
        (their shares of the totals, %) and, when timed, ``latency_ms`` (sum of the leaves'
        instrumented latencies) and ``latency_pct`` (its share of the instrumented pass): what
        a kind of layer costs against what it takes; a training step's ``backward_macs``,
        ``backward_flops`` and, timed, ``backward_latency_ms`` too. With per-layer times, their
        rough flags (``latency_rough``, ``backward_latency_rough``): a sum with a rough row in it
        is rough. Index: ``layer_type``; sorted by FLOPs, largest first."""

        def kind(r: Row) -> str:
            return r.kind if r.kind in LAYER_TYPES else layer_type(r.type, r.ops, is_self=r.is_self)

        # ties (layers without FLOPs) in LAYER_TYPES order
        return self._by_leaf_group(kind, "layer_type", order=LAYER_TYPES.index)

    def _by_leaf_group(
        self, key: Callable[[Row], str], name: str, order: Callable[[str], int] | None = None
    ) -> pd.DataFrame:
        """The leaf rows summed by ``key`` of each into an index called ``name``, most FLOPs
        first (ties by ``order`` of the key, else first seen)."""
        leaves = [r for r in self.rows if r.leaf]
        keys = [key(r) for r in leaves]
        data: dict[str, Any] = {name: keys, "calls": [1] * len(leaves)}
        for c in COUNTED:
            data[c] = [int(getattr(r, c)) for r in leaves]
        if self.timed:
            data["latency_ms"] = [r.latency_ms for r in leaves]
            data["latency_pct"] = [r.latency_pct for r in leaves]
        step = ["backward_macs", "backward_flops"] if self.training_step is not None else []
        for c in step:
            data[c] = [int(getattr(r, c) or 0) for r in leaves]
        if step and self.training_step.timing is not None:
            data["backward_latency_ms"] = [r.backward_latency_ms for r in leaves]
        out = pd.DataFrame(data).groupby(name, sort=False).sum(min_count=1)
        flags = self._leaf_rough_flags()
        for flag, rough in flags.items():  # any rough leaf makes its group's sum rough
            out[flag] = pd.Series(rough).groupby(keys, sort=False).any().reindex(out.index)
        out["_order"] = [order(k) for k in out.index] if order else range(len(out))
        out = out.sort_values(["flops", "_order"], ascending=[False, True], kind="stable")
        out = out.drop(columns="_order").astype({c: "int64" for c in ["calls", *COUNTED, *step]})
        at = out.columns.get_loc("flops") + 1  # after flops: the cost shares (beside the
        for i, c in enumerate(("macs", "flops")):  # rows' own, NaN of a zero total)
            total = self.totals[c]
            out.insert(at + i, f"{c}_pct", 100.0 * out[c] / total if total else float("nan"))
        return shown(out, marks=list(flags))  # printed: the flags as their sums' marks (~)

    # -- exporters: each takes modelprof.render.options.ViewOptions, as view= or keywords --------
    def _table(
        self, view: Any
    ) -> tuple[pd.DataFrame, dict[str, Any] | None, dict[str, Any] | None]:
        """The frame to render, its totals row (the leaf sums) and its end-to-end row."""
        end_to_end: dict[str, Any] | None = None
        if self.latency is not None:
            end_to_end = {"latency_ms": self.latency.median_ms}
            if self.latency_unquotable is not None:  # the run says it is no figure to quote
                end_to_end["latency_ms_rough"] = True
            if self.backward_latency is not None:
                end_to_end["backward_latency_ms"] = self.backward_latency.median_ms
                if self.backward_latency_unquotable is not None:  # the forward's rule, own runs
                    end_to_end["backward_latency_ms_rough"] = True
        if view.group_by is not None:
            if view.style != "modelprof":
                raise ModelProfError(
                    f"group_by={view.group_by!r} sums the modelprof view; drop style={view.style!r}"
                )
            if view.depth is not None:
                raise ModelProfError(
                    f"group_by={view.group_by!r} sums the leaf rows; depth= does not apply"
                )
            df = (
                self.by_layer_type() if view.group_by == "layer_type" else self.by_module_type()
            ).reset_index()
            return df, _display_totals(self.totals), end_to_end
        if view.style == "torchstat":  # carries its own total row
            return self._torchstat_frame(view.depth), None, None
        return self.to_dataframe(), _display_totals(self.totals), end_to_end

    def _leaf_rough_flags(self) -> dict[str, list[bool]]:
        """The per-layer rough flags (``latency_rough``, ``backward_latency_rough``) of the leaf
        rows, in order; none where the report has no per-layer times."""
        if not self.timed:
            return {}
        df = self.to_dataframe()
        return {f: df.loc[df["leaf"], f].astype(bool).tolist() for f in _ROUGH_FLAGS if f in df}

    def _torchstat_frame(self, depth: int | None) -> pd.DataFrame:
        """torchstat's leaf table; with ``depth=k`` the tree collapsed to depth k (each row
        sums its subtree), so the rows still add up to the total. With per-layer times its
        ``latency_rough`` marks a rough row's duration, and the total's where any is rough."""
        # (a ViewOptions checked ``depth`` when it was made)
        chosen = [
            i
            for i, r in enumerate(self.rows)
            if (r.leaf if depth is None else r.depth == depth or (r.leaf and r.depth < depth))
        ]
        # the counts of a parent row are its subtree's already; its output and its share of the
        # time are its own span's: summed over the leaves below it (as depth=None shows them),
        # so that the total row does not change with depth
        below = {i: subtree_leaves(self.rows, i) for i in chosen}
        rows = [
            dataclasses.replace(
                self.rows[i],
                leaf=True,
                output_bytes=sum(self.rows[j].output_bytes for j in below[i]),
                latency_pct=_sum_measured(self.rows[j].latency_pct for j in below[i]),
            )
            for i in chosen
        ]
        df = torchstat_frame(rows, self.timed)
        flags = None if self.layer_timing is None else self.to_dataframe().get("latency_rough")
        if flags is not None:  # a sum with a rough part is rough
            rough = [
                any(bool(flags.iloc[j]) for j in below[i])
                for i in chosen
                if self.rows[i].kind == "module"
            ]
            df["latency_rough"] = [*rough, any(rough)]
        return df

    def _view(
        self, view: Any, options: dict[str, Any], *, compact: bool, **defaults: Any
    ) -> tuple[pd.DataFrame, Any, Any, Any]:
        """(frame, totals, end-to-end row, view options) for an exporter. ``compact``: the
        compact columns unless ``columns`` is given; ``defaults`` apply where neither ``view``
        nor the keywords set a value."""
        view = ViewOptions.parse(view, **options)
        df, totals, end_to_end = self._table(view)
        view = view.fit_for(view.columns, options).with_defaults(options, **defaults)
        update: dict[str, Any] = {}
        if view.style == "torchstat":
            update["depth"] = None  # already applied (group_by refused it in _table)
            if view.top_k is not None or view.sort_by is not None:  # the layers ranked, and
                # the total row last as ever: ranked with them it took a place of top_k's
                ranked = select_rows(df.iloc[:-1], top_k=view.top_k, sort_by=view.sort_by)
                df = pd.concat([ranked, df.iloc[-1:]])
                update.update(top_k=None, sort_by=None)
        per_layer = view.style == "modelprof" and view.group_by is None
        if compact and per_layer and view.columns is None:
            update["columns"] = compact_columns(df)
        elif compact and not per_layer and view.columns in (None, "compact"):
            # a grouped or torchstat table whole, its rough flags said by their marks (~)
            update["columns"] = [c for c in df.columns if c not in _ROUGH_FLAGS]
        return df, totals, end_to_end, view.replace(**update) if update else view

    def export(
        self,
        format: str,
        path: str | Path | None = None,
        *,
        view: Any = None,
        **options: Any,
    ) -> str | Path | list[Path]:
        """The table in any registered format (:mod:`modelprof.render.formats`, where each
        ``to_<format>`` is documented). A human format shows the compact columns unless
        ``columns`` says, the title as caption (HTML: the summary above the table, Markdown:
        listed below it, unless ``standalone=False``); a raw one every column, raw numbers, the
        totals and (JSON) the environment. ``view=ViewOptions(...)`` or its fields as keywords
        (``style``, ``columns``, ``depth``...; a keyword wins). Returns the text, or writes
        ``path`` and returns it as a :class:`~pathlib.Path` (one file). ``"png"``: the figures
        ``--format png`` writes, several files: returns the ``list`` of their paths
        (:meth:`export_png`)."""
        if is_figure_format(format):
            return self.export_png(path, view=view, **options)
        fmt = get_format(format)
        check_read_by(fmt.name, options)
        title = self._title()  # once: whether a (self) row reads short takes the whole frame
        df, totals, end_to_end, view = self._view(
            view,
            options,
            compact=fmt.human,
            priority=_LATEX_PRIORITY if self.training_step is None else _STEP_PRIORITY,
            caption=title,
            # a browser tab's or bookmark's title: the model, the caption under it in the page
            title=f"modelprof: {self.display_name}" if fmt.name == "html" else title,
            standalone=True,
            summary=tuple(self.summary().splitlines()) if fmt.human else (),
        )
        if not fmt.human:  # raw data: the model's totals as counted, and the environment
            totals = self.totals
        legend = title.removeprefix(self._head()).removeprefix(". ")
        if legend and view.caption not in (None, title) and legend not in view.caption:
            # a caption of the user's own keeps what the ~ marks mean (a paper sets one)
            view = view.replace(caption=f"{view.caption.rstrip('. ')}. {legend}")
        env = None if fmt.human else self._environment()
        return fmt.write(df, totals, end_to_end=end_to_end, env=env, path=path, view=view)

    def figures(self) -> list[tuple[str, Any]]:
        """The figures ``export("png", path)`` and ``modelprof profile --format png`` write, as
        ``(name, draw)``: ``flops`` (:meth:`plot_flops`) always, ``latency``
        (:meth:`plot_latency`) when the report is timed, ``roofline`` (:meth:`plot_roofline`)
        when it has the peaks too (none with ``roofline=False``)."""
        drawn = [("flops", self.plot_flops)]
        if self.timed:
            drawn += [("latency", self.plot_latency)]
        if self.timed and self.peaks is not None:
            drawn += [("roofline", self.plot_roofline)]
        return drawn

    def export_png(
        self, path: str | os.PathLike[str] | None, *, view: Any = None, **options: Any
    ) -> list[Path]:
        """Write :meth:`figures` as ``<stem>_<name>.png`` (``path`` ``out/resnet18.png`` or
        ``out/resnet18``: ``out/resnet18_flops.png``...; a folder: the model's name in it), as
        the command line's ``--format png`` does; returns the paths written (every figure is
        drawn before any is written: one that fails leaves none). A timed report without the
        roofline's peaks (``roofline=False``) writes no roofline, and a warning says so."""
        if view is not None or options:
            given = sorted(options) or ["view"]
            raise ModelProfError(
                f"export('png') takes no view options ({', '.join(given)}): it writes the "
                "figures --format png does; draw one your way with report.plot_latency(top_k="
                "10, save='out/latency.png') (also plot_flops, plot_roofline)"
            )
        if path is None:
            raise ModelProfError(
                "export('png') writes files and returns no text: give a path, "
                "report.export('png', 'out/model.png') (out/model_flops.png, ...), or draw a "
                "Figure with report.plot_flops(), plot_latency() or plot_roofline()"
            )
        stem = Path(path)
        if stem.is_dir() or str(path).endswith(("/", os.sep)):
            stem = stem / (re.sub(r"[^\w.+-]+", "_", self.display_name).strip("_") or "model")
        elif stem.suffix.lower() == ".png":
            stem = stem.with_suffix("")
        figures = self.figures()
        if self.timed and "roofline" not in dict(figures):
            warn_user(
                f"modelprof: export('png') writes no roofline figure: {_UNPROBED}, so it has no "
                "peaks to draw it against",
                ModelProfWarning,
            )
        drawn = {stem.with_name(f"{stem.name}_{name}.png"): draw() for name, draw in figures}
        for path_, fig in drawn.items():
            save_figure(fig, path_)
        return list(drawn)

    def _environment(self) -> dict[str, Any]:
        """What a raw export carries beside the table: the environment and the timing."""
        return {
            **self.env,
            "latency": self.latency.to_dict(samples=True) if self.latency is not None else None,
            "instrumentation_overhead": self.instrumentation_overhead,
            "coverage": self.coverage,
            "unsupported": self.unsupported,
            "timing_notes": self.timing_notes,
            "timing_agreement": dataclasses.asdict(self.timing_agreement)
            if self.timing_agreement is not None
            else None,
            "training_step": self.training_step.to_dict()
            if self.training_step is not None
            else None,
        }

    def to_text(
        self, path: str | Path | None = None, *, view: Any = None, **options: Any
    ) -> str | Path:
        """A plain-text table for terminals (the compact columns by default); a torchstat view
        ends with :meth:`flops_conventions`. Returns the text, or writes ``path`` and returns
        it."""
        text = str(self.export("text", None, view=view, **options))
        torchstat = options.get("style", getattr(view, "style", None)) == "torchstat"
        text += "\n" + self.flops_conventions() if torchstat else ""
        return emit(text if path is None else text + "\n", path)

    def flops_conventions(self) -> str:
        """One line on the two FLOP counts a torchstat view shows beside the summary."""
        ts = sum(r.torchstat_flops for r in self.rows if r.leaf and r.kind == "module")
        return (
            f"Flops (torchstat's formulas: one per multiply-add) = {format_count(ts)}; "
            f"the summary's FLOPs (2 per multiply-add + every other op) = "
            f"{format_count(self.totals['flops'])}"
        )

    @keywords_named
    def to_trace(
        self, path: str | Path | None = None, *, max_passes: int | None = None
    ) -> str | Path:
        """The per-layer timeline as a Chrome / Perfetto trace (JSON, Trace Event Format;
        :mod:`modelprof.render.trace`): one track per instrumented pass, each module call a
        slice with its MACs, FLOPs and bytes; with ``backward=True`` a second process for the
        backward. ``max_passes``: the first n passes only."""
        processes = self._trace_timelines(max_passes)
        meta = {
            "model": self.model_name,
            "input": self.input_shape,
            "device": self.device,
            "dtype": self.dtype,
            "batch_size": self.batch_size,
            "times": "microseconds from each pass's start, as the per-layer stamps read "
            "them (the hooks' own cost included)",
        }
        return write_trace(trace_document(processes, meta), path)

    def _trace_timelines(self, max_passes: int | None) -> dict[str, list[Any]]:
        """The forward (and backward) passes as :class:`~modelprof.render.trace.PassTimeline`s."""
        timing = self.layer_timing
        offsets = getattr(timing, "start_offsets_ms", None)
        if timing is None or offsets is None or timing.raw_samples is None:
            raise ModelProfError(
                "to_trace needs the per-layer timeline of a timed report: profile(..., timing=True)"
            )
        if max_passes is not None:
            max_passes = check_int("max_passes", max_passes)
        by_key = {(r.module, r.call): r for r in self.rows if not r.is_self and r.kind == "module"}
        n = offsets.shape[0] if max_passes is None else min(max_passes, offsets.shape[0])
        forward = []
        for p in range(n):
            t = PassTimeline(f"forward pass {p + 1}", timing.passes_ms[p])
            for i, key in enumerate(timing.order):
                row = by_key.get(key)
                t.add(call_label(*key), offsets[p, i], timing.raw_samples[key][p], cost_args(row))
            forward.append(t)
        out = {"forward": forward}
        step = self.training_step
        segments = getattr(getattr(step, "timing", None), "segments", None)
        if segments:
            by_record = {r.record: r for r in self.rows if not r.is_self and r.kind == "module"}
            loss = next((r for r in self.rows if r.kind == "loss"), None)
            out["backward"] = [
                self._backward_timeline(p, cols, ms, by_record, loss)
                for p, (cols, ms) in enumerate(segments[:n])
            ]
        return out

    @staticmethod
    def _backward_timeline(
        p: int, columns: Any, ms: Any, by_record: dict[int, Row], loss: Row | None
    ) -> Any:
        """One backward pass: each run of consecutive stretches of one call is a slice."""
        t = PassTimeline(f"backward pass {p + 1}", float(sum(ms)))
        start = 0.0
        for column, run in itertools.groupby(zip(columns, ms), key=operator.itemgetter(0)):
            dur = float(sum(m for _, m in run))
            row = by_record.get(int(column), loss)
            name = "(loss)" if row is loss or row is None else call_label(row.module, row.call)
            t.add(name, start, dur, cost_args(row))
            start += dur
        return t

    # -- plots ----------------------------------------------------------------------------------
    def plot_latency(self, top_k: int = 20, **kw: Any):
        """Bar chart of the slowest leaf calls (needs ``timing=True``); a training step's
        backward with ``column="backward_latency_ms"``."""
        if not self.timed:
            raise ModelProfError("plot_latency needs a timed report: profile(..., timing=True)")
        return plot_latency(self._with_percentiles(self.to_dataframe()), top_k, **kw)

    def _with_percentiles(self, df: pd.DataFrame) -> pd.DataFrame:
        """``df`` with ``latency_p10_ms``/``latency_p90_ms`` over the instrumented passes, for
        error bars: of the samples whose median is the row's ``latency_ms`` (one rule for both,
        ``modelprof.timing.columns``)."""
        if not getattr(self.layer_timing, "samples", None):
            return df
        return df.assign(
            latency_p10_ms=[r.latency_p10_ms for r in self.rows],
            latency_p90_ms=[r.latency_p90_ms for r in self.rows],
        )

    def plot_flops(self, top_k: int = 20, **kw: Any):
        """Bar chart of the leaf calls with the most FLOPs."""
        return plot_flops(self.to_dataframe(), top_k, **kw)

    def plot_roofline(self, peaks: Any = None, **kw: Any):
        """Each leaf call as a point under the device's roofline (the report's peaks, or
        ``peaks``). A view never measures: without peaks it says how to get them."""
        peaks = peaks or self.peaks
        if peaks is None:  # timed without them: roofline=False was asked (as utilization says)
            why = _UNPROBED if self.timed else "it was not timed (timing=False)"
            raise ModelProfError(
                f"this report has no peaks to draw the roofline against: {why}; profile "
                "with timing and roofline=None (which probes the device), or pass "
                "peaks=modelprof.timing.peaks."
                f"probe_peaks({self.device!r}) or lookup_peaks('<device name>', "
                f"{report_peak_dtype(self)!r})"
            )
        df = self.to_dataframe()  # (the roofs a row proves: by its span as read)
        return plot_roofline(with_read_times(df, self) if self.timed else df, peaks, **kw)

    # -- display --------------------------------------------------------------------------------
    def _title(self) -> str:
        """The caption of an export: the model (a torchvision architecture by its builder's name,
        ``resnet50``, not its class ``ResNet``) and its run, and why rows are marked rough."""
        title = self._head()
        whole = self.latency_unquotable
        if whole is not None:
            title += f". The end-to-end latency marked ~ is no figure to quote: {whole}"
        whole = self.backward_latency_unquotable
        if whole is not None:
            title += f". The end-to-end backward marked ~ is no figure to quote: {whole}"
        reason = self._rough_reason()
        if reason is None and self.layer_timing is not None:
            reason = _short_rows_reason(self.to_dataframe())  # (layers not rough)
        backward = self.backward_agreement
        if backward is not None and not (backward.agree or backward.between_regimes):
            why = {
                "stamps": "they include the per-node stamps' cost",
                "imprecise": "they and the clean backward are too noisy to compare",
                "leaves": "their medians do not add up to the backward",
                "window": "they were read in a window slower than the clean backward's",
            }.get(backward.verdict, "they disagree with the clean backward")
            reason = "; ".join(r for r in (reason, f"backward times: {why}") if r)
        return title if reason is None else f"{title}. Per-layer times marked ~ are rough: {reason}"

    @property
    def display_name(self) -> str:
        """The model as the caption, the summary and the figures' files name it: a torchvision
        architecture's builder (``resnet18``, by its class and parameter count), else
        ``model_name`` (the class, or the name given)."""
        return display_name(self.model_name, int(self.totals.get("params") or 0))

    def _head(self) -> str:
        """The caption's first sentence: the model and its run."""
        model = self.display_name
        return (
            f"{model}, input {self.input_shape}, {self._dtype_words()} on "
            f"{self.env.get('device_name', self.device)}"
        )

    def _dtype_words(self) -> str:
        """The inputs' dtype and how the run changed what the kernels saw: ``float32 under
        bfloat16 autocast, channels_last`` (the counts and times are of that run; the layout
        said where an input is 4-D, the tensors channels_last converts)."""
        mode = self.env.get("mode") or {}
        words = [str(self.dtype)]
        if mode.get("amp"):
            words[0] += f" under {str(mode['amp']).removeprefix('torch.')} autocast"
        shapes = re.findall(r"\d+(?:x\d+)*", str(self.input_shape))  # "1x3x8x8, 1x4"
        if mode.get("channels_last") and any(s.count("x") == 3 for s in shapes):
            words.append("channels_last")
        return ", ".join(words)

    @property
    def latency_unquotable(self) -> str | None:
        """Why the clean end-to-end median (``latency``) is no figure to quote, as the run's own
        checks say (marked ~ in the end-to-end row and said in the caption; a sweep's
        ``latency_unquotable`` column); else None (and untimed)."""
        a, m = self.timing_agreement, self.latency
        if m is None:
            return None
        reasons = []
        if a is not None and a.verdict == "imprecise" and a.quote != "clean":
            reasons.append("the per-layer and clean runs are too noisy to compare")
        if a is not None and a.verdict == "disagree" and a.quote == "per-layer" and not a.regimes:
            reasons.append("the clean runs were slowed (quote the (root) row)")
        return "; ".join(reasons + unquotable(m)) or None

    @property
    def backward_latency_unquotable(self) -> str | None:
        """Why the clean end-to-end backward median (``backward_latency``) is no figure to
        quote, by the forward's rule on its own runs (``unquotable``: loaded, too few runs; a
        sweep's ``backward_latency_unquotable`` column); else None (and untimed)."""
        m = self.backward_latency
        return None if m is None else "; ".join(unquotable(m)) or None

    def _rough_reason(self) -> str | None:
        """Why the per-layer times are rough (:attr:`layers_rough`), in a few words; else None."""
        a, lt = self.timing_agreement, self.layer_timing
        if lt is None:
            return None
        # (the clean runs slowed beyond both intervals: the rows are the figures to quote)
        slowed = a is not None and a.verdict == "disagree" and a.quote == "per-layer"
        if a is not None and not a.agree and not a.regimes and not slowed:
            return {
                "identical": "identical layers read far apart",
                "leaves": "the leaf rows add up to more than the model",
                "short": "the leaf rows add up to far less than the model (load)",
                "imprecise": "the per-layer and clean runs are too noisy to compare",
            }.get(a.verdict, "the per-layer passes disagree with the clean runs")
        if lt.n < 2 or (lt.min_samples is not None and lt.n < lt.min_samples):
            plural = "es" if lt.n != 1 else ""
            return f"{lt.n} per-layer pass{plural}, fewer than the stop rule promises"
        return None

    def summary(self) -> str:
        t = self.totals
        lines = [
            f"{self.display_name} on input {self.input_shape} ({self._dtype_words()}, "
            f"{self.device}, batch {self.batch_size})",
            f"params {t['params']:,}  MACs {t['macs']:,}  FLOPs {t['flops']:,}  "
            f"read {t['read_bytes']:,} B  write {t['write_bytes']:,} B",
        ]
        if self.memory is not None:
            est = self.memory_estimate().loc["total"]
            lines.append(
                f"estimated memory: inference {format_bytes(est['inference'])}, "
                f"training step {format_bytes(est['training_step'])} "
                "(report.memory_estimate())"
            )
        if t.get("frozen_params"):
            lines.append(
                f"trainable params {t['trainable_params']:,}, frozen "
                f"{t['frozen_params']:,} (requires_grad=False)"
            )
        idle = [r for r in self.rows if r.module == NOT_CALLED]
        if idle:
            lines.append(
                f"({idle[0].params:,} of the params are in modules this forward did "
                f"not call: {idle[0].type}; row {NOT_CALLED!r})"
            )
        if self.peaks is not None and self.peaks.loaded:
            lines.append(loaded_probe_note(self.peaks, run_peaks(self)))
        if self.latency is not None:
            lines.extend(self._timing_summary())
            if self.peaks is not None:
                used = self.utilization()
                lines.append(used.describe() + self._mfu_quoted(used))
        else:  # a counting-only report still says why (device="meta": counting only)
            lines.extend(f"note: {n}" for n in self.timing_notes)
        if self.training_step is not None:
            lines.append(self.training_step.summary())
        if self.unsupported:
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.unsupported.items()))
            lines.append(f"ops with no formula (counted as 0 FLOPs): {ops}")
        for op, notes in self.notes.items():
            for note, calls in notes.items():
                lines.append(f"{op} x{calls}: {note}")
        return "\n".join(lines)

    def _timing_summary(self) -> list[str]:
        """The summary's timing lines: end to end, CPU work on a loaded CPU, the per-layer rows
        against that figure, a disagreement between the two windows, then the notes."""
        m = self.latency
        lo, hi = m.median_ci_ms
        ci = f"95% CI {lo:.3f}-{hi:.3f}" if m.has_interval else "95% CI n/a"
        clock = str((m.env.get("mode") or {}).get("clock"))  # clock="cpu": CPU time, not wall
        runs = "clean end-to-end runs"
        if clock.startswith("thread_time"):
            runs += f", CPU time: {clock}"
        elif clock.startswith("process_time"):  # several threads' work: above the latency
            runs += f", CPU time: {clock}, all threads' work, not a latency"
        lines = [
            f"latency median {m.median_ms:.3f} ms ({ci}, p90 {m.p90_ms:.3f}, n={m.n}), "
            f"{m.fps:.1f} samples/s at that median ({runs}){_latency_caveats(m)}"
        ]
        p = self.pipelined
        if p is not None and p.has_interval:
            plo, phi = p.median_ci_ms
            lines.append(
                f"pipelined (back to back) {p.median_ms:.3f} ms per call (95% CI {plo:.3f}-"
                f"{phi:.3f}), {p.fps:.1f} samples/s at that median: the throughput of a full "
                "stream"
            )
        if m.loaded:
            line = f"the machine was loaded ({m.load_reason}): the wall clock includes waiting"
            if m.cpu is not None:
                held = (
                    "not waiting for a core (the other work can still slow the work "
                    "itself); it equals latency only on an idle core"
                    if m.cpu_holds
                    else "stretched too: several threads spin while one waits for a core"
                )
                line += f"; CPU work {m.cpu.median_ms:.3f} ms ({m.cpu_clock}), {held}"
            lines.append(line)
        agreement = self.timing_agreement
        share = f"{100 * self.coverage:.1f}% of the end-to-end median"
        covered = (
            f"leaf coverage {share}"
            if agreement is None
            else f"leaves sum to {agreement.leaf_sum_ms:.3f} ms, {share}"
        )
        if getattr(self.layer_timing, "gpu", False):  # kernel time: the busy share, not a sum
            covered = f"kernel time, the GPU busy {share} (timing_notes: launch-bound layers)"
        lines.append(f"per-layer rows: {covered}; {self._instrument_words()}")
        if self.layer_timing is not None and not getattr(self.layer_timing, "gpu", False):
            lines.append(_SHARE_NOTE)  # (a GPU's: of its kernel time, the root's 100 %)
        skip = None if agreement is None or agreement.agree else agreement.note()
        if skip is not None:
            lines.append(f"!! {skip}")
        backward = self.backward_agreement
        loud = (backward.note(),) if backward is not None and backward.alarming else ()
        lines.extend(
            f"{'!!' if n in loud else 'note:'} {n}" for n in self.timing_notes if n != skip
        )
        return lines

    def _mfu_quoted(self, used: Any) -> str:
        """Where the check says to quote the (root) row's time, not the slowed clean median the
        MFU of ``used`` (the summary's utilization) is taken over: the MFU over that time."""
        a = self.timing_agreement
        if a is None or a.verdict != "disagree" or a.regimes or a.quote != "per-layer":
            return ""
        phases = used.phases.set_index("phase")
        if "forward" not in phases.index or not a.quote_ms > 0:
            return ""
        forward = phases.loc["forward"]  # its MFU over its own time (a step's: the step's forward)
        mfu = float(forward["mfu"]) * float(forward["time_ms"]) / a.quote_ms
        return (
            f"; over the (root) row's {a.quote_ms:.3f} ms, the figure to quote (the clean "
            f"median {a.clean_ms:.3f} ms was slowed): the forward's MFU {mfu:.3g}"
        )

    def _instrument_words(self) -> str:
        """What the per-layer passes cost, in words (a bare ``x0.747`` reads as a saving)."""
        x = self.instrumentation_overhead
        if x is None:
            return "the hooked passes' cost was not measured"
        if round(100 * abs(x - 1), 1) == 0:  # (0.0 % either way: no difference to read)
            return "the hooked passes ran as fast as the plain passes beside them"
        if x >= 1:
            said = f"the hooked passes ran {100 * (x - 1):.1f} % slower than the plain passes "
            hooks = self._hooks_share()
            if hooks is None or x - 1 <= 2 * hooks + 0.05:
                return said + "beside them (the hooks' cost)"
            return (  # a newcomer read 44.7 % "the hooks' cost" where they measured 7.6 %
                f"{said}beside them, of which the hooks' measured cost explains about "
                f"{100 * hooks:.1f} %: the rest is other work on the machine"
            )
        return (
            f"the hooked passes ran {100 * (1 - x):.1f} % faster than the plain passes "
            "beside them: the machine's noise is larger than the hooks' cost"
        )

    def _hooks_share(self) -> float | None:
        """The share of a plain pass the hooks' measured cost adds (its per-call cost times the
        calls of a pass); None where it was not measured."""
        lt = self.layer_timing
        cost = getattr(lt, "hook_cost", None)
        plain = getattr(lt, "plain_ms", None)
        if cost is None or plain is None or not plain.size or np.median(plain) <= 0:
            return None
        return cost.per_call_ms * len(lt.order) / float(np.median(plain))

    def __repr__(self) -> str:
        return self.summary() + "\n" + self.to_text(max_rows=60)

    def _repr_html_(self) -> str:
        """The notebook display: the summary and the compact table, every row shown."""
        table = self.export("html", standalone=False)
        return html_notebook(self.summary().splitlines(), str(table))


def loaded_probe_note(peaks: Any, used: Any) -> str:
    """The summary's line on roofs probed on a busy machine, naming the roofs of ``used`` (the
    run's one peak, ``run_peaks``) raised above them: the MFU beside it uses those."""
    raised = []
    if used.peak_flops > peaks.peak_flops:
        raised.append(f"compute {format_rate(used.peak_flops, 'FLOP/s')}")
    if used.peak_bytes > peaks.peak_bytes:
        raised.append(f"memory {format_rate(used.peak_bytes, 'B/s')}")
    used_text = (
        f"; the roofs used here are raised to what layers of this run reached ({', '.join(raised)})"
        if raised
        else ""
    )
    return (
        f"note: the roofline probe ran on a busy machine ({peaks.load_reason}): its roofs (compute "
        f"{format_rate(peaks.peak_flops, 'FLOP/s')}, memory "
        f"{format_rate(peaks.peak_bytes, 'B/s')}) read low{used_text}, and every efficiency, MFU "
        "and MBU judged against them is marked (efficiency_loaded, mfu_rough, mbu_rough); probe "
        "again on a quiet machine, or pass roofline=lookup_peaks(...)"
    )


#: what the table's latency share is of, under it: a newcomer read the root row's 99.89 % as a
#: loss (``layer_columns``: over the median corrected pass, timed from outside the model's call)
_SHARE_NOTE = (
    "note: latency share is a row's median over the median instrumented pass, timed from outside "
    "the model's call: (root)'s falls short of 100 % by the pass's time outside its own stamps"
)


def _latency_caveats(m: Any) -> str:
    """What the summary's latency line adds about its own runs: a drift (the DriftWarning alone
    said it: a trial's -46 % read as a plain median), and why sampling stopped where it stopped
    short of its precision (a trial's n=10 and +28 % interval went unexplained), in the
    Measurement's own words (``stop_text``)."""
    words = ""
    if m.stable is False:
        words += f"; drifted {m.drift_pct:+.1f} % over its runs: the median describes that window"
    if m.stop_reason not in ("precision", "repeat"):
        target = f" ±{m.precision:.1%}" if m.precision is not None else ""
        words += f"; short of its{target} precision: stop={m.stop_text}"
    return words


def _sum_measured(values: Iterable[float]) -> float:
    """The sum of the measured values (NaN: not measured), NaN where none was."""
    measured = [v for v in values if not math.isnan(v)]
    return float(sum(measured)) if measured else math.nan


def _display_totals(totals: Mapping[str, int]) -> dict[str, int]:
    """The leaf sums a table's footer shows, without ``output_bytes`` (``write_bytes`` says
    it)."""
    return {k: v for k, v in totals.items() if k != "output_bytes"}


def display_name(class_name: str, params: int) -> str:
    """The one naming rule of profile's reports and compare's rows: the torchvision builder of a
    ``class_name`` model with ``params`` parameters (``resnet18``), else the class."""
    return _torchvision_name(class_name, params) or class_name


@functools.lru_cache(maxsize=64)
def _torchvision_name(class_name: str, params: int) -> str | None:
    """The torchvision architecture of class ``class_name`` with ``params`` parameters
    (``("ResNet", 25_557_032) -> "resnet50"``): the one builder whose published weights have
    that many, built on meta to check its class; else None."""
    try:
        from torchvision import models as tvm
    except ImportError:
        return None
    found = []
    for name in tvm.list_models(module=tvm):
        try:
            weights = list(tvm.get_model_weights(name))
        except Exception:  # noqa: BLE001 - a builder without weights names nothing
            continue
        if any(w.meta.get("num_params") == params for w in weights):
            found.append(name)
    if len(found) != 1:
        return None
    try:
        with torch.device("meta"), warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            warnings.simplefilter("ignore")
            built = tvm.get_model(found[0], weights=None)
    except Exception:  # noqa: BLE001 - a builder that cannot run on meta names nothing
        return None
    return found[0] if type(built).__name__ == class_name else None


#: why rows read short (:func:`_short_row_causes`), in the caption's words
_SHORT_WORDS = {
    "zero": "rows at 0 though they did work (the hooks' measured cost took all of a span)",
    "own": "(self) rows (a parent's span less its children's) read faster than their roof",
    "cut": "rows read faster than their roof once the hooks' measured cost took more than half "
    "of a span",
    "scattered": "rows faster than their roof whose passes scatter wider than their median "
    "(the machine's load)",
}


def _short_rows_reason(df: pd.DataFrame) -> str | None:
    """The causes of the ``latency_rough`` rows of a report whose layers are not rough as a
    whole (each such row read short: :func:`_short_row_causes`), in words; None for none."""
    rough = df.get("latency_rough", pd.Series(False, index=df.index)).fillna(False).astype(bool)
    if not rough.any():
        return None
    causes = _short_row_causes(df)
    named = [_SHORT_WORDS[k] for k, rows in causes.items() if (rows & rough).any()]
    return "; ".join(named) or "rows read shorter than their work allows"


def _short_own_rows(df: pd.DataFrame) -> pd.Series:
    """Per row: rough by any of :func:`_short_row_causes` (its time read short)."""
    short = pd.Series(False, index=df.index)
    for rows in _short_row_causes(df).values():
        short |= rows
    return short


def _short_row_causes(df: pd.DataFrame) -> dict[str, pd.Series]:
    """Per row, by cause, whether its time read short: ``zero``, a row at 0 though it did work
    (the hooks' correction took its whole span, or its parent's own time); ``own``, a
    ``(self)`` row (its parent's span less its children's) faster than the roof it is judged
    against (efficiency above 1, which for a measured row raises the probed roof instead);
    ``cut``, a measured row's faster than its roof where the hooks' correction took more than
    half of its span as read (``PROOF_COLUMN``: it proved none, ``roof_proofs``);
    ``scattered``, one faster than its roof whose passes scatter wider than
    its median (:func:`scattered`: it proved none). Above a roof given or looked up, a row's
    time stands otherwise, its efficiency above 1 saying so."""
    work = (df["flops"] > 0) | (df["read_bytes"] + df["write_bytes"] > 0)
    causes = {"zero": (df["latency_ms"] <= 0) & work}
    if "efficiency" in df.columns:
        above = df["efficiency"] > 1
        read = df.get(PROOF_COLUMN, pd.Series(np.nan, index=df.index))
        causes["own"] = above & pd.Series(own_rows(df), index=df.index)
        causes["cut"] = above & (df["latency_ms"] < read / 2)  # (NaN: not read, False)
        causes["scattered"] = above & pd.Series(scattered(df), index=df.index)
    return causes
