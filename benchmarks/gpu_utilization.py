"""MFU, HFU and MBU on a GPU, each against the datasheet's dense peak and the probe:

1. a bf16 matmul (``nn.Linear`` 8192 -> 8192 at 8192 rows, no bias): compute bound, MFU near
   what cuBLAS reaches;
2. a small Llama training step in bf16, plain and with activation checkpointing: the same model
   FLOPs, the checkpointed one's HFU above its MFU;
3. a decode-like step (batch 1 through eight 8192 x 8192 bf16 linears): memory bound, MBU.

    PYTHONPATH=. python3 benchmarks/gpu_utilization.py [OUT_FILE]
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

import modelprof
from modelprof.timing.peaks import probe_peaks

FAST = dict(budget_s=2.0, warmup_s=0.2)


def line(out: list[str], text: str) -> None:
    print(text, flush=True)
    out.append(text)


def figures(name: str, u, out: list[str]) -> None:
    p = u.phases
    line(
        out,
        f"{name}: "
        + "; ".join(
            f"{r.phase} model {r.model_flops:.4g} FLOP, hardware {r.hardware_flops:.4g}, "
            f"{r.time_ms:.3f} ms, MFU {r.mfu:.3f}, HFU {r.hfu:.3f}, MBU {r.mbu:.3f}"
            for r in p.itertuples()
        ),
    )
    line(out, f"  by peak: {u.by_peak}; {u.describe()}")


def matmul(peaks, out: list[str]) -> None:
    model = nn.Linear(8192, 8192, bias=False, device="cuda", dtype=torch.bfloat16)
    r = modelprof.profile(model, (8192,), batch_size=8192, roofline=peaks, **FAST)
    figures("matmul 8192^3 bf16", r.utilization(), out)


def llama_step(peaks, out: list[str]) -> None:
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=32000,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 32000, (4, 1024), device="cuda")
    for ckpt in (False, True):
        if ckpt:
            model.gradient_checkpointing_enable()
        r = modelprof.profile(
            model, inputs={"input_ids": ids}, backward=True, roofline=peaks, **FAST
        )
        figures(f"llama 4x2048 step, batch 4 x 1024, checkpointing={ckpt}", r.utilization(), out)


def decode_like(peaks, out: list[str]) -> None:
    model = nn.Sequential(*[nn.Linear(8192, 8192, bias=False) for _ in range(8)]).to(
        "cuda", torch.bfloat16
    )
    r = modelprof.profile(model, (8192,), batch_size=1, roofline=peaks, **FAST)
    u = r.utilization()
    figures("batch-1 GEMV chain 8 x 8192^2 bf16", u, out)
    line(out, "  per layer MBU: " + ", ".join(f"{v:.3f}" for v in u.rows["mbu"][1:]))


def main() -> None:
    out: list[str] = []
    t0 = time.time()
    line(out, f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    peaks = probe_peaks("cuda", torch.bfloat16)
    line(
        out,
        f"probe bf16: {peaks.peak_flops / 1e12:.1f} TFLOP/s, {peaks.peak_bytes / 1e12:.2f} TB/s",
    )
    for part in (matmul, llama_step, decode_like):
        try:
            part(peaks, out)
        except Exception as e:  # noqa: BLE001 - record and go on to the next part
            line(out, f"{part.__name__} failed: {type(e).__name__}: {e}")
    line(out, f"({time.time() - t0:.0f} s)")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
