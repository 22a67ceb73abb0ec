"""``GenerationReport``: the phases, measured generations, KV cache, memory plan, roofline bound
and MoE routing of one ``profile_generation`` run. The DataFrames stay numeric."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from modelprof.errors import ModelProfError, TimingDisagreementWarning, warn_user
from modelprof.generation.bound import bound_rows, phase_bound, row_bounds
from modelprof.generation.cache import KVCacheInfo
from modelprof.generation.memory import MemoryPlan
from modelprof.generation.moe import MoEInfo
from modelprof.generation.phases import Phase
from modelprof.generation.plots import plot_decode_growth, plot_phase_share
from modelprof.generation.spec import GenerationSpec
from modelprof.generation.timing import GenerationTiming, fit_slope, rate_flags, stable_flags
from modelprof.render._output import emit
from modelprof.render.formats import Exports, export, get_format
from modelprof.render.html import html_notebook
from modelprof.render.markdown import prose
from modelprof.render.options import ViewOptions, check_read_by
from modelprof.render.units import format_rate
from modelprof.render.views import ROUGH_MARK, compact_columns, default_priority
from modelprof.report.frames import shown
from modelprof.report.utilization import RATIOS, Utilization
from modelprof.runtime.env import jsonable
from modelprof.timing.agreement import NeighbourDisagreement, SeriesPoint, neighbour_disagreements
from modelprof.timing.measurement import quieter_machine, unquotable

__all__ = ["GenerationReport"]

_GROWTH = ("macs", "flops", "read_bytes", "write_bytes")


def _slope(x: pd.Series, y: pd.Series) -> float:
    """Least-squares slope of ``y`` on ``x``: exact (in fractions) for whole numbers, so a
    counted growth of 2048 a token reads 2048.0; ``polyfit`` for measured times."""
    xs, ys = list(x), list(y)
    if not all(float(v).is_integer() for v in (*xs, *ys)):
        return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])
    fx = [Fraction(int(v)) for v in xs]
    fy = [Fraction(int(v)) for v in ys]
    mx, my = sum(fx) / len(fx), sum(fy) / len(fy)
    spread = sum((a - mx) ** 2 for a in fx)
    return float(sum((a - mx) * (b - my) for a, b in zip(fx, fy)) / spread) if spread else 0.0


def _kv_words(kv: Any) -> str:
    """The KV cache in words: bytes per token beside the closed form, except where the cache
    does not hold one entry per token seen (a static cache's capacity; a sliding window's
    fewer tokens), which a per-token figure would read as a mismatch."""
    kind = "self-attention " if kv.cross_bytes else ""
    cf = kv.closed_form_per_token
    if kv.allocated:  # a static cache: its capacity, allocated up front
        held = kv.total_bytes - kv.constant_bytes  # (a state or cross-attention: said after)
        room = held // (cf * kv.batch_size) if cf else None
        at = f" (room for {room} tokens at the closed form's {cf} bytes/token)" if room else ""
        return f"{kind}{held:,} bytes allocated{at}, holding {kv.tokens} tokens"
    if kv.matches_closed_form and cf and round(kv.per_token_bytes) != cf:
        return (
            f"{kind}{kv.total_bytes:,} bytes at {kv.tokens} tokens, the closed form's: a "
            f"sliding window holds fewer tokens than seen ({cf} bytes per token held)"
        )
    beside = "no closed form for this model" if cf is None else f"closed form {cf}"
    return (
        f"{kind}{kv.per_token_bytes:,.0f} bytes/token ({beside}), {kv.total_bytes:,} "
        f"bytes at {kv.tokens} tokens"
    )


#: the view options that select or shape a table, whoever's view carries them
_SHAPING = frozenset(
    "style group_by columns depth leaf_only top_k sort_by units show_totals max_rows".split()
)


def _median_text(m: Any, rough: bool = False) -> str:
    """``12.345 ms (12.001-12.700)``: a median with its 95 % interval, or why there is none;
    ``rough`` (the summary's ``*_rough``): marked ``~``, as the notes below it say."""
    mark = ROUGH_MARK if rough else ""
    if not m.has_interval:
        why = m.short_reason or f"no interval from {m.n} runs in {m.n_blocks} blocks"
        return f"{mark}{m.median_ms:.3f} ms ({why})"
    lo, hi = m.median_ci_ms
    return f"{mark}{m.median_ms:.3f} ms ({lo:.3f}-{hi:.3f})"


@dataclasses.dataclass(eq=False, repr=False)
class GenerationReport(Exports):
    """Everything ``profile_generation`` found, per batch size (``phase_tables``: the phases;
    ``timings``: the measured generations); ``export``/``to_<format>`` write it."""

    model_name: str
    spec: GenerationSpec
    device: str
    dtype: str
    phase_tables: dict[int, list[Phase]]
    timings: dict[int, GenerationTiming]
    kv: KVCacheInfo | None
    memory: MemoryPlan | None
    peaks: Any = None
    moe: MoEInfo | None = None
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: timed points slower than a neighbour doing more work (``_neighbours``), warned once each
    disagreements: list[NeighbourDisagreement] = dataclasses.field(init=False)
    #: the timing option ``warn``: False keeps the disagreements' notes, without a warning
    warn: bool = dataclasses.field(default=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.disagreements = _neighbours(self.phase_tables, self.timings)
        for d in self.disagreements if self.warn else ():
            warn_user(f"modelprof: {d.note()}", TimingDisagreementWarning)

    @property
    def timing_notes(self) -> list[str]:
        """A sentence for each of ``disagreements`` and each point the machine's load or too
        few runs left no figure to quote (the ``*_rough`` columns; measuring warned of each)."""
        return [d.note() for d in self.disagreements] + [n for _, _, n in self._unquotable]

    @functools.cached_property
    def _unquotable(self) -> list[tuple[str, str, str]]:
        """(series, point, note) of each timed figure read on a loaded machine or from too few
        runs: TTFT, TPOT and the end to end of a batch size, and a phase's plain runs."""
        found = []
        for b, t in self.timings.items():
            for kind, series in _FIGURES.items():
                m = getattr(t, kind)
                if m is not None and unquotable(m):
                    label = f"{_FIGURE_NAMES[kind]} at batch {b}"
                    note = _unquotable_note(label, m, f"{kind}_cpu_ms")
                    found.append((series, f"batch {b}", note))
        for p in (p for ps in self.phase_tables.values() for p in ps):
            m = p.report.latency
            if m is not None and unquotable(m):
                point = _phase_point(p)
                found.append((_PHASES, point, _unquotable_note(point, m)))
        return found

    def _rough(self, series: str, point: str) -> bool:
        return any(d.series == series and d.point == point for d in self.disagreements) or any(
            s == series and at == point for s, at, _ in self._unquotable
        )

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(self.phase_tables)

    def phases(self, batch_size: int | None = None) -> list[Phase]:
        """The encoder (if any), prefill and decode steps of ``batch_size`` (default: the first)."""
        return self.phase_tables[self._batch(batch_size)]

    def prefill(self, batch_size: int | None = None) -> Phase:
        return next(p for p in self.phases(batch_size) if p.name == "prefill")

    def encoder(self, batch_size: int | None = None) -> Phase:
        """An encoder-decoder's encoder phase: its one forward over the source."""
        found = [p for p in self.phases(batch_size) if p.name == "encoder"]
        if not found:
            raise ModelProfError(f"{self.model_name} has no encoder phase (no encoder-decoder)")
        return found[0]

    def decode(self, context: int | None = None, batch_size: int | None = None) -> Phase:
        """The decode step at ``context`` (default: the last one profiled)."""
        steps = [p for p in self.phases(batch_size) if p.name == "decode"]
        found = [p for p in steps if context in (None, p.context)]
        if found:
            return found[-1]
        raise ModelProfError(
            f"context={context!r} was not profiled; the decode contexts are "
            f"{[p.context for p in steps]}"
        )

    def _every(self, batch_size: int | None) -> list[Phase]:
        """The phases of every batch size profiled, or of ``batch_size``."""
        sizes = self.batch_sizes if batch_size is None else [self._batch(batch_size)]
        return [p for b in sizes for p in self.phases(b)]

    def _batch(self, batch_size: int | None) -> int:
        if batch_size is None:
            return self.batch_sizes[0]
        if batch_size not in self.phase_tables:
            raise ModelProfError(
                f"batch_size={batch_size!r} was not profiled; the batch sizes "
                f"are {list(self.batch_sizes)}"
            )
        return batch_size

    @property
    def timing(self) -> GenerationTiming | None:
        """The measured generations of the first batch size (None when not timed)."""
        return self.timings.get(self.batch_sizes[0])

    def to_dataframe(self, batch_size: int | None = None) -> pd.DataFrame:
        """Every phase's per-layer table under ``phase``, ``context`` and ``batch_size`` columns,
        of every batch size profiled (or of ``batch_size``); with a target, ``bound_ms``
        (roofline lower bound) and ``bound``. A rough phase's timed rows are rough."""
        frames = []
        for p in self._every(batch_size):
            df = _tagged(self.phase_frame(p), p)
            if self.peaks is not None:
                bounds = row_bounds(df, self.peaks)
                df["bound_ms"], df["bound"] = bounds["bound_ms"], bounds["bound"]
            frames.append(df)
        return pd.concat(frames, ignore_index=True)

    def phase_frame(self, phase: Phase) -> pd.DataFrame:
        """``phase``'s per-layer table, its timed rows rough (``latency_rough``) where the
        phase's time is (slower than a phase doing more work, or read on a loaded machine)."""
        df = phase.report.to_dataframe()
        if "latency_rough" in df.columns and self._rough(_PHASES, _phase_point(phase)):
            df["latency_rough"] = df["latency_ms"].notna()
        return df

    def phase_table(self, batch_size: int | None = None) -> pd.DataFrame:
        """One row per phase of every batch size (or of ``batch_size``): counted totals, KV bytes
        after it, median of the per-layer passes' plain runs, the instrument's cost
        (instrumented / plain) and, with a target, the bound. ``latency_rough`` (``~``, the
        caption says why): slower than a phase doing more work, beyond both intervals, or no
        figure to quote by its own runs (``unquotable``: read on a loaded machine, too few)."""
        rows, phases = [], self._every(batch_size)
        for p in phases:
            t, latency, overhead = p.totals, p.report.latency, p.report.instrumentation_overhead
            row = {
                "phase": p.name,
                "context": p.context,
                "tokens": p.tokens,
                "batch_size": p.batch_size,
                **{k: t[k] for k in ("params", *_GROWTH)},
                "kv_cache_bytes": p.kv.total_bytes if p.kv is not None else float("nan"),
                "latency_ms": latency.median_ms if latency is not None else float("nan"),
                "instrumentation_overhead": overhead if overhead is not None else float("nan"),
            }
            if self.peaks is not None:
                row.update(phase_bound(p.report, self.peaks))
            if latency is not None:
                row["latency_rough"] = self._rough(_PHASES, _phase_point(p))
            rows.append(row)
        caption = [c for c in (self._bound_caption(), self._phases_rough(phases)) if c]
        return shown(pd.DataFrame(rows), caption=". ".join(caption) or None)

    def _phases_rough(self, phases: list[Phase]) -> str | None:
        """The caption's line on the phases marked ``~``, grouped by why; None when none is."""
        why: dict[str, list[str]] = {}  # reasons -> the phases they mark, in order
        for p in phases:
            m, point = p.report.latency, _phase_point(p)
            if m is None or not self._rough(_PHASES, point):
                continue
            reasons = unquotable(m)
            if any(d.series == _PHASES and d.point == point for d in self.disagreements):
                reasons.append("slower than a phase doing more work")
            why.setdefault("; ".join(reasons), []).append(point)
        if not why:
            return None
        groups = "; ".join(f"{r}: {', '.join(points)}" for r, points in why.items())
        return f"latency marked ~ is no figure to quote ({groups})"

    def _bound_caption(self) -> str | None:
        """What the ``bound_*`` columns are against: the datasheet variant, named."""
        p = self.peaks
        if p is None:
            return None
        return (
            f"bound_*: roofline lower bound on {p.device} ({p.dtype}, datasheet: "
            f"{format_rate(p.peak_flops, 'FLOP/s')}, {format_rate(p.peak_bytes, 'B/s')}); "
            "a bound, not a measurement"
        )

    def utilization(
        self,
        peak: Any = None,
        *,
        flops: str = "2macs",
        causal: str = "counted",
        batch_size: int | None = None,
    ) -> Any:
        """MFU, HFU and MBU of every phase and layer (``Report.utilization`` per phase, under
        ``phase`` and ``context`` columns; a phase's time is its per-layer passes' plain median).
        ``causal="half"`` halves the prefill's attention only. Of ``batch_size``, default the
        first (one batch size's phases: a figure per phase, not one per batch). Where
        generations were timed, ``phases`` adds ``generation_ms`` (TTFT for the prefill, the
        median step at a decode step's context) and ``mfu_generation``, ``mbu_generation`` over
        it. Rough (``~``) as the report marks the time beneath: ``time_rough`` where the phase
        table marks the phase's, ``generation_rough`` where the summary marks the TTFT (the
        TPOT, whose runs a decode step's median is of), and each ratio over a rough time (or
        against a peak probed on a busy machine) with its ``<ratio>_rough``."""
        rows, phases, first = [], [], None
        b = self._batch(batch_size)
        timing = self.timings.get(b)
        for p in self.phases(b):
            # an encoder attends both ways, a decode step's one query masks nothing
            u = p.report.utilization(peak, flops=flops, causal=causal, decode=p.name != "prefill")
            first = first or u
            rows.append(_tagged(u.rows, p))
            phases.append(_tagged(u.phases.drop(columns="phase"), p))
            phases[-1]["time_rough"] |= self._rough(_PHASES, _phase_point(p))
            phases[-1]["generation_ms"] = _in_generation(timing, p)
            kind = {"prefill": "ttft", "decode": "tpot"}.get(p.name)
            rough = kind is not None and timing is not None
            phases[-1]["generation_rough"] = rough and self._rough(_FIGURES[kind], f"batch {b}")
        table = pd.concat(phases, ignore_index=True)
        chosen = first.convention.peaks
        if chosen is not None:
            seconds = table["generation_ms"] * 1e-3
            table["mfu_generation"] = table["model_flops"] / (seconds * chosen.peak_flops)
            table["mbu_generation"] = table["bytes"] / (seconds * chosen.peak_bytes)
        table = _flag_ratios(table, chosen)
        return Utilization(first.convention, pd.concat(rows, ignore_index=True), table, {})

    def bound_table(self, batch_size: int | None = None) -> pd.DataFrame:
        """Every phase's leaf rows (of every batch size, or of ``batch_size``) with their
        compute, memory and roofline bound (ms)."""
        if self.peaks is None:
            raise ModelProfError(
                "no target: pass target='H100 SXM' (or a Peaks) to "
                "profile_generation for the roofline bound"
            )
        frames = [_tagged(bound_rows(p.report, self.peaks), p) for p in self._every(batch_size)]
        return shown(pd.concat(frames, ignore_index=True), caption=self._bound_caption())

    def growth(self, batch_size: int | None = None) -> pd.DataFrame:
        """The decode rows of :meth:`phase_table` of ``batch_size`` (default: the first),
        against the context."""
        table = self.phase_table(self._batch(batch_size))
        return shown(
            table[table["phase"] == "decode"].reset_index(drop=True), caption=self._bound_caption()
        )

    def growth_slopes(self, batch_size: int | None = None) -> dict[str, float]:
        """Per context token: the least-squares slope of each counted column, of the decode
        phases' time (``latency_ms``, the per-layer passes') and of the step time, each time
        with its 95 % interval and NaN where that reaches zero (never a negative time)."""
        g = self.growth(batch_size)
        out: dict[str, float] = {}
        if len(g) >= 2:
            for col in _GROWTH:
                if g[col].astype(float).notna().all():
                    out[f"{col}_per_token"] = _slope(g["context"], g[col])
            if g["latency_ms"].astype(float).notna().all():  # the step time's rule: below
                fit = fit_slope(g["context"], g["latency_ms"])  # None: < 3 contexts, no interval
                out.update(
                    latency_ms_per_token=fit.measured_ms_per_token if fit else math.nan,
                    latency_ms_per_token_ci_low=fit.ci_low if fit else math.nan,
                    latency_ms_per_token_ci_high=fit.ci_high if fit else math.nan,
                )
        timing = self.timings.get(self._batch(batch_size))
        slope = timing.step_slope if timing is not None else None
        if slope is not None:
            # NaN where the interval reaches zero: not measurable, never a negative time
            out.update(
                step_ms_per_token=slope.measured_ms_per_token,
                step_ms_per_token_ci_low=slope.ci_low,
                step_ms_per_token_ci_high=slope.ci_high,
            )
        return out

    def summary(self) -> pd.DataFrame:
        """One row per batch size: TTFT, TPOT, end to end (medians, 95 % intervals, stability;
        on the CPU their CPU work, ``ttft_cpu_ms``...: the figures to quote where a loaded run's
        note says so), tokens/s and the counted prefill and last decode step. ``*_rough``:
        slower than a bigger batch's, beyond both intervals, or no figure to quote by its own
        runs (the notes say which); a tokens/s figure's (``tokens_per_s_rough``...) is that of
        the TPOT or end to end it is computed from."""
        rows = []
        for b in self.batch_sizes:
            row: dict[str, Any] = {"batch_size": b}
            pre, last = self.prefill(b), self.decode(batch_size=b)
            if any(p.name == "encoder" for p in self.phases(b)):
                row["encoder_macs"] = self.encoder(b).totals["macs"]
            row.update(
                prefill_macs=pre.totals["macs"],
                decode_macs=last.totals["macs"],
                decode_context=last.context,
            )
            t = self.timings.get(b)
            if t is not None:
                row.update({k: v for k, v in t.summary().items() if k != "batch_size"})
                for kind, series in _FIGURES.items():
                    row[f"{kind}_rough"] = self._rough(series, f"batch {b}")
                row.update(rate_flags(row))  # tokens/s: rough with the figure it is over
            rows.append(row)
        return shown(stable_flags(pd.DataFrame(rows)))

    def kv_cache(self) -> pd.DataFrame:
        """Bytes per layer held by the cache after the last profiled step."""
        if self.kv is None:
            return pd.DataFrame(columns=["layer", "bytes", "bytes_per_token"])
        per = np.asarray(self.kv.per_layer_bytes, dtype=float)
        states, cross = np.zeros_like(per), np.zeros_like(per)
        states[: len(self.kv.per_layer_state_bytes)] = self.kv.per_layer_state_bytes
        cross[: len(self.kv.per_layer_cross_bytes)] = self.kv.per_layer_cross_bytes
        # keys and values grow per token; a recurrent state and cross-attention do not
        return shown(
            pd.DataFrame(
                {
                    "layer": range(per.size),
                    "bytes": per,
                    "state_bytes": states,
                    "cross_bytes": cross,
                    "bytes_per_token": (per - states - cross)
                    / (self.kv.batch_size * self.kv.tokens),
                }
            ),
            units={"bytes": "_bytes", "bytes_per_token": "_bytes"},
        )

    def export(
        self,
        format: str,
        path: str | Path | None = None,
        batch_size: int | None = None,
        *,
        view: Any = None,
        memory_bytes: float | None = None,
        **options: Any,
    ) -> str | Path:
        """Any registered format: :meth:`to_dataframe` (every batch size, or ``batch_size``),
        captioned with the run; a raw format (CSV, JSON) carries the rest of the report as its
        environment (:meth:`_document`); Markdown is :meth:`to_markdown`. ``view=ViewOptions(
        ...)`` or its fields as keywords (``columns``, ``depth``, ``units``...; a keyword wins,
        and either wins over the defaults here), as every exporter takes them; ``memory_bytes``:
        the Markdown document also says what fits that many bytes (:meth:`to_markdown`). The
        text, or ``path`` written."""
        fmt = get_format(format)
        check_read_by(fmt.name, options)
        given = ViewOptions.parse(view, **options)
        for name, own in (("style", "modelprof"), ("group_by", None)):
            if getattr(given, name) != own:  # the frame below is the phases' modelprof rows
                raise ModelProfError(
                    f"{name}={getattr(given, name)!r} is a Report's view; a generation report's "
                    "table is the phases' rows in modelprof's: export one phase's Report for it "
                    f"(report.prefill().report.export(..., {name}=...))"
                )
        if memory_bytes is not None and (fmt.name != "markdown" or given.standalone is False):
            raise ModelProfError(  # refused, not dropped
                f"memory_bytes={memory_bytes!r}: what fits is said by the Markdown document "
                f"alone (to_markdown), not a {fmt.name} table; report.memory.fit_text() says it"
            )
        if fmt.name == "markdown" and given.standalone is not False:
            if batch_size is not None:  # the document is every batch size's: refused, not dropped
                raise ModelProfError(
                    f"batch_size={batch_size!r}: the Markdown document covers every batch size; "
                    "pass standalone=False for one batch size's per-layer table"
                )
            return self._markdown_document(path, given, options, memory_bytes)
        df = self.to_dataframe(batch_size)
        given = self._table_view(fmt.human, df, batch_size, given, options)
        env = None if fmt.human else self._document()
        return fmt.write(df, None, env=env, path=path, view=given)

    def _table_view(
        self,
        human: bool,
        df: pd.DataFrame,
        batch_size: int | None,
        given: ViewOptions,
        options: dict[str, Any],
    ) -> ViewOptions:
        """The caller's view (``options``: the keywords passed, which win) over this report's
        defaults: the run as caption and title; in a human format a report's compact columns
        under the phase's, kept longest in LaTeX, and no totals row (the phases' sums, every
        batch size's, are no run's totals). The caption says what a ``~`` of the table marks:
        the phases' times it holds, never a figure it leaves out (the TTFT's, in the notes)."""
        rough = self._phases_rough(self._every(batch_size)) if "latency_ms" in df else None
        heading = self._heading() + (f"; {rough}" if rough else "")
        defaults: dict[str, Any] = dict(
            caption=heading, title=heading, standalone=True, summary=(heading, *self.timing_notes)
        )
        if not human:
            return given.with_defaults(options, **defaults)
        given = given.fit_for(given.columns, options).with_defaults(
            options, priority=_LATEX_PRIORITY, show_totals=False, **defaults
        )
        if given.columns not in (None, "compact"):
            return given
        bound = [c for c in ("bound_ms", "bound") if c in df.columns]
        batch = ["batch_size"] if len(self.batch_sizes) > 1 and batch_size is None else []
        return given.replace(columns=["phase", "context", *batch, *compact_columns(df), *bound])

    def _heading(self) -> str:
        """The run in a line."""
        return (
            f"{self.model_name}: generation ({self.spec.prompt_len} prompt + "
            f"{self.spec.new_tokens} new tokens, {self.device}, {self.dtype})"
        )

    def to_markdown(
        self,
        path: str | Path | None = None,
        *,
        view: Any = None,
        memory_bytes: float | None = None,
        **options: Any,
    ) -> str | Path:
        """The whole report: the summary, the phases, the KV cache and the memory plan as
        Markdown tables (needs tabulate), with ``memory_bytes`` what fits that many bytes
        (``report.memory.fit_text``), a document that takes no view options; with
        ``standalone=False`` the per-layer table alone, which takes them as :meth:`export`
        does."""
        return self.export("markdown", path, view=view, memory_bytes=memory_bytes, **options)

    def _markdown_document(
        self,
        path: str | Path | None,
        given: ViewOptions,
        options: dict[str, Any],
        memory_bytes: float | None = None,
    ) -> str | Path:
        """:meth:`to_markdown`'s document: its tables are shown whole, so an option that would
        select or shape a table is refused, not dropped (a keyword, or a shared ``view``'s
        selection and units; another format's fields in that view are that format's)."""
        changed = given.changed()
        asked = sorted(
            f.name
            for f in dataclasses.fields(ViewOptions)
            if f.name != "standalone"
            and (f.name in options or (f.name in _SHAPING and f.name in changed))
        )
        if asked:
            raise ModelProfError(
                f"the Markdown document (summary, phases, KV cache) takes no view options, got "
                f"{', '.join(f'{k}={getattr(given, k)!r}' for k in asked)}: pass "
                "standalone=False for the per-layer table alone, which takes them"
            )
        # (the notes, the model's name and the device are text, never markup: render.markdown)
        parts = [f"# {prose(self._heading())}", "", "## Summary", "", _md(self.summary())]
        parts += ["", "## Phases", "", _md(self.phase_table())]
        if self.timing_notes:
            parts += ["", "## Timing notes", "", *(f"- {prose(n)}" for n in self.timing_notes)]
        if self.conventions:
            parts += ["", "## Conventions", "", *(f"- {prose(n)}" for n in self.conventions)]
        if self.peaks is not None:
            parts += ["", f"{prose(self._bound_caption())}."]
        if self.kv is not None:
            kv = {k: v for k, v in self.kv.to_dict().items() if not k.startswith("per_layer_")}
            parts += ["", "## KV cache", "", _md(pd.DataFrame([kv]))]
        if self.memory is not None:
            parts += ["", "## Memory plan", "", *self._memory_lines(memory_bytes)]
        if self.moe is not None:
            moe = self.moe
            active = f"active parameters per token {moe.active_params:,} of {moe.total_params:,}"
            parts += ["", "## Mixture of experts", "", active, "", _md(moe.tokens_per_expert())]
        return emit("\n".join(parts) + "\n", path)

    def _memory_lines(self, memory_bytes: float | None) -> list[str]:
        """The memory plan as the document says it: per phase, the bytes to hold this run
        (weights, KV cache and token ids at the plan's batch and context, the activations),
        and with ``memory_bytes`` what fits that many (the command line's ``--memory``)."""
        mem = self.memory
        lines = [
            f"At batch {mem.batch_size} and {mem.context} tokens of context, per phase:",
            "",
            _md(mem.table()),
        ]
        if memory_bytes is not None:
            lines += ["", *(prose(line) for line in mem.fit_text(memory_bytes).splitlines())]
        return lines

    def _document(self) -> dict[str, Any]:
        """What a raw export carries beside the table, as plain JSON values."""
        doc = {
            "model": self.model_name,
            "device": self.device,
            "dtype": self.dtype,
            "spec": dataclasses.asdict(self.spec),  # the cache mode a str enum: its value
            "summary": _records(self.summary()),
            "phases": _records(self.phase_table()),
            "kv_cache": self.kv.to_dict() if self.kv is not None else None,
            "memory": self.memory.to_dict() if self.memory is not None else None,
            "target": None
            if self.peaks is None
            else {
                k: getattr(self.peaks, k) for k in ("device", "dtype", "peak_flops", "peak_bytes")
            },
            "moe": self.moe.to_dict() if self.moe is not None else None,
            "timing": {
                str(b): t.end_to_end.to_dict(samples=False)
                | {
                    "ttft": t.ttft.to_dict(),
                    "tpot": None if t.tpot is None else t.tpot.to_dict(samples=False),
                }
                for b, t in self.timings.items()
            },
        }
        return json.loads(json.dumps(doc, default=jsonable))

    def plot_decode_growth(self, save: str | Path | None = None, batch_size: int | None = None):
        """Decode step time (measured) and bytes (counted) against the context."""
        return plot_decode_growth(self, save=save, batch_size=batch_size)

    def plot_phase_share(
        self,
        save: str | Path | None = None,
        batch_size: int | None = None,
        column: str | None = None,
    ):
        """Per top-level layer: its share of the prefill and of a decode step."""
        return plot_phase_share(self, save=save, batch_size=batch_size, column=column)

    def __repr__(self) -> str:
        lines = [
            f"GenerationReport({self.model_name}, prompt {self.spec.prompt_len} + "
            f"{self.spec.new_tokens} new tokens, cache={self.spec.cache.value}, "
            f"{self.device}, {self.dtype})"
        ]
        for b in self.batch_sizes:
            pre, last = self.prefill(b), self.decode(batch_size=b)
            encoder = [p for p in self.phases(b) if p.name == "encoder"]
            line = (
                f"  batch {b}: "
                + "".join(f"encoder {p.totals['macs'] / 1e9:.3g} GMACs, " for p in encoder)
                + f"prefill {pre.totals['macs'] / 1e9:.3g} GMACs, decode@"
                f"{last.context} {last.totals['macs'] / 1e9:.3g} GMACs"
            )
            t = self.timings.get(b)
            if t is not None:
                rough = {k: self._rough(series, f"batch {b}") for k, series in _FIGURES.items()}
                line += f"; TTFT {_median_text(t.ttft, rough['ttft'])}"
                if t.tpot is not None:
                    line += (
                        f", TPOT {_median_text(t.tpot, rough['tpot'])}"
                        f"{' DRIFTED' if t.tpot.stable is False else ''}, "
                        + _tokens_rate(t, rough["tpot"], rough["end_to_end"])
                    )
                if t.step_slope is not None:
                    line += f"; step growth {t.step_slope.describe()}"
            lines.append(line)
        kv = self.kv
        if kv is not None:
            # (several batch sizes: the cache is the first's, as report.memory and the defaults)
            at = f" at batch {kv.batch_size}" if len(self.spec.batch_sizes) > 1 else ""
            lines.append(f"  KV cache{at}: {_kv_words(kv)}")
            cross = f"cross-attention over the encoder's {kv.cross_tokens} tokens"
            constant = ((kv.state_bytes, "recurrent state"), (kv.cross_bytes, cross))
            fixed = [f"{n:,} bytes of {what}" for n, what in constant if n]
            if fixed:
                lines[-1] += f", of which {' and '.join(fixed)} (the same at every context)"
        if self.moe is not None:
            lines.append(
                f"  MoE: {self.moe.active_params:,} active of "
                f"{self.moe.total_params:,} parameters per token"
            )
        lines.extend(f"  note: {note}" for note in self.conventions)
        lines.extend(f"  !! {note}" for note in self.timing_notes)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The notebook display: the printed summary, then the phase table."""
        return html_notebook(repr(self).splitlines(), self.phase_table()._repr_html_())

    @property
    def conventions(self) -> list[str]:
        """Counting conventions a reader could take otherwise (docs/counting.md)."""
        out = []
        if any(p.name == "encoder" for b in self.batch_sizes for p in self.phases(b)):
            out.append(
                "the prefill computes the output layer on every decoder prompt position (an "
                "encoder-decoder's forward takes no logits_to_keep), not on the last alone"
            )
        past = self.spec.past_static_cache
        if past:  # (spec.cache_room: a step's counted cost includes the cache's size)
            one = len(past) == 1
            steps = _listed([f"decode@{c}" for c in past])
            sizes = _listed([f"{c + 1:,}" for c in past])
            out.append(
                f"{steps} {'is' if one else 'are'} counted on "
                f"{'a static cache' if one else 'static caches'} of {sizes} tokens, just large "
                f"enough for {'it' if one else 'each'}: past the "
                f"{self.spec.static_cache_len:,} tokens generate() allocates for prompt_len + "
                "new_tokens (the other steps' and the timed generation's cache), over all of "
                "which a static cache's attention runs"
            )
        if self.kv is not None and self.kv.state_bytes and self.dtype in ("bfloat16", "float16"):
            out.append(
                f"the recurrent state is counted as the cache holds it: a {self.dtype} Mamba "
                "keeps its SSM state in float32 there (transformers' scan computes it so)"
            )
        return out


_FIGURE_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "end_to_end": "the end-to-end generation"}
#: the neighbour check's series: each generation figure across batch sizes, and the phases' time
_FIGURES = {kind: f"{name} across batch sizes" for kind, name in _FIGURE_NAMES.items()}
_PHASES = "the phases' time (per-layer passes' plain runs)"
#: the ratios over a phase's time inside the generations (``generation_ms``)
_GENERATION_RATIOS = ("mfu_generation", "mbu_generation")


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _phase_point(p: Phase) -> str:
    return f"{p.label} at batch {p.batch_size}"


def _unquotable_note(label: str, m: Any, column: str = "") -> str:
    """Why the timed figure ``label`` of generation is rough: the machine's load, or too few
    runs. Loaded with its CPU work standing for the work (``cpu_holds``, enough runs): that CPU
    work is the figure to quote (``column`` of the summary, where it carries one), as the
    Measurement's warning says."""
    if m.loaded:
        why = f"read on a loaded machine ({m.load_reason})"
        fix = quieter_machine([m])  # by profile()'s rule: never the thread count in use
        if m.cpu_holds and not m.undersampled:
            where = f"; {column}" if column else ""
            return (  # on the warning's condition where a wait explains the wall as well
                f"{label}, median {m.median_ms:,.3f} ms, {why}: its wall time is marked ~; "
                f"quote its CPU work{m.wait_condition}, median {m.cpu.median_ms:,.3f} ms "
                f"({m.cpu_clock}{where}), which waiting for a core cannot stretch, or {fix}"
            )
    else:
        why = f"rests on too few runs ({m.short_reason})"
        fix = "time again with a larger repeat= or budget_s="
    return f"{label}, median {m.median_ms:,.3f} ms, {why}: no figure to quote (marked ~); {fix}"


def _neighbours(
    phase_tables: dict[int, list[Phase]], timings: dict[int, GenerationTiming]
) -> list[NeighbourDisagreement]:
    """Timed points out of line with their neighbours (``timing.agreement``): a batch size's
    figures against a bigger batch's, a phase against one of its kind with more FLOPs."""
    found: list[NeighbourDisagreement] = []
    for kind, series in _FIGURES.items():
        points = [SeriesPoint(f"batch {b}", b, getattr(t, kind)) for b, t in timings.items()]
        found += neighbour_disagreements(series, points)
    phases = [p for ps in phase_tables.values() for p in ps if p.report.latency is not None]
    groups: dict[tuple, list[Phase]] = {}
    for p in phases:
        groups.setdefault((p.name, "batch", p.batch_size), []).append(p)
        groups.setdefault((p.name, "context", p.context), []).append(p)
    seen: set[str] = set()
    for members in groups.values():
        points = [
            SeriesPoint(_phase_point(p), p.totals["flops"], p.report.latency) for p in members
        ]
        for d in neighbour_disagreements(_PHASES, points):
            if d.point not in seen:
                seen.add(d.point)
                found.append(d)
    for p in phases:  # a prefill is part of the TTFT, which does more: never slower than it
        t = timings.get(p.batch_size)
        if p.name != "prefill" or t is None or _phase_point(p) in seen:
            continue
        pair = [
            SeriesPoint(_phase_point(p), 0, p.report.latency),
            SeriesPoint(f"TTFT at batch {p.batch_size}", 1, t.ttft),
        ]
        found += neighbour_disagreements(_PHASES, pair)
    return found


#: the columns a LaTeX table of the phases keeps longest (the first, ``phase``, always stays)
_LATEX_PRIORITY = default_priority(
    "phase context batch_size module macs latency_ms params type bound_ms output_shape | flops"
)


def _tokens_rate(t: GenerationTiming, tpot_rough: bool, whole_rough: bool) -> str:
    """Decode tokens per second at the median step, over the batch where it holds several
    sequences (the figure a serving table quotes), per sequence beside it; and over the median
    whole generation (prefill and every step: slow steps, which the median step leaves out,
    count there). Each marked ``~`` where the TPOT (the end to end) it is over is rough."""
    step, end = (ROUGH_MARK if rough else "" for rough in (tpot_rough, whole_rough))
    whole = f"{end}{t.end_to_end_tokens_per_s:,.1f} end to end"
    if t.batch_size == 1:
        return f"{step}{t.tokens_per_s:,.1f} tokens/s ({whole})"
    return (
        f"{step}{t.batch_tokens_per_s:,.1f} tokens/s over the batch ({step}"
        f"{t.tokens_per_s:,.1f} per sequence; {whole})"
    )


def _tagged(df: pd.DataFrame, phase: Phase) -> pd.DataFrame:
    """A copy of ``df`` under the phase's ``phase``, ``context`` and ``batch_size`` columns."""
    out = df.copy()
    out.insert(0, "batch_size", phase.batch_size)
    out.insert(0, "context", phase.context)
    out.insert(0, "phase", phase.name)
    return out


def _in_generation(timing: GenerationTiming | None, phase: Phase) -> float:
    """TTFT for the prefill, the median decode step at the phase's context; NaN untimed."""
    if timing is None or phase.name == "encoder":  # the encoder is inside the TTFT
        return math.nan
    if phase.name == "prefill":
        return float(timing.ttft.median_ms)
    at = np.asarray(timing.contexts) == phase.context
    if not at.any():
        return math.nan
    return float(np.median(timing.step_ms[:, at]))


def _flag_ratios(table: pd.DataFrame, peaks: Any) -> pd.DataFrame:
    """``table`` (the phases' utilization) with each ratio rough where measured over a rough
    time (``time_rough`` for MFU, HFU and MBU, ``generation_rough`` for ``*_generation``) or
    against a peak probed on a busy machine (as ``mark_loaded`` flags MFU, HFU and MBU)."""
    busy = peaks is not None and bool(peaks.loaded)
    for time, ratios in (("time_rough", RATIOS), ("generation_rough", _GENERATION_RATIOS)):
        for r in (r for r in ratios if r in table):
            measured = np.isfinite(table[r].to_numpy(dtype=float))
            flag = table[f"{r}_rough"].to_numpy(dtype=bool) if f"{r}_rough" in table else busy
            table[f"{r}_rough"] = (flag | table[time].to_numpy(dtype=bool)) & measured
    return table


def _md(df: pd.DataFrame) -> str:
    """A table of the report in the registered Markdown format, human units."""
    return str(export("markdown", df, show_totals=False)).rstrip("\n")


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(df.to_json(orient="records"))
