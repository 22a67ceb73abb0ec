"""A CPU matmul's MFU against a probe of the same product in the same process (one thread, the
CPU-time clock): the probe and the utilization should agree (MFU near 1).

    python benchmarks/cpu_mfu.py [rounds]
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

import modelprof
from modelprof.timing.peaks import probe_peaks


def main(rounds: int = 3, n: int = 512) -> None:
    torch.set_num_threads(1)
    for _ in range(rounds):
        peaks = probe_peaks("cpu", matmul_size=n, budget_s=1.0)
        report = modelprof.profile(
            nn.Linear(n, n, bias=False),
            (n,),
            batch_size=n,
            roofline=peaks,
            clock="cpu",
            repeat=7,
            warmup=2,
            budget_s=3,
        )
        u = report.utilization(peak="probe")
        print(
            f"load {os.getloadavg()[0]:.1f}  probed peak {peaks.peak_flops / 1e9:.1f} GFLOP/s"
            f"  MFU {u.mfu:.3f}"
        )
    print(u.describe())


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
