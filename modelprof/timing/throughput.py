"""``measure_throughput``: the batch size with the most samples per second, and the whole curve.

The search doubles the batch (1, 2, 4, ...), each point a short adaptive measurement, and stops
when ``patience`` (2) points in a row do not beat the best samples/s so far by ``gain`` (5 %), at
``max_batch``, or at the first out-of-memory error: then memory is freed and the largest batch
that fits is found by binary search. samples/s of a point = batches x batch size / total measured
time. A point whose latency lies above a bigger batch's beyond both intervals
(``timing.agreement.neighbour_disagreements``) is marked rough (``latency_rough``; ``~`` in the
human-readable exports), named in ``notes`` and warned about. The points do not warn one by
one: a search warns once of the points timed on a loaded machine, once of those that drifted,
once of those whose GPU clock moved and once of those on too few runs (``timing_notes``,
``timing_warnings``); a point on too few runs (``undersampled``) is rough too, and the best
point is taken from those with enough runs where any has. Each point's
median has its 95 % interval (``latency_ci_low_ms``/``_high``); its samples/s is a mean, so a
stall counts, and under load it reads below batch / median.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from modelprof.errors import (
    DriftWarning,
    FewSamplesWarning,
    GpuClockWarning,
    LoadedMachineWarning,
    ModelProfError,
    TimingDisagreementWarning,
    check_callback,
    check_int,
    warn_user,
)
from modelprof.render.formats import Exports, get_format
from modelprof.render.options import ViewOptions, check_read_by
from modelprof.runtime.agree import agreed_timing, current_agreement, decisions
from modelprof.runtime.device import is_oom
from modelprof.runtime.env import collect_env, jsonable
from modelprof.runtime.execution import random_kept
from modelprof.runtime.exported import check_recorded, runnable
from modelprof.runtime.guard import preserved_state
from modelprof.runtime.inputs import parse_dtype, parse_input_size, split_inputs, token_inputs
from modelprof.runtime.progress import progress_bar
from modelprof.timing.agreement import NeighbourDisagreement, SeriesPoint, neighbour_disagreements
from modelprof.timing.latency import FIRST_CALL, HELD_BYTES, measure_latency, resolve_call
from modelprof.timing.measurement import (
    CLOCK_MOVED_FRACTION,
    Measurement,
    format_ms,
    load_note,
)
from modelprof.timing.options import TimingOptions, check_option_names, keyword_names

__all__ = [
    "HELD_BYTES",
    "PATIENCE",
    "PointMeasure",
    "SizedMeasure",
    "THROUGHPUT_GAIN",
    "Throughput",
    "ThroughputPoint",
    "check_search_bounds",
    "measure_throughput",
    "search_batches",
]

#: what a point times in place of the forward's latency: ``(model, batch_size, device,
#: options) -> Measurement``, each sample one batch (``measure_throughput(measure=)``)
PointMeasure = Callable[[Any, int, torch.device, TimingOptions], Measurement]


@dataclasses.dataclass(frozen=True)
class SizedMeasure:
    """A point measure that makes its own inputs (``step_measure``'s), with the size it makes
    them at (``input_size`` or ``tokens``): ``measure_throughput`` refuses a size of its own
    that differs, which the curve's ``env["input"]`` and caption would name, not the one run."""

    run: PointMeasure
    input_size: Any = None
    tokens: int | None = None

    def __call__(
        self, model: Any, batch_size: int, device: torch.device, opts: TimingOptions
    ) -> Measurement:
        return self.run(model, batch_size, device, opts)


THROUGHPUT_GAIN = 0.05
#: what a ``measure=`` point's own environment says beside the mode flags (a training step's)
_MEASURED_KEYS = ("backward", "training", "loss", "optimizer")
PATIENCE = 2
_COLUMNS = (
    "batch_size latency_ms latency_ci_low_ms latency_ci_high_ms latency_n samples_per_s "
    "peak_memory_bytes loaded"
).split()
_ROUGH = "latency_rough"
#: what ``Throughput.to_dict`` gives before its points, notes and env, in order
_SUMMARY = (
    "device stop_reason stop_explanation best_batch_size best_samples_per_s max_fit_batch "
    "oom_batch memory_before_bytes memory_after_bytes memory_restored"
).split()


@dataclasses.dataclass
class ThroughputPoint:
    """One batch size: median latency (and its 95 % interval), samples/s over the whole time its
    samples took (a mean: a stall counts, so under load it reads below batch / median),
    allocator peak (CUDA)."""

    batch_size: int
    latency_ms: float
    samples_per_s: float
    peak_memory_bytes: int | None = None
    measurement: Measurement | None = dataclasses.field(default=None, repr=False)

    @property
    def latency_ci_low_ms(self) -> float:
        return self._ci()[0]

    @property
    def latency_ci_high_ms(self) -> float:
        return self._ci()[1]

    def _ci(self) -> tuple[float, float]:
        m = self.measurement
        return m.median_ci_ms if m is not None and m.has_interval else (math.nan, math.nan)

    @property
    def latency_n(self) -> int | None:
        """The samples (batches timed) the point rests on."""
        return self.measurement.n if self.measurement is not None else None

    @property
    def loaded(self) -> bool:
        """Other work on the machine stretched the point (``Measurement.loaded``): rough."""
        return bool(self.measurement is not None and self.measurement.loaded)

    @property
    def undersampled(self) -> bool:
        """The point rests on fewer runs than ``min_samples``, or has no interval
        (``Measurement.undersampled``)."""
        return bool(self.measurement is not None and self.measurement.undersampled)

    @property
    def runs_text(self) -> str:
        """The runs it rests on, against what it asked for: ``n=2 < min_samples=5``, or
        ``n=1, no interval``."""
        m = self.measurement
        if m is None:
            return "no runs kept"
        if m.min_samples is not None and m.n < m.min_samples:
            return f"n={m.n} < min_samples={m.min_samples}"
        return f"n={m.n}" + ("" if m.has_interval else ", no interval")

    def to_dict(self) -> dict[str, Any]:
        """The point's columns, JSON-ready (an interval it has not: None)."""
        return jsonable({k: getattr(self, k) for k in _COLUMNS})


@dataclasses.dataclass(eq=False)
class Throughput(Exports):
    """The measured curve (sorted by batch size), its best point and how the search ended;
    ``to_<format>`` (``to_csv``, ``to_markdown``, ``to_latex``...) for every registered format
    (:meth:`export`).

    ``stop_reason``: ``"no_improvement"``, ``"oom"`` (then ``max_fit_batch`` is the largest batch
    that ran and ``oom_batch`` the smallest that did not) or ``"max_batch"``.
    """

    points: list[ThroughputPoint]
    stop_reason: str
    device: str = "cpu"
    max_fit_batch: int | None = None
    oom_batch: int | None = None
    memory_before_bytes: int | None = None
    memory_after_bytes: int | None = None
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the best point's batch where chosen otherwise than by this process's samples/s (under a
    #: process group: the group's best); None: the fastest point here
    best_batch: int | None = None
    disagreements: list[NeighbourDisagreement] = dataclasses.field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        """A sentence for each point that disagrees with a bigger batch."""
        return [d.note() for d in self.disagreements]

    @property
    def timing_warnings(self) -> list[tuple[str, type[Warning]]]:
        """What made the points' timing less sure, each with its warning's kind: the points
        timed on a loaded machine (``LoadedMachineWarning``), those that drifted
        (``DriftWarning``), those whose GPU clock moved (``GpuClockWarning``), those on too few
        runs (``FewSamplesWarning``); a search warns of each once, its points not one by one."""
        points = [p for p in self.points if p.measurement is not None]
        ms = {f"batch {p.batch_size}": p.measurement for p in points}
        loaded = [k for k, m in ms.items() if m.loaded]
        clocked = [k for k, m in ms.items() if m.clock_moved]  # (its drift's cause)
        drifted = [k for k, m in ms.items() if m.stable is False and k not in clocked]
        found: list[tuple[str, type[Warning]]] = []
        if loaded:
            note = (
                f"{', '.join(loaded)} timed on a loaded machine "
                f"({load_note(ms[k] for k in loaded)}): their latency and samples/s moved with "
                "the load, and a quieter run may find another best batch size"
            )
            found.append((note, LoadedMachineWarning))
        if drifted:
            note = (
                f"{', '.join(drifted)} drifted while timed (beyond their intervals): the "
                "machine changed speed during the search"
            )
            found.append((note, DriftWarning))
        if clocked:
            note = (
                f"the GPU's SM clock moved by more than {100 * CLOCK_MOVED_FRACTION:.0f} % while "
                f"{', '.join(clocked)} {'was' if len(clocked) == 1 else 'were'} timed: the "
                "GPU changed speed (lock its clocks, or warm up longer)"
            )
            found.append((note, GpuClockWarning))
        few = [p for p in points if p.undersampled]
        if few:
            why = "; ".join(f"batch {p.batch_size}: {p.measurement.short_reason}" for p in few)
            note = (
                f"batch {', '.join(str(p.batch_size) for p in few)} "
                f"{'rests' if len(few) == 1 else 'rest'} on too few runs ({why}): rough, "
                "and the best batch size is taken from points with enough where any has; a "
                "larger budget_s gives more runs"
            )
            found.append((note, FewSamplesWarning))
        return found

    @property
    def timing_notes(self) -> list[str]:
        """:attr:`timing_warnings`' sentences."""
        return [note for note, _ in self.timing_warnings]

    @property
    def best(self) -> ThroughputPoint:
        """The point with the most samples/s of those not on too few runs (``undersampled``),
        of all where every one is (then rough, as it is in the frame); ``best_batch`` where
        set."""
        if self.best_batch is not None:
            return next(p for p in self.points if p.batch_size == self.best_batch)
        enough = [p for p in self.points if not p.undersampled] or self.points
        return max(enough, key=lambda p: p.samples_per_s)

    def _rule(self, key: str) -> Any:
        """A search setting as ``measure_throughput`` records it (``env["mode"]``, where
        ``collect_env`` keeps the keywords it is given), else at the top of an ``env`` given by
        hand."""
        mode = self.env.get("mode")
        if isinstance(mode, dict) and key in mode:
            return mode[key]
        return self.env.get(key)

    @property
    def stop_explanation(self) -> str:
        """Why the search stopped where it did, in a sentence; where the points it stopped on
        were read on a loaded machine or rest on too few runs, it says so and concludes
        nothing from them."""
        last = max(p.batch_size for p in self.points)
        if self.stop_reason == "no_improvement":
            return self._flattened_text(last)
        if self.stop_reason == "oom":
            return (
                f"stopped by out-of-memory: batch {self.oom_batch} did not fit, "
                f"{self.max_fit_batch} was the largest that ran"
            )
        if self.stop_reason == "max_batch":
            return self._capped_text(last)
        return f"stopped: {self.stop_reason}"

    def _flattened_text(self, last: int) -> str:
        """``no_improvement``: the points after the one they did not beat (the anchor) by
        ``gain``; a loaded one read low, and the anchor or one after it on too few runs may
        read either way: then the curve may not have flattened."""
        gain, patience = self._rule("gain"), self._rule("patience")
        rule = f" by at least {100 * gain:g} %" if isinstance(gain, (int, float)) else ""
        times = f"{patience} batch sizes in a row" if patience else "the last batch sizes"
        anchor = _anchor(self.points, gain if isinstance(gain, (int, float)) else 0.0)
        after = [p for p in self.points if p.batch_size > anchor.batch_size]
        head = (
            f"stopped at batch {last}: {times} did not raise samples/s{rule} over batch "
            f"{anchor.batch_size}'s"
        )
        doubt, advice = _doubts(after, [anchor, *after])
        if doubt:  # the load or the few runs, not the batch, may have held them back
            return f"{head}, but {doubt}: the curve may not have flattened; time again {advice}"
        return f"{head}: the curve has flattened, a larger max_batch is unlikely to help"

    def _capped_text(self, last: int) -> str:
        """``max_batch``: the last batch read fewer samples/s than the best (a larger batch is
        unlikely to help, unless load or too few runs lowered it), or it is the best."""
        cap = self._rule("max_batch") or last
        head = f"stopped at max_batch={cap}, the largest batch allowed"
        best = self.best
        if best.batch_size == last:
            return head + ": raise max_batch (--max-batch) to search further"
        top = self.points[-1]
        if top.samples_per_s > best.samples_per_s:  # passed over: too few runs (``best``)
            return (
                f"{head}; batch {last} read more samples/s than batch {best.batch_size}'s but "
                f"rests on too few runs ({top.runs_text}): time again with a larger budget_s, "
                "and raise max_batch (--max-batch) to search further"
            )
        text = f"{head}; batch {last} read fewer samples/s than batch {best.batch_size}'s"
        after = [p for p in self.points if p.batch_size > best.batch_size]
        doubt, advice = _doubts(after, [best, *after])
        if doubt:
            return f"{text}, but {doubt}: a larger batch may still help; time again {advice}"
        return text + ": a larger batch is unlikely to help"

    @property
    def best_batch_size(self) -> int:
        return self.best.batch_size

    @property
    def best_samples_per_s(self) -> float:
        return self.best.samples_per_s

    @property
    def memory_restored(self) -> bool | None:
        """On CUDA: the GPU holds after the search exactly the memory it held before."""
        if self.memory_before_bytes is None or self.memory_after_bytes is None:
            return None
        return self.memory_after_bytes <= self.memory_before_bytes

    @property
    def curve(self) -> Any:
        """``to_dataframe()``."""
        return self.to_dataframe()

    def to_dataframe(self) -> Any:
        """One row per batch size: ``_COLUMNS`` and ``latency_rough``; ``peak_memory_bytes``
        only where an allocator kept one (CUDA's), as a report's."""
        values = [[getattr(p, k) for k in _COLUMNS] for p in self.points]
        df = pd.DataFrame(values, columns=list(_COLUMNS))  # NaN, not the JSON's None
        rough = {d.point for d in self.disagreements}
        df[_ROUGH] = [
            f"batch {p.batch_size}" in rough or p.loaded or p.undersampled for p in self.points
        ]
        df["latency_n"] = df["latency_n"].astype("Int64")  # (a point without runs: <NA>)
        if all(p.peak_memory_bytes is None for p in self.points):
            return df.drop(columns="peak_memory_bytes")
        return df.astype({"peak_memory_bytes": "float64"})  # (the registry's: NaN where none)

    def export(
        self, format: str, path: str | Path | None = None, *, view: Any = None, **options: Any
    ) -> str | Path:
        """The curve (:meth:`to_dataframe`) in any registered format: a human one captioned
        with the search (its best point, what the ``~`` marks mean), a page (HTML, Markdown,
        unless ``standalone=False``) with how it stopped and the notes below, its rough flag
        said by the marks alone unless ``columns`` names it; a raw one every column, raw
        numbers (CSV reads back exactly), JSON with :meth:`to_dict` less its points as the
        environment. ``view=ViewOptions(...)`` or its fields as keywords (``columns``,
        ``units``...), as every exporter takes them. The text, or ``path`` written."""
        fmt = get_format(format)
        check_read_by(fmt.name, options)
        given = ViewOptions.parse(view, **options)
        for name, own in (("style", "modelprof"), ("group_by", None), ("depth", None)):
            if getattr(given, name) != own:  # a row per batch size: no layers to shape
                raise ModelProfError(
                    f"{name}={getattr(given, name)!r} is a per-layer table's view; a throughput "
                    "curve's rows are its batch sizes"
                )
        df = self.to_dataframe()
        head, legend = self._heading()
        heading = head + legend
        summary = (heading, self.stop_explanation, *self.notes, *self.timing_notes)
        given = given.with_defaults(
            options, caption=heading, title=heading, summary=summary, standalone=True
        ).replace(show_totals=False)  # (no totals: the points are no sum)
        for name in ("caption", "title"):  # one of the caller's keeps what the ~ marks mean
            own = getattr(given, name)
            if legend and own not in (None, heading) and legend not in own:
                given = given.replace(**{name: own.rstrip(". ") + legend})
        if fmt.human and given.columns in (None, "compact"):
            given = given.replace(columns=[c for c in df.columns if c != _ROUGH])
        env = None if fmt.human else {k: v for k, v in self.to_dict().items() if k != "points"}
        return fmt.write(df, None, env=env, path=path, view=given)

    def _heading(self) -> tuple[str, str]:
        """The curve in a line (where, what a sample is: ``env["input"]``, the best point), and
        the legend of the ``~`` marks where some are set (a point slower than a bigger batch,
        loaded, or on too few runs)."""
        what = "whole training steps" if self._rule("backward") else "forward"
        sample = self.env.get("input")
        what += f", input {sample}" if sample else ""  # a sample's size: 32 tokens, 3x224x224
        b = self.best
        head = (
            f"throughput on {self.device} ({what}): best {b.samples_per_s:,.1f} samples/s over "
            f"all its runs at batch {b.batch_size}"
        )
        legend = ""
        if self.notes:
            legend += f"; ~ rough: {len(self.notes)} batch size(s) slower than a bigger one"
        loaded = [p.batch_size for p in self.points if p.loaded]
        if loaded:
            legend += f"; ~ rough: batch {', '.join(map(str, loaded))} timed on a loaded machine"
        few = [f"{p.batch_size} ({p.runs_text})" for p in self.points if p.undersampled]
        if few:
            legend += f"; ~ rough: batch {', '.join(few)} on too few runs"
        return head, legend

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in _SUMMARY}
        d.update(points=[p.to_dict() for p in self.points], notes=self.notes, env=self.env)
        d["timing_notes"] = self.timing_notes
        return d

    def __repr__(self) -> str:
        b = self.best
        lines = [
            f"Throughput({self.device}): best {b.samples_per_s:,.1f} samples/s over all its runs "
            f"at batch {b.batch_size} ({format_ms(b.latency_ms)}/batch median); "
            f"{self.stop_explanation}"
        ]
        for p in self.points:
            mem = (
                f", peak {p.peak_memory_bytes / 2**20:,.0f} MiB"
                if p.peak_memory_bytes is not None
                else ""
            )
            few = f" (too few runs: {p.runs_text}; rough)" if p.undersampled else ""
            lines.append(
                f"  batch {p.batch_size:>5}: {format_ms(p.latency_ms):>9} median, "
                f"{p.samples_per_s:,.1f} samples/s over all its runs{few}{mem}"
            )
        if self.memory_before_bytes is not None:
            lines.append(
                f"  memory before {self.memory_before_bytes:,} B, after "
                f"{self.memory_after_bytes:,} B"
            )
        lines.extend(f"  !! {note}" for note in [*self.notes, *self.timing_notes])
        return "\n".join(lines)


def _doubts(busy: list[ThroughputPoint], few: list[ThroughputPoint]) -> tuple[str, str]:
    """What makes a conclusion from points' samples/s unsure, and how to time again: those
    of ``busy`` read on a loaded machine, those of ``few`` on too few runs (``undersampled``:
    fewer than ``min_samples``, or no interval). ``("", "")`` where neither."""
    loaded = [p.batch_size for p in busy if p.loaded]
    short = [p for p in few if p.undersampled]
    said, advice = [], []
    if loaded:
        said.append(f"batch {', '.join(map(str, loaded))} read on a loaded machine")
        advice.append("on a quieter machine")
    if short:
        runs = ", ".join(f"{p.batch_size} ({p.runs_text})" for p in short)
        said.append(f"batch {runs} {'rests' if len(short) == 1 else 'rest'} on too few runs")
        advice.append("with a larger budget_s")
    return " and ".join(said), " or ".join(advice)


def _anchor(points: list[ThroughputPoint], gain: float) -> ThroughputPoint:
    """The point the search last saw raise samples/s by ``gain`` over every point before it:
    the one the points after it did not beat (``search_batches``' rule)."""
    best, anchor = 0.0, points[0]
    for p in points:
        if p.samples_per_s >= best * (1.0 + gain):
            anchor = p
        best = max(best, p.samples_per_s)
    return anchor


def search_batches(
    measure: Callable[[int], ThroughputPoint],
    max_batch: int,
    gain: float = THROUGHPUT_GAIN,
    patience: int = PATIENCE,
    free: Callable[[], None] = lambda: None,
    on_point: Callable[[ThroughputPoint], None] | None = None,
) -> tuple[list[ThroughputPoint], str, int | None, int | None]:
    """Doubling then (after an out-of-memory error) binary search; see the module docstring.

    Returns ``(points sorted by batch, stop_reason, max_fit_batch, oom_batch)``. Under a process
    group a batch is out of memory, and stops helping, when it does on any rank.
    """
    points: dict[int, ThroughputPoint] = {}
    agree = decisions()

    def attempt(b: int) -> ThroughputPoint | None:
        failed = False
        try:
            p = measure(b)
        except Exception as e:
            if not is_oom(e):
                raise
            failed = True
        if agree.any(failed):  # all ranks alike; outside the except: its traceback holds tensors
            free()
            return None
        points[b] = p
        if on_point is not None:
            on_point(p)
        return p

    b, best_sps, stale, last_ok = 1, 0.0, 0, None
    reason, oom = "max_batch", None
    while True:
        p = attempt(b)
        if p is None:
            oom = b
            break
        last_ok = b
        stale = 0 if p.samples_per_s >= best_sps * (1.0 + gain) else stale + 1
        best_sps = max(best_sps, p.samples_per_s)
        if agree.any(stale >= patience):
            reason = "no_improvement"
            break
        if b >= max_batch:
            break
        b = min(2 * b, max_batch)
    if oom is not None:
        if last_ok is None:
            raise ModelProfError("batch_size=1 does not fit in memory; nothing to search")
        lo, hi = last_ok, oom
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if attempt(mid) is None:
                hi = mid
            else:
                lo = mid
        reason, last_ok, oom = "oom", lo, hi
    return [points[k] for k in sorted(points)], reason, last_ok, oom


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


#: Per-point defaults of the search (shorter than a single measurement's): each can be overridden.
POINT_DEFAULTS = dict(budget_s=1.0, precision=0.02, min_samples=5, min_blocks=3, warmup_s=0.25)


def check_search_bounds(
    max_batch: int = 1024, gain: float = THROUGHPUT_GAIN, patience: int = PATIENCE
) -> tuple[int, float, int]:
    """The search's bounds as :func:`measure_throughput` takes them, each checked."""
    max_batch = check_int("max_batch", max_batch, 1)
    patience = check_int("patience", patience, 1)
    if not isinstance(gain, (int, float)) or not 0 <= gain < 10:
        raise ModelProfError(f"gain={gain!r} must be a fraction >= 0, e.g. 0.05 for 5 %")
    return max_batch, gain, patience


def measure_throughput(
    model: nn.Module | Callable[..., Any],
    input_size: Any = None,
    *,
    tokens: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    max_batch: int = 1024,
    gain: float = THROUGHPUT_GAIN,
    patience: int = PATIENCE,
    training: bool = False,
    no_grad: bool = True,
    options: TimingOptions | None = None,
    on_point: Callable[[ThroughputPoint], None] | None = None,
    measure: PointMeasure | None = None,
    **timing_options: Any,
) -> Throughput:
    """Measure samples/s at batch 1, 2, 4, ... and return the curve.

    ``input_size`` excludes the batch dimension; ``tokens`` (instead) times a language model fed
    token ids of that length (``token_inputs``: ``input_ids`` from the model's vocabulary, an
    all-ones ``attention_mask`` where the forward takes one). Timing options (``TimingOptions``
    or keywords: ``amp``, ``channels_last``, ``compile``, ``cuda_graph``, ``repeat``,
    ``warmup``...) apply to every point; unless given, a point samples for ``budget_s=1.0`` s to
    ``precision=0.02`` (``POINT_DEFAULTS``). ``progress=True`` shows a progress bar;
    ``on_point`` is called with each point as it is measured. A module runs in eval mode under
    ``no_grad`` unless ``training``/``no_grad`` say otherwise, and comes back as it went in, as
    does the global RNG (as from :func:`measure_latency`). ``measure(model, batch_size,
    device, options)`` replaces what a point times (the forward's latency,
    :func:`measure_latency`) by another ``Measurement`` of one batch per sample:
    :func:`modelprof.step.throughput.step_measure` times whole training steps
    (``compare(backward=True, throughput=True)`` uses it) at its size, which must be this one
    (the curve names it: another is refused); then ``training``/``no_grad`` change
    nothing that runs. An ``ExportedProgram`` is timed as its ``module()``, what running it
    means; a batch size it was not exported for is refused before it runs, naming the shape
    it recorded (export it with a dynamic batch dimension, ``torch.export.Dim``).
    """
    program, model = model, runnable(model)
    max_batch, gain, patience = check_search_bounds(max_batch, gain, patience)
    check_callback("on_point", on_point)
    for bad in ("inputs", "batch_size", "input_size"):  # what the search makes itself
        if bad in timing_options:
            raise ModelProfError(
                f"{bad}= is set by measure_throughput itself; pass input_size (or tokens= for "
                "a language model)"
            )
    if (input_size is None) == (tokens is None):
        raise ModelProfError(
            "pass one of input_size (e.g. (3, 224, 224), without the batch) or tokens= (a "
            f"sequence length: token ids for a language model); got input_size={input_size!r}"
            f", tokens={tokens!r}"
        )
    tokens = None if tokens is None else check_int("tokens", tokens)
    _check_measure_size(measure, input_size, tokens)
    check_option_names(timing_options, own=_KEYWORDS)  # max_bach=
    if options is None:
        timing_options = {**POINT_DEFAULTS, **timing_options}
    asked = TimingOptions.parse(options, **timing_options)
    opts = asked.replace(warn=False)  # the points are judged together, after the search
    dt = parse_dtype(dtype)
    target, placed = resolve_call(model, device=device, dtype=dt, channels_last=opts.channels_last)
    dev = placed.device  # a module moved once, not per point (a copy: the user's stays)
    if dev.type == "meta":  # asked for, or where the model lies: it timed shapes alone
        raise ModelProfError("device='meta' has no clock: measure_throughput times real runs")
    switches = {"training": training, "no_grad": no_grad}
    point = _Point(target, input_size, dev, dt, opts, switches, measure, (model, tokens), program)
    mem_before = point.baseline_memory()
    points, reason, fit, oom, best_batch = _search(
        model, point, max_batch, (gain, patience), on_point
    )
    result = Throughput(
        points,
        reason,
        device=str(dev),
        max_fit_batch=fit,
        oom_batch=oom,
        memory_before_bytes=mem_before,
        memory_after_bytes=point.memory_now(),
        best_batch=best_batch,
        disagreements=_disagreements(points, warn=asked.warn),
    )
    for note, kind in result.timing_warnings if asked.warn else ():
        warn_user(f"modelprof: throughput: {note}", kind)
    result.env = _curve_env(result.best, point, (max_batch, gain, patience))
    return result


def _curve_env(
    best: ThroughputPoint, point: _Point, bounds: tuple[int, float, int]
) -> dict[str, Any]:
    """The curve's environment: the best point's device and dtype, the search's ``bounds``
    (max_batch, gain, patience) and modes (those a ``measure=``'s runs say, where it ran its
    own) under ``mode``, and what a sample is (``input``: ``32 tokens``, ``3x224x224``)."""
    m = best.measurement
    training, no_grad = point.switches["training"], point.switches["no_grad"]
    flags = point.opts.flags(eval_mode=not training, no_grad=no_grad)
    if point.timed is not None and m is not None:  # its runs say what they ran
        own = m.env.get("mode", {})
        flags = {**flags, **{k: own[k] for k in (*flags, *_MEASURED_KEYS) if k in own}}
    max_batch, gain, patience = bounds
    env = collect_env(
        point.dev,
        dtype=point.dtype or (m.env.get("dtype") if m is not None else None),
        batch_size=best.batch_size,
        max_batch=max_batch,
        gain=gain,
        patience=patience,
        budget_s_per_point=point.opts.stop.budget_s,
        **flags,
    )
    env["input"] = _sample_text(point.input_size, point.tokens[1])
    return env


def _check_measure_size(measure: Any, input_size: Any, tokens: int | None) -> None:
    """A ``measure=`` that says the size it runs at (a :class:`SizedMeasure`) runs at the
    search's: the curve names one size, so two would caption one that did not run."""
    if not isinstance(measure, SizedMeasure):
        return  # (a measure of its own: what it makes of input_size is its business)
    named = _sample_text(input_size, tokens)
    if named != _sample_text(measure.input_size, measure.tokens):
        given, its = (
            _size_words(input_size, tokens),
            _size_words(measure.input_size, measure.tokens),
        )
        raise ModelProfError(
            f"measure_throughput({given}) with a measure= that runs {its}: the curve's "
            f"env['input'] and caption would name {named}, a size that never ran; pass the "
            "same size to both"
        )


def _size_words(input_size: Any, tokens: int | None) -> str:
    return f"tokens={tokens!r}" if tokens is not None else f"input_size={input_size!r}"


def _sample_text(input_size: Any, tokens: int | None) -> str:
    """What one sample of the search is, batch left out: ``32 tokens`` (a sequence of token
    ids), ``3x224x224``, several inputs comma-separated (as the command line's heading)."""
    if tokens is not None:
        return f"{tokens} tokens"
    try:
        shapes = parse_input_size(input_size)
    except ModelProfError:  # (a ``measure=`` of its own may read it otherwise)
        return str(input_size)
    return ", ".join("x".join(map(str, s)) for s in shapes)


_KEYWORDS = keyword_names(measure_throughput)  # (read once, as profile's)


def _disagreements(points: list[ThroughputPoint], warn: bool) -> list[NeighbourDisagreement]:
    """The points whose latency lies above a bigger batch's, each warned about once (``warn``)."""
    found = neighbour_disagreements(
        "the throughput curve's latency per batch",
        [SeriesPoint(f"batch {p.batch_size}", p.batch_size, p.measurement) for p in points],
    )
    for d in found if warn else ():
        warn_user(f"modelprof: {d.note()}", TimingDisagreementWarning)
    return found


def _search(
    model: Any,
    point: _Point,
    max_batch: int,
    rule: tuple[float, int],
    report: Callable[[ThroughputPoint], None] | None,
) -> tuple:
    """``search_batches`` with its progress bar, under an agreement across ranks for a sharded
    model; and the best point's batch (``_agreed_best``). The model (a module) and the global
    RNG come back as they went in, as from ``measure_latency``."""
    with random_kept(point.dev), agreed_timing([model]), preserved_state(model, watched=FIRST_CALL):
        # total: the doubling points; a refinement after an out-of-memory error counts past it
        bar = progress_bar(
            max_batch.bit_length(), enabled=point.opts.progress, desc="throughput", unit="point"
        )

        def on_point(p: ThroughputPoint) -> None:
            if bar.total is not None and bar.n >= bar.total:
                bar.total = bar.n + 1
            bar.update(1)
            bar.set_postfix(batch=p.batch_size, samples_per_s=f"{p.samples_per_s:,.1f}")
            if report is not None:
                report(p)

        try:
            points, reason, fit, oom = search_batches(
                point.measure, max_batch, *rule, free=lambda: _free(point.dev), on_point=on_point
            )
        finally:
            bar.close()
        return points, reason, fit, oom, _agreed_best(points)


def _agreed_best(points: list[ThroughputPoint]) -> int:
    """The batch with the most samples/s of those not on too few runs (``undersampled``: a
    point of 2 runs won by a hair, unmarked), of all where every one is; under a process group,
    the batch whose slowest rank is fastest, a point on too few runs on any rank passed over
    (every rank picks the same)."""
    agree = current_agreement()

    def least(values: list[float]) -> list[float]:
        if agree is None:
            return values
        return agree.least([int(round(v * 1e3)) for v in values])  # int64 milli-units

    sps = least([-1.0 if p.undersampled else p.samples_per_s for p in points])
    if max(sps) < 0:  # every point on too few runs (somewhere): the fastest, rough
        sps = least([p.samples_per_s for p in points])
    return points[max(range(len(points)), key=lambda i: sps[i])].batch_size


@dataclasses.dataclass
class _Point:
    """One batch size's measurement, and the device memory around the search."""

    target: Any
    input_size: Any
    dev: torch.device
    dtype: Any
    opts: TimingOptions
    switches: dict[str, bool]
    timed: PointMeasure | None = None  # (measure_throughput's ``measure``)
    tokens: tuple[Any, int | None] = (None, None)  # (the user's model, a token length)
    program: Any = None  # an ExportedProgram passed: its recorded shapes, checked per batch

    def __post_init__(self) -> None:
        self.cuda = self.dev.type == "cuda"

    def _latency(self, batch: int, opts: TimingOptions) -> Measurement:
        if self.timed is not None:
            return self.timed(self.target, batch, self.dev, opts)
        model, length = self.tokens
        if length is None:
            given: dict[str, Any] = {"input_size": self.input_size, "batch_size": batch}
        else:  # the user's module (a placed copy has the same vocabulary and forward)
            given = {"inputs": token_inputs(model, length, batch, device=self.dev)}
        if self.program is not None:  # before it runs: its guards name no input
            made = given.get("inputs") or tuple(
                torch.empty(batch, *s, device="meta") for s in parse_input_size(self.input_size)
            )
            check_recorded(self.program, *split_inputs(made))
        return measure_latency(
            self.target,
            **given,
            device=self.dev,
            dtype=self.dtype,
            options=opts,
            **self.switches,
        )

    def baseline_memory(self) -> int | None:
        """The allocated memory before the search (CUDA), after a first call has made what
        stays for the process (cuBLAS workspace, handles): the check sees only the search's."""
        if not self.cuda:
            return None
        try:
            with torch.random.fork_rng(devices=[self.dev]):  # as the search's (``_search``)
                self._latency(1, self.opts.replace(warmup=0, repeat=1))
        except Exception as e:
            if not is_oom(e):  # out of memory at batch 1: the search will say so
                raise
        return self.memory_now()  # after the except block: its traceback holds tensors

    def memory_now(self) -> int | None:
        if not self.cuda:
            return None
        _free(self.dev)
        return torch.cuda.memory_allocated(self.dev)

    def measure(self, b: int) -> ThroughputPoint:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
        m = self._latency(b, self.opts)
        peak = None
        if self.cuda:
            held = m.env.get(HELD_BYTES, 0)  # (copies a point's runs held: left out)
            peak = max(0, int(torch.cuda.max_memory_allocated(self.dev)) - held)
        sps = b * m.n / (float(m.samples_ms.sum()) / 1e3)
        return ThroughputPoint(b, m.median_ms, sps, peak, m)
