"""End to end, as a user sees it: time to first token (TTFT), time per output token (TPOT),
the whole generation, tokens/s, and how a decode step's time grows with the context.

One sample is one greedy generation of exactly ``new_tokens``, stamped per token: one TTFT (call
to first token), ``new_tokens - 1`` decode steps (token to token) and the end-to-end time (call
to return), taken in blocks by ``measure_latency``'s recipe, so TTFT and TPOT are Measurements
over the same blocks. On CUDA each stamp synchronises first; on the CPU each also reads the CPU
time, so every Measurement carries its CPU work (the figure that holds on a loaded machine).

``tokens_per_s`` = 1000 / median TPOT per sequence, ``batch_tokens_per_s`` that x batch size,
``end_to_end_tokens_per_s`` = batch x new_tokens / median end-to-end (prefill included).
``step_slope``: least squares of the per-context median step time against the context ``L``
(``ms = a + b L``), with the 95 % t interval of ``b``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np
import pandas as pd
import torch

from modelprof.generation.lm import LanguageModel
from modelprof.generation.spec import GenerationSpec
from modelprof.runtime.device import MemoryStats, device_synchronize
from modelprof.timing.clock import CpuClock, cpu_time_source, other_cpu_clock, thread_share
from modelprof.timing.interleave import interval_columns
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import TimingOptions
from modelprof.timing.runner import Runner
from modelprof.timing.stats import t_quantile

__all__ = [
    "GenerationTiming",
    "Slope",
    "fit_slope",
    "generation_sampler",
    "measure_generation",
    "stable_flags",
]


@dataclasses.dataclass(frozen=True)
class Slope:
    """``ms = intercept_ms + ms_per_token x L``, with the 95 % interval of the slope, kept as
    fitted; :attr:`measured_ms_per_token` is what may be shown as a time."""

    ms_per_token: float
    ci_low: float
    ci_high: float
    intercept_ms: float
    points: int

    @property
    def measurable(self) -> bool:
        """The interval lies above zero: one reaching zero measured no growth (noise larger
        than it), and a step cannot take negative time per token."""
        return self.ci_low > 0

    @property
    def measured_ms_per_token(self) -> float:
        """The slope where :attr:`measurable`, else NaN."""
        return self.ms_per_token if self.measurable else float("nan")

    def describe(self) -> str:
        """``0.05 ms per token (0.04-0.06)``; ``not measurable (interval -0.3 to 0.5 ms ...)``
        where the interval holds zero; ``negative (...)`` where it lies wholly below zero: a
        measured slope, but a step does not get faster with context (the load moved the runs),
        so no figure to quote."""
        interval = f"interval {self.ci_low:.3g} to {self.ci_high:.3g} ms per token"
        if self.ci_high < 0:
            return (
                f"negative ({interval}: faster with context, the load moved the runs), "
                "no figure to quote"
            )
        if not self.measurable:
            return f"not measurable ({interval})"
        return f"{self.ms_per_token:.3g} ms per token ({self.ci_low:.3g}-{self.ci_high:.3g})"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "measurable": self.measurable}


def fit_slope(x: np.ndarray, y: np.ndarray, confidence: float = 0.95) -> Slope | None:
    """Least squares of ``y`` on ``x`` with the slope's t interval (None: < 3 distinct x)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.unique(x).size < 3:
        return None
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    dof = x.size - 2
    sxx = float(((x - x.mean()) ** 2).sum())
    se = math.sqrt(float((resid**2).sum()) / dof / sxx) if dof > 0 else math.inf
    half = t_quantile(0.5 + confidence / 2.0, dof) * se if dof > 0 else math.inf
    return Slope(float(b), float(b - half), float(b + half), float(a), int(x.size))


@dataclasses.dataclass(eq=False)
class GenerationTiming:
    """The measured generations of one batch size (see the module docstring)."""

    batch_size: int
    prompt_len: int
    new_tokens: int
    end_to_end: Measurement
    ttft: Measurement
    tpot: Measurement | None
    step_ms: np.ndarray  # (generations, new_tokens - 1): every decode step's time
    contexts: np.ndarray  # the cache length L of each step column
    peak_memory_bytes: int | None = None

    @property
    def step_slope(self) -> Slope | None:
        """How a decode step's time grows with the context (per-context medians)."""
        if self.step_ms.shape[1] < 3:
            return None
        return fit_slope(self.contexts, np.median(self.step_ms, axis=0))

    @property
    def tokens_per_s(self) -> float:
        """Per sequence, at the median TPOT."""
        return 1e3 / self.tpot.median_ms if self.tpot is not None else float("nan")

    @property
    def batch_tokens_per_s(self) -> float:
        return self.batch_size * self.tokens_per_s

    @property
    def end_to_end_tokens_per_s(self) -> float:
        """All sequences' new tokens over the median end-to-end time (prefill included)."""
        return self.batch_size * self.new_tokens / (self.end_to_end.median_ms / 1e3)

    def summary(self) -> dict[str, Any]:
        """One row of numbers: medians, intervals, stability, on the CPU each figure's CPU work
        (``ttft_cpu_ms``... with intervals), rates, slope."""
        row: dict[str, Any] = {
            "batch_size": self.batch_size,
            "prompt_len": self.prompt_len,
            "new_tokens": self.new_tokens,
            "generations": self.end_to_end.n,
        }
        for name in ("ttft", "tpot", "end_to_end"):
            m = getattr(self, name)
            if m is None:  # not measured: no interval nor stability (NaN, None), no drift column
                values = (math.nan, math.nan, math.nan, math.nan, None)
            else:
                values = (m.median_ms, *m.median_ci_ms, m.min_ms, m.stable, m.drift_pct)
            row.update({f"{name}{k}": v for k, v in zip(_FIGURE, values)})  # a missing one: 5
        for name in ("ttft", "tpot", "end_to_end"):  # on the CPU: the work load cannot stretch
            m = getattr(self, name)
            if m is not None and m.cpu is not None:  # (the figure to quote where cpu_holds)
                row.update(interval_columns(f"{name}_cpu", m.cpu, median=""))
        slope = self.step_slope
        row.update(
            tokens_per_s=self.tokens_per_s,
            batch_tokens_per_s=self.batch_tokens_per_s,
            end_to_end_tokens_per_s=self.end_to_end_tokens_per_s,
            step_ms_per_context_token=slope.measured_ms_per_token if slope else float("nan"),
            step_slope_ci_low=slope.ci_low if slope else float("nan"),
            step_slope_ci_high=slope.ci_high if slope else float("nan"),
            peak_memory_bytes=self.peak_memory_bytes,
        )
        return row


#: a figure's columns in ``GenerationTiming.summary`` (after its name: ``ttft_ms``...)
_FIGURE = "_ms _ci_low_ms _ci_high_ms _min_ms _stable _drift_pct".split()

#: each tokens/s figure of ``GenerationTiming.summary`` and the figure it is computed from
RATES = {
    "tokens_per_s": "tpot",
    "batch_tokens_per_s": "tpot",
    "end_to_end_tokens_per_s": "end_to_end",
}


def rate_flags(row: dict[str, Any]) -> dict[str, bool]:
    """``<rate>_rough`` of each tokens/s figure in ``row`` (a summary row with its
    ``tpot_rough``, ``end_to_end_rough``): a rate computed from a figure that is no figure to
    quote is none either, marked ``~`` beside it."""
    return {f"{r}_rough": bool(row.get(f"{k}_rough")) for r, k in RATES.items() if r in row}


def stable_flags(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (rows of ``GenerationTiming.summary``) with each ``*_stable`` column as pandas'
    nullable boolean: True, False or NA (cannot be judged). Held as objects, a column with a
    None beside True rendered ``True`` where a column of bools renders ``yes``."""
    for col in [c for c in df.columns if str(c).endswith("_stable")]:
        df[col] = df[col].astype("boolean")
    return df


class _Run:
    """One generation, stamped: TTFT, the decode steps and the end-to-end time in ms; on the
    CPU with their CPU time too (``timing.clock.cpu_time_source``)."""

    def __init__(self, lm: LanguageModel, prompt: torch.Tensor, new_tokens: int) -> None:
        self.lm, self.prompt, self.n = lm, prompt, new_tokens
        dev = lm.device
        self.sync = (lambda: device_synchronize(dev)) if dev.type != "cpu" else (lambda: None)
        self.cpu_clock, self.cpu_now = cpu_time_source() if dev.type == "cpu" else (None, None)
        self.ttft: list[float] = []
        self.steps: list[np.ndarray] = []
        self.cpu: dict[str, list] = {"end_to_end": [], "ttft": [], "steps": []}
        # each end to end's time on the other CPU clock, for the calling thread's share
        self.other: list[float] = []
        self.other_clock = other_cpu_clock(self.cpu_clock)
        self.tare_ms = self._stamp_tare() if self.cpu_now is not None else 0.0
        # the end to end's reads of both clocks, around an empty generation (ms, each clock)
        self.end_tares = self._end_tares() if self.cpu_now is not None else (0.0, 0.0)

    def _stamper(self, stamps: list[int], resumed: list[int], cpus: list[int]) -> Any:
        """The callback ``generate`` calls as each token is ready: its wall stamp, its CPU
        clock read, then the wall stamp its next step starts from. A loaded scheduler often
        preempts at the CPU clock read (a system call): each step runs from the wall stamp
        after the read, and the reads are out of the end to end."""
        sync, perf = self.sync, time.perf_counter_ns
        cpu = self.cpu_now or (lambda: 0)

        def stamp() -> None:
            sync()
            stamps.append(perf())
            cpus.append(cpu())
            resumed.append(perf())

        return stamp

    def _stamp_tare(self) -> float:
        """The CPU ms one stamp's own reads add to a step beyond its wall span (the CPU clock
        read, which the wall span leaves out, and a wall stamp): the median over
        ``CpuClock.TARE_SAMPLES`` empty steps, taken off each CPU figure as ``CpuClock`` takes
        its tare off, so a step's CPU work is at most its wall time, as one thread's is."""
        stamps: list[int] = []
        resumed: list[int] = []
        cpus: list[int] = []
        stamp = self._stamper(stamps, resumed, cpus)
        for _ in range(CpuClock.TARE_SAMPLES + 1):
            stamp()
        wall = np.asarray(stamps[1:], np.float64) - np.asarray(resumed[:-1], np.float64)
        return max(float(np.median(np.diff(np.asarray(cpus, np.float64)) - wall)) / 1e6, 0.0)

    def _end_tares(self) -> tuple[float, float]:
        """What the end to end's own clock reads add to its CPU span and to the other clock's
        beyond its wall time, with no work between them: the medians over
        ``CpuClock.TARE_SAMPLES`` empty ones, as ``CpuClock`` tares each clock. Each stamp's
        read is on both clocks too (this thread's CPU time): ``tare_ms`` each."""
        sync, perf, cpu, other = self.sync, time.perf_counter_ns, self.cpu_now, self.other_clock
        excess = []
        for _ in range(CpuClock.TARE_SAMPLES):
            sync()
            other0 = other()
            c0 = cpu()
            t0 = perf()
            sync()
            t1 = perf()
            c1, other1 = cpu(), other()
            excess.append((c1 - c0 - (t1 - t0), other1 - other0 - (t1 - t0)))
        return tuple(max(float(v) / 1e6, 0.0) for v in np.median(excess, axis=0))

    def __call__(self) -> float:
        stamps: list[int] = []  # each token ready
        resumed: list[int] = []  # after the stamp's own reads
        cpus: list[int] = []
        sync, perf = self.sync, time.perf_counter_ns
        cpu = self.cpu_now or (lambda: 0)
        stamp = self._stamper(stamps, resumed, cpus)

        sync()
        other0 = self.other_clock()  # the CPU clocks read outside the spans, as CpuClock does
        c0 = cpu()
        t0 = perf()
        self.lm.generate(self.prompt, self.n, stamp)
        sync()
        t1 = perf()
        c1, other1 = cpu(), self.other_clock()
        ends, starts = np.asarray(stamps[1:], np.float64), np.asarray(resumed[:-1], np.float64)
        self.ttft.append((stamps[0] - t0) / 1e6)
        self.steps.append((ends - starts) / 1e6)
        if self.cpu_now is not None:  # less the reads' tare, each span's (never below 0)
            tare, (end, other_end) = self.tare_ms, self.end_tares
            self.cpu["end_to_end"].append(max((c1 - c0) / 1e6 - end - tare * len(stamps), 0.0))
            # the other clock's span holds the stamps' reads too, and the end to end's own:
            # left in, the thread's share read low (empty steps: 0.24 with one thread)
            other_ms = (other1 - other0) / 1e6 - other_end - tare * len(stamps)
            self.other.append(max(other_ms, 0.0))
            self.cpu["ttft"].append(max((cpus[0] - c0) / 1e6 - tare, 0.0))
            steps = np.diff(np.asarray(cpus, dtype=np.float64)) / 1e6
            self.cpu["steps"].append(np.maximum(steps - tare, 0.0))
        return (t1 - t0 - (sum(resumed) - sum(stamps))) / 1e6

    def block(self, k: int) -> np.ndarray:
        return np.asarray([self() for _ in range(k)])

    def clear(self) -> None:
        for samples in (self.ttft, self.steps, self.other, *self.cpu.values()):
            samples.clear()

    def cpu_fields(self, kind: str) -> dict[str, Any]:
        """``cpu_ms``/``cpu_clock`` for a Measurement of ``kind`` (none off the CPU)."""
        if self.cpu_now is None or not self.cpu[kind]:
            return {}
        values, total = self.cpu[kind], sum(self.cpu["end_to_end"])
        return {
            "cpu_ms": np.concatenate(values) if kind == "steps" else np.asarray(values),
            "cpu_clock": self.cpu_clock,
            "cpu_thread_share": thread_share(self.cpu_clock, total, sum(self.other)),
        }


def generation_sampler(
    lm: LanguageModel, spec: GenerationSpec, batch: int, generator: torch.Generator
) -> _Run:
    """A callable that runs one stamped generation (``.block(k)`` runs ``k``)."""
    prompt = lm.prompt(batch, spec.prompt_len, generator)
    return _Run(lm, prompt, spec.new_tokens)


def measure_generation(
    lm: LanguageModel,
    spec: GenerationSpec,
    batch: int,
    opts: TimingOptions,
    generator: torch.Generator,
) -> GenerationTiming:
    """Warm up, then generations in blocks until ``opts.stop`` says stop."""
    lm.phase(f"the timed generations at batch {batch}")
    run = generation_sampler(lm, spec, batch, generator)
    runner = Runner(opts, lm.device, lm.name, batch)
    est = runner.warm_with(run)
    run.clear()
    sampled = runner.sample(run.block, est, f"generations of {lm.name} at batch {batch}")
    peak = _peak_memory(run, runner)
    return timing_from(runner, run, sampled, spec, peak)


def timing_from(
    runner: Runner, run: _Run, sampled: Any, spec: GenerationSpec, peak: int | None = None
) -> GenerationTiming:
    """The Measurements of what ``run`` recorded over ``sampled``'s blocks, taken by ``runner``
    (labelled with its model's name)."""
    common, name, opts, batch = runner.fields(sampled), runner.label, runner.opts, runner.batch_size
    # the threads the generations ran on: the loaded-machine advice names fewer (threads_hint)
    common["env"] = {**common.get("env", {}), "torch_num_threads": torch.get_num_threads()}
    e2e = Measurement(
        sampled.samples_ms, label=f"{name} generation", **common, **run.cpu_fields("end_to_end")
    )
    ttft = Measurement(
        np.asarray(run.ttft), label=f"{name} TTFT", **common, **run.cpu_fields("ttft")
    )
    steps = np.vstack(run.steps) if run.steps else np.empty((0, 0))
    tpot = None
    if steps.size:
        per = steps.shape[1]
        offsets = (np.asarray(run.ttft)[:, None] + np.cumsum(steps, axis=1) - steps) / 1e3
        per_step = dict(  # each step its generation's block, stamped when it began
            blocks=np.repeat(sampled.blocks, per),
            timestamps_s=(sampled.timestamps_s[:, None] + offsets).reshape(-1),
        )
        tpot = Measurement(
            steps.reshape(-1),
            label=f"{name} TPOT",
            **{**common, **per_step, **run.cpu_fields("steps")},
        )
    contexts = spec.prompt_len + np.arange(steps.shape[1])
    if opts.warn:  # a short budget said once (of the generations); drift and noise each
        for m in (e2e,) if e2e.undersampled else (ttft, tpot):
            if m is not None:
                m.warn_if_noisy()
    return GenerationTiming(
        batch, spec.prompt_len, spec.new_tokens, e2e, ttft, tpot, steps, contexts, peak
    )


def _peak_memory(run: _Run, runner: Runner) -> int | None:
    """The allocator's peak over one more generation (CUDA), else None."""
    stats = MemoryStats.for_device(runner.dev)
    if stats is None:
        return None
    peak = runner.peak_bytes(run, stats)
    run.ttft.pop()
    run.steps.pop()  # no CPU time off the CPU
    return peak
