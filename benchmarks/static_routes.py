"""The two routes of a counting-only CPU profile on models beyond static_speed.py's two.

    python benchmarks/static_routes.py [--reps 9] [--threads 1] [--no-table]

For each model, interleaved in rounds in one process: a bare ``torch.no_grad()`` forward,
``profile(model, inputs=..., timing=False)`` as it runs by default (the first profile of a
fresh process: the meta-output table emptied and the model's fall-back memory forgotten before
each call, so a model the meta route cannot count pays its failed attempt every time), the
same profile repeated on the same model (the table warm; a model that fell back goes straight
to the real kernels), and the real kernels alone (``MODELPROF_STATIC_ROUTE=real``). Printed:
each one's median and its paired ratio to the bare forward (trimmed mean of the per-round log
ratios, 95 % interval), and which route the default took. The models: a detector whose
non-maximum suppression has no meta kernel (the fall-back case), and language models from
``transformers`` configs (random weights, nothing downloaded) from small, where the CPU's
kernels are cheap, to larger.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import numpy as np
import torch

from modelprof import profile
from modelprof.counting import meta_cache, meta_route
from modelprof.timing.stats import paired_ratio


def _models():
    import torchvision
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    det = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None).eval()
    yield "fasterrcnn_mobilenet_v3_large_320_fpn 320px", det, ([torch.rand(3, 320, 320)],)
    ids = {"input_ids": torch.randint(0, 1000, (1, 128))}
    yield "gpt2 4 layers x 256, 128 tokens", GPT2LMHeadModel(
        GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1000)).eval(), ids
    for layers, width, tokens in ((4, 256, 128), (8, 1024, 256)):
        cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=width,
                          intermediate_size=width * 11 // 4, num_attention_heads=width // 64,
                          num_key_value_heads=width // 128, vocab_size=1000)
        yield (f"llama {layers} layers x {width}, {tokens} tokens",
               LlamaForCausalLM(cfg).eval(), {"input_ids": torch.randint(0, 1000, (1, tokens))})


def bench(name: str, model: torch.nn.Module, inputs, reps: int) -> str:
    args, kwargs = (inputs, {}) if isinstance(inputs, tuple) else ((), inputs)

    def bare():
        with torch.no_grad():
            model(*args, **kwargs)

    def first():
        meta_cache.clear()
        meta_route.forget(model)
        return profile(model, inputs=inputs, timing=False)

    def repeat():
        profile(model, inputs=inputs, timing=False)

    def real():
        os.environ[meta_route.ROUTE_ENV] = "real"
        try:
            profile(model, inputs=inputs, timing=False)
        finally:
            del os.environ[meta_route.ROUTE_ENV]

    fns = {"bare": bare, "first": first, "repeat": repeat, "real": real}
    for fn in fns.values():   # warm-up
        fn()
    route = first().env["static_route"]
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for key, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    parts = [f"{name}: bare {statistics.median(times['bare']) * 1e3:.1f} ms"]
    for key, label in (("first", f"default (route {route}), first profile"),
                       ("repeat", "default, repeated"), ("real", "real kernels")):
        r, low, high = paired_ratio(np.array(times[key]), np.array(times["bare"]), 0.95)
        parts.append(f"{label} {statistics.median(times[key]) * 1e3:.1f} ms, / bare {r:.2f} "
                     f"({low:.2f}-{high:.2f})")
    return " | ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    ap.add_argument("--no-table", action="store_true",
                    help="run every meta kernel (counting/meta_cache.py bypassed), to see what "
                         "the table saves")
    args = ap.parse_args()
    if args.no_table:
        from modelprof.counting import counter
        counter.run_meta = lambda func, a, k: func(*a, **k)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, medians of "
          f"{args.reps} rounds; load average before "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for name, model, inputs in _models():
        print(bench(name, model, inputs, args.reps), flush=True)
    print(f"load average after {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
