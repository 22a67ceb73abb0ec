"""What wall/CPU sees of load and what ``competing_cores`` sees, quiet and beside busy loops.

    python3 benchmarks/machine_load.py                 # resnet18, torch's default threads
    python3 benchmarks/machine_load.py --threads 1 --loops 0 1 2

For each count of busy loops (pure-Python spinning processes, started here and stopped after),
times a resnet18 forward with ``measure_latency`` and prints its median, its CPU work, wall/CPU,
``competing_cores`` and ``loaded``. With several intra-op threads the threads spin while one of
them waits for a core, so wall/CPU stays near 1 / threads .. 1 under load while the median grows;
``competing_cores`` (other work's share of the cores, from /proc/stat) is what shows it.
"""

from __future__ import annotations

import argparse
import warnings

import torch
from timing_under_load import spinning


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    ap.add_argument("--loops", type=int, nargs="+", default=[0, 1, 2], help="busy loops per row")
    args = ap.parse_args()

    import torchvision

    from modelprof import measure_latency

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 224, 224)
    print(f"resnet18 1x3x224x224, {torch.get_num_threads()} intra-op thread(s)")
    for loops in args.loops:
        with spinning(loops), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = measure_latency(model, inputs=x)
        share = "n/a" if m.competing_cores is None else f"{m.competing_cores:.2f}"
        print(
            f"{loops} busy loop(s): median {m.median_ms:.1f} ms, CPU work {m.cpu.median_ms:.1f} ms "
            f"({m.cpu_clock}), wall/CPU {m.wall_over_cpu:.2f}, competing_cores {share}, "
            f"loaded {m.loaded}"
        )


if __name__ == "__main__":
    main()
