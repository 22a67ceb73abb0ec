"""The sections of ``gpu_evidence.py``, one function per numbered item of issue 22.

Each takes the run's ``Ctx`` and an ``Outcome`` it fills as it goes (checks, figures, notes), and
writes its tables into ``ctx.val_dir`` (validation) or ``ctx.rep_dir`` (reports). In a dry run
(``ctx.dry``) the device is the CPU with CUDA faked (``gpu_fakes.py``) and the models are tiny;
what needs real device memory (pinned buffers, transfers, graphs, the allocator, CUPTI, CuPy) is
replaced by the nearest CPU stand-in or left out with a note.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import gc
import importlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import validate_timer
from gpu_evidence import ROOT, Ctx, Outcome, Section, Skip, verdict
from gpu_fakes import FAKE_CYCLES_PER_MS
from gpu_step_memory import plain_steps
from torch import nn

from modelprof import compare, measure_latency, measure_throughput, profile
from modelprof.runtime.device import device_synchronize
from modelprof.runtime.inputs import make_inputs
from modelprof.timing import time_layers
from modelprof.timing.calibration import calibrate_cuda_sleep
from modelprof.timing.kernels import time_kernels
from modelprof.timing.peaks import Peaks, lookup_peaks, probe_peaks

__all__ = ["SECTIONS"]


# -- models --------------------------------------------------------------------------------------
def vision(ctx: Ctx, name: str) -> tuple[nn.Module, tuple[int, ...]]:
    """A torchvision model (random weights) at 224, or in a dry run a tiny stand-in: a ViT of
    one layer at 32x32, a conv-bn-relu net at 16x16 for the rest."""
    import torchvision

    if not ctx.dry:
        return getattr(torchvision.models, name)(weights=None).eval(), (3, 224, 224)
    if name.startswith("vit"):
        from torchvision.models.vision_transformer import VisionTransformer

        return VisionTransformer(
            image_size=32,
            patch_size=16,
            num_layers=1,
            num_heads=2,
            hidden_dim=32,
            mlp_dim=64,
            num_classes=10,
        ).eval(), (3, 32, 32)
    width = 8 if name == "resnet18" else 12
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, 10),
    ).eval(), (3, 16, 16)


def _on(ctx: Ctx, model: nn.Module, size: tuple[int, ...], batch: int) -> torch.Tensor:
    model.to(ctx.dev)
    return torch.randn(batch, *size, device=ctx.dev)


def _rel(got: float, want: float) -> float:
    return abs(got / want - 1.0)


def _leaves(model: nn.Module) -> dict[nn.Module, str]:
    return {m: n for n, m in model.named_modules() if n and next(m.children(), None) is None}


def _named(model: nn.Module) -> dict[nn.Module, str]:
    """Every module but the root, by name."""
    return {m: n for n, m in model.named_modules() if n}


@contextlib.contextmanager
def _hooks(
    model: nn.Module, pre: Callable[..., Any], post: Callable[..., Any], names: dict[nn.Module, str]
) -> Iterator[None]:
    handles = []
    for m in names:
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# -- 1. the test suite ---------------------------------------------------------------------------
def _pytest(
    args: list[str], cap_s: float, log: Path, label: str, threads: int | None = None
) -> subprocess.Popen:
    """Start pytest on ``args`` with this checkout first on the path, output into ``log``."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rfE",
        "-p",
        "no:cacheprovider",
        "--durations=5",
        *args,
    ]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    f = open(log, "w")  # noqa: SIM115 - closed by _wait
    f.write(
        f"===== {label}: python {' '.join(cmd[1:])} (cap {cap_s:.0f} s"
        + (f", OMP_NUM_THREADS={threads}" if threads else "")
        + ")\n"
    )
    f.flush()
    p = subprocess.Popen(
        cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    p.log_file = f  # type: ignore[attr-defined]
    return p


def _wait(procs: list[subprocess.Popen], cap_s: float) -> list[int | None]:
    """Exit codes (None: killed at the cap); every process group is gone on return."""
    end = time.perf_counter() + cap_s
    codes: list[int | None] = []
    try:
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(end - time.perf_counter(), 0.1)))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            p.log_file.close()  # type: ignore[attr-defined]
    return codes


def _counts(text: str) -> dict[str, int]:
    """passed/failed/skipped/error/deselected counts of pytest's last summary line."""
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", ln)]
    found = re.findall(
        r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)",
        lines[-1] if lines else "",
    )
    out = collections.Counter()
    for n, kind in found:
        out[kind.rstrip("s") if kind.startswith("error") else kind] += int(n)
    return dict(out)


def _collect_log(ctx: Ctx, parts: list[Path]) -> str:
    text = "\n".join(p.read_text(errors="replace") for p in parts)
    log = ctx.val_dir / "pytest.log"
    with open(log, "a") as f:
        f.write(text + "\n")
    for p in parts:
        p.unlink()
    return text


STUB_TESTS = """import pytest


def test_one():
    assert 1 + 1 == 2


def test_two():
    assert sorted([2, 1]) == [1, 2]


@pytest.mark.cuda
@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_cuda():
    pass
"""


def _dry_stub(ctx: Ctx, name: str) -> Path:
    """Dry run: a test file that imports nothing heavy, so the harness (subprocess, cap, log,
    shards, counts) runs in seconds; the suite itself is CI's job."""
    stub = ctx.tree / "stub_tests" / f"test_{name}.py"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text(STUB_TESTS)
    return stub


def sec_cuda_tests(ctx: Ctx, o: Outcome) -> None:
    """The ``cuda``-marked tests (in a dry run: a stub's, which skips); the rest of the suite
    (section 1b, when it is to run) starts beside them on the other cores."""
    if ctx.background.get("run_suite"):
        ctx.background["suite"] = _start_suite(ctx)
    part = ctx.val_dir / "pytest-cuda.part"
    target = str(_dry_stub(ctx, "cuda")) if ctx.dry else "tests/"
    (code,) = _wait(
        [_pytest(["-m", "cuda", target], ctx.budget_s, part, "cuda-marked tests")], ctx.budget_s
    )
    counts = _counts(_collect_log(ctx, [part]))
    o.info["cuda_tests"] = {"exit_code": code, **counts}
    ran = counts.get("passed", 0) if not ctx.dry else counts.get("skipped", 0)
    o.check(
        "pytest -m cuda",
        code == 0 and ran > 0 and not counts.get("failed"),
        "exit 0, no failure" + ("" if not ctx.dry else " (dry run: a stub that skips)"),
        exact=ctx.dry,
        exit_code=code,
        **counts,
    )


#: seconds the suite's shards leave at the end of the run (section 10 and the files)
SUITE_RESERVE_S = 12.0


def _start_suite(ctx: Ctx) -> tuple[list[subprocess.Popen], list[Path], int, float]:
    """Start the suite's shards (processes, logs, number of files, when they must end): the
    test files dealt over parallel single-threaded pytest processes, capped to end before the
    run does (in a dry run: two stub files in two shards)."""
    files = sorted((ROOT / "tests").glob("test_*.py"), key=lambda p: -p.stat().st_size)
    # one thread per process: many processes each spinning all cores' OpenMP threads stall;
    # two cores stay with the cuda-marked tests beside them
    shards = max(2, min(12, (os.cpu_count() or 2) - 3))
    if ctx.dry:
        files = [_dry_stub(ctx, "a"), _dry_stub(ctx, "b")]
        shards = 2
    groups = [files[i::shards] for i in range(shards)]
    cap = max(ctx.remaining() - SUITE_RESERVE_S, 5)
    parts = [ctx.val_dir / f"pytest-suite-{i}.part" for i in range(len(groups))]
    procs = [
        _pytest(
            ["-m", "not cuda", *[str(f) for f in g]],
            cap,
            part,
            f"suite shard {i + 1}/{len(groups)}",
            threads=1,
        )
        for i, (g, part) in enumerate(zip(groups, parts, strict=True))
    ]
    return procs, parts, len(files), time.perf_counter() + cap


def sec_suite(ctx: Ctx, o: Outcome) -> None:
    """The rest of the suite (not ``cuda``-marked), started beside section 1a (or here, when
    1a did not run), waited for until the run's end less a few seconds for section 10."""
    procs, parts, n_files, end = ctx.background.pop("suite", None) or _start_suite(ctx)
    cap = max(end - time.perf_counter(), 0.1)
    codes = _wait(procs, cap)
    text = _collect_log(ctx, parts)
    total: collections.Counter = collections.Counter()
    for chunk in text.split("===== suite shard")[1:]:
        total.update(_counts(chunk))
    o.info["suite"] = {"exit_codes": codes, "files": n_files, **total}
    o.check(
        "pytest -m 'not cuda' (whole suite, parallel shards)",
        all(c == 0 for c in codes) and total.get("passed", 0) > 0,
        f"every shard exits 0 within {cap:.0f} s",
        exact=ctx.dry,
        exit_codes=codes,
        **dict(total),
    )


# -- 2. the timer against known durations --------------------------------------------------------
def sec_timer(ctx: Ctx, o: Outcome) -> None:
    """validate_timer.py's checks on CUDA, and the per-layer overhead on resnet50 batch 1."""
    if not ctx.dry:
        o.checks += validate_timer.cpu_checks(quick=True, budget=0.5)
    cpm = calibrate_cuda_sleep(ctx.dev)
    o.info["sleep_cycles_per_ms"] = cpm
    if ctx.dry:  # the fake's rate is exact; its calibration reads host preemption too
        cpm = FAKE_CYCLES_PER_MS
    ms = (0.5, 1.0, 2.0) if ctx.dry else (2.0, 5.0, 10.0)
    o.checks += validate_timer.sleep_checks(ctx.dev, cpm, ms, callable_ms=ms[1], **ctx.timing(2.0))
    if ctx.dry:
        o.notes.append("transfer and CUDA-graph checks need device memory: GPU run only")
    else:
        o.checks += validate_timer.transfer_checks(ctx.dev)
        o.checks.append(validate_timer.graph_check(ctx.dev))
    model, size = vision(ctx, "resnet50")
    x = _on(ctx, model, size, 1)
    clean = measure_latency(model, x, warn=False, **ctx.timing(2.0))
    lt = time_layers(model, make_inputs(model, inputs=x), **ctx.timing(4.0))
    ratio = lt.overhead(clean)
    o.check(
        "resnet50 batch 1: per-layer instrumentation overhead",
        ratio <= 1.05,
        "<= 1.05x",
        ratio=ratio,
        clean_ms=clean.median_ms,
        instrumented_ms=float(np.median(lt.passes_ms)),
        coverage=lt.coverage(),
        n=lt.n,
    )


# -- 3. the hardware's own account ---------------------------------------------------------------
def profiler_leaf_ms(
    ctx: Ctx, model: nn.Module, x: torch.Tensor, passes: int
) -> dict[tuple[str, int], float]:
    """Per module call (all but the root): mean over ``passes`` of the summed CUDA kernel time
    (CUPTI) launched inside it, from ``torch.profiler`` with one ``record_function`` range per
    call (CPU time of the range in a dry run)."""
    from torch.profiler import ProfilerActivity

    names = _named(model)
    count: collections.Counter = collections.Counter()
    stack: list[Any] = []

    def pre(m: nn.Module, args: Any) -> None:
        count[names[m]] += 1
        rf = torch.profiler.record_function(f"mp::{names[m]}::{count[names[m]]}")
        rf.__enter__()
        stack.append(rf)

    def post(m: nn.Module, args: Any, out: Any) -> None:
        stack.pop().__exit__(None, None, None)

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if not ctx.dry else [])
    with torch.no_grad(), _hooks(model, pre, post, names):
        model(x)
        device_synchronize(ctx.dev)
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(passes):
                count.clear()
                model(x)
            device_synchronize(ctx.dev)
    total: collections.Counter = collections.Counter()
    seen: collections.Counter = collections.Counter()
    for e in prof.events():
        if not e.name.startswith("mp::") or "CPU" not in str(getattr(e, "device_type", "CPU")):
            continue
        name, call = e.name[4:].rsplit("::", 1)
        us = e.cpu_time_total if ctx.dry else getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        total[(name, int(call))] += us
        seen[(name, int(call))] += 1
    return {k: total[k] / seen[k] / 1e3 for k in total}


def sync_timer_ms(
    ctx: Ctx, model: nn.Module, x: torch.Tensor, passes: int
) -> tuple[dict[tuple[str, int], float], float]:
    """What DeepSpeed's flops profiler does: synchronize and read the host clock around every
    leaf; per-call medians and the median pass (ms)."""
    names = _leaves(model)
    count: collections.Counter = collections.Counter()
    start: list[int] = []
    got: dict[tuple[str, int], list[float]] = collections.defaultdict(list)

    def pre(m: nn.Module, args: Any) -> None:
        device_synchronize(ctx.dev)
        start.append(time.perf_counter_ns())

    def post(m: nn.Module, args: Any, out: Any) -> None:
        device_synchronize(ctx.dev)
        count[names[m]] += 1
        got[(names[m], count[names[m]])].append((time.perf_counter_ns() - start.pop()) / 1e6)

    pass_ms = []
    with torch.no_grad(), _hooks(model, pre, post, names):
        for _ in range(passes + 1):
            count.clear()
            device_synchronize(ctx.dev)
            t0 = time.perf_counter_ns()
            model(x)
            device_synchronize(ctx.dev)
            pass_ms.append((time.perf_counter_ns() - t0) / 1e6)
    return {k: float(np.median(v[1:] or v)) for k, v in got.items()}, float(np.median(pass_ms[1:]))


def _shares(times: dict[Any, float], keys: list[Any]) -> np.ndarray:
    v = np.array([times[k] for k in keys], dtype=np.float64)
    return v / v.sum()


def _account(ctx: Ctx, o: Outcome, name: str, batch: int) -> None:
    model, size = vision(ctx, name)
    x = _on(ctx, model, size, batch)
    clean = measure_latency(model, x, warn=False, **ctx.timing(2.0))
    # the per-layer instrument on CUDA: kernel time by correlation id (per_layer="kernels")
    lt = time_kernels(model, make_inputs(model, inputs=x), repeat=3 if ctx.dry else 10)
    ev = dict(zip(lt.order, lt.medians()["kernel"].tolist()))
    kern = profiler_leaf_ms(ctx, model, x, passes=3 if ctx.dry else 10)
    keys = [k for k in lt.order if k[0] and k in kern]  # every module call but the root
    big = [k for k in keys if kern[k] > 0.05]
    errs = {k: _rel(ev[k], kern[k]) for k in big}
    worst = max(errs, key=errs.get) if errs else None
    rows = ["layer,call,modelprof_kernel_ms,kernels_ms"] + [
        f"{k[0]},{k[1]},{ev[k]:.5f},{kern[k]:.5f}" for k in keys
    ]
    (ctx.val_dir / f"cupti_vs_events_{name}.csv").write_text("\n".join(rows) + "\n")
    o.check(
        f"{name} batch {batch}: modelprof's per-module kernel_ms vs CUPTI kernel sums",
        bool(errs) and max(errs.values()) <= 0.05,
        "within 5 % on every module > 50 us",
        modules_over_50us=len(big),
        within_5pct=sum(e <= 0.05 for e in errs.values()),
        median_err_pct=100 * float(np.median(list(errs.values()))) if errs else None,
        worst=f"{worst[0]}#{worst[1]} {100 * errs[worst]:.1f} %" if worst else None,
    )
    sync_ms, sync_pass = sync_timer_ms(ctx, model, x, passes=3 if ctx.dry else 20)
    skeys = [k for k in lt.leaves() if k in sync_ms]
    d = np.abs(_shares(sync_ms, skeys) - _shares(ev, skeys))
    top = skeys[int(np.argmax(d))]
    sync_over = sync_pass / clean.median_ms
    o.info[f"sync_timer_{name}"] = {
        "overhead": sync_over,
        "pass_ms": sync_pass,
        "clean_ms": clean.median_ms,
        "share_shift_total_pp": 50 * float(d.sum()),
        "share_shift_max_pp": 100 * float(d.max()),
        "most_shifted": f"{top[0]}#{top[1]}",
    }
    o.check(
        f"{name}: kernels instrument's overhead below a synchronize-per-module timer's",
        lt.overhead(clean) < sync_over,
        "instrumented/clean < sync pass/clean",
        events_overhead=lt.overhead(clean),
        sync_overhead=sync_over,
        share_shift_total_pp=50 * float(d.sum()),
        share_shift_max_pp=100 * float(d.max()),
    )


def sec_cupti(ctx: Ctx, o: Outcome) -> None:
    """Per-layer events against CUPTI kernel time; a per-module-synchronize timer beside them."""
    for name in ("resnet50", "vit_b_16"):
        _account(ctx, o, name, batch=2 if ctx.dry else 16)


# -- 4. the seed's recipe and the throughput search ----------------------------------------------
def seed_recipe(
    model: nn.Module, x: torch.Tensor, dev: torch.device, warmup: int = 100, samples: int = 300
) -> dict[str, float]:
    """The seed's hand-written loop: CUDA events around each call, a synchronize after each,
    mean/std and FPS; its wall time."""
    t0 = time.perf_counter()
    starter, ender = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = np.zeros(samples)
    with torch.no_grad():
        for _ in range(warmup):
            model(x)
        torch.cuda.synchronize(dev)
        for i in range(samples):
            starter.record()
            model(x)
            ender.record()
            torch.cuda.synchronize(dev)
            times[i] = starter.elapsed_time(ender)
    return {
        "mean_ms": float(times.mean()),
        "std_ms": float(times.std()),
        "median_ms": float(np.median(times)),
        "fps": 1e3 * x.shape[0] / float(times.mean()),
        "wall_s": time.perf_counter() - t0,
    }


class OomAbove(nn.Module):
    """Dry run: raises the out-of-memory error for batches above ``limit`` samples."""

    def __init__(self, inner: nn.Module, limit: int) -> None:
        super().__init__()
        self.inner, self.limit = inner, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"fake: out of memory at batch {x.shape[0]}")
        return self.inner(x)


def sec_seed(ctx: Ctx, o: Outcome) -> None:
    model, size = vision(ctx, "resnet50")
    x = _on(ctx, model, size, 1)
    warm, n = (5, 15) if ctx.dry else (100, 300)
    seed = seed_recipe(model, x, ctx.dev, warm, n)
    t0 = time.perf_counter()
    m = measure_latency(model, x, warn=False, **(ctx.timing(0.1) if ctx.dry else {}))
    wall = time.perf_counter() - t0
    o.check(
        "resnet50 batch 1: seed recipe vs modelprof, medians",
        _rel(m.median_ms, seed["median_ms"]) <= 0.01,
        "within 1 %",
        seed_median_ms=seed["median_ms"],
        seed_mean_ms=seed["mean_ms"],
        seed_std_ms=seed["std_ms"],
        seed_fps=seed["fps"],
        modelprof_median_ms=m.median_ms,
        modelprof_ci_pct=100 * m.relative_ci,
        n=m.n,
        stop=m.stop_reason,
    )
    o.check(
        "modelprof's wall time vs the fixed recipe's",
        wall <= 0.5 * seed["wall_s"],
        "<= 0.5x",
        modelprof_wall_s=wall,
        seed_wall_s=seed["wall_s"],
        ratio=wall / seed["wall_s"],
    )
    _throughput_to_oom(ctx, o, model, size)


def _throughput_to_oom(ctx: Ctx, o: Outcome, model: nn.Module, size: tuple[int, ...]) -> None:
    """Grow the batch until memory runs out (capped at 3 GiB on a GPU so it comes quickly), back
    off, and compare the allocator before and after."""
    kw: dict[str, Any] = {"gain": 0.0, "patience": 64}
    if ctx.dry:
        searched, cap = OomAbove(model, 8), None
        kw.update(max_batch=64, repeat=2, warmup=1)
    else:
        searched = model
        cap = 3 * 2**30 / torch.cuda.get_device_properties(ctx.dev).total_memory
        kw.update(max_batch=8192, budget_s=0.2, min_samples=3, min_blocks=1, warmup=1)
        torch.cuda.synchronize(ctx.dev)
        # the fraction takes a device index (a bare "cuda" is refused: found on an H200)
        torch.cuda.set_per_process_memory_fraction(cap, torch.cuda.current_device())
    # earlier sections' garbage in reference cycles (a model a captured CUDA graph's closure
    # holds: 103,077,888 B on the H200's second run) is collected first, not charged to the
    # search, whose out-of-memory recovery collects it
    gc.collect()
    before = torch.cuda.memory_allocated(ctx.dev) if not ctx.dry else None
    try:
        tp = measure_throughput(searched, size, device=ctx.dev, **kw)
    finally:
        if cap is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
    after = torch.cuda.memory_allocated(ctx.dev) if not ctx.dry else None
    curve = ", ".join(f"{p.batch_size}:{p.samples_per_s:.0f}" for p in tp.points)
    o.info["throughput"] = tp.to_dict() | {"env": None}
    o.check(
        "resnet50 throughput search up to out-of-memory and back",
        tp.stop_reason == "oom"
        and before == after
        and tp.memory_restored is not False
        and (not ctx.dry or tp.max_fit_batch == 8),  # the fake fails above 8 samples
        "stops at OOM; allocated memory after == before",
        exact=ctx.dry,
        stop=tp.stop_reason,
        max_fit_batch=tp.max_fit_batch,
        oom_batch=tp.oom_batch,
        best=f"{tp.best_samples_per_s:.1f}/s at {tp.best_batch_size}",
        allocated_before=before,
        allocated_after=after,
        curve=curve,
    )


# -- 5. a raw CUDA kernel with transfers ---------------------------------------------------------
KERNEL = r"""
extern "C" __global__ void axpb(const float* x, float* y, const long long n) {
    long long i = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
"""


def _raw_kernel(ctx: Ctx) -> Callable[[torch.Tensor], torch.Tensor]:
    if ctx.dry:
        return lambda x: x * 2.0 + 1.0
    try:
        import cupy as cp
    except ImportError as e:
        raise Skip(f"CuPy is not importable: {e}") from e
    kernel = cp.RawKernel(KERNEL, "axpb")

    def run(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        kernel(((n + 255) // 256,), (256,), (cp.asarray(x), cp.asarray(y), cp.int64(n)))
        return y

    return run


def sec_raw_kernel(ctx: Ctx, o: Outcome) -> None:
    """``measure_latency`` of a CuPy ``RawKernel`` with ``transfer=True``."""
    run = _raw_kernel(ctx)
    n = 2**12 if ctx.dry else 64 * 2**20  # 256 MiB of float32 on a GPU
    x = torch.randn(n)
    y = run(x.to(ctx.dev)).cpu()
    o.check(
        "raw kernel computes 2x+1",
        torch.equal(y, x * 2.0 + 1.0),
        "bit-exact",
        exact=True,
        elements=n,
        kernel="CuPy RawKernel" if not ctx.dry else "torch stand-in (dry run)",
    )
    if ctx.dry:
        m = measure_latency(run, x, **ctx.timing(0.1))
        o.info["kernel_ms"] = m.median_ms
        o.notes.append("transfer=True needs CUDA: the dry run times the stand-in alone")
        return
    nbytes = 4 * n
    ref_h2d, ref_d2h = validate_timer.copy_bandwidth(ctx.dev, nbytes, pin=True)
    m = measure_latency(
        run, x, device=ctx.dev, transfer=True, pin_memory=True, warn=False, **ctx.timing(3.0)
    )
    bw = nbytes / m.h2d.median_ms / 1e6
    o.check(
        "raw kernel, transfer=True: H2D vs the pinned bandwidth",
        _rel(bw, ref_h2d) <= 0.05,
        "within 5 %",
        h2d_ms=m.h2d.median_ms,
        kernel_ms=m.compute.median_ms,
        d2h_ms=m.d2h.median_ms,
        h2d_GBps=bw,
        pinned_h2d_GBps=ref_h2d,
        d2h_GBps=nbytes / m.d2h.median_ms / 1e6,
        pinned_d2h_GBps=ref_d2h,
    )


# -- 6. the CUDA-only formulas -------------------------------------------------------------------
def formula_cases(ctx: Ctx) -> list[tuple[str, Callable[[], nn.Module], Any]]:
    """(label, builder, inputs) of the models whose CUDA kernels differ from the CPU's."""
    small = ctx.dry
    cases: list[tuple[str, Callable[[], nn.Module], Any]] = []
    vit, size = vision(ctx, "vit_b_16")
    cases.append(
        ("vit_b_16" if not small else "tiny ViT", lambda: copy.deepcopy(vit), torch.randn(1, *size))
    )
    cases.append(
        (
            "resnet18 (cuDNN batch norm)",
            lambda: vision(ctx, "resnet18")[0],
            torch.randn(2, *vision(ctx, "resnet18")[1]),
        )
    )
    h = 16 if small else 256
    cases.append(
        (
            "2-layer LSTM",
            lambda: nn.LSTM(h // 2, h, num_layers=2, batch_first=True),
            torch.randn(2, 8 if small else 64, h // 2),
        )
    )
    try:
        import transformers as tf
    except ImportError:
        return cases
    ids = torch.randint(0, 1000, (2, 16 if small else 128))
    hid = 32 if small else 256
    bert = tf.BertConfig(
        vocab_size=1000,
        hidden_size=hid,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=2 * hid,
        attn_implementation="sdpa",
    )
    llama = tf.LlamaConfig(
        vocab_size=1000,
        hidden_size=hid,
        intermediate_size=2 * hid,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    cases.append(("HF BERT", lambda: tf.BertModel(bert).eval(), {"input_ids": ids}))
    cases.append(("HF Llama", lambda: tf.LlamaModel(llama).eval(), {"input_ids": ids}))
    return cases


def _variants(ctx: Ctx) -> list[tuple[str, dict[str, Any], Any]]:
    """(label, profile options, SDPA backends) of the counted runs compared with the CPU's."""
    from torch.nn.attention import SDPBackend

    if ctx.dry:
        return [
            ("cpu bf16 autocast", {"amp": torch.bfloat16}, None),
            ("cpu sdpa math", {}, [SDPBackend.MATH]),
        ]
    return [
        ("cuda fp32", {}, None),
        ("cuda bf16 amp", {"amp": torch.bfloat16}, None),
        ("cuda flash (bf16)", {"amp": torch.bfloat16}, [SDPBackend.FLASH_ATTENTION]),
        ("cuda efficient", {}, [SDPBackend.EFFICIENT_ATTENTION]),
        ("cuda cuDNN attention (bf16)", {"amp": torch.bfloat16}, [SDPBackend.CUDNN_ATTENTION]),
    ]


def _moved(inputs: Any, dev: torch.device) -> Any:
    if isinstance(inputs, dict):
        return {k: v.to(dev) for k, v in inputs.items()}
    return inputs.to(dev)


FORMULA_OPS = re.compile(
    r"attention|cudnn|rnn|lstm|batch_norm|native_multi_head|sdp", re.IGNORECASE
)


def sec_formulas(ctx: Ctx, o: Outcome) -> None:
    """MACs on the device (each SDPA backend, AMP) equal the CPU count of the same model."""
    for label, build, inputs in formula_cases(ctx):
        if ctx.section_left() < 3:
            o.notes.append(f"{label}: not counted (the section's time was spent)")
            continue
        try:
            _formula_case(ctx, o, label, build, inputs)
        except Exception as e:  # noqa: BLE001 - recorded; the next model still runs
            o.check(
                f"{label}: counted",
                False,
                "no error",
                exact=True,
                error=f"{type(e).__name__}: {str(e)[:300]}",
            )


def _formula_case(
    ctx: Ctx, o: Outcome, label: str, build: Callable[[], nn.Module], inputs: Any
) -> None:
    from torch.nn.attention import sdpa_kernel

    torch.manual_seed(0)
    ref = profile(build(), inputs=inputs, device="cpu", timing=False)
    for vlabel, opts, backends in _variants(ctx):
        if backends is not None and not re.search("ViT|vit|BERT|Llama", label):
            continue
        torch.manual_seed(0)
        model = build()
        try:
            with sdpa_kernel(backends) if backends else contextlib.nullcontext():
                rep = profile(
                    model, inputs=_moved(inputs, ctx.dev), device=ctx.dev, timing=False, **opts
                )
        except Exception as e:
            if backends is None and _torch_runs(build, inputs, ctx.dev, opts):
                raise
            # a fused backend this GPU or these shapes cannot use, or a mode torch itself cannot
            # run here (oneDNN has no bf16 LSTM on a CPU without AVX-512): recorded, not a
            # failure of the count
            o.notes.append(f"{label}, {vlabel}: {type(e).__name__}: {str(e)[:200]}")
            continue
        ops = [op for op in rep.by_operator()["op"] if FORMULA_OPS.search(op)]
        a, b = rep.totals, ref.totals
        o.check(
            f"{label}, {vlabel}: MACs == CPU fp32 count",
            a["macs"] == b["macs"],
            "equal",
            exact=True,
            macs=a["macs"],
            cpu_macs=b["macs"],
            flops=a["flops"],
            cpu_flops=b["flops"],
            flops_diff=a["flops"] - b["flops"],
            unsupported=dict(rep.unsupported) or None,
            ops=" ".join(ops) or None,
        )


def _torch_runs(
    build: Callable[[], nn.Module], inputs: Any, dev: torch.device, opts: dict[str, Any]
) -> bool:
    """Whether torch itself runs the model's forward in this mode here (no modelprof)."""
    model = build().to(dev)
    x = _moved(inputs, dev)
    amp = opts.get("amp")
    try:
        with torch.no_grad(), torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            model(**x) if isinstance(x, dict) else model(x)
    except Exception:  # noqa: BLE001 - the answer is the point
        return False
    return True


# -- 7. tables and plots -------------------------------------------------------------------------
MODES: dict[str, dict[str, Any]] = {
    "fp32": {},
    "bf16-amp": {"amp": torch.bfloat16},
    "channels_last": {"channels_last": True},
}


def _save_plot(fig_fn: Callable[[], Any], path: Path, o: Outcome) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = fig_fn()
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
    except ImportError as e:
        o.notes.append(f"no plot {path.name}: {e}")


def _markdown(
    write: Callable[[Path], Any], path: Path, o: Outcome, text: Callable[[], str] | None = None
) -> None:
    """Markdown needs tabulate (an optional extra): without it, a plain-text table (or none),
    and a note saying so."""
    from modelprof import ModelProfError

    try:
        write(path)
    except (ModelProfError, ImportError) as e:  # (pandas' own to_markdown: ImportError)
        if "tabulate" not in str(e):
            raise
        if text is not None:
            path.with_suffix(".txt").write_text(text())
        o.notes.append(
            f"no {path.name} (tabulate is not installed)"
            + (f"; {path.with_suffix('.txt').name} instead" if text else "")
        )


def _peaks(ctx: Ctx) -> dict[str, dict[str, Any]]:
    """Measured peaks per dtype (short probe) and the datasheet's beside them; in a dry run
    fixed stand-ins (the probe is slow on a loaded CPU and is tested on its own)."""
    name = ctx.env.get("device_name") or ""
    out = {}
    for dt in ("float32", "bfloat16"):
        if ctx.dry:
            measured = Peaks(peak_flops=1e11, peak_bytes=1e10, source="user", dtype=dt)
        else:
            measured = probe_peaks(ctx.dev, dt, budget_s=2.0)
        out[dt] = {"measured": measured, "datasheet": lookup_peaks(name, dt)}
    return out


def _model_table(
    ctx: Ctx, o: Outcome, peaks: dict[str, dict[str, Any]], name: str, mode: str
) -> str:
    """Profile one model in one mode; write its table, CSV and plots; its summary row."""
    d, opts = ctx.rep_dir, MODES[mode]
    model, size = vision(ctx, name)
    dt = "bfloat16" if "amp" in opts else "float32"
    rep = profile(
        model.to(ctx.dev),
        size,
        device=ctx.dev,
        roofline=peaks[dt]["measured"],
        **ctx.timing(1.0),
        **opts,
    )
    stem = f"{name}_{mode}"
    _markdown(lambda path: rep.to_markdown(path), d / f"{stem}.md", o, lambda: rep.to_text())
    rep.to_csv(d / f"{stem}.csv")
    if not ctx.dry or stem == "resnet18_fp32":  # plots are slow on a loaded CPU
        _save_plot(lambda: rep.plot_roofline(), d / f"{stem}_roofline.png", o)
        _save_plot(lambda: rep.plot_latency(), d / f"{stem}_latency.png", o)
    lat = rep.latency
    tflops = rep.totals["flops"] / (lat.median_ms / 1e3) / 1e12
    o.check(
        f"{name} {mode}: table, csv and plots written",
        (d / f"{stem}.csv").exists(),
        "files exist",
        exact=True,
        median_ms=lat.median_ms,
        fps=lat.fps,
    )
    return (
        f"| {name} | {mode} | {lat.median_ms:.3f} | {lat.fps:.1f} | "
        f"{rep.instrumentation_overhead or float('nan'):.3f} | "
        f"{rep.coverage or float('nan'):.1%} | {tflops:.2f} |"
    )


def sec_tables(ctx: Ctx, o: Outcome) -> None:
    """resnet18, resnet50, vit_b_16 in fp32, bf16 AMP and channels_last; 4 architectures."""
    peaks = _peaks(ctx)
    lines = [
        "| dtype | measured TFLOP/s | measured GB/s | datasheet TFLOP/s | datasheet GB/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for dt, p in peaks.items():
        m, s = p["measured"], p["datasheet"]
        lines.append(
            f"| {dt} ({m.dtype}) | {m.peak_flops / 1e12:.1f} | {m.peak_bytes / 1e9:.0f} |"
            f" {s.peak_flops / 1e12 if s else float('nan'):.1f} | "
            f"{s.peak_bytes / 1e9 if s else float('nan'):.0f} |"
        )
        o.info[f"peaks_{dt}"] = {
            "measured_flops": m.peak_flops,
            "measured_bytes": m.peak_bytes,
            "datasheet_flops": s.peak_flops if s else None,
            "datasheet_bytes": s.peak_bytes if s else None,
        }
    table = [
        "| model | mode | median ms | fps | overhead | coverage | TFLOP/s achieved |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    plan = [("resnet50", m) for m in MODES] + [
        ("vit_b_16", "fp32"),
        ("vit_b_16", "bf16-amp"),
        ("resnet18", "fp32"),
    ]
    if ctx.dry:  # each mode once, on a loaded 2-core CI machine
        plan = [("resnet18", "fp32"), ("resnet18", "channels_last"), ("vit_b_16", "bf16-amp")]
    for name, mode in plan:
        if ctx.section_left() < 15:  # the comparison and the README still to write
            o.notes.append(f"{name} {mode}: not run (the section's time was spent)")
            continue
        table.append(_model_table(ctx, o, peaks, name, mode))
    _comparison(ctx, o)
    (ctx.rep_dir / "README.md").write_text(
        "\n".join(
            [
                f"# {ctx.env.get('device_name')}",
                "",
                (
                    f"torch {ctx.env.get('torch_version')}, CUDA {ctx.env.get('cuda_version')}, cuDNN "
                    f"{ctx.env.get('cudnn_version')}, driver {ctx.env.get('driver_version')}; "
                    f"`{ctx.env.get('command')}`"
                ),
                "",
                "## Peaks",
                "",
                *lines,
                "",
                "## Models (batch 1)",
                "",
                *table,
                "",
                "[comparison.md](comparison.md): 4 architectures measured interleaved.",
                "",
            ]
        )
    )


def _comparison(ctx: Ctx, o: Outcome) -> None:
    names = ("resnet18", "resnet50", "mobilenet_v3_large", "vit_b_16")
    models = {}
    for n in names:
        m, size = vision(ctx, n)
        models[n] = m.to(ctx.dev)
    cmp = compare(models, size, device=ctx.dev, roofline=False, **ctx.timing(1.0))
    _markdown(
        lambda path: cmp.to_markdown(path),
        ctx.rep_dir / "comparison.md",
        o,
        lambda: cmp.to_string(),
    )
    cmp.to_csv(ctx.rep_dir / "comparison.csv")
    col = "latency_x" if "latency_x" in cmp.columns else None
    o.check(
        "comparison of 4 architectures (interleaved)",
        len(cmp) == 4,
        "4 rows",
        exact=True,
        **{n: float(cmp.loc[n, col]) for n in names} if col else {},
    )


# -- 8. the training step ------------------------------------------------------------------------
class SleepBackward(torch.autograd.Function):
    """Identity forward; its backward queues ``torch.cuda._sleep(cycles)``."""

    cycles = 0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(SleepBackward.cycles)
        return grad


class SleepLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SleepBackward.apply(x)


def _saved_bytes_oracle(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the storages autograd saves in forward + default loss (params/buffers not)."""
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen.setdefault(s.data_ptr(), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
        out.float().sum()
    return sum(seen.values())


def sec_step(ctx: Ctx, o: Outcome) -> None:
    sleep_ms = 1.0 if ctx.dry else 4.0
    cpm = calibrate_cuda_sleep(ctx.dev) if not ctx.dry else FAKE_CYCLES_PER_MS
    SleepBackward.cycles = int(sleep_ms * cpm)
    model = nn.Sequential(nn.Linear(4, 4), SleepLayer(), nn.Linear(4, 4)).to(ctx.dev)
    rep = profile(
        model,
        (4,),
        device=ctx.dev,
        backward=True,
        optimizer=torch.optim.SGD,
        roofline=False,
        **ctx.timing(2.0),
    )
    got = rep.to_dataframe().set_index(["module", "call"]).loc[("1", 1), "backward_latency_ms"]
    clock = rep.training_step.timing.env["mode"].get("clock")
    o.check(
        "the step is timed by CUDA events",
        clock == "cuda_event",
        "clock == cuda_event",
        exact=True,
        clock=clock,
    )
    o.check(
        f"backward of a {sleep_ms:g} ms _sleep read back in its layer",
        _rel(float(got), sleep_ms) <= 0.02,
        "within 2 %",
        backward_ms=float(got),
        want_ms=sleep_ms,
    )
    net, size = vision(ctx, "resnet18")
    net.train()
    x = _on(ctx, net, size, 2 if ctx.dry else 8)
    rep = profile(
        net,
        inputs=x,
        device=ctx.dev,
        backward=True,
        optimizer=torch.optim.SGD,
        roofline=False,
        **ctx.timing(2.0),
    )
    peak = rep.training_step.timing.peak_memory_bytes
    if ctx.dry:
        o.notes.append("allocator peak of the step: GPU run only (no allocator on the CPU)")
    else:
        # the reference step right after, on the same device state (nothing run between: the
        # saved-bytes oracle below leaves gradients), from no gradients, setting them to None
        # after; modelprof's peak leaves out its copy of the model and its snapshot
        # (benchmarks/gpu_step_memory.py: with them it read 100.6 MB above a plain step's)
        want = max(step["peak"] for step in plain_steps(net, x, 2, to_none=True))
        o.check(
            "resnet18 step: peak memory vs torch.cuda.max_memory_allocated of a plain step "
            "that sets gradients to None",
            peak is not None and _rel(peak, want) <= 0.05,
            "within 5 %",
            modelprof_bytes=peak,
            plain_step_bytes=want,
        )
    saved = int(rep.totals["saved_bytes"])
    oracle = _saved_bytes_oracle(net, x)
    o.check(
        "resnet18 step: saved bytes vs a saved_tensors_hooks count",
        saved == oracle,
        "equal",
        saved_bytes=saved,
        oracle_bytes=oracle,
    )


# -- 9. generation and sharded models ------------------------------------------------------------
def _entry(module: str, names: tuple[str, ...]) -> Any:
    with contextlib.suppress(ImportError):
        mod = importlib.import_module(module)
        for n in names:
            if hasattr(mod, n):
                return getattr(mod, n)
    return None


def sec_generation(ctx: Ctx, o: Outcome) -> None:
    """TTFT/TPOT of a small Llama config, and a sharded run — when they have landed."""
    import modelprof

    gen = getattr(modelprof, "profile_generation", None) or _entry(
        "modelprof.generation", ("profile_generation",)
    )
    # profile_sharded is modelprof's (the H200 run looked for it in modelprof.distributed only
    # and said "not landed")
    dist = getattr(modelprof, "profile_sharded", None) or _entry(
        "modelprof.distributed", ("profile_distributed", "profile_sharded", "profile_fsdp")
    )
    o.info["generation"] = "landed" if gen else "not landed"
    o.info["distributed"] = "landed" if dist else "not landed"
    if gen is None and dist is None:
        raise Skip(
            "not landed: modelprof.generation has no profile_generation and "
            "modelprof.distributed no entry point"
        )
    if gen is not None:
        import transformers as tf

        hid = 64 if ctx.dry else 512
        cfg = tf.LlamaConfig(
            vocab_size=1000,
            hidden_size=hid,
            intermediate_size=2 * hid,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
        )
        model = tf.LlamaForCausalLM(cfg).eval().to(ctx.dev)
        res = gen(
            model,
            prompt_len=16 if ctx.dry else 128,
            new_tokens=4 if ctx.dry else 32,
            batch_size=1,
            **ctx.timing(1.0),
        )
        figs = {
            k: getattr(res, k)
            for k in dir(res)
            if re.search("ttft|tpot|tokens_per_s|bound", k) and not k.startswith("_")
        }
        o.info["generation_result"] = {k: str(v) for k, v in figs.items()}
        o.check(
            "profile_generation of a small Llama config ran",
            True,
            "ran",
            **{k: v for k, v in figs.items() if isinstance(v, (int, float))},
        )
    if dist is not None and dist.__name__ == "profile_sharded":
        _sharded_check(ctx, o, dist)
    elif dist is not None:
        o.notes.append(f"modelprof.distributed has {dist.__name__}: no runner written here yet")


def _sharded_check(ctx: Ctx, o: Outcome, profile_sharded: Callable[..., Any]) -> None:
    """FSDP2 built on meta, rank 1 of a fake group of 2, on this machine: FSDP's default mesh
    must not follow its GPU (on the H200 it gathered onto cuda:0 parameters made on the CPU)."""
    from modelprof.runtime.compat import fully_shard

    d = 64 if ctx.dry else 1024

    def build() -> nn.Module:
        model = nn.Sequential(*(nn.Linear(d, d) for _ in range(4)))
        for layer in model:
            fully_shard(layer)
        return fully_shard(model)

    plain = profile(
        nn.Sequential(*(nn.Linear(d, d) for _ in range(4))),
        (d,),
        batch_size=8,
        device="meta",
        timing=False,
    ).totals
    got = profile_sharded(build, (d,), batch_size=8, world_size=2, rank=1, backward=True).totals
    # FSDP shards every weight and bias along dim 0: half of 4 * (d*d + d) per rank
    o.check(
        "profile_sharded: FSDP2 built on meta, rank 1 of 2",
        2 * got["params"] == plain["params"] and got["macs"] == plain["macs"],
        "half the parameters, all the MACs",
        exact=True,
        params=got["params"],
        plain_params=plain["params"],
        macs=got["macs"],
        plain_macs=plain["macs"],
    )


# -- 10. the README's GPU statements -------------------------------------------------------------
def sec_readme(ctx: Ctx, o: Outcome) -> None:
    """Lines of README/docs that state something about GPUs with a number, and which items of
    this run passed: the list to bring the README in line with."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(GPU|CUDA|H100|H200|A100)\b", line) and re.search(r"\d", line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:160]}")
    o.info["gpu_statements"] = found
    records = ctx.records
    o.info["passed_on_this_device"] = [r["title"] for r in records if verdict(r) == "PASS"]
    o.info["not_passed"] = [
        f"{r['key']}. {r['title']}: {verdict(r)}" for r in records if verdict(r) != "PASS"
    ]
    o.notes += [
        f"passed here: {', '.join(o.info['passed_on_this_device']) or 'nothing'}",
        f"not passed here: {'; '.join(o.info['not_passed']) or 'nothing'}",
        f"{len(found)} README/docs lines state GPU figures (evidence.json lists them)",
    ]


#: in the order they run: the seed's recipes first (what the timer is worth), then what only a
#: GPU shows, the tests last; budgets (GPU, dry run) in s, 330 s before the suite on a GPU,
#: which has the rest of the 420 s (its shards start beside 1a)
SECTIONS = [
    Section("2", "timer against known durations (validate_timer)", 40, 30, sec_timer),
    Section("4", "seed recipe vs modelprof; throughput up to OOM", 30, 30, sec_seed),
    Section("5", "raw CuPy kernel with transfers", 15, 10, sec_raw_kernel),
    Section("3", "events vs CUPTI kernel times; per-module-sync timer", 45, 30, sec_cupti),
    Section("6", "CUDA-only formulas vs the CPU count", 40, 40, sec_formulas),
    Section("8", "training step on CUDA", 20, 20, sec_step),
    Section("9", "generation and sharded models", 25, 20, sec_generation),
    Section(
        "7",
        "tables and plots: resnet50, vit_b_16, resnet18; roofline, comparison",
        60,
        60,
        sec_tables,
    ),
    # 1a waits inside the suite's own window (its shards run beside it until the run's end), so
    # its cap costs no time of the run: 50 s stopped the H200's in the 12th of 12 tests
    Section("1a", "cuda-marked tests", 100, 60, sec_cuda_tests),
    Section("1b", "the rest of the test suite (not cuda-marked)", 240, 60, sec_suite),
    Section("10", "README GPU statements", 5, 5, sec_readme),
]
