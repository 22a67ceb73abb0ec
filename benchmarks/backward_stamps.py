"""What the per-node stamps of the instrumented backward cost, per model: the instrumented /
clean backward median of ``profile(..., backward=True)`` (``training_step.timing.overhead``),
the stamps' measured cost taken off the rows, the corrected instrumented / clean median, and
whether the check against the clean backward flagged it (``training_step.agreement``).

    python benchmarks/backward_stamps.py [--runs 2] [--budget 1.5]

One intra-op thread; both figures come from the same run, so the ratio is the machine's in that
moment, not an absolute duration.
"""

from __future__ import annotations

import argparse
import warnings

import torch
import torchvision

import modelprof


def _models() -> dict:
    mlp = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(6)]
    )
    vit = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=4, num_heads=4, hidden_dim=64, mlp_dim=128
    )
    return {
        "resnet18 (3x64x64)": (torchvision.models.resnet18(), (3, 64, 64)),
        "ViT 4 layers, width 64 (3x32x32)": (vit, (3, 32, 32)),
        "6 x Linear(256)+ReLU (256)": (mlp, (256,)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--budget", type=float, default=1.5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "| model | autograd nodes | clean backward (ms) | instrumented / clean | stamp (us) "
        "| corrected / clean | flagged |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, (model, size) in _models().items():
        for _ in range(args.runs):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = modelprof.profile(model, size, backward=True, budget_s=args.budget)
            t, a = r.training_step.timing, r.training_step.agreement
            c = t.stamp_cost
            applied = c is not None and c.applied
            cost, corrected = (
                (f"{c.per_call_ms * 1e3:.2f}", f"{a.ratio:.3f}") if applied else ("--", "--")
            )
            print(
                f"| {name} | {t.nodes} | {t.backward.median_ms:.3f} | {t.overhead:.3f} | "
                f"{cost} | {corrected} | {'no' if a.agree else a.verdict} |"
            )


if __name__ == "__main__":
    main()
