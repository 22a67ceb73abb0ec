"""``Measurement``: the raw latency samples of one timed callable and statistics derived from them.

Conventions, stated once:

* samples are milliseconds, one per timed call, in the order taken; percentiles use numpy's
  default linear interpolation; ``std_ms`` has ``ddof=1``; ``cv = std_ms / mean_ms``;
* samples come in time-separated ``blocks`` (``timestamps_s``: each sample's start, from the
  first); the interval of the median is the hull of the order-statistic interval of all samples
  and the between-block t interval of the block medians (``modelprof.timing.stats``), so drift
  widens it, cut to the samples' range from six blocks on. Without two blocks (or two samples)
  it is NaN ("n/a") and the run ``undersampled``; without ``blocks`` the samples are
  independent (an interval from two samples on);
* ``stable``: False when the block medians follow a significant trend larger than the interval
  (``drift_pct``: the trend over the window, %); None (never True) without three timed blocks or
  with an interval wider than ±``JUDGE_MAX_RELATIVE_CI``;
* a budget that ends below ``min_samples`` is extended by at most ``FLOOR_EXTEND_S``
  (``extended_s``); a run still short quotes no median (``short_reason``) and warns once;
* ``cpu_ms``: each sample's CPU time over its wall span (``cpu_clock``: ``"thread_time"`` for
  one intra-op thread, ``"process_time"`` for several; the clock reads' own cost taken off,
  ``CpuClock``: one thread's CPU work is at most the sample's wall time, and a busy thread's
  ``wall_over_cpu``, median over median, reads 1); ``cpu`` is that CPU work as a Measurement;
  it stands for the work on a loaded machine (``cpu_holds``) only as the calling thread's (it did
  ``CPU_ONE_THREAD_SHARE`` of the process's CPU time: ``cpu_thread_share``): several
  threads spin while one of them waits for a core, so load stretches their CPU time too;
* ``loaded``: the wall clock over the CPU time above ``LOADED_WALL_OVER_CPU``, or other work
  took ``competing_cores`` (``runtime.env.MachineShare``) of the cores the run needed; a wall
  that high beyond what that other work can stretch (:func:`load_stretch`) is ``waited``
  instead (the caller waited on another thread, a sleep or a device), and its CPU time is not
  the work's; above ``SHARED_CORE_WALL_OVER_CPU`` it can still stretch, a wait explains the wall
  as well (``wait_unclear``): the CPU work is then quoted only on that condition;
  ``competing_cores_margin``: how far ``/proc/stat``'s ticks can move a reading
  over a short window (under ``MIN_SHARE_S``), which counts as load only beyond it;
* ``sm_clock_mhz``: on CUDA, the GPU's SM clock read after each block (``runtime.env``); a clock
  that moved by more than ``CLOCK_MOVED_FRACTION`` between blocks (``clock_moved``) warns once;
* outliers: outside Tukey's fences ``[q1 - 1.5 IQR, q3 + 1.5 IQR]``, counted and kept;
* ``fps = batch_size / (median_ms / 1000)``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from modelprof.errors import (
    DriftWarning,
    FewSamplesWarning,
    GpuClockWarning,
    LoadedMachineWarning,
    NoisyMeasurementWarning,
    warn_user,
)
from modelprof.render.html import html_notebook
from modelprof.timing.stats import (
    between_block_ci,
    block_medians,
    combined_ci,
    drift,
    median_ci_ranks,
    within_ci,
)

__all__ = [
    "Measurement",
    "NOISY_CV",
    "NOISY_IQR_FRACTION",
    "JUDGE_MAX_RELATIVE_CI",
    "CPU_ONE_THREAD_SHARE",
    "LOADED_COMPETING_CORES",
    "LOADED_WALL_OVER_CPU",
    "SHARED_CORE_WALL_OVER_CPU",
    "load_stretch",
    "median_ci_ranks",
    "quieter_machine",
    "unquotable",
]

#: A run is "noisy" when IQR / median exceeds this fraction ...
NOISY_IQR_FRACTION = 0.10
#: ... or when the coefficient of variation (std / mean) exceeds this one.
NOISY_CV = 0.25
#: Above this relative interval (±50 %) a trend cannot be judged against it: ``stable`` is None.
JUDGE_MAX_RELATIVE_CI = 0.5
#: An interval one of whose sides (below, above the median) is this many times the other is
#: printed as its two sides (``-4.44%/+2178.91%``), not as a half-width that fits neither.
LOPSIDED_CI = 1.5
#: Wall over CPU time above this and the machine is "loaded": the work waited for a core.
LOADED_WALL_OVER_CPU = 1.15
#: ... or when other work took at least this many cores' worth of the cores the run needed.
LOADED_COMPETING_CORES = 0.25
#: The SM clock moved when its highest reading over its blocks is this much above its lowest.
CLOCK_MOVED_FRACTION = 0.05
#: A process's CPU time is one thread's work when the calling thread did this share of it.
CPU_ONE_THREAD_SHARE = 0.9
#: The most wall/CPU that sharing cores usually explains, read or not by what the other work can
#: stretch (:func:`load_stretch`, unbounded from a whole core of it on): Linux shares a core
#: fairly, so a thread that waits for nothing but a core runs at least 1/(m + 1) of the time
#: beside m other runnable threads, and 4x needs three of them queued on its core throughout.
#: Above it a sleep, I/O, another thread or a device explains the wall as well as load does
#: (``wait_unclear``): the CPU work stands for the work only if the work waits on nothing else.
SHARED_CORE_WALL_OVER_CPU = 4.0

# the attributes ``to_dict`` and ``stats`` give, in order
_METADATA = (
    "label device batch_size warmup stop_reason precision confidence compile_ms wall_s min_samples "
    "extended_s floor_cap_s needed_s"
).split()
_SPREAD = "n mean_ms std_ms median_ms min_ms max_ms p90_ms p95_ms p99_ms iqr_ms cv".split()
_PARTS = ("h2d", "compute", "d2h")
# what ``cpu``, the CPU work's Measurement, shares with the wall clock's (its blocks aside)
_CPU_SHARED = (
    "device batch_size warmup stop_reason precision confidence timestamps_s min_samples"
).split()
_JUDGED = (
    "median_ci_coverage relative_ci outliers fps noisy n_blocks drift_pct stable undersampled"
).split()


def _percentile(q: float) -> functools.cached_property:
    """The ``q``-th percentile of the samples (ms), computed once (0: the least, 100: the most)."""
    return functools.cached_property(lambda self: float(np.percentile(self._sorted, q)))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


@dataclasses.dataclass(eq=False)
class Measurement:
    """Raw latency samples (ms) of one callable on one device, with lazily derived statistics.

    ``stop_reason``: ``"precision"``, ``"budget"``, ``"spread"`` (the precision would take over
    twice the budget), ``"repeat"`` or ``"max_samples"``; ``needed_s``: after a budget or spread
    stop, the estimated seconds the precision would take. Transfer-inclusive runs carry their
    parts (``h2d``, ``compute``, ``d2h``) as Measurements.
    """

    samples_ms: np.ndarray
    device: str = "cpu"
    batch_size: int = 1
    warmup: int = 0
    stop_reason: str = "repeat"
    precision: float | None = None
    confidence: float = 0.95
    compile_ms: float | None = None
    wall_s: float | None = None
    label: str = ""
    h2d: Measurement | None = None
    compute: Measurement | None = None
    d2h: Measurement | None = None
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    blocks: np.ndarray | None = None
    timestamps_s: np.ndarray | None = None
    min_samples: int | None = None
    cpu_ms: np.ndarray | None = None
    cpu_clock: str | None = None
    competing_cores: float | None = None
    competing_cores_margin: float = 0.0
    cpu_thread_share: float | None = None
    sm_clock_mhz: np.ndarray | None = None
    extended_s: float = 0.0
    floor_cap_s: float | None = None
    needed_s: float | None = None
    _warned: bool = dataclasses.field(default=False, init=False, repr=False)
    _independent: bool = dataclasses.field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.samples_ms = np.asarray(self.samples_ms, dtype=np.float64).reshape(-1)
        if self.samples_ms.size == 0:
            raise ValueError("a Measurement needs at least one sample")
        n = self.samples_ms.size
        if self.blocks is None:  # no block structure known: independent samples
            self.blocks = np.zeros(n, dtype=np.int64)
            self._independent = True
        arrays = {"blocks": np.int64, "timestamps_s": np.float64, "cpu_ms": np.float64}
        for name, dtype in arrays.items():
            if getattr(self, name) is None:
                continue
            v = np.asarray(getattr(self, name), dtype=dtype).reshape(-1)
            if v.size != n:
                raise ValueError(f"{name} has {v.size} entries for {n} samples")
            setattr(self, name, v)
        if self.sm_clock_mhz is not None:  # one reading per block, not per sample
            self.sm_clock_mhz = np.asarray(self.sm_clock_mhz, dtype=np.float64).reshape(-1)

    @functools.cached_property
    def _sorted(self) -> np.ndarray:
        return np.sort(self.samples_ms)

    @property
    def n(self) -> int:
        return int(self.samples_ms.size)

    @functools.cached_property
    def median_ms(self) -> float:
        return float(np.median(self._sorted))

    @functools.cached_property
    def mean_ms(self) -> float:
        return float(self.samples_ms.mean())

    @functools.cached_property
    def std_ms(self) -> float:
        """Sample standard deviation; NaN from one sample (no spread can be stated)."""
        return float(self.samples_ms.std(ddof=1)) if self.n > 1 else math.nan

    @property
    def min_ms(self) -> float:
        return float(self._sorted[0])

    @property
    def max_ms(self) -> float:
        return float(self._sorted[-1])

    p90_ms = _percentile(90)
    p95_ms = _percentile(95)
    p99_ms = _percentile(99)
    q1_ms = _percentile(25)
    q3_ms = _percentile(75)

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms

    @property
    def cv(self) -> float:
        return self.std_ms / self.mean_ms if self.mean_ms > 0 else float("nan")

    @functools.cached_property
    def _block_medians(self) -> tuple[np.ndarray, np.ndarray]:
        return block_medians(self.samples_ms, self.blocks)

    @property
    def n_blocks(self) -> int:
        return int(self._block_medians[0].size)

    @property
    def block_medians_ms(self) -> np.ndarray:
        """Median of each block, in the order the blocks were taken."""
        return self._block_medians[1]

    @functools.cached_property
    def within_ci_ms(self) -> tuple[float, float]:
        """Distribution-free interval of the median as if all samples were independent."""
        return within_ci(self._sorted, self.confidence)

    @functools.cached_property
    def between_ci_ms(self) -> tuple[float, float] | None:
        """``median * exp(± t sd(log block medians) / sqrt(blocks))``; None with one block."""
        return between_block_ci(self.median_ms, self.block_medians_ms, self.confidence)

    @property
    def has_interval(self) -> bool:
        """Two samples in two blocks (or independent ones): one block says nothing of the next."""
        return self.n >= 2 and (self._independent or self.n_blocks >= 2)

    @functools.cached_property
    def median_ci_ms(self) -> tuple[float, float]:
        """``confidence`` interval of the median (module doc); NaNs without an interval."""
        if not self.has_interval:
            return math.nan, math.nan
        span = (self.min_ms, self.max_ms)  # (a loaded machine's blocks: 17 us .. 12.4 s
        # about 14.6 ms, cut to the samples' range from 6 blocks on: stats.combined_ci)
        return combined_ci(
            self.median_ms,
            self.within_ci_ms,
            self.between_ci_ms,
            span,
            self.n_blocks,
            self.confidence,
        )

    @property
    def median_ci_coverage(self) -> float:
        """Coverage of the within-sample part of the interval (>= confidence unless n is tiny)."""
        return median_ci_ranks(self.n, self.confidence)[2]

    @functools.cached_property
    def _drift(self) -> tuple[float | None, bool]:
        """(trend in %, significant); None without three timed blocks at distinct times."""
        if self.timestamps_s is None or self.n_blocks < 3 or (self.block_medians_ms <= 0).any():
            return None, False
        ids = self._block_medians[0]
        times = np.array([float(self.timestamps_s[self.blocks == b].mean()) for b in ids])
        if float(np.ptp(times)) <= 0:
            return None, False
        return drift(times, self.block_medians_ms)

    @property
    def drift_pct(self) -> float | None:
        """The block medians' trend over the window, % of the median; None (not 0) if unknown."""
        return self._drift[0]

    @property
    def stable(self) -> bool | None:
        """False: a significant drift beyond the interval's half-width; None: cannot be judged
        (a large drift inside a still larger interval is no proof of stability)."""
        pct, significant = self._drift
        rel = self.relative_ci
        if pct is not None and significant and math.isfinite(rel) and abs(pct) / 100.0 > rel:
            return False
        # ``not rel <= ...``: a NaN or infinite interval cannot judge a trend either
        if self.n_blocks < 3 or self.timestamps_s is None or not rel <= JUDGE_MAX_RELATIVE_CI:
            return None
        return True

    def _drift_text(self) -> str:
        """``, drift +4.2 %`` for the repr, saying where the trend is within the blocks' own
        scatter (its slope not told from 0): a large figure there is no drift to act on."""
        pct, significant = self._drift
        if pct is None:
            return ""
        return f", drift {pct:+.1f} %" + ("" if significant else " (within the blocks' scatter)")

    @property
    def stability_unknown_reason(self) -> str | None:
        """Why :attr:`stable` is None, in words (None when it is known)."""
        if self.stable is not None:
            return None
        if not self.has_interval:
            return (
                f"no interval from {_plural(self.n, 'sample')} in {_plural(self.n_blocks, 'block')}"
            )
        if self.n_blocks < 3 or self.timestamps_s is None:
            return f"a trend needs 3 timed blocks, this run has {self.n_blocks}"
        return (
            f"its interval (±{self.relative_ci:.0%}) is too wide to judge a trend against "
            f"(limit ±{JUDGE_MAX_RELATIVE_CI:.0%})"
        )

    @property
    def undersampled(self) -> bool:
        """The budget stopped sampling below ``min_samples``, or there is no interval."""
        short = self.min_samples is not None and self.n < self.min_samples
        return not self.has_interval or (self.stop_reason == "budget" and short)

    @property
    def short_reason(self) -> str | None:
        """Why no median of this run is to be quoted (None when one is)."""
        if not self.undersampled:
            return None
        if not self.has_interval:
            return f"no interval from {_plural(self.n, 'run')} in {_plural(self.n_blocks, 'block')}"
        past = (
            f" and {self.extended_s:.3g} s past it (cap {self.floor_cap_s:g} s)"
            if self.floor_cap_s is not None
            else ""
        )
        return (
            f"{_plural(self.n, 'run')} in the time budget{past}, fewer than "
            f"min_samples={self.min_samples}"
        )

    @property
    def stop_text(self) -> str:
        """Why sampling stopped, in words, with the extension past the budget."""
        text = self.stop_reason
        if self.needed_s is not None and self.precision is not None:
            text += f" (±{self.precision:.1%} would take ~{_duration(self.needed_s)} of sampling)"
        if self.extended_s > 0:
            text += (
                f" (+{self.extended_s:.3g} s past the budget for min_samples={self.min_samples})"
            )
        return text

    @property
    def ci_half_width_ms(self) -> float:
        lo, hi = self.median_ci_ms
        return (hi - lo) / 2.0

    @property
    def relative_ci(self) -> float:
        """CI half-width over the median (0.01 = ±1 %); NaN without an interval."""
        if not self.has_interval:
            return math.nan
        return self.ci_half_width_ms / self.median_ms if self.median_ms > 0 else float("inf")

    def relative_ci_text(self, digits: int = 2) -> str:
        """The interval's width over the median as printed: ``±1.00%`` (:attr:`relative_ci`), or
        where one side is over ``LOPSIDED_CI`` times the other (a loaded run's interval, cut to
        the samples' range) its two sides, ``-4.44%/+2178.91%``; ``n/a`` without one."""
        if not self.has_interval:
            return "n/a"
        lo, hi = self.median_ci_ms
        if self.median_ms > 0:
            below, above = (
                (self.median_ms - lo) / self.median_ms,
                (hi - self.median_ms) / self.median_ms,
            )
            if max(below, above) > LOPSIDED_CI * min(below, above):
                return f"-{below:.{digits}%}/+{above:.{digits}%}"
        return f"±{self.relative_ci:.{digits}%}"

    @functools.cached_property
    def cpu(self) -> Measurement | None:
        """The CPU time of the same samples as a Measurement (None when not read)."""
        if self.cpu_ms is None:
            return None
        label = f"{self.label or 'the callable'} CPU work ({self.cpu_clock})"
        shared = {k: getattr(self, k) for k in _CPU_SHARED}
        blocks = None if self._independent else self.blocks
        return Measurement(self.cpu_ms, label=label, blocks=blocks, **shared)

    @property
    def wall_over_cpu(self) -> float:
        """Median wall over median CPU time (NaN when not read): about 1 for one thread on an
        idle core; above it, the work waited for a core."""
        cpu = self.cpu
        if cpu is None or cpu.median_ms <= 0:
            return math.nan
        return self.median_ms / cpu.median_ms

    @property
    def loaded(self) -> bool:
        """The machine was busy (:func:`load_reason`); with several threads, ``wall_over_cpu``
        shows only load that left the process less than one core."""
        return bool(self.load_reason)

    @property
    def cpu_holds(self) -> bool:
        """The CPU work stands for the work on a loaded machine: the calling thread did
        ``CPU_ONE_THREAD_SHARE`` or more of the process's CPU time (``cpu_thread_share``; one
        thread's ``thread_time`` where the share is not read), and did not wait on other work
        (``waited``). Several threads' grows with load too: they spin while one of them waits
        for a core; a callable whose work another thread does leaves the caller's idle."""
        if self.cpu is None or self.waited:
            return False
        share = self.cpu_thread_share
        if share is None:
            return self.cpu_clock == "thread_time"
        return share >= CPU_ONE_THREAD_SHARE

    @property
    def waited(self) -> bool:
        """The calling thread waited on other work than a core's (:func:`waited`), so the CPU
        time is not the work's, and not load."""
        return waited(self.wall_over_cpu, self.competing_cores, self.competing_cores_margin)

    @property
    def wait_unclear(self) -> bool:
        """A wall/CPU above ``SHARED_CORE_WALL_OVER_CPU`` that the other work read could still
        stretch (not ``waited``; from a whole core of it on, any): a sleep, I/O, another thread
        or a device explains it as well, so the CPU work is the work's only where the work
        waits on nothing but a core (a 5 ms sleep beside a core of other work read wall/CPU
        74.62, and was told to quote its 68.71 us of CPU work)."""
        return not self.waited and self.wall_over_cpu > SHARED_CORE_WALL_OVER_CPU

    @property
    def wait_condition(self) -> str:
        """Where ``wait_unclear``, the CPU work's condition, as the warning and notes say it."""
        if not self.wait_unclear:
            return ""
        return (
            " only if the work waits on nothing but a core (no sleep, I/O, other thread or "
            f"device): its wall/CPU {self.wall_over_cpu:.2f} is above the "
            f"{SHARED_CORE_WALL_OVER_CPU:g} that sharing cores usually explains"
        )

    @property
    def load_reason(self) -> str:
        """What showed the load, in words ("" when not ``loaded``)."""
        wall = "wall/CPU {:.2f}: the work waited for a core"
        if self.wait_unclear:
            wall += ", or on other work (a sleep, I/O, another thread, a device)"
        return load_reason(
            self.wall_over_cpu, self.competing_cores, wall, self.competing_cores_margin
        )

    @functools.cached_property
    def outliers(self) -> int:
        """Samples outside Tukey's fences."""
        lo, hi = self.q1_ms - 1.5 * self.iqr_ms, self.q3_ms + 1.5 * self.iqr_ms
        return int(np.count_nonzero((self.samples_ms < lo) | (self.samples_ms > hi)))

    @property
    def fps(self) -> float:
        """Samples per second at the median latency."""
        return self.batch_size / (self.median_ms / 1e3) if self.median_ms > 0 else float("inf")

    @property
    def noisy(self) -> bool:
        """IQR / median above ``NOISY_IQR_FRACTION`` or CV above ``NOISY_CV``."""
        if self.n < 2 or self.median_ms <= 0:
            return False
        return self.iqr_ms / self.median_ms > NOISY_IQR_FRACTION or self.cv > NOISY_CV

    def warn_if_noisy(self) -> bool:
        """Warn once: too few samples, drift, a moved GPU clock, a loaded machine or noise (in
        that order; a drift with a moved clock is a ``GpuClockWarning``); True if it warned."""
        if self._warned:
            return False
        what = f"{self.label or 'the callable'} on {self.device}"
        if self.undersampled and not (self.stop_reason == "repeat" and self.n < 2):
            text, kind = f"timing of {what}: {self._few_samples_text()}", FewSamplesWarning
        elif self.stable is False:
            text, kind = (
                f"timing of {what} drifted by {self.drift_pct:+.1f} % over its "
                f"{self.n_blocks} blocks, beyond its ±{self.relative_ci:.1%} interval; the machine "
                "changed speed while measuring (other load, thermal or frequency changes)",
                DriftWarning,
            )
        elif self.clock_moved:
            text, kind = f"timing of {what}: {self._clock_text()}", GpuClockWarning
        elif self.loaded:
            text, kind = f"timing of {what}: {self._loaded_text()}", LoadedMachineWarning
        elif self.noisy:
            text, kind = (
                f"noisy timing of {what}: "
                f"IQR/median = {self.iqr_ms / self.median_ms:.1%}, CV = {self.cv:.1%} "
                f"(thresholds {NOISY_IQR_FRACTION:.0%}, {NOISY_CV:.0%}); other load on the "
                "machine, frequency scaling or too short a warm-up can cause this",
                NoisyMeasurementWarning,
            )
        else:
            return False
        if self.clock_moved and kind is not GpuClockWarning:
            text += f"; {self._clock_text()}"
            if kind is DriftWarning:  # the clock moving is the drift's cause, read directly
                kind = GpuClockWarning  # (a DriftWarning still)
        if self.loaded and kind is not LoadedMachineWarning:
            text += f"; {self._loaded_text()}"
        self._warned = True
        warn_user(text, kind)
        return True

    @property
    def sm_clock_moved(self) -> float | None:
        """How far the SM clock moved over the blocks: highest / lowest reading - 1 (None: not
        read)."""
        c = self.sm_clock_mhz
        if c is None or c.size == 0 or c.min() <= 0:
            return None
        return float(c.max() / c.min() - 1.0)

    @property
    def clock_moved(self) -> bool:
        """The SM clock moved by more than ``CLOCK_MOVED_FRACTION`` between blocks."""
        moved = self.sm_clock_moved
        return moved is not None and moved > CLOCK_MOVED_FRACTION

    def _clock_text(self) -> str:
        c = self.sm_clock_mhz
        assert c is not None
        return (
            f"the GPU's SM clock read {c.min():.0f} to {c.max():.0f} MHz over "
            f"{_plural(c.size, 'block')} (more than {CLOCK_MOVED_FRACTION:.0%} apart): the GPU "
            "changed speed while measuring (power or thermal limits, or clocks that drop while "
            "it waits on the host); lock the clocks (nvidia-smi --lock-gpu-clocks) or warm up "
            "longer"
        )

    def _loaded_text(self) -> str:
        text = (
            f"the machine was loaded ({self.load_reason}), so the wall median "
            f"{format_ms(self.median_ms)} moved with the machine's load and another run will "
            "read otherwise; "
        )
        if self.cpu_holds and self.wait_unclear:
            return text + (
                f"the CPU work, median {format_ms(self.cpu.median_ms)} ({self.cpu_clock}), is "
                f"the work's{self.wait_condition}; then quote it, which waiting for a core cannot "
                "stretch, else time again on a quieter machine"
            )
        if self.cpu_holds:
            return text + (
                f"quote the CPU work, median {format_ms(self.cpu.median_ms)} ({self.cpu_clock}), "
                "which waiting for a core cannot stretch (the other work can still slow the work "
                "itself), or time again on a quieter machine"
            )
        if self.waited:  # (other work took cores; the caller's own wall is a wait)
            text += "the caller's CPU work is not the work's (it waited on other work); "
        elif self.cpu is not None and self.cpu_clock == "thread_time":  # one thread's clock
            text += (
                f"the calling thread's CPU work, {format_ms(self.cpu.median_ms)} (thread_time), "
                "is a part of the work: other threads of the process did the rest; "
            )
        elif self.cpu is not None:
            text += (
                f"the CPU work, {format_ms(self.cpu.median_ms)} ({self.cpu_clock}), is several "
                "threads', which load stretches too (they spin while one of them waits for a "
                "core); "
            )
        return text + quieter_machine([self])

    def _waited_text(self) -> str:
        """Why the wall is a wait and not load, in words (``waited``)."""
        k, margin = self.competing_cores, self.competing_cores_margin
        ratio = f"wall/CPU {self.wall_over_cpu:.2f}"
        if k is None or k + margin < LOADED_COMPETING_CORES:
            free = "with the cores free"
        else:
            free = (
                f"beyond what other work on {cores_text(k, margin)} cores' worth of the cores "
                f"can stretch (at most {load_stretch(k + margin):.2f})"
            )
        return (
            f"{ratio} {free}: the calling thread waited on other work (another thread, a sleep, "
            "a device)"
        )

    def threads_hint(self) -> str:
        """``torch.set_num_threads(k)`` with k the cores the other work left to torch's threads
        (their count less ``competing_cores``, at least 1: one thread's CPU work is not
        stretched by waiting), where both were read and k is fewer than they are; "" where k
        is not fewer (never the count in use: at 1 thread there is none fewer to ask for); a
        generic ``k`` where the count or the other work was not read."""
        threads, other = self.env.get("torch_num_threads"), self.competing_cores
        if isinstance(threads, int) and threads <= 1:  # no fewer threads to ask for
            return ""
        if not isinstance(threads, int) or other is None or not math.isfinite(other):
            return "torch.set_num_threads(k) for k cores left idle"
        k = max(1, math.floor(threads - other))
        if k >= threads:  # no fewer threads to ask for
            return ""
        return (
            f"torch.set_num_threads({k}): other work took {other:.2f} of the cores its "
            f"{threads} threads need"
        )

    def _few_samples_text(self) -> str:
        samples = _plural(self.n, "sample")
        if not self.has_interval:
            return (
                f"n={samples} in {_plural(self.n_blocks, 'block')}: no interval can be "
                "stated (it is NaN) and stability cannot be judged. Raise budget_s (or repeat=) "
                "for two blocks or more"
            )
        past = (
            f", and {self.extended_s:.3g} s past it (at most {self.floor_cap_s:g} s) did not "
            "reach the floor"
            if self.floor_cap_s is not None
            else ""
        )
        return (
            f"the time budget allowed only n={samples} "
            f"(min_samples={self.min_samples}){past}; no median to quote. Raise budget_s, or "
            "pass repeat= (or a lower min_samples) to ask for fewer runs on purpose"
        )

    @property
    def parts(self) -> dict[str, Measurement]:
        """The transfer-inclusive parts that exist: ``h2d``, ``compute``, ``d2h``."""
        return {k: getattr(self, k) for k in _PARTS if getattr(self, k) is not None}

    def stats(self) -> dict[str, float | int]:
        """The derived statistics, as plain numbers."""
        lo, hi = self.median_ci_ms
        out = {k: getattr(self, k) for k in _SPREAD}
        out.update(median_ci_low_ms=lo, median_ci_high_ms=hi)
        out.update({k: getattr(self, k) for k in _JUDGED})
        if self.cpu is not None:
            out.update(
                cpu_median_ms=self.cpu.median_ms,
                cpu_clock=self.cpu_clock,
                wall_over_cpu=self.wall_over_cpu,
            )
        for k in ("competing_cores", "cpu_thread_share"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.competing_cores_margin:
            out["competing_cores_margin"] = self.competing_cores_margin
        if self.cpu is not None or self.competing_cores is not None:
            out["loaded"] = self.loaded
        if self.sm_clock_moved is not None:
            c = self.sm_clock_mhz
            out.update(sm_clock_min_mhz=float(c.min()), sm_clock_max_mhz=float(c.max()))
        return out

    def to_dict(self, samples: bool = True) -> dict[str, Any]:
        """JSON-serialisable: metadata, statistics, parts, env and (optionally) the raw samples."""
        d: dict[str, Any] = {k: getattr(self, k) for k in _METADATA}
        d.update(self.stats())
        if self.parts:
            d["parts"] = {k: m.to_dict(samples=samples) for k, m in self.parts.items()}
        if self.env:
            d["env"] = self.env
        if samples:
            d["samples_ms"] = self.samples_ms.tolist()
            d["blocks"] = None if self._independent else self.blocks.tolist()
            for k in ("timestamps_s", "cpu_ms", "sm_clock_mhz"):
                if getattr(self, k) is not None:
                    d[k] = getattr(self, k).tolist()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        """Rebuild from ``to_dict()`` output (which must include ``samples_ms``)."""
        if "samples_ms" not in d:
            raise ValueError("from_dict needs the raw samples: use to_dict(samples=True)")
        parts = {k: cls.from_dict(v) for k, v in (d.get("parts") or {}).items()}
        meta = {
            f.name: d[f.name]
            for f in dataclasses.fields(cls)
            if f.init and f.name in d and f.name not in _PARTS
        }
        return cls(**meta, **parts)

    def __repr__(self) -> str:
        lo, hi = self.median_ci_ms
        head = (
            f"Measurement({self.label + ', ' if self.label else ''}{self.device}, "
            f"batch {self.batch_size})"
        )
        ci = (
            f"95% CI {format_ms(lo)}..{format_ms(hi)}, {self.relative_ci_text()}"
            if self.has_interval
            else "95% CI n/a"
        )
        spread = f" ± {format_ms(self.std_ms)}" if self.n > 1 else ""
        quoted = self.short_reason is None or self.stop_reason == "repeat"
        headline = (
            f"  median {format_ms(self.median_ms)} ({ci}), mean {format_ms(self.mean_ms)}{spread}"
            if quoted
            else f"  no median to quote: {self.short_reason} (the runs taken: median "
            f"{format_ms(self.median_ms)}, mean {format_ms(self.mean_ms)})"
        )
        # (no throughput nor CV beside no median to quote: n/a, as its interval)
        cv = f"{self.cv:.1%}" if quoted and math.isfinite(self.cv) else "n/a"
        lines = [
            head,
            headline,
            f"  min {format_ms(self.min_ms)}, p90 {format_ms(self.p90_ms)}, p99 {format_ms(self.p99_ms)}, "
            f"max {format_ms(self.max_ms)}, IQR {format_ms(self.iqr_ms)}, CV {cv}",
            f"  n={self.n} in {_plural(self.n_blocks, 'block')} after "
            f"{self.warmup} warm-up, stop={self.stop_text}, "
            f"{_plural(self.outliers, 'outlier')}, "
            + (f"{self.fps:,.1f} fps" if quoted else "fps n/a")
            + self._drift_text()
            + (", UNSTABLE" if self.stable is False else "")
            + (", stability unknown" if self.stable is None else "")
            + (", UNDERSAMPLED" if self.undersampled else "")
            + (f" (min {self.min_samples})" if self.undersampled and self.min_samples else "")
            + (", NOISY" if self.noisy else ""),
        ]
        if self.compile_ms is not None:
            lines.append(f"  compile {format_ms(self.compile_ms)}")
        for k, m in self.parts.items():
            lines.append(f"  {k}: median {format_ms(m.median_ms)}")
        if self.cpu is not None:
            lines.append(
                f"  CPU work ({self.cpu_clock}): median {format_ms(self.cpu.median_ms)}, "
                f"wall/CPU {self.wall_over_cpu:.2f}"
            )
        if self.loaded:
            lines.append(f"  loaded: {self.load_reason}")
        if self.waited:
            lines.append(f"  waited: {self._waited_text()}")
        if self.sm_clock_moved is not None:
            c = self.sm_clock_mhz
            lines.append(
                f"  SM clock {c.min():.0f}-{c.max():.0f} MHz"
                + (" (MOVED)" if self.clock_moved else "")
            )
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The notebook display: the lines it prints."""
        return html_notebook(repr(self).splitlines())


def load_stretch(competing_cores: float | None) -> float:
    """The most wall/CPU that other work on ``competing_cores`` (k) of the cores a run needed
    explains for the median sample of a thread that waits for nothing but a core: at worst the
    other work fell on its core alone, and only while half its samples ran (the median's),
    which are then stretched by s = 1 / (1 - k_burst) while the other half run alone; over the
    window that burst averages k = (s - 1) / (s + 1), so s <= (1 + k) / (1 - k) = 1 + 2k / (1 - k)
    (1 for free cores; 3 for half a core; 7 for 0.75). Unbounded (inf) from a whole core on,
    and where nothing was read (None): any wall/CPU may then be load."""
    if competing_cores is None or not competing_cores < 1.0:  # (NaN: not read)
        return math.inf
    k = max(0.0, competing_cores)
    return (1.0 + k) / (1.0 - k)


def waited(wall_over_cpu: float | None, competing_cores: float | None, margin: float = 0.0) -> bool:
    """A wall above ``LOADED_WALL_OVER_CPU`` x the CPU time and above what the other work read
    on the cores can stretch it (:func:`load_stretch`: with the cores free, any wall/CPU above
    ``LOADED_WALL_OVER_CPU``): the work waited on something else (another thread, a sleep, a
    device), not on a core. A 600 ms sleep read wall/CPU 5952.57 beside 0.75 cores of other
    work, which can stretch it 7x: it was called loaded, and its 100 us of CPU time quoted.
    ``margin``: how far the reading's ticks can move it (the most it can be is judged)."""
    if wall_over_cpu is None or not wall_over_cpu > LOADED_WALL_OVER_CPU:
        return False
    most = None if competing_cores is None else competing_cores + margin
    return wall_over_cpu > load_stretch(most)


def load_reason(
    wall_over_cpu: float | None, competing_cores: float | None, wall: str, margin: float = 0.0
) -> str:
    """What showed a loaded machine, in words ("" for none): a wall clock above
    ``LOADED_WALL_OVER_CPU`` x the CPU time (``wall`` formatted with the ratio), unless the
    work :func:`waited` (its wall moved with what it waited on, which the load cannot explain);
    other work on ``LOADED_COMPETING_CORES`` or more of the cores it needed, beyond the
    reading's ``margin`` (what a short window's ticks can move it by), waited or not: work
    another thread does for the caller is slowed by it all the same."""
    why = []
    stretched = wall_over_cpu is not None and wall_over_cpu > LOADED_WALL_OVER_CPU
    if stretched and not waited(wall_over_cpu, competing_cores, margin):
        why.append(wall.format(wall_over_cpu))
    if competing_cores is not None and competing_cores - margin >= LOADED_COMPETING_CORES:
        cores = cores_text(competing_cores, margin)
        why.append(f"other work took {cores} cores' worth of the cores it needed")
    return "; ".join(why)


def cores_text(competing_cores: float, margin: float = 0.0) -> str:
    """``0.75``, or with a short window's margin ``0.50 (±0.14 in its ticks)``."""
    if not margin:
        return f"{competing_cores:.2f}"
    return f"{competing_cores:.2f} (±{margin:.2f} in its ticks)"


def quieter_machine(ms: Iterable[Measurement]) -> str:
    """The advice for a loaded run: time again on a quieter machine, or with the first of
    ``ms``'s :meth:`Measurement.threads_hint` (none where each already runs as few threads)."""
    hint = next((h for m in ms if (h := m.threads_hint())), "")
    return "time again on a quieter machine" + (f", or with {hint}" if hint else "")


def load_note(ms: Any) -> str:
    """What showed the load of the most loaded of ``ms`` (some ``loaded``), in words: the
    largest wall/CPU, or cores of other work (1 core of it read as wall/CPU 2)."""

    def weight(m: Measurement) -> float:
        wall = m.wall_over_cpu if math.isfinite(m.wall_over_cpu) else 0.0
        return max(wall, 1.0 + (m.competing_cores or 0.0))

    return max((m for m in ms if m.loaded), key=weight).load_reason


def _duration(s: float) -> str:
    """Seconds in words: ``42 s``, ``3.5 min``, ``8.6 h``."""
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


def format_ms(v: float) -> str:
    """Human latency with a unit (us/ms/s), to the microsecond-ish."""
    if not math.isfinite(v):
        return str(v)
    if abs(v) < 1.0:
        return f"{v * 1e3:.2f} us"
    if abs(v) < 1e3:
        return f"{v:.3f} ms"
    return f"{v / 1e3:.3f} s"


def unquotable(m: Measurement) -> list[str]:
    """Why a clean end-to-end Measurement's median is no figure to quote, as its own runs say
    (read on a loaded machine, or too few for an interval: :attr:`Measurement.undersampled`);
    empty when it is one. A report marks such a forward, backward or step median ``~`` (its
    end-to-end row, its summary, a utilization phase's ``time_rough``), as ``compare`` does."""
    reasons = []
    if m.loaded and not m.cpu_holds:  # several threads' CPU work, or not read: none to quote
        reasons.append("the machine was loaded (no CPU work to quote)")
    elif m.loaded:
        only = " only if it waits on nothing but a core" if m.wait_unclear else ""
        reasons.append(f"the machine was loaded (quote the CPU work{only})")
    if m.undersampled:
        reasons.append(f"too few runs (n={m.n})")
    return reasons
