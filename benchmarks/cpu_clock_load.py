"""Does the CPU-time clock hold where the wall clock bends? Three identical resnet18 copies
(1 intra-op thread, 112x112) with BOTH cores kept busy by two busy-loop processes that this
script starts and stops.

    python benchmarks/cpu_clock_load.py [--runs 4] [--rounds 30] [--budget-s 3] [--out DIR]

Part 1, by hand (as the issue measured it): per run, the three copies round-robin for
``--rounds`` rounds, each forward timed by ``perf_counter`` and by ``thread_time``; the medians'
ratios of the copies to the first (identical models: 1.00 is the truth) on each clock, and wall
over CPU. Part 2: ``modelprof.compare`` of the same three copies under the same load: its
wall-clock ``latency_x`` and its CPU-clock ``cpu_work_x`` with their intervals, and what it
ranked by. The load average before and after is printed.
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modelprof import compare  # noqa: E402


def _busy() -> None:
    """Burn one core until terminated."""
    x = 0
    while True:
        x += 1


def round_robin(
    models: dict[str, torch.nn.Module], x: torch.Tensor, rounds: int
) -> dict[str, dict[str, float]]:
    """Median wall and thread-CPU ms of each copy over ``rounds`` round-robin forwards."""
    wall: dict[str, list[float]] = {n: [] for n in models}
    cpu: dict[str, list[float]] = {n: [] for n in models}
    with torch.no_grad():
        for m in models.values():
            for _ in range(3):
                m(x)
        for _ in range(rounds):
            for name, m in models.items():
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                m(x)
                t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
                wall[name].append((t1 - t0) / 1e6)
                cpu[name].append((c1 - c0) / 1e6)
    return {
        n: {"wall_ms": float(np.median(wall[n])), "cpu_ms": float(np.median(cpu[n]))}
        for n in models
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=3.0, help="compare()'s budget per model")
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--out", default=None, help="write cpu_clock_load.json/.md here")
    args = ap.parse_args(argv)

    import torchvision

    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = torchvision.models.resnet18(weights=None).eval()
    models = {"a": base, "b": copy.deepcopy(base), "c": copy.deepcopy(base)}
    x = torch.randn(1, 3, args.size, args.size)
    load_before = os.getloadavg()
    busy = [mp.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(2)]
    for p in busy:
        p.start()
    runs, comparisons = [], []
    try:
        time.sleep(1.0)  # let the busy loops take their cores
        for run in range(args.runs):
            med = round_robin(models, x, args.rounds)
            a = med["a"]
            row = {
                n: {
                    "wall_ratio": v["wall_ms"] / a["wall_ms"],
                    "cpu_ratio": v["cpu_ms"] / a["cpu_ms"],
                    "wall_over_cpu": v["wall_ms"] / v["cpu_ms"],
                    **v,
                }
                for n, v in med.items()
            }
            runs.append(row)
            print(
                f"run {run + 1}: "
                + "; ".join(
                    f"{n} wall x{r['wall_ratio']:.3f} cpu x{r['cpu_ratio']:.3f} "
                    f"wall/cpu {r['wall_over_cpu']:.2f}"
                    for n, r in row.items()
                ),
                flush=True,
            )
        for run in range(args.runs):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                df = compare(
                    models, (3, args.size, args.size), budget_s=args.budget_s, roofline=False
                )
            cols = [
                "latency_median_ms",
                "latency_x",
                "latency_x_ci_low",
                "latency_x_ci_high",
                "cpu_work_median_ms",
                "cpu_work_x",
                "cpu_work_x_ci_low",
                "cpu_work_x_ci_high",
                "wall_over_cpu",
                "rank",
            ]
            got = {n: {c: float(df.loc[n, c]) for c in cols} for n in df.index}
            comparisons.append({"ranked_by": df.attrs["ranked_by"], "models": got})
            print(
                f"compare {run + 1} (ranked by {df.attrs['ranked_by']}): "
                + "; ".join(
                    f"{n} latency_x {v['latency_x']:.3f} [{v['latency_x_ci_low']:.3f}, "
                    f"{v['latency_x_ci_high']:.3f}] cpu_work_x {v['cpu_work_x']:.3f} "
                    f"[{v['cpu_work_x_ci_low']:.3f}, {v['cpu_work_x_ci_high']:.3f}] wall/cpu "
                    f"{v['wall_over_cpu']:.2f}"
                    for n, v in got.items()
                ),
                flush=True,
            )
    finally:
        for p in busy:
            p.terminate()
        for p in busy:
            p.join(timeout=5)
    load_after = os.getloadavg()
    summary = _summary(runs, comparisons)
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(json.dumps(summary, indent=1))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cpu_clock_load.json").write_text(
            json.dumps(
                {
                    "runs": runs,
                    "compare": comparisons,
                    "summary": summary,
                    "load_before": load_before,
                    "load_after": load_after,
                },
                indent=1,
            )
        )
    return 0


def _summary(runs: list[dict], comparisons: list[dict]) -> dict[str, list[float]]:
    """Ranges over runs and copies (the baseline copy excluded from the ratios)."""

    def span(values: list[float]) -> list[float]:
        return [round(min(values), 3), round(max(values), 3)]

    wall = [r[n]["wall_ratio"] for r in runs for n in ("b", "c")]
    cpu = [r[n]["cpu_ratio"] for r in runs for n in ("b", "c")]
    w_over_c = [r[n]["wall_over_cpu"] for r in runs for n in r]
    lat = [c["models"][n]["latency_x"] for c in comparisons for n in ("b", "c")]
    cw = [c["models"][n]["cpu_work_x"] for c in comparisons for n in ("b", "c")]
    cw_lo = [c["models"][n]["cpu_work_x_ci_low"] for c in comparisons for n in ("b", "c")]
    cw_hi = [c["models"][n]["cpu_work_x_ci_high"] for c in comparisons for n in ("b", "c")]
    return {
        "round_robin_wall_ratio": span(wall),
        "round_robin_cpu_ratio": span(cpu),
        "round_robin_wall_over_cpu": span(w_over_c),
        "compare_latency_x": span(lat),
        "compare_cpu_work_x": span(cw),
        "compare_cpu_work_x_ci": [round(min(cw_lo), 3), round(max(cw_hi), 3)],
        "compare_ranked_by": sorted({c["ranked_by"] for c in comparisons}),
    }


if __name__ == "__main__":
    raise SystemExit(main())
