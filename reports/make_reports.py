"""Regenerate the reports in ``reports/<device>/``:

    python reports/make_reports.py                # on the CUDA device if there is one, else CPU
    python reports/make_reports.py --device cpu   # force the CPU

Writes, into a folder named after the device it ran on (``reports/cpu-<model>/``,
``reports/nvidia-h100-80gb-hbm3/``):

- ``resnet18.{md,csv}`` and ``resnet18_torchstat.{md,csv}``: the per-layer table in both styles;
- ``resnet18_layer_types.md``: its leaf rows summed per kind of layer;
- ``resnet18_latency.png``, ``resnet18_roofline.png``: where resnet18's time goes;
- ``comparison.{md,csv,png}`` and ``comparison_cost_vs_latency.png``: several torchvision
  architectures side by side, each at its evaluation crop size;
- ``README.md``: the device, the environment and the command.

Weights are never downloaded (architectures only). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from modelprof.compare import compare  # noqa: E402
from modelprof.models import load_model  # noqa: E402
from modelprof.profile import profile  # noqa: E402
from modelprof.render.comparison import env_caption  # noqa: E402
from modelprof.report.plots import plot_compare  # noqa: E402
from modelprof.runtime.env import cpu_name  # noqa: E402

__all__ = ["COMPARED", "device_label", "main"]

COMPARED = (
    "resnet18",
    "resnet50",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "convnext_tiny",
    "vit_b_16",
    "swin_t",
)
COMMAND = "python reports/make_reports.py"


def device_label(device: torch.device) -> tuple[str, str]:
    """``(human name, folder name)`` of ``device``: ``("NVIDIA H100 80GB HBM3",
    "nvidia-h100-80gb-hbm3")``; CPUs get a ``cpu-`` prefix."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return name, _slug(name)
    name = cpu_name()
    return name, "cpu-" + _slug(name) if name else "cpu"


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$", "", text, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return float("nan")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    _log(f"  wrote {path}")


def profile_resnet18(out: Path, device: torch.device, budget_s: float) -> Any:
    """resnet18's table in both styles, and its plots."""
    model, name, size = load_model("resnet18")
    _log(f"profiling {name} {size} on {device} ...")
    report = profile(model, size, device=device, budget_s=budget_s)
    for style, stem in (("modelprof", name), ("torchstat", f"{name}_torchstat")):
        for writer, ext in ((report.to_markdown, "md"), (report.to_csv, "csv")):
            path = out / f"{stem}.{ext}"
            writer(path, style=style)
            _log(f"  wrote {path}")
    path = out / f"{name}_layer_types.md"
    report.to_markdown(path, group_by="layer_type")
    _log(f"  wrote {path}")
    _save(report.plot_latency(), out / f"{name}_latency.png")
    _save(report.plot_roofline(), out / f"{name}_roofline.png")
    return report


def compare_architectures(
    out: Path, names: Sequence[str], device: torch.device, budget_s: float
) -> Any:
    """The comparison table (Markdown with units, CSV with numbers) and its charts."""
    models, sizes = {}, {}
    for spec in names:
        models[spec], _, sizes[spec] = load_model(spec)
    _log(f"comparing {', '.join(models)} on {device} ...")
    df = compare(models, sizes, device=device, budget_s=budget_s, progress=True)
    title = env_caption(df.attrs["env"])
    df.render.to_csv(out / "comparison.csv")
    _log(f"  wrote {out / 'comparison.csv'}")
    (out / "comparison.md").write_text(
        f"Comparison on {title}, baseline {df.attrs['baseline']}.\n\n"
        + df.render.to_markdown(columns="all"),
        encoding="utf-8",
    )
    _log(f"  wrote {out / 'comparison.md'}")
    _save(
        plot_compare(df, ["macs", "params", "latency_median_ms"], title=title),
        out / "comparison.png",
    )

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(df["macs"] / 1e9, df["latency_median_ms"])
    for model_name, row in df.iterrows():
        ax.annotate(
            str(model_name),
            (row["macs"] / 1e9, row["latency_median_ms"]),
            fontsize=8,
            xytext=(4, 2),
            textcoords="offset points",
        )
    ax.set_xlabel("GMACs")
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"cost vs. time on {title}", fontsize=10)
    ax.grid(alpha=0.3)
    _save(fig, out / "comparison_cost_vs_latency.png")
    return df


def write_readme(
    out: Path,
    device_name: str,
    env: dict[str, Any],
    names: Sequence[str],
    budget_s: float,
    seconds: float,
    load: tuple[float, float],
) -> None:
    rows = "\n".join(f"| {k} | {v} |" for k, v in env.items())
    text = f"""# modelprof reports on {device_name}

Generated by `{COMMAND}` (timing budget {budget_s:g} s per model; took {seconds:.0f} s;
1-minute load average {load[0]:.2f} before, {load[1]:.2f} after, on {env.get("cpu_count")} CPUs:
other work on the machine slows the latencies, never the costs).
Numbers of cost (params, MACs, FLOPs, bytes) do not depend on the device; latencies do.

| file | what |
| --- | --- |
| `resnet18.md`, `resnet18.csv` | resnet18's per-layer table, modelprof columns (Markdown: the compact ones) |
| `resnet18_layer_types.md` | the same leaf rows summed per kind of layer (conv, norm, activation, ...) |
| `resnet18_torchstat.md`, `resnet18_torchstat.csv` | the same in torchstat's columns |
| `resnet18_latency.png`, `resnet18_roofline.png` | resnet18's per-layer time and roofline |
| `comparison.md`, `comparison.csv` | {", ".join(names)} side by side |
| `comparison.png`, `comparison_cost_vs_latency.png` | the comparison as charts |

## Environment

| key | value |
| --- | --- |
{rows}
"""
    (out / "README.md").write_text(text, encoding="utf-8")
    _log(f"  wrote {out / 'README.md'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument(
        "--budget",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="timing budget per model (default: 2)",
    )
    parser.add_argument(
        "--models", default=",".join(COMPARED), help="comma-separated torchvision names to compare"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "reports", help="parent folder of the per-device folders"
    )
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    device_name, folder = device_label(device)
    out = args.out / folder
    out.mkdir(parents=True, exist_ok=True)
    _log(f"writing reports for {device_name} into {out}")
    start, load_before = time.perf_counter(), _load_average()
    report = profile_resnet18(out, device, args.budget)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    compare_architectures(out, names, device, args.budget)
    env = report.env
    write_readme(
        out,
        device_name,
        env,
        names,
        args.budget,
        time.perf_counter() - start,
        (load_before, _load_average()),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
