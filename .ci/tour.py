"""What a new user runs first, on whatever stack is installed: the README's 30-second tour
(resnet18, 64 x 64 images and short timing budgets so it stays quick on 2 cores), and a
generation profile of a small Llama and a small GPT-2, counted and timed.

    python .ci/tour.py OUT.json

Writes the installed versions and each step's result (ok, or the error) to OUT.json, prints
them, and exits 1 when a step failed.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "torchvision", "transformers", "numpy", "pandas")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "-"
    return found


def readme_tour() -> None:
    """The README's first Python block, as written, at 64 x 64 with 0.3 s timing budgets."""
    import matplotlib

    matplotlib.use("Agg")
    import modelprof

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## A 30-second tour\n.*?```python\n(.*?)```", text, re.S).group(1)
    small = block.replace("(3, 224, 224)", "(3, 64, 64)")
    assert small != block, "the tour's input size changed: update .ci/tour.py"
    budget = dict(budget_s=0.3)
    real = modelprof.profile
    modelprof.profile = lambda *a, **k: real(*a, **{**budget, **k})
    try:
        exec(compile(small, "README.md (tour)", "exec"), {})
    finally:
        modelprof.profile = real


def generation(kind: str) -> None:
    """A tiny causal LM's generation, counted and timed, with a dynamic cache."""
    import transformers

    from modelprof import ModelProfError, profile_generation

    if kind == "llama":
        config = transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
        )
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64
        )
        model = transformers.GPT2LMHeadModel(config)
    try:
        report = profile_generation(model, prompt_len=8, new_tokens=4, budget_s=0.3)
    except ModelProfError as e:  # GPT-2 took transformers Cache objects from 4.4x on
        if "does not support transformers Cache objects" not in str(e):
            raise
        print(f"refused, as it should be on this transformers: {e}\nso, without a cache:")
        report = profile_generation(model, prompt_len=8, new_tokens=4, budget_s=0.3, cache=None)
    assert report.timing is not None and report.prefill().totals["macs"] > 0
    print(report.phase_table().to_string()[:800])


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    record = {"versions": versions(), "steps": {}}
    print(record["versions"])
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the tour writes into out/
        for name, step in (
            ("readme tour", readme_tour),
            ("generation llama", lambda: generation("llama")),
            ("generation gpt2", lambda: generation("gpt2")),
        ):
            start = time.perf_counter()
            try:
                step()
                result = "ok"
            except Exception:  # noqa: BLE001 - recorded, then exit 1
                result = traceback.format_exc(limit=-6)
            record["steps"][name] = {"result": result, "s": round(time.perf_counter() - start, 1)}
            print(f"{name}: {result} ({record['steps'][name]['s']} s)")
        os.chdir(cwd)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0 if all(s["result"] == "ok" for s in record["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
