"""The GPU timing issue's sections of ``gpu_evidence.py`` (they run first): kernel time per layer
against oracles and against the profiler without hooks, the seed's loop interleaved with the
latency mode, the stop rule's wall time and reason, the instrument's cost per call.

In a dry run (the CPU, CUDA faked) the same code runs on the CPU's op time: a ``_sleep`` layer is
a host spin there (no op), so only the identities (exact sums, the op-order map) are asserted.
"""

from __future__ import annotations

import csv
import time
from typing import Any

import numpy as np
import torch
from gpu_evidence import ROOT, Ctx, Outcome, Section
from gpu_sections import _on, _rel, seed_recipe, vision
from torch import nn

from modelprof import measure_latency
from modelprof.runtime.compat import fast_range, profiler_events
from modelprof.runtime.device import device_synchronize
from modelprof.runtime.inputs import make_inputs
from modelprof.timing.calibration import calibrate_cuda_sleep, sleep_model
from modelprof.timing.kernels import PASS_RANGE, KernelTiming, read_passes, time_kernels

__all__ = ["KERNEL_SECTIONS"]

CUPTI_CSV = ROOT / "reports" / "validation" / "cuda-nvidia-h200"


class TinyAdds(nn.Module):
    """300 one-element adds: a layer whose GPU work is far shorter than its launches."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x[:1]
        for _ in range(300):
            y = y + 1
        return x + y.sum() * 0


def _passes(ctx: Ctx) -> int:
    return 3 if ctx.dry else 10


def sec_oracles(ctx: Ctx, o: Outcome) -> None:
    """``_sleep`` layers read back within 1 % and not launch-bound; 300 tiny adds launch-bound."""
    cpm = calibrate_cuda_sleep(ctx.dev) if not ctx.dry else 1.0e6
    ms = (0.5, 1.0, 2.0)
    model = nn.Sequential(sleep_model(ms, cpm), TinyAdds()).to(ctx.dev)
    mi = make_inputs(model, (4,), device=ctx.dev)
    kt = time_kernels(model, mi, repeat=_passes(ctx), warmup=2)
    m = kt.medians()
    where = {k: i for i, k in enumerate(kt.order)}
    bound = set(kt.launch_bound_calls())
    for j, want in enumerate(ms):
        key = (f"0.{j}", 1)
        got = float(m["kernel"][where[key]])
        o.check(
            f"_sleep layer {j} ({want:g} ms): kernel_ms within 1 %, not launch-bound",
            _rel(got, want) <= 0.01 and key not in bound,
            "within 1 %",
            kernel_ms=got,
            idle_ms=float(m["idle"][where[key]]),
            host_ms=float(m["host"][where[key]]),
        )
    i = where[("1", 1)]
    o.check(
        "300 tiny adds: launch-bound, host_ms >= 2x kernel_ms",
        ("1", 1) in bound and m["host"][i] >= 2 * m["kernel"][i],
        "launch-bound and host >= 2x kernels",
        kernel_ms=float(m["kernel"][i]),
        idle_ms=float(m["idle"][i]),
        host_ms=float(m["host"][i]),
        launches=float(m["kernels"][i]),
    )
    o.info["oracle_instrument_us_per_call"] = kt.instrument_ms * 1e3
    # the backward's kernels run on the autograd thread, outside every range: charged through
    # their nodes' sequence numbers to the forward calls that made them
    width, batch = (64, 8) if ctx.dry else (2048, 256)
    net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).to(ctx.dev)
    bk = time_kernels(
        net,
        make_inputs(net, (width,), batch_size=batch, device=ctx.dev),
        repeat=_passes(ctx),
        warmup=1,
        backward=True,
    )
    bwd = bk.backward_kernel_ms()
    calls = bwd[("0", 1)] + bwd[("1", 1)] + bwd[("2", 1)]
    o.check(
        "backward kernels charged to the forward calls (sequence numbers): most of the root's",
        bwd[("", 1)] > 0 and calls >= 0.9 * bwd[("", 1)] and bwd[("0", 1)] > bwd[("1", 1)],
        "the three calls hold >= 90 % of the backward, the linear more than the relu",
        root_backward_ms=bwd[("", 1)],
        linear0_ms=bwd[("0", 1)],
        relu_ms=bwd[("1", 1)],
        linear2_ms=bwd[("2", 1)],
    )


def plain_kernel_ms(ctx: Ctx, model: nn.Module, x: torch.Tensor, passes: int) -> list[list[float]]:
    """Profiled passes of ``model`` without hooks: each pass's device activities' durations
    (ms) in the order the device started them (the CPU's outermost ops in a dry run)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if not ctx.dry:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.no_grad():
        model(x)
        device_synchronize(ctx.dev)
        with torch.profiler.profile(activities=acts) as prof:
            for p in range(passes + 1):
                with fast_range(f"{PASS_RANGE}{p}"):
                    model(x)
                device_synchronize(ctx.dev)
    got = read_passes(profiler_events(prof), 0, gpu=not ctx.dry)
    return [got[p][0].durations_ms for p in sorted(got) if p > 0]


def op_order_map(kt: KernelTiming, plain: list[list[float]]) -> np.ndarray | None:
    """Each call's inclusive device time from the hook-free passes, the activities charged by
    the hooked pass's op order (None where the sequences differ in length)."""
    n = len(kt.order)
    if not plain or any(len(p) != len(kt.owners) for p in plain):
        return None
    durations = np.median(np.array(plain), axis=0)
    own = np.zeros(n + 1)
    for owner, d in zip(kt.owners, durations):
        own[owner] += d
    return kt._tree(own[None, :])[0]


def _cupti_column(name: str) -> dict[tuple[str, int], float]:
    path = CUPTI_CSV / f"cupti_vs_events_{name}.csv"
    if not path.exists():
        return {}
    return {
        (r["layer"], int(r["call"])): float(r["kernels_ms"]) for r in csv.DictReader(path.open())
    }


def _model_case(ctx: Ctx, o: Outcome, name: str, batch: int) -> None:
    model, size = vision(ctx, name)
    x = _on(ctx, model, size, batch)
    t0 = time.perf_counter()
    kt = time_kernels(model, make_inputs(model, inputs=x), repeat=_passes(ctx), warmup=3)
    wall = time.perf_counter() - t0
    m = kt.medians()
    n = len(kt.order)
    inner = {p for p in kt.parent_index if p is not None}
    leaves = sum(m["kernel"][i] for i in range(n) if i not in inner)
    selfs = sum(m["kernel_self"][i] for i in inner)
    children_ok = all(
        m["kernel"][p] + 1e-12 >= m["kernel"][i]
        for i, p in enumerate(kt.parent_index)
        if p is not None
    )
    tag = f"{name} batch {batch}"
    o.check(
        f"{tag}: leaf + (self) kernel_ms add up to the root exactly; no parent below a child",
        abs(leaves + selfs - m["kernel"][0]) <= 1e-9 * max(1.0, m["kernel"][0]) and children_ok,
        "exact",
        exact=True,
        root_kernel_ms=float(m["kernel"][0]),
        leaves_plus_self_ms=float(leaves + selfs),
    )
    timeline = float(m["kernel"][0] + m["idle"][0])
    o.info[f"{tag}"] = {
        "root_kernel_ms": float(m["kernel"][0]),
        "root_idle_ms": float(m["idle"][0]),
        "root_timeline_ms": timeline,
        "pass_wall_ms": float(np.median(kt.passes_ms)),
        "plain_wall_ms": float(np.median(kt.plain_ms)),
        "instrument_us_per_call": kt.instrument_ms * 1e3,
        "outside_ms": kt.outside_ms,
        "launch_bound_leaves": len(kt.launch_bound_calls()),
        "calls": n,
        "wall_s": wall,
    }
    mapped = op_order_map(kt, plain_kernel_ms(ctx, model, x, _passes(ctx)))
    o.check(
        f"{tag}: the device runs the same activities with and without the hooks",
        mapped is not None,
        "same count, mapped by op order",
        exact=True,
        activities=len(kt.owners),
    )
    if mapped is not None:
        big = [i for i in range(n) if mapped[i] > 0.05]
        errs = [_rel(m["kernel"][i], mapped[i]) for i in big]
        o.check(
            f"{tag}: per-module kernel_ms vs a profiler-only pass without hooks (op order)",
            bool(errs) and max(errs) <= 0.03,
            "within 3 % on every module > 50 us",
            exact=False,
            modules=len(big),
            median_err_pct=100 * float(np.median(errs)) if errs else None,
            worst_err_pct=100 * float(max(errs)) if errs else None,
        )
    cupti = _cupti_column(name) if not ctx.dry and batch == 16 else {}
    if cupti:
        where = {k: i for i, k in enumerate(kt.order)}
        keys = [k for k in cupti if k in where and cupti[k] > 0.05]
        errs = [_rel(m["kernel"][where[k]], cupti[k]) for k in keys]
        o.check(
            f"{tag}: kernel_ms vs the committed CUPTI column (first H200 run)",
            bool(errs) and float(np.median(errs)) <= 0.05,
            "median within 5 % (modules > 50 us)",
            modules=len(keys),
            within_5pct=sum(e <= 0.05 for e in errs),
            median_err_pct=100 * float(np.median(errs)) if errs else None,
            worst_err_pct=100 * float(max(errs)) if errs else None,
        )
    rows = ["layer,call,kernel_ms,kernel_self_ms,idle_ms,host_ms,kernels,launch_bound"]
    bound = set(kt.launch_bound_calls())
    for i, k in enumerate(kt.order):
        rows.append(
            f"{k[0]},{k[1]},{m['kernel'][i]:.5f},{m['kernel_self'][i]:.5f},{m['idle'][i]:.5f},"
            f"{m['host'][i]:.5f},{m['kernels'][i]:g},{k in bound}"
        )
    (ctx.val_dir / f"kernels_{name}_b{batch}.csv").write_text("\n".join(rows) + "\n")


def sec_models(ctx: Ctx, o: Outcome) -> None:
    """resnet50 at batch 1 and 16, vit_b_16 at 16: exact sums, the op-order map, CUPTI."""
    big = 2 if ctx.dry else 16
    for name, batch in (("resnet50", 1), ("resnet50", big), ("vit_b_16", big)):
        _model_case(ctx, o, name, batch)


def _paired_rounds(
    ctx: Ctx, model: nn.Module, x: torch.Tensor, rounds: int, per: int
) -> tuple[list[float], list[float]]:
    """``rounds`` short rounds of ``per`` calls, the seed's loop and the latency mode in each,
    which goes first alternating: a host whose speed drifts over a minute (the second run read
    4.3-6.5 ms on one launch-bound model) moves both halves of a round alike, and the per-round
    ratios cancel it where two medians over minutes cannot."""
    seeds, ours = [], []
    with torch.no_grad():
        for r in range(rounds):
            for first in (0, 1) if r % 2 == 0 else (1, 0):
                if first == 0:
                    seeds.append(seed_recipe(model, x, ctx.dev, warmup=5, samples=per)["median_ms"])
                else:
                    m = measure_latency(model, x, warn=False, warmup=5, repeat=per)
                    ours.append(m.median_ms)
    return seeds, ours


def sec_seed_agreement(ctx: Ctx, o: Outcome) -> None:
    """The latency mode against the seed's loop, in short paired rounds on one warm GPU
    (resnet50 at batch 1, launch-bound, and at batch 16); the pipelined time beside it; the
    default stop rule's wall time and reason."""
    model, size = vision(ctx, "resnet50")
    x = _on(ctx, model, size, 1)
    if ctx.dry:
        m = measure_latency(model, x, warn=False, warmup=1, repeat=5)
        o.notes.append("the seed loop needs CUDA events: GPU run only")
        ours = [m.median_ms]
    else:
        for batch in (1, 16):
            xb = x if batch == 1 else _on(ctx, model, size, batch)
            seeds, ours_b = _paired_rounds(ctx, model, xb, rounds=24, per=25)
            ratios = np.array(ours_b) / np.array(seeds)
            lo, hi = np.percentile(ratios, [2.5, 97.5])
            ratio = float(np.median(ratios))
            o.check(
                f"resnet50 batch {batch}: latency mode vs the seed's loop, median of paired "
                "per-round ratios",
                abs(ratio - 1) <= 0.02,
                "within 2 %",
                ratio=ratio,
                round_ratios_2p5_97p5=[float(lo), float(hi)],
                seed_median_ms=float(np.median(seeds)),
                modelprof_median_ms=float(np.median(ours_b)),
                seed_round_medians_ms=[float(v) for v in seeds],
                modelprof_round_medians_ms=[float(v) for v in ours_b],
                rounds=len(ratios),
            )
            if batch == 1:
                ours = ours_b
    p = measure_latency(model, x, warn=False, latency_mode="pipelined", **ctx.timing(1.0))
    o.info["pipelined"] = {
        "median_ms": p.median_ms,
        "calls_per_sample": p.env.get("calls_per_sample"),
        "fps": p.fps,
        "latency_median_ms": float(np.median(ours)),
    }
    if ctx.dry:
        return
    from modelprof import profile

    rep = profile(model, inputs=x, roofline=False, budget_s=1.0, warmup_s=0.2, warn=False)
    o.info["profile_summary"] = rep.summary()
    df = rep.to_dataframe()
    o.check(
        "profile() on CUDA: kernel columns; the root's latency share is 100 %",
        "kernel_ms" in df.columns and abs(float(df.latency_pct.iloc[0]) - 100.0) < 1e-9,
        "columns there, root 100 %",
        exact=True,
        pipelined_ms=getattr(rep.pipelined, "median_ms", None),
    )
    seed = seed_recipe(model, x, ctx.dev)  # the fixed recipe: 100 warm-up, 300 samples
    t0 = time.perf_counter()
    m = measure_latency(model, x, warn=False)
    wall = time.perf_counter() - t0
    limit = 1.2 if m.stop_reason == "precision" else 0.6
    o.check(
        "default stop rule: wall time against the seed's fixed recipe",
        wall <= limit * seed["wall_s"],
        f"<= {limit}x (stop={m.stop_reason})",
        modelprof_wall_s=wall,
        seed_wall_s=seed["wall_s"],
        ratio=wall / seed["wall_s"],
        stop=m.stop_reason,
        n=m.n,
        ci_pct=100 * m.relative_ci if m.has_interval else None,
        median_ms=m.median_ms,
        seed_median_ms=seed["median_ms"],
    )
    from modelprof.runtime.execution import RunMode
    from modelprof.timing.helps import what_helps
    from modelprof.timing.options import TimingOptions

    result, left = what_helps(
        model,
        make_inputs(model, inputs=x),
        RunMode(),
        TimingOptions.parse(budget_s=2.0, warmup_s=0.2),
        variants=("cuda_graph",),  # compile's first call takes minutes of this run
    )
    if result is not None:
        ratio, lo, hi = result.ratios["cuda_graph"]
        o.check(
            "resnet50 batch 1 (launch-bound): what_helps times a CUDA graph faster than eager",
            hi < 1.0,
            "ratio's upper bound < 1",
            ratio=ratio,
            low=lo,
            high=hi,
            rounds=result.rounds,
        )
    else:
        o.check("what_helps: a CUDA graph of resnet50 was captured", False, "captured", why=left)
    clocks = m.sm_clock_mhz
    o.check(
        "the stop rule's run: the SM clock read after every block",
        clocks is not None and clocks.size == m.n_blocks,
        "one reading per block (pynvml)",
        exact=True,
        n_blocks=m.n_blocks,
        sm_clock_mhz=None if clocks is None else clocks.tolist(),
        moved_pct=None if m.sm_clock_moved is None else 100 * m.sm_clock_moved,
        clock_moved=m.clock_moved,
    )
    o.info["stop_rule_samples"] = {
        "samples_ms": [float(v) for v in m.samples_ms[:2000]],
        "blocks": [int(b) for b in (m.blocks[:2000] if m.blocks is not None else [])],
    }


def sec_compile(ctx: Ctx, o: Outcome) -> None:
    """``what_helps`` with ``torch.compile`` (reduce-overhead) beside a CUDA graph on a
    launch-bound model (resnet18 at batch 1), interleaved with eager on CUDA events; the whole
    call's wall time, compiling included."""
    if ctx.dry:
        o.notes.append("torch.compile on CUDA: GPU run only")
        return
    from modelprof.runtime.execution import RunMode
    from modelprof.timing.helps import helps_note, what_helps
    from modelprof.timing.options import TimingOptions

    model, size = vision(ctx, "resnet18")
    x = _on(ctx, model, size, 1)
    t0 = time.perf_counter()
    result, left = what_helps(
        model,
        make_inputs(model, inputs=x),
        RunMode(),
        TimingOptions.parse(budget_s=2.0, warmup_s=0.2),
        variants=("cuda_graph", "compile"),
    )
    o.info["note"] = helps_note(result, left)
    ratios = result.ratios if result is not None else {}
    ratio, lo, hi = ratios.get("compile", (None, None, None))
    o.check(
        "resnet18 batch 1 (launch-bound): what_helps compiles it and times it faster than eager",
        hi is not None and hi < 1.0,
        "compiled; the ratio's upper bound < 1",
        ratio=ratio,
        low=lo,
        high=hi,
        cuda_graph=ratios.get("cuda_graph"),
        left_out=left,
        wall_s=time.perf_counter() - t0,
    )


KERNEL_SECTIONS: list[Any] = [
    Section("K1", "kernel time: _sleep and tiny-add oracle layers", 25, 30, sec_oracles),
    Section("K2", "kernel time per layer: sums, op-order map, CUPTI column", 60, 60, sec_models),
    Section(
        "K3", "latency mode vs the seed loop; pipelined; stop rule", 60, 40, sec_seed_agreement
    ),
    Section("K4", "what_helps with torch.compile on CUDA", 120, 10, sec_compile),
]
