"""A comparison with a failing candidate keeps the others (the failure in its row); the timers'
errors name the candidate; a backward inside inference_mode says so; the human tables say which
way ``rank`` runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelprof import ModelProfError, compare, measure_latencies

QUICK = dict(budget_s=0.1, warn=False)


class _Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        raise RuntimeError("boom")


class _SecondCallFails(nn.Module):
    """Counted fine (its first call), fails when timed (every later call)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = [0]

    def forward(self, x):
        self.calls[0] += 1
        if self.calls[0] > 1:
            raise RuntimeError("tired")
        return self.fc(x)


@pytest.mark.parametrize("timing", [False, True])
def test_a_failing_model_keeps_the_others_table(timing):
    models = {"a": nn.Linear(4, 4), "bad": _Boom(), "c": nn.Linear(4, 8)}
    df = compare(models, (4,), timing=timing, **QUICK)
    assert list(df.index) == ["a", "bad", "c"]
    # a: 4 x 4 = 16 MACs; c: 4 x 8 = 32 MACs; the ratio to the baseline a: 2
    assert df.loc["a", "macs"] == 16 and df.loc["c", "macs"] == 32 and df.loc["c", "macs_x"] == 2
    assert "RuntimeError: boom" in df.loc["bad", "error"] and pd_isna(df.loc["bad", "macs"])
    assert df.attrs["failed"].keys() == {"bad"}
    assert any(n.startswith("bad failed and is not compared") for n in df.attrs["notes"])
    if timing:  # only the two that ran are ranked
        assert sorted(df["rank"].dropna().tolist()) in ([1, 2], [1, 1])
        assert pd_isna(df.loc["bad", "rank"])


def pd_isna(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def test_a_failing_baseline_hands_the_ratios_to_the_next():
    df = compare({"bad": _Boom(), "a": nn.Linear(4, 4), "c": nn.Linear(4, 8)}, (4,), timing=False)
    # the baseline is the first model that ran: a (16 MACs); c's 32 MACs are 2x
    assert df.attrs["baseline"] == "a" and df.loc["c", "macs_x"] == 2


def test_a_model_failing_only_when_timed_leaves_the_timed_comparison():
    models = {"a": nn.Linear(4, 4), "tired": _SecondCallFails(), "c": nn.Linear(4, 8)}
    df = compare(models, (4,), **QUICK)
    assert "candidate 'tired'" in df.loc["tired", "error"] and "tired" in df.loc["tired", "error"]
    assert df.loc["a", "latency_median_ms"] > 0 and df.loc["c", "latency_median_ms"] > 0
    assert pd_isna(df.loc["tired", "rank"])


def test_every_model_failing_names_each():
    with pytest.raises(ModelProfError, match=r"every model failed: model 'x': .*boom.*model 'y'"):
        compare({"x": _Boom(), "y": _Boom()}, (4,), timing=False)


def test_measure_latencies_names_the_failing_candidate():
    x = torch.randn(1, 4)
    with pytest.raises(ModelProfError, match=r"^candidate 'bad': the forward pass failed"):
        measure_latencies({"ok": nn.Linear(4, 4), "bad": _Boom()}, x, **QUICK)
    with pytest.raises(ModelProfError, match=r"^candidate 'three': .*not callable"):
        measure_latencies({"ok": nn.Linear(4, 4), "three": 3}, x, **QUICK)
    with pytest.raises(ModelProfError, match=r"^candidate 'wide': .*shapes cannot be multiplied"):
        measure_latencies({"ok": nn.Linear(4, 4), "wide": nn.Linear(5, 5)}, x, **QUICK)


def test_a_backward_inside_inference_mode_says_inference_mode():
    # models built inside it too: their outputs then need no grad, and the refusal was the
    # default loss's "no floating tensor that requires grad"
    with torch.inference_mode():
        models = {"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)}
        with pytest.raises(ModelProfError, match=r"^backward=True inside torch.inference_mode"):
            compare(models, (4,), backward=True, **QUICK)


@pytest.mark.parametrize("fmt", ["markdown", "text", "html"])
def test_the_human_tables_say_which_way_rank_runs(fmt):
    df = compare({"a": nn.Linear(4, 4), "b": nn.Linear(4, 8)}, (4,), **QUICK)
    assert df.attrs["ranked_by"] in ("latency", "cpu_work")
    out = str(getattr(df.render, f"to_{fmt}")())
    by = "CPU work" if df.attrs["ranked_by"] == "cpu_work" else "latency"
    assert f"rank (1 = lowest {by})" in out
    assert "rank" in df.columns  # the frame's own column keeps its name


def test_profile_backward_inside_inference_mode_says_inference_mode():
    # the same refusal from profile() itself, before any forward runs (it was the forward's
    # "Inference tensors cannot be saved for backward", from inside the model)
    import modelprof

    model = nn.Linear(4, 4)
    with torch.inference_mode():
        with pytest.raises(ModelProfError, match=r"call profile\(\) outside inference_mode"):
            modelprof.profile(model, (4,), backward=True, timing=False)
    # outside it the same call counts the step
    assert modelprof.profile(model, (4,), backward=True, timing=False).totals["backward_flops"] > 0
