"""The timing recipe in one place: option checks, warm-up, and the adaptive stop.

Warm-up (``warmup=None``) runs a callable at least ``WARMUP_MIN_ITERS`` times AND for at least
``warmup_s`` seconds after its first call, synchronising after each call (lazy initialisation, cuDNN
autotuning, GPU clocks). ``WARMED`` remembers the input signatures already warmed per callable: a
known one gets ``REWARM_ITERS`` calls and ``min(warmup_s, REWARM_S)`` seconds, a new shape the full
warm-up. ``warmup=<int>`` runs exactly that many calls.

Sampling (``collect``) takes *blocks* of back-to-back calls of about ``BLOCK_S`` seconds (at most
``MAX_BLOCK`` calls; one synchronize per block on CUDA; ``budget_s / min_blocks`` when shorter).
``repeat=<int>`` takes exactly that many samples; otherwise blocks come until the block-aware 95 %
interval of the median (``modelprof.timing.stats``) is within ``±precision``, after ``min_samples``
samples in ``min_blocks`` blocks ("precision"), within ``budget_s`` of sampling (warm-up and
compilation not included, "budget") and ``max_samples``. From ``SPREAD_MIN_BLOCKS`` blocks on (fewer
give too rough an estimate), sampling stops early ("spread") when the precision would take more than
``SPREAD_MARGIN`` times the budget (``needed_s``, an estimate that errs on the short side; the
margin absorbs its noise). A budget that ends below ``min_samples`` is extended by at most
``FLOOR_EXTEND_S`` seconds (per candidate; ``hold_floor``); what is still short is ``undersampled``
on the Measurement. ``collect_interleaved`` measures several callables in rounds of one block each,
in a shuffled order per round.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch

from modelprof.errors import ModelProfError, check_int
from modelprof.runtime.agree import decisions
from modelprof.runtime.tensors import iter_tensors
from modelprof.timing.stats import (
    between_block_ci,
    block_medians,
    combined_ci,
    paired_block_medians,
    paired_ratio,
    t_quantile,
    within_ci,
)

__all__ = [
    "BLOCK_S",
    "BlockLog",
    "DEFAULT_MIN_BLOCKS",
    "MAX_BLOCK",
    "Sampled",
    "block_size",
    "collect_interleaved",
    "relative_ci",
    "DEFAULT_BUDGET_S",
    "DEFAULT_MAX_SAMPLES",
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_PRECISION",
    "REWARM_ITERS",
    "REWARM_S",
    "StopRule",
    "WARMED",
    "WARMUP_MIN_ITERS",
    "WARMUP_S",
    "WarmRegistry",
    "WarmupPolicy",
    "collect",
    "extend",
    "FLOOR_EXTEND_S",
    "SPREAD_MARGIN",
    "SPREAD_MIN_BLOCKS",
    "hold_floor",
    "needed_s",
    "input_signature",
    "warm_up",
]

WARMUP_MIN_ITERS = 3
WARMUP_S = 0.5
REWARM_ITERS = 1
REWARM_S = 0.1
DEFAULT_PRECISION = 0.01
DEFAULT_BUDGET_S = 5.0
DEFAULT_MIN_SAMPLES = 10
DEFAULT_MAX_SAMPLES = 100_000
DEFAULT_MIN_BLOCKS = 6
BLOCK_S = 0.1
MAX_BLOCK = 1000
FLOOR_EXTEND_S = 30.0
SPREAD_MARGIN = 2.0
SPREAD_MIN_BLOCKS = 8
#: The degrees of freedom beyond which the t quantile is taken as constant (``needed_s``).
_T_DF_CAP = 1000


def _number(value: Any) -> bool:
    """An int or a float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    """A finite int or float."""
    return _number(value) and math.isfinite(value)


def check_seconds(name: str, value: Any, allow_zero: bool, what_zero: str = "") -> float:
    """``value`` as seconds, or a ModelProfError naming it (``what_zero``: what 0 means)."""
    if not _real(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "" if _number(value) else f" (an int or a float, not {type(value).__name__})"
        raise ModelProfError(  # "finite": nan and inf are floats, and refused too
            f"{name}={value!r} must be a finite number of seconds "
            f"{'>= 0' if allow_zero else '> 0'}"
            + (f" (0: {what_zero})" if what_zero else "")
            + kind
        )
    return float(value)


@dataclasses.dataclass(frozen=True)
class WarmupPolicy:
    """``count`` exact warm-up calls, or ``None`` for the automatic count-and-time rule."""

    count: int | None = None
    seconds: float = WARMUP_S

    @classmethod
    def parse(cls, warmup: int | None, warmup_s: float) -> WarmupPolicy:
        count = None if warmup is None else check_int("warmup", warmup, 0)
        return cls(count, check_seconds("warmup_s", warmup_s, allow_zero=True))

    def plan(self, already_warm: bool) -> tuple[int, float, int | None]:
        """(minimum calls, minimum seconds, exact count or None)."""
        if self.count is not None:
            return self.count, 0.0, self.count
        if already_warm:
            return REWARM_ITERS, min(self.seconds, REWARM_S), None
        return WARMUP_MIN_ITERS, self.seconds, None


@dataclasses.dataclass(frozen=True)
class StopRule:
    """When sampling ends: ``repeat`` exact samples, or adaptive (precision within budget)."""

    repeat: int | None = None
    precision: float = DEFAULT_PRECISION
    budget_s: float = DEFAULT_BUDGET_S
    min_samples: int = DEFAULT_MIN_SAMPLES
    max_samples: int = DEFAULT_MAX_SAMPLES
    confidence: float = 0.95
    min_blocks: int = DEFAULT_MIN_BLOCKS
    #: the cap of the extension to ``min_samples``; 0: never; None: ``FLOOR_EXTEND_S``
    floor_extend_s: float | None = None

    @property
    def floor_cap_s(self) -> float:
        return FLOOR_EXTEND_S if self.floor_extend_s is None else self.floor_extend_s

    @property
    def promised_min(self) -> int | None:
        """The count below which a Measurement is ``undersampled`` (None with ``repeat``)."""
        return None if self.repeat is not None else self.min_samples

    @classmethod
    def parse(
        cls,
        repeat: int | None = None,
        precision: float = DEFAULT_PRECISION,
        budget_s: float = DEFAULT_BUDGET_S,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        min_blocks: int = DEFAULT_MIN_BLOCKS,
        floor_extend_s: float | None = None,
    ) -> StopRule:
        rep = None if repeat is None else check_int("repeat", repeat, 1)
        if not (_real(precision) and 0 < precision < 1):
            raise ModelProfError(
                f"precision={precision!r} must be a relative half-width in "
                "(0, 1), e.g. 0.01 for a median within ±1 %"
            )
        budget = check_seconds("budget_s", budget_s, allow_zero=False)
        lo = check_int("min_samples", min_samples, 1)
        hi = check_int("max_samples", max_samples, 1)
        if hi < lo:
            raise ModelProfError(f"max_samples={hi} is below min_samples={lo}")
        blocks = check_int("min_blocks", min_blocks, 1)
        floor = floor_extend_s
        if floor is not None:
            zero = "never sample past the budget for min_samples"
            floor = check_seconds("floor_extend_s", floor, True, zero)
        return cls(rep, float(precision), budget, lo, hi, 0.95, blocks, floor)


@dataclasses.dataclass
class Sampled:
    """What sampling produced: samples (ms) with their block and start time, and why it ended."""

    samples_ms: np.ndarray
    blocks: np.ndarray
    timestamps_s: np.ndarray
    stop_reason: str
    wall_s: float
    #: seconds sampled past the budget for ``min_samples``, and that extension's cap (None: none)
    extended_s: float = 0.0
    floor_cap_s: float | None = None
    #: after a budget or spread stop, the estimated seconds the precision would take in all
    needed_s: float | None = None
    #: on the CPU, what other work took of the cores while these samples were taken
    competing_cores: float | None = None
    #: and how far a short window's ticks can move that reading (``MachineShare.margin``)
    competing_cores_margin: float = 0.0
    #: on CUDA, the GPU's SM clock (MHz) read after each block, in the order they were taken
    sm_clock_mhz: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.samples_ms.size)

    def fields(self, rule: StopRule) -> dict[str, Any]:
        """The keywords every Measurement of these samples shares."""
        return dict(
            stop_reason=self.stop_reason,
            precision=None if rule.repeat is not None else rule.precision,
            min_samples=rule.promised_min,
            blocks=self.blocks,
            timestamps_s=self.timestamps_s,
            extended_s=self.extended_s,
            floor_cap_s=self.floor_cap_s,
            needed_s=self.needed_s,
            competing_cores=self.competing_cores,
            competing_cores_margin=self.competing_cores_margin,
            sm_clock_mhz=self.sm_clock_mhz,
        )


class BlockLog:
    """Samples as they arrive, one block at a time, with the block's start on the host clock."""

    def __init__(self, origin: float, wall_ms: float | None = None) -> None:
        self.origin = origin
        self._samples: list[np.ndarray] = []
        self._blocks: list[np.ndarray] = []
        self._times: list[np.ndarray] = []
        self.n = 0
        self.n_blocks = 0
        self.wall_ms = wall_ms  # wall time per sample, overheads included
        self.needed_s: float | None = None  # the last estimate of the precision's time

    def add(self, got: np.ndarray, started: float, ended: float, block: int | None = None) -> None:
        got = np.asarray(got, dtype=np.float64).reshape(-1)
        if got.size == 0:
            return
        b = self.n_blocks if block is None else block
        self._samples.append(got)
        self._blocks.append(np.full(got.size, b, dtype=np.int64))
        offsets = np.concatenate(([0.0], np.cumsum(got[:-1]) / 1e3))
        self._times.append(started - self.origin + offsets)
        self.n += got.size
        self.n_blocks += 1
        self.wall_ms = max((ended - started) * 1e3 / got.size, float(np.median(got)), 1e-6)

    @classmethod
    def resume(cls, sampled: Sampled, origin: float) -> BlockLog:
        """A log holding what ``sampled`` holds, its next block numbered after theirs."""
        log = cls(origin)
        if sampled.n:
            log._samples, log._blocks = [sampled.samples_ms], [sampled.blocks]
            log._times = [sampled.timestamps_s]
            log.n, log.n_blocks = sampled.n, int(sampled.blocks.max()) + 1
        return log

    def samples(self) -> np.ndarray:
        return np.concatenate(self._samples) if self._samples else np.empty(0)

    def blocks(self) -> np.ndarray:
        return np.concatenate(self._blocks) if self._blocks else np.empty(0, dtype=np.int64)

    def times(self) -> np.ndarray:
        return np.concatenate(self._times) if self._times else np.empty(0)

    def relative_ci(self, confidence: float) -> float:
        """Half-width of the block-aware interval of the median, over the median."""
        return relative_ci(self.samples(), self.blocks(), confidence)

    def result(self, reason: str, wall_s: float) -> Sampled:
        return Sampled(
            self.samples(), self.blocks(), self.times(), reason, wall_s, needed_s=self.needed_s
        )


def relative_ci(
    samples: np.ndarray, blocks: np.ndarray | None = None, confidence: float = 0.95
) -> float:
    """Half-width of the median's block-aware interval over the median (``inf`` for median 0)."""
    s = np.sort(samples)
    med = float(np.median(s))
    if med <= 0:
        return math.inf
    between, n_blocks = None, 0
    if blocks is not None:
        medians = block_medians(samples, blocks)[1]
        between, n_blocks = between_block_ci(med, medians, confidence), medians.size
    span = (float(s[0]), float(s[-1]))
    lo, hi = combined_ci(med, within_ci(s, confidence), between, span, n_blocks, confidence)
    return (hi - lo) / 2.0 / med


def block_size(wall_ms: float | None, block_s: float = BLOCK_S) -> int:
    """Samples in one block: about ``block_s`` of wall time, at least 1, at most ``MAX_BLOCK``."""
    if wall_ms is None or wall_ms <= 0:
        return 1
    return max(1, min(MAX_BLOCK, int(block_s * 1e3 / wall_ms + 1e-6)))


def run_blocks(plan: Callable[[int], Any], take: Callable[[Any], Any]) -> int:
    """The one sampling loop: ``plan(blocks taken so far)`` says what to take next (None: stop),
    ``take(it)`` takes it. Returns the number of blocks taken."""
    i = 0
    while (block := plan(i)) is not None:
        take(block)
        i += 1
    return i


def _block(rule: StopRule, log: BlockLog, first: bool) -> int:
    """A candidate's next block before the budget (0 or less: it has its ``repeat`` or
    ``max_samples``). With ``repeat=N``, at most ``ceil(N / min_blocks)`` samples (an interval
    needs 2 blocks). Else a small ``first`` block: the warm-up's estimate may miss what a sample
    costs besides the call (a cache flush, the hooks), and a whole block sized on it could
    overshoot the budget. A budget too short for ``min_blocks`` blocks of ``BLOCK_S`` gets
    shorter blocks (``budget_s / min_blocks``): two blocks' interval spans decades."""
    k = block_size(log.wall_ms, min(BLOCK_S, rule.budget_s / rule.min_blocks))
    if rule.repeat is not None:
        return min(k, max(1, math.ceil(rule.repeat / max(2, rule.min_blocks))), rule.repeat - log.n)
    if first:
        k = min(k, max(1, math.ceil(rule.min_samples / rule.min_blocks)))
    return min(k, rule.max_samples - log.n)


def collect(
    sample_block: Callable[[int], np.ndarray],
    rule: StopRule,
    est_ms: float | None = None,
    now: Callable[[], float] = time.perf_counter,
    on_block: Callable[[int, float], None] | None = None,
) -> Sampled:
    """Call ``sample_block(k)`` (``k`` samples back to back, their ms) block after block until
    ``rule`` says stop; ``on_block(samples, seconds so far)`` after each block (a progress bar).
    Under a process group (``modelprof.runtime.agree``) every rank takes the same blocks and
    stops when any rank's budget or count says so or every rank has its precision."""
    t0 = now()
    log = BlockLog(t0, est_ms)
    agree = decisions()
    reason: str | None = None

    def plan(i: int) -> int | None:
        nonlocal reason
        if i == 0:
            return agree.size(_next_block(rule, log, t0, now))
        k, reason, log.needed_s = _after_block(log, rule, t0, now, agree)
        return None if reason else k

    run_blocks(plan, lambda k: _take(sample_block, k, log, now, on_block))
    return log.result(reason, now() - t0)


def _after_block(
    log: BlockLog, rule: StopRule, t0: float, now: Callable[[], float], agree: Any
) -> tuple[int, str | None, float | None]:
    """``collect``'s agreed decision after a block: (next size, stop reason, ``needed_s``)."""
    if rule.repeat is not None:
        left = rule.repeat - log.n
        k, _ = agree.block(_next_block(rule, log, t0, now), False, left <= 0)
        return k, "repeat" if left <= 0 else None, None
    full, rel = log.n >= rule.max_samples, math.nan
    if log.n >= rule.min_samples and log.n_blocks >= rule.min_blocks:
        rel = log.relative_ci(rule.confidence)
    precise = rel <= rule.precision  # False before the floor (NaN)
    need = None if precise or full else needed_s(log, rule, rel, now() - t0)
    spread = (
        need is not None
        and log.n_blocks >= SPREAD_MIN_BLOCKS
        and need > SPREAD_MARGIN * rule.budget_s
    )
    want = _next_block(rule, log, t0, now)
    late = (now() - t0) * 1e3 + (log.wall_ms or 0.0) > rule.budget_s * 1e3  # the next block
    k, stop = agree.block(want, precise, full or spread or late)
    return k, _stop_reason(precise, full, spread) if stop else None, need


def _next_block(rule: StopRule, log: BlockLog, t0: float, now: Callable[[], float]) -> int:
    """The next block's size as this rank wants it: ``_block``, and without ``repeat`` what fits
    the budget (one sample first without an estimate: it may be slow)."""
    k = _block(rule, log, first=not log.n_blocks)
    if rule.repeat is None:
        k = min(k, _fit((rule.budget_s - (now() - t0)) * 1e3, log.wall_ms))
    return max(1, k)


def _take(
    sample_block: Callable[[int], np.ndarray],
    k: int,
    log: BlockLog,
    now: Callable[[], float],
    on_block: Callable[[int, float], None] | None = None,
    block: int | None = None,
) -> None:
    """One block of ``k`` samples (numbered ``block``), logged with its start and end; reported
    to ``on_block``."""
    t = now()
    got = sample_block(k)
    t_end = now()
    log.add(got, t, t_end, block)
    if on_block is not None:
        on_block(log.n, t_end - log.origin)


def needed_s(log: BlockLog, rule: StopRule, rel: float, elapsed_s: float) -> float | None:
    """Seconds of sampling the precision would take in all, from ``rel`` after ``elapsed_s``: the
    half-width shrinks as ``t(B - 1) / sqrt(B)``, so ``B' = B (rel / precision)^2 (t(B' - 1) /
    t(B - 1))^2`` blocks (fixed-point steps) at the time a block took so far. None without an
    interval, or where the robust interval is within the precision (no projection to make)."""
    b = log.n_blocks
    if not (math.isfinite(rel) and rel > 0 and b >= 2 and elapsed_s > 0):
        return None
    if rel <= rule.precision:
        return elapsed_s
    samples, blocks = log.samples(), log.blocks()
    first = blocks == blocks[0]
    if b >= 3 and first.sum() < (blocks == blocks[-1]).sum():
        # a small first block (``_block``) is noisier than the rest: project without it
        samples, blocks, b = samples[~first], blocks[~first], b - 1
        rel = relative_ci(samples, blocks, rule.confidence)
    # a few blocks hit by a passing load would make it pessimistic: the robust one, if smaller
    rel = min(rel, _robust_relative_ci(samples, blocks, rule.confidence))
    if not (math.isfinite(rel) and rel > 0) or rel <= rule.precision:
        # within the precision robustly, not by the stop rule: no time to project (the time
        # so far, the budget, is no estimate of what the rule's precision would take)
        return None
    q = 0.5 + rule.confidence / 2.0
    scale = (rel / rule.precision) ** 2
    t_now = t_quantile(q, b - 1)
    blocks = b * scale
    for _ in range(4):
        df = int(min(_T_DF_CAP, max(1.0, math.ceil(blocks) - 1)))
        blocks = b * scale * (t_quantile(q, df) / t_now) ** 2
    return elapsed_s * max(blocks, b) / b


def _robust_relative_ci(samples: np.ndarray, blocks: np.ndarray, confidence: float) -> float:
    """``relative_ci`` with 1.4826 x the MAD of the log block medians for their std."""
    rel = relative_ci(samples, None, confidence)
    if not math.isfinite(rel):
        return rel
    logs = np.log(block_medians(samples, blocks)[1])
    b = logs.size
    if b < 2 or not np.isfinite(logs).all():
        return rel
    mad = 1.4826 * float(np.median(np.abs(logs - np.median(logs))))
    half = t_quantile(0.5 + confidence / 2.0, b - 1) * mad / math.sqrt(b)
    return max(rel, math.sinh(half))


def _stop_reason(precise: bool, full: bool, spread: bool) -> str:
    if precise:
        return "precision"
    return "max_samples" if full else "spread" if spread else "budget"


def collect_interleaved(
    samplers: Sequence[Callable[[int], np.ndarray]],
    rule: StopRule,
    est_ms: Sequence[float | None],
    rng: np.random.Generator | None = None,
    now: Callable[[], float] = time.perf_counter,
    on_round: Callable[[int, float], None] | None = None,
    on_floor: Callable[[int, float, float], None] | None = None,
) -> list[Sampled]:
    """Sample several callables in rounds of one block each, in a freshly shuffled order, so
    the machine's drift reaches all alike; block ``r`` of every candidate is round ``r``.

    Stops when every candidate's own interval and its paired ratio to the first are within
    ``precision`` (after ``min_samples`` in ``min_blocks``), on "spread", or at ``budget_s`` per
    candidate or ``max_samples``. Then the sample floor: while a candidate is below
    ``min_samples``, more rounds of about one run of the slowest short one, none ending past
    ``floor_cap_s`` per candidate. ``on_round(fewest samples, seconds so far)`` after each
    round (of the floor's, once it began); ``on_floor(fewest samples, seconds ahead, cap)``
    once as the floor begins (the runs still wanting at each one's wall time a sample, within
    the cap: an estimate, the cap the bound). Every rank of a process group takes the same
    rounds.
    """
    m = len(samplers)
    if m == 0:
        return []
    agree = decisions()
    rng = agree.shared_rng(rng if rng is not None else np.random.default_rng())
    t0 = now()
    logs = [BlockLog(t0, est) for est in est_ms]
    reason: str | None = None
    round_s = 0.0
    need, cap = rule.promised_min, rule.floor_cap_s * m
    floor: list[float] = []  # once stopped: the round the floor's began at, and their start

    def plan(r: int) -> tuple[int, list[int]] | None:
        nonlocal reason
        if r and not floor:
            elapsed = now() - t0
            spread = _rounds_spread(logs, rule, r, elapsed, rule.budget_s * m)
            late = elapsed + round_s > rule.budget_s * m
            reason = _round_stop(logs, rule, r, late, agree, spread)
            if reason is not None:
                if need is None:
                    return None
                floor[:] = [r, now()]
        if not floor:
            return r, [_block(rule, log, first=not r) for log in logs]
        ks = _floor_block(logs, need, rule.max_samples)
        next_s = sum(k * (log.wall_ms or 0.0) for k, log in zip(ks, logs)) / 1e3
        if on_floor is not None and r == floor[0] and ks and 0 < next_s <= cap:
            # as the floor begins (not where its first round would not fit: none runs)
            wanting = sum(max(0, need - log.n) * (log.wall_ms or 0.0) for log in logs)
            on_floor(min(log.n for log in logs), min(cap, wanting / 1e3), cap)
        fits = bool(ks) and (now() - floor[1]) + next_s <= cap
        return (r, ks) if agree.every(fits) else None

    def take(round_: tuple[int, list[int]]) -> None:
        nonlocal round_s
        round_s = _run_round(samplers, logs, round_[1], round_[0], rng, now)
        if on_round is not None:
            on_round(min(log.n for log in logs), now() - (floor[1] if floor else t0))

    r = run_blocks(plan, take)
    extended = now() - floor[1] if floor and r > floor[0] else 0.0
    return [
        dataclasses.replace(
            log.result(reason, now() - t0),
            extended_s=extended,
            floor_cap_s=cap if extended > 0 else None,
        )
        for log in logs
    ]


def _run_round(
    samplers: Sequence[Callable[[int], np.ndarray]],
    logs: Sequence[BlockLog],
    ks: list[int],
    r: int,
    rng: np.random.Generator,
    now: Callable[[], float] = time.perf_counter,
) -> float:
    """Round ``r``: ``ks[i]`` samples of candidate ``i`` as its block ``r``; returns its seconds."""
    ks = decisions().least(ks)
    start = now()
    for i in rng.permutation(len(samplers)):
        if ks[i] > 0:
            _take(samplers[i], ks[i], logs[i], now, block=r)
    return now() - start


def _floor_block(logs: Sequence[BlockLog], need: int, cap: int) -> list[int]:
    """Each candidate's block in a floor round (empty when none is short)."""
    short = [log.wall_ms or 0.0 for log in logs if log.n < need]
    if not short:
        return []
    slow_ms = max(short)
    return [
        max(0, min(cap - log.n, max(1, min(block_size(log.wall_ms), _fit(slow_ms, log.wall_ms)))))
        for log in logs
    ]


def _fit(total_ms: float, each_ms: float | None) -> int:
    """How many runs of ``each_ms`` fit in ``total_ms`` (1 without an estimate)."""
    return int(total_ms / each_ms) if each_ms else 1


def _round_stop(
    logs: Sequence[BlockLog],
    rule: StopRule,
    r: int,
    late: bool,
    agree: Any,
    spread: bool = False,
) -> str | None:
    """Why the interleaved rounds stop after round ``r`` (None: go on), agreed across ranks."""
    if rule.repeat is not None:
        return "repeat" if all(log.n >= rule.repeat for log in logs) else None
    precise, stop = agree.flags(_rounds_precise(logs, rule, r), late or spread)
    full = all(log.n >= rule.max_samples for log in logs)
    if not (precise or full or stop):
        return None
    return _stop_reason(precise, full, spread and not late)


def _rounds_spread(
    logs: Sequence[BlockLog], rule: StopRule, r: int, elapsed_s: float, budget_s: float
) -> bool:
    """Some candidate's ``needed_s`` (kept on its log) is over ``SPREAD_MARGIN`` budgets."""
    if r < max(rule.min_blocks, SPREAD_MIN_BLOCKS) or any(log.n < rule.min_samples for log in logs):
        return False
    worst = 0.0
    for log in logs:
        rel = log.relative_ci(rule.confidence)
        log.needed_s = None if rel <= rule.precision else needed_s(log, rule, rel, elapsed_s)
        worst = max(worst, log.needed_s or 0.0)
    return worst > SPREAD_MARGIN * budget_s


def _rounds_precise(logs: Sequence[BlockLog], rule: StopRule, r: int) -> bool:
    """Every candidate has its samples, blocks and interval, and its ratio to the first."""
    if not (all(log.n >= rule.min_samples for log in logs) and r >= rule.min_blocks):
        return False
    if not all(log.relative_ci(rule.confidence) <= rule.precision for log in logs):
        return False
    base = logs[0]
    for log in logs[1:]:  # over the rounds both took: one at its max_samples takes no more
        med, base_med = paired_block_medians(
            log.samples(), log.blocks(), base.samples(), base.blocks()
        )
        ratio, lo, hi = paired_ratio(med, base_med, rule.confidence)
        if not (math.isfinite(lo) and (hi - lo) / 2.0 / ratio <= rule.precision):
            return False
    return True


def extend(
    sample_block: Callable[[int], np.ndarray],
    sampled: Sampled,
    need: int,
    cap_s: float,
    now: Callable[[], float] = time.perf_counter,
    on_block: Callable[[int, float], None] | None = None,
) -> tuple[Sampled, float]:
    """Continue ``sampled`` to ``need`` samples, one per block, none that the median sample says
    would end past ``cap_s`` seconds (on every rank alike). Returns the merged :class:`Sampled`
    (its stop reason kept) and the seconds it took."""
    t0 = now()
    log = BlockLog.resume(sampled, t0 - sampled.wall_s)  # stamps go on from the sampling's
    est_s = float(np.median(sampled.samples_ms)) / 1e3 if sampled.n else 0.0
    agree = decisions()

    def plan(_: int) -> int | None:
        return 1 if agree.every(log.n < need and now() - t0 + est_s <= cap_s) else None

    run_blocks(plan, lambda k: _take(sample_block, k, log, now, on_block))
    spent = now() - t0
    return log.result(sampled.stop_reason, sampled.wall_s + spent), spent


def hold_floor(
    sample_block: Callable[[int], np.ndarray],
    sampled: Sampled,
    rule: StopRule,
    cap_s: float | None = None,
    now: Callable[[], float] = time.perf_counter,
    on_block: Callable[[int, float], None] | None = None,
) -> Sampled:
    """The sample floor: ``extend`` a sampling below ``rule.min_samples`` by at most ``cap_s``
    seconds (``rule.floor_cap_s``), recorded as ``extended_s``/``floor_cap_s``."""
    need = rule.promised_min
    cap = rule.floor_cap_s if cap_s is None else float(cap_s)
    if need is None or sampled.n >= need or cap <= 0:
        return sampled
    merged, spent = extend(sample_block, sampled, need, cap, now, on_block)
    return dataclasses.replace(merged, extended_s=sampled.extended_s + spent, floor_cap_s=cap)


def warm_up(
    step: Callable[[], Any],
    policy: WarmupPolicy,
    already_warm: bool,
    sync: Callable[[], None] = lambda: None,
    now: Callable[[], float] = time.perf_counter,
) -> tuple[int, float | None]:
    """Run ``step`` per ``policy``, synchronising after each call (untimed, so it may); the
    time rule counts from the end of the first call, whose one-off set-up (``measure_latency``'s
    watch of the first writes, lazy initialisation) warms no model.
    Returns (calls made, median wall ms of a call or None: it sizes the blocks)."""
    min_calls, min_s, exact = policy.plan(already_warm)
    walls: list[float] = []
    t_start = math.inf  # the end of the first call
    agree = decisions()  # warm until every rank is warm

    def plan(i: int) -> int | None:
        if exact is not None:
            return 1 if i < exact else None
        return 1 if agree.any(i < min_calls or now() - t_start < min_s) else None

    def take(_: int) -> None:
        nonlocal t_start
        t = now()
        step()
        sync()
        end = now()
        walls.append((end - t) * 1e3)
        t_start = min(t_start, end)

    run_blocks(plan, take)
    return len(walls), (float(np.median(walls)) if walls else None)


def input_signature(args: Any, kwargs: Any = None, **flags: Any) -> tuple[Hashable, ...]:
    """What makes a warm-up specific: shape, dtype, device, layout of every tensor, and flags."""
    tensors = tuple(
        (
            tuple(t.shape),
            str(t.dtype),
            str(t.device),
            t.is_contiguous(),
            t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last),
        )
        for t in iter_tensors((args, kwargs))
    )
    return tensors + tuple(sorted((k, repr(v)) for k, v in flags.items()))


class WarmRegistry:
    """Per callable (weakly held), the input signatures already warmed up."""

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, set] = weakref.WeakKeyDictionary()
        self._by_id: dict[int, set] = {}

    def _slot(self, fn: Any) -> tuple[set, Any]:
        owner, extra = fn, None
        if inspect.ismethod(fn):  # a fresh bound-method object each access: key on its owner
            owner, extra = fn.__self__, fn.__func__
        try:
            return self._weak.setdefault(owner, set()), extra
        except TypeError:
            return self._by_id.setdefault(id(owner), set()), extra

    def seen(self, fn: Any, signature: Hashable) -> bool:
        slot, extra = self._slot(fn)
        return (extra, signature) in slot

    def add(self, fn: Any, signature: Hashable) -> None:
        slot, extra = self._slot(fn)
        slot.add((extra, signature))

    def clear(self) -> None:
        self._weak = weakref.WeakKeyDictionary()
        self._by_id.clear()


#: The process-wide record of warmed-up callables and input signatures.
WARMED = WarmRegistry()
