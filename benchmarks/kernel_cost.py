"""What the per-layer instruments cost on the CPU, as ratios against plain runs in this process.

    python3 benchmarks/kernel_cost.py            # chain of 183 one-op modules; resnet50 at 224
    python3 benchmarks/kernel_cost.py --quick    # resnet50 at 64 px, fewer passes

1. ``per_layer="kernels"``' hooks and ranges under the profiler, over the profiler alone: a chain
   of 183 one-op modules, passes alternated (profiler alone, then hooked), µs per module call
   from the medians (the GPU timing issue's bound: <= 8 µs).
2. resnet50: the default CPU instrument's hooked pass over a plain pass (``time_layers``' own
   interleaved plain passes, ``LayerTiming.overhead``; bound <= 1.05x), and the kernels run's
   hooked pass over its plain pass, both under the profiler.

One intra-op thread (``torch.set_num_threads(1)``), so that a second core's load does not reach
the ops unevenly.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modelprof.runtime.compat import fast_range  # noqa: E402
from modelprof.runtime.inputs import make_inputs  # noqa: E402
from modelprof.timing import time_layers  # noqa: E402
from modelprof.timing.kernels import time_kernels  # noqa: E402


class AddOne(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def chain_cost(calls: int = 183, passes: int = 200) -> dict[str, float]:
    """µs per module call that the hooks and ranges add over the profiler alone."""
    chain = nn.Sequential(*(AddOne() for _ in range(calls - 1)))  # + the Sequential: `calls`
    x = torch.zeros(8)
    stack: list = []

    def pre(m, a):
        r = fast_range("modelprof.call:0")
        r.__enter__()
        stack.append(r)

    def post(m, a, o):
        stack.pop().__exit__(None, None, None)

    plain, hooked = [], []
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        for _ in range(passes):
            t0 = time.perf_counter_ns()
            chain(x)
            plain.append(time.perf_counter_ns() - t0)
            handles = [m.register_forward_pre_hook(pre) for m in chain.modules()]
            handles += [m.register_forward_hook(post) for m in chain.modules()]
            t0 = time.perf_counter_ns()
            chain(x)
            hooked.append(time.perf_counter_ns() - t0)
            for h in handles:
                h.remove()
    per_call = (np.median(hooked) - np.median(plain)) / calls / 1e3
    return {
        "plain_pass_us": float(np.median(plain)) / 1e3,
        "hooked_pass_us": float(np.median(hooked)) / 1e3,
        "us_per_call": float(per_call),
    }


def resnet_cost(size: int, passes: int) -> dict[str, float]:
    import torchvision

    model = torchvision.models.resnet50().eval()
    mi = make_inputs(model, (3, size, size))
    lt = time_layers(model, mi, repeat=passes, warmup=2, warn=False, memory_stats=False)
    kt = time_kernels(model, mi, repeat=passes, warmup=2)
    return {
        "stamps_over_plain": lt.overhead(),
        "kernels_over_plain_under_profiler": float(np.median(kt.passes_ms))
        / float(np.median(kt.plain_ms)),
        "kernels_instrument_us_per_call": kt.instrument_ms * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    c = chain_cost(passes=50 if args.quick else 200)
    print(
        f"chain of 183 one-op modules under the profiler: plain {c['plain_pass_us']:.0f} us, "
        f"hooks + ranges {c['hooked_pass_us']:.0f} us: {c['us_per_call']:.2f} us per call "
        "(bound 8)"
    )
    size, passes = (64, 5) if args.quick else (224, 12)
    r = resnet_cost(size, passes)
    print(
        f"resnet50 at {size}px: stamps (CPU default) {r['stamps_over_plain']:.3f}x a plain pass "
        f"(bound 1.05); kernels {r['kernels_over_plain_under_profiler']:.3f}x a plain pass under "
        f"the profiler, {r['kernels_instrument_us_per_call']:.1f} us per call"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
