"""Does a training comparison's backward ratio hold under load? ``compare(backward=True)`` of
mobilenet_v3_small against resnet18 (``--threads`` intra-op threads, 1 by default; 112x112,
batch 1), first on a quiet
machine (the reference), then with ``--spinners`` busy-loop processes that this script starts
and stops; per run the wall-clock ``backward_latency_x`` and the CPU-work
``backward_cpu_work_x`` with their intervals (and the forward's ``latency_x`` and
``cpu_work_x`` beside them), the backward's wall/CPU, and whether the table said to read the
CPU work (``attrs["backward_by"]``).

    python benchmarks/backward_under_load.py [--runs 2] [--spinners 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_clock_load import _busy  # noqa: E402

from modelprof import compare  # noqa: E402


def one(models: dict, size: int, budget_s: float) -> str:
    """One training comparison, as a line: the candidate's backward ratios and their intervals."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = compare(models, (3, size, size), backward=True, budget_s=budget_s, roofline=False)
    row = df.loc["mobilenet_v3_small"]
    wall = row["backward_latency_median_ms"] / row["backward_cpu_work_median_ms"]

    def ratio(name: str) -> str:
        return f"{row[name]:.3f} [{row[name + '_ci_low']:.3f}, {row[name + '_ci_high']:.3f}]"

    return (
        f"forward latency_x {ratio('latency_x')}, cpu_work_x {ratio('cpu_work_x')}; "
        f"backward_latency_x {ratio('backward_latency_x')}, backward_cpu_work_x "
        f"{ratio('backward_cpu_work_x')}, wall/CPU {wall:.2f}, read the CPU work: "
        f"{df.attrs.get('backward_by') == 'cpu_work'}; "
        + " | ".join(n for n in df.attrs["notes"] if n.startswith("the training steps"))
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--spinners", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=2.0, help="compare()'s budget per model")
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    args = ap.parse_args(argv)

    import torchvision

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = {
        "resnet18": torchvision.models.resnet18(weights=None),
        "mobilenet_v3_small": torchvision.models.mobilenet_v3_small(weights=None),
    }
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
    )
    for run in range(args.runs):
        print(f"quiet {run + 1}: {one(models, args.size, args.budget_s)}", flush=True)
    busy = [
        mp.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(args.spinners)
    ]
    for p in busy:
        p.start()
    try:
        time.sleep(1.0)  # let the busy loops take their cores
        for run in range(args.runs):
            line = one(models, args.size, args.budget_s)
            print(f"{args.spinners} busy loops {run + 1}: {line}", flush=True)
    finally:
        for p in busy:
            p.terminate()
        for p in busy:
            p.join(timeout=5)
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
