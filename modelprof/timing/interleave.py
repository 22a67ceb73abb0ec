"""Comparisons measured the fair way: several callables timed in interleaved rounds.

Every round takes one block of samples of each candidate, in a freshly shuffled order (Google
Benchmark's random interleaving), so the machine's drift reaches them alike. Each ratio to the
baseline is the quotient of the two medians, with a paired interval from the per-round ratios of
block medians (``stats.ratio_of_medians``). On the CPU the CPU time of every sample is read
beside the wall clock, and may be what the comparison ranks by (``ranked_by``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pandas as pd

from modelprof.errors import ModelProfError, TimingDisagreementWarning, warn_user
from modelprof.runtime.agree import agreed_timing
from modelprof.runtime.execution import RunMode, legacy_eval_mode
from modelprof.runtime.exported import check_recorded, runnable
from modelprof.timing.agreement import RatioAgreement, judge_ratio
from modelprof.timing.latency import TimedCall, given_back, no_inputs_hint, resolve_call
from modelprof.timing.measurement import Measurement, format_ms, load_note, quieter_machine
from modelprof.timing.options import TimingOptions
from modelprof.timing.runner import sample_interleaved
from modelprof.timing.stats import paired_block_medians, ratio_of_medians

__all__ = [
    "Candidate",
    "LatencyComparison",
    "cpu_work_columns",
    "cpu_work_note",
    "disagreeing",
    "floor_notes",
    "interval_columns",
    "measure_interleaved",
    "rough_flags",
    "round_ratio",
    "tied_ranks",
    "unranked_note",
    "measure_latencies",
]


@dataclasses.dataclass
class Candidate:
    """One callable of a comparison: the user's object, what is called, and its inputs;
    ``given``: what gives them back (``latency.given_back``, for ``TimedCall``'s ``given=``),
    None where the caller gives them back itself (``compare``)."""

    name: str
    fn: Any
    target: Callable[..., Any]
    inputs: Any  # a ModelInputs
    given: Any = None


@dataclasses.dataclass(eq=False)
class LatencyComparison:
    """Interleaved measurements of several callables and their latency ratios to a baseline.

    ``ratios[name] = (ratio, low, high)``: ``median(name) / median(baseline)`` and its paired
    interval at the measurements' confidence (``stats.RATIO_ESTIMATOR``; NaN bounds with a
    single round). ``cpu_ratios``: the same for the CPU work, when the CPU time was read.
    """

    measurements: dict[str, Measurement]
    baseline: str
    ratios: dict[str, tuple[float, float, float]]
    rounds: int = 0
    wall_s: float | None = None
    cpu_ratios: dict[str, tuple[float, float, float]] | None = None

    @property
    def loaded(self) -> bool:
        """Any candidate ran on a loaded machine (``Measurement.loaded``)."""
        return any(m.loaded for m in self.measurements.values())

    @property
    def ranked_by(self) -> str:
        """``"cpu_work"`` where one thread's CPU time was read (``Measurement.cpu_holds``) and
        the machine was ``loaded`` or the wall clock ``wall_moved`` (load stretches the wall
        clock, not that CPU work); else ``"latency"``."""
        if self.cpu_ratios is None or not all(m.cpu_holds for m in self.measurements.values()):
            return "latency"
        return "cpu_work" if self.loaded or self.wall_moved else "latency"

    @property
    def wall_moved(self) -> bool:
        """A ``latency_x`` disagrees with its rounds while every ``cpu_work_x`` agrees: the
        wall clock moved with the machine between rounds, the work did not."""
        checks = [c for found in self.ratio_checks().values() for c in found]
        wall = [c.agree for c in checks if c.figure == "latency_x"]
        cpu = [c.agree for c in checks if c.figure == "cpu_work_x"]
        return bool(cpu) and not all(wall) and all(cpu)

    def __getitem__(self, name: str) -> Measurement:
        return self.measurements[name]

    def ratio_checks(self) -> dict[str, list[RatioAgreement]]:
        """Each candidate's ``latency_x`` (and ``cpu_work_x``) judged against its rounds
        (``agreement.judge_ratio``); none when a candidate is undersampled."""
        return self._judged

    @functools.cached_property
    def _judged(self) -> dict[str, list[RatioAgreement]]:
        ms = self.measurements
        if any(m.undersampled for m in ms.values()):
            return {}
        base = ms[self.baseline]
        out: dict[str, list[RatioAgreement]] = {}
        for name, m in ms.items():
            if name == self.baseline:
                continue
            out[name] = [judge_ratio("latency_x", name, self.baseline, m, base)]
            if self.cpu_ratios is not None:
                out[name].append(judge_ratio("cpu_work_x", name, self.baseline, m.cpu, base.cpu))
        return out

    @property
    def notes(self) -> list[str]:
        """A sentence for each ratio its rounds disagree with (``*_x_rough`` in the frame)."""
        return [c.note() for found in self.ratio_checks().values() for c in found if not c.agree]

    def _rough(self) -> dict[str, set[str]]:
        checks = self.ratio_checks()
        return {n: {c.figure for c in checks.get(n, ()) if not c.agree} for n in self.measurements}

    def to_dataframe(self) -> Any:
        """One row per candidate: latency statistics, the ratio and its interval, stability."""
        rows = {}
        rough = self._rough()
        for name, m in self.measurements.items():
            cpu = cpu_work_columns(self, name)
            if cpu:
                cpu["cpu_work_x_rough"] = "cpu_work_x" in rough[name]
            rows[name] = {
                **interval_columns("latency", m),
                "latency_std_ms": m.std_ms,
                "latency_p90_ms": m.p90_ms,
                "fps": m.fps,
                "n": m.n,
                **interval_columns("latency_x", self.ratios[name]),
                "latency_x_rough": "latency_x" in rough[name],
                "stable": m.stable,
                **cpu,
            }
        # in the order given (pandas 3.0.6's from_dict puts a row with other keys last)
        df = pd.DataFrame.from_dict(rows, orient="index").reindex(list(rows))
        df.index.name = "name"
        return df

    def __repr__(self) -> str:
        lines = [
            f"LatencyComparison({len(self.measurements)} candidates, {self.rounds} "
            f"interleaved rounds, baseline {self.baseline!r})"
        ]
        rough = self._rough()
        for name, m in self.measurements.items():
            ratio, lo, hi = self.ratios[name]
            ci = f" [{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) else ""
            lines.append(
                f"  {name:<24} {format_ms(m.median_ms):>11} {m.relative_ci_text(1)}   "
                f"x{ratio:.3f}{ci}"
                + ("  UNSTABLE" if m.stable is False else "")
                + ("  ROUGH" if "latency_x" in rough[name] else "")
            )
        lines.extend(f"  !! {note}" for note in self.notes)
        return "\n".join(lines)


def measure_interleaved(
    candidates: list[Candidate],
    opts: TimingOptions,
    *,
    baseline: str | None = None,
    mode: RunMode = RunMode(),
) -> LatencyComparison:
    """Warm every candidate up, then sample them in interleaved rounds, each run as ``mode``
    says."""
    if not candidates:
        raise ModelProfError("nothing to compare: pass at least one candidate")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ModelProfError(f"candidate names must be unique, got {names}")
    baseline = names[0] if baseline is None else baseline
    if baseline not in names:
        raise ModelProfError(f"baseline={baseline!r} is not one of the candidates: {names}")
    ordered = sorted(candidates, key=lambda c: c.name != baseline)  # the baseline first
    t_begin = time.perf_counter()
    calls = [
        TimedCall(c.fn, c.target, c.inputs, opts, mode=mode, label=c.name, given=c.given)
        for c in ordered
    ]
    sampled = sample_interleaved(calls, opts, "interleaved timing")
    timed = {c.name: tc.measurement(s, t_begin) for c, tc, s in zip(ordered, calls, sampled)}
    measurements = {n: timed[n] for n in names}
    cpu_ratios = None
    if all(m.cpu is not None for m in measurements.values()):
        cpu_ratios = _ratios({n: m.cpu for n, m in measurements.items()}, baseline)
    if opts.warn:
        for m in timed.values():
            m.warn_if_noisy()
    return LatencyComparison(
        measurements,
        baseline,
        _ratios(measurements, baseline),
        rounds=int(timed[baseline].n_blocks),
        wall_s=time.perf_counter() - t_begin,
        cpu_ratios=cpu_ratios,
    )


def _ratios(
    measurements: dict[str, Measurement], baseline: str
) -> dict[str, tuple[float, float, float]]:
    """Each candidate's ratio of medians to the baseline, with its paired interval from the
    rounds both took (paired by round, as ``agreement.judge_ratio`` pairs them)."""
    base = measurements[baseline]
    return {
        name: (1.0, 1.0, 1.0) if name == baseline else round_ratio(m, base, m.confidence)
        for name, m in measurements.items()
    }


def round_ratio(m: Measurement, base: Measurement, confidence: float) -> tuple[float, float, float]:
    """``median(m) / median(base)`` and its interval at ``confidence``, paired over the rounds
    both took (``stats.paired_block_medians``: one at its ``max_samples`` takes no more)."""
    num, den = paired_block_medians(m.samples_ms, m.blocks, base.samples_ms, base.blocks)
    return ratio_of_medians(m.samples_ms, base.samples_ms, num, den, confidence)


def tied_ranks(
    figures: Mapping[str, Measurement], also: Mapping[str, Measurement] | None = None
) -> tuple[dict[str, int], str | None]:
    """Each candidate's rank, 1 the lowest median of the figure ranked by, and the note naming
    the ties: a candidate ties with the first of the group ranked just above it when the
    interval of their paired ratio (:func:`round_ratio`) holds 1, as when it is the same model;
    the rounds cannot order them. ``also``: a second figure of each (the wall clock beside the
    CPU work on a loaded machine, where the other work slows one model's work more than
    another's) that must not hold 1 nor order a candidate the other way against the first of
    any group above it; where it does, that group, every one between and the candidate tie.
    Ranks run 1, 1, 3 (two tied for first). Where the time budget ended some runs (stop
    ``budget`` or ``spread``), the note says more may order them."""
    groups: list[list[str]] = []  # in order of the figure's medians, each led by its first
    for name in sorted(figures, key=lambda name: figures[name].median_ms):
        join = None
        if groups and _unordered(figures[name], figures[groups[-1][0]]):
            join = len(groups) - 1
        if also is not None:
            join = next(
                (j for j, g in enumerate(groups) if _unordered(also[name], also[g[0]], True)),
                join,
            )
        if join is None:
            groups.append([name])
        else:
            groups[join:] = [[n for g in groups[join:] for n in g] + [name]]
    ranks: dict[str, int] = {}
    for group in groups:
        ranks.update(dict.fromkeys(group, len(ranks) + 1))
    tied = [", ".join(g) for g in groups if len(g) > 1]
    if not tied:
        return ranks, None
    held = (
        "holds 1"
        if also is None
        else "holds 1, or the wall clock's does or orders them the other way"
    )
    note = f"tied in rank (the interval of their paired ratio {held}): {'; '.join(tied)}"
    if any(m.stop_reason in ("budget", "spread") for m in figures.values()):
        note += "; the time budget ended the runs: a larger budget_s may order them"
    return ranks, note


def _unordered(m: Measurement, leader: Measurement, either_way: bool = False) -> bool:
    """The rounds cannot put ``m`` after ``leader``: their paired ratio's interval holds 1 or
    is unknown (fewer than two rounds paired; ``either_way``: or lies below 1, ordering them
    the other way)."""
    ratio, low, high = round_ratio(m, leader, m.confidence)
    unknown = math.isnan(low) or math.isnan(high)
    return ratio == 1.0 or unknown or low <= 1.0 <= high or (either_way and high < 1.0)


def shaken_attrs(measured: Mapping[str, Iterable[Measurement]], loaded: bool) -> dict[str, Any]:
    """What a comparison's caption says made its timing less sure: ``"loaded"`` (with
    ``loaded``: the table ranks by latency, so the load is its to state) in words, and
    ``"drifted"``, the names of the candidates any of whose ``measured`` figures drifted."""
    out: dict[str, Any] = {}
    every = [m for ms in measured.values() for m in ms]
    if loaded and any(m.loaded for m in every):
        out["loaded"] = load_note(every)
    drifted = [name for name, ms in measured.items() if any(m.stable is False for m in ms)]
    if drifted:
        out["drifted"] = drifted
    return out


def unranked_note(counts: Mapping[str, int]) -> str | None:
    """The sentence a comparison states instead of ranks and timed ratios when a candidate got
    too few runs for an interval (``counts``: each such candidate's runs); None when none did."""
    if not counts:
        return None
    runs = ", ".join(f"{name} n={n}" for name, n in counts.items())
    return (
        f"cannot rank the models: too few runs for an interval ({runs}); "
        "the timed ratios are not stated. Give the comparison more time "
        "(budget_s) or a quieter machine"
    )


def floor_notes(measurements: Iterable[Measurement]) -> list[str]:
    """A sentence when the rounds went on past the budget to hold the sample floor."""
    extended = [m for m in measurements if m.extended_s > 0]
    if not extended:
        return []
    m = max(extended, key=lambda m: m.extended_s)
    return [
        f"the time budget was extended by {m.extended_s:.3g} s (at most {m.floor_cap_s:g} s) "
        f"so that every candidate has min_samples={m.min_samples} runs"
    ]


def loaded_latency_notes(measurements: Iterable[Measurement]) -> list[str]:
    """On a loaded machine where some CPU work does not hold (``cpu_holds``: several threads',
    or a caller's that waited on other work): why the table ranks by latency all the same, and
    what to do (fewer threads only where a measurement that ran several can have fewer)."""
    ms = list(measurements)
    if not any(m.loaded for m in ms) or all(m.cpu_holds for m in ms):
        return []
    # a CPU work that does not hold: several threads' (load stretches it too), or a caller's
    # that waited on other work (no figure of the work at all)
    threads = [m for m in ms if m.cpu is not None and not m.waited and not m.cpu_holds]
    if threads:
        cpu = "so does the CPU work of several threads (they spin while one waits for a core)"
    elif any(m.waited for m in ms):
        cpu = "and the CPU work is no figure either (the timed thread waited on other work)"
    else:
        cpu = "and no CPU work was read to rank by"
    return [  # fewer threads only for those whose work they run (not a waiting caller's)
        f"ranked by latency on a loaded machine ({load_note(ms)}): the ratios moved with the "
        f"load, {cpu}, so no figure here is proof against it; {quieter_machine(threads)}"
    ]


def cpu_work_note(
    measurements: Iterable[Measurement],
    why: str | None = None,
    what: str = "model",
    advice: str = "",
) -> str:
    """Why a comparison ranks by CPU work: ``why``, by default the load on the machine, which
    stretches the wall clock of whichever ``what`` it hits; ``advice`` before the caveat."""
    ms = list(measurements)
    if why is None:
        why = (
            f"the machine was loaded ({load_note(ms)}), which stretches the wall clock of "
            f"whichever {what} it hits"
        )
    return (
        f"ranked by CPU work ({ms[0].cpu_clock}): {why}; {advice}CPU work equals latency only "
        "for a single-threaded model on an idle core, and other work can still slow one "
        f"{what}'s work more than another's (shared caches), which the intervals do not cover"
    )


def disagreeing(
    checks: Mapping[str, list[RatioAgreement]],
    ranking: str,
    words: str,
    attrs: dict[str, Any],
    notes: list[str],
    warn: bool = True,
) -> None:
    """Each ratio that disagrees with its rounds: a note, a warning (unless not ``warn``) and
    its name in ``attrs["rough_ratios"]`` (``latency_x of b``, for a caption); where it is
    ``ranking``, the ratio the table ranks by (``words``: it in words), the sentence that
    withholds the ranks (``attrs["ratios_disagree"]``), noted after them."""
    for check in (c for found in checks.values() for c in found if not c.agree):
        notes.append(check.note())
        attrs.setdefault("rough_ratios", []).append(f"{check.figure} of {check.name}")
        if warn:
            warn_user(f"modelprof: {check.note()}", TimingDisagreementWarning)
        if check.figure == ranking and "ratios_disagree" not in attrs:
            attrs["ratios_disagree"] = (
                f"not ranked: {words} of {check.name} disagrees with its per-round ratios "
                "(the ratio of medians lies outside their interval)"
            )
    if "ratios_disagree" in attrs:
        notes.append(attrs["ratios_disagree"])


def rough_flags(
    checks: Iterable[RatioAgreement], row: dict[str, Any], ratios: Iterable[str]
) -> None:
    """``<ratio>_rough`` beside each of ``ratios`` that ``row`` states: whether ``checks`` found
    it disagreeing with its per-round ratios."""
    rough = {c.figure for c in checks if not c.agree}
    row.update({f"{r}_rough": r in rough for r in ratios if r in row})


def interval_columns(
    prefix: str, figure: Measurement | tuple[float, float, float], median: str = "_median"
) -> dict[str, float]:
    """A figure and its interval as a comparison table's three columns: a measurement's
    ``{prefix}_median_ms``, ``{prefix}_ci_low_ms``, ``{prefix}_ci_high_ms`` (the first
    ``{prefix}_ms`` with ``median=""``), or a ratio ``(ratio, low, high)``'s ``{prefix}``,
    ``{prefix}_ci_low``, ``{prefix}_ci_high``."""
    if not isinstance(figure, Measurement):  # a ratio, its low and high bounds
        return dict(zip((prefix, f"{prefix}_ci_low", f"{prefix}_ci_high"), figure))
    low, high = figure.median_ci_ms
    return {
        f"{prefix}{median}_ms": figure.median_ms,
        f"{prefix}_ci_low_ms": low,
        f"{prefix}_ci_high_ms": high,
    }


def cpu_work_columns(result: LatencyComparison, name: str) -> dict[str, Any]:
    """A candidate's CPU work columns beside its wall-clock latency (empty when not read)."""
    m = result.measurements[name]
    if m.cpu is None or result.cpu_ratios is None:
        return {}
    return {
        **interval_columns("cpu_work", m.cpu),
        **interval_columns("cpu_work_x", result.cpu_ratios[name]),
        "wall_over_cpu": m.wall_over_cpu,
        "loaded": m.loaded,
    }


def measure_latencies(
    candidates: Mapping[str, Callable[..., Any]],
    inputs: Any = None,
    *,
    input_size: Any = None,
    batch_size: int | None = None,
    device: Any = None,
    dtype: Any = None,
    baseline: str | None = None,
    training: bool = False,
    no_grad: bool = True,
    options: TimingOptions | None = None,
    **timing_options: Any,
) -> LatencyComparison:
    """Time several callables on the same inputs, interleaved, e.g.
    ``measure_latencies({"eager": model, "compiled": torch.compile(model)}, x)``.

    Takes the inputs and timing options of :func:`measure_latency`; ``budget_s`` is per
    candidate. ``baseline`` (default: the first) is what ``latency_x`` divides by. Gives back
    what :func:`measure_latency` gives back: each module as it went in, the inputs (every
    call sees them as they went in, whatever another candidate wrote) and the global RNG.
    An ``ExportedProgram`` is timed as its ``module()``, what running it means.
    """
    if not isinstance(candidates, Mapping) or not candidates:
        raise ModelProfError(
            f"candidates={candidates!r} must be a non-empty dict {{name: callable}}"
        )
    programs, candidates = candidates, {name: runnable(fn) for name, fn in candidates.items()}
    training = legacy_eval_mode(training, timing_options, "measure_latencies")
    opts = TimingOptions.parse(options, **timing_options)
    prepared = []
    for name, fn in candidates.items():
        try:
            target, mi = resolve_call(
                fn,
                inputs,
                input_size=input_size,
                batch_size=batch_size,
                device=device,
                dtype=dtype,
                channels_last=opts.channels_last,
            )
            check_recorded(programs[name], mi.args, mi.kwargs)  # a program: before it runs
        except ModelProfError as e:  # say which candidate
            raise ModelProfError(f"candidate {str(name)!r}: {e}") from e
        prepared.append(Candidate(str(name), fn, target, mi))
    # sharded models under torchrun: ranks agree
    with (
        no_inputs_hint(candidates.values(), inputs, input_size),
        agreed_timing(candidates.values()),
        contextlib.ExitStack() as held,
    ):
        _give_back(held, prepared, inputs, baseline)
        result = measure_interleaved(
            prepared,
            opts,
            baseline=baseline,
            mode=RunMode.parse(training=training, no_grad=no_grad),
        )
    if opts.warn:
        for note in result.notes:
            warn_user(f"modelprof: {note}", TimingDisagreementWarning)
    return result


def _give_back(
    held: contextlib.ExitStack, prepared: list[Candidate], inputs: Any, baseline: str | None
) -> None:
    """Each candidate's module, the inputs and the RNG given back when ``held`` closes, as
    ``measure_latency`` gives them back (``given_back``: its first call watched, what it
    writes put back before every later call). Entered in the order the candidates are warmed
    up, the baseline first: the outermost guard of a module that two candidates run (``m`` and
    ``torch.compile(m)``), which restores last, is the one whose watch saw its first writes."""
    first = prepared[0].name if baseline is None else baseline
    for c in sorted(prepared, key=lambda c: c.name != first):
        c.given = held.enter_context(given_back(c.fn, c.target, inputs, c.inputs))
