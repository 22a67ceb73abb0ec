"""The training step's allocator peak against a plain step's on one device state (section 8 of
``gpu_evidence.py`` read 12-15 % apart in two H200 runs): a plain step's peak per iteration, each
beside the memory in use at its reset, before and after ``profile()``, and modelprof's step peak
beside the memory in use at its own reset (recorded by wrapping ``MemoryStats.for_device``).

The first run of this script (third H200 run) found the cause: modelprof's step peak held its
own copy of the model and the parameters' snapshot, 100.6 MB above a plain step's 346.0 MB on
resnet18 at batch 8, while the step's peak above the memory in use when it began agreed (226.7
against 226.1 MB); the reported peak now leaves those out.

    PYTHONPATH=. python3 benchmarks/gpu_step_memory.py --out $OUT     # a CUDA machine
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torchvision

from modelprof import profile
from modelprof.runtime import device as devmod


def plain_steps(net: torch.nn.Module, x: torch.Tensor, iters: int, to_none: bool) -> list[dict]:
    """The seed's step (loss = output sum, SGD): per iteration, the memory in use at the reset,
    the peak, and what is in use after."""
    dev = x.device
    opt = torch.optim.SGD(net.parameters())
    net.zero_grad(set_to_none=True)
    got = []
    for _ in range(iters):
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        net(x).float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=to_none)
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev)
        got.append(
            {
                "base": base,
                "peak": peak,
                "above_base": peak - base,
                "after": torch.cuda.memory_allocated(dev),
            }
        )
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    resets: list[int] = []
    made = devmod.MemoryStats.for_device

    def recording(cls: Any, device: torch.device) -> Any:
        stats = made(device)
        if stats is None:
            return None

        def reset() -> None:
            resets.append(torch.cuda.memory_allocated(device))
            stats.reset_peak()

        return cls(stats.max_allocated, reset)

    devmod.MemoryStats.for_device = classmethod(recording)
    torch.manual_seed(0)
    net = torchvision.models.resnet18().to(dev).train()
    x = torch.randn(8, 3, 224, 224, device=dev)
    rec: dict[str, Any] = {
        "params_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
        "input_bytes": x.numel() * x.element_size(),
        "in_use_at_start": torch.cuda.memory_allocated(dev),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }
    rec["plain_before_profile"] = plain_steps(net, x, 2, True)
    rep = profile(
        net,
        inputs=x,
        device=dev,
        backward=True,
        optimizer=torch.optim.SGD,
        roofline=False,
        budget_s=1.0,
        warmup_s=0.2,
        warn=False,
    )
    peak = rep.training_step.timing.peak_memory_bytes
    rec["modelprof"] = {
        "peak": peak,  # less its copy of the model and its snapshot (step/timing.py)
        "resets": len(resets),
        "in_use_at_last_reset": resets[-1] if resets else None,
        "in_use_with_report": torch.cuda.memory_allocated(dev),
    }
    rec["plain_after_profile"] = plain_steps(net, x, 2, True)
    rec["plain_keeping_grads"] = plain_steps(net, x, 3, False)
    del rep
    rec["in_use_report_gone"] = torch.cuda.memory_allocated(dev)
    rec["plain_report_gone"] = plain_steps(net, x, 2, True)
    text = json.dumps(rec, indent=1)
    Path(args.out, "step_memory.json").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
