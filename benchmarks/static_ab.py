"""The counting pass of this tree against another revision's, paired in one process.

    python benchmarks/static_ab.py [--rev main] [--reps 31] [--models resnet50,vit_b_16]

``--rev``'s ``modelprof/`` is taken with ``git archive`` into a temporary folder and imported as
``modelprof_base`` (its imports renamed), beside this tree's ``modelprof``. Each round runs a
bare ``torch.no_grad()`` forward, ``profile(model, inputs=x, timing=False)`` of both, in a
shuffled order (CPU, batch 1, one thread). Printed: after / before, and each over the bare
forward, as paired ratios (the trimmed mean of the per-round log ratios with its 95 % interval,
as ``compare()`` computes it). ``MODELPROF_STATIC_ROUTE=real`` is set, so that a revision that
had a meta route counts on the real kernels as this tree does.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torchvision

ROOT = Path(__file__).resolve().parents[1]


def _import_base(rev: str, into: Path) -> object:
    """``rev``'s package, imported as ``modelprof_base``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "modelprof"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "modelprof").rename(into / "modelprof_base")
    pattern = re.compile(r"\b(from|import) modelprof\b(?!_)")
    for path in (into / "modelprof_base").rglob("*.py"):
        path.write_text(pattern.sub(r"\1 modelprof_base", path.read_text()))
    sys.path.insert(0, str(into))
    import modelprof_base

    return modelprof_base


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="main")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--models", default="resnet50,vit_b_16")
    args = ap.parse_args()
    os.environ["MODELPROF_STATIC_ROUTE"] = "real"
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    import modelprof
    from modelprof.timing.stats import paired_ratio

    with tempfile.TemporaryDirectory() as tmp:
        base = _import_base(args.rev, Path(tmp))
        print(
            f"torch {torch.__version__}, 1 thread, {args.reps} rounds, before = {args.rev}; "
            f"load average {os.getloadavg()}",
            flush=True,
        )
        for name in args.models.split(","):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = getattr(torchvision.models, name)().eval()
            x = torch.randn(1, 3, 224, 224)

            def bare() -> None:
                with torch.no_grad():
                    model(x)

            fns = {
                "bare": bare,
                "before": lambda: base.profile(model, inputs=x, timing=False),
                "after": lambda: modelprof.profile(model, inputs=x, timing=False),
            }
            for fn in fns.values():  # warm-up
                fn()
            times: dict[str, list[float]] = {k: [] for k in fns}
            order = list(fns)
            rng = random.Random(0)
            for _ in range(args.reps):
                rng.shuffle(order)
                for key in order:
                    t0 = time.perf_counter()
                    fns[key]()
                    times[key].append(time.perf_counter() - t0)

            def ratio(a: str, b: str) -> str:
                r, lo, hi = paired_ratio(np.array(times[a]), np.array(times[b]), 0.95)
                return f"{r:.3f} ({lo:.3f}-{hi:.3f})"

            print(
                f"{name:10s} after / before {ratio('after', 'before')} | before / bare "
                f"{ratio('before', 'bare')} | after / bare {ratio('after', 'bare')}",
                flush=True,
            )
        print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
