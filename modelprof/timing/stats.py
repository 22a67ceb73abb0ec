"""The statistics of timing samples taken in blocks: pure functions of arrays, shared by
``Measurement``, the adaptive stop and the interleaved comparison.

Consecutive samples on a shared or throttling machine are not independent (a background job
moves a whole stretch of them), so samples are taken in time-separated blocks and the interval
of the median is the hull of the order-statistic interval of the pooled samples (variation
within) and ``median * exp(± t(B-1) * sd(log block medians) / sqrt(B))`` (variation between
blocks, on the log scale: latency noise is multiplicative), widened for correlated blocks
(:func:`lag1_inflation`). A run is *unstable* when its log block medians follow a trend that is
significant (99 %) and larger than that interval; ``drift_pct`` is the trend's change, in %.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = [
    "DRIFT_CONFIDENCE",
    "between_block_ci",
    "block_medians",
    "lag1_inflation",
    "LAG1_MAX",
    "LAG1_MIN_BLOCKS",
    "combined_ci",
    "drift",
    "median_ci_ranks",
    "paired_block_medians",
    "paired_ratio",
    "ratio_of_medians",
    "RATIO_ESTIMATOR",
    "trimmed_mean_ci",
    "t_quantile",
    "within_ci",
]

#: Confidence of the trend test that declares a run unstable.
DRIFT_CONFIDENCE = 0.99


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int, float]:
    """1-based ranks ``(j, k)`` of the order statistics bounding the median, and their coverage.

    ``P(x_(j) <= median <= x_(k)) = 1 - 2 P(B <= j - 1)``, ``B ~ Binomial(n, 1/2)``,
    ``k = n - j + 1``. When even ``(min, max)`` covers less than ``confidence`` (n <= 5 at 95 %),
    that is returned.
    """
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    alpha_half = (1.0 - confidence) / 2.0
    i = np.arange(0, n // 2 + 1, dtype=np.float64)
    lg = np.vectorize(math.lgamma)
    log_pmf = math.lgamma(n + 1) - lg(i + 1) - lg(n - i + 1) - n * math.log(2.0)
    cdf = np.cumsum(np.exp(log_pmf))
    ok = np.nonzero(cdf <= alpha_half)[0]  # m with P(B <= m) <= alpha/2
    j = int(ok[-1]) + 1 if ok.size else 1  # j - 1 = the largest such m
    j = min(j, (n + 1) // 2)
    k = n - j + 1
    return j, k, 1.0 - 2.0 * float(cdf[j - 1])


def _nonzero(v: float) -> float:
    """``v``, or the smallest magnitude the continued fraction works with (modified Lentz)."""
    return v if abs(v) > 1e-300 else 1e-300


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 / _nonzero(1.0 - qab * x / qap)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 / _nonzero(1.0 + aa * d)
        c = _nonzero(1.0 + aa / c)
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 / _nonzero(1.0 + aa * d)
        c = _nonzero(1.0 + aa / c)
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """Quantile ``p`` (0.5 < p < 1) of Student's t with ``df`` degrees of freedom (bisection on
    the exact CDF; ``t_quantile(0.975, 1) = 12.706``, ``t_quantile(0.975, 10) = 2.228``)."""
    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def within_ci(sorted_samples: np.ndarray, confidence: float) -> tuple[float, float]:
    """Order-statistic interval of the median of (already sorted) samples."""
    j, k, _ = median_ci_ranks(int(sorted_samples.size), confidence)
    return float(sorted_samples[j - 1]), float(sorted_samples[k - 1])


def block_medians(samples: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(block ids in order of first appearance, the median of each block)``."""
    ids, first = np.unique(blocks, return_index=True)
    ids = ids[np.argsort(first)]
    return ids, np.array([float(np.median(samples[blocks == b])) for b in ids])


def paired_block_medians(
    num_ms: np.ndarray, num_blocks: np.ndarray, den_ms: np.ndarray, den_blocks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The block medians of ``num`` and ``den`` in the blocks both took, paired by block id (in
    an interleaved comparison block ``r`` of every candidate is round ``r``), in ``num``'s order:
    the pairs of :func:`ratio_of_medians` and :func:`paired_ratio`. A round only one side took
    is left out of both, never shifting the later pairs."""
    ids, med = block_medians(np.asarray(num_ms), np.asarray(num_blocks))
    den_ids, den_med = block_medians(np.asarray(den_ms), np.asarray(den_blocks))
    at = {int(b): i for i, b in enumerate(den_ids)}
    keep = [i for i, b in enumerate(ids) if int(b) in at]
    return med[keep], den_med[[at[int(ids[i])] for i in keep]]


#: From this many blocks on, the between-block interval is widened for correlated blocks.
LAG1_MIN_BLOCKS = 10
#: The largest lag-1 autocorrelation the widening uses (a factor of sqrt(1.9 / 0.1) = 4.4).
LAG1_MAX = 0.9


def lag1_inflation(logs: np.ndarray) -> float:
    """How much wider an interval of the mean of ``logs`` (in time order) must be for their
    lag-1 autocorrelation ``r``: the AR(1) factor ``sqrt((1 + r) / (1 - r))``, ``r`` corrected
    for its bias in short series (``r + (1 + 4 r) / B``, Marriott and Pope) and at most
    ``LAG1_MAX``; 1 when ``r <= 0`` or below ``LAG1_MIN_BLOCKS`` values (``r`` too rough)."""
    x = np.asarray(logs, dtype=np.float64)
    if x.size < LAG1_MIN_BLOCKS:
        return 1.0
    d = x - x.mean()
    ss = float((d * d).sum())
    r = float((d[1:] * d[:-1]).sum()) / ss if ss > 0 else 0.0
    if r <= 0:
        return 1.0
    r = min(LAG1_MAX, r + (1.0 + 4.0 * r) / x.size)
    return math.sqrt((1.0 + r) / (1.0 - r))


def between_block_ci(
    center: float, medians: np.ndarray, confidence: float
) -> tuple[float, float] | None:
    """``center * exp(± t(B-1) sd(log medians) / sqrt(B) * lag1_inflation)`` (``medians`` in
    the order taken); None with fewer than two blocks or a non-positive median."""
    b = int(medians.size)
    if b < 2 or center <= 0 or (medians <= 0).any():
        return None
    logs = np.log(medians)
    half = t_quantile(0.5 + confidence / 2.0, b - 1) * float(logs.std(ddof=1)) / math.sqrt(b)
    half *= lag1_inflation(logs)
    return center * math.exp(-half), center * math.exp(half)


def combined_ci(
    center: float,
    within: tuple[float, float],
    between: tuple[float, float] | None,
    span: tuple[float, float] | None = None,
    n_blocks: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """The hull of the within-sample and between-block intervals, cut to ``span`` (the samples'
    least and most) where ``n_blocks`` are enough for the range of their medians to be a
    distribution-free interval at ``confidence`` (``1 - 2 / 2^B``: 96.9 % from 6 blocks at
    95 %), which the samples' range holds; with fewer blocks (2: t(1)) a wide interval stands,
    since all the samples can lie on one side of the median of blocks not yet drawn."""
    if between is None:
        return within
    lo, hi = min(within[0], between[0]), max(within[1], between[1])
    if span is not None and 1.0 - 2.0 * 0.5**n_blocks >= confidence:
        lo, hi = max(lo, span[0]), min(hi, span[1])
    return lo, hi


def drift(
    times_s: np.ndarray, medians: np.ndarray, confidence: float = DRIFT_CONFIDENCE
) -> tuple[float, bool]:
    """Least-squares trend of the log block medians against block times: ``(change over the
    window in %, whether the slope differs from 0 at confidence)``. Needs three blocks."""
    b = int(medians.size)
    if b < 3 or (medians <= 0).any():
        return 0.0, False
    t = np.asarray(times_s, dtype=np.float64)
    t = t - t.mean()
    sxx = float((t * t).sum())
    if sxx <= 0:
        return 0.0, False
    logs = np.log(medians)
    y = logs - logs.mean()
    slope = float((t * y).sum()) / sxx
    window = float(t.max() - t.min())
    pct = 100.0 * math.expm1(slope * window)
    resid = y - slope * t
    dof = b - 2  # (1 or more: three blocks)
    se = math.sqrt(float((resid * resid).sum()) / dof / sxx)
    if se == 0.0:
        return pct, slope != 0.0
    return pct, abs(slope) / se > t_quantile(0.5 + confidence / 2.0, dof)


#: Share of the per-round log ratios trimmed from each end (Yuen's usual 20 %: robust to a few
#: rounds hit by other load).
RATIO_TRIM = 0.2


def trimmed_mean_ci(
    x: np.ndarray, confidence: float, trim: float = RATIO_TRIM
) -> tuple[float, float]:
    """The ``trim``-trimmed mean of ``x`` and the half-width of Yuen's t interval for it: the
    winsorized variance, ``h = n - 2g`` values kept, ``h - 1`` degrees of freedom. NaN
    half-width below two values."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = x.size
    g = int(trim * n)
    kept = x[g : n - g]
    centre = float(kept.mean())
    h = kept.size
    if h < 2:  # (h <= n)
        return centre, math.nan
    winsorized = np.clip(x, kept[0], kept[-1])
    se = math.sqrt((n - 1) * float(winsorized.var(ddof=1)) / (h * (h - 1)))
    return centre, t_quantile(0.5 + confidence / 2.0, h - 1) * se


def paired_ratio(num: np.ndarray, den: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """``(ratio, low, high)`` of two candidates from their per-round block medians: the
    trimmed mean of the per-round log ratios and Yuen's t interval, on the ratio scale (a plain
    mean would follow the rounds load hit). NaN bounds with one round."""
    r = np.log(np.asarray(num, dtype=np.float64) / np.asarray(den, dtype=np.float64))
    m, half = trimmed_mean_ci(r, confidence)
    if not math.isfinite(half):
        return math.exp(m), math.nan, math.nan
    return math.exp(m), math.exp(m - half), math.exp(m + half)


#: How a comparison's ``*_x`` ratios and their intervals are estimated, in words (for tables).
RATIO_ESTIMATOR = (
    "ratio of the medians (so it ranks as the medians do); its 95 % interval "
    "that of the per-round paired ratios of block medians (Yuen's t on the 20 %-trimmed "
    "log ratios); a ratio far outside it is flagged *_x_rough"
)


def ratio_of_medians(
    num_ms: np.ndarray,
    den_ms: np.ndarray,
    num_blocks: np.ndarray,
    den_blocks: np.ndarray,
    confidence: float,
) -> tuple[float, float, float]:
    """``median(num) / median(den)`` (so ratios rank as the medians do), with the interval of
    the per-round ratios of block medians (:func:`paired_ratio`; paired: the drift the rounds
    shared cancels; ``num_blocks``/``den_blocks``: the block medians of the same rounds,
    :func:`paired_block_medians`), the one ``agreement.judge_ratio`` holds the ratio against,
    so a ratio outside it shows in the table. NaN bounds with one round."""
    den = float(np.median(den_ms))
    ratio = float(np.median(num_ms)) / den if den > 0 else math.nan
    k = min(len(num_blocks), len(den_blocks))
    num_b = np.asarray(num_blocks[:k], dtype=np.float64)
    den_b = np.asarray(den_blocks[:k], dtype=np.float64)
    if not math.isfinite(ratio) or ratio <= 0 or k < 2 or (num_b <= 0).any() or (den_b <= 0).any():
        return ratio, math.nan, math.nan
    _, lo, hi = paired_ratio(num_b, den_b, confidence)
    return ratio, lo, hi
