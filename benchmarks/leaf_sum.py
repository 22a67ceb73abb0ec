"""Do the corrected leaf times add up to the plain pass? 200 ``Linear(16, 16)`` on the CPU.

    python benchmarks/leaf_sum.py [--runs 6] [--heap 3000000] [--gc-on]

Each run profiles the model (``repeat=200``) and prints, from the same run, the median over
passes of the corrected leaf spans' sum over the median plain pass (interleaved with the
instrumented ones): 1.00 means the leaf rows add up to the clean forward. The README's bound is
±10 %. ``--heap N`` keeps N small Python objects alive first (a test process's heap, where a
cyclic collection costs tens of ms); ``--gc-on`` leaves the collector running during the passes
(neither paused nor collected between blocks), to show what pausing it changes. The clocks read
thread CPU time, as in the test: time spent descheduled then enters neither kind of pass.
``coverage`` is the report's: the displayed per-leaf medians' sum over the reported end-to-end
median (the clean runs'; each leaf median leaves out its own tail).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import types
import warnings

import numpy as np
import torch
from torch import nn

import modelprof.timing.clock as clock_module
import modelprof.timing.layers as layers_module
from modelprof import profile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--heap", type=int, default=0, help="small objects kept alive first")
    ap.add_argument("--gc-on", action="store_true", help="do not pause the collector")
    args = ap.parse_args()
    fake = types.SimpleNamespace(
        **{k: getattr(time, k) for k in dir(time) if not k.startswith("_")}
    )
    fake.perf_counter_ns = time.thread_time_ns
    clock_module.time = fake
    layers_module.time = fake
    if args.gc_on:  # the collector left running: nothing to pause, nothing to collect
        layers_module.gc_paused = lambda: contextlib.nullcontext(lambda: None)
    heap = [{"a": [i], "b": (i,)} for i in range(args.heap)]
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(200))).eval()
    x = torch.randn(1, 16)
    print(
        f"torch {torch.__version__}, heap {len(heap)} objects, collector "
        f"{'on' if args.gc_on else 'paused'} during the passes"
    )
    ratios = []
    for _ in range(args.runs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = profile(model, inputs=x, repeat=200, warmup=5, roofline=False)
        lt = report.layer_timing
        top = [k for k, p in lt.parents.items() if p == ("", 1)]
        plain = float(np.median(lt.plain_ms))
        ratio = float(np.median(np.sum([lt.samples[k] for k in top], axis=0))) / plain
        ratios.append(ratio)
        raw_leaves = np.median(np.sum([lt.raw_samples[k] for k in top], axis=0)) / plain
        root = np.median(lt.samples[("", 1)]) / plain
        print(
            f"leaf sum / plain pass {ratio:.3f}   hook cost {lt.hook_cost.per_call_ms * 1e3:.2f} "
            f"us/call ({lt.hook_cost.self_ms * 1e3:.2f} inside a span)   instrumented / plain "
            f"{np.median(lt.passes_ms) / plain:.3f}   raw leaf sum / plain {raw_leaves:.3f}   "
            f"corrected root / plain {root:.3f}   coverage {report.coverage:.3f}"
        )
    print(f"range {min(ratios):.3f}..{max(ratios):.3f} over {len(ratios)} runs")


if __name__ == "__main__":
    main()
