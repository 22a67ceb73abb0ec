"""Generation on this machine: TTFT, TPOT and tokens/s of GPT-2 small and a small Llama (random
weights, CPU) at batch 1 and 8; the profiler's cost on a decode step against a plain
``generate``; counted decode MACs against ``FlopCounterMode``; and the Llama-3-70B-shaped meta
analysis at 8k context (time, memory) with its H100 SXM roofline bound, written to
``reports/generation/``.

    python benchmarks/generation.py                 # everything (several minutes on 2 cores)
    python benchmarks/generation.py --part meta70b  # the 70B analysis only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "generation"
sys.path.insert(0, str(ROOT))

import transformers

from modelprof import measure_latencies, profile_generation


def gpt2_small() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()


def small_llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


MODELS = {"gpt2-small": gpt2_small, "llama-small (8 x 512, GQA 8/2)": small_llama}


def cpu_part(prompt_len: int, new_tokens: int, budget_s: float) -> list[dict]:
    """TTFT, TPOT, tokens/s at batch 1 and 8 (generate() as users run it)."""
    rows = []
    for name, build in MODELS.items():
        model = build()
        report = profile_generation(
            model, prompt_len, new_tokens, batch_size=[1, 8], layer_timing=False, budget_s=budget_s
        )
        for _, r in report.summary().iterrows():
            rows.append(
                {
                    "model": name,
                    **{
                        k: r[k]
                        for k in (
                            "batch_size",
                            "generations",
                            "ttft_ms",
                            "ttft_ci_low_ms",
                            "ttft_ci_high_ms",
                            "tpot_ms",
                            "tpot_ci_low_ms",
                            "tpot_ci_high_ms",
                            "tpot_stable",
                            "tokens_per_s",
                            "batch_tokens_per_s",
                            "end_to_end_tokens_per_s",
                        )
                    },
                }
            )
            print(rows[-1], flush=True)
    return rows


def overhead_part(new_tokens: int, budget_s: float) -> dict:
    """A decode step under the profiler (generate with its stamping streamer) against plain
    generate: both run ``new_tokens`` and 1 token, interleaved; the step is the difference
    over ``new_tokens - 1``."""
    from modelprof.generation.lm import LanguageModel
    from modelprof.generation.spec import CacheMode

    model = gpt2_small()
    lm = LanguageModel(model, None, CacheMode.DYNAMIC, torch.device("cpu"), torch.float32)
    prompt = torch.randint(0, 50257, (1, 32))
    plain_gc, one_gc = lm.generation_config(new_tokens), lm.generation_config(1)
    stamps: list[int] = []

    def stamp() -> None:
        stamps.append(time.perf_counter_ns())

    calls = {
        "plain": lambda: model.generate(
            prompt, attention_mask=torch.ones_like(prompt), generation_config=plain_gc
        ),
        "profiled": lambda: lm.generate(prompt, new_tokens, stamp),
        "plain_1": lambda: model.generate(
            prompt, attention_mask=torch.ones_like(prompt), generation_config=one_gc
        ),
    }
    with torch.no_grad():
        cmp = measure_latencies(calls, budget_s=budget_s, warn=False)
    med = {k: cmp[k].median_ms for k in calls}
    step_plain = (med["plain"] - med["plain_1"]) / (new_tokens - 1)
    step_prof = (med["profiled"] - med["plain_1"]) / (new_tokens - 1)
    ratio, lo, hi = cmp.ratios["profiled"]
    out = {
        "new_tokens": new_tokens,
        "plain_generate_ms": med["plain"],
        "profiled_generate_ms": med["profiled"],
        "generate_1_token_ms": med["plain_1"],
        "decode_step_plain_ms": step_plain,
        "decode_step_profiled_ms": step_prof,
        "decode_step_ratio": step_prof / step_plain,
        "whole_generation_ratio": ratio,
        "whole_generation_ratio_ci": [lo, hi],
    }
    print(out, flush=True)
    return out


def flop_counter_part() -> list[dict]:
    """Counted decode MACs against FlopCounterMode on the same step (batch 1 and 8)."""
    from torch.utils.flop_counter import FlopCounterMode

    from modelprof.generation.cache import model_dims

    rows = []
    for name, build in MODELS.items():
        model = build()
        for batch in (1, 8):
            report = profile_generation(model, 64, 2, batch_size=batch, contexts=[64], timing=False)
            counted = report.decode(64).totals["macs"]
            cache = transformers.DynamicCache(config=model.config)
            with torch.no_grad():
                model(
                    input_ids=torch.zeros(batch, 64, dtype=torch.long),
                    past_key_values=cache,
                    use_cache=True,
                )
                with FlopCounterMode(display=False) as fc:
                    model(
                        input_ids=torch.zeros(batch, 1, dtype=torch.long),
                        past_key_values=cache,
                        use_cache=True,
                        logits_to_keep=1,
                    )
            # FlopCounterMode has no formula for the CPU's fused attention
            # (aten._scaled_dot_product_flash_attention_for_cpu): the step's attention,
            # 2 x layers x (L + 1) x heads x head_dim MACs, is missing from its total
            dims = model_dims(model.config)
            attention = 2 * dims["layers"] * 65 * dims["heads"] * dims["head_dim"] * batch
            flops = fc.get_total_flops()
            rows.append(
                {
                    "model": name,
                    "batch_size": batch,
                    "context": 64,
                    "counted_macs": counted,
                    "flop_counter_flops": flops,
                    "flops_over_2macs": flops / (2 * counted),
                    "attention_macs": attention,
                    "equal_without_attention": flops == 2 * (counted - attention),
                }
            )
            print(rows[-1], flush=True)
    return rows


META_SCRIPT = r"""
import json, os, resource, sys, time, torch, transformers
sys.path.insert(0, sys.argv[1])
from modelprof import profile_generation
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg = transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                               num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                               max_position_embeddings=8192, rope_theta=500000.0)
load_before = os.getloadavg()
t0, c0 = time.perf_counter(), time.process_time()
with torch.device("meta"):
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
report = profile_generation(model, prompt_len=8064, new_tokens=128, target="H100 SXM")
took, cpu = time.perf_counter() - t0, time.process_time() - c0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = sys.argv[2]
report.phase_table().to_csv(out + "/llama3_70b_8k_h100_phases.csv", index=False)
report.bound_table().to_csv(out + "/llama3_70b_8k_h100_bound.csv", index=False)
report.to_markdown(out + "/llama3_70b_8k_h100.md")
print(json.dumps({"seconds": took, "cpu_seconds": cpu, "load_average_1_5_15": load_before,
                  "rss_before_kib": base, "rss_peak_kib": peak,
                  "added_mib": (peak - base) / 1024, "params": report.prefill().totals["params"],
                  "kv_bytes_per_token": report.kv.per_token_bytes}))
"""


def meta_part() -> dict:
    """The 70B-shaped analysis in a fresh process (its memory is its own)."""
    OUT.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        [sys.executable, "-c", META_SCRIPT, str(ROOT), str(OUT)],
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print(out, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["all", "cpu", "overhead", "flops", "meta70b"], default="all")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared 2-core VM two OpenMP threads "
        "contend with the other load; a 16-token generate of a 2-layer model "
        "took 11 s with 2 threads and 0.32 s with 1)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results: dict = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
    }
    if args.part in ("all", "meta70b"):
        results["meta70b"] = meta_part()
    if args.part in ("all", "flops"):
        results["flop_counter"] = flop_counter_part()
    if args.part in ("all", "overhead"):
        results["overhead"] = overhead_part(args.new_tokens, args.budget)
    if args.part in ("all", "cpu"):
        results["cpu"] = cpu_part(args.prompt_len, args.new_tokens, args.budget)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"benchmark_{args.part}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
