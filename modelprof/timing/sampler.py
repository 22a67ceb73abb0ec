"""The timing recipe in one place: option checks, warm-up, and the adaptive stop.

Warm-up (``warmup=None``, the default) runs a callable at least ``WARMUP_MIN_ITERS`` (3) times AND
for at least ``warmup_s`` (0.5 s) of wall time, synchronising after each call: enough for lazy
initialisation, cuDNN autotuning (``cudnn.benchmark`` tries algorithms on the first call of a shape)
and GPU clocks to ramp up. The registry ``WARMED`` remembers, per callable, the input signatures
(shapes, dtypes, devices, mode flags) already warmed: a signature seen before gets a short refresher
(``REWARM_ITERS`` = 1 call and ``min(warmup_s, REWARM_S)`` = 0.1 s), a new one — a changed input
shape — the full warm-up again. ``warmup=<int>`` runs exactly that many calls, always.

Sampling (``collect``): ``repeat=<int>`` takes exactly that many samples. Otherwise samples come in
chunks until the distribution-free 95 % CI of the median is within ``±precision`` of the median
(after at least ``min_samples``), bounded by ``budget_s`` of sampling time (warm-up and compilation
not included; the budget wins over ``min_samples`` for calls slower than ``budget_s / min_samples``)
and by ``max_samples``. Chunks last at most ``CHUNK_S`` so that the stop is checked often; on CUDA
each chunk costs exactly one synchronize.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ..errors import ModelProfError
from ..inputs import iter_tensors
from .measurement import median_ci_ranks

__all__ = [
    "CHUNK_S",
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
CHUNK_S = 0.2
MAX_CHUNK = 1000


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ModelProfError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


def _check_seconds(name: str, value: Any, allow_zero: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise ModelProfError(f"{name}={value!r} must be a number of seconds "
                             f"{'>= 0' if allow_zero else '> 0'}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class WarmupPolicy:
    """``count`` exact warm-up calls, or ``None`` for the automatic count-and-time rule."""

    count: int | None = None
    seconds: float = WARMUP_S

    @classmethod
    def parse(cls, warmup: int | None, warmup_s: float) -> WarmupPolicy:
        count = None if warmup is None else _check_int("warmup", warmup, 0)
        return cls(count, _check_seconds("warmup_s", warmup_s, allow_zero=True))

    def plan(self, already_warm: bool) -> tuple[int, float, int | None]:
        """(minimum calls, minimum seconds, exact count or None) for this callable/signature."""
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

    @classmethod
    def parse(cls, repeat: int | None = None, precision: float = DEFAULT_PRECISION,
              budget_s: float = DEFAULT_BUDGET_S, min_samples: int = DEFAULT_MIN_SAMPLES,
              max_samples: int = DEFAULT_MAX_SAMPLES) -> StopRule:
        rep = None if repeat is None else _check_int("repeat", repeat, 1)
        ok = (isinstance(precision, (int, float)) and not isinstance(precision, bool)
              and math.isfinite(precision) and 0 < precision < 1)
        if not ok:
            raise ModelProfError(f"precision={precision!r} must be a relative half-width in "
                                 "(0, 1), e.g. 0.01 for a median within ±1 %")
        budget = _check_seconds("budget_s", budget_s, allow_zero=False)
        lo = _check_int("min_samples", min_samples, 1)
        hi = _check_int("max_samples", max_samples, 1)
        if hi < lo:
            raise ModelProfError(f"max_samples={hi} is below min_samples={lo}")
        return cls(rep, float(precision), budget, lo, hi)


def relative_ci(samples: np.ndarray, confidence: float = 0.95) -> float:
    """Half-width of the median's CI over the median (``inf`` when the median is 0)."""
    s = np.sort(samples)
    j, k, _ = median_ci_ranks(s.size, confidence)
    med = float(np.median(s))
    return (float(s[k - 1]) - float(s[j - 1])) / 2.0 / med if med > 0 else math.inf


def collect(sample_chunk: Callable[[int], np.ndarray], rule: StopRule,
            est_ms: float | None = None,
            now: Callable[[], float] = time.perf_counter) -> tuple[np.ndarray, str, float]:
    """Call ``sample_chunk(k)`` (which takes ``k`` samples, returns their ms) until ``rule`` says
    stop. Returns ``(samples_ms, stop_reason, sampling_wall_s)``."""
    t0 = now()
    chunks: list[np.ndarray] = []
    n = 0
    wall_ms = est_ms  # wall time per sample, overheads (flush, hooks, sync) included

    def take(k: int) -> np.ndarray:
        nonlocal n, wall_ms
        t = now()
        got = np.asarray(sample_chunk(k), dtype=np.float64).reshape(-1)
        wall_ms = max((now() - t) * 1e3 / max(got.size, 1), float(np.median(got)), 1e-6)
        chunks.append(got)
        n += got.size
        return got

    def cap() -> int:
        if wall_ms is None or wall_ms <= 0:
            return MAX_CHUNK
        return max(1, min(MAX_CHUNK, int(CHUNK_S * 1e3 / wall_ms)))

    if rule.repeat is not None:
        while n < rule.repeat:
            take(min(rule.repeat - n, cap()))
        return np.concatenate(chunks), "repeat", now() - t0

    need = rule.min_samples
    while True:
        elapsed = now() - t0
        # without an estimate of a call's duration, one sample first: it may be slow
        fit = (rule.budget_s - elapsed) * 1e3 / wall_ms if wall_ms else 1.0
        k = max(1, min(need, int(fit), cap(), rule.max_samples - n))
        take(k)
        samples = np.concatenate(chunks)
        rel = relative_ci(samples, rule.confidence)
        if n >= rule.min_samples and rel <= rule.precision:
            reason = "precision"
        elif n >= rule.max_samples:
            reason = "max_samples"
        elif (now() - t0) * 1e3 + wall_ms > rule.budget_s * 1e3:
            reason = "budget"
        else:
            if n < rule.min_samples:
                need = rule.min_samples - n
            else:  # the CI half-width shrinks like 1/sqrt(n)
                want = math.ceil(n * (rel / rule.precision) ** 2) if math.isfinite(rel) else 2 * n
                need = max(want - n, math.ceil(0.1 * n), 1)
            continue
        return samples, reason, now() - t0


def warm_up(step: Callable[[], Any], policy: WarmupPolicy, already_warm: bool,
            sync: Callable[[], None] = lambda: None,
            now: Callable[[], float] = time.perf_counter) -> tuple[int, float | None]:
    """Run ``step`` per ``policy``, synchronising after each call (untimed, so it may).

    Returns ``(calls made, median wall ms of a call or None)``; the latter sizes sample chunks.
    """
    min_calls, min_s, exact = policy.plan(already_warm)
    walls: list[float] = []
    t_start = now()
    while True:
        if exact is not None:
            if len(walls) >= exact:
                break
        elif len(walls) >= min_calls and now() - t_start >= min_s:
            break
        t = now()
        step()
        sync()
        walls.append((now() - t) * 1e3)
    return len(walls), (float(np.median(walls)) if walls else None)


def input_signature(args: Any, kwargs: Any = None, **flags: Any) -> tuple[Hashable, ...]:
    """What makes a warm-up specific: shape, dtype, device, layout of every tensor, and flags."""
    tensors = tuple((tuple(t.shape), str(t.dtype), str(t.device), t.is_contiguous(),
                     t.dim() == 4 and t.is_contiguous(memory_format=_channels_last()))
                    for t in iter_tensors((args, kwargs)))
    return tensors + tuple(sorted((k, repr(v)) for k, v in flags.items()))


def _channels_last() -> Any:
    import torch
    return torch.channels_last


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
