"""What a throughput curve says of its points: the search's conclusions, undersampled points,
what a sample is, and its units. Every point comes from a fake ``measure=``, so the curve is
the same on any machine."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
from torch import nn

from modelprof.timing import Throughput, measure_throughput
from modelprof.timing.measurement import Measurement

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


def fake(
    sps: dict[int, float], *, loaded: bool = False, few: Iterable[int] = ()
) -> Callable[..., Measurement]:
    """A point measure whose batch ``b`` reads ``sps[b]`` samples/s (to within 0.6 %) over 12
    runs in 6 blocks, or 2 runs in 2 blocks (below min_samples=5) for a batch of ``few``;
    ``loaded``: the wall clock twice the CPU work, a core's worth of other work beside it."""
    few = set(few)

    def measure(model: Any, b: int, device: Any, options: Any) -> Measurement:
        n = 2 if b in few else 12
        ms = np.full(n, b / sps[b] * 1e3) * (1 + 0.001 * np.arange(n))
        return Measurement(
            ms,
            batch_size=b,
            stop_reason="budget",
            blocks=np.arange(n) // 2 if n > 2 else np.arange(n),
            cpu_ms=ms / 2 if loaded else ms,
            cpu_clock="thread_time",
            competing_cores=1.0 if loaded else 0.0,
            min_samples=5,
        )

    return measure


def search(sps: dict[int, float], max_batch: int = 64, **fake_args: Any) -> Throughput:
    return measure_throughput(
        nn.Linear(2, 2), (2,), max_batch=max_batch, measure=fake(sps, **fake_args), warn=False
    )


def test_a_searched_curve_reads_its_own_rule_and_load():
    # measure_throughput keeps gain and patience in env["mode"]: stop_explanation read them at
    # the top of env, found no gain, took the last point as the one not beaten, and said the
    # curve had flattened from points all read on a loaded machine
    curve = search({1: 1000, 2: 1900, 4: 1950, 8: 1990}, loaded=True)
    assert curve.stop_reason == "no_improvement" and all(p.loaded for p in curve.points)
    assert curve.stop_explanation == (
        "stopped at batch 8: 2 batch sizes in a row did not raise samples/s by at least 5 % "
        "over batch 2's, but batch 4, 8 read on a loaded machine: the curve may not have "
        "flattened; time again on a quieter machine"
    )
    quiet = search({1: 1000, 2: 1900, 4: 1950, 8: 1990})
    assert quiet.stop_explanation.endswith(
        "over batch 2's: the curve has flattened, a larger max_batch is unlikely to help"
    )
    # a training step's search records backward=True there too: its caption said "forward"
    quiet.env["mode"]["backward"] = True
    assert "throughput on cpu (whole training steps, input 2): best" in str(quiet.to_markdown())


def test_a_search_stopped_at_max_batch_concludes_nothing_from_loaded_points():
    # batch 4 read fewer samples/s than batch 2 at the cap: "a larger batch is unlikely to
    # help", though every point was read on a loaded machine
    sps = {1: 1000, 2: 1900, 4: 1800}
    loaded = search(sps, max_batch=4, loaded=True)
    assert loaded.stop_reason == "max_batch" and loaded.best_batch_size == 2
    text = loaded.stop_explanation
    assert text.startswith("stopped at max_batch=4, the largest batch allowed; batch 4 read fewer")
    assert "but batch 4 read on a loaded machine: a larger batch may still help" in text
    assert "unlikely to help" not in text
    assert search(sps, max_batch=4).stop_explanation.endswith(
        ": a larger batch is unlikely to help"
    )


def test_a_conclusion_from_too_few_runs_says_so():
    # batch 8 ran twice (min_samples=5): its samples/s may read either way
    curve = search({1: 1000, 2: 1900, 4: 1950, 8: 1990}, few=[8])
    assert [p.undersampled for p in curve.points] == [False, False, False, True]
    assert not any(p.loaded for p in curve.points)
    text = curve.stop_explanation
    assert "over batch 2's, but batch 8 (n=2 < min_samples=5) rests on too few runs: the" in text
    assert text.endswith("the curve may not have flattened; time again with a larger budget_s")
    capped = search({1: 1000, 2: 1900, 4: 1800}, max_batch=4, few=[4]).stop_explanation
    assert (
        "but batch 4 (n=2 < min_samples=5) rests on too few runs" in capped
        and "unlikely" not in capped
    )


def test_a_point_on_too_few_runs_is_shown_rough_and_not_chosen_best():
    # batch 4 ran twice (min_samples=5) and read 1004.5 samples/s beside batch 1's and 2's
    # 994.5 over 12 runs each: it was the best, unmarked, in no note
    import warnings

    from modelprof.errors import FewSamplesWarning

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        curve = measure_throughput(
            nn.Linear(2, 2), (2,), max_batch=4, measure=fake({1: 1000, 2: 1000, 4: 1005}, few=[4])
        )
    four = curve.points[-1]
    assert four.samples_per_s == max(p.samples_per_s for p in curve.points)
    assert curve.best_batch_size == 1 and four.undersampled and not curve.best.undersampled
    assert curve.to_dataframe()["latency_rough"].tolist() == [False, False, True]
    [note] = curve.timing_notes
    assert note.startswith("batch 4 rests on too few runs (batch 4: 2 runs in the time budget")
    said = [str(w.message) for w in got if issubclass(w.category, FewSamplesWarning)]
    assert said == [f"modelprof: throughput: {note}"]  # once, for the search
    assert "batch     4:" in repr(curve) and "(too few runs: n=2 < min_samples=5; rough)" in repr(
        curve
    )
    md = str(curve.to_markdown()).replace("\\~", "~").replace("\\<", "<")
    assert "~ rough: batch 4 (n=2 < min_samples=5) on too few runs" in md.splitlines()[0]
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in md.splitlines() if r.startswith("|")]
    header, cells = rows[0], {r[0]: dict(zip(rows[0], r)) for r in rows[2:]}
    assert "samples/s" in header and "latency" in header
    for batch, marked in (("1", False), ("2", False), ("4", True)):
        assert cells[batch]["latency"].startswith("~") == marked
        assert cells[batch]["samples/s"].startswith("~") == marked
    assert note in md and curve.to_dict()["timing_notes"] == [note]
    # every point on too few runs: the fastest, rough and said so
    short = search({1: 1000, 2: 1000, 4: 1005}, max_batch=4, few=[1, 2, 4])
    assert short.best_batch_size == 4 and short.to_dataframe()["latency_rough"].all()
    # at max_batch, a last batch passed over for its few runs is not "read fewer samples/s"
    capped = search({1: 1000, 2: 1900, 4: 2500}, max_batch=4, few=[4])
    assert capped.best_batch_size == 2
    assert "batch 4 read more samples/s than batch 2's but rests on too few runs" in (
        capped.stop_explanation
    )


class _Ids(nn.Module):
    """A language model's shape: token ids in, one vector a token out."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 4)

    def forward(self, input_ids):
        return self.embed(input_ids)


def test_a_curve_records_what_a_sample_is_in_its_env_and_caption(tmp_path):
    # with tokens=32 only the command line's stdout heading said the sequence length: the
    # JSON's env, the Markdown and LaTeX captions did not
    from modelprof.render import read_json

    rate = {1: 1000, 2: 1900, 4: 1950}
    curves = {
        "32 tokens": measure_throughput(
            _Ids(), tokens=32, max_batch=4, measure=fake(rate), warn=False
        ),
        "3x224x224": measure_throughput(
            nn.Linear(2, 2), (3, 224, 224), max_batch=4, measure=fake(rate), warn=False
        ),
        "3x8, 5": measure_throughput(
            nn.Linear(2, 2), [(3, 8), (5,)], max_batch=4, measure=fake(rate), warn=False
        ),
    }
    for sample, curve in curves.items():
        assert curve.env["input"] == sample
        heading = f"throughput on cpu (forward, input {sample}): best"
        assert heading in str(curve.to_markdown()).splitlines()[0]
        latex = heading.replace("x", "$\\times$")  # (3$\times$224$\times$224, as a report's)
        assert f"\\caption{{{latex}" in str(curve.to_latex(width=None))
        _, _, env = read_json(curve.to_json(tmp_path / "tp.json"))
        assert env["env"]["input"] == sample


def test_a_curves_samples_per_s_is_shown_in_a_unit_of_at_most_4_digits():
    # LaTeX and Markdown printed 584824.35 samples/s, no unit: a column of at most 4 digits
    # before the point, as every count-like column (K samples/s here); CSV keeps raw numbers
    from modelprof.render import read_csv

    curve = search({1: 150_000, 2: 300_000, 4: 584_824}, max_batch=4)
    thousands = [f"{p.samples_per_s / 1e3:.2f}" for p in curve.points]
    assert thousands == ["149.18", "298.36", "581.63"]
    lines = str(curve.to_latex(width=None)).splitlines()
    top = lines.index("\\midrule")
    units = [c.strip() for c in lines[top - 1].rstrip("\\ ").split("&")]
    names = [c.strip() for c in lines[top - 2].rstrip("\\ ").split("&")]
    assert units[names.index("samples/s")] == "(K)"
    rows = [[c.strip() for c in r.rstrip("\\ ").split("&")] for r in lines[top + 1 : top + 4]]
    assert [r[names.index("samples/s")] for r in rows] == thousands
    md = str(curve.to_markdown())
    header = [c.strip() for c in md.splitlines()[2].split("|")[1:-1]]
    cells = [[c.strip() for c in r.split("|")[1:-1]] for r in md.splitlines()[4:7]]
    assert [r[header.index("samples/s")] for r in cells] == [f"{t} K" for t in thousands]
    back = read_csv(curve.to_csv())
    assert back["samples_per_s"].tolist() == [p.samples_per_s for p in curve.points]
