"""Cost of the static analysis: ``profile(..., timing=False)`` over ``FlopCounterMode``.

    python benchmarks/static_speed.py [--reps 41]

Both run one forward of the same model on the same input, in the same process, interleaved, on
the CPU (batch 1, eval, no_grad); the printed ratio (paired by round, with its 95 % interval)
must stay <= 1.0 — modelprof's decomposition fallback, higher-order-operator handling, per-call
records and the state guard included. A bare ``torch.no_grad()`` forward is timed in the same
rounds: modelprof / bare (paired, with its interval) is what the static pass costs on top of the
compute, the physical limit being 1.0 (target <= 1.05). Single-threaded by default
(``--threads``), where the ratio to the compute is largest.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch.utils.flop_counter import FlopCounterMode

from modelprof import profile
from modelprof.counting.meta_route import ROUTE_ENV
from modelprof.timing.stats import paired_ratio

LIMIT = 1.0  # modelprof / FlopCounterMode
BARE_LIMIT = 1.05  # modelprof / bare no_grad forward


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(name: str, reps: int, meta: bool = False) -> tuple[float, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(torchvision.models, name)().eval()
    x = torch.randn(1, 3, 224, 224)

    def bare():
        with torch.no_grad():
            model(x)

    def flop_counter():
        with torch.no_grad(), FlopCounterMode(display=False):
            model(x)

    def modelprof():
        profile(model, inputs=x, timing=False)

    def on_meta():   # device="meta": shapes alone, the report says meta
        profile(model, tuple(x.shape[1:]), device="meta", timing=False)

    def meta_route():   # the opt-in meta route of the CPU static pass (the report says cpu)
        os.environ[ROUTE_ENV] = "meta"
        try:
            profile(model, inputs=x, timing=False)
        finally:
            del os.environ[ROUTE_ENV]

    fns = [("bare", bare), ("flop_counter", flop_counter), ("modelprof", modelprof)]
    if meta:
        fns += [("meta", on_meta), ("route", meta_route)]
    for _, fn in fns:  # warm-up: lazy init, allocator, oneDNN
        fn()
    times: dict[str, list[float]] = {key: [] for key, _ in fns}
    for _ in range(reps):
        for key, fn in fns:
            times[key].append(_time(fn))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    # paired: each round's modelprof / FlopCounterMode, run back to back (drift cancels); the
    # estimator compare() uses (20 %-trimmed mean of the per-round log ratios, Yuen's interval)
    ratio, low, high = paired_ratio(np.array(times["modelprof"]),
                                    np.array(times["flop_counter"]), 0.95)
    bare, b_low, b_high = paired_ratio(np.array(times["modelprof"]), np.array(times["bare"]),
                                       0.95)
    line = (f"{name:10s} bare forward {med['bare']:8.1f} ms | FlopCounterMode "
            f"{med['flop_counter']:8.1f} ms | modelprof {med['modelprof']:8.1f} ms | "
            f"modelprof / FlopCounterMode = {ratio:.3f} (95 % CI {low:.3f}-{high:.3f}) | "
            f"modelprof / bare = {bare:.3f} (95 % CI {b_low:.3f}-{b_high:.3f})")
    if meta:
        m, m_low, m_high = paired_ratio(np.array(times["meta"]), np.array(times["bare"]), 0.95)
        r, r_low, r_high = paired_ratio(np.array(times["route"]), np.array(times["bare"]),
                                        0.95)
        line += (f" | device='meta' {med['meta']:8.1f} ms, / bare = {m:.3f} "
                 f"(95 % CI {m_low:.3f}-{m_high:.3f}) | meta route ({ROUTE_ENV}=meta) "
                 f"{med['route']:8.1f} ms, / bare = {r:.3f} (95 % CI {r_low:.3f}-{r_high:.3f})")
    return (ratio, bare), line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    ap.add_argument("--models", default="resnet50,vit_b_16")
    ap.add_argument("--out", default=None, help="also write static_speed.txt to this directory")
    ap.add_argument("--meta", action="store_true",
                    help="also time profile(..., device='meta', timing=False) and the opt-in "
                         "meta route of the CPU static pass (MODELPROF_STATIC_ROUTE=meta)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines: list[str] = []

    def say(text: str) -> None:
        lines.append(text)
        print(text, flush=True)

    say(f"torch {torch.__version__}, {torch.get_num_threads()} threads, medians of {args.reps} "
        f"(ratio: trimmed mean of the paired per-round log ratios); load average before "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ratios = []
    for name in args.models.split(","):
        ratio, line = bench(name, args.reps, args.meta)
        ratios.append(ratio)
        say(line)
    worst = max(r for r, _ in ratios)
    worst_bare = max(b for _, b in ratios)
    say(f"worst ratio to FlopCounterMode {worst:.3f} (limit {LIMIT}): "
        f"{'PASS' if worst <= LIMIT else 'FAIL'}; worst ratio to the bare forward "
        f"{worst_bare:.3f} (target {BARE_LIMIT}): {'PASS' if worst_bare <= BARE_LIMIT else 'FAIL'}; "
        f"load average after {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "static_speed.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
