"""Cost of the static analysis: ``profile(..., timing=False)`` over ``FlopCounterMode``.

    python benchmarks/static_speed.py [--reps 41] [--models resnet50,vit_b_16,llama] [--meta]

Each runs one forward of the same model on the same input, in the same process, interleaved,
on the CPU (batch 1, eval, no_grad): a bare ``torch.no_grad()`` forward, ``FlopCounterMode`` and
modelprof's counting pass (the user's forward on the real kernels). ``llama`` is a small
Llama (transformers; 4 layers of width 256) on 128 tokens, the others torchvision models on
one 224x224 image. Printed: modelprof's ratio to ``FlopCounterMode`` (paired by round, with its
95 % interval), which must stay <= 1.0 (decomposition fallback, higher-order-operator handling,
per-call records and the state guard included), and to the bare forward, the cost on top of
the compute. ``--meta`` adds ``profile(..., device="meta")``. Single-threaded by default
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
from modelprof.timing.stats import paired_ratio

LIMIT = 1.0  # modelprof / FlopCounterMode


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _model(name: str) -> tuple[torch.nn.Module, dict]:
    """The model in eval mode and its inputs (keyword arguments of its forward)."""
    if name == "llama":
        import transformers

        cfg = transformers.LlamaConfig(
            num_hidden_layers=4,
            hidden_size=256,
            intermediate_size=688,
            num_attention_heads=8,
            num_key_value_heads=4,
            vocab_size=1000,
        )
        return (
            transformers.LlamaForCausalLM(cfg).eval(),
            {"input_ids": torch.randint(0, 1000, (1, 128)), "use_cache": False},
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(torchvision.models, name)().eval()
    return model, {"x": torch.randn(1, 3, 224, 224)}


def bench(name: str, reps: int, meta: bool = False) -> tuple[float, str]:
    model, kw = _model(name)

    def bare():
        with torch.no_grad():
            model(**kw)

    def flop_counter():
        with torch.no_grad(), FlopCounterMode(display=False):
            model(**kw)

    def modelprof():
        profile(model, inputs=kw, timing=False)

    def on_meta():  # device="meta": shapes alone, the report says meta
        profile(model, inputs=kw, device="meta", timing=False)

    fns = [("bare", bare), ("flop_counter", flop_counter), ("modelprof", modelprof)]
    if meta:
        fns.append(("meta", on_meta))
    for _, fn in fns:  # warm-up: lazy init, allocator, oneDNN
        fn()
    times: dict[str, list[float]] = {key: [] for key, _ in fns}
    for _ in range(reps):
        for key, fn in fns:
            times[key].append(_time(fn))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}

    def over(a: str, b: str) -> tuple[float, str]:
        # paired: each round's a / b, run back to back (drift cancels); the estimator compare()
        # uses (20 %-trimmed mean of the per-round log ratios, Yuen's interval)
        r, low, high = paired_ratio(np.array(times[a]), np.array(times[b]), 0.95)
        return r, f"{r:.3f} (95 % CI {low:.3f}-{high:.3f})"

    ratio, fc = over("modelprof", "flop_counter")
    line = (
        f"{name:10s} bare forward {med['bare']:8.1f} ms | FlopCounterMode "
        f"{med['flop_counter']:8.1f} ms | modelprof {med['modelprof']:8.1f} ms: "
        f"/ FlopCounterMode = {fc}, / bare = {over('modelprof', 'bare')[1]}"
    )
    if meta:
        line += f" | device='meta' {med['meta']:8.1f} ms, / bare = {over('meta', 'bare')[1]}"
    return ratio, line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    ap.add_argument("--models", default="resnet50,vit_b_16")
    ap.add_argument("--out", default=None, help="also write static_speed.txt to this directory")
    ap.add_argument(
        "--meta", action="store_true", help="also time profile(..., device='meta', timing=False)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines: list[str] = []

    def say(text: str) -> None:
        lines.append(text)
        print(text, flush=True)

    say(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, medians of {args.reps} "
        f"(ratio: trimmed mean of the paired per-round log ratios); load average before "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    ratios = []
    for name in args.models.split(","):
        ratio, line = bench(name, args.reps, args.meta)
        ratios.append(ratio)
        say(line)
    worst = max(ratios)
    say(
        f"worst ratio to FlopCounterMode {worst:.3f} (limit {LIMIT}): "
        f"{'PASS' if worst <= LIMIT else 'FAIL'}; "
        f"load average after {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "static_speed.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
