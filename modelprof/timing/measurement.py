"""``Measurement``: the raw latency samples of one timed callable and statistics derived from them.

Conventions, stated once:

* samples are milliseconds, one per timed call (``samples_ms``), kept in the order taken;
* percentiles (median, p90/p95/p99, quartiles) use numpy's default linear interpolation;
* ``std_ms`` is the sample standard deviation (``ddof=1``), ``cv = std_ms / mean_ms``;
* the confidence interval of the median is distribution-free: the order statistics
  ``[x_(j), x_(n-j+1)]`` with the largest ``j`` whose coverage ``1 - 2 P(B <= j-1)``,
  ``B ~ Binomial(n, 1/2)``, is at least the requested confidence (95 %);
* outliers are counted by Tukey's fences (outside ``[q1 - 1.5 IQR, q3 + 1.5 IQR]``) and kept;
* ``fps = batch_size / (median_ms / 1000)``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any

import numpy as np
import torch

__all__ = [
    "Measurement",
    "NoisyMeasurementWarning",
    "NOISY_CV",
    "NOISY_IQR_FRACTION",
    "median_ci_ranks",
]

#: A run is "noisy" when IQR / median exceeds this fraction ...
NOISY_IQR_FRACTION = 0.10
#: ... or when the coefficient of variation (std / mean) exceeds this one.
NOISY_CV = 0.25

STOP_REASONS = ("precision", "budget", "repeat", "max_samples")


class NoisyMeasurementWarning(UserWarning):
    """Issued once per measurement whose spread makes its median less trustworthy."""


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int, float]:
    """1-based ranks ``(j, k)`` of the order statistics bounding the median, and their coverage.

    ``P(x_(j) <= median <= x_(k)) = 1 - 2 P(B <= j - 1)``, ``B ~ Binomial(n, 1/2)``,
    ``k = n - j + 1``.
    When even ``(min, max)`` covers less than ``confidence`` (n <= 5 at 95 %), that is returned.
    """
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    alpha_half = (1.0 - confidence) / 2.0
    i = torch.arange(0, n // 2 + 1, dtype=torch.float64)
    log_pmf = (math.lgamma(n + 1) - torch.lgamma(i + 1) - torch.lgamma(n - i + 1)
               - n * math.log(2.0))
    cdf = torch.cumsum(torch.exp(log_pmf), 0).numpy()
    ok = np.nonzero(cdf <= alpha_half)[0]          # m with P(B <= m) <= alpha/2
    j = int(ok[-1]) + 1 if ok.size else 1          # j - 1 = the largest such m
    j = min(j, (n + 1) // 2)
    k = n - j + 1
    return j, k, 1.0 - 2.0 * float(cdf[j - 1])


@dataclasses.dataclass(eq=False)
class Measurement:
    """Raw latency samples (ms) of one callable on one device, with lazily derived statistics.

    ``stop_reason`` says why sampling ended: ``"precision"`` (median CI narrow enough),
    ``"budget"`` (time budget spent), ``"repeat"`` (fixed count asked) or ``"max_samples"``.
    Transfer-inclusive runs carry their parts (``h2d``, ``compute``, ``d2h``) as Measurements.
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
    _warned: bool = dataclasses.field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.samples_ms = np.asarray(self.samples_ms, dtype=np.float64).reshape(-1)
        if self.samples_ms.size == 0:
            raise ValueError("a Measurement needs at least one sample")

    # -- order statistics ---------------------------------------------------------------------
    @functools.cached_property
    def _sorted(self) -> np.ndarray:
        return np.sort(self.samples_ms)

    def _pct(self, q: float) -> float:
        return float(np.percentile(self._sorted, q))

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
        return float(self.samples_ms.std(ddof=1)) if self.n > 1 else 0.0

    @property
    def min_ms(self) -> float:
        return float(self._sorted[0])

    @property
    def max_ms(self) -> float:
        return float(self._sorted[-1])

    @functools.cached_property
    def p90_ms(self) -> float:
        return self._pct(90)

    @functools.cached_property
    def p95_ms(self) -> float:
        return self._pct(95)

    @functools.cached_property
    def p99_ms(self) -> float:
        return self._pct(99)

    @functools.cached_property
    def q1_ms(self) -> float:
        return self._pct(25)

    @functools.cached_property
    def q3_ms(self) -> float:
        return self._pct(75)

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms

    @property
    def cv(self) -> float:
        return self.std_ms / self.mean_ms if self.mean_ms > 0 else float("nan")

    @functools.cached_property
    def median_ci_ms(self) -> tuple[float, float]:
        """Distribution-free ``confidence`` interval of the median (order statistics)."""
        j, k, _ = median_ci_ranks(self.n, self.confidence)
        return float(self._sorted[j - 1]), float(self._sorted[k - 1])

    @property
    def median_ci_coverage(self) -> float:
        """Actual coverage of ``median_ci_ms`` (>= confidence unless n is tiny)."""
        return median_ci_ranks(self.n, self.confidence)[2]

    @property
    def ci_half_width_ms(self) -> float:
        lo, hi = self.median_ci_ms
        return (hi - lo) / 2.0

    @property
    def relative_ci(self) -> float:
        """CI half-width over the median: the precision reached (0.01 = ±1 %)."""
        return self.ci_half_width_ms / self.median_ms if self.median_ms > 0 else float("inf")

    @functools.cached_property
    def outliers(self) -> int:
        """Samples outside Tukey's fences ``[q1 - 1.5 IQR, q3 + 1.5 IQR]`` (counted, kept)."""
        lo, hi = self.q1_ms - 1.5 * self.iqr_ms, self.q3_ms + 1.5 * self.iqr_ms
        return int(np.count_nonzero((self.samples_ms < lo) | (self.samples_ms > hi)))

    @property
    def fps(self) -> float:
        """Samples per second at the median latency: ``batch_size / median`` (seconds)."""
        return self.batch_size / (self.median_ms / 1e3) if self.median_ms > 0 else float("inf")

    @property
    def noisy(self) -> bool:
        """IQR / median above ``NOISY_IQR_FRACTION`` or CV above ``NOISY_CV``."""
        if self.n < 2 or self.median_ms <= 0:
            return False
        return self.iqr_ms / self.median_ms > NOISY_IQR_FRACTION or self.cv > NOISY_CV

    def warn_if_noisy(self) -> bool:
        """``warnings.warn`` once (per Measurement) when the run is noisy; True if it warned."""
        if self._warned or not self.noisy:
            return False
        self._warned = True
        warnings.warn(
            f"noisy timing of {self.label or 'the callable'} on {self.device}: "
            f"IQR/median = {self.iqr_ms / self.median_ms:.1%}, CV = {self.cv:.1%} "
            f"(thresholds {NOISY_IQR_FRACTION:.0%}, {NOISY_CV:.0%}); other load on the machine, "
            "frequency scaling or too short a warm-up can cause this",
            NoisyMeasurementWarning, stacklevel=3)
        return True

    @property
    def parts(self) -> dict[str, Measurement]:
        """The transfer-inclusive parts that exist: ``h2d``, ``compute``, ``d2h``."""
        return {k: m for k, m in (("h2d", self.h2d), ("compute", self.compute),
                                  ("d2h", self.d2h)) if m is not None}

    # -- export ------------------------------------------------------------------------------
    def stats(self) -> dict[str, float | int]:
        """The derived statistics, as plain numbers."""
        lo, hi = self.median_ci_ms
        return {
            "n": self.n, "mean_ms": self.mean_ms, "std_ms": self.std_ms,
            "median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms,
            "p90_ms": self.p90_ms, "p95_ms": self.p95_ms, "p99_ms": self.p99_ms,
            "iqr_ms": self.iqr_ms, "cv": self.cv, "median_ci_low_ms": lo,
            "median_ci_high_ms": hi, "median_ci_coverage": self.median_ci_coverage,
            "relative_ci": self.relative_ci, "outliers": self.outliers, "fps": self.fps,
            "noisy": self.noisy,
        }

    def to_dict(self, samples: bool = True) -> dict[str, Any]:
        """JSON-serialisable: metadata, statistics, parts, env and (optionally) the raw samples."""
        d: dict[str, Any] = {
            "label": self.label, "device": self.device, "batch_size": self.batch_size,
            "warmup": self.warmup, "stop_reason": self.stop_reason, "precision": self.precision,
            "confidence": self.confidence, "compile_ms": self.compile_ms, "wall_s": self.wall_s,
            **self.stats(),
        }
        if self.parts:
            d["parts"] = {k: m.to_dict(samples=samples) for k, m in self.parts.items()}
        if self.env:
            d["env"] = self.env
        if samples:
            d["samples_ms"] = self.samples_ms.tolist()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        """Rebuild from ``to_dict()`` output (which must include ``samples_ms``)."""
        if "samples_ms" not in d:
            raise ValueError("from_dict needs the raw samples: use to_dict(samples=True)")
        parts = {k: cls.from_dict(v) for k, v in (d.get("parts") or {}).items()}
        meta = {f.name: d[f.name] for f in dataclasses.fields(cls)
                if f.init and f.name in d and f.name not in ("h2d", "compute", "d2h")}
        return cls(**meta, **parts)

    def __repr__(self) -> str:
        lo, hi = self.median_ci_ms
        head = f"Measurement({self.label + ', ' if self.label else ''}{self.device}, " \
               f"batch {self.batch_size})"
        lines = [
            head,
            f"  median {_ms(self.median_ms)} (95% CI {_ms(lo)}..{_ms(hi)}, "
            f"±{self.relative_ci:.2%}), mean {_ms(self.mean_ms)} ± {_ms(self.std_ms)}",
            f"  min {_ms(self.min_ms)}, p90 {_ms(self.p90_ms)}, p99 {_ms(self.p99_ms)}, "
            f"max {_ms(self.max_ms)}, IQR {_ms(self.iqr_ms)}, CV {self.cv:.1%}",
            f"  n={self.n} after {self.warmup} warm-up, stop={self.stop_reason}, "
            f"{self.outliers} outlier{'s' if self.outliers != 1 else ''}, {self.fps:,.1f} fps"
            + (", NOISY" if self.noisy else ""),
        ]
        if self.compile_ms is not None:
            lines.append(f"  compile {_ms(self.compile_ms)}")
        for k, m in self.parts.items():
            lines.append(f"  {k}: median {_ms(m.median_ms)}")
        return "\n".join(lines)


def _ms(v: float) -> str:
    """Human latency with a unit (us/ms/s), to the microsecond-ish."""
    if not math.isfinite(v):
        return str(v)
    if abs(v) < 1.0:
        return f"{v * 1e3:.2f} us"
    if abs(v) < 1e3:
        return f"{v:.3f} ms"
    return f"{v / 1e3:.3f} s"
