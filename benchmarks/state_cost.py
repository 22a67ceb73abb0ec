"""Cost of giving the model back as it went in (``modelprof/state.py``) in a timed profile.

    python benchmarks/state_cost.py [--model resnet50] [--pairs 3] [--repeat 30]

Two measurements, in one process, on the CPU (batch 1, eval):

1. **A/B**: the same timed ``profile()`` (fixed ``repeat``/``warmup``, so both do the same
   work) with the state guard and with it replaced by a no-op, interleaved in pairs; the ratio
   of the medians. Honest but noisy: the profile's own run-to-run spread is of the order of
   the effect.
2. **Direct**: what the guard itself adds — building it (snapshot of slots, versions, the
   buffers' copy), restoring (checking every tensor, copying back what changed) and the write
   watch in the static pass (a static pass with and without it, interleaved) — as a share of
   the profile's wall time.

The issue's limit is 5 % of a timed resnet50 profile.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import time
import warnings

import torch
import torchvision

from modelprof import profile
from modelprof.counting.forward import analyze
from modelprof.runtime.guard import StateGuard, preserved_state
from modelprof.runtime.hooks import module_names
from modelprof.runtime.inputs import make_inputs

# the modules themselves: ``modelprof.profile`` as an attribute is the re-exported function
profile_mod = importlib.import_module("modelprof.profile")
static_mod = importlib.import_module("modelprof.counting.forward")


class _NoGuard:
    """Restores nothing; walks the model for what the static pass reads from a guard (without
    a guard, analyze would have to walk it itself)."""

    def __init__(self, model) -> None:
        self.names = module_names(model)
        self.has_children = {m: next(iter(m.children()), None) is not None for m in self.names}
        self.parameters = list(model.parameters())
        self.lazy: list[str] = []
        self.script_attrs: list[dict] = []

    def write_hook(self):
        return None


@contextlib.contextmanager
def _no_state(model, *_, **__):
    yield _NoGuard(model)


@contextlib.contextmanager
def _guard_off():
    """Profile without the guard: both places that take it get a no-op."""
    saved = profile_mod.preserved_state, static_mod.preserved_state
    profile_mod.preserved_state = static_mod.preserved_state = _no_state
    try:
        yield
    finally:
        profile_mod.preserved_state, static_mod.preserved_state = saved


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=30, help="timed samples per profile")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    model = getattr(torchvision.models, args.model)().eval()
    opts = dict(repeat=args.repeat, warmup=5)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.model}, "
        f"profile(repeat={args.repeat}, warmup=5), {args.pairs} interleaved pairs"
    )

    def with_guard() -> None:
        profile(model, (3, 224, 224), **opts)

    def without_guard() -> None:
        with _guard_off():
            profile(model, (3, 224, 224), **opts)

    with_guard()  # warm-up: oneDNN, allocator, the roofline probe's first run
    on, off = [], []
    for i in range(args.pairs):
        pair = [(on, with_guard), (off, without_guard)]
        for times, fn in pair if i % 2 == 0 else pair[::-1]:
            times.append(_seconds(fn))
    med_on, med_off = statistics.median(on), statistics.median(off)
    print(
        f"A/B   profile with guard {med_on:7.3f} s, without {med_off:7.3f} s: "
        f"ratio {med_on / med_off:.4f} ({100 * (med_on / med_off - 1):+.2f} %)  "
        f"[with: {', '.join(f'{t:.2f}' for t in on)}; without: "
        f"{', '.join(f'{t:.2f}' for t in off)}]"
    )

    # the guard's own work, timed directly
    reps = 20
    build = statistics.median(_seconds(lambda: StateGuard(model)) for _ in range(reps))
    guards = [StateGuard(model) for _ in range(reps)]
    restore = statistics.median(_seconds(g.restore) for g in guards)
    mi = make_inputs(model, (3, 224, 224))
    watched, bare = [], []
    for i in range(7):

        def on_() -> None:
            analyze(model, mi)

        def off_() -> None:
            with _guard_off():
                analyze(model, mi)

        pair = [(watched, on_), (bare, off_)]
        for times, fn in pair if i % 2 == 0 else pair[::-1]:
            times.append(_seconds(fn))
    # the static pass with the guard (built, watching writes, restored) minus without it: the
    # write watch is what remains after the separately timed build and restore
    in_static = max(0.0, statistics.median(watched) - statistics.median(bare))
    watch = max(0.0, in_static - build - restore)
    direct = build + restore + watch
    print(
        f"direct: build {build * 1e3:.2f} ms + restore {restore * 1e3:.2f} ms + write watch "
        f"{watch * 1e3:.2f} ms (a static pass with the guard {in_static * 1e3:.2f} ms over "
        f"{statistics.median(bare) * 1e3:.1f} ms without) = {direct * 1e3:.2f} ms = "
        f"{100 * direct / med_off:.3f} % of the profile"
    )
    with preserved_state(model) as guard:
        pass
    copied = sum(
        t.snapshot.numel() * t.snapshot.element_size()
        for t in guard.tracked
        if t.snapshot is not None
    )
    total = sum(t.tensor.numel() * t.tensor.element_size() for t in guard.tracked)
    print(
        f"copied up front: {copied:,} B of {total:,} B of parameters and buffers "
        f"({100 * copied / total:.2f} %)"
    )
    worst = max(direct / med_off, med_on / med_off - 1)
    print(
        f"state restore cost {100 * worst:.2f} % (limit 5 %): {'PASS' if worst <= 0.05 else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
