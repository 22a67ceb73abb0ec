"""What keeping the user's inputs as they went in costs (``modelprof.runtime.snapshot``).

    python benchmarks/snapshot_cost.py [--rounds 41]

For ordinary inputs (a forward that writes none of them) ``profile`` runs nothing between its
timed passes (``Snapshot.between_passes()`` is None, checked in tests/test_users_things.py): the
cost is one-off, a copy of the inputs when the snapshot is taken, one comparison after the first
pass and one at the end. This prints those one-off costs for image batches and a HuggingFace
cache, beside one forward of resnet18 on the same batch (the cheapest pass a profile runs), and
the quick ``reset()`` that ``compare`` runs before each pass (outside the timed span). Medians of
``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from modelprof.runtime.snapshot import Snapshot


def median_ms(fn, rounds: int) -> float:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(out))


def one_off(inputs, rounds: int) -> tuple[float, float]:
    """(snapshot + the check after the first pass + the check at the end, one reset) in ms."""

    def whole() -> None:
        snap = Snapshot(inputs)
        snap.between_passes()
        snap.restore()

    snap = Snapshot(inputs)
    return median_ms(whole, rounds), median_ms(snap.reset, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    args = parser.parse_args()
    torch.manual_seed(0)
    import torchvision

    net = torchvision.models.resnet18(weights=None).eval()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"median of {args.rounds} rounds"
    )
    print("| inputs | bytes | snapshot + 2 checks (ms) | reset (us) | resnet18 forward (ms) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for batch in (1, 8, 32):
        x = torch.randn(batch, 3, 224, 224)
        whole, reset = one_off(x, args.rounds)
        with torch.no_grad():
            fwd = median_ms(lambda: net(x), max(5, args.rounds // 4))
        print(
            f"| image batch {batch} | {x.numel() * 4:,} | {whole:.3f} | {reset * 1e3:.1f} "
            f"| {fwd:.1f} |"
        )
    try:
        import transformers
    except ImportError:
        return
    cfg = transformers.GPT2Config(
        n_layer=12,
        n_embd=768,
        n_head=12,
        vocab_size=1000,
        n_positions=1024,
        bos_token_id=0,
        eos_token_id=0,
    )
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        cache = lm(torch.randint(0, 1000, (1, 512)), use_cache=True).past_key_values
    inputs = {"input_ids": torch.randint(0, 1000, (1, 1)), "past_key_values": cache}
    nbytes = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    whole, reset = one_off(inputs, args.rounds)
    print(
        f"| GPT-2 (12 layers) cache of 512 tokens | {nbytes:,} | {whole:.3f} "
        f"| {reset * 1e3:.1f} | |"
    )


if __name__ == "__main__":
    main()
