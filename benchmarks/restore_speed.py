"""What putting a KV cache back between timed passes costs: ``Snapshot.reset`` against a
hand-written rewind, per restore, on a 32-layer cache.

    python benchmarks/restore_speed.py [--rounds 401] [--layers 32] [--context 128]

The reference is the rewind ``generation/cache.py`` wrote by hand before the ``Snapshot`` took
it over: each cache layer's and the cache's attributes put back (a ``DynamicLayer`` rebinds
``keys``/``values`` to the concatenation, so the old tensors are intact) and the 0-d tensors
copied back; it leaves a ``StaticLayer``'s written slot as the step left it (outside the valid
length), where the snapshot puts every written tensor back bit for bit (taken as generation
takes it, ``copy_on_write=True``, the first step watched: a static cache's keys and values are
copied before that step writes them, a dynamic cache's nothing). Each round runs one
decode step's cache writes (``cache.update`` per layer, as the attention does), then times one
restore; the two restores alternate round by round, so a change of the machine's pace reaches
both alike. Medians of ``--rounds`` rounds; ratios are snapshot / reference.

A decode step of a 32-layer tiny Llama is timed too: before, the rewind ran inside every timed
plain pass (after the step); now it runs before each pass, outside the timed span, so what a
timed pass holds is the step alone.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

import numpy as np
import torch
import transformers

from modelprof.runtime.guard import watching_writes
from modelprof.runtime.snapshot import Snapshot


def reference_rewind(cache: Any):
    """The hand-written rewind: every layer's and the cache's ``__dict__`` as now, lists and
    dicts copied, 0-d tensors by value."""
    saved = []
    for obj in [*cache.layers, cache]:
        attrs = dict(vars(obj))
        scalars = [
            (t, t.clone()) for t in attrs.values() if isinstance(t, torch.Tensor) and t.numel() <= 1
        ]
        saved.append((obj, attrs, scalars))

    def restore() -> None:
        for obj, attrs, scalars in saved:
            obj.__dict__.update({k: _shallow(v) for k, v in attrs.items()})
            for t, v in scalars:
                t.copy_(v)

    return restore


def _shallow(value: Any) -> Any:
    return list(value) if type(value) is list else dict(value) if type(value) is dict else value


def _config(layers: int) -> Any:
    """A tiny Llama of ``layers`` layers: 2 KV heads of 16 (hidden 64 over 4 heads)."""
    sizes = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 128}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    return transformers.LlamaConfig(
        num_hidden_layers=layers, max_position_embeddings=4096, **sizes, **heads
    )


def _filled(kind: str, config: Any, context: int) -> Any:
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    if kind == "static":
        cache = transformers.StaticCache(config=config, max_cache_len=context + 1)
    else:
        cache = transformers.DynamicCache(config=config)
    g = torch.Generator().manual_seed(0)
    for layer in range(config.num_hidden_layers):
        kv = [torch.randn(1, heads, context, dim, generator=g) for _ in range(2)]
        cache.update(*kv, layer, {"cache_position": torch.arange(context)})
    return cache


def restore_us(kind: str, config: Any, context: int, rounds: int) -> tuple[float, float, int]:
    """Median microseconds of one restore (reference, snapshot), and the bytes of values the
    snapshot keeps."""
    cache = _filled(kind, config, context)
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    token = [torch.randn(1, heads, 1, dim) for _ in range(2)]
    position = {"cache_position": torch.tensor([context])}
    # as generation takes it: values copied on the first write, by the watched (counted) step
    reference, snap = reference_rewind(cache), Snapshot(cache, copy_on_write=True)
    times: dict[str, list[float]] = {"reference": [], "snapshot": []}
    for r in range(2 * rounds + 2):
        name, restore = ("reference", reference) if r % 2 else ("snapshot", snap.reset)
        with watching_writes(snap) if r == 0 else contextlib.nullcontext():
            for layer in range(config.num_hidden_layers):  # a decode step's cache writes
                cache.update(*token, layer, position)
        t0 = time.perf_counter_ns()
        restore()
        t1 = time.perf_counter_ns()
        assert cache.get_seq_length() == context, "the restore did not take the token out"
        if r >= 2:  # the first of each: warm-up
            times[name].append((t1 - t0) / 1e3)
    return (
        float(np.median(times["reference"])),
        float(np.median(times["snapshot"])),
        snap.copied_bytes,
    )


def decode_step_us(config: Any, context: int, rounds: int) -> float:
    """Median microseconds of one decode step (the forward alone, rewound between steps)."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    cache = _filled("dynamic", config, context)
    snap, ids = Snapshot(cache), torch.tensor([[1]])
    out = []
    with torch.no_grad():
        for r in range(rounds + 1):
            snap.reset()
            t0 = time.perf_counter_ns()
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            t1 = time.perf_counter_ns()
            if r:
                out.append((t1 - t0) / 1e3)
    return float(np.median(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=401)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args()
    config = _config(args.layers)
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads; {args.layers} layers, context {args.context}, "
        f"median of {args.rounds} rounds"
    )
    print(
        "| cache | reference rewind (us) | Snapshot.reset (us) | ratio | values kept (bytes) "
        "| copied up front (bytes) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    dynamic = (0.0, 0.0)
    for kind in ("dynamic", "static"):
        ref, snap, kept = restore_us(kind, config, args.context, args.rounds)
        dynamic = (ref, snap) if kind == "dynamic" else dynamic
        up_front = Snapshot(_filled(kind, config, args.context)).copied_bytes
        print(f"| {kind} | {ref:.1f} | {snap:.1f} | {snap / ref:.2f}x | {kept:,} | {up_front:,} |")
    step = decode_step_us(config, args.context, 21)
    ref, snap = dynamic
    print(f"\ndecode step of a {args.layers}-layer tiny Llama, dynamic cache: {step:.0f} us")
    print("| per timed pass | before (reference rewind) | now (Snapshot) | now / before |")
    print("| --- | ---: | ---: | ---: |")
    print(  # before: the rewind ran after the step inside the timed span; now before it, outside
        f"| timed span (us) | {step + ref:.0f} | {step:.0f} | {step / (step + ref):.4f}x |"
    )
    print(
        f"| wall, pass and rewind (us) | {step + ref:.0f} | {step + snap:.0f} | "
        f"{(step + snap) / (step + ref):.4f}x |"
    )


if __name__ == "__main__":
    main()
