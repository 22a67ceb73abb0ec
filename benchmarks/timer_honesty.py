"""Is the interval a Measurement states honest? Two workloads that run no tensor op:

* stationary: each call spins for a duration drawn from a fixed distribution (lognormal, median
  ``--median-ms``, 5 % spread; seeded). Its reference median comes from a long plain loop over
  the same callable in the same process, taken in slices between the runs so that the
  reference spans the same stretch of time. Bar: the stated 95 % interval covers the
  reference in >= 90 % of the runs, and <= 10 % of the runs are flagged unstable.
* drifting: each call spins ``--median-ms * (1 + 0.2 * seconds since the run began)`` (20 % per
  second). Bar: every run is flagged unstable or its interval covers the median of the
  durations the workload itself produced during that run.

    python benchmarks/timer_honesty.py [--runs 20] [--drift-runs 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modelprof.timing import measure_latency  # noqa: E402
from modelprof.timing.calibration import spin  # noqa: E402


class JitterSpin:
    """Spins a lognormal duration per call (seeded): a stationary workload of known spread."""

    def __init__(self, median_ms: float, sigma: float = 0.05, seed: int = 0) -> None:
        self.median_ms, self.sigma = median_ms, sigma
        self.rng = np.random.default_rng(seed)

    def __call__(self) -> None:
        spin(self.median_ms * float(np.exp(self.sigma * self.rng.standard_normal())))


class DriftSpin:
    """Spins ``median_ms * (1 + rate * seconds since reset)``, recording what it spun."""

    def __init__(self, median_ms: float, rate: float = 0.2) -> None:
        self.median_ms, self.rate = median_ms, rate
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.spun: list[float] = []

    def __call__(self) -> None:
        ms = self.median_ms * (1.0 + self.rate * (time.perf_counter() - self.t0))
        self.spun.append(ms)
        spin(ms)


def plain_loop(fn, seconds: float) -> list[float]:
    """Durations (ms) of back-to-back calls for ``seconds``: the reference, no modelprof."""
    out = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t) / 1e6)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--drift-runs", type=int, default=4)
    ap.add_argument("--median-ms", type=float, default=2.0)
    ap.add_argument("--budget-s", type=float, default=3.0)
    ap.add_argument(
        "--reference-s",
        type=float,
        default=1.0,
        help="seconds of plain loop between runs (pooled into the reference)",
    )
    ap.add_argument("--out", default=None, help="write timer_honesty.json/.md here")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")

    work = JitterSpin(args.median_ms)
    measure_latency(work, warmup_s=0.5, repeat=20, warn=False)  # warm the process once
    reference: list[float] = plain_loop(work, args.reference_s)
    runs = []
    for i in range(args.runs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = measure_latency(work, warmup_s=0.1, budget_s=args.budget_s, label="stationary")
        reference += plain_loop(work, args.reference_s)
        lo, hi = m.median_ci_ms
        runs.append(
            {
                "median_ms": m.median_ms,
                "ci": [lo, hi],
                "n": m.n,
                "blocks": m.n_blocks,
                "stable": m.stable,
                "drift_pct": m.drift_pct,
                "stop": m.stop_reason,
                "warnings": [type(w.message).__name__ for w in caught],
            }
        )
    ref = float(np.median(reference))
    covered = [r["ci"][0] <= ref <= r["ci"][1] for r in runs]
    flagged = [not r["stable"] for r in runs]
    for i, r in enumerate(runs):
        print(
            f"stationary {i + 1:>2}: median {r['median_ms']:.4f} ms, CI [{r['ci'][0]:.4f}, "
            f"{r['ci'][1]:.4f}] (±{(r['ci'][1] - r['ci'][0]) / 2 / r['median_ms']:.2%}), "
            f"n={r['n']} in {r['blocks']} blocks, drift {r['drift_pct']:+.2f} %, "
            f"{'covers' if covered[i] else 'MISSES'} the reference"
            f"{', FLAGGED' if flagged[i] else ''}"
        )
    print(f"reference median of {len(reference)} plain-loop calls: {ref:.4f} ms")

    drifting = DriftSpin(args.median_ms)
    measure_latency(drifting, warmup=3, repeat=3, warn=False)
    drift_runs = []
    for i in range(args.drift_runs):
        drifting.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = measure_latency(drifting, warmup=0, budget_s=args.budget_s, label="drifting")
        true_median = float(np.median(drifting.spun))
        lo, hi = m.median_ci_ms
        ok = (not m.stable) or lo <= true_median <= hi
        drift_runs.append(
            {
                "median_ms": m.median_ms,
                "ci": [lo, hi],
                "n": m.n,
                "blocks": m.n_blocks,
                "stable": m.stable,
                "drift_pct": m.drift_pct,
                "spun_median_ms": true_median,
                "flagged_or_covered": ok,
                "warnings": [type(w.message).__name__ for w in caught],
            }
        )
        print(
            f"drifting {i + 1}: median {m.median_ms:.3f} ms, CI [{lo:.3f}, {hi:.3f}], "
            f"drift {m.drift_pct:+.1f} % over {m.n_blocks} blocks, "
            f"{'FLAGGED' if not m.stable else 'not flagged'}, spun median {true_median:.3f} "
            f"-> {'ok' if ok else 'NEITHER FLAGGED NOR COVERED'}"
        )

    load_after = os.getloadavg()
    coverage = sum(covered) / len(runs)
    flag_rate = sum(flagged) / len(runs)
    drift_ok = all(r["flagged_or_covered"] for r in drift_runs)
    passed = coverage >= 0.9 and flag_rate <= 0.1 and drift_ok
    summary = {
        "stationary_runs": len(runs),
        "coverage": coverage,
        "flag_rate": flag_rate,
        "reference_median_ms": ref,
        "reference_calls": len(reference),
        "drift_runs": len(drift_runs),
        "drift_all_flagged_or_covered": drift_ok,
        "passed": passed,
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
    }
    print(
        f"stationary: interval covers the reference in {sum(covered)}/{len(runs)} "
        f"({coverage:.0%}, bar >= 90 %), flagged {sum(flagged)}/{len(runs)} "
        f"({flag_rate:.0%}, bar <= 10 %); drifting: "
        f"{sum(r['flagged_or_covered'] for r in drift_runs)}/{len(drift_runs)} flagged or "
        f"covered; {'PASS' if passed else 'FAIL'}; load average after "
        f"{load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}"
    )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "timer_honesty.json").write_text(
            json.dumps({"summary": summary, "stationary": runs, "drifting": drift_runs}, indent=2)
        )
        drift_read = ", ".join(f"{r['drift_pct']:+.1f} %" for r in drift_runs)
        lines = [
            "# Does the stated interval hold? (benchmarks/timer_honesty.py)",
            "",
            f"Load average before {load_before[0]:.2f}, after {load_after[0]:.2f}.",
            "",
            f"- stationary workload (spin, lognormal 5 % around {args.median_ms} ms): the "
            f"95 % interval covered the plain-loop reference median ({ref:.4f} ms, "
            f"{len(reference)} calls) in {sum(covered)}/{len(runs)} runs; "
            f"{sum(flagged)}/{len(runs)} runs flagged unstable.",
            f"- drifting workload (+20 %/s): {sum(r['flagged_or_covered'] for r in drift_runs)}"
            f"/{len(drift_runs)} runs flagged unstable or covering their own spun median "
            f"(drift read: {drift_read}).",
            f"- verdict: {'PASS' if passed else 'FAIL'}",
            "",
        ]
        (out / "timer_honesty.md").write_text("\n".join(lines))
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
