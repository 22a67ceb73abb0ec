"""What measuring costs: wall time modelprof needs for a ±1 % median of resnet50 (batch 1) vs the
classic fixed recipe (100 warm-up + 300 samples), in the same run on the device at hand.

    python benchmarks/timer_cost.py [--device cuda] [--precision 0.01] [--threads N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modelprof.runtime.env import collect_env  # noqa: E402
from modelprof.timing import measure_latency  # noqa: E402
from modelprof.timing.sampler import WARMED  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--precision", type=float, default=0.01)
    ap.add_argument(
        "--budget-s",
        type=float,
        default=30.0,
        help="modelprof's sampling budget (the precision normally stops it first)",
    )
    ap.add_argument(
        "--out", default=None, help="also write timer_cost.json and timer_cost.md to this directory"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (default: torch's own choice)",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import torchvision

    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = torchvision.models.resnet50(weights=None).to(dev).eval()
    x = torch.randn(1, 3, 224, 224, device=dev)
    env = collect_env(dev, dtype=torch.float32, batch_size=1)
    load0 = list(os.getloadavg())
    print(
        f"resnet50, batch 1, {dev} ({env.get('device_name')}), torch {env['torch_version']}, "
        f"{env['torch_num_threads']} threads, load average {load0[0]:.2f}"
    )

    WARMED.clear()  # modelprof starts cold: it pays its own full warm-up
    t0 = time.perf_counter()
    adaptive = measure_latency(
        model, x, precision=args.precision, budget_s=args.budget_s, warn=False
    )
    wall_adaptive = time.perf_counter() - t0

    t0 = time.perf_counter()
    classic = measure_latency(model, x, warmup=100, repeat=300, warn=False)
    wall_classic = time.perf_counter() - t0

    diff = adaptive.median_ms / classic.median_ms - 1.0
    print(
        f"modelprof ±{args.precision:.0%}: wall {wall_adaptive:7.2f} s, median "
        f"{adaptive.median_ms:.3f} ms (CI ±{adaptive.relative_ci:.2%}), {adaptive.warmup} "
        f"warm-up + {adaptive.n} samples, stop={adaptive.stop_reason}"
    )
    print(
        f"classic 100+300:  wall {wall_classic:7.2f} s, median {classic.median_ms:.3f} ms "
        f"(CI ±{classic.relative_ci:.2%}), 100 warm-up + 300 samples"
    )
    print(
        f"ratio of wall times (classic / modelprof): {wall_classic / wall_adaptive:.1f}x; "
        f"medians differ by {diff:+.2%}"
    )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        cmd = " ".join(
            ["python benchmarks/timer_cost.py", *(argv if argv is not None else sys.argv[1:])]
        )
        (out / "timer_cost.json").write_text(
            json.dumps(
                {
                    "device": str(dev),
                    "env": env,
                    "command": cmd,
                    "load_average_at_start": load0,
                    "modelprof": {"wall_s": wall_adaptive, **adaptive.to_dict(samples=False)},
                    "classic": {"wall_s": wall_classic, **classic.to_dict(samples=False)},
                    "wall_ratio": wall_classic / wall_adaptive,
                    "median_diff": diff,
                },
                indent=1,
            )
        )
        (out / "timer_cost.md").write_text(
            "\n".join(
                [
                    f"# Cost of measuring: resnet50, batch 1, {env.get('device_name')}",
                    "",
                    f"torch {env['torch_version']}, {env['torch_num_threads']} threads, load average "
                    f"{load0[0]:.2f} at start, `{cmd}`",
                    "",
                    "| recipe | wall (s) | median (ms) | CI of median | warm-up + samples | stop |",
                    "| --- | ---: | ---: | ---: | --- | --- |",
                    f"| modelprof ±{args.precision:.0%} | {wall_adaptive:.2f} | "
                    f"{adaptive.median_ms:.3f} | "
                    f"±{adaptive.relative_ci:.2%} | {adaptive.warmup} + {adaptive.n} | "
                    f"{adaptive.stop_reason} |",
                    f"| classic 100 + 300 | {wall_classic:.2f} | {classic.median_ms:.3f} | "
                    f"±{classic.relative_ci:.2%} | 100 + 300 | repeat |",
                    "",
                    f"classic / modelprof wall time: **{wall_classic / wall_adaptive:.1f}x**; "
                    f"medians differ by {diff:+.2%}.",
                    "",
                ]
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
