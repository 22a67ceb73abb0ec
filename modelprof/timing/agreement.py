"""Whether timed figures that should tell one story do: three checks, one tolerance.

- **The per-layer window against the clean runs** (:func:`judge_agreement`): ``profile`` times
  clean end-to-end runs, then instrumented passes (their corrected pass is the ``(root)`` row);
  when the machine's load changes between the two windows they disagree, which the coverage
  (passes of one window) cannot tell. The leaf rows, disjoint parts of the ``(root)`` pass, must
  also add up to it. The figure to quote is the faster window's: load only ever adds time.
- **A point against its neighbours** (:func:`neighbour_disagreements`): in a series over a
  growing amount of work (batch sizes, contexts), more work does not take less time.
- **A ratio against its rounds** (:func:`judge_ratio`): a comparison's ratio of medians against
  its per-round ratios of block medians (``stats.paired_ratio``): a candidate whose time moved
  between rounds has medians that say one ratio and rounds that say another.

A side without a 95 % interval counts as its median.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from modelprof.render.units import format_multiple
from modelprof.timing.measurement import JUDGE_MAX_RELATIVE_CI, Measurement
from modelprof.timing.stats import paired_block_medians, paired_ratio

__all__ = [
    "AGREEMENT_TOLERANCE",
    "IDENTICAL_FACTOR",
    "LEAVES_SHORT_SHARE",
    "IdenticalSpread",
    "NeighbourDisagreement",
    "RatioAgreement",
    "SeriesPoint",
    "TimingAgreement",
    "identical_spread",
    "judge_agreement",
    "judge_backward",
    "judge_ratio",
    "neighbour_disagreements",
]

#: Figures further apart than this (and beyond both intervals) disagree, in every check here.
AGREEMENT_TOLERANCE = 0.10
#: Calls doing identical work (same module type, shapes, parameters and FLOPs) whose per-layer
#: medians are more than this factor apart, by more than ``IDENTICAL_SHARE`` of the pass,
#: disagree: caches and placement move identical layers by tens of percent, not by 2x.
IDENTICAL_FACTOR = 2.0
IDENTICAL_SHARE = 0.05
#: On a loaded machine, leaf rows whose medians sum to less than this share of the (root) pass
#: they are parts of do not add up: a sum of many small right-skewed parts' medians reads up to
#: ~19 % short of the median of their sums on a noisy machine (README), and under load each
#: part's median leaves out the preemptions every whole pass meets (a newcomer's mobilenet read
#: 42 %). Not on a quiet one: wrappers whose own Python makes no (self) row read short there.
LEAVES_SHORT_SHARE = 0.70
#: The most one autograd node's stamp is taken to cost (µs): an instrumented backward slower
#: than the clean one by at most this per node is the stamps' cost, said, not a disagreement
#: (1.5-2.5 µs per node on this project's 2-core VM: ``benchmarks/backward_stamps.py``).
STAMP_BOUND_US = 5.0


@dataclasses.dataclass(frozen=True)
class IdenticalSpread:
    """Two calls doing identical work whose per-layer medians (ms) are far apart."""

    slow: str
    slow_ms: float
    fast: str
    fast_ms: float

    def note(self) -> str:
        return (
            f"the per-layer rows DISAGREE among identical layers: {self.slow} read "
            f"{_ms(self.slow_ms)} and {self.fast}, which does the same work on the same shapes, "
            f"{_ms(self.fast_ms)} ({self.slow_ms / self.fast_ms:.1f}x; a layer's first calls "
            "or the machine's load moved one of them); read the rows as rough, and time again "
            "with a larger budget_s or on a quieter machine"
        )


def identical_spread(rows, latencies, total_ms: float) -> IdenticalSpread | None:
    """Of the module rows (``latencies``: their per-layer medians, ms) doing identical work, the
    pair furthest apart when beyond ``IDENTICAL_FACTOR`` and ``IDENTICAL_SHARE`` of
    ``total_ms`` (the pass they are parts of); else None."""
    groups: dict[tuple, list[tuple[float, str]]] = {}
    for row, ms in zip(rows, latencies):
        if row.kind != "module" or row.is_self or ms is None or not math.isfinite(ms):
            continue
        work = (row.type, row.depth, repr(row.input_shapes), repr(row.output_shapes))
        name = row.module if row.call == 1 else f"{row.module} (call {row.call})"
        groups.setdefault((*work, row.params, row.flops), []).append((ms, name))
    worst = None
    for members in groups.values():
        if len(members) < 2:
            continue
        (lo, fast), (hi, slow) = min(members), max(members)
        far = hi > IDENTICAL_FACTOR * lo and hi - lo > IDENTICAL_SHARE * total_ms
        if far and (worst is None or hi - lo > worst.slow_ms - worst.fast_ms):
            worst = IdenticalSpread(slow, hi, fast, lo)
    return worst


@dataclasses.dataclass(frozen=True)
class TimingAgreement:
    """The clean runs against the per-layer window: both medians (ms; ``passes_ms`` the
    ``(root)`` row's where the table has one, beside the passes' interval) and intervals, the
    leaf rows' sum, their ratio (per-layer / clean), the verdict and the figure to quote."""

    clean_ms: float
    clean_ci_ms: tuple[float, float]
    passes_ms: float
    passes_ci_ms: tuple[float, float]
    leaf_sum_ms: float
    ratio: float
    agree: bool
    quote_ms: float
    quote: str  # "clean", "per-layer" or "none" (too noisy or too few runs to quote either)
    cpu_ms: float | None = None  # the clean runs' CPU work, when read on a loaded CPU
    cpu_clock: str | None = None
    regimes: str | None = None  # modes the clean runs use and the per-layer passes do not
    #: "agree", "disagree" (apart beyond both intervals), "imprecise" (apart, but an interval
    #: too wide to tell), "leaves" (the leaf rows add up to more than the (root) pass), "short"
    #: (to less than ``LEAVES_SHORT_SHARE`` of it) or
    #: "identical" (identical layers far apart: ``identical``); a backward's also "stamps"
    #: and "window" (:func:`judge_backward`)
    verdict: str = "agree"
    identical: IdenticalSpread | None = None
    #: "forward" (the per-layer passes) or "backward" (a training step's instrumented backward)
    phase: str = "forward"
    #: a backward's autograd nodes, and what each one's stamp cost if the excess is theirs
    nodes: int = 0
    stamp_us: float = math.nan
    #: a backward whose stamps' measured cost was taken off the passes already
    corrected: bool = False
    #: the plain backwards run beside the instrumented ones (median ms; verdict "window")
    plain_ms: float = math.nan

    @property
    def between_regimes(self) -> bool:
        """A disagreement of two regimes (``regimes``: a ``torch.compile``'d model's clean runs
        against its eager per-layer passes), no sign the rows are off."""
        return bool(self.regimes) and self.verdict == "disagree"

    @property
    def alarming(self) -> bool:
        """A disagreement to warn about and mark ``!!``: any but what the stamps explain, or
        the instrumented window's own pace (notes, no alarm: else every small model's
        training step warned)."""
        return not self.agree and self.verdict not in ("stamps", "window")

    def note(self) -> str:
        """One sentence for the summary, ``timing_notes`` and the warning."""
        w = _WORDS["backward corrected" if self.corrected else self.phase]
        if self.agree:
            return (
                f"{w['passes']} (median {_ms(self.passes_ms)}) and {w['runs']} "
                f"(median {_ms(self.clean_ms)}) agree within their intervals"
            )
        if self.verdict == "imprecise":
            return self._too_noisy(w)
        if self.verdict == "identical" and self.identical is not None:
            return self.identical.note()
        if self.verdict == "window":
            return (
                f"the per-layer backward rows, less their stamps' measured cost, read "
                f"{_ms(self.passes_ms)}, {_x(self.ratio)} the clean backward's "
                f"{_ms(self.clean_ms)}, as did the plain backward run beside them "
                f"({_ms(self.plain_ms)}): the two windows ran the backward at different paces "
                "(caches, the allocator, the machine's load), not the stamps; "
                f"{self._quote_clean(w)}"
                f"{self._cpu_work()}"
            )
        if self.verdict == "stamps":
            return (
                f"the per-layer backward rows include their stamps: the instrumented backward "
                f"read {_ms(self.passes_ms)}, {_x(self.ratio)} the clean backward's "
                f"{_ms(self.clean_ms)}, about {self.stamp_us:.1f} us for each of its "
                f"{self.nodes} autograd nodes (not taken off here: a GPU, too few or too noisy "
                f"pairs, or correct_overhead=False); {self._quote_clean(w)}{self._cpu_work()}"
            )
        if self.verdict == "short":
            return (
                f"{w['rows']} DO NOT ADD UP: {w['parts']} sum to {_ms(self.leaf_sum_ms)}, "
                f"{self.leaf_sum_ms / self.passes_ms:.0%} of {w['whole']} "
                f"{_ms(self.passes_ms)} they are parts of: each part's median leaves out the "
                "pauses every whole pass meets (other work on the machine took the cores), so "
                "the rows and their shares understate the layers; read them as rough, and time "
                "again on a quieter machine"
            )
        if self.verdict == "leaves":
            return (
                f"{w['rows']} DO NOT ADD UP: {w['parts']} sum to "
                f"{_ms(self.leaf_sum_ms)}, {_x(self.leaf_sum_ms / self.passes_ms)} "
                f"{w['whole']} {_ms(self.passes_ms)} they are parts of (per-layer medians taken "
                "while the machine's load moved); read the rows as rough, and time again with a "
                "larger budget_s or on a quieter machine"
            )
        return self._disagreement(w)

    def _quote_clean(self, w: dict[str, str]) -> str:
        """The advice of a verdict the stamps or the window explain: quote the clean backward,
        where it stands on its own (``quote``)."""
        if self.quote == "clean":
            return f"quote the clean backward and read the rows by their {w['share']}"
        return (
            "the clean backward is itself too noisy or loaded to quote (time again with a "
            f"larger budget_s or on a quieter machine); read the rows by their {w['share']}"
        )

    def _too_noisy(self, w: dict[str, str]) -> str:
        """The TOO NOISY TO COMPARE sentence: whether the clean median stands on its own."""
        few = not all(map(math.isfinite, (*self.passes_ci_ms, *self.clean_ci_ms)))
        head = (
            f"{w['passes']} and {w['runs']} are TOO NOISY TO COMPARE: {w['root']} "
            f"read {_ms(self.passes_ms)} {_ci(self.passes_ci_ms)}, {w['clean']} "
            f"median {_ms(self.clean_ms)} {_ci(self.clean_ci_ms)}: {_x(self.ratio)} apart, "
            + (
                "too few runs for an interval to say which holds"
                if few
                else "inside an interval too wide to say which holds (the machine's load "
                "moved the runs)"
            )
        )
        if self.quote == "clean":
            return (
                f"{head}; {w['clean']} median {_ms(self.clean_ms)} stands on its own "
                "(a tight interval, and its own runs showed no load, whatever other timings "
                f"of this run showed): quote it, and read {w['rows']} "
                "as rough"
            )
        return (
            f"{head}; neither is a figure to quote: time again with a larger budget_s "
            "or on a quieter machine"
        )

    def _disagreement(self, w: dict[str, str]) -> str:
        """The DISAGREE sentence: both medians, why they differ, the figure to quote."""
        leaves = (  # (none for a backward: its rows are its stamps' stretches, one sum)
            f" and the leaf rows sum to {_ms(self.leaf_sum_ms)}"
            if math.isfinite(self.leaf_sum_ms)
            else ""
        )
        head = (
            f"{w['passes']} and {w['runs']} DISAGREE: {w['root']} read "
            f"{_ms(self.passes_ms)} {_ci(self.passes_ci_ms)}{leaves}, {w['clean']} median "
            f"{_ms(self.clean_ms)} {_ci(self.clean_ci_ms)}: {_x(self.ratio)}, beyond both "
            "intervals, "
        )
        if self.regimes:
            return (
                f"{head}as the clean runs use {self.regimes} and the per-layer passes do not "
                "(they run the eager model, or an exported program's layers unflattened); "
                f"quote {w['clean']} {_ms(self.clean_ms)} for the model as it runs, and "
                f"{w['rows']} by their {w['share']}"
            )
        if self.quote == "clean":
            why = w["slower"]
            advice = (
                f"quote {w['clean']} {_ms(self.quote_ms)} (the faster window: load "
                f"only adds time) and read {w['rows']} by their {w['share']}, not their ms"
            )
        else:
            why = "so the machine's load changed between the two"
            advice = (  # (that figure is the one to quote: said once)
                f"quote that figure, {w['quoted']} (the faster window: load only "
                f"adds time; the clean runs were slowed), and {w['rows']} as measured"
            )
        return f"{head}{why}; {advice}{self._cpu_work()}"

    def _cpu_work(self) -> str:
        """On a loaded CPU where it holds, the clean runs' CPU work (the figure the
        loaded-machine warning says to quote), after the advice on the wall clock's."""
        if self.cpu_ms is None:
            return ""
        return (
            f"; the CPU work of the clean runs, {_ms(self.cpu_ms)} ({self.cpu_clock}), "
            "is what waiting for a core cannot stretch"
        )


#: how a note names each side, by phase
_WORDS = {
    "forward": {
        "passes": "the per-layer passes",
        "runs": "the clean runs",
        "root": "the (root) row",
        "clean": "the clean end-to-end",
        "rows": "the per-layer rows",
        "quoted": "the (root) row's",
        "share": "latency share",
        "slower": "so the machine's load changed between the two",
        "parts": "the leaf rows",
        "whole": "the (root) pass's",
    },
    "backward": {
        "passes": "the per-layer backward passes",
        "runs": "the clean backward runs",
        "root": "the instrumented backward (every row's, (loss) included)",
        "clean": "the clean backward",
        "rows": "the per-layer backward rows",
        "quoted": "the instrumented backward",
        "share": "backward latency share",
        "parts": "the rows' medians",
        "whole": "the instrumented backward's",
        # where the stamps' cost was not taken off (CUDA, too few or too noisy pairs,
        # correct_overhead=False): on small layers they are a share of every node's time
        "slower": "so the stamp on each autograd node cost that much (small layers: tens of "
        "percent) or the machine's load changed between the two",
    },
}
_WORDS["backward corrected"] = {
    **_WORDS["backward"],
    "root": "the instrumented backward less its stamps' measured cost",
    "quoted": "the instrumented backward less its stamps",
    "whole": "the instrumented backward's, less its stamps,",
    "slower": _WORDS["forward"]["slower"],
}


def _ms(v: float) -> str:
    return f"{v:,.3f} ms" if math.isfinite(v) else "n/a"


def _x(ratio: float) -> str:
    """A ratio as the tables print it, in significant digits (0.003 read "0.00x")."""
    return format_multiple(ratio).replace("×", "x")


def _ci(ci: tuple[float, float]) -> str:
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "(no interval)"
    return f"(95 % CI {lo:,.3f}-{hi:,.3f})"


def _relative_width(m: Measurement) -> float:
    """``m.relative_ci``; without an interval (too few runs) infinite: a single run is no
    precise figure."""
    r = m.relative_ci
    return r if math.isfinite(r) else math.inf


def _stands(m: Measurement) -> bool:
    """A median to quote on its own: an interval within ``JUDGE_MAX_RELATIVE_CI``, unloaded."""
    return _relative_width(m) <= JUDGE_MAX_RELATIVE_CI and not m.loaded


def _bounds(m: Measurement) -> tuple[float, float]:
    lo, hi = m.median_ci_ms
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return m.median_ms, m.median_ms
    return lo, hi


def judge_agreement(
    clean: Measurement,
    passes: Measurement,
    leaf_sum_ms: float,
    tolerance: float = AGREEMENT_TOLERANCE,
    regimes: str | None = None,
    identical: IdenticalSpread | None = None,
    phase: str = "forward",
    root_ms: float | None = None,
) -> TimingAgreement:
    """``clean``: the clean end-to-end Measurement; ``passes``: the per-layer window's corrected
    passes (the ``(root)`` row); ``leaf_sum_ms``: the leaf rows' sum; ``regimes``: the modes
    only the clean runs use, if any; ``identical``: :func:`identical_spread`'s finding, if any;
    ``root_ms``: the ``(root)`` row's median as the table shows it (its call's span, inside the
    pass), the per-layer figure read and quoted (the passes' median where None).

    Medians further apart than ``tolerance`` *disagree* when their intervals do not overlap,
    and are *too noisy to compare* when they overlap only because an interval is wider than
    ±``JUDGE_MAX_RELATIVE_CI`` (neither is then a figure to quote); a leaf sum above the
    ``(root)`` pass by more than ``tolerance`` is a third disagreement."""
    c_lo, c_hi = _bounds(clean)
    p_lo, p_hi = _bounds(passes)
    figure = root_ms or passes.median_ms  # the per-layer figure the note reads and quotes
    ratio = figure / clean.median_ms if clean.median_ms > 0 else math.nan
    # (a side without an interval, too few runs, is apart from nothing: no disagreement)
    known = math.isfinite(_relative_width(clean)) and math.isfinite(_relative_width(passes))
    apart = known and (p_lo > c_hi or p_hi < c_lo)
    precise = max(_relative_width(clean), _relative_width(passes)) <= JUDGE_MAX_RELATIVE_CI
    # overlapping intervals that both tell something show no disagreement
    far = math.isfinite(ratio) and abs(math.log(ratio)) > math.log1p(tolerance)
    far = far and (apart or not precise)
    over = passes.median_ms > 0 and leaf_sum_ms > passes.median_ms * (1.0 + tolerance)
    # (only on a loaded machine: a wrapper module whose own work makes no (self) row leaves
    # its time in the (root) pass and in no leaf, a structure no quieter machine changes)
    under = clean.loaded and leaf_sum_ms < passes.median_ms * LEAVES_SHORT_SHARE
    if far:
        verdict = "disagree" if apart else "imprecise"
    elif over or under:
        verdict = "leaves" if over else "short"
    else:
        verdict = "identical" if identical is not None else "agree"
    quote = "clean" if not ratio < 1.0 else "per-layer"
    if verdict == "imprecise":  # a tight, unloaded clean median still stands; else none does
        quote = "clean" if _stands(clean) else "none"
    show_cpu = clean.cpu_holds and clean.loaded
    return TimingAgreement(
        clean_ms=clean.median_ms,
        clean_ci_ms=clean.median_ci_ms,
        passes_ms=figure,
        passes_ci_ms=passes.median_ci_ms,
        leaf_sum_ms=float(leaf_sum_ms),
        ratio=float(ratio),
        agree=verdict == "agree",
        quote_ms={"clean": clean.median_ms, "per-layer": figure}.get(quote, math.nan),
        quote=quote,
        cpu_ms=clean.cpu.median_ms if show_cpu else None,
        cpu_clock=clean.cpu_clock if show_cpu else None,
        regimes=regimes or None,
        verdict=verdict,
        identical=identical,
        phase=phase,
    )


def judge_backward(
    clean: Measurement,
    passes: Measurement,
    nodes: int,
    corrected: bool = False,
    rows_ms: float = math.nan,
    plain: Measurement | None = None,
    regimes: str | None = None,
) -> TimingAgreement:
    """A training step's instrumented backward (``passes``) against its clean backward: as
    :func:`judge_agreement` (``regimes``: the modes only the clean steps use, a
    ``torch.compile``'d model's, which explain a disagreement), except that, where the stamps'
    cost was not taken off (``corrected``), a disagreement (or a difference too noisy to judge) the per-node stamps
    can explain (the instrumented one slower by at most ``STAMP_BOUND_US`` per node of
    ``nodes``) is the verdict ``"stamps"``: the rows include their stamps, said in a note, no
    alarm; and a clean median of n/a is "imprecise", never agreement. Where the two agree,
    ``rows_ms`` (the rows' medians summed: parts of every pass) above the passes' median by
    more than the tolerance is the verdict ``"leaves"``: under load the medians of parts need
    not add up. Corrected passes slower than the clean backward but within the tolerance of the
    ``plain`` backwards run beside them are the verdict ``"window"``: a note, no alarm."""
    a = judge_agreement(clean, passes, math.nan, phase="backward", regimes=regimes)
    a = dataclasses.replace(a, nodes=nodes, corrected=corrected)
    if not math.isfinite(a.ratio):  # a clean median of n/a (or 0): nothing to say they agree
        return dataclasses.replace(a, agree=False, verdict="imprecise")
    if a.regimes and a.verdict in ("disagree", "imprecise"):  # two regimes: not the stamps
        return a
    # (above only, as the forward's: a sum of medians of many small right-skewed parts reads
    # short of the median of their sums on a quiet machine too)
    over = a.passes_ms > 0 and rows_ms > a.passes_ms * (1.0 + AGREEMENT_TOLERANCE)
    if a.verdict == "agree" and over:
        return dataclasses.replace(a, verdict="leaves", agree=False, leaf_sum_ms=rows_ms)
    if a.verdict not in ("disagree", "imprecise") or not a.ratio > 1.0:
        return a
    if not math.isfinite(_relative_width(clean)):  # one clean run: too few to quote it by
        return a
    # the notes of both verdicts quote the clean backward: where it stands on its own
    quoted = {"quote": "clean", "quote_ms": clean.median_ms} if _stands(clean) else {}
    if corrected:
        beside = a.passes_ms / plain.median_ms if plain is not None and plain.median_ms > 0 else 0
        if beside > 0 and abs(math.log(beside)) <= math.log1p(AGREEMENT_TOLERANCE):
            return dataclasses.replace(a, verdict="window", plain_ms=plain.median_ms, **quoted)
        return a
    if nodes <= 0:
        return a
    per_node_us = 1000.0 * (passes.median_ms - clean.median_ms) / nodes
    if per_node_us > STAMP_BOUND_US:
        return a
    return dataclasses.replace(a, verdict="stamps", stamp_us=per_node_us, **quoted)


@dataclasses.dataclass(frozen=True)
class SeriesPoint:
    """One timed point of a series: its label (``batch 4``), its work (only "more" matters)
    and its Measurement (None: not timed, left out)."""

    label: str
    work: float
    measurement: Measurement | None


@dataclasses.dataclass(frozen=True)
class NeighbourDisagreement:
    """A point of ``series`` whose 95 % interval lies wholly above that of ``other``, which
    does strictly more work, beyond the tolerance (:func:`neighbour_disagreements`)."""

    series: str
    point: str
    point_ms: float
    point_ci_ms: tuple[float, float]
    point_n: int
    other: str
    other_ms: float
    other_ci_ms: tuple[float, float]
    other_n: int

    def note(self) -> str:
        return (
            f"{self.series} DISAGREES across its points: {self.point} read "
            f"{_ms(self.point_ms)} {_ci(self.point_ci_ms)}, n={self.point_n}, above "
            f"{self.other}'s {_ms(self.other_ms)} {_ci(self.other_ci_ms)}, n={self.other_n}, "
            f"which does more work ({_x(self.point_ms / self.other_ms)}, beyond both "
            "intervals): more work does not take less time, so a warm-up, a first call or the "
            f"machine's load moved one of them; {self.point} is marked rough: time again with "
            "a larger budget_s or on a quieter machine"
        )


def neighbour_disagreements(
    series: str, points: Iterable[SeriesPoint], tolerance: float = AGREEMENT_TOLERANCE
) -> list[NeighbourDisagreement]:
    """Every point of ``points`` (one series, named ``series`` in the notes) whose interval's
    lower bound lies above ``1 + tolerance`` times the upper bound of a point with strictly
    more work, each against the point it lies furthest above; in the order given."""
    timed = [
        p for p in points if p.measurement is not None and math.isfinite(p.measurement.median_ms)
    ]
    out = []
    for p in timed:
        low = _bounds(p.measurement)[0]
        above = [
            (_bounds(q.measurement)[1], i)
            for i, q in enumerate(timed)
            if q.work > p.work and low > _bounds(q.measurement)[1] * (1.0 + tolerance)
        ]
        if not above:
            continue
        q = timed[min(above)[1]]
        m, o = p.measurement, q.measurement
        out.append(
            NeighbourDisagreement(
                series, p.label, m.median_ms, m.median_ci_ms, m.n,
                q.label, o.median_ms, o.median_ci_ms, o.n,
            )
        )  # fmt: skip
    return out


@dataclasses.dataclass(frozen=True)
class RatioAgreement:
    """A comparison's ratio (``figure`` of ``name`` to ``baseline``: the quotient of the
    medians) against its rounds' paired ratios (``paired``, their trimmed centre, with its 95 %
    interval ``paired_ci``, from ``rounds`` rounds): :func:`judge_ratio`."""

    figure: str
    name: str
    baseline: str
    ratio: float
    paired: float
    paired_ci: tuple[float, float]
    rounds: int
    agree: bool

    def note(self) -> str:
        lo, hi = self.paired_ci
        ci = f"interval {lo:.3f}-{hi:.3f}" if math.isfinite(lo) else "no interval"
        return (
            f"{self.figure} of {self.name} DISAGREES with its rounds: the ratio of the medians, "
            f"{self.ratio:.3f}, lies outside the per-round ratios to {self.baseline} "
            f"({self.paired:.3f}, 95 % {ci}, {self.rounds} rounds), "
            f"{abs(self.ratio / self.paired - 1.0):.0%} from their centre: its time moved "
            "between rounds (the machine's load in a share of them), so no one figure stands "
            "for the ratio; it is marked rough and no rank is taken from it: time "
            "again with a larger budget_s or on a quieter machine"
        )


def judge_ratio(
    figure: str,
    name: str,
    baseline: str,
    m: Measurement,
    base: Measurement,
    tolerance: float = AGREEMENT_TOLERANCE,
) -> RatioAgreement:
    """``median(m) / median(base)`` against the per-round ratios of their block medians
    in the rounds both took (``stats.paired_block_medians``; ``stats.paired_ratio`` at
    ``m.confidence``): it disagrees when it lies outside that interval (a single round: its
    ratio) and further than ``tolerance`` from its centre.
    Nothing to judge (a median not positive, no round in common) agrees."""
    ratio = m.median_ms / base.median_ms if base.median_ms > 0 else math.nan
    num, den = paired_block_medians(m.samples_ms, m.blocks, base.samples_ms, base.blocks)
    judged = math.isfinite(ratio) and ratio > 0 and num.size > 0
    if not judged or (num <= 0).any() or (den <= 0).any():
        return RatioAgreement(figure, name, baseline, ratio, ratio, (ratio, ratio), 0, True)
    paired, lo, hi = paired_ratio(num, den, m.confidence)
    low, high = (lo, hi) if math.isfinite(lo) else (paired, paired)
    outside = ratio < low or ratio > high
    far = abs(math.log(ratio / paired)) > math.log1p(tolerance)
    return RatioAgreement(
        figure, name, baseline, ratio, paired, (lo, hi), int(num.size), not (outside and far)
    )
