"""Write the example notebooks from the cells below, without outputs.

    python notebooks/build_notebooks.py

Edit the notebooks here, not in Jupyter, so they stay reviewable and reproducible;
``tests/test_notebooks.py`` executes the written files. Timing budgets are small so that each
notebook runs in seconds on a 2-core CPU.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

__all__ = ["NOTEBOOKS", "build", "main"]

HERE = Path(__file__).resolve().parent


def _cells(*blocks: tuple[str, str]) -> list[nbformat.NotebookNode]:
    make = {"md": new_markdown_cell, "code": new_code_cell}
    return [make[kind](textwrap.dedent(src).strip()) for kind, src in blocks]


QUICKSTART = _cells(
    ("md", """
        # modelprof quickstart

        Profile a torchvision ResNet-18 on the CPU: the per-layer table of what it *costs*
        (parameters, MACs, FLOPs, memory traffic) joined with what it *takes* (measured latency),
        then the totals, the exports and a plot. No weights are downloaded: profiling needs the
        architecture, not trained values.
    """),
    ("code", """
        %matplotlib inline
        import torchvision

        from modelprof import profile

        model = torchvision.models.resnet18(weights=None).eval()
    """),
    ("md", """
        One call. `(3, 224, 224)` is the input size *without* the batch dimension (batch 1 by
        default). `budget_s` bounds the time spent timing, so this stays quick; use a few
        seconds for numbers you want to quote.
    """),
    ("code", """
        report = profile(model, (3, 224, 224), device="cpu", budget_s=0.5)
        report
    """),
    ("md", """
        ## The table

        `to_dataframe()` is a plain, numeric pandas DataFrame: one row per module *call* (the
        `relu` of a BasicBlock runs twice, so it has two rows), parents aggregating their
        children. Counts are raw numbers and units are in the column names, so it sorts,
        filters and plots like any other frame.
    """),
    ("code", """
        df = report.to_dataframe()
        df.head(12)
    """),
    ("md", "The leaf layers that cost the most FLOPs:"),
    ("code", """
        leaves = df[df["leaf"]]
        leaves.sort_values("flops", ascending=False).head(5)
    """),
    ("md", """
        By kind of layer: the leaf rows summed per type (`conv`, `norm`, `activation`, `pool`,
        `linear`, ...). The residual adds that a BasicBlock runs itself are `elementwise`, not
        `BasicBlock`; the sums equal the totals.
    """),
    ("code", """
        report.by_layer_type()
    """),
    ("md", """
        ## Totals and latency

        `totals` sums the leaf rows. `macs` matches torchvision's published 1.814 GMACs for
        ResNet-18; `flops` is `2 * macs` plus the arithmetic of the other ops. `latency` keeps
        the raw samples and derives median, p90, spread and FPS from them.
    """),
    ("code", """
        {name: f"{value:,}" for name, value in report.totals.items()}
    """),
    ("code", """
        lat = report.latency
        print(f"median {lat.median_ms:.2f} ms, p90 {lat.p90_ms:.2f} ms, "
              f"std {lat.std_ms:.2f} ms, {lat.fps:.1f} images/s")
    """),
    ("md", """
        The same run in torchstat's layout (`MAdd`, `MemRead(B)`, `MemWrite(B)`, ...), for
        anyone comparing with an older table:
    """),
    ("code", """
        report.to_dataframe(style="torchstat").head()
    """),
    ("md", """
        ## Export

        CSV keeps raw numbers; Markdown humanises them (`1.81 G`, `3.06 MiB`) for a README or
        a paper draft. The files go into `out/` next to the notebook. Every exporter takes the
        same view options: `depth=` collapses the tree, `columns=` picks columns, `top_k=` and
        `leaf_only=` pick rows.
    """),
    ("code", """
        from pathlib import Path

        out = Path("out")
        out.mkdir(exist_ok=True)
        report.to_csv(out / "resnet18.csv")
        report.to_markdown(out / "resnet18.md")
        report.to_html(out / "resnet18.html")  # a standalone page
        columns = ["module", "type", "params", "macs", "latency_ms"]
        print(report.to_markdown(depth=1, columns=columns))
    """),
    ("md", """
        For a paper: a booktabs table with one unit per column, fitted to `\\columnwidth` or
        `\\textwidth`, a `longtable` when long; its first line names the LaTeX packages it needs.
    """),
    ("code", """
        print(report.to_latex(depth=2, width="columnwidth", caption="ResNet-18 on the CPU.",
                              label="tab:resnet18"))
    """),
    ("md", """
        ## A plot

        Where the time goes, layer by layer. `plot_*` methods return a matplotlib Figure, to
        show or save.
    """),
    ("code", """
        fig = report.plot_latency()
        fig.savefig(out / "resnet18_latency.png", dpi=120, bbox_inches="tight")
        fig
    """),
    ("md", """
        The roofline: each layer against the roof of the memory level its data fits in (the
        probe measures L1, L2, L3 and DRAM bandwidth), and the compute roof.
    """),
    ("code", """
        report.plot_roofline()
    """),
    ("md", """
        ## What does a training step cost?

        `backward=True` profiles one training step instead of an inference forward: the model
        in train mode with grad on, a loss (here the default, the sum of the outputs; pass
        `loss_fn=` and `target=` for your own), the backward and, with `optimizer=`, the
        optimizer's step. Every op the backward runs is charged to the layer whose forward
        created it, so the same table gains `backward_macs`, `backward_flops`, `saved_bytes`
        (what autograd keeps for the backward) and the measured `backward_latency_ms`.
        Your model, its gradients and your optimizer are not touched.
    """),
    ("code", """
        import torch

        step = profile(model, (3, 224, 224), device="cpu", backward=True,
                       optimizer=torch.optim.AdamW, budget_s=0.5)
        t = step.totals
        print(f"forward {t['macs'] / 1e9:.3f} GMACs, backward {t['backward_macs'] / 1e9:.3f} "
              f"GMACs ({t['backward_macs'] / t['macs']:.2f}x: the first conv needs no input "
              f"gradient), {t['saved_bytes'] / 2**20:.1f} MiB saved for the backward")
    """),
    ("md", """
        The layers whose backward takes longest, next to their forward:
    """),
    ("code", """
        cols = ["module", "type", "macs", "backward_macs", "latency_ms", "backward_latency_ms",
                "saved_bytes"]
        sdf = step.to_dataframe()
        sdf[sdf["leaf"]].sort_values("backward_latency_ms", ascending=False)[cols].head(8)
    """),
    ("md", """
        Two rows of their own close the table: `(loss)` and `(optimizer)` (AdamW: 14 flops per
        parameter, documented in `modelprof/counting/formulas/optim.py`). The forward, backward and
        optimizer step are also measured end to end, each a `Measurement`:
    """),
    ("code", """
        sdf[sdf["module"].isin(["(loss)", "(optimizer)"])][["module", "type", "flops",
                                                            "backward_flops", "latency_ms"]]
    """),
    ("code", """
        timing = step.training_step.timing
        print({phase: f"{m.median_ms:.1f} ms" for phase, m in timing.phases().items()})
        print(f"backward rows sum to {timing.rows_ms:.1f} ms, "
              f"the clean backward {timing.backward.median_ms:.1f} ms")
        step.to_csv(out / "resnet18_training_step.csv")
    """),
)


COMPARE = _cells(
    ("md", """
        # Comparing architectures

        `compare` profiles several models the same way (one device, dtype and batch size) and
        returns one row per model with its totals, its latency and its ratio to a baseline.
        The result is an ordinary pandas DataFrame; it only displays with human units.
    """),
    ("code", """
        %matplotlib inline
        import torchvision

        from modelprof.compare import compare
        from modelprof.report.plots import plot_compare

        names = ["resnet18", "mobilenet_v3_small", "squeezenet1_1"]
        models = {name: torchvision.models.get_model(name, weights=None).eval() for name in names}
    """),
    ("md", """
        All three are evaluated at 224 x 224. The first model (resnet18) is the baseline of the
        `*_x` ratio columns unless `baseline=` names another. A short timing budget per model
        keeps this fast; raise it to a few seconds for numbers you want to quote.
    """),
    ("code", """
        df = compare(models, (3, 224, 224), device="cpu", budget_s=0.3)
        df
    """),
    ("md", """
        ## Ratios

        `macs_x = macs / macs of the baseline`, likewise `params_x` and `latency_x`.
        Fewer MACs do not always mean proportionally less time: depthwise convolutions and
        small layers do little arithmetic per byte moved.
    """),
    ("code", """
        df[["macs_x", "params_x", "latency_x"]].round(2)
    """),
    ("code", """
        # achieved arithmetic rate: MACs per second of measured latency
        (df["macs"] / (df["latency_median_ms"] / 1e3) / 1e9).rename("GMAC/s").round(2)
    """),
    ("md", "## Charts"),
    ("code", """
        plot_compare(df, ["macs", "params", "latency_median_ms"])
    """),
    ("code", """
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.scatter(df["macs"] / 1e9, df["latency_median_ms"])
        for name, row in df.iterrows():
            ax.annotate(name, (row["macs"] / 1e9, row["latency_median_ms"]), fontsize=8,
                        xytext=(4, 2), textcoords="offset points")
        ax.set_xlabel("GMACs")
        ax.set_ylabel("median latency (ms)")
        ax.set_title("cost vs. time")
        ax.grid(alpha=0.3)
    """),
    ("md", """
        ## Where it ran

        The environment is recorded once for the whole comparison.
    """),
    ("code", """
        df.attrs["env"]
    """),
    ("md", """
        ## Export

        The comparison is a pandas DataFrame; `df.render` has a report's exporters: humanised
        Markdown, LaTeX and HTML (the compact columns unless `columns="all"`), CSV and JSON with
        the raw numbers.
    """),
    ("code", """
        from pathlib import Path

        Path("out").mkdir(exist_ok=True)
        df.render.to_csv("out/comparison.csv")
        df.render.to_html("out/comparison.html")
        print(df.render.to_markdown())
    """),
)

GENERATION = _cells(
    ("md", """
        # Profiling generation

        A language model runs token by token: a prefill over the prompt, then one decode step
        per new token against a KV cache that grows. `profile_generation` counts both phases
        per layer, measures TTFT and TPOT over whole `generate()` runs, reads the KV cache from
        the cache objects and bounds every phase on a datasheet device. Two tiny Llama configs
        with random weights keep this quick on a CPU: nothing is downloaded.
    """),
    ("code", """
        %matplotlib inline
        import os

        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from modelprof import compare_generation, profile_generation

        os.makedirs("out", exist_ok=True)
        torch.manual_seed(0)


        def llama(kv_heads):
            config = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=kv_heads,
                                 vocab_size=1000, max_position_embeddings=512)
            return LlamaForCausalLM(config).eval()


        gqa = llama(kv_heads=1)
    """),
    ("md", """
        One call: a 32-token prompt, 12 new tokens, batch sizes 1 and 4. `budget_s` bounds
        each measurement; `target` adds the H100 roofline **bound** (never a measurement).
    """),
    ("code", """
        report = profile_generation(gqa, prompt_len=32, new_tokens=12, batch_size=[1, 4],
                                    target="H100 SXM", budget_s=0.3)
        report
    """),
    ("md", """
        ## Phases

        The prefill and a decode step at three contexts (first, middle, last step): counted
        totals, the KV cache after the step, the measured step (per-layer passes) and the
        bound. A decode step's MACs grow by `2 x layers x hidden` per cached token.
    """),
    ("code", """
        report.phase_table()
    """),
    ("code", """
        report.growth_slopes()
    """),
    ("md", """
        Every phase has `profile`'s per-layer table, under `phase` and `context` columns.
    """),
    ("code", """
        df = report.to_dataframe()
        df[df["leaf"] & (df["phase"] == "decode")].sort_values("read_bytes", ascending=False).head(8)
    """),
    ("code", """
        report.plot_decode_growth(save="out/decode_growth.png");
        report.plot_phase_share(save="out/phase_share.png");
    """),
    ("md", """
        ## TTFT, TPOT, tokens/s; memory to fit

        Medians with their 95 % intervals, whether the run drifted, and tokens per second per
        sequence and for the batch.
    """),
    ("code", """
        report.summary()[["batch_size", "ttft_ms", "ttft_ci_low_ms", "ttft_ci_high_ms",
                          "tpot_ms", "tpot_stable", "batch_tokens_per_s"]]
    """),
    ("code", """
        print(report.kv.per_token_bytes, "bytes of KV cache per token")
        print(report.memory.table())
        print("batch that fits 1 GB at 512 tokens:", report.memory.max_batch(1e9, context=512))
    """),
    ("md", """
        ## GQA against MHA

        Measured in interleaved rounds; `tpot_x` is the ratio to the first model, with its
        interval.
    """),
    ("code", """
        table = compare_generation({"gqa (1 KV head)": gqa, "mha (4 KV heads)": llama(4)},
                                   prompt_len=32, new_tokens=8, budget_s=0.3)
        table[["ttft_ms", "tpot_ms", "tpot_x", "tpot_x_ci_low", "tpot_x_ci_high",
               "kv_bytes_per_token"]]
    """),
    ("code", """
        report.to_markdown("out/generation.md")
        report.to_csv("out/generation.csv")
    """),
)

NOTEBOOKS: dict[str, list[nbformat.NotebookNode]] = {
    "quickstart.ipynb": QUICKSTART,
    "compare_architectures.ipynb": COMPARE,
    "generation.ipynb": GENERATION,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name``, without outputs."""
    nb = new_notebook(cells=NOTEBOOKS[name])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main() -> None:
    for name in NOTEBOOKS:
        nb = build(name)
        for i, cell in enumerate(nb.cells):
            cell["id"] = f"cell-{i:02d}"  # stable ids: rebuilding changes no line by itself
        nbformat.validate(nb)
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    main()
