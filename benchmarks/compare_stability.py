"""Do identical models compare as identical? Three copies of one resnet18 (the same weights;
two of them the same object) at 112x112 on the CPU, compared over several rounds by
``modelprof.compare`` (interleaved, paired ratios) and, in the same run, by
``torch.utils.benchmark`` measuring them one after another (its ``blocked_autorange``).

    python benchmarks/compare_stability.py [--rounds 10] [--budget-s 3] [--out DIR]

Prints every round's ratios to the first copy and a summary: the largest |ratio - 1| of each
method, and whether every modelprof ratio lies within 1.00 ± 0.03 (the issue's bar). The load
average before and after is printed, since other work on the machine is what this is about.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modelprof import compare  # noqa: E402
from modelprof.runtime.env import collect_env  # noqa: E402

TOLERANCE = 0.03


def sequential_ratios(
    models: dict[str, torch.nn.Module], x: torch.Tensor, min_run_time: float
) -> dict[str, float]:
    """torch.utils.benchmark, one model after another: median / the first model's median."""
    from torch.utils import benchmark

    medians = {}
    for name, m in models.items():
        t = benchmark.Timer(
            stmt="m(x)", globals={"m": m, "x": x}, num_threads=torch.get_num_threads()
        )
        medians[name] = t.blocked_autorange(min_run_time=min_run_time).median
    first = next(iter(medians.values()))
    return {name: v / first for name, v in medians.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=3.0, help="modelprof's budget per model")
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--out", default=None, help="write compare_stability.json/.md here")
    args = ap.parse_args(argv)

    import torchvision

    torch.manual_seed(0)
    base = torchvision.models.resnet18(weights=None).eval()
    models = {"a": base, "b": copy.deepcopy(base), "a2": base}
    x = torch.randn(1, 3, args.size, args.size)
    env = collect_env("cpu", dtype=torch.float32, batch_size=1)
    load_before = os.getloadavg()
    print(
        f"resnet18 x3 at {args.size}x{args.size}, cpu ({env['device_name']}), "
        f"torch {env['torch_version']}, {env['torch_num_threads']} threads, "
        f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}"
    )
    print(
        f"{'round':>5}  {'modelprof b/a':>22}  {'modelprof a2/a':>22}  "
        f"{'utils.benchmark b/a':>20}  {'a2/a':>6}"
    )
    rows = []
    t0 = time.perf_counter()
    for r in range(args.rounds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = compare(models, (3, args.size, args.size), budget_s=args.budget_s, seed=r)
        seq = sequential_ratios(models, x, min_run_time=args.budget_s)
        row = {"round": r + 1}
        for name in ("b", "a2"):
            row[f"modelprof_{name}"] = float(df.loc[name, "latency_x"])
            row[f"modelprof_{name}_ci"] = [
                float(df.loc[name, "latency_x_ci_low"]),
                float(df.loc[name, "latency_x_ci_high"]),
            ]
            row[f"sequential_{name}"] = float(seq[name])
        rows.append(row)
        print(
            f"{r + 1:>5}  {row['modelprof_b']:6.3f} [{row['modelprof_b_ci'][0]:.3f}, "
            f"{row['modelprof_b_ci'][1]:.3f}]  {row['modelprof_a2']:6.3f} "
            f"[{row['modelprof_a2_ci'][0]:.3f}, {row['modelprof_a2_ci'][1]:.3f}]  "
            f"{row['sequential_b']:20.3f}  {row['sequential_a2']:6.3f}",
            flush=True,
        )
    load_after = os.getloadavg()
    ours = [row[f"modelprof_{n}"] for row in rows for n in ("b", "a2")]
    theirs = [row[f"sequential_{n}"] for row in rows for n in ("b", "a2")]
    worst_ours = max(abs(v - 1.0) for v in ours)
    worst_theirs = max(abs(v - 1.0) for v in theirs)
    covered = sum(
        lo <= 1.0 <= hi
        for row in rows
        for n in ("b", "a2")
        for lo, hi in [row[f"modelprof_{n}_ci"]]
    )
    ok = worst_ours <= TOLERANCE
    summary = {
        "rounds": args.rounds,
        "budget_s_per_model": args.budget_s,
        "modelprof_range": [min(ours), max(ours)],
        "modelprof_worst_abs_dev": worst_ours,
        "sequential_range": [min(theirs), max(theirs)],
        "sequential_worst_abs_dev": worst_theirs,
        "modelprof_ci_covers_1": f"{covered}/{len(ours)}",
        "within_tolerance": ok,
        "tolerance": TOLERANCE,
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "wall_s": time.perf_counter() - t0,
    }
    print(
        f"modelprof latency_x: {min(ours):.3f} .. {max(ours):.3f} (worst |x-1| "
        f"{worst_ours:.3f}; interval covers 1.0 in {covered}/{len(ours)}); "
        f"torch.utils.benchmark sequential: {min(theirs):.3f} .. {max(theirs):.3f} "
        f"(worst {worst_theirs:.3f})"
    )
    print(
        f"every modelprof ratio within 1.00 ± {TOLERANCE:.2f}: {'yes' if ok else 'NO'}; "
        f"load average after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}"
    )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare_stability.json").write_text(
            json.dumps({"summary": summary, "rounds": rows, "env": env}, indent=2)
        )
        lines = [
            "# Identical models compared: modelprof (interleaved) vs sequential",
            "",
            f"resnet18 x3 (same weights) at {args.size}x{args.size}, batch 1, "
            f"{env['device_name']}, torch {env['torch_version']}, "
            f"{env['torch_num_threads']} threads. Load average before "
            f"{load_before[0]:.2f}, after {load_after[0]:.2f}.",
            "",
            "| round | modelprof b/a [95 % CI] | modelprof a2/a [95 % CI] | "
            "sequential b/a | sequential a2/a |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row in rows:
            lines.append(
                f"| {row['round']} | {row['modelprof_b']:.3f} [{row['modelprof_b_ci'][0]:.3f}, "
                f"{row['modelprof_b_ci'][1]:.3f}] | {row['modelprof_a2']:.3f} "
                f"[{row['modelprof_a2_ci'][0]:.3f}, {row['modelprof_a2_ci'][1]:.3f}] | "
                f"{row['sequential_b']:.3f} | {row['sequential_a2']:.3f} |"
            )
        lines += [
            "",
            f"modelprof: {min(ours):.3f} .. {max(ours):.3f}, worst |x - 1| = "
            f"{worst_ours:.3f}, interval covers 1.0 in {covered}/{len(ours)}. "
            f"Sequential torch.utils.benchmark: {min(theirs):.3f} .. {max(theirs):.3f}, "
            f"worst {worst_theirs:.3f}.",
            "",
        ]
        (out / "compare_stability.md").write_text("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
