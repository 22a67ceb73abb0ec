"""What a training step costs, and what profiling its backward costs: resnet50 and a small GPT-2.

    python benchmarks/train_step.py [--budget 3] [--rounds 12] [--per-round 1]
                                    [--models resnet50,gpt2] [--out reports/train_step.md]

For each model (CPU, batch 1 image / batch 2 x 128 tokens, AdamW):

1. ``profile(model, ..., backward=True, optimizer=torch.optim.AdamW)`` — forward, backward and
   optimizer MACs/FLOPs and medians in one table.
2. The overhead of the per-layer backward instrumentation against a *plain* training step written
   by hand (``zero_grad``; forward; loss; ``perf_counter`` around ``loss.backward()``;
   ``opt.step()``), in the same process: rounds of a few plain steps, a few of modelprof's clean
   steps and a few instrumented passes, in shuffled order, so the machine's drift reaches all
   alike. Printed as ratios of medians against the plain backward: instrumented / plain (the
   limit is 1.10) and modelprof's clean backward / plain (should read 1.0: the clean measurement
   adds nothing).

GPT-2 needs ``transformers`` (built from a config, no download); it is skipped without it.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from modelprof import profile
from modelprof.runtime.inputs import make_inputs
from modelprof.step.count import count_step
from modelprof.step.spec import StepSpec
from modelprof.step.timing import StepTimer

LIMIT = 1.10


def resnet50() -> tuple[nn.Module, Any, dict[str, Any]]:
    import torchvision

    return torchvision.models.resnet50(), torch.randn(1, 3, 224, 224), {}


def gpt2_small() -> tuple[nn.Module, Any, dict[str, Any]] | None:
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        n_layer=4, n_embd=256, n_head=4, vocab_size=8000, n_positions=128
    )
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 8000, (2, 128), generator=torch.Generator().manual_seed(0))

    def next_token_loss(out: Any, target: torch.Tensor) -> torch.Tensor:
        logits = out.logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))

    return model, ids, {"loss_fn": next_token_loss, "target": ids}


def plain_backward_ms(
    model: nn.Module, x: Any, loss_of: Callable[[Any], torch.Tensor], opt: torch.optim.Optimizer
) -> float:
    """One hand-written training step; the milliseconds of its ``loss.backward()``."""
    opt.zero_grad(set_to_none=True)
    loss = loss_of(model(x))
    t = time.perf_counter_ns()
    loss.backward()
    ms = (time.perf_counter_ns() - t) / 1e6
    opt.step()
    return ms


def overhead(
    model: nn.Module, x: Any, step: dict[str, Any], rounds: int, per_round: int
) -> tuple[float, float, float]:
    """Medians (ms) of the plain backward, modelprof's clean backward and the instrumented
    one, interleaved round by round."""
    spec = StepSpec.parse(optimizer=torch.optim.AdamW, **step)
    mi = make_inputs(model, inputs=x)
    static, _ = count_step(model, mi, spec)
    plain_model = copy.deepcopy(model).train()
    plain_opt = torch.optim.AdamW(plain_model.parameters())

    def loss_of(out: Any) -> torch.Tensor:
        return spec.loss(out, step.get("target"))

    got: list[list[float]] = [[], [], []]
    with StepTimer(model, mi, spec) as timer:
        inst = timer.instrument(len(static.records))
        arms = [
            lambda: [
                plain_backward_ms(plain_model, x, loss_of, plain_opt) for _ in range(per_round)
            ],
            lambda: list(timer.sample_block(per_round)),  # modelprof's clean steps
            lambda: [inst.one() for _ in range(per_round)],
        ]  # the instrumented passes
        for arm in arms:  # warm every arm up
            arm()
        for _ in range(rounds):
            order = [0, 1, 2]
            random.shuffle(order)
            for which in order:
                got[which].extend(arms[which]())
    plain, clean, instrumented = (statistics.median(g) for g in got)
    return plain, clean, instrumented


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=3.0, help="profile's budget_s")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--per-round", type=int, default=1)
    parser.add_argument(
        "--models", default="resnet50,gpt2", help="comma-separated, of: resnet50, gpt2"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the table (Markdown)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    lines = [
        "| model | forward MACs | backward MACs | backward / forward | AdamW FLOPs | "
        "forward ms | backward ms | optimizer ms | step ms | instrumented / plain "
        "backward | modelprof clean / plain backward |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    worst = 0.0
    chosen = {m.strip() for m in args.models.split(",") if m.strip()}
    for key, name, build in (
        ("resnet50", "resnet50", resnet50),
        ("gpt2", "gpt2 (4x256)", gpt2_small),
    ):
        if key not in chosen:
            continue
        built = build()
        if built is None:
            print(f"{name}: skipped (pip install transformers)", file=sys.stderr)
            continue
        model, x, step = built
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = profile(
                model,
                inputs=x,
                backward=True,
                optimizer=torch.optim.AdamW,
                budget_s=args.budget,
                roofline=False,
                **step,
            )
            plain_ms, clean, inst_ms = overhead(model, x, step, args.rounds, args.per_round)
        t = r.training_step.timing
        worst = max(worst, inst_ms / plain_ms)
        opt = r.training_step.cost.optimizer
        lines.append(
            f"| {name} | {r.totals['macs']:,} | {r.totals['backward_macs']:,} | "
            f"{r.totals['backward_macs'] / r.totals['macs']:.2f} | {opt.flops:,} | "
            f"{t.forward.median_ms:.1f} | {t.backward.median_ms:.1f} | "
            f"{t.optimizer.median_ms:.1f} | "
            f"{t.step.median_ms:.1f} | {inst_ms / plain_ms:.3f} | {clean / plain_ms:.3f} |"
        )
        print(
            f"{name}: plain backward {plain_ms:.1f} ms, instrumented {inst_ms:.1f} ms, "
            f"modelprof clean {clean:.1f} ms ({r.training_step.cost.nodes} autograd nodes)",
            file=sys.stderr,
        )
    table = "\n".join(lines)
    env = (
        f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; the ratios from "
        f"{args.rounds} rounds of {args.per_round} plain steps, {args.per_round} clean "
        f"modelprof steps and {args.per_round} instrumented passes, in shuffled order"
    )
    print(table)
    print(f"\n{env}\nworst instrumented / plain backward: {worst:.3f} (limit {LIMIT})")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            f"# What a training step costs (`benchmarks/train_step.py`)\n\n"
            f"{table}\n\n{env}; worst instrumented / plain backward "
            f"{worst:.3f} (limit {LIMIT}).\n"
        )
    return 0 if worst <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
