"""Comparisons that can be quoted: ratios that rank as the medians do (with a paired interval
and the estimator said), intervals and the environment in every human-readable export,
undefined intervals printed "n/a" (never "± 0"), latency in the LaTeX table or a word on why
not, a cost-vs-latency plot, and on a loaded CPU a ranking by CPU work (a FAKE clock: no load)."""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fake_clock import VirtualSpin, hit_and_spared, install
from helpers import latex_headers
from torch import nn

from modelprof import compare
from modelprof.cli import main
from modelprof.timing.stats import paired_ratio, ratio_of_medians

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


def test_ratio_of_medians_ranks_as_the_medians_with_a_paired_interval():
    # per round: a = 2 * b, except two rounds where load hit a's block (x10). The trimmed mean
    # of per-round ratios and the ratio of pooled medians can then rank differently; the
    # ratio shown must be the quotient of the medians shown
    rng = np.random.default_rng(0)
    b = 10.0 * np.exp(rng.normal(0, 0.01, 8))
    a = 2.0 * b
    a[[1, 5]] *= 10.0
    ratio, lo, hi = ratio_of_medians(a, b, a, b, 0.95)
    assert ratio == pytest.approx(float(np.median(a)) / float(np.median(b)), rel=1e-12)
    # the interval is the per-round ratios' own (the one judge_ratio holds the ratio against),
    # not one shifted to centre on the ratio of medians
    assert (lo, hi) == pytest.approx(paired_ratio(a, b, 0.95)[1:], rel=1e-12)
    one = ratio_of_medians(a[:1], b[:1], a[:1], b[:1], 0.95)
    assert one[0] == pytest.approx(2.0) and math.isnan(one[1]) and math.isnan(one[2])


class _Flickers(VirtualSpin):
    """``ms`` of work whose wall clock runs 2.0x on even calls and 2.42x on odd ones (load that
    comes and goes, one call a round here)."""

    def forward(self, x):
        self.clock.factor = 2.42 if getattr(self, "odd", False) else 2.0
        self.odd = not getattr(self, "odd", False)
        try:
            return super().forward(x)
        finally:
            self.clock.factor = 1.0


class _Steady(VirtualSpin):
    """``ms`` of work whose wall clock runs 2.0x on every call."""

    def forward(self, x):
        self.clock.factor = 2.0
        try:
            return super().forward(x)
        finally:
            self.clock.factor = 1.0


def test_a_loaded_ranking_by_cpu_work_ties_where_the_wall_clock_cannot_order(
    monkeypatch, one_thread
):
    # CPU work 1.0 ms against 1.1 ms every round: cpu_work_x 1.1 [1.1, 1.1], which alone ranks
    # "a" first. Load slows one model's work more than another's (benchmarks/
    # backward_under_load.py), so on a loaded machine the wall clock must not contradict it:
    # b's wall 2.2 ms against a's 2.0 or 2.42 in alternate rounds, per-round ratios 1.1 and
    # 1/1.1, centred on 1: that interval holds 1, a tie. (wall/CPU 2.0 and up: loaded)
    clock = install(monkeypatch)
    models = {"a": nn.Sequential(_Flickers(clock, 1.0)), "b": nn.Sequential(_Steady(clock, 1.1))}
    df = compare(models, (4,), repeat=60, warmup=2, min_blocks=60, budget_s=600.0, roofline=False)
    assert df.attrs["ranked_by"] == "cpu_work" and df.loc["b", "cpu_work_x"] == pytest.approx(1.1)
    low, high = df.loc["b", "latency_x_ci_low"], df.loc["b", "latency_x_ci_high"]
    assert low <= 1.0 <= high and df.loc["b", "cpu_work_x_ci_low"] > 1.0
    assert df["rank"].tolist() == [1, 1]
    assert "or the wall clock's does or orders them the other way): a, b" in df.attrs["tied"]


def test_a_loaded_cpu_ranks_identical_models_by_cpu_work(monkeypatch, one_thread):
    # two identical 1 ms models; "load" (the fake clock's wall factor) hits only the first:
    # its wall clock reads 3x, its CPU time 1x
    models = hit_and_spared(install(monkeypatch))
    df = compare(models, (4,), repeat=12, warmup=1, roofline=False)
    assert df.loc["spared", "latency_x"] == pytest.approx(1 / 3)  # wall: 1 ms / 3 ms
    assert df.loc["spared", "cpu_work_x"] == pytest.approx(1.0)  # CPU: 1 ms / 1 ms
    assert df.loc["hit", "wall_over_cpu"] == pytest.approx(3.0)
    assert df.attrs["ranked_by"] == "cpu_work"
    assert df["rank"].tolist() == [1, 1]  # equal CPU work: a tie, not 2nd
    assert any(
        "ranked by CPU work" in n and "single-threaded model on an idle core" in n
        for n in df.attrs["notes"]
    )
    text = df.render.to_markdown()
    assert "CPU work median" in text and "CPU work ratio" in text


def test_an_idle_cpu_ranks_by_latency(monkeypatch):
    clock = install(monkeypatch)
    models = {
        "one": nn.Sequential(VirtualSpin(clock, 1.0)),
        "two": nn.Sequential(VirtualSpin(clock, 2.0)),
    }
    df = compare(models, (4,), repeat=12, warmup=1, roofline=False)
    assert df.attrs["ranked_by"] == "latency" and df["rank"].tolist() == [1, 2]
    assert df.loc["two", "latency_x"] == pytest.approx(2.0)
    assert "CPU work median" not in df.render.to_markdown()  # shown only when ranked by it


def test_copies_of_one_model_tie_and_a_note_says_so(monkeypatch):
    # three copies of a 1 ms model and a 2 ms one on the exact fake clock: the copies' paired
    # ratios are 1 (a tie, not 1, 2, 3 by noise); the 2 ms one is 4th
    clock = install(monkeypatch)
    models = {name: nn.Sequential(VirtualSpin(clock, 1.0)) for name in ("a", "b", "c")}
    models["slow"] = nn.Sequential(VirtualSpin(clock, 2.0))
    df = compare(models, (4,), repeat=12, warmup=1, roofline=False)
    assert df["rank"].tolist() == [1, 1, 1, 4]
    assert any(n.startswith("tied in rank") and "a, b, c" in n for n in df.attrs["notes"])


@pytest.fixture
def spin_nets(tmp_path: Path) -> Path:
    """Two models that burn 15 and 20 ms of their thread's CPU time a call: work a loaded
    machine stretches in wall time but not in CPU time, as a real forward's. (Spins on the
    wall clock have no CPU work of their own: under two spinning processes theirs read 7-11 ms
    for the 15 ms spin, and the CPU-work ratio that a loaded comparison ranks by moved between
    rounds enough that its check withheld the rank in 5 runs of 5.)"""
    f = tmp_path / "spin_nets.py"
    f.write_text(
        textwrap.dedent("""
        import time
        from torch import nn
        INPUT_SIZE = (4,)
        class CpuSpin(nn.Module):
            def __init__(self, ms):
                super().__init__()
                self.ms = ms
            def forward(self, x):
                end = time.thread_time_ns() + int(self.ms * 1e6)
                while time.thread_time_ns() < end:
                    pass
                return x
        def slow():
            return nn.Sequential(CpuSpin(15.0))
        def slower():
            return nn.Sequential(CpuSpin(20.0))
    """)
    )
    return f


@pytest.fixture
def no_floor(monkeypatch):
    """No extension past the budget (as if its cap were spent): a short budget stays short."""
    import modelprof.timing.sampler as sampler

    monkeypatch.setattr(sampler, "FLOOR_EXTEND_S", 0.0)


def test_a_short_budget_is_extended_until_every_model_has_min_samples(spin_nets, capsys):
    # a 10 ms budget per model against 15-20 ms calls gave one round; the sample floor goes on
    # in paired rounds to min_samples=10 each (about 10 x 35 ms, far inside the 60 s cap), so
    # the models rank, and a note says the budget was extended
    code = main(["compare", f"{spin_nets}:slow", f"{spin_nets}:slower", "--budget", "0.01"])
    assert code == 0
    out = capsys.readouterr().out
    assert "not ranked" not in out
    assert "the time budget was extended by" in out and "min_samples=10 runs" in out
    df = compare(
        {"slow": f"{spin_nets}:slow", "slower": f"{spin_nets}:slower"},
        budget_s=0.01,
        roofline=False,
    )
    assert (df["latency_n"] >= 10).all() and df["rank"].notna().all()
    # 15 ms against 20 ms of CPU work: the slower one ranks second, the ratio of medians the
    # table ranks by above 1 (on a loaded machine that is cpu_work_x: the wall clock's
    # latency_x there reads the waits for a core too, and the notes say so). Ranked so on a
    # loaded machine, the two tie where the wall clock's interval of 10 rounds cannot order
    # them (load moves one model's CPU work more than another's), and the tie says why
    ranked = "cpu_work_x" if df.attrs["ranked_by"] == "cpu_work" else "latency_x"
    assert df[ranked].iloc[1] > 1.0
    wall_tie = "or the wall clock's does or orders them the other way" in df.attrs.get("tied", "")
    assert list(df["rank"]) == ([1, 1] if wall_tie else [1, 2])
    assert any("extended by" in note for note in df.attrs["notes"])


def test_cli_compare_with_one_round_exports_no_interval_as_na(
    spin_nets, tmp_path, capsys, no_floor
):
    # a 10 ms budget per model against 15-20 ms calls, no floor extension: one round (one
    # block each), so no interval exists: "n/a" in every human-readable export, NaN in the raw
    # ones, never "± 0"
    out = tmp_path / "out"
    code = main(
        [
            "compare",
            f"{spin_nets}:slow",
            f"{spin_nets}:slower",
            "--budget",
            "0.01",
            "--out",
            str(out),
            "--format",
            "csv,md,tex,html,json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    texts = {p.suffix: p.read_text() for p in out.iterdir()}
    for suffix, text in texts.items():
        assert "± 0" not in text and "±0" not in text, suffix
    for suffix in (".md", ".html"):
        assert "n/a" in texts[suffix], suffix
    csv = pd.read_csv(out / "comparison.csv")
    assert csv["latency_ci_low_ms"].isna().all()
    assert math.isnan(csv["latency_x_ci_low"].iloc[1])  # (the baseline's is 1.0 by definition)
    data = json.loads(texts[".json"])
    assert data is not None
    # LaTeX: the latency column is there (what did not fit the width is named in a comment),
    # and the caption carries the environment and the ratio estimator
    tex = texts[".tex"]
    heads = latex_headers(tex)
    assert "latency median (ms)" in heads and "latency ratio ($\\times$)" in heads
    assert "n/a" in tex or "% dropped to fit" in tex
    assert "float32" in tex and "batch 1" in tex and "torch" in tex
    assert "not ranked: too few runs for an interval" in tex
    # HTML: the device/dtype/batch/torch line and the interval columns, on the page
    html = texts[".html"]
    assert "float32, batch 1, torch" in html and "latency 95% CI low" in html
    assert "not ranked" in html


def test_an_undersampled_comparison_says_it_cannot_rank(spin_nets, capsys, no_floor):
    # one round per model (10 ms budget, 15-20 ms calls, no floor extension): a rank and a 1.3x
    # ratio from one sample each would read as quotable; neither is stated, and the run itself
    # succeeded
    code = main(["compare", f"{spin_nets}:slow", f"{spin_nets}:slower", "--budget", "0.01"])
    assert code == 0
    out = capsys.readouterr().out
    assert "not ranked: too few runs for an interval" in out
    assert re.search(  # (a file's factory named by file and factory)
        r"note: cannot rank the models: too few runs for an interval "
        r"\(spin_nets_slow n=\d, spin_nets_slower n=\d\)",
        out,
    )
    df = compare(
        {"slow": f"{spin_nets}:slow", "slower": f"{spin_nets}:slower"},
        budget_s=0.01,
        roofline=False,
    )
    assert df["rank"].isna().all()
    assert df["latency_x"].isna().all()
    assert (df["latency_median_ms"] > 0).all()  # the measurements themselves are kept
    assert df.attrs["unranked"].startswith("cannot rank the models")


def test_cli_compare_without_timing_says_why_the_latex_has_no_latency(spin_nets, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(
            [
                "compare",
                f"{spin_nets}:slow",
                f"{spin_nets}:slower",
                "--no-timing",
                "--out",
                str(out),
                "--format",
                "tex",
            ]
        )
        == 0
    )
    tex = (out / "comparison.tex").read_text()
    assert "latency not measured (timing off)" in tex


def test_plot_cost_latency_draws_each_model_with_its_interval(monkeypatch):
    pytest.importorskip("matplotlib")
    clock = install(monkeypatch)
    models = {
        "one": nn.Sequential(nn.Linear(4, 4), VirtualSpin(clock, 1.0)),
        "two": nn.Sequential(nn.Linear(4, 8), VirtualSpin(clock, 2.0)),
    }
    df = compare(models, (4,), repeat=12, warmup=1, roofline=False)
    fig = df.plot_cost_latency("macs")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "MACs" and ax.get_ylabel() == "latency median"
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == ["one", "two"]
    # the points sit at (MACs, median): 4*4 = 16 and 4*8 = 32 MACs; 1 ms and 2 ms
    # every sample exactly 1 or 2 ms: the intervals are the points, drawn as error bars
    (bars,) = ax.containers
    x, y = bars.lines[0].get_data()
    assert sorted(zip(x, y)) == [(16.0, pytest.approx(1.0)), (32.0, pytest.approx(2.0))]
    # pandas' own plot accessor is untouched
    assert type(df).plot is pd.DataFrame.plot
