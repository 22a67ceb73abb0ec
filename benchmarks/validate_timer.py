"""Validate modelprof's timer against workloads of known duration on the device at hand.

CPU: busy-spin layers of 2/5/10 ms (per layer and end to end within 3 %), a 3 ms callable, the
instrumentation overhead (< 5 %), the fixed recipe's exact call count.
CUDA, in addition: ``torch.cuda._sleep`` layers (cycles per ms calibrated first) within 1 %,
end to end == sum of layers, a transfer-inclusive copy of a known size vs the bandwidth measured by
a plain event-timed copy, CUDA graphs vs eager on a model of many tiny ops.
Then end-to-end and per-layer latency of torchvision resnet18/resnet50 at batch 1 and their
throughput curves. Each check prints PASS/FAIL with its figures; Markdown + JSON go to ``--out``
(default ``reports/validation/<device-slug>/``).

    python benchmarks/validate_timer.py [--device cuda] [--out DIR] [--models resnet18,resnet50]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modelprof.runtime.env import collect_env  # noqa: E402
from modelprof.runtime.inputs import make_inputs  # noqa: E402
from modelprof.timing import measure_latency, measure_throughput, time_layers  # noqa: E402
from modelprof.timing.calibration import calibrate_cuda_sleep, sleep_model, spin, spin_model


@dataclasses.dataclass
class Check:
    name: str
    passed: bool
    criterion: str
    figures: dict[str, Any]

    def line(self) -> str:
        figs = ", ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items())
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name}: {figs}  [{self.criterion}]"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def rel_err(got: float, want: float) -> float:
    return abs(got / want - 1.0)


# -- CPU checks --------------------------------------------------------------------------------
def cpu_checks(quick: bool, budget: float | None = None) -> list[Check]:
    """Busy-spin layers and callables of known duration, read back on the CPU clock."""
    checks: list[Check] = []
    budget = budget or (2.0 if quick else 5.0)
    targets = {("0", 1): 2.0, ("1", 1): 5.0, ("2", 1): 10.0, ("", 1): 17.0}  # root: 2+5+10
    model = spin_model((2.0, 5.0, 10.0))
    mi = make_inputs(model, (4,))

    def layers():
        return time_layers(model, mi, budget_s=budget)

    lt = layers()
    med = lt.median_ms()
    for key, want in targets.items():
        what = f"layer {key[0]}" if key[0] else "model, instrumented root call"
        checks.append(
            Check(
                f"cpu spin {what} ({want:g} ms), per layer",
                rel_err(med[key], want) <= 0.03,
                "median within 3 %",
                {
                    "median_ms": med[key],
                    "want_ms": want,
                    "err_pct": 100 * rel_err(med[key], want),
                    "n": lt.n,
                },
            )
        )

    def e2e():
        return measure_latency(model, mi.args[0], budget_s=budget, warn=False)

    clean = e2e()
    checks.append(
        Check(
            "cpu spin model (2+5+10 ms), end to end",
            rel_err(clean.median_ms, 17.0) <= 0.03,
            "median within 3 %",
            {
                "median_ms": clean.median_ms,
                "want_ms": 17.0,
                "err_pct": 100 * rel_err(clean.median_ms, 17.0),
                "ci_pct": 100 * clean.relative_ci,
                "n": clean.n,
                "stop": clean.stop_reason,
            },
        )
    )
    checks.append(
        Check(
            "cpu spin model, leaf coverage (sum of layers / pass)",
            abs(lt.coverage() - 1.0) <= 0.03,
            "within 3 % of 1",
            {"coverage": lt.coverage()},
        )
    )

    def overhead():
        a = time_layers(model, mi, budget_s=budget)
        b = measure_latency(model, mi.args[0], budget_s=budget, warn=False)
        return a.overhead(b)

    ov = overhead()
    checks.append(
        Check(
            "cpu instrumentation overhead (instrumented / clean)",
            ov < 1.05,
            "< 1.05",
            {"ratio": ov},
        )
    )

    def callable3():
        return measure_latency(lambda: spin(3.0), budget_s=budget, warn=False)

    m3 = callable3()
    checks.append(
        Check(
            "cpu callable spinning 3 ms",
            rel_err(m3.median_ms, 3.0) <= 0.03,
            "median within 3 %",
            {"median_ms": m3.median_ms, "err_pct": 100 * rel_err(m3.median_ms, 3.0), "n": m3.n},
        )
    )
    calls: list[int] = []
    m = measure_latency(lambda: calls.append(1), warmup=7, repeat=11, warn=False)
    checks.append(
        Check(
            "fixed recipe warmup=7, repeat=11",
            len(calls) == 18 and m.n == 11,
            "exactly 18 calls",
            {"calls": len(calls), "n": m.n},
        )
    )
    return checks


# -- CUDA checks -------------------------------------------------------------------------------
def cuda_checks(dev: torch.device, quick: bool) -> tuple[list[Check], dict[str, Any]]:
    """All CUDA checks: calibrated sleep layers, transfer parts, CUDA graphs."""
    cpm = calibrate_cuda_sleep(dev)
    checks = sleep_checks(dev, cpm)
    checks += transfer_checks(dev)
    checks.append(graph_check(dev))
    return checks, {"sleep_cycles_per_ms": cpm}


def sleep_checks(
    dev: torch.device,
    cpm: float,
    ms: tuple[float, ...] = (2.0, 5.0, 10.0),
    callable_ms: float = 3.0,
    **timing: Any,
) -> list[Check]:
    """``torch.cuda._sleep`` layers of ``ms`` read back per layer and end to end (within 1 %),
    the instrumentation overhead, and a callable sleeping ``callable_ms``."""
    checks: list[Check] = []
    model = sleep_model(ms, cpm).to(dev)
    mi = make_inputs(model, (4,), device=dev)
    lt = time_layers(model, mi, **timing)
    med = lt.median_ms()
    for i, want in enumerate(ms):
        key = (str(i), 1)
        checks.append(
            Check(
                f"cuda _sleep layer {i} ({want:g} ms), per layer",
                rel_err(med[key], want) <= 0.01,
                "median within 1 %",
                {"median_ms": med[key], "err_pct": 100 * rel_err(med[key], want), "n": lt.n},
            )
        )
    leaf_sum = sum(med[k] for k in lt.leaves())
    checks.append(
        Check(
            "cuda end to end == sum of layers (instrumented)",
            rel_err(med[("", 1)], leaf_sum) <= 0.01,
            "within 1 %",
            {"root_ms": med[("", 1)], "sum_layers_ms": leaf_sum},
        )
    )
    total = float(sum(ms))
    clean = measure_latency(model, mi.args[0], warn=False, **timing)
    checks.append(
        Check(
            f"cuda _sleep model end to end ({total:g} ms)",
            rel_err(clean.median_ms, total) <= 0.01,
            "median within 1 %",
            {
                "median_ms": clean.median_ms,
                "err_pct": 100 * rel_err(clean.median_ms, total),
                "n": clean.n,
            },
        )
    )
    checks.append(
        Check(
            "cuda instrumentation overhead",
            lt.overhead(clean) < 1.05,
            "< 1.05",
            {"ratio": lt.overhead(clean)},
        )
    )
    cycles = int(callable_ms * cpm)
    m1 = measure_latency(lambda: torch.cuda._sleep(cycles), device=dev, warn=False, **timing)
    checks.append(
        Check(
            f"cuda callable sleeping {callable_ms:g} ms",
            rel_err(m1.median_ms, callable_ms) <= 0.01,
            "median within 1 %",
            {"median_ms": m1.median_ms},
        )
    )
    return checks


def copy_bandwidth(
    dev: torch.device, nbytes: int, pin: bool, repeat: int = 10
) -> tuple[float, float]:
    """(H2D, D2H) GB/s of a plain event-timed copy of ``nbytes`` (median of ``repeat``)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    devbuf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    ref_h2d, ref_d2h = [], []
    for _ in range(3):
        devbuf.copy_(host, non_blocking=pin)
    for _ in range(repeat):
        a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        a.record()
        devbuf.copy_(host, non_blocking=pin)
        b.record()
        host.copy_(devbuf, non_blocking=pin)
        c.record()
        torch.cuda.synchronize(dev)
        ref_h2d.append(a.elapsed_time(b))
        ref_d2h.append(b.elapsed_time(c))
    return nbytes / np.median(ref_h2d) / 1e6, nbytes / np.median(ref_d2h) / 1e6


def transfer_checks(dev: torch.device, nbytes: int = 256 * 2**20) -> list[Check]:
    """A transfer-inclusive run of a known-size copy against a plain event-timed copy."""
    checks: list[Check] = []
    for pin in (True, False):
        bw_ref_h2d, bw_ref_d2h = copy_bandwidth(dev, nbytes, pin)
        m = measure_latency(
            lambda x: x,
            torch.empty(nbytes, dtype=torch.uint8),
            device=dev,
            transfer=True,
            pin_memory=pin,
            warn=False,
        )
        bw_h2d = nbytes / m.h2d.median_ms / 1e6
        bw_d2h = nbytes / m.d2h.median_ms / 1e6
        ok = rel_err(bw_h2d, bw_ref_h2d) <= 0.05 and rel_err(bw_d2h, bw_ref_d2h) <= 0.05
        checks.append(
            Check(
                f"cuda transfer of {nbytes / 2**20:g} MiB ({'pinned' if pin else 'pageable'})",
                ok,
                "H2D and D2H bandwidth within 5 % of a plain copy",
                {
                    "h2d_GBps": bw_h2d,
                    "ref_h2d_GBps": bw_ref_h2d,
                    "d2h_GBps": bw_d2h,
                    "ref_d2h_GBps": bw_ref_d2h,
                    "h2d_ms": m.h2d.median_ms,
                    "compute_ms": m.compute.median_ms,
                    "d2h_ms": m.d2h.median_ms,
                },
            )
        )
    return checks


class TinyOps(nn.Module):
    """``n`` tiny adds: launch-bound in eager mode."""

    def __init__(self, n: int = 500) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = x + 1
        return x


def graph_check(dev: torch.device, n_ops: int = 500) -> Check:
    """CUDA-graph replay against eager on ``n_ops`` tiny adds (launch-bound eager)."""
    x = torch.zeros(16, device=dev)
    eager = measure_latency(TinyOps(n_ops), x, warn=False)
    graphed = measure_latency(TinyOps(n_ops), x, cuda_graph=True, warn=False)
    return Check(
        f"cuda graph removes launch overhead ({n_ops} tiny adds)",
        graphed.median_ms < 0.7 * eager.median_ms,
        "graph < 0.7 x eager",
        {
            "eager_ms": eager.median_ms,
            "graph_ms": graphed.median_ms,
            "ratio": graphed.median_ms / eager.median_ms,
            "eager_us_per_op": 1e3 * eager.median_ms / n_ops,
        },
    )


# -- real models -------------------------------------------------------------------------------
def model_results(name: str, dev: torch.device, quick: bool) -> dict[str, Any]:
    import torchvision

    model = getattr(torchvision.models, name)(weights=None).to(dev).eval()
    mi = make_inputs(model, (3, 224, 224), device=dev)
    e2e = measure_latency(model, mi.args[0], warn=False)
    lt = time_layers(model, mi, budget_s=3.0 if quick else 10.0)
    df = lt.to_dataframe()
    top = df[[("." not in n) for n in df["name"]]]
    max_batch = 256 if dev.type == "cuda" else 32
    tp = measure_throughput(
        model, (3, 224, 224), device=dev, max_batch=max_batch, budget_s=0.5 if quick else 1.0
    )
    return {
        "end_to_end": e2e.to_dict(samples=False),
        "instrumented_median_ms": float(np.median(lt.passes_ms)),
        "overhead": lt.overhead(e2e),
        "coverage": lt.coverage(),
        "layers": df.to_dict(orient="records"),
        "top_layers": top.to_dict(orient="records"),
        "throughput": tp.to_dict() | {"env": None},
    }


def to_markdown(
    env: dict[str, Any], checks: list[Check], models: dict[str, Any], extra: dict[str, Any]
) -> str:
    out = [
        f"# modelprof timer validation — {env.get('device_name')}",
        "",
        f"- device: `{env['device']}` ({env.get('device_name')})",
        f"- torch {env['torch_version']}, CUDA {env['cuda_version']}, cuDNN "
        f"{env['cudnn_version']}, Python {env['python_version']}, modelprof "
        f"{env['modelprof_version']}",
        f"- threads {env['torch_num_threads']}, cudnn.benchmark {env['cudnn_benchmark']}, "
        f"TF32 matmul {env['tf32_matmul']} / cudnn {env['tf32_cudnn']}",
        f"- load average at start (1/5/15 min): "
        f"{', '.join(f'{x:.2f}' for x in extra.get('loadavg', []))}",
        f"- command: `{extra.get('command')}`",
        "",
    ]
    if env.get("gpu_state"):
        out.insert(5, f"- GPU state: {env['gpu_state']}")
    passed = sum(c.passed for c in checks)
    out += [
        f"## Checks: {passed}/{len(checks)} passed",
        "",
        "| result | check | figures | criterion |",
        "| --- | --- | --- | --- |",
    ]
    for c in checks:
        figs = ", ".join(f"{k} {_fmt(v)}" for k, v in c.figures.items())
        out.append(f"| {'PASS' if c.passed else '**FAIL**'} | {c.name} | {figs} | {c.criterion} |")
    for name, r in models.items():
        e = r["end_to_end"]
        out += [
            "",
            f"## {name}, batch 1",
            "",
            f"End to end: median **{e['median_ms']:.3f} ms** (95 % CI "
            f"{e['median_ci_low_ms']:.3f}–{e['median_ci_high_ms']:.3f}, n={e['n']}, stop "
            f"{e['stop_reason']}), p90 {e['p90_ms']:.3f} ms, p99 {e['p99_ms']:.3f} ms, "
            f"CV {e['cv']:.1%}, {e['fps']:.1f} fps.",
            f"Instrumented pass {r['instrumented_median_ms']:.3f} ms (overhead "
            f"{r['overhead']:.3f}x), leaf coverage {r['coverage']:.1%}.",
            "",
            "| layer | latency_ms | std_ms | % of pass | peak memory (MiB) |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for row in r["top_layers"]:
            mem = row["peak_memory_bytes"]
            mem_s = f"{mem / 2**20:.1f}" if isinstance(mem, (int, float)) and mem == mem else ""
            label = row["name"] or "(model)"
            label += f" #{row['call']}" if row["call"] > 1 else ""
            out.append(
                f"| {label} | {row['latency_ms']:.3f} | {row['latency_std_ms']:.3f} | "
                f"{row['latency_pct']:.1f} | {mem_s} |"
            )
        tp = r["throughput"]
        out += [
            "",
            "Throughput search: batch doubled until samples/s stops improving by >= 5 % "
            "for 2 points in a row, memory runs out, or the cap.",
            "",
            f"Throughput: best **{tp['best_samples_per_s']:.1f} samples/s** at batch "
            f"{tp['best_batch_size']} (stop: {tp['stop_reason']}"
            + (
                f", memory before/after {tp['memory_before_bytes']}/{tp['memory_after_bytes']} B"
                if tp["memory_before_bytes"] is not None
                else ""
            )
            + ")",
            "",
            "| batch | latency_ms | samples/s | peak memory (MiB) |",
            "| ---: | ---: | ---: | ---: |",
        ]
        for p in tp["points"]:
            mem = p["peak_memory_bytes"]
            out.append(
                f"| {p['batch_size']} | {p['latency_ms']:.3f} | {p['samples_per_s']:.1f} | "
                f"{'' if mem is None else f'{mem / 2**20:.1f}'} |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cpu or cuda[:i] (default: cuda if available)")
    ap.add_argument("--out", default=None, help="output directory")
    ap.add_argument(
        "--models",
        default="resnet18,resnet50",
        help="comma-separated torchvision models ('' for none)",
    )
    ap.add_argument("--quick", action="store_true", help="shorter budgets")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (default: torch's own choice)",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    env = collect_env(dev)
    extra: dict[str, Any] = {
        "loadavg": list(os.getloadavg()),
        "command": " ".join(
            [
                "python",
                "benchmarks/validate_timer.py",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
    }
    out_dir = (
        Path(args.out)
        if args.out
        else ROOT / "reports" / "validation" / slug(f"{dev.type}-{env.get('device_name') or ''}")
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"modelprof timer validation on {dev} ({env.get('device_name')}), torch "
        f"{env['torch_version']}, load average {extra['loadavg']}"
    )

    t0 = time.perf_counter()
    checks = cpu_checks(args.quick)
    if dev.type == "cuda":
        more, info = cuda_checks(dev, args.quick)
        checks += more
        extra.update(info)
    for c in checks:
        print(c.line(), flush=True)

    models: dict[str, Any] = {}
    for name in filter(None, args.models.split(",")):
        r = model_results(name, dev, args.quick)
        models[name] = r
        e, tp = r["end_to_end"], r["throughput"]
        print(
            f"INFO  {name} batch 1: median {e['median_ms']:.3f} ms (±{e['relative_ci']:.2%}, "
            f"n={e['n']}, stop {e['stop_reason']}), instrumented "
            f"{r['instrumented_median_ms']:.3f} ms (overhead {r['overhead']:.3f}x, coverage "
            f"{r['coverage']:.1%}); throughput best {tp['best_samples_per_s']:.1f} samples/s at "
            f"batch {tp['best_batch_size']} ({tp['stop_reason']}), curve "
            + ", ".join(f"{p['batch_size']}:{p['samples_per_s']:.1f}" for p in tp["points"]),
            flush=True,
        )
    extra["wall_s"] = time.perf_counter() - t0
    result = {
        "env": env,
        "extra": extra,
        "checks": [dataclasses.asdict(c) for c in checks],
        "models": models,
        "passed": all(c.passed for c in checks),
    }
    (out_dir / "validation.json").write_text(json.dumps(result, indent=1, default=str))
    (out_dir / "README.md").write_text(to_markdown(env, checks, models, extra))
    print(
        f"{sum(c.passed for c in checks)}/{len(checks)} checks passed in "
        f"{extra['wall_s']:.0f} s; wrote {out_dir}/README.md and validation.json"
    )
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
